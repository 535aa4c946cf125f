// Fused causal attention (flash-style): softmax, attention dropout and both
// attention GEMMs in one call, without the [S, S] probability matrices that the
// unfused path (softmax.h: causal_softmax_*, dropout.h: dropout_*, plus gemm) writes
// to memory. What is saved for backward is q, k, v, the output and one
// log-sum-exp per row; backward recomputes the probabilities from them.
//
// Same contracts as the layer kernels (conventions.h: dtypes, rounding, devices). Shapes: q, k,
// v, out, dout, dq, dk, dv are [BH, S, D] (BH = samples x local heads),
// contiguous, of one storage dtype; lse is [BH, S] of row_stat_dtype.
// Grouped-query attention: k and v may hold BH / G heads (G query heads per
// k/v head; query head h reads k/v head h / G); dk and dv stay per query head
// ([BH, S, D]) and the caller sums each group's. The GPU kernels read the
// grouped k/v in place; the CPU repeats them into workspace.
//
// The dropout mask is dropout_forward's for `layout` (samples, groups = local
// heads, matrix_rows = matrix_cols = S; see layers/attention.cpp): the fused and the unfused
// attention drop the same elements, so they agree to rounding on any TP layout.
//
// CPU: blocks of query rows; each block is two library GEMMs around a softmax
// pass over a [BH, rows, keys] working set (workspace, counted by the memory
// tracker; the planner's CPU stand-in allocates the same). CUDA
// (megazero/cuda/flash_attention.cu): tiles stay in shared memory; bf16/fp16
// only, head size <= 128.
#pragma once

#include <string>

#include "megazero/kernels/dropout.h"

namespace megazero::kernels {

// out = dropout(softmax_causal(scale * q k^T)) v; lse[bh, i] = log sum_{j <= i}
// exp(scale * q_i . k_j). p = 0: no dropout.
//
// key_starts (--reset-attention-mask): softmax.h's per-document masks, int64
// [B*S] on q's device (matrix bh belongs to sample bh / (BH / B)): row i keeps
// the keys key_starts[b*S + i] <= j <= i only (lse over those). Each sample's
// starts must not decrease along it (documents follow each other: the GPU
// kernels skip the key tiles before a query tile's first start).
void fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, double p,
                             const RngKey& key, const DropoutLayout& layout, Tensor& out, Tensor& lse,
                             const Tensor& key_starts = Tensor());

// dq, dk, dv (overwritten) from dout and what forward saved (q, k, v, out, lse)
// with the same scale, p, key, layout and key_starts.
void fused_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
                              const Tensor& lse, double scale, double p, const RngKey& key, const DropoutLayout& layout,
                              Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& key_starts = Tensor());

// Empty when tensors of `dtype` on a `device` device with this head size have a
// fused kernel; otherwise the reason, for an error message that names the flag.
std::string fused_attention_unsupported(DeviceKind device, DType dtype, std::int64_t head_dim);

}  // namespace megazero::kernels
