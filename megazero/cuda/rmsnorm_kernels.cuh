// The device kernels of RMSNorm (contract: megazero/kernels/rmsnorm.h;
// launchers: rmsnorm.cu). Kept apart, kernels only, so that tests/cuda_emulation
// runs them on the CPU as they are. The arithmetic is the CPU kernel's
// (kernels/rmsnorm.cpp): sums and results in double, each result rounded once.
#pragma once

#include <cstdint>

#include "megazero/cuda/column_tiles.cuh"
#include "megazero/cuda/kernel_common.cuh"

namespace megazero::cuda::detail_k {

// One block per row (grid-stride over rows; blockDim.x a multiple of 32):
// rstd = 1 / sqrt(mean(x^2) + eps), y = x * rstd * gamma. The block reads its
// whole row before block_sum returns and then each thread writes only what it
// read itself, so y may alias x.
template <typename S, typename C>
__global__ void rmsnorm_forward_kernel(const S* x, const S* gamma, double eps, S* y, C* rstd, i64 rows, i64 cols) {
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    const S* xr = x + r * cols;
    S* yr = y + r * cols;
    double sq = 0;
    for (i64 c = threadIdx.x; c < cols; c += blockDim.x) {
      const double v = ld(xr[c]);
      sq += v * v;
    }
    const double rs = 1.0 / sqrt(block_sum(sq) / static_cast<double>(cols) + eps);
    for (i64 c = threadIdx.x; c < cols; c += blockDim.x)
      yr[c] = st<S>(static_cast<double>(ld(xr[c])) * rs * ld(gamma[c]));
    if (threadIdx.x == 0) rstd[r] = static_cast<C>(rs);
  }
}

// dx = rstd * (g - x * rstd^2 * mean(g * x)) (+ add), g = gamma * dy; one
// block per row. Each thread reads dy[c] before writing dx[c], and the block
// is past block_sum before any write, so dx may alias dy.
template <typename S, typename C>
__global__ void rmsnorm_backward_dx_kernel(const S* dy, const S* x, const S* gamma, const C* rstd, S* dx, const S* add,
                                           i64 rows, i64 cols) {
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    const S* dyr = dy + r * cols;
    const S* xr = x + r * cols;
    S* dxr = dx + r * cols;
    const double rs = rstd[r];
    double sgx = 0;
    for (i64 c = threadIdx.x; c < cols; c += blockDim.x)
      sgx += static_cast<double>(ld(dyr[c])) * ld(gamma[c]) * ld(xr[c]);
    const double k = rs * rs * (block_sum(sgx) / static_cast<double>(cols));
    for (i64 c = threadIdx.x; c < cols; c += blockDim.x) {
      const double g = static_cast<double>(ld(dyr[c])) * ld(gamma[c]);
      const double v = rs * (g - ld(xr[c]) * k);
      dxr[c] = st<S>(add ? v + static_cast<double>(ld(add[r * cols + c])) : v);
    }
  }
}

// dgamma's column sums, sum_r dy[r, c] * x[r, c] * rstd[r] in double, split as
// gpu_scratch::column_chunks says: thread c of block column blockIdx.x sums
// rows chunk blockIdx.y into partial[blockIdx.y * cols + c]; the last block of
// each block column then adds the chunks into dgamma (`fold`, column_tiles.cuh;
// without tickets, column_finish_kernel after it).
template <typename S, typename C, typename G = float>
__global__ void rmsnorm_dgamma_partial_kernel(const S* dy, const S* x, const C* rstd, i64 rows, i64 cols,
                                              i64 rows_per_chunk, double* partial, ColumnFold<G> fold = {}) {
  const i64 first = static_cast<i64>(blockIdx.x) * blockDim.x, c = first + threadIdx.x;
  if (c < cols) {  // every thread goes on to the fold's barriers
    const i64 r0 = static_cast<i64>(blockIdx.y) * rows_per_chunk, r1 = min(rows, r0 + rows_per_chunk);
    double acc = 0;
    for (i64 r = r0; r < r1; ++r)
      acc += static_cast<double>(ld(dy[r * cols + c])) * (ld(x[r * cols + c]) * static_cast<double>(rstd[r]));
    partial[static_cast<i64>(blockIdx.y) * cols + c] = acc;
  }
  finish_if_last(fold, 1, cols, first, blockDim.x, partial);
}

// One chunk holds every row: the sum added straight into dgamma (no scratch).
template <typename S, typename C, typename G>
__global__ void rmsnorm_dgamma_direct_kernel(const S* dy, const S* x, const C* rstd, i64 rows, i64 cols, G* dgamma) {
  const i64 c = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  double acc = 0;
  for (i64 r = 0; r < rows; ++r)
    acc += static_cast<double>(ld(dy[r * cols + c])) * (ld(x[r * cols + c]) * static_cast<double>(rstd[r]));
  dgamma[c] = st<G>(static_cast<double>(ld(dgamma[c])) + acc);
}

}  // namespace megazero::cuda::detail_k
