#include "megazero/kernels/optimizer_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "megazero/kernels/adamw_formula.h"
#include "megazero/kernels/kernel_support.h"
#ifdef MEGAZERO_WITH_CUDA
#include "megazero/cuda/optimizer.h"
#endif

namespace megazero::kernels {

using namespace detail;

namespace {

// No params output: adamw_cpu<G, NoParams> stores only the optimizer's buffers.
struct NoParams {};

// Split over the math threads and vectorised: no element depends on another,
// so the result is the same bits for any thread count or vector width (the
// formula of adamw_formula.h, fp32, each operation rounded on its own, none
// fused: -ffp-contract=off; nothing is summed). The bare loop through a
// load-function pointer ran at ~14 ns per parameter.
//
// The params output P is the new fp32 weight cast by st<P>(float) (for 16-bit
// P float_to_bf16 / float_to_half, what copy_from(master) runs). An fp32/fp64
// copy is stored from the register with the master, and so is a 16-bit one
// when the loop is scalar anyway (fp16 gradients). Otherwise the 16-bit cast
// is a second loop over each chunk of 2048 while it is in L1: inside the
// vectorised update loop the bf16 cast cost twice the separate pass.
template <typename G, typename P>
void adamw_cpu(float* w, float* m, float* v, const G* g, P* p, i64 b, i64 e, bool decay, const AdamCoefficients& c) {
  const float df = decay ? c.decay_factor : 1.0f;
  constexpr bool kStoreInLoop = !std::is_same_v<P, NoParams> && (!is_16bit_v<P> || std::is_same_v<G, Half>);
  constexpr bool kCastAfter = is_16bit_v<P> && !kStoreInLoop;
  constexpr i64 kChunk = 2048;
#pragma omp parallel for num_threads(threads()) schedule(static) if (parallel : e - b > (i64{1} << 16))
  for (i64 ch = b; ch < e; ch += kChunk) {
    const i64 ce = std::min(e, ch + kChunk);
#pragma omp simd
    for (i64 i = ch; i < ce; ++i) {
      float wi = w[i], mi = m[i], vi = v[i];
      adamw_element(wi, mi, vi, static_cast<float>(widen(g[i])), df, c);
      m[i] = mi;
      v[i] = vi;
      w[i] = wi;
      if constexpr (kStoreInLoop) p[i] = st<P>(wi);
    }
    if constexpr (kCastAfter) {
#pragma omp simd
      for (i64 i = ch; i < ce; ++i) p[i] = st<P>(w[i]);
    }
  }
}

// Eight running sums over the elements i = begin + 8j + k, combined pairwise,
// then the range's tail. The eight independent sums vectorise (the sequential
// sum through a per-element dtype switch ran at about the cost of the AdamW
// update itself).
template <typename G>
double sum_of_squares_cpu(const G* g, const std::vector<std::pair<i64, i64>>& ranges) {
  double s = 0;
  for (const auto& [begin, end] : ranges) {
    double acc[8] = {};
    i64 i = begin;
    for (; i + 8 <= end; i += 8)
      for (int k = 0; k < 8; ++k) {
        const double v = widen(g[i + k]);
        acc[k] += v * v;
      }
    double r = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < end; ++i) {
      const double v = widen(g[i]);
      r += v * v;
    }
    s += r;
  }
  return s;
}

}  // namespace

void adamw(const Tensor& master, const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& grads,
           const std::vector<AdamSegment>& segments, const AdamStep& a, const Tensor& params) {
  constexpr const char* op = "adamw";
  check_operands(op, master, DType::F32, {{"master", &master}, {"exp_avg", &exp_avg}, {"exp_avg_sq", &exp_avg_sq}});
  check_float(op, "grads", grads);
  check_operand(op, "grads", grads, master, grads.dtype());
  const i64 n = master.numel();
  MZ_CHECK(exp_avg.numel() == n && exp_avg_sq.numel() == n && grads.numel() == n, "adamw: sizes differ");
  // Disjoint: one pass when the segments come in order (ZeRO's do), a sorted
  // copy otherwise. Empty segments may lie anywhere inside the buffers.
  bool in_order = true;
  i64 last_end = 0;
  for (const auto& s : segments) {
    MZ_CHECK(s.begin >= 0 && s.end <= n && s.begin <= s.end, "adamw: segment [", s.begin, ", ", s.end, ") outside ", n,
             " elements");
    if (s.begin == s.end) continue;
    in_order = in_order && s.begin >= last_end;
    last_end = s.end;
  }
  if (!in_order) {
    std::vector<std::pair<i64, i64>> sorted;
    for (const auto& s : segments)
      if (s.begin < s.end) sorted.emplace_back(s.begin, s.end);
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t k = 1; k < sorted.size(); ++k)
      MZ_CHECK(sorted[k].first >= sorted[k - 1].second, "adamw: segments [", sorted[k - 1].first, ", ",
               sorted[k - 1].second, ") and [", sorted[k].first, ", ", sorted[k].second, ") overlap");
  }
  const bool publish = params.defined();
  if (publish) {
    check_float(op, "params", params);
    check_operand(op, "params", params, master, params.dtype());
    MZ_CHECK(params.numel() == n, "adamw: params has ", params.numel(), " elements, master ", n);
  }
  MZ_ON_CUDA(master, cuda::adamw(ptr<float>(master), ptr<float>(exp_avg), ptr<float>(exp_avg_sq), grads.data(),
                                 grads.dtype(), publish ? params.data() : nullptr,
                                 publish ? params.dtype() : DType::F32, segments, a, stream_of(master)));
  if (!on_host(op, master)) return;
  const AdamCoefficients c = adam_coefficients(a);
  with_storage_type(grads.dtype(), [&](auto g_tag) {
    using G = decltype(g_tag);
    const auto run = [&](auto* p) {
      for (const auto& s : segments)
        if (s.begin < s.end)
          adamw_cpu(ptr<float>(master), ptr<float>(exp_avg), ptr<float>(exp_avg_sq), ptr<const G>(grads), p, s.begin,
                    s.end, s.decay, c);
    };
    if (!publish) {
      run(static_cast<NoParams*>(nullptr));
      return;
    }
    with_storage_type(params.dtype(), [&](auto p_tag) { run(ptr<decltype(p_tag)>(params)); });
  });
}

