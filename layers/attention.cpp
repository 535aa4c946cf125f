#include "layers/attention.h"

#include <cmath>

#include "megazero/core/error.h"
#include "megazero/kernels/gemm.h"
#include "megazero/kernels/fused_attention.h"
#include "megazero/kernels/dropout.h"
#include "megazero/kernels/softmax.h"

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

kernels::DropoutLayout ParallelSelfAttention::probs_layout() const {
  kernels::DropoutLayout l;
  l.samples = step_.micro_batch;
  l.sample_offset = step_.sample_offset;
  l.groups = local_heads_;
  l.group_offset = ctx_.rank() * local_heads_;
  l.global_groups = cfg_.num_attention_heads;
  l.matrix_rows = step_.seq;
  l.matrix_cols = step_.seq;
  return l;
}

RngKey ParallelSelfAttention::dropout_key() const {
  return {step_.seed, step_.iteration, static_cast<std::uint32_t>(layer_), kRngAttentionDropout};
}

double ParallelSelfAttention::scale() const { return 1.0 / std::sqrt(static_cast<double>(head_dim_)); }

Tensor ParallelSelfAttention::forward(const Tensor& x, const StepInfo& step, bool add_output_bias) {
  step_ = step;
  const std::int64_t B = step.micro_batch, S = step.seq;
  MZ_CHECK(x.size(0) == B * S, "attention input has ", x.size(0), " rows for B*S = ", B * S);
  Tensor qkv = qkv_.forward(x);
  q_ = split_heads(qkv, 0);
  k_ = split_heads(qkv, 1);
  v_ = split_heads(qkv, 2);
  qkv = Tensor();
  const double p = step.training ? cfg_.attention_dropout : 0.0;
  const Tensor ctx = cfg_.fused_attention() ? attend_fused(p, dropout_key()) : attend_unfused(p, dropout_key());
  Tensor merged = ctx_.activation({B * S, local_heads_ * head_dim_});
  merged.view({B, S, local_heads_, head_dim_}).copy_from(ctx.view({B, local_heads_, S, head_dim_}).transpose(1, 2));
  return dense_.forward(merged, add_output_bias);
}

Tensor ParallelSelfAttention::attend_unfused(double p, const RngKey& key) {
  const std::int64_t S = step_.seq, BH = step_.micro_batch * local_heads_;
  Tensor scores = ctx_.activation({BH, S, S});
  gemm(q_, false, k_, true, scores);
  probs_ = scores;  // softmax in place
  kernels::causal_softmax_forward(scores, scale(), probs_);
  if (p > 0) {
    probs_dropped_ = ctx_.activation({BH, S, S});
    kernels::dropout_forward(probs_, p, key, probs_layout(), probs_dropped_);
  } else {
    probs_dropped_ = probs_;
  }
  Tensor ctx = ctx_.activation({BH, S, head_dim_});
  gemm(probs_dropped_, false, v_, false, ctx);
  return ctx;
}

Tensor ParallelSelfAttention::attend_fused(double p, const RngKey& key) {
  const std::int64_t S = step_.seq, BH = step_.micro_batch * local_heads_;
  context_ = ctx_.activation({BH, S, head_dim_});
  lse_ = ctx_.row_stats({BH, S});
  kernels::fused_attention_forward(q_, k_, v_, scale(), p, key, probs_layout(), context_, lse_);
  return context_;
}

Tensor ParallelSelfAttention::backward(const Tensor& dy, bool output_bias_grad_done) {
  MZ_CHECK(q_.defined(), "attention backward before forward");
  const std::int64_t B = step_.micro_batch, S = step_.seq, BH = B * local_heads_;
  Tensor dmerged = dense_.backward(dy, output_bias_grad_done);
  Tensor dctx = ctx_.activation({B, local_heads_, S, head_dim_});
  dctx.copy_from(dmerged.view({B, S, local_heads_, head_dim_}).transpose(1, 2));
  dctx = dctx.view({BH, S, head_dim_});
  const double p = step_.training ? cfg_.attention_dropout : 0.0;
  const RngKey key = dropout_key();
  Tensor dq = ctx_.activation({BH, S, head_dim_});
  Tensor dk = ctx_.activation({BH, S, head_dim_});
  Tensor dv = ctx_.activation({BH, S, head_dim_});
  if (cfg_.fused_attention())
    attend_backward_fused(dctx, p, key, dq, dk, dv);
  else
    attend_backward_unfused(dctx, p, key, dq, dk, dv);
  Tensor dqkv = ctx_.activation({B * S, local_heads_ * 3 * head_dim_});
  auto five = dqkv.view({B, S, local_heads_, 3, head_dim_});
  const Tensor* parts[] = {&dq, &dk, &dv};
  for (int i = 0; i < 3; ++i)
    five.select(3, i).copy_from(parts[i]->view({B, local_heads_, S, head_dim_}).transpose(1, 2));
  Tensor dx = qkv_.backward(dqkv);
  release();
  return dx;
}

void ParallelSelfAttention::attend_backward_unfused(const Tensor& dctx, double p, const RngKey& key, Tensor& dq,
                                                    Tensor& dk, Tensor& dv) {
  const std::int64_t S = step_.seq, BH = step_.micro_batch * local_heads_;
  Tensor dprobs = ctx_.activation({BH, S, S});
  gemm(dctx, false, v_, true, dprobs);          // dP = dctx V^T
  gemm(probs_dropped_, true, dctx, false, dv);  // dV = P^T dctx
  if (p > 0) kernels::dropout_backward(dprobs, p, key, probs_layout(), dprobs);
  kernels::causal_softmax_backward(dprobs, probs_, scale(), dprobs);
  gemm(dprobs, false, k_, false, dq);  // dQ = dS K
  gemm(dprobs, true, q_, false, dk);   // dK = dS^T Q
}

void ParallelSelfAttention::attend_backward_fused(const Tensor& dctx, double p, const RngKey& key, Tensor& dq,
                                                  Tensor& dk, Tensor& dv) {
  kernels::fused_attention_backward(q_, k_, v_, context_, dctx, lse_, scale(), p, key, probs_layout(), dq, dk, dv);
}

void ParallelSelfAttention::release() {
  q_ = k_ = v_ = probs_ = probs_dropped_ = context_ = lse_ = Tensor();
  qkv_.release();
  dense_.release();
}

}  // namespace megazero::layers
