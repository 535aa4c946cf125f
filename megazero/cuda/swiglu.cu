// Launchers of the CUDA SwiGLU (swiglu_cuda.h; kernels: swiglu_kernels.cuh).
#include <cuda_runtime.h>

#include <algorithm>

#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/swiglu_cuda.h"
#include "megazero/cuda/swiglu_kernels.cuh"

namespace megazero::cuda {
using namespace detail_k;

namespace {

// x over column blocks of f, y over rows (at most 65535; the kernels stride).
dim3 swiglu_grid(i64 rows, i64 f) {
  return dim3(static_cast<unsigned>((f + kThreads - 1) / kThreads), static_cast<unsigned>(std::min<i64>(rows, 65535)));
}

}  // namespace

void swiglu_forward(DType t, const void* x, void* y, i64 rows, i64 f, cudaStream_t s) {
  if (rows == 0 || f == 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    swiglu_forward_kernel<S>
        <<<swiglu_grid(rows, f), kThreads, 0, s>>>(static_cast<const S*>(x), static_cast<S*>(y), rows, f);
  });
  check_launch("swiglu_forward");
}

void swiglu_backward(DType t, const void* dy, const void* x, void* dx, i64 rows, i64 f, cudaStream_t s) {
  if (rows == 0 || f == 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    swiglu_backward_kernel<S><<<swiglu_grid(rows, f), kThreads, 0, s>>>(
        static_cast<const S*>(dy), static_cast<const S*>(x), static_cast<S*>(dx), rows, f);
  });
  check_launch("swiglu_backward");
}

}  // namespace megazero::cuda
