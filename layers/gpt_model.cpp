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

TpContext model_context(TpContext ctx, const GPTConfig& cfg) {
  ctx.sequence_parallel = cfg.sequence_parallel && ctx.size() > 1;
  ctx.gemm_epilogues = cfg.gemm_epilogues;
  return ctx;
}
// The first group; before it, the weights' initialisation for every
// parameter the model adds (--init-method-xavier-uniform).
int begin_embedding_group(ParameterSet& params, const GPTConfig& cfg) {
  params.set_xavier_uniform(cfg.init_xavier_uniform);
  return params.begin_group("embedding");
}

}  // namespace

GPTModel::GPTModel(const GPTConfig& cfg, const TpContext& ctx, ParameterSet& params)
    : cfg_(validated(cfg, ctx.size())),
      ctx_(model_context(ctx, cfg)),
      embedding_group_(begin_embedding_group(params, cfg)),
      embedding_(params, "embedding.word", cfg.vocab_size, cfg.padded_vocab(ctx.size()), cfg.hidden_size, ctx_,
                 cfg.init_method_std),
      loss_(ctx_) {
  if (!cfg.rope())
    position_ = std::make_unique<PositionEmbedding>(params, "embedding.position", cfg.max_position_embeddings,
                                                    cfg.hidden_size, ctx_, cfg.init_method_std);
  // Declared in forward order, which is also the parameters' order; one
  // parameter group per block (param_hooks.h).
  for (int l = 0; l < cfg.num_layers; ++l) {
    const int g = params.begin_group("layers." + std::to_string(l));
    if (l == 0) first_layer_group_ = g;
    layers_.push_back(std::make_unique<TransformerLayer>(params, cfg, l, ctx_));
  }
  final_group_ = params.begin_group("final_ln");
  final_ln_ = make_normalization(params, "final_ln", cfg, ctx_);
  if (cfg.untie_embeddings) {
    output_group_ = params.begin_group("output_layer");
    const Parameter& word = embedding_.weight();
    output_ = &params.add("output_layer.weight", word.global_shape, 0, ctx_.rank(), ctx_.size(), Init::Normal,
                          cfg.init_method_std);
    output_->padding_from_row = cfg.vocab_size;
    output_->grad_overwritable = true;  // written only by the logits' weight-gradient GEMM (backward)
  }
}

kernels::DropoutLayout GPTModel::hidden_layout(const Tensor& hidden) const {
  const std::int64_t rows = step_.micro_batch * step_.seq;
  return hidden_dropout_layout(step_, ctx_.first_row(rows), hidden.size(0), cfg_.hidden_size);
}

