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
void causal_softmax_forward(const Tensor& scores, double scale, Tensor& probs);
// Backward (sq == sk): dscores = scale * probs * (dprobs - sum_j(dprobs *
// probs)); may alias dprobs.
void causal_softmax_backward(const Tensor& dprobs, const Tensor& probs, double scale, Tensor& dscores);

}  // namespace megazero::kernels
