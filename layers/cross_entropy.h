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
//
// With one TP rank and the backward's scale known at the forward (training:
// train_step sets StepInfo::backward_scale), there is no all-reduce between
// the statistics and the gradient, so the forward writes the gradient too, in
// the same pass over the logits (kernels::cross_entropy_forward_backward: the
// two kernels' bits, the logits read once instead of twice); the backward
// then only hands it over.
#pragma once

#include <optional>

#include "layers/tp_context.h"

namespace megazero::layers {

class VocabParallelCrossEntropy {
 public:
  explicit VocabParallelCrossEntropy(const TpContext& ctx) : ctx_(ctx) {}
  // logits [N, V_local] covering global columns [vocab_start, vocab_start + V_local),
  // of which the first `valid` are real; kept for the backward, which
  // overwrites them with their gradient. Returns the per-token losses [N] on the logits' device
  // (kernels::row_stat_dtype of the logits).
  // backward_scale: the scale the backward will be called with, where known
  // (the gradient is then written by the forward where it can be).
  // loss_weights, when defined: [N] of the losses' dtype, each token's weight
  // (--eod-mask-loss: 0 for a masked token, the others N / the kept count):
  // the losses returned are weighted, and so is the gradient.
  Tensor forward(Tensor& logits, const Tensor& targets, std::int64_t vocab_start, std::int64_t valid,
                 std::optional<double> backward_scale = std::nullopt, const Tensor& loss_weights = Tensor());
  // d(scale * mean weighted loss) / d logits, in the forward's logits tensor.
  // A forward given backward_scale takes only that scale.
  Tensor backward(double scale);
  // Drops what forward kept for the backward (evaluation has none).
  void release();

 private:
  TpContext ctx_;
  // Held from forward to backward only: a tensor kept across steps would sit
  // in the middle of the next step's allocations (and of a device arena).
  Tensor logits_, targets_, global_max_, sum_exp_, weights_;
  const Tensor* weights() const { return weights_.defined() ? &weights_ : nullptr; }  // the kernels' row weights
  std::int64_t vocab_start_ = 0, valid_ = 0;
  std::optional<double> fused_scale_;  // set: logits_ holds the gradient for this backward scale
};

}  // namespace megazero::layers