namespace {
// sum_of_squares' and count_zeros' operands checked, and the GPU kernel's
// partial sums allocated (a meta device standing in for CUDA plans them too).
Tensor range_sum_scratch(const char* op, const Tensor& grads, const std::vector<std::pair<i64, i64>>& ranges,
                         const Tensor& out, const char* what) {
  check_float(op, "grads", grads);
  check_operand(op, "grads", grads, grads, grads.dtype());
  check_operand(op, "out", out, grads, DType::F64);
  check_rows(op, "out", out, 1);
  for (const auto& [b, e] : ranges)
    MZ_CHECK(b >= 0 && b <= e && e <= grads.numel(), op, ": range [", b, ", ", e, ") outside ", grads.numel());
  return allocate_gpu_scratch(grads, gpu_scratch::sum_of_squares_bytes(static_cast<i64>(ranges.size())), what);
}
}  // namespace

void sum_of_squares(const Tensor& grads, const std::vector<std::pair<i64, i64>>& ranges, const Tensor& out) {
  constexpr const char* op = "sum_of_squares";
  const Tensor ws = range_sum_scratch(op, grads, ranges, out, "grad norm partials");
  MZ_ON_CUDA(grads, cuda::sum_of_squares(grads.data(), grads.dtype(), ranges, scratch_of(ws), ptr<double>(out),
                                         stream_of(grads)));
  if (!on_host(op, grads)) return;
  with_storage_type(grads.dtype(), [&](auto tag) {
    using G = decltype(tag);
    ptr<double>(out)[0] = sum_of_squares_cpu(ptr<const G>(grads), ranges);
  });
}

void count_zeros(const Tensor& grads, const std::vector<std::pair<i64, i64>>& ranges, const Tensor& out) {
  constexpr const char* op = "count_zeros";
  const Tensor ws = range_sum_scratch(op, grads, ranges, out, "zeros in grad partials");
  MZ_ON_CUDA(grads, cuda::count_zeros(grads.data(), grads.dtype(), ranges, scratch_of(ws), ptr<double>(out),
                                      stream_of(grads)));
  if (!on_host(op, grads)) return;
  with_storage_type(grads.dtype(), [&](auto tag) {
    using G = decltype(tag);
    const G* g = ptr<const G>(grads);
    i64 zeros = 0;
    for (const auto& [begin, end] : ranges)
      for (i64 i = begin; i < end; ++i) zeros += widen(g[i]) == 0;
    ptr<double>(out)[0] = static_cast<double>(zeros);
  });
}

void zero_ranges(const Tensor& flat, const std::vector<std::pair<i64, i64>>& ranges) {
  constexpr const char* op = "zero_ranges";
  check_float(op, "flat", flat);
  check_operand(op, "flat", flat, flat, flat.dtype());
  for (const auto& [b, e] : ranges)
    MZ_CHECK(b >= 0 && b <= e && e <= flat.numel(), op, ": range [", b, ", ", e, ") outside ", flat.numel());
  MZ_ON_CUDA(flat, cuda::zero_ranges(flat.data(), flat.dtype(), ranges, stream_of(flat)));
  if (!on_host(op, flat)) return;
  auto* base = static_cast<unsigned char*>(flat.device().compute_address(flat.data()));  // bytes: any dtype
  const auto elem = static_cast<i64>(dtype_size(flat.dtype()));
  for (const auto& [b, e] : ranges)
    if (e > b) std::memset(base + b * elem, 0, static_cast<std::size_t>((e - b) * elem));
}

}  // namespace megazero::kernels
