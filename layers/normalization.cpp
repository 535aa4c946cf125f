#include "layers/normalization.h"

#include "layers/layernorm.h"
#include "layers/rmsnorm.h"
#include "megazero/core/error.h"
#include "megazero/kernels/gelu_bias.h"

namespace megazero::layers {

NormGradients::NormGradients(const TpContext& ctx, std::vector<Tensor*> accumulators)
    : ctx_(ctx), accumulators_(std::move(accumulators)) {
  if (!ctx_.partial_rows()) return;
  std::int64_t total = 0;
  for (const Tensor* a : accumulators_) total += a->numel();
  const DType t = accumulators_.front()->dtype();
  stacked_ = Tensor::zeros(ctx_.device, {total}, t, MemoryCategory::Activations);
  std::int64_t at = 0;
  for (const Tensor* a : accumulators_) {
    MZ_CHECK(a->dtype() == t, "norm gradients of mixed dtypes");
    parts_.push_back(stacked_.narrow(0, at, a->numel()).view(a->shape()));
    at += a->numel();
  }
}

void NormGradients::finish() {
  if (!ctx_.partial_rows()) return;
  ctx_.tp->all_reduce(stacked_, ReduceOp::Sum).wait();
  for (std::size_t i = 0; i < accumulators_.size(); ++i) kernels::add(*accumulators_[i], parts_[i], *accumulators_[i]);
  stacked_ = Tensor();
  parts_.clear();
}

const Tensor& NormGamma::forward() {
  if (!one_plus_) return weight_->value;
  const Tensor& w = weight_->value;
  if (!ones_.defined()) {  // once: a constant beside the weight
    ones_ = Tensor::empty(w.device_ptr(), w.shape(), w.dtype(), MemoryCategory::Other, "norm ones");
    ones_.copy_from_doubles(std::vector<double>(static_cast<std::size_t>(w.numel()), 1.0));
  }
  gamma_ = Tensor::empty(w.device_ptr(), w.shape(), w.dtype(), MemoryCategory::Activations, "norm 1+w");
  kernels::add(w, ones_, gamma_);
  return gamma_;
}

const Tensor& NormGamma::backward() {
  if (!one_plus_) return weight_->value;
  MZ_CHECK(gamma_.defined(), "a norm's backward before its forward (--apply-layernorm-1p)");
  return gamma_;
}

std::unique_ptr<Normalization> make_normalization(ParameterSet& params, const std::string& name, const GPTConfig& cfg,
                                                  const TpContext& ctx) {
  return make_normalization(params, name, cfg, ctx, cfg.hidden_size);
}

std::unique_ptr<Normalization> make_normalization(ParameterSet& params, const std::string& name, const GPTConfig& cfg,
                                                  const TpContext& ctx, std::int64_t width) {
  if (cfg.rmsnorm())
    return std::make_unique<RMSNorm>(params, name, width, cfg.layernorm_epsilon, ctx, cfg.layernorm_1p);
  return std::make_unique<LayerNorm>(params, name, width, cfg.layernorm_epsilon, ctx, cfg.layernorm_1p);
}

}  // namespace megazero::layers
