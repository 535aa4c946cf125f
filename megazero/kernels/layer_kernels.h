// The forward/backward kernels of the transformer layers, written out
// explicitly (no autograd), as llm.c does. Every kernel works on contiguous
// tensors of fp32 or fp64 (fp64 is the reference path of the gradient checks)
// and dispatches on the device; these are the CPU implementations.
// Conventions: "rows" = all leading dimensions flattened, "cols" = the last
// dimension. Backward kernels that produce parameter gradients ACCUMULATE into
// them (+=), so micro-batches accumulate; input gradients are OVERWRITTEN.
#pragma once

#include "megazero/core/tensor.h"
#include "megazero/kernels/rng.h"

namespace megazero::kernels {

// ---- LayerNorm over the last dimension ----
// y = (x - mean) * rstd * gamma + beta; saves mean and rstd ([rows], x's dtype).
void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& y,
                       Tensor& mean, Tensor& rstd);
// dx = overwritten; dgamma, dbeta accumulated.
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta);

// ---- GeLU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) ----
void gelu_forward(const Tensor& x, Tensor& y);                          // y may alias x
void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx);      // dx may alias dy

// ---- bias and element-wise ----
void add_bias(Tensor& y, const Tensor& bias);           // y[r, c] += bias[c]
void bias_grad(const Tensor& dy, Tensor& dbias);        // dbias[c] += sum_r dy[r, c]
void add(const Tensor& a, const Tensor& b, Tensor& out);  // out = a + b (out may alias a or b)
void axpy(double alpha, const Tensor& x, Tensor& y);    // y += alpha * x
void scale(Tensor& x, double alpha);                    // x *= alpha

// ---- causal softmax for attention scores [batch, sq, sk] (sq == sk) ----
// probs[b, i, j] = softmax_j(scale * scores[b, i, j]) over j <= i; 0 for j > i.
// Computed in fp32 at least (fp64 for fp64). probs may alias scores.
void causal_softmax_forward(const Tensor& scores, double scale, Tensor& probs);
// dscores = scale * probs * (dprobs - sum_j(dprobs * probs)); may alias dprobs.
void causal_softmax_backward(const Tensor& dprobs, const Tensor& probs, double scale, Tensor& dscores);

// ---- dropout keyed by global coordinates ----
// A tensor is seen as [A, B, C, D] locally (rows-major, contiguous); element
// (a, b, c, d) has global index ((a0 + a) * GB + (b0 + b)) * C * D + c * D + d,
// where a0/b0 are this rank's offsets in dims A/B and GB the global size of B.
// For attention probabilities: A = samples (a0 = global sample offset),
// B = heads (b0 = first head of this TP rank, GB = all heads), C = D = seq.
// For hidden states: A = samples, B = 1, C = seq, D = hidden.
struct DropoutLayout {
  std::int64_t A = 1, B = 1, C = 1, D = 1;
  std::int64_t a0 = 0, b0 = 0, GB = 1;
};
// y = x * keep / (1 - p) with keep = uniform_at(key, global index) >= p.
// p == 0 copies. y may alias x.
void dropout_forward(const Tensor& x, double p, const RngKey& key, const DropoutLayout& layout, Tensor& y);
// dx = dy * keep / (1 - p), regenerating the same mask. dx may alias dy.
void dropout_backward(const Tensor& dy, double p, const RngKey& key, const DropoutLayout& layout, Tensor& dx);

// ---- vocab-parallel embedding and cross-entropy pieces ----
// ids: int64 [N] global token ids; table: [V_local, H] holding global rows
// [vocab_start, vocab_start + V_local). Rows of ids outside the slice are 0.
void embedding_forward(const Tensor& ids, const Tensor& table, std::int64_t vocab_start, Tensor& out);
// dtable[id - vocab_start] += dout[n] for ids inside the slice.
void embedding_backward(const Tensor& ids, const Tensor& dout, std::int64_t vocab_start, Tensor& dtable);
// Position embeddings: out[b*S + s, :] += pos_table[s, :] for a [B*S, H] tensor.
void add_position_embedding(Tensor& out, const Tensor& pos_table, std::int64_t seq);
// dpos[s, :] += sum_b dout[b*S + s, :].
void position_embedding_backward(const Tensor& dout, std::int64_t seq, Tensor& dpos);

// logits: [N, V_local]; only the first `valid` columns are real vocabulary
// (the rest is padding, excluded from max/sum and given zero gradient).
void rowwise_max(const Tensor& logits, std::int64_t valid, Tensor& out);               // out [N]
void rowwise_sum_exp(const Tensor& logits, const Tensor& row_max, std::int64_t valid,  // out [N]
                     Tensor& out);
// out[n] = logits[n, t - vocab_start] if the target t is in [vocab_start, vocab_start + valid), else 0.
void gather_target_logit(const Tensor& logits, const Tensor& targets, std::int64_t vocab_start,
                         std::int64_t valid, Tensor& out);
// dlogits = scale * (exp(logits - max) / sum_exp - onehot(target)); padding columns get 0.
void cross_entropy_backward(const Tensor& logits, const Tensor& row_max, const Tensor& sum_exp,
                            const Tensor& targets, std::int64_t vocab_start, std::int64_t valid, double scale,
                            Tensor& dlogits);

}  // namespace megazero::kernels
