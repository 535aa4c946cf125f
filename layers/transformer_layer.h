// One pre-LayerNorm GPT block:
//   x1  = x  + dropout(attention(ln1(x)))
//   out = x1 + dropout(mlp(ln2(x1)))
// With recompute (activation checkpointing) the block keeps only its input
// after forward and re-runs forward in backward; dropout masks come from the
// counter-based RNG, so the recomputed masks are the same without saving state.
// With --recompute-method block only the first --recompute-num-layers layers
// do (GPTConfig::recomputes_layer); the others keep their activations. With
// --recompute-method uniform --recompute-num-layers N, N layers share one
// kept input and the model remakes them together (restore_checkpoint,
// recompute, set_recompute_input).
#pragma once

#include "layers/attention.h"
#include "layers/checkpoint_store.h"
#include "layers/normalization.h"
#include "layers/mlp.h"
#include "megazero/kernels/rng.h"

namespace megazero::layers {

class TransformerLayer {
 public:
  TransformerLayer(ParameterSet& params, const GPTConfig& cfg, int layer, const TpContext& ctx);
  TransformerLayer(const TransformerLayer&) = delete;  // store_ may point at own_store_
  TransformerLayer& operator=(const TransformerLayer&) = delete;
  Tensor forward(const Tensor& x, const StepInfo& step);
  Tensor backward(const Tensor& dy);
  // Chunks of recompute (--recompute-method uniform --recompute-num-layers N),
  // driven by the model when its backward reaches a chunk's last layer: the
  // chunk's first layer hands back the kept input; each layer below the last
  // recomputes its forward from the one below's output (keeping its
  // activations for its backward, which then recomputes nothing); the last
  // layer is given its input and recomputes inside its backward.
  Tensor restore_checkpoint();
  Tensor recompute(const Tensor& x);
  void set_recompute_input(const Tensor& x) { recompute_input_ = x; }
  // Where the checkpointed input goes with recompute (the model's store).
  // nullptr: keep the whole input (the layer's own store).
  void set_checkpoint_store(ActivationCheckpointStore* store) { store_ = store ? store : &own_store_; }
  // The attention kernels' start-up work (ParallelSelfAttention::prepare_kernels).
  std::string prepare_kernels(const StepInfo& step, double p) { return attention_.prepare_kernels(step, p); }
  // This layer's key/value cache buffer (layers/kv_cache.h).
  Tensor make_kv_buffer(std::int64_t capacity) const { return attention_.make_kv_buffer(capacity); }

 private:
  Tensor forward_impl(const Tensor& x);
  kernels::DropoutLayout layout_of(const Tensor& hidden) const;  // of this rank's residual-stream rows
  Tensor hidden_dropout(const Tensor& x, RngSite site) const;
  Tensor bias_dropout_add(const Tensor& y, const Parameter* bias, const Tensor& residual, RngSite site) const;
  // The backward of the dropout at `site` over residual-stream rows shaped
  // like `dy`, into `out`. With `bias` (the sub-block's output bias, added
  // before the dropout), its gradient is summed in the same pass
  // (kernels::dropout_backward_bias_grad).
  kernels::DropoutBackwardOf hidden_dropout_backward_of(const Tensor& dy, RngSite site, Parameter* bias,
                                                        Tensor& out) const;
  void release();

  GPTConfig cfg_;
  int layer_;
  TpContext ctx_;
  std::unique_ptr<Normalization> ln1_;
  ParallelSelfAttention attention_;
  std::unique_ptr<Normalization> ln2_;
  ParallelMLP mlp_;
  StepInfo step_;
  bool recomputed_ = false;  // recompute() ran since the forward: the backward finds its activations
  Tensor recompute_input_;   // set_recompute_input's
  KeepWholeCheckpoints own_store_;
  ActivationCheckpointStore* store_ = &own_store_;
};

}  // namespace megazero::layers
