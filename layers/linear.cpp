#include "layers/linear.h"

#include "layers/mappings.h"
#include "megazero/core/error.h"
#include "megazero/kernels/gemm.h"
#include "megazero/kernels/gelu_bias.h"
#include "megazero/kernels/linear_epilogues.h"

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
  weight_->grad_overwritable = true;  // written only by the weight-gradient GEMM (backward), first with beta 0
}

Tensor ColumnParallelLinear::weight() const {
  const Shape& l = weight_->local_shape;
  return weight_->value.view({local_out_, l.back()});
}

Tensor ColumnParallelLinear::bias_value() const { return bias_->value.view({local_out_}); }

Tensor ColumnParallelLinear::full_input(const Tensor& x) {
  input_ = x;  // under sequence parallelism only this rank's rows: backward gathers them again
  if (ctx_.sequence_parallel)
    return GatherFromSequenceParallelRegion::forward(*ctx_.tp, x, MemoryCategory::Activations);
  CopyToTpRegion::forward(*ctx_.tp, x);
  return x;
}

Tensor ColumnParallelLinear::forward(const Tensor& x, bool add_bias) {
  MZ_CHECK(add_bias || !gather_output_, "ColumnParallelLinear: a gathered output cannot leave its bias to the caller");
  const Tensor full = full_input(x);
  Tensor y = ctx_.activation({full.size(0), local_out_});
  if (bias_ && add_bias && forward_epilogues(ctx_.gemm_epilogues)) {
    kernels::linear_bias_forward(full, weight(), bias_value(), y);
  } else {
    gemm(full, false, weight(), true, y);
    if (bias_ && add_bias) kernels::add_bias(y, bias_value());
  }
  if (!gather_output_) return y;
  return GatherFromTpRegion::forward(*ctx_.tp, y, MemoryCategory::Activations);
}

Tensor ColumnParallelLinear::forward_gelu(const Tensor& x, Tensor& pre) {
  MZ_CHECK(bias_ && !gather_output_, "ColumnParallelLinear::forward_gelu needs a bias and an output left split");
  const Tensor full = full_input(x);
  pre = ctx_.activation({full.size(0), local_out_});
  Tensor out = ctx_.activation({full.size(0), local_out_});
  kernels::linear_bias_gelu_forward(full, weight(), bias_value(), pre, out);
  return out;
}

Tensor ColumnParallelLinear::backward(const Tensor& dy_in, bool bias_grad_done) {
  MZ_CHECK(input_.defined(), "ColumnParallelLinear::backward before forward");
  Tensor dy = gather_output_ ? GatherFromTpRegion::backward(*ctx_.tp, dy_in, MemoryCategory::Activations) : dy_in;
  // Sequence parallelism keeps 1/TP of the input and all-gathers it again
  // here (Megatron does the same): memory for one more collective.
  const Tensor full = ctx_.sequence_parallel
                          ? GatherFromSequenceParallelRegion::forward(*ctx_.tp, input_, MemoryCategory::Activations)
                          : input_;
  Tensor dweight = weight_->grad.view({local_out_, full.size(1)});
  const float beta = take_grad_beta(*weight_);  // 0: the first write of this backward overwrites
  const bool bias_grad = bias_ && !bias_grad_done;
  if (bias_grad && backward_epilogues(ctx_.gemm_epilogues)) {
    Tensor dbias = bias_->grad.view({local_out_});
    kernels::linear_weight_bias_grad(dy, full, dweight, dbias, beta);  // both in the weight-gradient GEMM
  } else {
    gemm(dy, true, full, false, dweight, 1.0f, beta);  // dW (+)= dy^T x
    if (bias_grad) {
      Tensor dbias = bias_->grad.view({local_out_});
      kernels::bias_grad(dy, dbias);
    }
  }
  Tensor dx = ctx_.activation(full.shape());
  gemm(dy, false, weight(), false, dx);  // partial: this rank's outputs only
  release();
  if (ctx_.sequence_parallel)
    return GatherFromSequenceParallelRegion::backward(*ctx_.tp, dx, MemoryCategory::Activations);
  CopyToTpRegion::backward(*ctx_.tp, dx);
  return dx;
}

RowParallelLinear::RowParallelLinear(ParameterSet& params, const std::string& name, std::int64_t in, std::int64_t out,
                                     bool bias, const TpContext& ctx, double init_std)
    : ctx_(ctx) {
  weight_ = &params.add(name + ".weight", {out, in}, 1, ctx.rank(), ctx.size(), Init::Normal, init_std);
  weight_->grad_overwritable = true;  // written only by the weight-gradient GEMM (backward), first with beta 0
  if (bias) bias_ = &params.add(name + ".bias", {out}, -1, 0, 1, Init::Zeros, 0, false);
}

Tensor RowParallelLinear::forward(const Tensor& x, bool add_bias) {
  input_ = x;
  Tensor y = ctx_.activation({x.size(0), weight_->local_shape[0]});
  gemm(x, false, weight_->value, true, y);
  if (ctx_.sequence_parallel)
    y = ReduceScatterToSequenceParallelRegion::forward(*ctx_.tp, y, MemoryCategory::Activations);
  else
    ReduceFromTpRegion::forward(*ctx_.tp, y);
  if (bias_ && add_bias) kernels::add_bias(y, bias_->value);  // after the reduction: added once
  return y;
}

Tensor RowParallelLinear::backward(const Tensor& dy_in, bool bias_grad_done, const GeluInput* gelu) {
  MZ_CHECK(input_.defined(), "RowParallelLinear::backward before forward");
  Tensor dy = dy_in;
  if (ctx_.sequence_parallel)
    dy = ReduceScatterToSequenceParallelRegion::backward(*ctx_.tp, dy_in, MemoryCategory::Activations);
  else
    ReduceFromTpRegion::backward(*ctx_.tp, dy);
  // Under sequence parallelism the bias's gradient is summed here, over the
  // gathered rows (the whole batch), so it needs no reduction of its own.
  if (bias_ && !bias_grad_done) kernels::bias_grad(dy, bias_->grad);
  gemm(dy, true, input_, false, weight_->grad, 1.0f, take_grad_beta(*weight_));
  Tensor dx = ctx_.activation(input_.shape());
  if (gelu != nullptr) {
    MZ_CHECK(gelu->pre != nullptr && gelu->dbias != nullptr, "RowParallelLinear::backward: incomplete GeluInput");
    kernels::linear_dgelu_bias_grad(dy, weight_->value, *gelu->pre, dx, *gelu->dbias);  // d pre, not d gelu(pre)
  } else {
    gemm(dy, false, weight_->value, false, dx);
  }
  release();
  return dx;
}

}  // namespace megazero::layers
