#include "layers/gpt_model.h"

#include "layers/mappings.h"
#include "megazero/core/error.h"
#include "megazero/kernels/gemm.h"
#include "megazero/kernels/dropout.h"

namespace megazero::layers {
namespace {
const GPTConfig& validated(const GPTConfig& cfg, int tp) {
  cfg.validate(tp);
  return cfg;
}
}  // namespace

GPTModel::GPTModel(const GPTConfig& cfg, const TpContext& ctx, ParameterSet& params)
    : cfg_(validated(cfg, ctx.size())),
      ctx_(ctx),
      embedding_group_(params.begin_group("embedding")),
      embedding_(params, "embedding.word", cfg.vocab_size, cfg.padded_vocab(ctx.size()), cfg.hidden_size, ctx,
                 cfg.init_method_std),
      position_(params, "embedding.position", cfg.max_position_embeddings, cfg.hidden_size, ctx, cfg.init_method_std),
      loss_(ctx) {
  // Declared in forward order, which is also the parameters' order; one
  // parameter group per block (param_hooks.h).
  for (int l = 0; l < cfg.num_layers; ++l) {
    const int g = params.begin_group("layers." + std::to_string(l));
    if (l == 0) first_layer_group_ = g;
    layers_.push_back(std::make_unique<TransformerLayer>(params, cfg, l, ctx));
  }
  final_group_ = params.begin_group("final_ln");
  final_ln_ = std::make_unique<LayerNorm>(params, "final_ln", cfg.hidden_size, cfg.layernorm_epsilon, ctx);
}

void GPTModel::set_checkpoint_store(ActivationCheckpointStore* store) {
  for (auto& l : layers_) l->set_checkpoint_store(store);
}

void GPTModel::check_ids(const Tensor& ids, const char* what) const {
  MZ_CHECK(ids.dtype() == DType::I64 && ids.dim() == 1, what, " must be int64 [B*S]");
  if (!ids.device().host_accessible()) return;  // device ids were checked on the host they came from
  const auto* p = ids.host_data<std::int64_t>();
  for (std::int64_t i = 0; i < ids.numel(); ++i)
    MZ_REQUIRE(p[i] >= 0 && p[i] < cfg_.vocab_size, what, " holds token id ", p[i], " at position ", i,
               ", outside the vocabulary [0, ", cfg_.vocab_size,
               "); the data was tokenized with a different vocabulary than the model's (check --vocab-file / "
               "--data-path)");
}

double GPTModel::forward(const Tensor& ids, const Tensor& targets, const StepInfo& step) {
  const Tensor losses = forward_losses(ids, targets, step);
  if (!losses.device().has_storage() || losses.numel() == 0) return 0.0;  // the planner's dry run: sizes only
  double total = 0;
  for (double l : losses.to_double_vector()) total += l;
  return total / static_cast<double>(losses.numel());
}

Tensor GPTModel::forward_losses(const Tensor& ids, const Tensor& targets, const StepInfo& step) {
  MZ_REQUIRE(step.seq <= cfg_.max_position_embeddings, "sequence length ", step.seq,
             " is longer than --max-position-embeddings ", cfg_.max_position_embeddings);
  MZ_CHECK(ids.numel() == step.micro_batch * step.seq, "ids hold ", ids.numel(),
           " tokens for B*S = ", step.micro_batch * step.seq);
  check_ids(ids, "the input");
  check_ids(targets, "the targets");
  step_ = step;
  // The word embedding is used again for the tied logits: its group stays in
  // use until the end of forward (so ZeRO-3 gathers it once per pass).
  hooks_->pre_forward(embedding_group_);
  Tensor h = embedding_.forward(ids);
  position_.forward(h, step.seq);
  if (step.training && cfg_.hidden_dropout > 0) {
    kernels::DropoutLayout l{.samples = step.micro_batch,
                             .matrix_rows = step.seq,
                             .matrix_cols = cfg_.hidden_size,
                             .sample_offset = step.sample_offset};
    kernels::dropout_forward(h, cfg_.hidden_dropout, RngKey{step.seed, step.iteration, 0, kRngEmbeddingDropout}, l, h);
  }
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const int g = first_layer_group_ + static_cast<int>(l);
    hooks_->pre_forward(g);
    h = layers_[l]->forward(h, step);
    hooks_->post_forward(g);
  }
  hooks_->pre_forward(final_group_);
  final_hidden_ = final_ln_->forward(h);
  hooks_->post_forward(final_group_);
  CopyToTpRegion::forward(*ctx_.tp, final_hidden_);
  Tensor logits = ctx_.activation({final_hidden_.size(0), embedding_.local_rows()});
  gemm(final_hidden_, false, embedding_.weight().value, true, logits);
  hooks_->post_forward(embedding_group_);
  kept_logits_ = keep_logits_ ? logits.clone(MemoryCategory::Other) : Tensor();
  Tensor losses = loss_.forward(logits, targets, embedding_.vocab_start(), embedding_.valid_rows());
  if (!step.training) {  // evaluation: nothing kept for a backward (see TransformerLayer::forward)
    loss_.release();
    final_ln_->release();
    final_hidden_ = Tensor();
  }
  return losses;
}

