// The vocabulary-parallel cross-entropy's pieces; layers/cross_entropy.cpp
// puts them together with the TP reductions. Dtype rules: conventions.h.
#pragma once

#include <cstdint>

#include "megazero/core/tensor.h"
#include "megazero/kernels/conventions.h"

namespace megazero::kernels {

// logits: [N, V_local]; only the first `valid` columns are real vocabulary
// (the rest is padding: excluded from max and sum, zero gradient).
// Statistics (row_max, global_max, sum_exp, target_logit, loss) are [N] of
// row_stat_dtype(logits.dtype()).
//
// Forward, reading the logits and writing nothing over them: row_max = the max
// of this rank's columns; sum_exp = the sum of exp(logits - row_max) over
// them, taken in double (the CUDA kernel reads each row once, rescaling its
// running sum when the running max grows); target_logit = logits[n, t -
// vocab_start] if this rank holds the target t, else 0 (the TP sum completes
// it). The backward recomputes the exponentials from the logits, so the
// [N, V_local] tensor is written once a step (by the backward) where keeping
// the exponentials in place wrote it twice.
void cross_entropy_forward(const Tensor& logits, const Tensor& targets, std::int64_t vocab_start, std::int64_t valid,
                           Tensor& row_max, Tensor& sum_exp, Tensor& target_logit);
// Tensor parallel: given global_max = the max over the TP ranks of row_max,
// sum_exp *= exp(row_max - global_max), after which the ranks' sums add up.
void rescale_sum_exp(const Tensor& row_max, const Tensor& global_max, Tensor& sum_exp);
// loss[n] = log(sum_exp[n]) + global_max[n] - target_logit[n], with sum_exp and
// target_logit completed over the TP group (computed in double, rounded once).
//
// Row weights (--eod-mask-loss): `weight`, when given, is [N] of the
// statistics' dtype; row n's loss is multiplied by weight[n] (in double,
// before the one rounding) and its gradient's scale is scale * weight[n]. A
// weight of 0 drops the row (loss and gradient exactly 0), 1 keeps its bits.
void cross_entropy_loss(const Tensor& global_max, const Tensor& sum_exp, const Tensor& target_logit, Tensor& loss,
                        const Tensor* weight = nullptr);
// dlogits = scale * (softmax - onehot(target)) with softmax = exp(logits -
// global_max) / sum_exp (the exponential in the compute type, the product in
// double, rounded once; sum_exp completed over TP); padding columns get 0.
// dlogits may alias logits. With `weight`, row n's scale is scale * weight[n].
void cross_entropy_backward(const Tensor& logits, const Tensor& global_max, const Tensor& sum_exp,
                            const Tensor& targets, std::int64_t vocab_start, std::int64_t valid, double scale,
                            Tensor& dlogits, const Tensor* weight = nullptr);

// Tensor parallel size 1 (this rank's columns are the whole vocabulary, so
// the row statistics are the global ones): cross_entropy_forward, then
// cross_entropy_backward with global_max = row_max, in one call. The CUDA
// kernel reads each row once where it fits in shared memory (returns true:
// fused), which the two calls read twice (the logits are the largest tensor
// of a GPT step); the CPU runs the two kernels. dlogits may alias logits; the
// statistics are the forward's, as if the backward had not run.
// `weight` scales each row's gradient as cross_entropy_backward's does.
bool cross_entropy_forward_backward(const Tensor& logits, const Tensor& targets, std::int64_t valid, double scale,
                                    Tensor& row_max, Tensor& sum_exp, Tensor& target_logit, Tensor& dlogits,
                                    const Tensor* weight = nullptr);

}  // namespace megazero::kernels
