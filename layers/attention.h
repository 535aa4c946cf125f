// Causal self-attention with heads split across TP ranks: a fused QKV
// column-parallel projection (each rank computes q, k, v for its heads), causal
// softmax in fp32 or wider, attention dropout, and a row-parallel output
// projection whose all-reduce combines the heads.
//
// QKV weight layout: global rows ordered [head][q|k|v][head_dim], so a
// contiguous TP split of the rows gives each rank whole heads (as Megatron).
#pragma once

#include "layers/gpt_config.h"
#include "layers/linear.h"
#include "layers/step.h"

namespace megazero::layers {

class ParallelSelfAttention {
 public:
  ParallelSelfAttention(ParameterSet& params, const std::string& name, const GPTConfig& cfg, int layer,
                        const TpContext& ctx);
  // [B*S, H] -> [B*S, H]; add_output_bias false: the dense layer's bias is
  // left to the caller (output_bias()).
  Tensor forward(const Tensor& x, const StepInfo& step, bool add_output_bias = true);
  const Parameter* output_bias() const { return dense_.bias(); }
  Tensor backward(const Tensor& dy);
  void release();

 private:
  // [B*S, local_heads*3*hn] -> contiguous [B*local_heads, S, hn] for q (0), k (1) or v (2).
  Tensor split_heads(const Tensor& qkv, int which) const;

  GPTConfig cfg_;
  int layer_;
  TpContext ctx_;
  std::int64_t local_heads_, head_dim_;
  ColumnParallelLinear qkv_;
  RowParallelLinear dense_;
  StepInfo step_;
  Tensor q_, k_, v_, probs_, probs_dropped_;
};

}  // namespace megazero::layers
