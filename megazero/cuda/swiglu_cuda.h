// The CUDA SwiGLU (contract: megazero/kernels/swiglu.h, which validates the
// arguments and calls these with raw device pointers; kernels:
// swiglu_kernels.cuh). Element-wise in the compute type (fp32 for fp32 and
// 16-bit storage, fp64 for fp64), each result rounded once; queued on `s`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "megazero/core/dtype.h"

namespace megazero::cuda {

using i64 = std::int64_t;

// x: [rows, 2f] = [gate | up]; y: [rows, f] = silu(gate) * up.
void swiglu_forward(DType t, const void* x, void* y, i64 rows, i64 f, cudaStream_t s);
// dy: [rows, f]; dx: [rows, 2f], overwritten (aliases neither x nor dy).
void swiglu_backward(DType t, const void* dy, const void* x, void* dx, i64 rows, i64 f, cudaStream_t s);

}  // namespace megazero::cuda
