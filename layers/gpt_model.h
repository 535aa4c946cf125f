// GPT: word (vocab-parallel) + position embeddings -> dropout -> N transformer
// layers -> final LayerNorm -> logits through the tied word-embedding weight
// (vocab-parallel, never gathered) -> vocab-parallel cross-entropy.
#pragma once

#include <memory>
#include <vector>

#include "layers/cross_entropy.h"
#include "layers/embedding.h"
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
  // the mean loss over the B*S tokens.
  double forward(const Tensor& ids, const Tensor& targets, const StepInfo& step);
  // Accumulates d(loss_scale * mean loss)/d(parameters) into the gradients.
  void backward(double loss_scale = 1.0);
  // Storage manager called around each parameter group (ZeRO); none by default.
  void set_param_hooks(ParamHooks* hooks) { hooks_ = hooks ? hooks : &no_hooks_; }
  // Where recomputing layers keep their inputs (ZeRO-R's Pa, Pa+cpu, MD); the
  // whole tensor by default.
  void set_checkpoint_store(ActivationCheckpointStore* store);
  // Parameter groups: embeddings (word + position), one per layer, final LN.
  int embedding_group() const { return embedding_group_; }

  const GPTConfig& config() const { return cfg_; }
  // This rank's logits [B*S, V_local] of the last forward (kept for tests and
  // evaluation), and which global columns they cover.
  const Tensor& logits() const { return logits_; }
  std::int64_t vocab_start() const { return embedding_.vocab_start(); }
  std::int64_t vocab_valid() const { return embedding_.valid_rows(); }
  const std::vector<double>& token_losses() const { return loss_.token_losses(); }
  // Model FLOPs per token for forward + backward, without recompute: 6 x the
  // parameters touched per token plus attention (Narayanan et al., eq. 3 / B s).
  double flops_per_token(bool with_recompute) const;

 private:
  void check_ids(const Tensor& ids, const char* what) const;

  GPTConfig cfg_;
  TpContext ctx_;
  int embedding_group_ = 0, first_layer_group_ = 0, final_group_ = 0;  // before the layers: init order
  VocabParallelEmbedding embedding_;
  PositionEmbedding position_;
  std::vector<std::unique_ptr<TransformerLayer>> layers_;
  std::unique_ptr<LayerNorm> final_ln_;
  VocabParallelCrossEntropy loss_;
  StepInfo step_;
  Tensor final_hidden_, logits_;
  ParamHooks no_hooks_;
  ParamHooks* hooks_ = &no_hooks_;
};

}  // namespace megazero::layers
