// The vocabulary-parallel cross-entropy's pieces, the softmax kept in place as
// Megatron does; layers/cross_entropy.cpp puts them together with the TP
// reductions. Dtype rules: conventions.h.
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
// Forward, one row at a time (read twice, the second time from cache):
// row_max = the max of this rank's columns;
// target_logit = logits[n, t - vocab_start] if this rank holds the target t,
// else 0 (the TP sum completes it); then the row is OVERWRITTEN with
// exp(logits - row_max) (padding: 0), and sum_exp = the sum of those values
// before rounding, taken in double. Nothing reads the logits again: the
// backward needs only the exponentials, so no second [N, V_local] tensor.
void cross_entropy_forward(Tensor& logits, const Tensor& targets, std::int64_t vocab_start, std::int64_t valid,
                           Tensor& row_max, Tensor& sum_exp, Tensor& target_logit);
// Tensor parallel: given global_max = the max over the TP ranks of row_max,
// sum_exp *= exp(row_max - global_max), after which the ranks' sums add up.
void rescale_sum_exp(const Tensor& row_max, const Tensor& global_max, Tensor& sum_exp);
// loss[n] = log(sum_exp[n]) + global_max[n] - target_logit[n], with sum_exp and
// target_logit completed over the TP group (computed in double, rounded once).
void cross_entropy_loss(const Tensor& global_max, const Tensor& sum_exp, const Tensor& target_logit, Tensor& loss);
// dlogits = scale * (softmax - onehot(target)) from cross_entropy_forward's
// exponentials: softmax = exp_logits * exp(row_max - global_max) / sum_exp
// (sum_exp completed over TP); padding columns get 0. dlogits may alias exp_logits.
void cross_entropy_backward(const Tensor& exp_logits, const Tensor& row_max, const Tensor& global_max,
                            const Tensor& sum_exp, const Tensor& targets, std::int64_t vocab_start, std::int64_t valid,
                            double scale, Tensor& dlogits);

}  // namespace megazero::kernels
