// The CUDA launchers of the vocabulary-parallel and position embeddings
// (megazero/kernels/embedding.h has the contracts; conventions: launchers.h).
#pragma once

#include <cstdint>

#include "megazero/cuda/launchers.h"

namespace megazero::cuda {

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

}  // namespace megazero::cuda
