// megazero/cuda/slot_reduce_kernels.cuh (the shm transport's reduction over
// device slots, for ranks that share a GPU), run on the CPU through the
// emulation in shim/, against reduce_host (comm/shm_collectives.h), the host
// path's reduction, on the same inputs: bit for bit (a NaN for a NaN), so a
// collective gives the same bits over either kind of slot. Every dtype, Sum,
// Avg and Max (integers: Sum and Max; uint8: Max), 1 to 5 sources, 16-byte
// packs and element by element, lengths that leave a tail, grids smaller than
// the work (a thread takes several units), the result written over a source.
// Inputs whose sums round: 16-bit values whose fp32 sum differs from the sum
// of the rounded pairwise sums, NaNs for Max, integers beyond 2^31. Exit code
// 1 on any difference.
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "emu_checks.h"
#include "emu_runtime.h"
#include "megazero/comm/shm_collectives.h"
#include "megazero/cuda/slot_reduce_kernels.cuh"

using namespace megazero;
namespace dk = megazero::cuda::detail_k;

namespace {

using emu_checks::failures;
using i64 = std::int64_t;

// Random storage bytes for t: values whose sums round in 16 bits and fp32.
std::vector<unsigned char> random_values(DType t, std::size_t n, std::mt19937& rng, bool nans) {
  const std::size_t es = dtype_size(t);
  std::vector<unsigned char> out(n * es);
  std::normal_distribution<double> normal(0.0, 3.0);
  std::uniform_int_distribution<std::int64_t> big(-(std::int64_t{1} << 40), std::int64_t{1} << 40);
  std::uniform_int_distribution<int> byte(0, 255), pick(0, 40);
  for (std::size_t i = 0; i < n; ++i) {
    double v = normal(rng) * (1 + (i % 7) * 100.0);
    if (nans && pick(rng) == 0) v = std::nan("");
    switch (t) {
      case DType::F32: {
        const float f = static_cast<float>(v);
        std::memcpy(&out[i * es], &f, es);
        break;
      }
      case DType::F64:
        std::memcpy(&out[i * es], &v, es);
        break;
      case DType::BF16: {
        const BFloat16 h = float_to_bf16(static_cast<float>(v));
        std::memcpy(&out[i * es], &h, es);
        break;
      }
      case DType::F16: {
        const Half h = float_to_half(static_cast<float>(v / 64));
        std::memcpy(&out[i * es], &h, es);
        break;
      }
      case DType::I32: {
        const auto x = static_cast<std::int32_t>(big(rng) >> 12);
        std::memcpy(&out[i * es], &x, es);
        break;
      }
      case DType::I64: {
        const std::int64_t x = big(rng) << 12;
        std::memcpy(&out[i * es], &x, es);
        break;
      }
      case DType::U8:
        out[i] = static_cast<unsigned char>(byte(rng));
        break;
    }
  }
  return out;
}

bool is_nan_bits(DType t, const unsigned char* p) {
  switch (t) {
    case DType::F32: {
      float f;
      std::memcpy(&f, p, 4);
      return f != f;
    }
    case DType::F64: {
      double d;
      std::memcpy(&d, p, 8);
      return d != d;
    }
    case DType::BF16:
    case DType::F16: {
      std::uint16_t u;
      std::memcpy(&u, p, 2);
      const std::uint16_t exp_mask = t == DType::BF16 ? 0x7f80 : 0x7c00, man_mask = t == DType::BF16 ? 0x7f : 0x3ff;
      return (u & exp_mask) == exp_mask && (u & man_mask) != 0;
    }
    default:
      return false;
  }
}

template <typename S, int V>
void run_kernel(void* dst, const std::vector<void*>& srcs, i64 n, dk::SlotOp op, int ranks, unsigned blocks) {
  dk::SlotSources in{};
  for (std::size_t q = 0; q < srcs.size(); ++q) in.p[q] = srcs[q];
  const i64 units = n / V;
  emu_launch(dim3{blocks, 1, 1}, 64, 0, [&] {
    dk::slot_reduce_kernel<S, V>(static_cast<S*>(dst), in, static_cast<int>(srcs.size()), units, op, ranks);
  });
}

template <typename S>
void one_case(DType t, ReduceOp op, int nsrc, i64 n, bool packed, bool in_place, unsigned blocks, std::mt19937& rng) {
  const std::size_t es = dtype_size(t), bytes = static_cast<std::size_t>(n) * es;
  // Sources, the host's result and the kernel's, 16-byte aligned.
  std::vector<std::vector<unsigned char>> src(static_cast<std::size_t>(nsrc));
  for (auto& s : src) s = random_values(t, static_cast<std::size_t>(n), rng, op == ReduceOp::Max);
  std::vector<const void*> host_srcs;
  for (auto& s : src) host_srcs.push_back(s.data());
  std::vector<unsigned char> want(bytes + 16);
  reduce_host(t, op, want.data(), host_srcs, static_cast<std::size_t>(n), nsrc, 1);

  std::vector<std::vector<unsigned char>> dev_src = src;  // the kernel's own copies (one may be written over)
  std::vector<void*> srcs;
  for (auto& s : dev_src) srcs.push_back(s.data());
  std::vector<unsigned char> out(bytes + 16, 0xab);
  void* dst = in_place ? srcs[static_cast<std::size_t>(nsrc - 1)] : static_cast<void*>(out.data());
  const dk::SlotOp o = op == ReduceOp::Max ? dk::SlotOp::Max : op == ReduceOp::Avg ? dk::SlotOp::Avg : dk::SlotOp::Sum;
  constexpr int kV = dk::kVec<S>;
  if (packed) {
    if (!dk::aligned16(dst) || n % kV != 0) return;  // the launcher would take the element-by-element kernel
    run_kernel<S, kV>(dst, srcs, n, o, nsrc, blocks);
  } else {
    run_kernel<S, 1>(dst, srcs, n, o, nsrc, blocks);
  }
  const auto* got = static_cast<const unsigned char*>(dst);
  int bad = 0;
  for (i64 i = 0; i < n; ++i) {
    const unsigned char* g = got + static_cast<std::size_t>(i) * es;
    const unsigned char* w = want.data() + static_cast<std::size_t>(i) * es;
    if (std::memcmp(g, w, es) == 0 || (is_nan_bits(t, g) && is_nan_bits(t, w))) continue;
    if (++bad == 1 && ++failures <= 20)
      std::printf("FAIL %s %s, %d sources, n %lld, %s%s: element %lld differs from reduce_host\n", dtype_name(t).data(),
                  reduce_op_name(op).data(), nsrc, static_cast<long long>(n), packed ? "packed" : "element by element",
                  in_place ? ", in place" : "", static_cast<long long>(i));
  }
  if (!in_place && std::memcmp(out.data() + bytes, std::vector<unsigned char>(16, 0xab).data(), 16) != 0 &&
      ++failures <= 20)
    std::printf("FAIL %s: written past the end\n", dtype_name(t).data());
}

template <typename S>
void all(DType t, std::mt19937& rng) {
  std::vector<ReduceOp> ops;
  if (t == DType::U8)
    ops = {ReduceOp::Max};
  else if (is_floating(t))
    ops = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max};
  else
    ops = {ReduceOp::Sum, ReduceOp::Max};
  const i64 v = dk::kVec<S>;
  for (ReduceOp op : ops)
    for (int nsrc : {1, 2, 3, 5})
      for (i64 n : {i64{1}, i64{7}, v * 64, v * 333 + 5})
        for (bool packed : {true, false})
          for (bool in_place : {false, true})
            for (unsigned blocks : {1u, 3u}) one_case<S>(t, op, nsrc, n, packed, in_place, blocks, rng);
}

}  // namespace

int main() {
  std::mt19937 rng(2027);
  all<float>(DType::F32, rng);
  all<double>(DType::F64, rng);
  all<__nv_bfloat16>(DType::BF16, rng);
  all<__half>(DType::F16, rng);
  all<std::int32_t>(DType::I32, rng);
  all<std::int64_t>(DType::I64, rng);
  all<std::uint8_t>(DType::U8, rng);
  if (failures) {
    std::printf("slot_reduce_emulated: %d checks failed\n", failures);
    return 1;
  }
  std::printf(
      "slot_reduce_emulated: the device slot reduction gives reduce_host's bits (every dtype and op, packed and "
      "element by element, in place and not)\n");
  return 0;
}
