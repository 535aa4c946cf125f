#include "layers/cross_entropy.h"

#include <cmath>

#include "layers/mappings.h"
#include "megazero/core/error.h"
#include "megazero/kernels/layer_kernels.h"

namespace megazero::layers {

double VocabParallelCrossEntropy::forward(const Tensor& logits, const Tensor& targets, std::int64_t vocab_start,
                                          std::int64_t valid) {
  const std::int64_t n = logits.size(0);
  logits_ = logits;
  targets_ = targets;
  vocab_start_ = vocab_start;
  valid_ = valid;
  max_ = ctx_.row_stats({n});
  kernels::rowwise_max(logits, valid, max_);
  if (ctx_.size() > 1) ctx_.tp->all_reduce(max_, ReduceOp::Max).wait();
  sum_exp_ = ctx_.row_stats({n});
  kernels::rowwise_sum_exp(logits, max_, valid, sum_exp_);
  Tensor target_logit = ctx_.row_stats({n});
  kernels::gather_target_logit(logits, targets, vocab_start, valid, target_logit);
  // One all-reduce for both sums (sum_exp and the target logit, which only
  // its owning rank contributes).
  Tensor both = ctx_.row_stats({2, n});
  both.narrow(0, 0, 1).view({n}).copy_from(sum_exp_);
  both.narrow(0, 1, 1).view({n}).copy_from(target_logit);
  ReduceFromTpRegion::forward(*ctx_.tp, both);
  sum_exp_.copy_from(both.narrow(0, 0, 1).view({n}));
  if (!logits.device().has_storage()) return 0.0;  // meta device (the planner): sizes only
  const auto se = sum_exp_.to_double_vector();
  const auto mx = max_.to_double_vector();
  const auto tl = both.narrow(0, 1, 1).view({n}).to_double_vector();
  token_losses_.assign(static_cast<std::size_t>(n), 0.0);
  double total = 0;
  for (std::size_t i = 0; i < token_losses_.size(); ++i) {
    token_losses_[i] = std::log(se[i]) + mx[i] - tl[i];
    total += token_losses_[i];
  }
  return n > 0 ? total / static_cast<double>(n) : 0.0;
}

Tensor VocabParallelCrossEntropy::backward(double scale) {
  MZ_CHECK(logits_.defined(), "cross-entropy backward before forward");
  Tensor dlogits = ctx_.activation(logits_.shape());
  const double per_token = logits_.size(0) > 0 ? scale / static_cast<double>(logits_.size(0)) : 0.0;
  kernels::cross_entropy_backward(logits_, max_, sum_exp_, targets_, vocab_start_, valid_, per_token, dlogits);
  logits_ = targets_ = max_ = sum_exp_ = Tensor();
  return dlogits;
}

}  // namespace megazero::layers
