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
#pragma omp declare simd notinbranch
float tanhf(float) noexcept;
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

namespace {
// 16 lanes: a whole number of vectors at every ISA's width (4, 8, 16), so a
// block's loop has no scalar remainder.
constexpr std::int64_t kTanhBlock = 16;

MZ_SIMD_CLONES void tanh_blocks(const float* u, float* t, std::int64_t blocks) {
  for (std::int64_t b = 0; b < blocks; ++b) {
    const float* ub = u + b * kTanhBlock;
    float* tb = t + b * kTanhBlock;
#pragma omp simd
    for (std::int64_t k = 0; k < kTanhBlock; ++k) tb[k] = tanhf(ub[k]);
  }
}
}  // namespace

void tanh_f32(const float* u, float* t, std::int64_t n) {
  const std::int64_t whole = n / kTanhBlock;
  tanh_blocks(u, t, whole);
  const std::int64_t done = whole * kTanhBlock;
  if (done == n) return;
  float in[kTanhBlock] = {}, out[kTanhBlock];
  std::copy(u + done, u + n, in);
  tanh_blocks(in, out, 1);
  std::copy(out, out + (n - done), t + done);
}

}  // namespace megazero::kernels
