#include "layers/cross_entropy.h"

#include "layers/mappings.h"
#include "megazero/core/error.h"
#include "megazero/kernels/cross_entropy.h"

namespace megazero::layers {

namespace {
double per_token(double scale, std::int64_t rows) { return rows > 0 ? scale / static_cast<double>(rows) : 0.0; }
}  // namespace

Tensor VocabParallelCrossEntropy::forward(Tensor& logits, const Tensor& targets, std::int64_t vocab_start,
                                          std::int64_t valid, std::optional<double> backward_scale,
                                          const Tensor& loss_weights) {
  const std::int64_t n = logits.size(0);
  targets_ = targets;
  weights_ = loss_weights;
  const Tensor* weight = weights();
  vocab_start_ = vocab_start;
  valid_ = valid;
  fused_scale_.reset();
  Tensor row_max = ctx_.row_stats({n});
  // Both sums share one all-reduce: row 0 the sum of exponentials, row 1 the
  // target logit (which only its owning rank contributes).
  Tensor sums = ctx_.row_stats({2, n});
  sum_exp_ = sums.narrow(0, 0, 1).view({n});
  Tensor target_logit = sums.narrow(0, 1, 1).view({n});
  if (backward_scale && ctx_.size() == 1) {
    MZ_CHECK(vocab_start == 0, "one TP rank holds the vocabulary from column 0, not ", vocab_start);
    kernels::cross_entropy_forward_backward(logits, targets, valid, per_token(*backward_scale, n), row_max, sum_exp_,
                                            target_logit, logits, weight);
    fused_scale_ = backward_scale;
  } else {
    kernels::cross_entropy_forward(logits, targets, vocab_start, valid, row_max, sum_exp_, target_logit);
  }
  logits_ = logits;
  global_max_ = row_max;
  if (ctx_.size() > 1) {
    global_max_ = row_max.clone(MemoryCategory::Activations);
    ctx_.tp->all_reduce(global_max_, ReduceOp::Max).wait();
    kernels::rescale_sum_exp(row_max, global_max_, sum_exp_);
  }
  ReduceFromTpRegion::forward(*ctx_.tp, sums);
  Tensor losses = ctx_.row_stats({n});
  kernels::cross_entropy_loss(global_max_, sum_exp_, target_logit, losses, weight);
  return losses;
}

Tensor VocabParallelCrossEntropy::backward(double scale) {
  MZ_CHECK(logits_.defined(), "cross-entropy backward before forward");
  Tensor dlogits = logits_;  // in place: written here, or already by the forward
  if (fused_scale_) {
    // Exact: the same double the caller computed for both.
    MZ_CHECK(scale == *fused_scale_, "cross-entropy backward with scale ", scale, " after a forward that wrote the ",
             "gradient for scale ", *fused_scale_);
  } else {
    kernels::cross_entropy_backward(logits_, global_max_, sum_exp_, targets_, vocab_start_, valid_,
                                    per_token(scale, dlogits.size(0)), dlogits, weights());
  }
  release();
  return dlogits;
}

void VocabParallelCrossEntropy::release() {
  logits_ = targets_ = global_max_ = sum_exp_ = weights_ = Tensor();
  fused_scale_.reset();
}

}  // namespace megazero::layers
