// AdamW's per-element formula, the one definition the CPU kernel
// (optimizer_kernels.cpp) and the CUDA kernel (megazero/cuda/optimizer_kernels.cuh)
// both call, so the two devices compute the same bits.
//
// Arithmetic is fp32, as PyTorch's fused AdamW, Apex's and DeepSpeed's FusedAdam
// compute it: the master weights and moments are fp32, so double arithmetic
// changed nothing a step keeps beyond the last bit of an update, and on a GPU
// it cost more than the step's memory traffic (three fp64 divisions and a
// square root per element on fp64 units a sixteenth to a half as wide as fp32's).
// The per-step scalars (bias corrections, step size, decay factor) are
// computed once in double and rounded to fp32 once (adam_coefficients).
//
// Every operation is rounded on its own, in the order written: on a GPU the
// _rn intrinsics (which nvcc never fuses into multiply-adds; division and
// square root correctly rounded), on the CPU plain operators in files built
// with -ffp-contract=off (IEEE division and square root are correctly rounded
// too). So the result does not depend on the device, the vector width or the
// thread count.
#pragma once

#include <cmath>

#include "megazero/kernels/optimizer_kernels.h"

// Always inlined: each caller's own flags (-ffp-contract=off) then apply,
// never an out-of-line copy another file compiled.
#if defined(__CUDACC__)
#define MZ_ADAM_HD __host__ __device__ __forceinline__
#else
#define MZ_ADAM_HD [[gnu::always_inline]] inline
#endif

namespace megazero::kernels {

// One step's fp32 scalars, from AdamStep (double).
struct AdamCoefficients {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float grad_scale;    // 1 / loss scale x clip coefficient
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float eps;
  float step_size;     // lr / (1 - beta1^t)
  float decay_factor;  // 1 - lr x weight_decay: a decayed segment's weights are multiplied by it
};

inline AdamCoefficients adam_coefficients(const AdamStep& a) {
  const auto f = [](double x) { return static_cast<float>(x); };
  return {f(a.beta1),     f(1 - a.beta1),  f(a.beta2),
          f(1 - a.beta2), f(a.grad_scale), f(1 / std::sqrt(a.bc2)),
          f(a.eps),       f(a.lr / a.bc1), f(1 - a.lr * a.weight_decay)};
}

namespace adam_ops {
MZ_ADAM_HD float mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
MZ_ADAM_HD float add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
MZ_ADAM_HD float sub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
MZ_ADAM_HD float div(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
MZ_ADAM_HD float sqrt(float a) {
#ifdef __CUDA_ARCH__
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
}  // namespace adam_ops

// One element's step: grad is the raw gradient (converted to fp32), decay_factor
// c.decay_factor on a decayed segment and 1 elsewhere (w x 1 is w exactly).
//   g = grad x scale;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   w = w x (1 - lr wd) - (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps)
MZ_ADAM_HD void adamw_element(float& w, float& m, float& v, float grad, float decay_factor, const AdamCoefficients& c) {
  using namespace adam_ops;
  const float g = mul(grad, c.grad_scale);
  m = add(mul(c.beta1, m), mul(c.one_minus_beta1, g));
  v = add(mul(c.beta2, v), mul(c.one_minus_beta2, mul(g, g)));
  const float denom = add(mul(adam_ops::sqrt(v), c.inv_sqrt_bc2), c.eps);
  w = sub(mul(w, decay_factor), div(mul(c.step_size, m), denom));
}

}  // namespace megazero::kernels

#undef MZ_ADAM_HD
