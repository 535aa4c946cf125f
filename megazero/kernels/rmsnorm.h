// RMSNorm over the last dimension (Zhang & Sennrich 2019; Llama, Megatron's
// --normalization RMSNorm): no mean subtraction and no bias.
//   rstd = 1 / sqrt(mean_c(x^2) + eps),  y = x * rstd * gamma
// Dtype rules are conventions.h's: 16-bit storage computes in fp32 (sums in
// double), rounds each result once; rstd is [rows] of row_stat_dtype(x).
#pragma once

#include "megazero/core/tensor.h"

namespace megazero::kernels {

// y may alias x.
void rmsnorm_forward(const Tensor& x, const Tensor& gamma, double eps, Tensor& y, Tensor& rstd);
// dx overwritten (may alias dy); dgamma accumulated (+=; storage dtype or fp32
// for 16-bit storage, as layernorm's). With add_to_dx, dx = RMSNorm's input
// gradient + *add_to_dx, rounded once (the pre-norm block's residual gradient).
//   dx = rstd * (gamma*dy - x * rstd^2 * mean_c(gamma*dy*x))
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd, Tensor& dx,
                      Tensor& dgamma, const Tensor* add_to_dx = nullptr);

}  // namespace megazero::kernels
