// The launchers of megazero/cuda/cuda_kernels.cu (dtype conversion, GEMM's
// beta on a strided matrix, the int64 pair cuDNN's dropout reads) and
// strided_copy.cu (Device::copy_strided: head splits and merges, casts),
// whole, on the CPU (tests/cuda_emulation/README.md, "The launchers, whole"),
// with fenced device memory, against the host's megazero::convert:
// - convert over every pair of float dtypes, with values that overflow,
//   underflow to subnormals and zero, infinities and NaNs: finite results bit
//   for bit, a NaN stays a NaN; the same dtype copies (and is a no-op in place);
//   an integer dtype is refused;
// - scale_matrix on a padded (batch, rows, cols) matrix: beta = 0 writes exact
//   zeros over NaN, beta != 0 rounds fp32's product once; padding untouched;
// - store_int64_pair: a one-thread launch writing two values and nothing else;
// - strided_copy: contiguous (a copy, or the cast kernel), rows of a head
//   split (a warp a row: rows >= 1024 of >= 16 elements), element by element
//   (a transpose), integers byte for byte, a cast on the strided path; every
//   destination element not in the copy keeps its poison;
// - reduce_slots (slot_reduce.cu, the shm transport's reduction over device
//   slots): reduce_host's bytes for every dtype and op, 2 and 3 sources, one
//   launch, 16-byte packs exactly when every pointer is aligned and the length
//   a whole number of packs (else element by element: the grid says which),
//   nothing written past the result; 0 or 33 sources refused.
// Exit code 1 on any failure.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "emu_checks.h"
#include "emu_device_checks.h"
#include "emu_host.h"
#include "megazero/comm/shm_collectives.h"
#include "megazero/core/error.h"
#include "megazero/cuda/cuda_kernels.h"
#include "megazero/cuda/launch_common.h"
#include "megazero/cuda/slot_reduce.h"
#include "megazero/cuda/strided_copy.h"

using namespace megazero;
using namespace emu_checks;
using namespace emu_device_checks;

