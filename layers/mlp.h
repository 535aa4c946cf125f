// h -> ffn (column-parallel, each rank a slice of the hidden units) -> GeLU
// (or SwiGLU, or squared ReLU) ->
// ffn -> h (row-parallel, all-reduced). No communication between the two.
#pragma once

#include "layers/gpt_config.h"
#include "layers/linear.h"

namespace megazero::layers {

class ParallelMLP {
 public:
  ParallelMLP(ParameterSet& params, const std::string& name, const GPTConfig& cfg, const TpContext& ctx);
  // add_output_bias false: fc2's bias is left to the caller (output_bias()).
  Tensor forward(const Tensor& x, bool add_output_bias = true);
  Parameter* output_bias() const { return fc2_.bias(); }
  // output_bias_grad_done: the caller summed fc2's bias gradient.
  Tensor backward(const Tensor& dy, bool output_bias_grad_done = false);
  void release();

 private:
  // Megatron's bias-GeLU fusion (--no-bias-gelu-fusion turns it off): fc1's
  // bias is added inside the GeLU kernel, and its gradient summed in the GeLU
  // backward's pass, instead of in passes of their own.
  bool fused_bias_gelu() const { return gelu() && bias_gelu_fusion_ && fc1_.bias() != nullptr; }
  bool gelu() const { return !swiglu_ && !squared_relu_; }
  // --gemm-epilogues: fc1's bias and the GeLU inside fc1's GEMM; with =all
  // also the GeLU backward with fc1's bias gradient inside fc2's
  // input-gradient GEMM (else our one-pass GeLU backward of pre, which holds
  // the bias already).
  bool gemm_gelu() const { return gelu() && forward_epilogues(ctx_.gemm_epilogues) && fc1_.bias() != nullptr; }

  TpContext ctx_;
  bool bias_gelu_fusion_;
  bool swiglu_;  // fc1 = [gate | up] (stacked), activation silu(gate) * up
  // --squared-relu: relu(pre)^2 after fc1 with its bias (Megatron fuses only
  // GeLU and SwiGLU with the bias, so neither is fused here).
  bool squared_relu_;
  ColumnParallelLinear fc1_;
  RowParallelLinear fc2_;
  // fc1's output: with its bias (also under --gemm-epilogues), or without it
  // under the bias-GeLU fusion (SwiGLU: [gate | up]).
  Tensor pre_gelu_;
};

}  // namespace megazero::layers
