#include "layers/linear.h"

#include "layers/mappings.h"
#include "megazero/core/error.h"
#include "megazero/kernels/gemm.h"
#include "megazero/kernels/gelu_bias.h"

namespace megazero::layers {

ColumnParallelLinear::ColumnParallelLinear(ParameterSet& params, const std::string& name, std::int64_t in,
                                           std::int64_t out, bool bias, bool gather_output, const TpContext& ctx,
                                           double init_std)
    : ctx_(ctx), gather_output_(gather_output), local_out_(out / ctx.size()) {
  weight_ = &params.add(name + ".weight", {out, in}, 0, ctx.rank(), ctx.size(), Init::Normal, init_std);
  if (bias) bias_ = &params.add(name + ".bias", {out}, 0, ctx.rank(), ctx.size(), Init::Zeros, 0, false);
}

Tensor ColumnParallelLinear::forward(const Tensor& x, bool add_bias) {
  MZ_CHECK(add_bias || !gather_output_, "ColumnParallelLinear: a gathered output cannot leave its bias to the caller");
  CopyToTpRegion::forward(*ctx_.tp, x);
  input_ = x;
  Tensor y = ctx_.activation({x.size(0), local_out_});
  gemm(x, false, weight_->value, true, y);
  if (bias_ && add_bias) kernels::add_bias(y, bias_->value);
  if (!gather_output_) return y;
  return GatherFromTpRegion::forward(*ctx_.tp, y, MemoryCategory::Activations);
}

Tensor ColumnParallelLinear::backward(const Tensor& dy_in, bool bias_grad_done) {
  MZ_CHECK(input_.defined(), "ColumnParallelLinear::backward before forward");
  Tensor dy = gather_output_ ? GatherFromTpRegion::backward(*ctx_.tp, dy_in, MemoryCategory::Activations) : dy_in;
  gemm(dy, true, input_, false, weight_->grad, 1.0f, 1.0f);  // dW += dy^T x
  if (bias_ && !bias_grad_done) kernels::bias_grad(dy, bias_->grad);
  Tensor dx = ctx_.activation(input_.shape());
  gemm(dy, false, weight_->value, false, dx);  // partial: this rank's outputs only
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
