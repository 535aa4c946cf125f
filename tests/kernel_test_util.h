// What the layer kernel test files (test_<family>_kernels.cpp,
// test_kernel_conventions.cpp) share: CPU tensors from and to vectors of
// doubles (and, for the files whose kernels run on the test device, tensors
// there: on_test_device), random inputs, tolerance and finite-difference
// checks, the check that a call is rejected with a given message, the
// rounding helpers of the 16-bit storage tests, and the same-bits check over
// CPU thread counts; plus the causal softmax's reference, which the softmax and
// cross-entropy files both use.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "megazero/kernels/cpu_threads.h"
#include "megazero/core/error.h"
#include "megazero/core/tensor.h"
#include "megazero/kernels/softmax.h"
#include "test_device.h"

namespace kernel_test {

using namespace megazero;
using namespace megazero::kernels;
using MC = MemoryCategory;
using Vec = std::vector<double>;
using i64 = std::int64_t;

inline const std::shared_ptr<Device>& cpu() {
  static const auto device = make_device(DeviceKind::CPU);
  return device;
}

// The test device (tests/test_device.h: $MEGAZERO_TEST_DEVICE, the CPU by
// default; cuda on a GPU machine, cpu-isolated to catch host access).
inline const std::shared_ptr<Device>& test_dev() {
  static const auto device = test_support::test_device();
  return device;
}

inline Tensor tensor_on(const std::shared_ptr<Device>& device, const Shape& shape, const Vec& values, DType t) {
  Tensor out = Tensor::empty(device, shape, t, MC::Other);
  out.copy_from_doubles(values);
  return out;
}

inline Tensor tensor(const Shape& shape, const Vec& values, DType t = DType::F64) {
  return tensor_on(cpu(), shape, values, t);
}

inline Tensor empty(const Shape& shape, DType t = DType::F64) { return Tensor::empty(cpu(), shape, t, MC::Other); }

// tensor() and empty() on the test device (and zeros()), for the files whose
// kernels run there: they name these with a using-declaration in their own
// namespace, which hides the CPU ones above.
namespace on_test_device {
inline Tensor tensor(const Shape& shape, const Vec& values, DType t = DType::F64) {
  return tensor_on(test_dev(), shape, values, t);
}
inline Tensor empty(const Shape& shape, DType t = DType::F64) { return Tensor::empty(test_dev(), shape, t, MC::Other); }
inline Tensor zeros(const Shape& shape, DType t) { return Tensor::zeros(test_dev(), shape, t, MC::Other); }
}  // namespace on_test_device

// An output operand made on the spot (it lives to the end of the call's full
// expression), for a call that takes a Tensor&.
inline Tensor& out(Tensor&& t) { return t; }

inline Tensor ids_tensor(const std::vector<i64>& ids) {
  Tensor out = Tensor::empty(cpu(), {static_cast<i64>(ids.size())}, DType::I64, MC::Other);
  std::copy(ids.begin(), ids.end(), out.host_data<i64>());
  return out;
}

inline Vec vals(const Tensor& t) { return t.to_double_vector(); }

inline Vec randn(std::size_t n, std::mt19937& rng, double sd = 1.0) {
  std::normal_distribution<double> d(0.0, sd);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Rounds to fp32 so that fp32 and fp64 runs see identical inputs.
inline Vec to_f32(Vec v) {
  for (auto& x : v) x = static_cast<float>(x);
  return v;
}

inline Vec minus(const Vec& a, const Vec& b) {
  Vec out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) out[i] = a[i] - b[i];
  return out;
}

inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

inline void expect_close(const Vec& got, const Vec& want, double rtol, double atol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool ok = std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i]);
    if (!ok && reported++ < 5) ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
  }
}

// |got - want| <= tol[i], element-wise.
inline void expect_within(const Vec& got, const Vec& want, const Vec& tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= tol[i]) && reported++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i] << " (tolerance " << tol[i]
                    << ")";
}

