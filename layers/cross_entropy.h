// Cross-entropy over vocabulary-parallel logits that never gathers the full
// logits: each rank holds [N, V/tp]; the row max, the sum of exponentials and
// the target logit are completed by two TP all-reduces (max; then the sums,
// each rank's rescaled to the global max). Padding columns (vocabulary
// padding) are excluded from the softmax, so the loss and its gradient do not
// depend on the TP degree. The forward only reads the logits; the backward
// recomputes the exponentials from them and writes the gradient over them
// (Megatron's in-place softmax gradient): the head holds one [N, V/tp]
// tensor, not two, and writes it once. The per-token losses
// stay on the device; only the TP all-reduces wait (on MPI, for the host copy).
#pragma once

#include "layers/tp_context.h"

namespace megazero::layers {

class VocabParallelCrossEntropy {
 public:
  explicit VocabParallelCrossEntropy(const TpContext& ctx) : ctx_(ctx) {}
  // logits [N, V_local] covering global columns [vocab_start, vocab_start + V_local),
  // of which the first `valid` are real; kept for the backward, which
  // overwrites them with their gradient. Returns the per-token losses [N] on the logits' device
  // (kernels::row_stat_dtype of the logits).
  Tensor forward(Tensor& logits, const Tensor& targets, std::int64_t vocab_start, std::int64_t valid);
  // d(scale * mean loss) / d logits, in the forward's logits tensor.
  Tensor backward(double scale);
  // Drops what forward kept for the backward (evaluation has none).
  void release();

 private:
  TpContext ctx_;
  // Held from forward to backward only: a tensor kept across steps would sit
  // in the middle of the next step's allocations (and of a device arena).
  Tensor logits_, targets_, global_max_, sum_exp_;
  std::int64_t vocab_start_ = 0, valid_ = 0;
};

}  // namespace megazero::layers
