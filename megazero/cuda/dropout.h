// Dropout's CUDA launchers (megazero/kernels/dropout.h has the contracts;
// conventions: launchers.h).
#pragma once

#include "megazero/cuda/launchers.h"
#include "megazero/kernels/dropout.h"
#include "megazero/kernels/rng.h"

namespace megazero::cuda {

// The same keep mask as the CPU (Philox-4x32-10 at the element's global index).
void dropout(DType t, const void* in, double p, const RngKey& key, const kernels::DropoutLayout& layout, void* out,
             cudaStream_t s);

// out = residual + dropout(y + bias) (kernels/dropout.h); bias has `cols` elements.
void bias_dropout_add(DType t, const void* y, const void* bias, const void* residual, double p, const RngKey& key,
                      const kernels::DropoutLayout& layout, void* out, i64 cols, cudaStream_t s);

// dx = dropout backward of dy (may alias) and dbias += its column sums, one
// pass (dropout_kernels.cuh; ws: dropout_bias_grad_bytes(rows, cols)).
void dropout_backward_bias_grad(DType t, const void* dy, double p, const RngKey& key,
                                const kernels::DropoutLayout& layout, void* dx, void* dbias, DType dbias_type, i64 rows,
                                i64 cols, kernels::GpuScratch ws, cudaStream_t s);

}  // namespace megazero::cuda
