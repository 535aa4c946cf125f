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
  const Parameter* output_bias() const { return fc2_.bias(); }
  Tensor backward(const Tensor& dy);
  void release();

 private:
  TpContext ctx_;
  ColumnParallelLinear fc1_;
  RowParallelLinear fc2_;
  Tensor pre_gelu_;
};

}  // namespace megazero::layers
