// The optimizer's kernels on the GPU: the launchers of megazero/cuda/optimizer.h
// (contracts: megazero/kernels/optimizer_kernels.h): AdamW, element by element
// in double, and the gradient norm's sum of squares, a fixed-order two-pass
// reduction (no atomics) kept on the device.
#include <cuda_runtime.h>

#include <utility>
#include <vector>

#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/optimizer.h"
#include "megazero/kernels/gpu_scratch.h"

namespace megazero::cuda {
using namespace detail_k;

namespace {

template <typename G>
__global__ void adamw_kernel(float* w, float* m, float* v, const G* g, i64 begin, i64 end, double wd, AdamArgs a) {
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 i = begin + static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < end; i += stride) {
    const double grad = static_cast<double>(ld(g[i])) * a.grad_scale;
    const double mi = a.beta1 * m[i] + (1 - a.beta1) * grad;
    const double vi = a.beta2 * v[i] + (1 - a.beta2) * grad * grad;
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    const double update = (mi / a.bc1) / (sqrt(vi / a.bc2) + a.eps);
    w[i] = static_cast<float>(w[i] - a.lr * (update + wd * w[i]));
  }
}

constexpr unsigned kNormBlocks = static_cast<unsigned>(kernels::gpu_scratch::kNormBlocks);

template <typename G>
__global__ void sum_sq_kernel(const G* g, i64 begin, i64 end, double* partial) {
  double acc = 0;
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 i = begin + static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < end; i += stride) {
    const double x = ld(g[i]);
    acc += x * x;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void sum_partials_kernel(const double* partial, i64 n, double* out) {
  double acc = 0;
  for (i64 i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out = acc;
}

}  // namespace

void adamw(float* w, float* m, float* v, const void* g, DType grad_type, i64 begin, i64 end, bool decay,
           const AdamArgs& a, cudaStream_t s) {
  if (end <= begin) return;
  with_storage(grad_type, [&](auto tag) {
    using G = decltype(tag);
    adamw_kernel<G><<<blocks_for(end - begin), kThreads, 0, s>>>(w, m, v, static_cast<const G*>(g), begin, end,
                                                                 decay ? a.weight_decay : 0.0, a);
  });
  check_launch("adamw");
}

void sum_of_squares(const void* g, DType t, const std::vector<std::pair<i64, i64>>& ranges, kernels::GpuScratch ws,
                    double* out, cudaStream_t s) {
  const i64 parts = static_cast<i64>(ranges.size()) * kNormBlocks;
  double* p =
      scratch_as<double>(ws, kernels::gpu_scratch::sum_of_squares_bytes(static_cast<i64>(ranges.size())), "grad norm");
  with_storage(t, [&](auto tag) {
    using G = decltype(tag);
    for (std::size_t k = 0; k < ranges.size(); ++k)
      sum_sq_kernel<G><<<kNormBlocks, kThreads, 0, s>>>(static_cast<const G*>(g), ranges[k].first, ranges[k].second,
                                                        p + static_cast<i64>(k) * kNormBlocks);
  });
  check_launch("grad norm");
  sum_partials_kernel<<<1, 1024, 0, s>>>(p, parts, out);
  check_launch("grad norm");
}

}  // namespace megazero::cuda
