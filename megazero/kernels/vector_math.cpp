#include "megazero/kernels/vector_math.h"

#include <algorithm>
#include <cmath>
#include <limits>

// glibc declares its vector variants only under -ffast-math; declaring expf
// `omp declare simd` here lets `omp simd` loops call libmvec
// (_ZGVeN16v_expf, _ZGVdN8v_expf, _ZGVbN4v_expf) without fast-math's licence
// to reorder the rest of the arithmetic. libm's linker script links libmvec.
// x86-64 glibc only (Debian's, which the project targets); elsewhere the same
// loops call the scalar expf.
#if defined(__x86_64__) && defined(__GLIBC__)
extern "C" {
#pragma omp declare simd notinbranch
float expf(float) noexcept;
}
// One clone per ISA, picked by the dynamic loader for the running CPU.
#define MZ_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MZ_SIMD_CLONES
#endif

namespace megazero::kernels {

MZ_SIMD_CLONES float scaled_max(const float* x, float scale, std::int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
  for (std::int64_t i = 0; i < n; ++i) mx = std::max(mx, scale * x[i]);
  return mx;
}

double scaled_max(const double* x, double scale, std::int64_t n) {
  double mx = -std::numeric_limits<double>::infinity();
  for (std::int64_t i = 0; i < n; ++i) mx = std::max(mx, scale * x[i]);
  return mx;
}

MZ_SIMD_CLONES double exp_scaled_shifted(const float* x, float scale, float shift, float* y, std::int64_t n) {
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (std::int64_t i = 0; i < n; ++i) {
    const float e = expf(scale * x[i] - shift);
    y[i] = e;
    sum += e;
  }
  return sum;
}

double exp_scaled_shifted(const double* x, double scale, double shift, double* y, std::int64_t n) {
  double sum = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    y[i] = std::exp(scale * x[i] - shift);
    sum += y[i];
  }
  return sum;
}

}  // namespace megazero::kernels
