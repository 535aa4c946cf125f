// The CUDA launchers of the GeLU, bias and element-wise kernels
// (megazero/kernels/gelu_bias.h has the contracts; conventions: launchers.h).
#pragma once

#include "megazero/cuda/launchers.h"

namespace megazero::cuda {

void gelu_forward(DType t, const void* x, void* y, i64 n, cudaStream_t s);
void gelu_backward(DType t, const void* dy, const void* x, void* dx, i64 n, cudaStream_t s);
void squared_relu_forward(DType t, const void* x, void* y, i64 n, cudaStream_t s);
void squared_relu_backward(DType t, const void* dy, const void* x, void* dx, i64 n, cudaStream_t s);
void bias_gelu_forward(DType t, const void* y, const void* bias, void* out, i64 rows, i64 cols, cudaStream_t s);
// One pass: each thread walks a column over a chunk of rows, writing dx and
// summing it (ws: column_sums_bytes(t, rows, cols, 1)).
void bias_gelu_backward(DType t, const void* dy, const void* y, const void* bias, void* dx, void* dbias,
                        DType dbias_type, i64 rows, i64 cols, kernels::GpuScratch ws, cudaStream_t s);
void add_bias(DType t, void* y, const void* bias, i64 rows, i64 cols, cudaStream_t s);
// sums[c] += sum_r x[r * cols + c] (kernels::column_sums and bias_grad; `what`
// names the caller in errors). ws: column_sums_bytes(t, rows, cols, 1).
void column_sums(DType t, const void* x, void* sums, DType sums_type, i64 rows, i64 cols, kernels::GpuScratch ws,
                 cudaStream_t s, const char* what);
void add(DType t, const void* a, const void* b, void* out, i64 n, cudaStream_t s);
void axpy(DType t, double alpha, const void* x, void* y, i64 n, cudaStream_t s);
void scale_elements(DType t, void* x, i64 n, double alpha, cudaStream_t s);

}  // namespace megazero::cuda
