#include "layers/layernorm.h"

#include "megazero/core/error.h"
#include "megazero/kernels/layernorm.h"

namespace megazero::layers {

LayerNorm::LayerNorm(ParameterSet& params, const std::string& name, std::int64_t hidden, double eps,
                     const TpContext& ctx, bool one_plus)
    : ctx_(ctx),
      gamma_(&params.add(name + ".weight", {hidden}, -1, 0, 1, one_plus ? Init::Zeros : Init::Ones, 0, false)),
      beta_(&params.add(name + ".bias", {hidden}, -1, 0, 1, Init::Zeros, 0, false)),
      applied_(gamma_, one_plus),
      eps_(eps) {}

Tensor LayerNorm::forward(const Tensor& x) {
  input_ = x;
  mean_ = ctx_.row_stats({x.size(0)});
  rstd_ = ctx_.row_stats({x.size(0)});
  Tensor y = ctx_.activation(x.shape());
  kernels::layernorm_forward(x, applied_.forward(), beta_->value, eps_, y, mean_, rstd_);
  return y;
}

Tensor LayerNorm::forward_bias_dropout_add(const Tensor& y, const kernels::BiasDropoutAddOf& before) {
  MZ_CHECK(before.out != nullptr, "LayerNorm::forward_bias_dropout_add: no tensor for the sum");
  input_ = *before.out;  // what the backward normalised: the sum
  mean_ = ctx_.row_stats({y.size(0)});
  rstd_ = ctx_.row_stats({y.size(0)});
  Tensor out = ctx_.activation(y.shape());
  kernels::bias_dropout_add_layernorm(y, before, applied_.forward(), beta_->value, eps_, out, mean_, rstd_);
  return out;
}

Tensor LayerNorm::backward(const Tensor& dy, const Tensor* residual_grad) {
  MZ_CHECK(input_.defined(), "LayerNorm::backward before forward");
  Tensor dx = ctx_.activation(input_.shape());
  NormGradients grads(ctx_, {&gamma_->grad, &beta_->grad});
  kernels::layernorm_backward(dy, input_, applied_.backward(), mean_, rstd_, dx, grads.grad(0), grads.grad(1),
                              residual_grad);
  grads.finish();
  release();
  return dx;
}

Tensor LayerNorm::backward_dropout(const Tensor& dy, const Tensor* residual_grad,
                                   const kernels::DropoutBackwardOf& then) {
  MZ_CHECK(input_.defined(), "LayerNorm::backward_dropout before forward");
  Tensor dx = ctx_.activation(input_.shape());
  NormGradients grads(ctx_, {&gamma_->grad, &beta_->grad});
  kernels::layernorm_backward_dropout(dy, input_, applied_.backward(), mean_, rstd_, dx, grads.grad(0), grads.grad(1),
                                      residual_grad, then);
  grads.finish();
  release();
  return dx;
}

void LayerNorm::release() {
  applied_.release();
  input_ = Tensor();
  mean_ = Tensor();
  rstd_ = Tensor();
}

}  // namespace megazero::layers
