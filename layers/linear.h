// Megatron's two tensor-parallel linear layers. Weights are stored [out, in]
// (y = x W^T + b) as at TP = 1, split along out (column-parallel) or in
// (row-parallel). Each layer keeps what its backward needs (its input) until
// backward or release().
#pragma once

#include "layers/parameter.h"
#include "layers/tp_context.h"

namespace megazero::layers {

// Y = X A^T with A split by rows of the weight (output features): each rank
// computes its slice of the outputs. Input X replicated across TP, or under
// sequence parallelism this rank's rows of it (all-gathered here).
//
// stacked > 1 holds `stacked` projections of the same input side by side
// (SwiGLU's gate and up): the weight is [stacked, out, in] split along `out`,
// so each rank's output is [N, stacked * out / tp] = its slice of each
// projection in turn, and the global tensor does not depend on the TP size.
class ColumnParallelLinear {
 public:
  ColumnParallelLinear(ParameterSet& params, const std::string& name, std::int64_t in, std::int64_t out, bool bias,
                       bool gather_output, const TpContext& ctx, double init_std, std::int64_t stacked = 1);
  // x: [N, in] -> [N, out / tp] (or [N, out] with gather_output). add_bias
  // false leaves the bias to the caller (the MLP's bias-GeLU fusion).
  Tensor forward(const Tensor& x, bool add_bias = true);
  // The MLP's fc1 under --gemm-epilogues (needs a bias; not gathered): pre =
  // x A^T + b, kept by the caller for the GeLU backward, and returns gelu(pre),
  // both from one fused GEMM (kernels::linear_bias_gelu_forward).
  Tensor forward_gelu(const Tensor& x, Tensor& pre);
  // dy like forward's output -> dx [N, in] (TP-reduced); accumulates dW and,
  // unless the caller already has (bias_grad_done: the fused bias-GeLU
  // backward sums the same dy in its own pass), db.
  Tensor backward(const Tensor& dy, bool bias_grad_done = false);
  void release() { input_ = Tensor(); }
  std::int64_t local_out() const { return local_out_; }
  // This rank's slice of the bias, or nullptr for a layer without one.
  Parameter* bias() const { return bias_; }

 private:
  Tensor weight() const;  // this rank's weight as [local_out, in]
  Tensor bias_value() const;
  Tensor full_input(const Tensor& x);  // keeps x; the GEMM's input (all rows under sequence parallelism)

  TpContext ctx_;
  Parameter* weight_;
  Parameter* bias_ = nullptr;
  bool gather_output_;
  std::int64_t local_out_;
  Tensor input_;
};

// Y = X A^T with A split by columns (input features): input already split
// across TP (the output of a ColumnParallelLinear); partial products summed by
// an all-reduce (under sequence parallelism a reduce-scatter: each rank gets
// its rows of the sum), then the (replicated) bias added.
class RowParallelLinear {
 public:
  RowParallelLinear(ParameterSet& params, const std::string& name, std::int64_t in, std::int64_t out, bool bias,
                    const TpContext& ctx, double init_std);
  // x: [N, in / tp] -> [N, out], identical on every TP rank. add_bias false
  // leaves the bias to the caller (Megatron's skip_bias_add: the transformer
  // layer fuses it into bias-dropout-add).
  Tensor forward(const Tensor& x, bool add_bias = true);
  // What the layer feeding this one did after its GEMM, when its backward
  // fuses into this layer's input-gradient GEMM (--gemm-epilogues): a GeLU of
  // `pre` (its GEMM's output with its bias), whose bias gradient accumulates
  // into `dbias`. backward then returns d pre instead of d gelu(pre).
  struct GeluInput {
    const Tensor* pre = nullptr;
    Tensor* dbias = nullptr;
  };
  // The bias, or nullptr for a layer without one.
  Parameter* bias() const { return bias_; }
  // dy [N, out] -> dx [N, in / tp]; accumulates dW and, unless the caller
  // already has (bias_grad_done: the transformer layer sums it in its
  // dropout backward's pass), db.
  Tensor backward(const Tensor& dy, bool bias_grad_done = false, const GeluInput* gelu = nullptr);
  void release() { input_ = Tensor(); }

 private:
  TpContext ctx_;
  Parameter* weight_;
  Parameter* bias_ = nullptr;
  Tensor input_;
};

}  // namespace megazero::layers
