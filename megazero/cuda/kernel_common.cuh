// Device-side helpers shared by the CUDA kernel files: storage <-> compute
// conversion with the CPU kernels' rounding rules and block reductions; with
// launch_common.h's launch sizing and checks. Included only by .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "megazero/core/dtype.h"
#include "megazero/cuda/launch_common.h"

namespace megazero::cuda::detail_k {

// The compute type of a storage type: fp32 for 16-bit storage, else itself
// (the CPU kernels' compute_t).
template <typename S>
struct ComputeOf {
  using type = S;
};
template <>
struct ComputeOf<__half> {
  using type = float;
};
template <>
struct ComputeOf<__nv_bfloat16> {
  using type = float;
};
template <typename S>
using compute_t = typename ComputeOf<S>::type;

__device__ __forceinline__ float ld(float v) { return v; }
__device__ __forceinline__ double ld(double v) { return v; }
__device__ __forceinline__ float ld(__half v) { return __half2float(v); }
__device__ __forceinline__ float ld(__nv_bfloat16 v) { return __bfloat162float(v); }

// Rounds a float or double result once, to nearest even, into S.
template <typename S>
__device__ __forceinline__ S st(float v) {
  if constexpr (std::is_same_v<S, __half>)
    return __float2half_rn(v);
  else if constexpr (std::is_same_v<S, __nv_bfloat16>)
    return __float2bfloat16_rn(v);
  else
    return static_cast<S>(v);
}
template <typename S>
__device__ __forceinline__ S st(double v) {
  if constexpr (std::is_same_v<S, __half>)
    return __double2half(v);
  else if constexpr (std::is_same_v<S, __nv_bfloat16>)
    return __double2bfloat16(v);
  else if constexpr (std::is_same_v<S, float>)
    return __double2float_rn(v);
  else
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread
// gets the result. The order is fixed, so the result is reproducible.
template <typename T>
__device__ T block_sum(T v) {
  __shared__ T warp_part[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // warp_part may still be read by a previous call
  if (lane == 0) warp_part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? warp_part[lane] : T(0);
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if (lane == 0) warp_part[0] = v;
  }
  __syncthreads();
  return warp_part[0];
}

template <typename T>
__device__ T block_max(T v) {
  __shared__ T warp_part[32];
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_down_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) warp_part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? warp_part[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_down_sync(0xffffffffu, v, o));
    if (lane == 0) warp_part[0] = v;
  }
  __syncthreads();
  return warp_part[0];
}

// The block's dynamic shared memory (the launch's third parameter), as T*.
// (The CPU emulation's stand-in returns the emulated block's buffer.)
template <typename T>
__device__ __forceinline__ T* dynamic_shared() {
  extern __shared__ __align__(16) unsigned char mz_dynamic_smem[];
  return reinterpret_cast<T*>(mz_dynamic_smem);
}

}  // namespace megazero::cuda::detail_k
