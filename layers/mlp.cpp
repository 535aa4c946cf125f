#include "layers/mlp.h"

#include <cmath>

#include "megazero/core/error.h"
#include "megazero/kernels/gelu_bias.h"
#include "megazero/kernels/swiglu.h"

namespace megazero::layers {

ParallelMLP::ParallelMLP(ParameterSet& params, const std::string& name, const GPTConfig& cfg, const TpContext& ctx)
    : ctx_(ctx),
      bias_gelu_fusion_(cfg.bias_gelu_fusion),
      swiglu_(cfg.swiglu),
      squared_relu_(cfg.squared_relu),
      fc1_(params, name + ".fc1", cfg.hidden_size, cfg.ffn(), cfg.add_bias_linear, false, ctx, cfg.init_method_std,
           cfg.swiglu ? 2 : 1),
      fc2_(params, name + ".fc2", cfg.ffn(), cfg.hidden_size, cfg.add_bias_linear, ctx,
           cfg.init_method_std / std::sqrt(2.0 * static_cast<double>(cfg.num_layers))) {}

Tensor ParallelMLP::forward(const Tensor& x, bool add_output_bias) {
  if (gemm_gelu()) return fc2_.forward(fc1_.forward_gelu(x, pre_gelu_), add_output_bias);
  const bool fused = fused_bias_gelu();
  pre_gelu_ = fc1_.forward(x, !fused);
  if (swiglu_) {
    Tensor act = ctx_.activation({pre_gelu_.size(0), pre_gelu_.size(1) / 2});
    kernels::swiglu_forward(pre_gelu_, act);
    return fc2_.forward(act, add_output_bias);
  }
  Tensor act = ctx_.activation(pre_gelu_.shape());
  if (squared_relu_) {
    kernels::squared_relu_forward(pre_gelu_, act);
  } else if (fused) {
    kernels::bias_gelu_forward(pre_gelu_, fc1_.bias()->value, act);
  } else {
    kernels::gelu_forward(pre_gelu_, act);
  }
  return fc2_.forward(act, add_output_bias);
}

Tensor ParallelMLP::backward(const Tensor& dy, bool output_bias_grad_done) {
  MZ_CHECK(pre_gelu_.defined(), "MLP backward before forward");
  if (gemm_gelu()) {  // the forward's epilogue kept pre = x W + b
    Tensor dpre;
    if (backward_epilogues(ctx_.gemm_epilogues)) {  // the GeLU backward inside fc2's input-gradient GEMM
      const RowParallelLinear::GeluInput gelu{&pre_gelu_, &fc1_.bias()->grad};
      dpre = fc2_.backward(dy, output_bias_grad_done, &gelu);
    } else {  // our one-pass GeLU backward, adding no bias: pre holds it
      dpre = fc2_.backward(dy, output_bias_grad_done);
      kernels::bias_gelu_backward(dpre, pre_gelu_, Tensor(), dpre, fc1_.bias()->grad);
    }
    pre_gelu_ = Tensor();
    return fc1_.backward(dpre, /*bias_grad_done=*/true);
  }
  Tensor dact = fc2_.backward(dy, output_bias_grad_done);
  const bool fused = fused_bias_gelu();
  if (swiglu_) {
    Tensor dpre = ctx_.activation(pre_gelu_.shape());
    kernels::swiglu_backward(dact, pre_gelu_, dpre);
    dact = dpre;
  } else if (squared_relu_) {
    kernels::squared_relu_backward(dact, pre_gelu_, dact);
  } else if (fused) {
    Parameter& bias = *fc1_.bias();
    kernels::bias_gelu_backward(dact, pre_gelu_, bias.value, dact, bias.grad);
  } else {
    kernels::gelu_backward(dact, pre_gelu_, dact);
  }
  pre_gelu_ = Tensor();
  return fc1_.backward(dact, fused);
}

void ParallelMLP::release() {
  pre_gelu_ = Tensor();
  fc1_.release();
  fc2_.release();
}

}  // namespace megazero::layers
