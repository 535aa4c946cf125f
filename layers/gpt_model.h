// GPT: word (vocab-parallel) + position embeddings -> dropout -> N transformer
// layers -> final LayerNorm -> logits through the tied word-embedding weight
// (vocab-parallel, never gathered) -> vocab-parallel cross-entropy.
//
// The same model covers Llama-style decoders (gpt_config.h): no position
// table with rotary embeddings (applied inside attention), RMSNorm, SwiGLU,
// grouped-query attention, no linear biases, and an output layer of its own
// (vocab-parallel like the embedding) with untied embeddings.
//
// With --sequence-parallel (TP > 1) the residual stream from the embedding to
// the final norm holds 1/TP of the token rows per rank (layers/mappings.h);
// the logits gather them again.
#pragma once

#include <memory>
#include <vector>

#include "layers/cross_entropy.h"
#include "layers/embedding.h"
#include "layers/kv_cache.h"
#include "layers/param_hooks.h"
#include "layers/transformer_layer.h"

namespace megazero::layers {

class GPTModel {
 public:
  // Declares every parameter in `params` (validating cfg for this TP size);
  // the caller then binds storage (ParameterSet::allocate or ZeRO) and
  // initialises.
  GPTModel(const GPTConfig& cfg, const TpContext& ctx, ParameterSet& params);

  // ids, targets: int64 [B*S] (B = step.micro_batch, S = step.seq). Returns
  // the per-token losses [B*S] on the model's device (fp32 for 16-bit
  // models) without waiting for the device: training sums them there.
  // loss_weights, when defined, weight each token's loss and its gradient
  // ([B*S] of the losses' dtype on the model's device; --eod-mask-loss makes
  // them, train/loss_mask.h).
  Tensor forward_losses(const Tensor& ids, const Tensor& targets, const StepInfo& step,
                        const Tensor& loss_weights = Tensor());
  // The same, returning the mean (weighted) loss over the B*S tokens (waits
  // for the device: evaluation, tests, benchmarks).
  double forward(const Tensor& ids, const Tensor& targets, const StepInfo& step, const Tensor& loss_weights = Tensor());
  // Generation with a key/value cache (layers/kv_cache.h): an empty cache for
  // `capacity` positions (at most --max-position-embeddings) on the model's device.
  KvCache make_kv_cache(std::int64_t capacity) const;
  // The logits [T, V_local] of T new tokens `ids` (int64 [T]) of one sequence
  // at positions cache.length .. + T - 1, each layer attending to the cached
  // positions and causally to the new ones, whose keys and values it appends.
  // Evaluation only; no sequence parallelism. The same function as forward's
  // logits of the whole sequence's last T rows (to rounding).
  Tensor decode(const Tensor& ids, KvCache& cache);
  // Accumulates d(loss_scale * mean loss)/d(parameters) into the gradients.
  void backward(double loss_scale = 1.0);
  // Start-up work of the kernels for steps shaped like `step` with attention
  // dropout p (--attention-backend cudnn: cuDNN's plans, built once; every
  // layer has the same shapes); a line for the log, empty if there is none.
  std::string prepare_kernels(const StepInfo& step, double p) {
    return layers_.empty() ? std::string() : layers_.front()->prepare_kernels(step, p);
  }
  // Storage manager called around each parameter group (ZeRO); none by default.
  void set_param_hooks(ParamHooks* hooks) { hooks_ = hooks ? hooks : &no_hooks_; }
  // Where recomputing layers keep their inputs (ZeRO-R's Pa, Pa+cpu, MD); the
  // whole tensor by default.
  void set_checkpoint_store(ActivationCheckpointStore* store);
  // Parameter groups: embeddings (word + position), one per layer, final
  // norm, and the output layer when untied.
  int embedding_group() const { return embedding_group_; }

  const GPTConfig& config() const { return cfg_; }
  // The loss consumes the logits in place, so they are not kept. With
  // keep_logits(true) (tests, inspection) each forward also keeps a copy,
  // one more [B*S, V_local] tensor, returned by logits().
  void keep_logits(bool keep) { keep_logits_ = keep; }
  const Tensor& logits() const { return kept_logits_; }
  // Which global vocabulary columns this rank's logits cover.
  std::int64_t vocab_start() const { return embedding_.vocab_start(); }
  std::int64_t vocab_valid() const { return embedding_.valid_rows(); }
  // Model FLOPs per token for forward + backward: 6 x the parameters touched
  // per token plus attention (Narayanan et al., eq. 3 / B s); with_recompute
  // adds what the configuration recomputes (full, block or selective).
  double flops_per_token(bool with_recompute) const;

 private:
  void check_ids(const Tensor& ids, const char* what) const;
  kernels::DropoutLayout hidden_layout(const Tensor& hidden) const;  // of this rank's residual-stream rows

  // The [V_local, H] weight the logits are computed with: the word embedding's
  // (tied) or the output layer's.
  Parameter& output_weight() { return output_ ? *output_ : embedding_.weight(); }
  // Embedding, layers, final norm and the logits GEMM of step_ (the forward's
  // and decode's common part); the embedding's positions start at `first_position`.
  Tensor logits_of(const Tensor& ids, std::int64_t first_position);

  GPTConfig cfg_;
  TpContext ctx_;
  int embedding_group_ = 0, first_layer_group_ = 0, final_group_ = 0;  // before the layers: init order
  int output_group_ = -1;                                              // untied only
  VocabParallelEmbedding embedding_;
  std::unique_ptr<PositionEmbedding> position_;  // learned absolute positions only
  std::vector<std::unique_ptr<TransformerLayer>> layers_;
  std::unique_ptr<Normalization> final_ln_;
  Parameter* output_ = nullptr;  // untied output-layer weight [padded vocab, H], split like the embedding
  VocabParallelCrossEntropy loss_;
  StepInfo step_;
  Tensor final_hidden_, kept_logits_;
  bool keep_logits_ = false;
  ParamHooks no_hooks_;
  ParamHooks* hooks_ = &no_hooks_;
  void recompute_chunk_below(std::int64_t last);  // --recompute-method uniform --recompute-num-layers N > 1
  ActivationCheckpointStore* store_ = nullptr;    // set_checkpoint_store's (nullptr: each layer keeps its own)
};

}  // namespace megazero::layers
