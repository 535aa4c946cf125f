// The CUDA fused causal attention behind kernels::fused_attention_* (the
// contract is in megazero/kernels/fused_attention.h; these take raw device
// pointers of validated tensors). bf16/fp16 q, k, v, out [bh, s, d] with
// d % 8 == 0 and d <= 128; lse fp32 [bh, s]. Queued on stream `st`; nothing
// blocks the host.
//
// Algorithm (FlashAttention-2's, with tensor-core WMMA tiles of 64 rows): a
// block of 4 warps owns 64 query rows, each warp 16; key/value tiles stream
// through shared memory; the running max and sum stay in registers and the
// output accumulator in shared memory (fp32). Backward runs two kernels, one
// per key tile (dk, dv) and one per query tile (dq), each recomputing P from
// lse; neither uses atomics, so a run repeats bit for bit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "megazero/core/dtype.h"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/dropout.h"

namespace megazero::cuda {

// kv_group: query heads per k/v head (grouped-query attention; 1 = one each):
// k and v hold bh / kv_group heads, query head h reads k/v head h / kv_group;
// dk and dv are per query head (bh of them; the caller sums each group's).
// key_starts (--reset-attention-mask), when given: int64 [samples * s], the
// first key of each row of the heads_per_sample matrices of a sample; never
// decreasing along a sample (documents), which lets whole key tiles be skipped.
void flash_attention_forward(DType t, const void* q, const void* k, const void* v, std::int64_t bh, std::int64_t s,
                             std::int64_t d, std::int64_t kv_group, double scale, double p, const RngKey& key,
                             const kernels::DropoutLayout& layout, void* out, float* lse, cudaStream_t st,
                             const std::int64_t* key_starts = nullptr, std::int64_t heads_per_sample = 1);

void flash_attention_backward(DType t, const void* q, const void* k, const void* v, const void* out, const void* dout,
                              const float* lse, std::int64_t bh, std::int64_t s, std::int64_t d, std::int64_t kv_group,
                              double scale, double p, const RngKey& key, const kernels::DropoutLayout& layout, void* dq,
                              void* dk, void* dv, kernels::GpuScratch ws,
                              cudaStream_t st,  // ws: gpu_scratch::flash_backward_bytes(bh, s)
                              const std::int64_t* key_starts = nullptr, std::int64_t heads_per_sample = 1);

}  // namespace megazero::cuda
