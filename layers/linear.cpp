#include "layers/linear.h"

#include "layers/mappings.h"
#include "megazero/core/error.h"
#include "megazero/kernels/gemm.h"
#include "megazero/kernels/layer_kernels.h"

namespace megazero::layers {

ColumnParallelLinear::ColumnParallelLinear(ParameterSet& params, const std::string& name, std::int64_t in,
                                           std::int64_t out, bool bias, bool gather_output, const TpContext& ctx,
                                           double init_std, std::int64_t stacked)
    : ctx_(ctx), gather_output_(gather_output), local_out_(stacked * (out / ctx.size())) {
  MZ_CHECK(stacked >= 1 && (stacked == 1 || !gather_output), "ColumnParallelLinear: stacked ", stacked,
           " projections cannot gather their output");
  if (stacked == 1) {
    weight_ = &params.add(name + ".weight", {out, in}, 0, ctx.rank(), ctx.size(), Init::Normal, init_std);
    if (bias) bias_ = &params.add(name + ".bias", {out}, 0, ctx.rank(), ctx.size(), Init::Zeros, 0, false);
  } else {
    weight_ = &params.add(name + ".weight", {stacked, out, in}, 1, ctx.rank(), ctx.size(), Init::Normal, init_std);
    if (bias) bias_ = &params.add(name + ".bias", {stacked, out}, 1, ctx.rank(), ctx.size(), Init::Zeros, 0, false);
  }
}

Tensor ColumnParallelLinear::weight() const {
  const Shape& l = weight_->local_shape;
  return weight_->value.view({local_out_, l.back()});
}

Tensor ColumnParallelLinear::bias_value() const { return bias_->value.view({local_out_}); }

Tensor ColumnParallelLinear::forward(const Tensor& x, bool add_bias) {
  MZ_CHECK(add_bias || !gather_output_, "ColumnParallelLinear: a gathered output cannot leave its bias to the caller");
  CopyToTpRegion::forward(*ctx_.tp, x);
  input_ = x;
  Tensor y = ctx_.activation({x.size(0), local_out_});
  gemm(x, false, weight(), true, y);
  if (bias_ && add_bias) kernels::add_bias(y, bias_value());
  if (!gather_output_) return y;
  return GatherFromTpRegion::forward(*ctx_.tp, y, MemoryCategory::Activations);
}

Tensor ColumnParallelLinear::backward(const Tensor& dy_in, bool bias_grad_done) {
  MZ_CHECK(input_.defined(), "ColumnParallelLinear::backward before forward");
  Tensor dy = gather_output_ ? GatherFromTpRegion::backward(*ctx_.tp, dy_in, MemoryCategory::Activations) : dy_in;
  Tensor dweight = weight_->grad.view({local_out_, input_.size(1)});
  gemm(dy, true, input_, false, dweight, 1.0f, 1.0f);  // dW += dy^T x
  if (bias_ && !bias_grad_done) {
    Tensor dbias = bias_->grad.view({local_out_});
    kernels::bias_grad(dy, dbias);
  }
  Tensor dx = ctx_.activation(input_.shape());
  gemm(dy, false, weight(), false, dx);  // partial: this rank's outputs only
  CopyToTpRegion::backward(*ctx_.tp, dx);
  release();
  return dx;
}

RowParallelLinear::RowParallelLinear(ParameterSet& params, const std::string& name, std::int64_t in, std::int64_t out,
                                     bool bias, const TpContext& ctx, double init_std)
    : ctx_(ctx) {
  weight_ = &params.add(name + ".weight", {out, in}, 1, ctx.rank(), ctx.size(), Init::Normal, init_std);
  if (bias) bias_ = &params.add(name + ".bias", {out}, -1, 0, 1, Init::Zeros, 0, false);
}

Tensor RowParallelLinear::forward(const Tensor& x, bool add_bias) {
  input_ = x;
  Tensor y = ctx_.activation({x.size(0), weight_->local_shape[0]});
  gemm(x, false, weight_->value, true, y);
  ReduceFromTpRegion::forward(*ctx_.tp, y);
  if (bias_ && add_bias) kernels::add_bias(y, bias_->value);  // after the reduction: added once
  return y;
}

Tensor RowParallelLinear::backward(const Tensor& dy, bool bias_grad_done) {
  MZ_CHECK(input_.defined(), "RowParallelLinear::backward before forward");
  ReduceFromTpRegion::backward(*ctx_.tp, dy);
  if (bias_ && !bias_grad_done) kernels::bias_grad(dy, bias_->grad);
  gemm(dy, true, input_, false, weight_->grad, 1.0f, 1.0f);
  Tensor dx = ctx_.activation(input_.shape());
  gemm(dy, false, weight_->value, false, dx);
  release();
  return dx;
}

}  // namespace megazero::layers
