// LayerNorm's CUDA launchers (megazero/kernels/layernorm.h has the contracts;
// conventions: launchers.h).
#pragma once

#include "megazero/cuda/launchers.h"

namespace megazero::cuda {

void layernorm_forward(DType t, const void* x, const void* gamma, const void* beta, double eps, void* y, void* mean,
                       void* rstd, i64 rows, i64 cols, cudaStream_t s);
void layernorm_backward(DType t, const void* dy, const void* x, const void* gamma, const void* mean, const void* rstd,
                        void* dx, void* dgamma, DType dgamma_type, void* dbeta, DType dbeta_type, const void* add,
                        i64 rows, i64 cols, bool one_pass, kernels::GpuScratch ws,
                        cudaStream_t s);  // ws: gpu_scratch::layernorm_backward_bytes(t, rows, cols); one_pass: where
                                          // layernorm_fused_plan allows

}  // namespace megazero::cuda