// Central differences of L(x) = sum(w * f(x)) at every element of x, against
// the analytic gradient `grad`. With h = 1e-6 in fp64 the difference quotient
// is good to ~1e-9 absolute for O(1) values, so a relative tolerance of 1e-6
// (floored at 1e-8 of the largest gradient) catches any wrong term.
inline void expect_fd_gradient(const std::string& what, const Vec& x, const std::function<Vec(const Vec&)>& f,
                               const Vec& w, const Vec& grad) {
  ASSERT_EQ(x.size(), grad.size()) << what;
  constexpr double h = 1e-6;
  double gmax = 0;
  for (double g : grad) gmax = std::max(gmax, std::fabs(g));
  int reported = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    Vec xp = x, xm = x;
    xp[i] += h;
    xm[i] -= h;
    const double fd = (dot(w, f(xp)) - dot(w, f(xm))) / (2 * h);
    const double tol = 1e-6 * (std::fabs(fd) + 0.01 * gmax) + 1e-12;
    if (std::fabs(grad[i] - fd) > tol && reported++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: analytic " << grad[i] << ", finite differences " << fd;
  }
}

// f must throw an InternalError whose message contains `needle`: the check
// meant, not some other one, rejected the call.
inline void expect_rejected(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    return;
  }
  ADD_FAILURE() << "no InternalError; expected one containing '" << needle << "'";
}

inline i64 numel(const Shape& s) { return shape_numel(s); }
inline std::size_t usize(i64 n) { return static_cast<std::size_t>(n); }

// =========================== causal softmax ===========================

inline Vec causal_softmax_ref(const Vec& s, i64 mats, i64 n, double scale) {
  Vec p(s.size(), 0.0);
  for (i64 m = 0; m < mats; ++m)
    for (i64 i = 0; i < n; ++i) {
      const std::size_t row = usize((m * n + i) * n);
      double mx = -1e300, sum = 0;
      for (i64 j = 0; j <= i; ++j) mx = std::max(mx, scale * s[row + usize(j)]);
      for (i64 j = 0; j <= i; ++j) sum += std::exp(scale * s[row + usize(j)] - mx);
      for (i64 j = 0; j <= i; ++j) p[row + usize(j)] = std::exp(scale * s[row + usize(j)] - mx) / sum;
    }
  return p;
}

inline Vec softmax_run(const Shape& shape, const Vec& s, double scale, DType t) {
  Tensor p = empty(shape, t);
  causal_softmax_forward(tensor(shape, s, t), scale, p);
  return vals(p);
}

// =========================== 16-bit storage ===========================
// Every kernel again with bf16 and fp16 tensors. Inputs are rounded to the
// dtype first and the fp64 reference sees the same rounded values, so what may
// differ is the one rounding of each output (plus the fp32 arithmetic where a
// kernel computes in fp32). Where the kernel's arithmetic is exactly that of the
// fp32 path (elementwise kernels) or the fp64 path (LayerNorm, sums in double),
// the 16-bit result is also checked bit for bit against that result rounded
// once to nearest even.

inline constexpr DType kHalfDtypes[] = {DType::BF16, DType::F16};
inline constexpr DType kAllDtypes[] = {DType::F64, DType::F32, DType::BF16, DType::F16};

// Unit roundoff: rounding to nearest errs by at most u |value| ...
inline double unit_roundoff(DType t) {
  switch (t) {
    case DType::F64:
      return 0x1p-53;
    case DType::F32:
      return 0x1p-24;
    case DType::BF16:
      return 0x1p-8;
    default:
      return 0x1p-11;
  }
}
// ... or, below the normal range, by half the (fixed) subnormal spacing.
inline double subnormal_error(DType t) {
  return t == DType::F16 ? 0x1p-25 : t == DType::BF16 ? 0x1p-134 : t == DType::F32 ? 0x1p-150 : 0.0;
}

