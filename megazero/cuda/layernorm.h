// LayerNorm's CUDA launchers (megazero/kernels/layernorm.h has the contracts;
// conventions: launchers.h).
#pragma once

#include "megazero/cuda/launchers.h"
#include "megazero/kernels/dropout.h"
#include "megazero/kernels/layernorm.h"

namespace megazero::cuda {

void layernorm_forward(DType t, const void* x, const void* gamma, const void* beta, double eps, void* y, void* mean,
                       void* rstd, i64 rows, i64 cols, cudaStream_t s);
// sum = residual + dropout(y + bias) (bias_dropout_add), then
// layernorm_forward(sum) into y_ln, mean, rstd (kernels::bias_dropout_add_layernorm):
// one pass where the fast forward and the layout (one layout row a row)
// allow, else the two launchers.
void bias_dropout_add_layernorm(DType t, const void* y, const void* bias, const void* residual, double p,
                                const RngKey& key, const kernels::DropoutLayout& layout, void* sum, const void* gamma,
                                const void* beta, double eps, void* y_ln, void* mean, void* rstd, i64 rows, i64 cols,
                                cudaStream_t s);
void layernorm_backward(DType t, const void* dy, const void* x, const void* gamma, const void* mean, const void* rstd,
                        void* dx, void* dgamma, DType dgamma_type, void* dbeta, DType dbeta_type, const void* add,
                        i64 rows, i64 cols, kernels::LayerNormBackwardPasses passes, kernels::GpuScratch ws,
                        cudaStream_t s);  // ws: gpu_scratch::layernorm_backward_bytes(t, rows, cols); one pass
                                          // (not Split) where layernorm_fused_plan allows
// layernorm_backward, then dd = the dropout backward of dx and dbias (when not
// null) += its column sums (kernels::layernorm_backward_dropout): one pass
// where the fused plan and the layout (one layout row a row) allow, else the
// two launchers. dgamma, dbeta and dbias are all acc_type. prefetch:
// LayerNormBackwardPasses::OnePassPrefetched (kernels:: passes it for Auto
// too). ws:
// gpu_scratch::layernorm_dropout_backward_bytes(t, rows, cols).
void layernorm_backward_dropout(DType t, const void* dy, const void* x, const void* gamma, const void* mean,
                                const void* rstd, void* dx, void* dgamma, void* dbeta, DType acc_type, const void* add,
                                i64 rows, i64 cols, double p, const RngKey& key, const kernels::DropoutLayout& layout,
                                void* dd, void* dbias, bool prefetch, kernels::GpuScratch ws, cudaStream_t s);

}  // namespace megazero::cuda
