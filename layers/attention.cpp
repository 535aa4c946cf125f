#include "layers/attention.h"

#include <cmath>

#include "megazero/core/error.h"
#include "megazero/kernels/gemm.h"
#include "megazero/kernels/cudnn_attention.h"
#include "megazero/kernels/fused_attention.h"
#include "megazero/kernels/dropout.h"
#include "megazero/kernels/gelu_bias.h"
#include "megazero/kernels/rope.h"
#include "megazero/kernels/softmax.h"

namespace megazero::layers {

ParallelSelfAttention::ParallelSelfAttention(ParameterSet& params, const std::string& name, const GPTConfig& cfg,
                                             int layer, const TpContext& ctx)
    : cfg_(cfg),
      layer_(layer),
      ctx_(ctx),
      local_heads_(cfg.num_attention_heads / ctx.size()),
      local_groups_(cfg.query_groups() / ctx.size()),
      per_group_(cfg.num_attention_heads / cfg.query_groups()),
      head_dim_(cfg.head_dim()),
      qkv_(params, name + ".qkv", cfg.hidden_size, (cfg.num_attention_heads + 2 * cfg.query_groups()) * cfg.head_dim(),
           cfg.qkv_bias(), false, ctx, cfg.init_method_std),
      dense_(params, name + ".dense", cfg.hidden_size, cfg.hidden_size, cfg.add_bias_linear, ctx,
             cfg.init_method_std / std::sqrt(2.0 * static_cast<double>(cfg.num_layers))) {
  if (cfg.qk_layernorm) {
    // A rank normalises only its heads' rows, so its gradients of the shared
    // weights are a share the norms sum over the TP group (NormGradients).
    TpContext heads = ctx;
    heads.heads_split = ctx.size() > 1;
    q_norm_ = make_normalization(params, name + ".q_layernorm", cfg, heads, head_dim_);
    k_norm_ = make_normalization(params, name + ".k_layernorm", cfg, heads, head_dim_);
  }
}

Tensor ParallelSelfAttention::norm_heads(Normalization* norm, const Tensor& x) {
  if (!norm) return x;
  return norm->forward(x.view({x.numel() / head_dim_, head_dim_})).view(x.shape());
}

Tensor ParallelSelfAttention::norm_heads_backward(Normalization* norm, const Tensor& dy) {
  if (!norm) return dy;
  return norm->backward(dy.view({dy.numel() / head_dim_, head_dim_})).view(dy.shape());
}

Tensor ParallelSelfAttention::split_heads(const Tensor& qkv, int which) const {
  const std::int64_t B = step_.micro_batch, S = step_.seq, G = local_groups_, P = per_group_;
  const Tensor five = qkv.view({B, S, G, P + 2, head_dim_});
  if (which == 0) {  // [B, S, G, P, hn] -> [B, G, P, S, hn]
    Tensor out = ctx_.activation({B, G, P, S, head_dim_});
    out.copy_from(five.narrow(3, 0, P).transpose(1, 2).transpose(2, 3));
    return out.view({B * G * P, S, head_dim_});
  }
  Tensor out = ctx_.activation({B, G, S, head_dim_});
  out.copy_from(five.select(3, P - 1 + which).transpose(1, 2));
  return out.view({B * G, S, head_dim_});
}

Tensor ParallelSelfAttention::sum_groups(const Tensor& dkv) const {
  if (per_group_ == 1) return dkv;
  const std::int64_t B = step_.micro_batch, S = step_.seq, G = local_groups_, P = per_group_;
  const Tensor five = dkv.view({B, G, P, S, head_dim_});
  Tensor out = ctx_.activation({B, G, S, head_dim_});
  Tensor term = ctx_.activation({B, G, S, head_dim_});
  out.copy_from(five.select(2, 0));
  for (std::int64_t j = 1; j < P; ++j) {  // in head order: the same sum on every device and layout
    term.copy_from(five.select(2, j));
    kernels::add(out, term, out);
  }
  return out.view({B * G, S, head_dim_});
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
  if (step.kv_cache) return forward_cached(x, *step.kv_cache, add_output_bias);
  const std::int64_t B = step.micro_batch, S = step.seq;
  MZ_CHECK(x.size(0) == ctx_.local_rows(B * S), "attention input has ", x.size(0), " rows for B*S = ", B * S,
           ctx_.sequence_parallel ? " split over the TP group" : "");
  Tensor qkv = qkv_.forward(x);
  const double p = step.training ? cfg_.attention_dropout : 0.0;
  if (cfg_.cudnn_attention() && cudnn_in_place()) {  // q, k, v read in place from the projection's rows
    q_ = group_view(qkv, 0);
    k_ = group_view(qkv, 1);
    v_ = group_view(qkv, 2);
  } else {
    q_ = norm_heads(q_norm_.get(), split_heads(qkv, 0));
    k_ = norm_heads(k_norm_.get(), split_heads(qkv, 1));
    v_ = split_heads(qkv, 2);
    if (cfg_.rope()) {
      kernels::rope_forward(q_, cfg_.rotary_base, q_, 0, step.positions, cfg_.rope_position_scale(),
                            cfg_.rotary_interleaved, cfg_.rope_llama3_factor());
      kernels::rope_forward(k_, cfg_.rotary_base, k_, 0, step.positions, cfg_.rope_position_scale(),
                            cfg_.rotary_interleaved, cfg_.rope_llama3_factor());
    }
  }
  qkv = Tensor();
  if (cfg_.cudnn_attention()) return dense_.forward(forward_cudnn(p, dropout_key()), add_output_bias);
  const Tensor ctx = cfg_.fused_attention() ? attend_fused(p, dropout_key()) : attend_unfused(p, dropout_key());
  Tensor merged = ctx_.activation({B * S, local_heads_ * head_dim_});
  merged.view({B, S, local_heads_, head_dim_}).copy_from(ctx.view({B, local_heads_, S, head_dim_}).transpose(1, 2));
  return dense_.forward(merged, add_output_bias);
}

Tensor ParallelSelfAttention::make_kv_buffer(std::int64_t capacity) const {
  return Tensor::zeros(ctx_.device, {local_groups_, capacity, head_dim_}, ctx_.dtype, MemoryCategory::Activations,
                       "kv-cache");
}

// T new tokens after L0 cached positions: their keys and values go to rows
// [L0, L0 + T) of the cache, and their queries (rows L0.. of the rotary
// embedding) meet the L0 + T keys in one batched GEMM per group, as the
// unfused path meets its own; the softmax masks each query's later positions.
Tensor ParallelSelfAttention::forward_cached(const Tensor& x, KvCache& cache, bool add_output_bias) {
  const std::int64_t T = step_.seq, L0 = cache.length, L = L0 + T;
  const std::int64_t G = local_groups_, P = per_group_, H = local_heads_;
  MZ_CHECK(step_.micro_batch == 1 && !step_.training && !ctx_.sequence_parallel,
           "the key/value cache runs one sequence, in evaluation, without sequence parallelism");
  MZ_CHECK(L <= cache.capacity && layer_ < static_cast<int>(cache.keys.size()), "key/value cache of ", cache.capacity,
           " positions for ", L, " (layer ", layer_, " of ", cache.keys.size(), ")");
  Tensor qkv = qkv_.forward(x);
  Tensor q = norm_heads(q_norm_.get(), split_heads(qkv, 0)), k = norm_heads(k_norm_.get(), split_heads(qkv, 1)),
         v = split_heads(qkv, 2);
  qkv = Tensor();
  if (q_norm_) q_norm_->release(), k_norm_->release();  // evaluation: nothing kept for a backward
  if (cfg_.rope()) {
    kernels::rope_forward(q, cfg_.rotary_base, q, L0, Tensor(), cfg_.rope_position_scale(), cfg_.rotary_interleaved,
                          cfg_.rope_llama3_factor());
    kernels::rope_forward(k, cfg_.rotary_base, k, L0, Tensor(), cfg_.rope_position_scale(), cfg_.rotary_interleaved,
                          cfg_.rope_llama3_factor());
  }
  Tensor& keys = cache.keys[static_cast<std::size_t>(layer_)];
  Tensor& values = cache.values[static_cast<std::size_t>(layer_)];
  keys.narrow(1, L0, T).copy_from(k);
  values.narrow(1, L0, T).copy_from(v);
  Tensor scores = ctx_.activation({H, T, L});
  Tensor grouped_scores = scores.view({G, P * T, L});
  gemm(q.view({G, P * T, head_dim_}), false, keys.narrow(1, 0, L), true, grouped_scores);
  kernels::causal_softmax_forward(scores, scale(), scores);
  Tensor ctx = ctx_.activation({H, T, head_dim_});
  Tensor grouped_ctx = ctx.view({G, P * T, head_dim_});
  gemm(grouped_scores, false, values.narrow(1, 0, L), false, grouped_ctx);
  Tensor merged = ctx_.activation({T, H * head_dim_});
  merged.view({1, T, H, head_dim_}).copy_from(ctx.view({1, H, T, head_dim_}).transpose(1, 2));
  return dense_.forward(merged, add_output_bias);
}

// A group's query heads are adjacent (q_ is [B, G, P, S, hn]): viewed as
// [B*G, P*S, hn] they meet their group's one k/v head in one batched GEMM, so
// the unfused path never repeats k and v, and the backward's dk and dv come
// out summed over the group by the GEMMs themselves. (P = 1: plain MHA.)
Tensor ParallelSelfAttention::attend_unfused(double p, const RngKey& key) {
  const std::int64_t S = step_.seq, BH = step_.micro_batch * local_heads_;
  const std::int64_t BG = step_.micro_batch * local_groups_, PS = per_group_ * S;
  make_probs(p, key);
  Tensor ctx = ctx_.activation({BH, S, head_dim_});
  Tensor grouped_ctx = ctx.view({BG, PS, head_dim_});
  gemm(probs_dropped_.view({BG, PS, S}), false, v_, false, grouped_ctx);
  // Selective recompute: backward makes them again from q and k (make_probs).
  if (cfg_.recompute_core_attention) probs_ = probs_dropped_ = Tensor();
  return ctx;
}

// probs_ = causal softmax of q k^T (scaled), probs_dropped_ = its dropout:
// the same bits each time for the same q, k, step and key.
void ParallelSelfAttention::make_probs(double p, const RngKey& key) {
  const std::int64_t S = step_.seq, BH = step_.micro_batch * local_heads_;
  const std::int64_t BG = step_.micro_batch * local_groups_, PS = per_group_ * S;
  Tensor scores = ctx_.activation({BH, S, S});
  Tensor grouped_scores = scores.view({BG, PS, S});
  gemm(q_.view({BG, PS, head_dim_}), false, k_, true, grouped_scores);
  probs_ = scores;  // softmax in place
  kernels::causal_softmax_forward(scores, scale(), probs_, step_.key_starts);
  if (p > 0) {
    probs_dropped_ = ctx_.activation({BH, S, S});
    kernels::dropout_forward(probs_, p, key, probs_layout(), probs_dropped_);
  } else {
    probs_dropped_ = probs_;
  }
}

Tensor ParallelSelfAttention::attend_fused(double p, const RngKey& key) {
  const std::int64_t S = step_.seq, BH = step_.micro_batch * local_heads_;
  context_ = ctx_.activation({BH, S, head_dim_});
  lse_ = ctx_.row_stats({BH, S});
  kernels::fused_attention_forward(q_, k_, v_, scale(), p, key, probs_layout(), context_, lse_, step_.key_starts);
  return context_;
}

// The QKV projection's rows [B*S, groups * (per_group + 2) * hn] seen as k
// (which = 1) or v (2) [B, groups, S, hn], or, with one head per group, q (0)
// [B, heads, S, hn]: views with a uniform head stride (a group's query heads
// are not evenly spaced otherwise).
Tensor ParallelSelfAttention::group_view(const Tensor& rows, int which) const {
  const std::int64_t P = per_group_;
  MZ_CHECK(which > 0 || P == 1, "query heads are a view of the QKV rows only with one head per group");
  const Tensor five = rows.view({step_.micro_batch, step_.seq, local_groups_, P + 2, head_dim_});
  return five.select(3, which == 0 ? 0 : P - 1 + which).transpose(1, 2);
}

// The output projection's rows [B*S, heads * hn] as [B, heads, S, hn].
Tensor ParallelSelfAttention::context_view(const Tensor& rows) const {
  return rows.view({step_.micro_batch, step_.seq, local_heads_, head_dim_}).transpose(1, 2);
}

// cudnn, multi-head without RoPE: q, k, v are views of the QKV output (no
// copies). Otherwise (RoPE rotates q and k, --qk-layernorm normalises them;
// with groups q's heads are not evenly spaced) forward makes copies as for the other backends and frees the
// QKV output: the same bytes kept either way.
bool ParallelSelfAttention::cudnn_in_place() const { return per_group_ == 1 && !cfg_.rope() && !cfg_.qk_layernorm; }

Tensor ParallelSelfAttention::forward_cudnn(double p, const RngKey& key) {
  const std::int64_t B = step_.micro_batch, S = step_.seq, H = local_heads_, G = local_groups_;
  if (!cudnn_in_place()) {  // the copies split_heads made, as [B, heads or groups, S, hn]
    q_ = q_.view({B, H, S, head_dim_});
    k_ = k_.view({B, G, S, head_dim_});
    v_ = v_.view({B, G, S, head_dim_});
  }
  // The context lands in the rows the output projection reads.
  Tensor merged = ctx_.activation({B * S, H * head_dim_});
  context_ = context_view(merged);
  lse_ = ctx_.row_stats({B * H, S});
  kernels::cudnn_attention_forward(q_, k_, v_, scale(), p, key, probs_layout(), context_, lse_, step_.key_starts);
  return merged;
}

// The gradients land in the rows the QKV projection's backward reads: all of
// them in place for multi-head without RoPE; otherwise dk (without RoPE) and
// dv in place — cuDNN sums each group's — and dq (and with RoPE dk) through a
// contiguous buffer.
Tensor ParallelSelfAttention::backward_cudnn(const Tensor& dmerged, double p, const RngKey& key) {
  const std::int64_t B = step_.micro_batch, S = step_.seq, H = local_heads_, G = local_groups_, P = per_group_;
  Tensor dqkv = ctx_.activation({B * S, G * (P + 2) * head_dim_});
  Tensor dk = group_view(dqkv, 1), dv = group_view(dqkv, 2);
  const Tensor dctx = context_view(dmerged);
  if (cudnn_in_place()) {
    Tensor dq = group_view(dqkv, 0);
    kernels::cudnn_attention_backward(q_, k_, v_, context_, dctx, lse_, scale(), p, key, probs_layout(),
                                      cfg_.deterministic, dq, dk, dv, step_.key_starts);
    return dqkv;
  }
  Tensor rq = ctx_.activation({B * H, S, head_dim_});
  Tensor rq4 = rq.view({B, H, S, head_dim_});
  if (!cfg_.rope() && !cfg_.qk_layernorm) {
    kernels::cudnn_attention_backward(q_, k_, v_, context_, dctx, lse_, scale(), p, key, probs_layout(),
                                      cfg_.deterministic, rq4, dk, dv, step_.key_starts);
  } else {
    Tensor rk = ctx_.activation({B * G, S, head_dim_});
    Tensor rk4 = rk.view({B, G, S, head_dim_});
    kernels::cudnn_attention_backward(q_, k_, v_, context_, dctx, lse_, scale(), p, key, probs_layout(),
                                      cfg_.deterministic, rq4, rk4, dv, step_.key_starts);
    if (cfg_.rope()) {
      kernels::rope_backward(rq, cfg_.rotary_base, rq, 0, step_.positions, cfg_.rope_position_scale(),
                             cfg_.rotary_interleaved, cfg_.rope_llama3_factor());  // the rotation's adjoint
      kernels::rope_backward(rk, cfg_.rotary_base, rk, 0, step_.positions, cfg_.rope_position_scale(),
                             cfg_.rotary_interleaved, cfg_.rope_llama3_factor());
    }
    dk.copy_from(norm_heads_backward(k_norm_.get(), rk).view({B, G, S, head_dim_}));
  }
  rq = norm_heads_backward(q_norm_.get(), rq);
  dqkv.view({B, S, G, P + 2, head_dim_})
      .narrow(3, 0, P)
      .copy_from(rq.view({B, G, P, S, head_dim_}).transpose(2, 3).transpose(1, 2));
  return dqkv;
}

std::string ParallelSelfAttention::prepare_kernels(const StepInfo& step, double p) {
  if (!cfg_.cudnn_attention()) return {};
  // The operands' shapes and strides exactly as forward_cudnn/backward_cudnn
  // make them, on the meta device (no memory); cuDNN plans on the run's GPU.
  step_ = step;
  const std::int64_t B = step.micro_batch, S = step.seq, H = local_heads_, G = local_groups_, P = per_group_;
  auto meta = make_meta_device(DeviceKind::CUDA);
  auto empty = [&](const Shape& shape) { return Tensor::empty(meta, shape, ctx_.dtype, MemoryCategory::Other); };
  const Tensor qkv = empty({B * S, G * (P + 2) * head_dim_}), dqkv = empty({B * S, G * (P + 2) * head_dim_});
  const bool in_place = cudnn_in_place();
  const Tensor q = in_place ? group_view(qkv, 0) : empty({B, H, S, head_dim_});
  const Tensor k = in_place ? group_view(qkv, 1) : empty({B, G, S, head_dim_});
  const Tensor v = in_place ? group_view(qkv, 2) : empty({B, G, S, head_dim_});
  const Tensor dq = in_place ? group_view(dqkv, 0) : empty({B, H, S, head_dim_});
  const Tensor dk = cfg_.rope() || cfg_.qk_layernorm ? empty({B, G, S, head_dim_}) : group_view(dqkv, 1);
  const Tensor out = context_view(empty({B * S, H * head_dim_})), dout = context_view(empty({B * S, H * head_dim_}));
  return kernels::cudnn_attention_prepare(*ctx_.device, q, k, v, out, dout, dq, dk, group_view(dqkv, 2), scale(), p,
                                          cfg_.deterministic, step.key_starts.defined());
}

Tensor ParallelSelfAttention::backward(const Tensor& dy, bool output_bias_grad_done) {
  MZ_CHECK(q_.defined(), "attention backward before forward");
  const std::int64_t B = step_.micro_batch, S = step_.seq, BH = B * local_heads_;
  Tensor dmerged = dense_.backward(dy, output_bias_grad_done);
  if (cfg_.cudnn_attention()) {
    const double p = step_.training ? cfg_.attention_dropout : 0.0;
    Tensor dx = qkv_.backward(backward_cudnn(dmerged, p, dropout_key()));
    release();
    return dx;
  }
  Tensor dctx = ctx_.activation({B, local_heads_, S, head_dim_});
  dctx.copy_from(dmerged.view({B, S, local_heads_, head_dim_}).transpose(1, 2));
  dctx = dctx.view({BH, S, head_dim_});
  const double p = step_.training ? cfg_.attention_dropout : 0.0;
  const RngKey key = dropout_key();
  Tensor dq = ctx_.activation({BH, S, head_dim_});
  Tensor dk, dv;
  if (cfg_.fused_attention()) {  // per query head, then summed over each group
    dk = ctx_.activation({BH, S, head_dim_});
    dv = ctx_.activation({BH, S, head_dim_});
    attend_backward_fused(dctx, p, key, dq, dk, dv);
    dk = sum_groups(dk);
    dv = sum_groups(dv);
  } else {  // per group already
    dk = ctx_.activation({B * local_groups_, S, head_dim_});
    dv = ctx_.activation({B * local_groups_, S, head_dim_});
    attend_backward_unfused(dctx, p, key, dq, dk, dv);
  }
  if (cfg_.rope()) {  // the rotation's adjoint, back to the projections' outputs
    kernels::rope_backward(dq, cfg_.rotary_base, dq, 0, step_.positions, cfg_.rope_position_scale(),
                           cfg_.rotary_interleaved, cfg_.rope_llama3_factor());
    kernels::rope_backward(dk, cfg_.rotary_base, dk, 0, step_.positions, cfg_.rope_position_scale(),
                           cfg_.rotary_interleaved, cfg_.rope_llama3_factor());
  }
  dq = norm_heads_backward(q_norm_.get(), dq);
  dk = norm_heads_backward(k_norm_.get(), dk);
  const std::int64_t G = local_groups_, P = per_group_;
  Tensor dqkv = ctx_.activation({B * S, G * (P + 2) * head_dim_});
  auto five = dqkv.view({B, S, G, P + 2, head_dim_});
  five.narrow(3, 0, P).copy_from(dq.view({B, G, P, S, head_dim_}).transpose(2, 3).transpose(1, 2));
  five.select(3, P).copy_from(dk.view({B, G, S, head_dim_}).transpose(1, 2));
  five.select(3, P + 1).copy_from(dv.view({B, G, S, head_dim_}).transpose(1, 2));
  Tensor dx = qkv_.backward(dqkv);
  release();
  return dx;
}

void ParallelSelfAttention::attend_backward_unfused(const Tensor& dctx, double p, const RngKey& key, Tensor& dq,
                                                    Tensor& dk, Tensor& dv) {
  const std::int64_t S = step_.seq, BH = step_.micro_batch * local_heads_;
  const std::int64_t BG = step_.micro_batch * local_groups_, PS = per_group_ * S;
  if (!probs_.defined()) make_probs(p, key);  // selective recompute dropped them after forward
  Tensor dprobs = ctx_.activation({BH, S, S});
  Tensor grouped_dprobs = dprobs.view({BG, PS, S}), grouped_dq = dq.view({BG, PS, head_dim_});
  const Tensor grouped_dctx = dctx.view({BG, PS, head_dim_});
  gemm(grouped_dctx, false, v_, true, grouped_dprobs);                    // dP = dctx V^T
  gemm(probs_dropped_.view({BG, PS, S}), true, grouped_dctx, false, dv);  // dV = P^T dctx
  if (p > 0) kernels::dropout_backward(dprobs, p, key, probs_layout(), dprobs);
  kernels::causal_softmax_backward(dprobs, probs_, scale(), dprobs, step_.key_starts);
  gemm(grouped_dprobs, false, k_, false, grouped_dq);                   // dQ = dS K
  gemm(grouped_dprobs, true, q_.view({BG, PS, head_dim_}), false, dk);  // dK = dS^T Q
}

void ParallelSelfAttention::attend_backward_fused(const Tensor& dctx, double p, const RngKey& key, Tensor& dq,
                                                  Tensor& dk, Tensor& dv) {
  kernels::fused_attention_backward(q_, k_, v_, context_, dctx, lse_, scale(), p, key, probs_layout(), dq, dk, dv,
                                    step_.key_starts);
}

void ParallelSelfAttention::release() {
  q_ = k_ = v_ = probs_ = probs_dropped_ = context_ = lse_ = Tensor();
  if (q_norm_) q_norm_->release(), k_norm_->release();
  qkv_.release();
  dense_.release();
}

}  // namespace megazero::layers
