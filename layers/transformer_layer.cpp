#include "layers/transformer_layer.h"

#include <utility>

#include "megazero/core/error.h"
#include "megazero/kernels/dropout.h"
#include "megazero/kernels/gelu_bias.h"

namespace megazero::layers {

TransformerLayer::TransformerLayer(ParameterSet& params, const GPTConfig& cfg, int layer, const TpContext& ctx)
    : cfg_(cfg),
      layer_(layer),
      ctx_(ctx),
      ln1_(make_normalization(params, "layers." + std::to_string(layer) + ".ln1", cfg, ctx)),
      attention_(params, "layers." + std::to_string(layer) + ".attention", cfg, layer, ctx),
      ln2_(make_normalization(params, "layers." + std::to_string(layer) + ".ln2", cfg, ctx)),
      mlp_(params, "layers." + std::to_string(layer) + ".mlp", cfg, ctx) {}

kernels::DropoutLayout TransformerLayer::layout_of(const Tensor& hidden) const {
  const std::int64_t rows = step_.micro_batch * step_.seq;
  MZ_CHECK(hidden.size(0) == ctx_.local_rows(rows), "residual stream of ", hidden.size(0), " rows for ",
           ctx_.local_rows(rows));
  return hidden_dropout_layout(step_, ctx_.first_row(rows), hidden.size(0), cfg_.hidden_size);
}

Tensor TransformerLayer::hidden_dropout(const Tensor& x, RngSite site) const {
  const double p = step_.training ? cfg_.hidden_dropout : 0.0;
  if (p == 0) return x;
  const kernels::DropoutLayout l = layout_of(x);
  Tensor y = ctx_.activation(x.shape());
  kernels::dropout_forward(x, p, RngKey{step_.seed, step_.iteration, static_cast<std::uint32_t>(layer_), site}, l, y);
  return y;
}

kernels::DropoutBackwardOf TransformerLayer::hidden_dropout_backward_of(const Tensor& dy, RngSite site, Parameter* bias,
                                                                        Tensor& out) const {
  return {step_.training ? cfg_.hidden_dropout : 0.0,
          RngKey{step_.seed, step_.iteration, static_cast<std::uint32_t>(layer_), site}, layout_of(dy), &out,
          bias ? &bias->grad : nullptr};
}

// residual + dropout(y + bias) in one pass (bias-dropout-add), written over y.
Tensor TransformerLayer::bias_dropout_add(const Tensor& y, const Parameter* bias, const Tensor& residual,
                                          RngSite site) const {
  const double p = step_.training ? cfg_.hidden_dropout : 0.0;
  const kernels::DropoutLayout l = layout_of(y);
  Tensor out = y;
  if (bias) {
    kernels::bias_dropout_add(y, bias->value, residual, p,
                              RngKey{step_.seed, step_.iteration, static_cast<std::uint32_t>(layer_), site}, l, out);
  } else {
    out = hidden_dropout(y, site);
    kernels::add(residual, out, out);
  }
  return out;
}

Tensor TransformerLayer::forward_impl(const Tensor& x) {
  // The residual each sub-block adds its output to: its input, or with
  // --apply-residual-connection-post-layernorm its norm's output (kept
  // until added; otherwise released once the attention has read it).
  const bool post = cfg_.residual_post_norm;
  Tensor h1 = ln1_->forward(x);
  Tensor a = attention_.forward(h1, step_, false);
  if (!post) h1 = Tensor();
  const Tensor& residual1 = post ? h1 : x;
  // x1 = residual1 + dropout(a + bias), written over a, and LN2 of it: one
  // pass where the device can (the LayerNorm's read of x1 saved).
  Tensor x1, h;
  if (const Parameter* bias = attention_.output_bias()) {
    x1 = a;
    h = ln2_->forward_bias_dropout_add(
        a, {&bias->value, &residual1, step_.training ? cfg_.hidden_dropout : 0.0,
            RngKey{step_.seed, step_.iteration, static_cast<std::uint32_t>(layer_), kRngAttentionOutputDropout},
            layout_of(a), &x1});
  } else {
    x1 = bias_dropout_add(a, nullptr, residual1, kRngAttentionOutputDropout);
    h = ln2_->forward(x1);
  }
  a = h1 = Tensor();
  Tensor m = mlp_.forward(h, false);
  const Tensor residual2 = post ? h : x1;
  h = x1 = Tensor();
  return bias_dropout_add(m, mlp_.output_bias(), residual2, kRngMlpOutputDropout);
}

Tensor TransformerLayer::forward(const Tensor& x, const StepInfo& step) {
  step_ = step;
  Tensor out = forward_impl(x);
  if (!step.training) {
    // Evaluation has no backward: keep nothing, or this pass's activations
    // would stay allocated into the next training step (above its plan).
    release();
  } else if (cfg_.recomputes_layer(layer_)) {
    if (cfg_.keeps_checkpoint(layer_)) store_->save(static_cast<int>(cfg_.checkpoint_slot(layer_)), x);
    release();
  }
  return out;
}

Tensor TransformerLayer::restore_checkpoint() {
  MZ_CHECK(cfg_.keeps_checkpoint(layer_), "layer ", layer_, " keeps no checkpoint");
  return store_->restore(static_cast<int>(cfg_.checkpoint_slot(layer_)));
}

Tensor TransformerLayer::recompute(const Tensor& x) {
  MZ_CHECK(cfg_.recomputes_layer(layer_) && !recomputed_, "layer ", layer_, ": recompute out of order");
  recomputed_ = true;
  return forward_impl(x);  // same step_, same masks
}

Tensor TransformerLayer::backward(const Tensor& dy) {
  if (cfg_.recomputes_layer(layer_)) {
    if (recomputed_)  // the model remade this layer's activations with the rest of its chunk
      recomputed_ = false;
    else if (recompute_input_.defined())  // the chunk's last layer: its input from the layer below
      forward_impl(std::exchange(recompute_input_, Tensor()));
    else
      forward_impl(store_->restore(static_cast<int>(cfg_.checkpoint_slot(layer_))));
  }
  // Each output bias's gradient is summed in its dropout backward's pass, so
  // the linear that owns it skips its own sum (the bias was added there too,
  // in bias-dropout-add). Not under sequence parallelism: that pass sees this
  // rank's rows only; the linear sums the gathered rows instead.
  Parameter* mlp_bias = ctx_.sequence_parallel ? nullptr : mlp_.output_bias();
  Tensor dm = ctx_.activation(dy.shape());  // not in place: dy is also the residual's gradient
  kernels::dropout_backward_of(dy, hidden_dropout_backward_of(dy, kRngMlpOutputDropout, mlp_bias, dm));
  // dx1 = LN2's input gradient + the residual's (dy), and the attention
  // output dropout's backward of it (da), in one pass where the device can.
  Parameter* attention_bias = ctx_.sequence_parallel ? nullptr : attention_.output_bias();
  Tensor dln2 = mlp_.backward(dm, mlp_bias != nullptr);
  dm = Tensor();  // each gradient released once read: a [rows, hidden] activation each
  // --apply-residual-connection-post-layernorm: the residual's gradient (dy)
  // joins the norm's output gradient, not its input's.
  const bool post = cfg_.residual_post_norm;
  if (post) kernels::add(dy, dln2, dln2);
  Tensor da = ctx_.activation(dy.shape());
  Tensor dx1 = ln2_->backward_dropout(dln2, post ? nullptr : &dy,
                                      hidden_dropout_backward_of(dy, kRngAttentionOutputDropout, attention_bias, da));
  dln2 = Tensor();
  if (!post) return ln1_->backward(attention_.backward(da, attention_bias != nullptr), &dx1);
  Tensor dh1 = attention_.backward(da, attention_bias != nullptr);
  da = Tensor();
  kernels::add(dx1, dh1, dh1);
  dx1 = Tensor();
  return ln1_->backward(dh1);
}

void TransformerLayer::release() {
  ln1_->release();
  attention_.release();
  ln2_->release();
  mlp_.release();
}

}  // namespace megazero::layers
