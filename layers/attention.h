// Causal self-attention with heads split across TP ranks: a fused QKV
// column-parallel projection (each rank computes q, k, v for its heads), causal
// softmax in fp32 or wider, attention dropout, and a row-parallel output
// projection whose all-reduce combines the heads.
//
// Two backends (--attention-backend), the same function: "unfused" keeps the
// [S, S] probabilities (before and after dropout) for backward; "fused" keeps
// only the attention output and a log-sum-exp per row and recomputes the rest
// (kernels/fused_attention.h). Both draw the same dropout mask. With
// --recompute-granularity selective the unfused path drops its probabilities
// after forward and makes them again in backward (Megatron's core-attention
// recompute; the same bits).
//
// QKV weight layout: global rows ordered [group][q heads of the group..., k,
// v][head_dim] (Megatron's), so a contiguous TP split of the rows gives each
// rank whole groups. Without grouped-query attention every head is its own
// group: [head][q|k|v][head_dim].
//
// Options: rotary position embedding (--position-embedding-type rope) rotates
// q and k of each head by position before the scores (after --qk-layernorm's
// per-head norms of q and k, when set); grouped-query attention
// (--num-query-groups G) shares one k/v head among the heads/G query heads of
// a group — k and v are kept per group (the memory GQA saves); the unfused
// path's batched GEMMs take a group's query heads at once against its k/v head
// (no copies); the fused kernels read each group's k/v head in place and give
// dk/dv per query head, summed here over the group.
#pragma once

#include <string>

#include "layers/gpt_config.h"
#include "layers/kv_cache.h"
#include "layers/linear.h"
#include "layers/normalization.h"
#include "layers/step.h"
#include "megazero/kernels/dropout.h"

namespace megazero::layers {

class ParallelSelfAttention {
 public:
  ParallelSelfAttention(ParameterSet& params, const std::string& name, const GPTConfig& cfg, int layer,
                        const TpContext& ctx);
  // [B*S, H] -> [B*S, H]; add_output_bias false: the dense layer's bias is
  // left to the caller (output_bias()).
  Tensor forward(const Tensor& x, const StepInfo& step, bool add_output_bias = true);
  Parameter* output_bias() const { return dense_.bias(); }
  // output_bias_grad_done: the caller summed the dense bias's gradient.
  Tensor backward(const Tensor& dy, bool output_bias_grad_done = false);
  void release();
  // --attention-backend cudnn on a GPU: builds cuDNN's plans for steps shaped
  // like `step` with dropout p (a log line); empty for the other backends.
  std::string prepare_kernels(const StepInfo& step, double p);
  // An empty key/value cache buffer of this layer (KvCache): [local key/value
  // heads, capacity, head size] on the model's device, in its dtype.
  Tensor make_kv_buffer(std::int64_t capacity) const;

 private:
  // cudnn: views of the projections' rows as [B, heads or groups, S, hn].
  Tensor group_view(const Tensor& rows, int which) const;
  Tensor context_view(const Tensor& rows) const;
  bool cudnn_in_place() const;  // q, k, v and their gradients all views of the rows
  // [B*S, local_groups*(per_group+2)*hn] -> contiguous q [B*local_heads, S, hn]
  // (which = 0), k or v [B*local_groups, S, hn] (which = 1, 2).
  Tensor split_heads(const Tensor& qkv, int which) const;
  // The fused kernels' dk or dv per query head [B*local_heads, S, hn] summed
  // over each group -> [B*local_groups, S, hn].
  Tensor sum_groups(const Tensor& dkv) const;
  // q, k, v (saved) -> the attention output [B*local_heads, S, hn], per backend.
  Tensor attend_unfused(double p, const RngKey& key);
  void make_probs(double p, const RngKey& key);  // unfused: probs_ and probs_dropped_ from q_, k_
  Tensor attend_fused(double p, const RngKey& key);
  // --attention-backend cudnn: q/k/v/context as [B, heads, S, hn] views into
  // the projections' buffers (no head copies); returns the dense input.
  Tensor forward_cudnn(double p, const RngKey& key);
  Tensor backward_cudnn(const Tensor& dmerged, double p, const RngKey& key);
  // With step.kv_cache (any backend's function, computed as the unfused path
  // does): the new tokens' keys and values appended to the cache, their
  // queries against every cached position and their own, causally.
  Tensor forward_cached(const Tensor& x, KvCache& cache, bool add_output_bias);
  // d(attention output) -> dq, dk, dv, per backend.
  void attend_backward_unfused(const Tensor& dctx, double p, const RngKey& key, Tensor& dq, Tensor& dk, Tensor& dv);
  void attend_backward_fused(const Tensor& dctx, double p, const RngKey& key, Tensor& dq, Tensor& dk, Tensor& dv);
  kernels::DropoutLayout probs_layout() const;  // of this step's [B, local heads, S, S] probabilities
  RngKey dropout_key() const;                   // of this step's attention dropout
  double scale() const;
  // --qk-layernorm: x [rows, S, hn] (q or k per head) through its norm, or
  // back (d of the norm's output -> d of its input); x itself without it.
  Tensor norm_heads(Normalization* norm, const Tensor& x);
  Tensor norm_heads_backward(Normalization* norm, const Tensor& dy);

  GPTConfig cfg_;
  int layer_;
  TpContext ctx_;
  std::int64_t local_heads_, local_groups_, per_group_, head_dim_;
  ColumnParallelLinear qkv_;
  RowParallelLinear dense_;
  // --qk-layernorm: q's and k's per-head norms (replicated across TP; each
  // rank's heads give a share of their gradients, summed over the TP group).
  std::unique_ptr<Normalization> q_norm_, k_norm_;
  StepInfo step_;
  Tensor q_, k_, v_;              // k_, v_: per group (after the rotary embedding)
  Tensor probs_, probs_dropped_;  // unfused
  Tensor context_, lse_;          // fused: the attention output [B*heads, S, hn] and its row log-sum-exp
                                  // (cudnn: q_, k_, v_, context_ are [B, heads, S, hn] views)
};

}  // namespace megazero::layers
