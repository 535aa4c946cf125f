// The CUDA implementations of the layer kernels (megazero/kernels/layer_kernels.h
// has the contracts: shapes, aliasing, dtypes, accumulate vs overwrite). The
// public functions there validate their arguments and call these with raw
// device pointers; everything is queued on stream `s` without blocking the
// host. Kernels that need scratch
// beyond their operands take it as `ws`, sized by megazero/kernels/gpu_scratch.h
// and allocated by the caller through the device; none allocates.
//
// Numerics follow the CPU kernels: 16-bit values are loaded exactly into fp32,
// statistics and sums are taken in double, and each result is rounded once.
// Reductions use a fixed order (no atomics), so a run repeats bit for bit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "megazero/core/dtype.h"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/layer_kernels.h"

namespace megazero::cuda {

using i64 = std::int64_t;

void layernorm_forward(DType t, const void* x, const void* gamma, const void* beta, double eps, void* y, void* mean,
                       void* rstd, i64 rows, i64 cols, cudaStream_t s);
void layernorm_backward(DType t, const void* dy, const void* x, const void* gamma, const void* mean, const void* rstd,
                        void* dx, void* dgamma, DType dgamma_type, void* dbeta, DType dbeta_type, const void* add,
                        i64 rows, i64 cols, kernels::GpuScratch ws,
                        cudaStream_t s);  // ws: column_sums_bytes(t, rows, cols, 2)

void gelu_forward(DType t, const void* x, void* y, i64 n, cudaStream_t s);
void gelu_backward(DType t, const void* dy, const void* x, void* dx, i64 n, cudaStream_t s);
void bias_gelu_forward(DType t, const void* y, const void* bias, void* out, i64 rows, i64 cols, cudaStream_t s);
// dx = dropout backward of dy (may alias) and dbias += its column sums, one
// pass (dropout_kernels.cuh; ws: dropout_bias_grad_bytes(rows, cols)).
void dropout_backward_bias_grad(DType t, const void* dy, double p, const RngKey& key,
                                const kernels::DropoutLayout& layout, void* dx, void* dbias, DType dbias_type, i64 rows,
                                i64 cols, kernels::GpuScratch ws, cudaStream_t s);
// One pass: each thread walks a column over a chunk of rows, writing dx and
// summing it (ws: column_sums_bytes(t, rows, cols, 1)).
void bias_gelu_backward(DType t, const void* dy, const void* y, const void* bias, void* dx, void* dbias,
                        DType dbias_type, i64 rows, i64 cols, kernels::GpuScratch ws, cudaStream_t s);
void add_bias(DType t, void* y, const void* bias, i64 rows, i64 cols, cudaStream_t s);
void bias_grad(DType t, const void* dy, void* dbias, DType dbias_type, i64 rows, i64 cols, kernels::GpuScratch ws,
               cudaStream_t s);  // ws: column_sums_bytes(t, rows, cols, 1)
void add(DType t, const void* a, const void* b, void* out, i64 n, cudaStream_t s);
void axpy(DType t, double alpha, const void* x, void* y, i64 n, cudaStream_t s);
void scale_elements(DType t, void* x, i64 n, double alpha, cudaStream_t s);

void causal_softmax_forward(DType t, const void* scores, double scale, void* probs, i64 mats, i64 n, cudaStream_t s);
void causal_softmax_backward(DType t, const void* dprobs, const void* probs, double scale, void* dscores, i64 mats,
                             i64 n, cudaStream_t s);

// The same keep mask as the CPU (Philox-4x32-10 at the element's global index).
void dropout(DType t, const void* in, double p, const RngKey& key, const kernels::DropoutLayout& layout, void* out,
             cudaStream_t s);

// out = residual + dropout(y + bias) (layer_kernels.h); bias has `cols` elements.
void bias_dropout_add(DType t, const void* y, const void* bias, const void* residual, double p, const RngKey& key,
                      const kernels::DropoutLayout& layout, void* out, i64 cols, cudaStream_t s);

void embedding_forward(DType t, const std::int64_t* ids, const void* table, i64 vocab_start, i64 v, i64 h, void* out,
                       i64 n, cudaStream_t s);
// Sorts (row, token) pairs on the GPU (CUB's stable radix sort) so each row's
// tokens are summed in token order: the CPU's order, no atomics (the result
// repeats bit for bit) and no host synchronisation.
// ws: embedding_sort_bytes(n).
void embedding_backward(DType t, const std::int64_t* ids, const void* dout, i64 vocab_start, i64 n, i64 v, i64 h,
                        void* dtable, DType dtable_type, kernels::GpuScratch ws, cudaStream_t s);
void add_position_embedding(DType t, void* out, const void* pos, i64 numel, i64 per_sample, cudaStream_t s);
void position_embedding_backward(DType t, const void* dout, i64 batch, i64 per_sample, void* dpos, DType dpos_type,
                                 kernels::GpuScratch ws,
                                 cudaStream_t s);  // ws: column_sums_bytes(t, batch, per_sample, 1)

// Vocabulary-parallel cross-entropy: the CPU kernels' contracts
// (megazero/kernels/layer_kernels.h); one block per row.
void cross_entropy_forward(DType t, void* logits, const std::int64_t* targets, i64 vocab_start, i64 rows, i64 cols,
                           i64 valid, void* row_max, void* sum_exp, void* target_logit, cudaStream_t s);
void rescale_sum_exp(DType stat, const void* row_max, const void* global_max, i64 rows, void* sum_exp, cudaStream_t s);
void cross_entropy_loss(DType stat, const void* global_max, const void* sum_exp, const void* target_logit, i64 rows,
                        void* loss, cudaStream_t s);
void cross_entropy_backward(DType t, const void* exp_logits, const void* row_max, const void* global_max,
                            const void* sum_exp, const std::int64_t* targets, i64 vocab_start, i64 rows, i64 cols,
                            i64 valid, double scale, void* dlogits, cudaStream_t s);

// ---- optimizer and ZeRO helpers ----

// AdamW on elements [begin, end) of fp32 master/moments with gradients of
// `grad_type`; the CPU's formula (double arithmetic, decoupled decay).
struct AdamArgs {
  double beta1, beta2, eps, weight_decay, lr, bc1, bc2, grad_scale;
};
void adamw(float* w, float* m, float* v, const void* g, DType grad_type, i64 begin, i64 end, bool decay,
           const AdamArgs& a, cudaStream_t s);

// *out (device memory) = the sum of squares of g over the ranges, in double
// and in a fixed order. ws: sum_of_squares_bytes(ranges.size()).
void sum_of_squares(const void* g, DType t, const std::vector<std::pair<i64, i64>>& ranges, kernels::GpuScratch ws,
                    double* out, cudaStream_t s);

// dst[idx] = convert(src[idx]) for every index of `shape` (at most 8
// dimensions), element strides for each side; the dtype conversion rounds
// once to nearest even. dst must not overlap src.
constexpr int kMaxCopyDims = 8;
void strided_copy(const void* src, DType src_type, const i64* src_strides, void* dst, DType dst_type,
                  const i64* dst_strides, const i64* shape, int ndim, cudaStream_t s);

}  // namespace megazero::cuda
