#include "layers/attention.h"

#include <cmath>

#include "megazero/core/error.h"
#include "megazero/kernels/gemm.h"
#include "megazero/kernels/layer_kernels.h"

namespace megazero::layers {

ParallelSelfAttention::ParallelSelfAttention(ParameterSet& params, const std::string& name, const GPTConfig& cfg,
                                             int layer, const TpContext& ctx)
    : cfg_(cfg),
      layer_(layer),
      ctx_(ctx),
      local_heads_(cfg.num_attention_heads / ctx.size()),
      head_dim_(cfg.head_dim()),
      qkv_(params, name + ".qkv", cfg.hidden_size, 3 * cfg.hidden_size, true, false, ctx, cfg.init_method_std),
      dense_(params, name + ".dense", cfg.hidden_size, cfg.hidden_size, true, ctx,
             cfg.init_method_std / std::sqrt(2.0 * static_cast<double>(cfg.num_layers))) {}

Tensor ParallelSelfAttention::split_heads(const Tensor& qkv, int which) const {
  const std::int64_t B = step_.micro_batch, S = step_.seq;
  Tensor out = ctx_.activation({B, local_heads_, S, head_dim_});
  out.copy_from(qkv.view({B, S, local_heads_, 3, head_dim_}).select(3, which).transpose(1, 2));
  return out.view({B * local_heads_, S, head_dim_});
}

namespace {
kernels::DropoutLayout probs_layout(const StepInfo& s, std::int64_t local_heads, std::int64_t heads, int tp_rank) {
  kernels::DropoutLayout l;
  l.A = s.micro_batch;
  l.a0 = s.sample_offset;
  l.B = local_heads;
  l.b0 = tp_rank * local_heads;
  l.GB = heads;
  l.C = s.seq;
  l.D = s.seq;
  return l;
}
}  // namespace

Tensor ParallelSelfAttention::forward(const Tensor& x, const StepInfo& step, bool add_output_bias) {
  step_ = step;
  const std::int64_t B = step.micro_batch, S = step.seq, BH = B * local_heads_;
  MZ_CHECK(x.size(0) == B * S, "attention input has ", x.size(0), " rows for B*S = ", B * S);
  Tensor qkv = qkv_.forward(x);
  q_ = split_heads(qkv, 0);
  k_ = split_heads(qkv, 1);
  v_ = split_heads(qkv, 2);
  qkv = Tensor();
  Tensor scores = ctx_.activation({BH, S, S});
  gemm(q_, false, k_, true, scores);
  probs_ = scores;  // softmax in place
  kernels::causal_softmax_forward(scores, 1.0 / std::sqrt(static_cast<double>(head_dim_)), probs_);
  const double p = step.training ? cfg_.attention_dropout : 0.0;
  if (p > 0) {
    probs_dropped_ = ctx_.activation({BH, S, S});
    kernels::dropout_forward(probs_, p, RngKey{step.seed, step.iteration, static_cast<std::uint32_t>(layer_), kRngAttentionDropout},
                             probs_layout(step, local_heads_, cfg_.num_attention_heads, ctx_.rank()), probs_dropped_);
  } else {
    probs_dropped_ = probs_;
  }
  Tensor ctx = ctx_.activation({BH, S, head_dim_});
  gemm(probs_dropped_, false, v_, false, ctx);
  Tensor merged = ctx_.activation({B * S, local_heads_ * head_dim_});
  merged.view({B, S, local_heads_, head_dim_}).copy_from(ctx.view({B, local_heads_, S, head_dim_}).transpose(1, 2));
  return dense_.forward(merged, add_output_bias);
}

Tensor ParallelSelfAttention::backward(const Tensor& dy) {
  MZ_CHECK(q_.defined(), "attention backward before forward");
  const std::int64_t B = step_.micro_batch, S = step_.seq, BH = B * local_heads_;
  Tensor dmerged = dense_.backward(dy);
  Tensor dctx = ctx_.activation({B, local_heads_, S, head_dim_});
  dctx.copy_from(dmerged.view({B, S, local_heads_, head_dim_}).transpose(1, 2));
  dctx = dctx.view({BH, S, head_dim_});
  Tensor dprobs = ctx_.activation({BH, S, S});
  gemm(dctx, false, v_, true, dprobs);  // dP = dctx V^T
  Tensor dv = ctx_.activation({BH, S, head_dim_});
  gemm(probs_dropped_, true, dctx, false, dv);  // dV = P^T dctx
  const double p = step_.training ? cfg_.attention_dropout : 0.0;
  if (p > 0)
    kernels::dropout_backward(dprobs, p,
                              RngKey{step_.seed, step_.iteration, static_cast<std::uint32_t>(layer_), kRngAttentionDropout},
                              probs_layout(step_, local_heads_, cfg_.num_attention_heads, ctx_.rank()), dprobs);
  kernels::causal_softmax_backward(dprobs, probs_, 1.0 / std::sqrt(static_cast<double>(head_dim_)), dprobs);
  Tensor dq = ctx_.activation({BH, S, head_dim_});
  gemm(dprobs, false, k_, false, dq);  // dQ = dS K
  Tensor dk = ctx_.activation({BH, S, head_dim_});
  gemm(dprobs, true, q_, false, dk);  // dK = dS^T Q
  Tensor dqkv = ctx_.activation({B * S, local_heads_ * 3 * head_dim_});
  auto five = dqkv.view({B, S, local_heads_, 3, head_dim_});
  const Tensor* parts[] = {&dq, &dk, &dv};
  for (int i = 0; i < 3; ++i)
    five.select(3, i).copy_from(parts[i]->view({B, local_heads_, S, head_dim_}).transpose(1, 2));
  Tensor dx = qkv_.backward(dqkv);
  release();
  return dx;
}

void ParallelSelfAttention::release() {
  q_ = k_ = v_ = probs_ = probs_dropped_ = Tensor();
  qkv_.release();
  dense_.release();
}

}  // namespace megazero::layers
