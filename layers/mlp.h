// h -> ffn (column-parallel, each rank a slice of the hidden units) -> GeLU ->
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
  bool fused_bias_gelu() const { return !swiglu_ && bias_gelu_fusion_ && fc1_.bias() != nullptr; }

  TpContext ctx_;
  bool bias_gelu_fusion_;
  bool swiglu_;  // fc1 = [gate | up] (stacked), activation silu(gate) * up
  ColumnParallelLinear fc1_;
  RowParallelLinear fc2_;
  Tensor pre_gelu_;  // fc1's output: with its bias, or without it when fused (SwiGLU: [gate | up])
};

}  // namespace megazero::layers