void GPTModel::backward(double loss_scale) {
  MZ_CHECK(final_hidden_.defined(), "GPTModel::backward before forward");
  Tensor dlogits = loss_.backward(loss_scale);
  // The embedding group's gradients collect from the logits (now) and the
  // lookup (last): it stays in backward for the whole pass.
  hooks_->pre_backward(embedding_group_);
  auto& w = embedding_.weight();
  gemm(dlogits, true, final_hidden_, false, w.grad, 1.0f, 1.0f);  // tied weight: logits part
  Tensor dh = ctx_.activation(final_hidden_.shape());
  gemm(dlogits, false, w.value, false, dh);
  dlogits = Tensor();  // the largest activation: not held through the layers' backward
  CopyToTpRegion::backward(*ctx_.tp, dh);
  final_hidden_ = Tensor();
  hooks_->pre_backward(final_group_);
  dh = final_ln_->backward(dh);
  hooks_->post_backward(final_group_);
  for (std::size_t i = layers_.size(); i-- > 0;) {
    const int g = first_layer_group_ + static_cast<int>(i);
    hooks_->pre_backward(g);
    dh = layers_[i]->backward(dh);
    hooks_->post_backward(g);
  }
  if (step_.training && cfg_.hidden_dropout > 0) {
    kernels::DropoutLayout l{.samples = step_.micro_batch,
                             .matrix_rows = step_.seq,
                             .matrix_cols = cfg_.hidden_size,
                             .sample_offset = step_.sample_offset};
    kernels::dropout_backward(dh, cfg_.hidden_dropout, RngKey{step_.seed, step_.iteration, 0, kRngEmbeddingDropout}, l,
                              dh);
  }
  position_.backward(dh, step_.seq);
  embedding_.backward(dh);
  hooks_->post_backward(embedding_group_);
}

double GPTModel::flops_per_token(bool with_recompute) const {
  // Narayanan et al. (2021) eq. 3 divided by B s: 96 l h^2 (1 + s/(6h) +
  // V/(16 l h)) with recompute. Without it the layers' factor is 72, but the
  // logits stay 6 h V (forward 2, backward 4: they are never recomputed);
  // scaling the whole of eq. 3 by 3/4 would undercount them.
  const double l = static_cast<double>(cfg_.num_layers), h = static_cast<double>(cfg_.hidden_size);
  const double s = static_cast<double>(step_.seq > 1 ? step_.seq : cfg_.seq_length);
  const double v = static_cast<double>(cfg_.vocab_size);
  return (with_recompute ? 96.0 : 72.0) * l * h * h * (1.0 + s / (6.0 * h)) + 6.0 * h * v;
}

}  // namespace megazero::layers