// The values a tensor of dtype t holds for `v` (the test inputs).
inline Vec rounded(const Vec& v, DType t) { return vals(tensor({static_cast<i64>(v.size())}, v, t)); }

// The 16-bit value nearest to each (finite, in-range) v, ties to even, chosen
// among the neighbours of the double -> fp32 -> 16-bit conversion (which may be
// one off after its double rounding). Written independently of the kernels.
// For t fp32, v rounded to fp32.
inline Vec round_once(const Vec& v, DType t) {
  if (t == DType::F32) return to_f32(v);
  const auto decode = [t](std::uint16_t b) {
    return t == DType::BF16 ? static_cast<double>(bf16_to_float(BFloat16{b})) : half_to_float(Half{b});
  };
  Vec out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const float f = static_cast<float>(v[i]);
    std::uint16_t best = t == DType::BF16 ? float_to_bf16(f).bits : float_to_half(f).bits;
    for (int d : {-1, 1}) {
      const auto nb = static_cast<std::uint16_t>(best + d);
      const double e = std::fabs(decode(nb) - v[i]), eb = std::fabs(decode(best) - v[i]);
      if (e < eb || (e == eb && (nb & 1u) == 0)) best = nb;  // NaN neighbours compare false
    }
    out[i] = decode(best);
  }
  return out;
}

// |got - want| <= factor * u * |want| + atol + subnormal_error, element-wise.
// factor 1.01 leaves 1% of a rounding for fp32 arithmetic before it (an fp32
// operation errs by 2^-24 relative: 2^-16 of a bf16 and 2^-13 of an fp16
// rounding); a conversion that truncates errs by up to 2u and fails.
inline void expect_one_rounding(const Vec& got, const Vec& want, DType t, const std::string& what, const Vec& atol,
                                double factor = 1.01) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double tol = factor * unit_roundoff(t) * std::fabs(want[i]) + atol[i] + subnormal_error(t);
    if (!(std::fabs(got[i] - want[i]) <= tol) && reported++ < 5)
      ADD_FAILURE() << what << " (" << dtype_name(t) << ")[" << i << "]: got " << got[i] << ", want " << want[i]
                    << ", error " << std::fabs(got[i] - want[i]) / (unit_roundoff(t) * std::fabs(want[i]))
                    << " roundings";
  }
}
inline void expect_one_rounding(const Vec& got, const Vec& want, DType t, const std::string& what, double atol = 0) {
  expect_one_rounding(got, want, t, what, Vec(want.size(), atol));
}

// Bit-for-bit equality (as doubles), reporting the first few differences.
inline void expect_same(const Vec& got, const Vec& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && reported++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
}

// ======================= CPU thread counts =======================

// Puts the CPU math thread count back as it was when this goes out of scope
// (also when a kernel throws or an ASSERT returns early).
class CpuMathThreadsRestorer {
 public:
  CpuMathThreadsRestorer() = default;
  CpuMathThreadsRestorer(const CpuMathThreadsRestorer&) = delete;
  CpuMathThreadsRestorer& operator=(const CpuMathThreadsRestorer&) = delete;
  ~CpuMathThreadsRestorer() { set_cpu_math_threads(before_); }

 private:
  int before_ = cpu_math_threads();
};

// outputs(t), for each dtype t, run with 1 and with 4 CPU math threads: the
// same bits, output by output.
template <typename DTypes>
void expect_same_bits_with_1_and_4_threads(const DTypes& dtypes,
                                           const std::function<std::vector<Vec>(DType)>& outputs) {
  const CpuMathThreadsRestorer restore;
  for (DType t : dtypes) {
    set_cpu_math_threads(1);
    const std::vector<Vec> one = outputs(t);
    set_cpu_math_threads(4);
    const std::vector<Vec> four = outputs(t);
    for (std::size_t k = 0; k < one.size(); ++k) EXPECT_EQ(one[k], four[k]) << dtype_name(t) << " output " << k;
  }
}

}  // namespace kernel_test