namespace {

const DType kFloats[] = {DType::F32, DType::F16, DType::BF16, DType::F64};

// Raw bytes of n elements of t, from doubles through the host's convert.
std::vector<unsigned char> bytes_of(const std::vector<double>& v, DType t) {
  std::vector<unsigned char> out(v.size() * dtype_size(t));
  convert(v.data(), DType::F64, out.data(), t, v.size());
  return out;
}

std::vector<double> doubles_of(const std::vector<unsigned char>& b, DType t) {
  std::vector<double> out(b.size() / dtype_size(t));
  convert(b.data(), t, out.data(), DType::F64, out.size());
  return out;
}

std::unique_ptr<emu::DeviceBuffer<unsigned char>> on_device(const std::vector<unsigned char>& b) {
  auto d = std::make_unique<emu::DeviceBuffer<unsigned char>>(b.size());
  d->upload(b);
  return d;
}

std::unique_ptr<emu::DeviceBuffer<unsigned char>> poison(std::size_t bytes) {
  auto d = std::make_unique<emu::DeviceBuffer<unsigned char>>(bytes);
  d->fill_bytes(0xff);
  return d;
}

// Finite values and infinities bit for bit, NaN as NaN.
void expect_converted(const std::vector<unsigned char>& got, const std::vector<unsigned char>& want, DType t,
                      const char* what) {
  const std::size_t e = dtype_size(t);
  const auto gv = doubles_of(got, t), wv = doubles_of(want, t);
  for (std::size_t i = 0; i < gv.size(); ++i)
    check(std::isnan(wv[i]) ? std::isnan(gv[i]) : std::memcmp(&got[i * e], &want[i * e], e) == 0, what, gv[i], wv[i],
          i);
}

// ------------------------------------------------------------ convert
std::vector<double> awkward_values(std::size_t n, std::mt19937& rng) {
  std::vector<double> v = randn(n, rng, 3.0);
  const double specials[] = {0.0,
                             -0.0,
                             1e5,
                             -7e4,
                             65504.0,
                             65520.0,
                             1e-8,
                             -3e-6,
                             6e-5,
                             1e-40,
                             3.4e38,
                             1e39,
                             -1e300,
                             1e-310,
                             0.1,
                             1.0 / 3,
                             2.5e-3,
                             1 + 0x1p-9,
                             1 + 0x1p-8,
                             1 + 0x1p-24,
                             std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity(),
                             std::nan("")};
  for (std::size_t i = 0; i < std::size(specials) && i < n; ++i) v[i * 7 % n] = specials[i];
  return v;
}

void conversions(std::mt19937& rng) {
  const std::size_t n = 1000;
  const auto v = awkward_values(n, rng);
  for (const DType from : kFloats)
    for (const DType to : kFloats) {
      const auto src = bytes_of(v, from);
      std::vector<unsigned char> want(n * dtype_size(to));
      convert(src.data(), from, want.data(), to, n);
      const auto ds = on_device(src);
      const auto dd = poison(want.size());
      cuda::convert(ds->get(), from, dd->get(), to, n, nullptr);
      expect_converted(dd->download(), want, to, "convert");
      if (from == to) {  // in place: nothing to do
        const Launches none;
        cuda::convert(ds->get(), from, ds->get(), to, n, nullptr);
        none.expect(0, "convert in place: launches");
        expect_converted(ds->download(), src, to, "convert in place");
      }
    }
  bool refused = false;
  const auto ids = poison(64);
  try {
    cuda::convert(ids->get(), DType::I64, ids->get(), DType::I32, 4, nullptr);
  } catch (const std::exception&) {
    refused = true;
  }
  check(refused, "convert of an integer dtype was not refused", 0, 1, 0);
}

// ------------------------------------------------------------ scale_matrix
void scale_matrix(DType t, float beta, std::mt19937& rng) {
  const std::size_t batch = 2, rows = 3, cols = 37, row_stride = 41, batch_stride = 130;
  const std::size_t total = batch * batch_stride;
  std::vector<double> v = randn(total, rng);
  for (std::size_t i = 0; i < total; i += 11) v[i] = std::nan("");  // beta = 0 must not read them
  const auto src = bytes_of(v, t);
  std::vector<unsigned char> want = src;
  const std::size_t e = dtype_size(t);
  for (std::size_t b = 0; b < batch; ++b)
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) {
        const std::size_t i = b * batch_stride + r * row_stride + c;
        if (t == DType::F64) {
          const double x = beta == 0.0f ? 0.0 : v[i] * static_cast<double>(beta);
          std::memcpy(&want[i * e], &x, e);
        } else {
          float x = 0;
          convert(&src[i * e], t, &x, DType::F32, 1);
          const float p = beta == 0.0f ? 0.0f : x * beta;  // the kernel's fp32 product, rounded once
          convert(&p, DType::F32, &want[i * e], t, 1);
        }
      }
  const auto d = on_device(src);
  cuda::scale_matrix(d->get(), t, batch, rows, cols, batch_stride, row_stride, beta, nullptr);
  expect_converted(d->download(), want, t, beta == 0.0f ? "scale_matrix, beta 0" : "scale_matrix");
}

void int64_pair() {
  emu::DeviceBuffer<std::int64_t> d(3);
  d.fill_bytes(0xab);
  const Launches one;
  cuda::store_int64_pair(d.get(), -5, std::int64_t{1} << 40, nullptr);
  one.expect(1, "store_int64_pair: launches");
  const auto got = d.download();
  check(got[0] == -5 && got[1] == (std::int64_t{1} << 40), "store_int64_pair", static_cast<double>(got[0]), -5, 0);
  std::int64_t poisoned_value;
  std::memset(&poisoned_value, 0xab, sizeof poisoned_value);
  check(got[2] == poisoned_value, "store_int64_pair wrote past its pair", static_cast<double>(got[2]), 0, 2);
}

// ------------------------------------------------------------ strided_copy
struct Copy {
  std::vector<i64> shape, src_strides, dst_strides;
  DType from, to;
};

// Elements of a strided layout: one past the largest offset.
std::size_t span(const std::vector<i64>& shape, const std::vector<i64>& strides) {
  i64 last = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) last += (shape[d] - 1) * strides[d];
  return static_cast<std::size_t>(last + 1);
}

std::vector<i64> row_major(const std::vector<i64>& shape) {
  std::vector<i64> s(shape.size());
  i64 k = 1;
  for (std::size_t d = shape.size(); d-- > 0;) {
    s[d] = k;
    k *= shape[d];
  }
  return s;
}

