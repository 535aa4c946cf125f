// cuDNN's fused causal attention (--attention-backend cudnn; CUDA only): the
// graph of megazero/cuda/sdpa_graph.h run through cuDNN's engines
// (megazero/cuda/cudnn_sdpa.h). Same math as fused_attention.h; what differs:
//  - q, k, v, out, dout, dq, dk, dv are 4-D [samples, heads, S, D] views with
//    unit stride in D and any other strides, so the layer points them straight
//    into the QKV projection's output and the output projection's input (no
//    head split or merge copies); lse is [samples * heads, S] fp32, contiguous.
//  - grouped-query attention: k, v (and dk, dv) hold heads / G heads (query
//    head i reads k/v head i / G); unlike fused_attention_backward, dk and dv
//    come out per k/v head, summed over each group (cuDNN sums them).
//  - the dropout mask is cuDNN's own (cuda::cudnn_dropout_seed keys it by
//    run seed, layer, iteration, micro-batch and the rank's first head): it is
//    statistically the same Bernoulli(1 - p) but not the Philox mask of the
//    other backends, so runs agree with them to rounding only at p = 0.
// On the meta device standing in for CUDA (the planner) the scratch is
// allocated and the work logged. On host devices it runs a reference: copies
// of the views through fused_attention_* (Philox masks, so it equals the fused
// backend exactly) — for CI to prove the layer's strided plumbing; users never
// reach it (the arguments refuse the backend off CUDA).
#pragma once

#include <string>

#include "megazero/kernels/dropout.h"

namespace megazero::kernels {

// key_starts (--reset-attention-mask): fused_attention.h's per-document masks,
// int64 [samples * S] on q's device; cuDNN gets them as an additive bias
// [samples, 1, S, S] made in its scratch (cuda::document_mask_bias).
void cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, double p,
                             const RngKey& key, const DropoutLayout& layout, Tensor& out, Tensor& lse,
                             const Tensor& key_starts = Tensor());

// deterministic: cuDNN's deterministic backward (dQ written directly; a
// [samples*heads, S, S] 16-bit workspace); otherwise its default, which
// accumulates dQ with atomics in fp32 (last bits may vary from run to run).
// The host reference is deterministic either way.
void cudnn_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
                              const Tensor& lse, double scale, double p, const RngKey& key, const DropoutLayout& layout,
                              bool deterministic, Tensor& dq, Tensor& dk, Tensor& dv,
                              const Tensor& key_starts = Tensor());

// Builds cuDNN's forward and backward plans for operands shaped and strided
// like these (views on any device — the meta device will do: only shapes and
// strides are read) on `gpu`, so that a graph cuDNN cannot run is refused at
// start-up (ConfigError naming the flag) and the first step does not plan.
// documents: the plans with the per-document bias. Returns a line for the
// log; empty when `gpu` is not a CUDA device.
std::string cudnn_attention_prepare(Device& gpu, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                    const Tensor& dout, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                    double scale, double p, bool deterministic, bool documents = false);

// Empty when --attention-backend cudnn can run tensors of `dtype` on `device`
// with this head size; otherwise the reason, naming the flags.
std::string cudnn_attention_unsupported(DeviceKind device, DType dtype, std::int64_t head_dim);

}  // namespace megazero::kernels
