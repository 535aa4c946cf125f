// The forward/backward kernels of the transformer layers, written out
// explicitly (no autograd), as llm.c does. Every kernel works on contiguous
// tensors and dispatches on the device; these are the CPU implementations.
// Conventions: "rows" = all leading dimensions flattened, "cols" = the last
// dimension. Backward kernels that produce parameter gradients ACCUMULATE into
// them (+=), so micro-batches accumulate; input gradients are OVERWRITTEN.
//
// Dtypes. The "storage dtype" of a call is the dtype of its activations:
// fp32, fp64 (the reference path of the gradient checks), bf16 or fp16.
//  - Activations and parameters (x, y, dy, dx, scores, probs, dprobs, logits,
//    dlogits, embedding tables and outputs, gamma, beta, bias, a, b, out) all
//    have the storage dtype; one call never mixes them.
//  - 16-bit storage is storage only: every element is loaded to fp32 (exactly),
//    the math is the fp32 path's (softmax, cross-entropy, LayerNorm and all
//    sums keep their fp32/double accumulations), and each result is rounded
//    ONCE, to nearest even (a value computed in double is not rounded to fp32
//    first). One exception: the cross-entropy keeps its exponentials in the
//    16-bit logits tensor, so its dlogits are rounded twice (Megatron's
//    in-place softmax; see cross_entropy_forward). fp64 computes in fp64; fp32 and fp64 results are bit for bit what
//    they were before 16-bit storage, and no result depends on the thread count.
//  - The softmax exponentials (cross-entropy, causal softmax, fused attention)
//    and the GeLU's tanh of fp32 and 16-bit tensors are libmvec's vector expf
//    and tanhf (vector_math.h; within 4 ulp, where the scalar ones are within
//    1; their last bits depend on the ISA clone the CPU selects); fp64 keeps
//    the scalar std::exp and std::tanh.
//  - Per-row statistics (layernorm mean/rstd; the cross-entropy's row_max,
//    global_max, sum_exp, target_logit and per-token loss) have row_stat_dtype():
//    fp32 for 16-bit storage, else the storage dtype. 16-bit statistics are
//    rejected. (Max and target logit of 16-bit logits are exact in fp32.)
//  - Parameter-gradient accumulators (layernorm dgamma/dbeta, bias_grad's dbias,
//    embedding_backward's dtable, position_embedding_backward's dpos) may have
//    the storage dtype or, for 16-bit storage, fp32 (Megatron-style fp32 main
//    grads); each independently (is_grad_accumulator_dtype). The column sums
//    are taken in double (embedding rows: in fp32, from the row's old value),
//    added to the accumulator's value and rounded once per call on store.
//  - ids/targets are int64. Dropout's keep mask does not depend on the dtype.
#pragma once

#include "megazero/core/tensor.h"
#include "megazero/kernels/rng.h"

namespace megazero::kernels {

// The dtype of per-row statistics for activations of `storage` dtype: fp32 for
// bf16/fp16, otherwise `storage` itself.
DType row_stat_dtype(DType storage);
// Whether `acc` may hold the parameter gradients of `storage` activations:
// acc == storage, or acc == fp32 when storage is bf16/fp16.
bool is_grad_accumulator_dtype(DType storage, DType acc);

// ---- LayerNorm over the last dimension ----
// y = (x - mean) * rstd * gamma + beta; saves mean and rstd ([rows],
// row_stat_dtype(x.dtype())). y may alias x.
void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& y, Tensor& mean,
                       Tensor& rstd);
// dx = overwritten (may alias dy); dgamma, dbeta accumulated. With add_to_dx,
// dx = (LayerNorm's input gradient) + *add_to_dx, rounded once: a pre-LN
// block's residual gradient joins in the same pass (same shape and dtype as dx).
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                        Tensor& dx, Tensor& dgamma, Tensor& dbeta, const Tensor* add_to_dx = nullptr);

// ---- GeLU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) ----
void gelu_forward(const Tensor& x, Tensor& y);                      // y may alias x
void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx);  // dx may alias dy
// Megatron's bias-GeLU fusion, the MLP's first linear without its own bias add:
// out = gelu(y + bias) with y + bias kept in the compute type (fp32 for 16-bit
// storage; for fp32 this is add_bias then gelu_forward bit for bit). bias is
// [cols] along the last dimension; out may alias y.
void bias_gelu_forward(const Tensor& y, const Tensor& bias, Tensor& out);
// Its backward: dx = dy * gelu'(y + bias), rounded to storage (dx may alias
// dy), and dbias += sum_r dx[r, :] of those rounded values — gelu_backward then
// bias_grad, in one pass over dy on a GPU.
void bias_gelu_backward(const Tensor& dy, const Tensor& y, const Tensor& bias, Tensor& dx, Tensor& dbias);

// ---- bias and element-wise ----
void add_bias(Tensor& y, const Tensor& bias);             // y[r, c] += bias[c]
void bias_grad(const Tensor& dy, Tensor& dbias);          // dbias[c] += sum_r dy[r, c]
void add(const Tensor& a, const Tensor& b, Tensor& out);  // out = a + b (out may alias a or b)
void axpy(double alpha, const Tensor& x, Tensor& y);      // y += alpha * x
void scale(Tensor& x, double alpha);                      // x *= alpha

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
// y = x * keep / (1 - p) with keep = uniform_at(key, global index) >= p,
// the same mask for every dtype. p == 0 copies. y may alias x.
void dropout_forward(const Tensor& x, double p, const RngKey& key, const DropoutLayout& layout, Tensor& y);
// dx = dy * keep / (1 - p), regenerating the same mask. dx may alias dy.
void dropout_backward(const Tensor& dy, double p, const RngKey& key, const DropoutLayout& layout, Tensor& dx);
// dropout_backward and the gradient of a bias added before the dropout (the
// bias of bias-dropout-add): dx as dropout_backward (may alias dy), and
// dbias[c] += sum_r dx[r, c] over dx's rounded values, dy taken as [rows,
// cols] by its last dimension. On a GPU one pass over dy; on the CPU the two
// kernels (p == 0: a copy and the sum).
void dropout_backward_bias_grad(const Tensor& dy, double p, const RngKey& key, const DropoutLayout& layout, Tensor& dx,
                                Tensor& dbias);

// Megatron's fused bias-dropout-add, the end of each sub-block:
//   out = residual + dropout(y + bias)   (bias [cols] along the last dimension)
// with dropout_forward's mask for the same key and layout, computed in the
// compute type and rounded once. out may alias y or residual. Its backward is
// dropout_backward (d residual = d out; d y = d bias-input = dropout_backward(d out)).
void bias_dropout_add(const Tensor& y, const Tensor& bias, const Tensor& residual, double p, const RngKey& key,
                      const DropoutLayout& layout, Tensor& out);

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

// ---- vocabulary-parallel cross-entropy (the softmax kept in place, as Megatron does) ----
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