void strided(const Copy& c, std::mt19937& rng, const char* what, long want_launches) {
  const std::size_t es = dtype_size(c.from), ed = dtype_size(c.to);
  const std::size_t ns = span(c.shape, c.src_strides), nd = span(c.shape, c.dst_strides);
  std::vector<unsigned char> src(ns * es);
  if (is_floating(c.from)) {
    src = bytes_of(randn(ns, rng, 2.0), c.from);
  } else {
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto& b : src) b = static_cast<unsigned char>(byte(rng));
  }
  std::vector<unsigned char> want(nd * ed, 0xff);
  i64 n = 1;
  for (const i64 s : c.shape) n *= s;
  for (i64 i = 0; i < n; ++i) {
    i64 rest = i, so = 0, dof = 0;
    for (std::size_t d = c.shape.size(); d-- > 0;) {
      const i64 idx = rest % c.shape[d];
      rest /= c.shape[d];
      so += idx * c.src_strides[d];
      dof += idx * c.dst_strides[d];
    }
    const auto* sp = &src[static_cast<std::size_t>(so) * es];
    auto* dp = &want[static_cast<std::size_t>(dof) * ed];
    if (c.from == c.to)
      std::memcpy(dp, sp, es);
    else
      convert(sp, c.from, dp, c.to, 1);
  }
  const auto ds = on_device(src);
  const auto dd = poison(want.size());
  const Launches launches;
  cuda::strided_copy(ds->get(), c.from, c.src_strides.data(), dd->get(), c.to, c.dst_strides.data(), c.shape.data(),
                     static_cast<int>(c.shape.size()), nullptr);
  launches.expect(want_launches, what);
  const auto got = dd->download();
  if (is_floating(c.to)) {
    expect_converted(got, want, c.to, what);
  } else {
    for (std::size_t i = 0; i < got.size(); ++i) check(got[i] == want[i], what, got[i], want[i], i);
  }
}

void strided_copies(std::mt19937& rng) {
  // Contiguous: a device copy (no launch), or the cast kernel.
  const std::vector<i64> flat{7, 33};
  strided({flat, row_major(flat), row_major(flat), DType::BF16, DType::BF16}, rng, "strided_copy, contiguous copy", 0);
  strided({flat, row_major(flat), row_major(flat), DType::F32, DType::BF16}, rng, "strided_copy, contiguous cast", 1);
  // A head split: [B, S, H, D] read as [B, H, S, D] (rows of D contiguous on
  // both sides, 2 x 3 x 200 rows of 20): a warp a row.
  const std::vector<i64> split{2, 3, 200, 20};
  const std::vector<i64> bshd = {200 * 3 * 20, 20, 3 * 20, 1};
  strided({split, bshd, row_major(split), DType::BF16, DType::BF16}, rng, "strided_copy, head split", 1);
  strided({split, bshd, row_major(split), DType::F16, DType::F32}, rng, "strided_copy, head split with a cast", 1);
  // Element by element: a transpose (the last dimension strided), padding in
  // the destination rows; integers byte for byte.
  const std::vector<i64> mat{19, 23};
  strided({mat, {1, 19}, {30, 1}, DType::F32, DType::F32}, rng, "strided_copy, transpose", 1);
  strided({mat, {1, 19}, {30, 1}, DType::F64, DType::F16}, rng, "strided_copy, transpose with a cast", 1);
  strided({mat, {1, 19}, {30, 1}, DType::I64, DType::I64}, rng, "strided_copy, int64 transpose", 1);
  strided({mat, {1, 19}, {30, 1}, DType::U8, DType::U8}, rng, "strided_copy, byte transpose", 1);
  // Rows too short for a warp each: element by element.
  const std::vector<i64> narrow{1100, 5};
  strided({narrow, {5, 1}, {8, 1}, DType::BF16, DType::BF16}, rng, "strided_copy, short rows", 1);
  bool refused = false;
  try {
    const std::vector<i64> nine(9, 1);
    cuda::strided_copy(nullptr, DType::F32, nine.data(), nullptr, DType::F32, nine.data(), nine.data(), 9, nullptr);
  } catch (const std::exception&) {
    refused = true;
  }
  check(refused, "strided_copy of 9 dimensions was not refused", 0, 1, 0);
}

}  // namespace

