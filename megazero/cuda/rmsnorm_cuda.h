// The CUDA RMSNorm (contract: megazero/kernels/rmsnorm.h, which validates the
// arguments and calls these with raw device pointers; kernels:
// rmsnorm_kernels.cuh). Everything is queued on stream `s`; nothing allocates.
// Numerics are the CPU's: inputs loaded exactly, the row sums and every
// result in double, each result rounded once; dgamma's column sums in double
// in a fixed order (no atomics), so a run repeats bit for bit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "megazero/core/dtype.h"
#include "megazero/kernels/gpu_scratch.h"

namespace megazero::cuda {

using i64 = std::int64_t;

// rstd: [rows] of row_stat_dtype(t). y may alias x.
void rmsnorm_forward(DType t, const void* x, const void* gamma, double eps, void* y, void* rstd, i64 rows, i64 cols,
                     cudaStream_t s);
// dgamma (of dgamma_type: t, or fp32 for 16-bit t) accumulated first, then dx
// overwritten (may alias dy), plus `add` when not null.
// ws: gpu_scratch::column_chunks(rows, cols).used * cols doubles when more
// than one chunk, else nothing (kernels/rmsnorm.cpp sizes it).
void rmsnorm_backward(DType t, const void* dy, const void* x, const void* gamma, const void* rstd, void* dx,
                      void* dgamma, DType dgamma_type, const void* add, i64 rows, i64 cols, kernels::GpuScratch ws,
                      cudaStream_t s);

}  // namespace megazero::cuda
