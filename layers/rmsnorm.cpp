#include "layers/rmsnorm.h"

#include "megazero/core/error.h"
#include "megazero/kernels/rmsnorm.h"

namespace megazero::layers {

RMSNorm::RMSNorm(ParameterSet& params, const std::string& name, std::int64_t hidden, double eps, const TpContext& ctx,
                 bool one_plus)
    : ctx_(ctx),
      gamma_(&params.add(name + ".weight", {hidden}, -1, 0, 1, one_plus ? Init::Zeros : Init::Ones, 0, false)),
      applied_(gamma_, one_plus),
      eps_(eps) {}

Tensor RMSNorm::forward(const Tensor& x) {
  input_ = x;
  rstd_ = ctx_.row_stats({x.size(0)});
  Tensor y = ctx_.activation(x.shape());
  kernels::rmsnorm_forward(x, applied_.forward(), eps_, y, rstd_);
  return y;
}

Tensor RMSNorm::backward(const Tensor& dy, const Tensor* residual_grad) {
  MZ_CHECK(input_.defined(), "RMSNorm::backward before forward");
  Tensor dx = ctx_.activation(input_.shape());
  NormGradients grads(ctx_, {&gamma_->grad});
  kernels::rmsnorm_backward(dy, input_, applied_.backward(), rstd_, dx, grads.grad(0), residual_grad);
  grads.finish();
  release();
  return dx;
}

void RMSNorm::release() {
  applied_.release();
  input_ = Tensor();
  rstd_ = Tensor();
}

}  // namespace megazero::layers