// ------------------------------------------------------------ reduce_slots
std::vector<unsigned char> random_elements(DType t, std::size_t n, std::mt19937& rng) {
  std::vector<unsigned char> out(n * dtype_size(t));
  if (is_floating(t)) {
    std::normal_distribution<double> d(0.0, 50.0);
    std::vector<double> v(n);
    for (auto& x : v) x = d(rng);
    return bytes_of(v, t);
  }
  std::uniform_int_distribution<std::int64_t> d(-(std::int64_t{1} << 40), std::int64_t{1} << 40);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t x = d(rng);
    std::memcpy(&out[i * dtype_size(t)], &x, dtype_size(t));  // the low bytes: any value of t
  }
  return out;
}

void slot_reduction(DType t, ReduceOp op, int nsrc, std::size_t n, std::size_t shift, std::mt19937& rng) {
  const std::size_t e = dtype_size(t), bytes = n * e;
  std::vector<std::vector<unsigned char>> host(static_cast<std::size_t>(nsrc));
  std::vector<std::unique_ptr<emu::DeviceBuffer<unsigned char>>> dev;
  std::vector<const void*> host_ptrs, dev_ptrs;
  for (auto& h : host) {
    h = random_elements(t, n, rng);
    std::vector<unsigned char> shifted(shift, 0);
    shifted.insert(shifted.end(), h.begin(), h.end());
    dev.push_back(on_device(shifted));
    host_ptrs.push_back(h.data());
    dev_ptrs.push_back(dev.back()->get() + shift);
  }
  std::vector<unsigned char> want(bytes);
  reduce_host(t, op, want.data(), host_ptrs, n, nsrc);
  const auto out = poison(bytes + shift);
  const cuda::SlotReduce o = op == ReduceOp::Max   ? cuda::SlotReduce::Max
                             : op == ReduceOp::Avg ? cuda::SlotReduce::Avg
                                                   : cuda::SlotReduce::Sum;
  LaunchLog log;
  cuda::reduce_slots(t, o, out->get() + shift, dev_ptrs.data(), nsrc, static_cast<i64>(n), nsrc, nullptr);
  const std::size_t vec = 16 / e;
  const bool packed = shift == 0 && n % vec == 0;
  check(log.launches.size() == 1, "reduce_slots: one launch", static_cast<double>(log.launches.size()), 1, 0);
  if (log.launches.size() == 1)
    check(log.launches[0].grid.x == cuda::detail_k::blocks_for(static_cast<i64>(packed ? n / vec : n)),
          packed ? "reduce_slots: a grid of 16-byte packs" : "reduce_slots: a grid of elements", log.launches[0].grid.x,
          cuda::detail_k::blocks_for(static_cast<i64>(packed ? n / vec : n)), 0);
  const auto got = out->download();
  for (std::size_t i = 0; i < n; ++i)
    check(std::memcmp(&got[shift + i * e], &want[i * e], e) == 0, "reduce_slots: reduce_host's bytes", 0, 0, i);
  for (std::size_t i = 0; i < shift; ++i) check(got[i] == 0xff, "reduce_slots wrote before its result", got[i], 255, i);
}

void slot_reductions(std::mt19937& rng) {
  for (const DType t : {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::I64, DType::U8}) {
    std::vector<ReduceOp> ops = {ReduceOp::Max};
    if (t != DType::U8) ops.push_back(ReduceOp::Sum);
    if (is_floating(t)) ops.push_back(ReduceOp::Avg);
    for (const ReduceOp op : ops)
      for (const int nsrc : {2, 3})
        for (const std::size_t n : {std::size_t{4096}, std::size_t{4099}})
          for (const std::size_t shift : {std::size_t{0}, dtype_size(t)}) slot_reduction(t, op, nsrc, n, shift, rng);
  }
  for (const int nsrc : {0, 33}) {
    bool refused = false;
    try {
      const void* none[33] = {};
      cuda::reduce_slots(DType::F32, cuda::SlotReduce::Sum, nullptr, none, nsrc, 1, 1, nullptr);
    } catch (const InternalError&) {
      refused = true;
    }
    check(refused, "reduce_slots: a source count outside 1-32 is refused", nsrc, 0, 0);
  }
}

int main() {
  return run_launcher_test([] {
    std::mt19937 rng(2028);
    conversions(rng);
    for (const DType t : kFloats)
      for (const float beta : {0.0f, 0.375f, -1.7f}) scale_matrix(t, beta, rng);
    int64_pair();
    strided_copies(rng);
    slot_reductions(rng);
  });
}
