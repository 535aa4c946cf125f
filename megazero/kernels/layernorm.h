// LayerNorm over the last dimension. Dtype rules, rows/cols and accumulate vs
// overwrite: conventions.h.
#pragma once

#include "megazero/core/tensor.h"
#include "megazero/kernels/conventions.h"
#include "megazero/kernels/dropout.h"

namespace megazero::kernels {

// y = (x - mean) * rstd * gamma + beta; saves mean and rstd ([rows],
// row_stat_dtype(x.dtype())). y may alias x.
void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& y, Tensor& mean,
                       Tensor& rstd);
// bias_dropout_add(y, *before.bias, *before.residual, ...) into *before.out,
// then layernorm_forward of it into y_ln, mean, rstd: the same values as the
// two calls, which is what the CPU runs. On a GPU one pass where the fast
// forward applies and the layout's rows are y's rows (a hidden-state layout):
// a transformer layer's attention output bias-dropout-add and LN2 (the
// LayerNorm's read of the sum saved). y_ln must not share the sum's storage.
void bias_dropout_add_layernorm(const Tensor& y, const BiasDropoutAddOf& before, const Tensor& gamma,
                                const Tensor& beta, double eps, Tensor& y_ln, Tensor& mean, Tensor& rstd);

// How the CUDA backward reads dy and x: once (dx, dgamma and dbeta in one
// pass, wherever gpu_scratch::layernorm_fused_plan allows) or twice (Split:
// the column sums, then dx: what ran before, kept so bench_kernels times one
// against the other). OnePass copies the next row's dy, x and residual
// gradient ahead only with one pack a thread; OnePassPrefetched always (with
// two packs a thread it costs half the blocks an SM, and in
// layernorm_backward_dropout it sums the bias gradient in the kernel too).
// Auto, the default, is what an H200 measured faster (bench_kernels,
// 2026-11-28, [32768, 8192] bf16): OnePass for layernorm_backward (0.609 ms
// against 0.656 prefetched), OnePassPrefetched for layernorm_backward_dropout
// (1.125 ms against 1.280). The CPU kernel has one way.
enum class LayerNormBackwardPasses { Auto, Split, OnePass, OnePassPrefetched };

// dx = overwritten (may alias dy); dgamma, dbeta accumulated. With add_to_dx,
// dx = (LayerNorm's input gradient) + *add_to_dx, rounded once: a pre-LN
// block's residual gradient joins in the same pass (same shape and dtype as dx).
// dgamma/dbeta are sums in double on the CPU; the CUDA one-pass kernel adds
// each lane's rows in fp32 first (up to ~125 rows, see layernorm_fused_plan),
// then in double.
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                        Tensor& dx, Tensor& dgamma, Tensor& dbeta, const Tensor* add_to_dx = nullptr,
                        LayerNormBackwardPasses passes = LayerNormBackwardPasses::Auto);

// layernorm_backward (with add_to_dx), then then.out = the dropout backward
// of dx and *then.dbias += its column sums (DropoutBackwardOf): the same
// values as layernorm_backward followed by dropout_backward_of(dx, then),
// which is what the CPU runs. On a GPU one pass where the one-pass backward
// applies and the layout's rows are dx's rows (a hidden-state layout): dx and
// *then.out are written by the same kernel, *then.dbias summed in it with one
// pack a thread or OnePassPrefetched (else right after it), dgamma/dbeta/dbias
// in the same accumulator dtype; otherwise (or with Split) the two calls.
// *then.out must not share dx's or dy's storage.
void layernorm_backward_dropout(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta, const Tensor* add_to_dx,
                                const DropoutBackwardOf& then,
                                LayerNormBackwardPasses passes = LayerNormBackwardPasses::Auto);

}  // namespace megazero::kernels
