// Cross-entropy over vocabulary-parallel logits that never gathers the full
// logits: each rank holds [N, V/tp]; the row max, the sum of exponentials and
// the target logit are completed by three TP all-reduces. Padding columns
// (vocabulary padding) are excluded from the softmax, so the loss and its
// gradient do not depend on the TP degree. The backward is local.
#pragma once

#include "layers/tp_context.h"

namespace megazero::layers {

class VocabParallelCrossEntropy {
 public:
  explicit VocabParallelCrossEntropy(const TpContext& ctx) : ctx_(ctx) {}
  // logits [N, V_local] covering global columns [vocab_start, vocab_start + V_local),
  // of which the first `valid` are real. Returns the mean loss over the N tokens.
  double forward(const Tensor& logits, const Tensor& targets, std::int64_t vocab_start, std::int64_t valid);
  // d(scale * mean loss) / d logits.
  Tensor backward(double scale);
  // Per-token losses of the last forward (host copy), for evaluation and tests.
  const std::vector<double>& token_losses() const { return token_losses_; }

 private:
  TpContext ctx_;
  Tensor logits_, targets_, max_, sum_exp_;
  std::int64_t vocab_start_ = 0, valid_ = 0;
  std::vector<double> token_losses_;
};

}  // namespace megazero::layers
