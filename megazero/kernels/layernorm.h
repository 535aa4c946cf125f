// LayerNorm over the last dimension. Dtype rules, rows/cols and accumulate vs
// overwrite: conventions.h.
#pragma once

#include "megazero/core/tensor.h"
#include "megazero/kernels/conventions.h"

namespace megazero::kernels {

// y = (x - mean) * rstd * gamma + beta; saves mean and rstd ([rows],
// row_stat_dtype(x.dtype())). y may alias x.
void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& y, Tensor& mean,
                       Tensor& rstd);
// dx = overwritten (may alias dy); dgamma, dbeta accumulated. With add_to_dx,
// dx = (LayerNorm's input gradient) + *add_to_dx, rounded once: a pre-LN
// block's residual gradient joins in the same pass (same shape and dtype as dx).
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                        Tensor& dx, Tensor& dgamma, Tensor& dbeta, const Tensor* add_to_dx = nullptr);

}  // namespace megazero::kernels
