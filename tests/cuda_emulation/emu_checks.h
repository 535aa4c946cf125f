// What the emulated-kernel tests share: checks that count failures (the test
// exits 1 if any), CPU tensors from values, and the emulated GPU's storage
// types with bit-for-bit views of megazero's tensors.
#pragma once

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "emu_runtime.h"
#include "megazero/core/tensor.h"

namespace emu_checks {

using namespace megazero;
using i64 = std::int64_t;

inline int failures = 0;

inline void check(bool ok, const char* what, double got, double want, std::size_t at) {
  if (ok) return;
  if (++failures <= 20) std::printf("FAIL %s at %zu: got %.9g, want %.9g\n", what, at, got, want);
}

// |a - b| <= rtol |b| + atol, element by element.
inline void expect_close(const std::vector<double>& a, const std::vector<double>& b, double rtol, double atol,
                         const char* what) {
  for (std::size_t i = 0; i < a.size(); ++i)
    check(a[i] == b[i] || (std::isfinite(a[i]) && std::fabs(a[i] - b[i]) <= rtol * std::fabs(b[i]) + atol), what, a[i],
          b[i], i);  // equal: also the -inf max of an all-padding slice
}

// n normal values (mean 0, standard deviation sd).
inline std::vector<double> randn(std::size_t n, std::mt19937& rng, double sd = 1.0) {
  std::normal_distribution<double> d(0.0, sd);
  std::vector<double> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::shared_ptr<Device> cpu() {
  static auto d = make_device(DeviceKind::CPU);
  return d;
}

inline Tensor tensor_of(const Shape& shape, const std::vector<double>& v, DType t) {
  Tensor x = Tensor::empty(cpu(), shape, DType::F64, MemoryCategory::Other);
  std::copy(v.begin(), v.end(), x.host_data<double>());
  return x.to(t, MemoryCategory::Other);
}

inline Tensor ids_of(const std::vector<std::int64_t>& v) {
  Tensor x = Tensor::empty(cpu(), {static_cast<i64>(v.size())}, DType::I64, MemoryCategory::Other);
  std::copy(v.begin(), v.end(), x.host_data<std::int64_t>());
  return x;
}

// The emulated GPU's storage type for a dtype.
template <DType T>
struct Storage;
template <>
struct Storage<DType::F32> {
  using type = float;
};
template <>
struct Storage<DType::BF16> {
  using type = __nv_bfloat16;
};
template <>
struct Storage<DType::F16> {
  using type = __half;
};

// Bit-for-bit views: megazero's 16-bit types and the shim's have the same layout.
template <typename S>
S* raw(Tensor& t) {
  static_assert(sizeof(S) == 2 || sizeof(S) == 4);
  return static_cast<S*>(t.data());
}

// Relative error allowed between the emulated GPU kernel and the CPU kernel
// for a value rounded to the storage type (the GPU computes exp in whatever
// precision its libm gives; one rounding step of the storage type).
inline double ulp_of(DType t) { return t == DType::F32 ? 0x1p-22 : t == DType::BF16 ? 0x1p-7 : 0x1p-10; }

inline std::vector<double> values(const Tensor& t) { return t.to_double_vector(); }

}  // namespace emu_checks
