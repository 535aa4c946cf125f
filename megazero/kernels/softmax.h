// The causal softmax of attention scores (the unfused attention path;
// fused_attention.h computes it without the [BH, S, S] tensors). Dtype rules:
// conventions.h.
#pragma once

#include "megazero/core/tensor.h"
#include "megazero/kernels/conventions.h"

namespace megazero::kernels {

// ---- causal softmax for attention scores [batch, sq, sk] ----
// Forward: sq <= sk, the queries being the last sq of the sk positions (sq ==
// sk in training; fewer with a key/value cache, layers/kv_cache.h): with
// d = sk - sq, probs[b, i, j] = softmax_j(scale * scores[b, i, j]) over
// j <= i + d; 0 for j > i + d. Computed in fp32 at least (fp64 for fp64).
// probs may alias scores.
//
// key_starts (--reset-attention-mask: each token attends within its own
// document only, train/documents.h): int64 [B*S] on the scores' device, sq ==
// sk == S, the matrices a multiple of B (matrix m belongs to sample m /
// (matrices / B)). Row i of sample b then keeps only the keys key_starts[b*S +
// i] <= j <= i (a start outside [0, i] is taken as the nearest end of it: one
// key at least); the others are 0 as the future ones are.
void causal_softmax_forward(const Tensor& scores, double scale, Tensor& probs, const Tensor& key_starts = Tensor());
// Backward (sq == sk): dscores = scale * probs * (dprobs - sum_j(dprobs *
// probs)) over the kept keys, exactly 0 elsewhere; may alias dprobs.
// key_starts: the forward's.
void causal_softmax_backward(const Tensor& dprobs, const Tensor& probs, double scale, Tensor& dscores,
                             const Tensor& key_starts = Tensor());

}  // namespace megazero::kernels