void GPTModel::set_checkpoint_store(ActivationCheckpointStore* store) {
  store_ = store;
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

double GPTModel::forward(const Tensor& ids, const Tensor& targets, const StepInfo& step, const Tensor& loss_weights) {
  const Tensor losses = forward_losses(ids, targets, step, loss_weights);
  if (!losses.device().has_storage() || losses.numel() == 0) return 0.0;  // the planner's dry run: sizes only
  double total = 0;
  for (double l : losses.to_double_vector()) total += l;
  return total / static_cast<double>(losses.numel());
}

Tensor GPTModel::forward_losses(const Tensor& ids, const Tensor& targets, const StepInfo& step,
                                const Tensor& loss_weights) {
  MZ_REQUIRE(step.seq <= cfg_.max_position_embeddings, "sequence length ", step.seq,
             " is longer than --max-position-embeddings ", cfg_.max_position_embeddings);
  MZ_CHECK(ids.numel() == step.micro_batch * step.seq, "ids hold ", ids.numel(),
           " tokens for B*S = ", step.micro_batch * step.seq);
  check_ids(ids, "the input");
  check_ids(targets, "the targets");
  MZ_REQUIRE(!ctx_.sequence_parallel || (step.micro_batch * step.seq) % ctx_.size() == 0,
             "--sequence-parallel splits the ", step.micro_batch * step.seq,
             " tokens of a micro-batch over the TP group of ", ctx_.size(),
             "; use a --seq-length divisible by --tensor-model-parallel-size");
  step_ = step;
  Tensor logits = logits_of(ids, 0);
  kept_logits_ = keep_logits_ ? logits.clone(MemoryCategory::Other) : Tensor();
  Tensor losses = loss_.forward(logits, targets, embedding_.vocab_start(), embedding_.valid_rows(),
                                step.training ? step.backward_scale : std::nullopt, loss_weights);
  if (!step.training) {  // evaluation: nothing kept for a backward (see TransformerLayer::forward)
    loss_.release();
    final_ln_->release();
    final_hidden_ = Tensor();
  }
  return losses;
}

KvCache GPTModel::make_kv_cache(std::int64_t capacity) const {
  MZ_REQUIRE(capacity > 0 && capacity <= cfg_.max_position_embeddings, "a key/value cache of ", capacity,
             " positions: the model has ", cfg_.max_position_embeddings, " (--max-position-embeddings)");
  KvCache cache;
  cache.capacity = capacity;
  for (const auto& layer : layers_) {
    cache.keys.push_back(layer->make_kv_buffer(capacity));
    cache.values.push_back(layer->make_kv_buffer(capacity));
  }
  return cache;
}

Tensor GPTModel::decode(const Tensor& ids, KvCache& cache) {
  const std::int64_t T = ids.numel();
  MZ_REQUIRE(T > 0 && cache.length + T <= cache.capacity, "the key/value cache holds ", cache.length, " of ",
             cache.capacity, " positions: no room for ", T, " more tokens");
  MZ_CHECK(!ctx_.sequence_parallel && cache.keys.size() == layers_.size(), "decode: a cache of ", cache.keys.size(),
           " layers for ", layers_.size(), ", or sequence parallelism");
  check_ids(ids, "the input");
  step_ = StepInfo{};
  step_.seq = T;
  step_.training = false;
  step_.kv_cache = &cache;
  Tensor logits = logits_of(ids, cache.length);
  cache.length += T;
  final_ln_->release();
  final_hidden_ = Tensor();
  step_.kv_cache = nullptr;
  return logits;
}

Tensor GPTModel::logits_of(const Tensor& ids, std::int64_t first_position) {
  const StepInfo& step = step_;
  // The word embedding is used again for the tied logits: its group stays in
  // use until the end of forward (so ZeRO-3 gathers it once per pass).
  hooks_->pre_forward(embedding_group_);
  Tensor h = position_ ? embedding_.forward(
                             ids, [&](Tensor& x) { position_->forward(x, step.seq, first_position, step.positions); })
                       : embedding_.forward(ids);
  if (output_) hooks_->post_forward(embedding_group_);
  if (step.training && cfg_.hidden_dropout > 0) {
    kernels::dropout_forward(h, cfg_.hidden_dropout, RngKey{step.seed, step.iteration, 0, kRngEmbeddingDropout},
                             hidden_layout(h), h);
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
  // The logits GEMM is vocab-parallel: every rank needs every token row.
  if (ctx_.sequence_parallel)
    final_hidden_ = GatherFromSequenceParallelRegion::forward(*ctx_.tp, final_hidden_, MemoryCategory::Activations);
  else
    CopyToTpRegion::forward(*ctx_.tp, final_hidden_);
  const int logits_group = output_ ? output_group_ : embedding_group_;
  if (output_) hooks_->pre_forward(output_group_);
  Tensor logits = ctx_.activation({final_hidden_.size(0), embedding_.local_rows()});
  gemm(final_hidden_, false, output_weight().value, true, logits);
  hooks_->post_forward(logits_group);
  return logits;
}

void GPTModel::backward(double loss_scale) {
  MZ_CHECK(final_hidden_.defined(), "GPTModel::backward before forward");
  Tensor dlogits = loss_.backward(loss_scale);
  // Tied: the embedding group's gradients collect from the logits (now) and
  // the lookup (last): it stays in backward for the whole pass.
  hooks_->pre_backward(output_ ? output_group_ : embedding_group_);
  auto& w = output_weight();
  gemm(dlogits, true, final_hidden_, false, w.grad, 1.0f, take_grad_beta(w));  // tied weight: logits part
  Tensor dh = ctx_.activation(final_hidden_.shape());
  gemm(dlogits, false, w.value, false, dh);
  dlogits = Tensor();  // the largest activation: not held through the layers' backward
  // The highest recomputing layer restores first: its checkpoint may start
  // back now (Pa+cpu), behind the work above and beside the backward of the
  // final norm and of the layers above it that keep their activations.
  if (store_ && cfg_.recomputed_layers() > 0)
    store_->prefetch(static_cast<int>(cfg_.checkpoint_slot(cfg_.recomputed_layers() - 1)));
  if (output_) hooks_->post_backward(output_group_);
  if (ctx_.sequence_parallel)
    dh = GatherFromSequenceParallelRegion::backward(*ctx_.tp, dh, MemoryCategory::Activations);
  else
    CopyToTpRegion::backward(*ctx_.tp, dh);
  final_hidden_ = Tensor();
  hooks_->pre_backward(final_group_);
  dh = final_ln_->backward(dh);
  hooks_->post_backward(final_group_);
  for (std::size_t i = layers_.size(); i-- > 0;) {
    const int g = first_layer_group_ + static_cast<int>(i);
    const auto li = static_cast<std::int64_t>(i);
    if (cfg_.recompute_chunk > 1 && cfg_.recomputes_layer(li) && cfg_.chunk_last_layer(li) == li)
      recompute_chunk_below(li);
    hooks_->pre_backward(g);
    dh = layers_[i]->backward(dh);
    hooks_->post_backward(g);
  }
  if (step_.training && cfg_.hidden_dropout > 0) {
    kernels::dropout_backward(dh, cfg_.hidden_dropout, RngKey{step_.seed, step_.iteration, 0, kRngEmbeddingDropout},
                              hidden_layout(dh), dh);
  }
  if (output_) hooks_->pre_backward(embedding_group_);
  const Tensor dsum = embedding_.backward(dh);  // under sequence parallelism: every row, gathered
  if (position_) position_->backward(dsum, step_.seq, step_.positions);
  hooks_->post_backward(embedding_group_);
}

// A chunk of recompute reached from above (its last layer `last`): its kept
// input back, the layers below `last` recomputed in order (each with its
// parameters, as in the forward: stage 3 gathers them again), and `last`
// given its input to recompute inside its own backward.
void GPTModel::recompute_chunk_below(std::int64_t last) {
  const std::int64_t first = cfg_.checkpoint_slot(last) * cfg_.recompute_chunk;
  Tensor x = layers_[static_cast<std::size_t>(first)]->restore_checkpoint();
  for (std::int64_t j = first; j < last; ++j) {
    const int g = first_layer_group_ + static_cast<int>(j);
    hooks_->pre_forward(g);
    x = layers_[static_cast<std::size_t>(j)]->recompute(x);
    hooks_->post_forward(g);
  }
  layers_[static_cast<std::size_t>(last)]->set_recompute_input(x);
}

double GPTModel::flops_per_token(bool with_recompute) const {
  // Narayanan et al. (2021) eq. 3 divided by B s, generalised to the model's
  // matrix shapes: a layer's forward is 2 x its GEMM weights per token plus
  // 4 s h for the attention scores and context (for GPT-2 24 h^2 (1 + s/(6h))),
  // x3 for forward and backward, x4 for a layer that recomputes (full: with
  // --recompute-method block only the first --recompute-num-layers do); the
  // logits stay 6 h V (never recomputed); scaling the whole of eq. 3 would
  // count them wrong. Selective recompute adds the scores' 2 s h per layer.
  const double l = static_cast<double>(cfg_.num_layers), h = static_cast<double>(cfg_.hidden_size);
  const double s = static_cast<double>(step_.seq > 1 ? step_.seq : cfg_.seq_length);
  const double v = static_cast<double>(cfg_.vocab_size), f = static_cast<double>(cfg_.ffn());
  const double kv = 2.0 * static_cast<double>(cfg_.query_groups() * cfg_.head_dim());
  const double weights = h * (h + kv) + h * h + (cfg_.swiglu ? 3.0 : 2.0) * h * f;
  const double layer_forward = 2.0 * weights + 4.0 * s * h;
  if (!with_recompute) return 3.0 * l * layer_forward + 6.0 * h * v;
  const double recomputed = static_cast<double>(cfg_.recomputed_layers());
  const double selective =
      cfg_.recompute_core_attention && !cfg_.fused_attention() && !cfg_.cudnn_attention() ? l * 2.0 * s * h : 0.0;
  return 3.0 * l * layer_forward + recomputed * layer_forward + selective + 6.0 * h * v;
}

}  // namespace megazero::layers
