// Device-side helpers shared by the CUDA kernel files: storage <-> compute
// conversion with the CPU kernels' rounding rules, block reductions, launch
// sizing and launch checks. Included only by .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "megazero/core/dtype.h"
#include "megazero/core/error.h"
#include "megazero/kernels/gpu_scratch.h"

namespace megazero::cuda::detail_k {

using i64 = std::int64_t;

constexpr unsigned kThreads = 256;
static_assert(kThreads == kernels::gpu_scratch::kThreads, "the scratch sizing assumes this block size");
// Enough blocks to fill an H100 (132 SMs) many times over; grid-stride loops
// cover the rest, so no grid dimension ever overflows.
constexpr i64 kMaxBlocks = 132 * 32;

inline unsigned blocks_for(i64 n, unsigned threads = kThreads) {
  return static_cast<unsigned>(std::max<i64>(1, std::min<i64>((n + threads - 1) / threads, kMaxBlocks)));
}

inline void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw InternalError(::megazero::detail::concat("CUDA kernel launch failed in ", what, ": ", cudaGetErrorName(err),
                                                   " (", cudaGetErrorString(err), ")"));
}

// A library call on the stream (CUB, cuBLAS's runtime helpers) that returns a cudaError_t.
inline void check_call(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw InternalError(::megazero::detail::concat("CUDA call failed in ", what, ": ", cudaGetErrorName(err), " (",
                                                   cudaGetErrorString(err), ")"));
}

// The grid of a grid-stride kernel that streams memory: as many blocks as
// the current device holds at once (the SMs times the blocks of `threads`
// the kernel's registers let one SM keep resident), fewer when n elements
// need fewer. One resident wave, so no block waits for a later one and no
// wave runs part-empty at the end (kMaxBlocks over 5 resident blocks an SM
// would leave the last of 6.4 waves 40% full).
template <typename Kernel>
unsigned resident_grid(Kernel kernel, i64 n, unsigned threads, const char* what) {
  int device = 0, sms = 0, per_sm = 0;
  check_call(cudaGetDevice(&device), what);
  check_call(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), what);
  check_call(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, static_cast<int>(threads), 0), what);
  const i64 resident = std::max<i64>(1, static_cast<i64>(sms) * per_sm);
  return static_cast<unsigned>(std::max<i64>(1, std::min<i64>((n + threads - 1) / threads, resident)));
}

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

// Calls fn(S{}) with the device storage type of a float dtype.
template <typename Fn>
void with_storage(DType t, Fn&& fn) {
  switch (t) {
    case DType::F64:
      fn(double{});
      break;
    case DType::BF16:
      fn(__nv_bfloat16{});
      break;
    case DType::F16:
      fn(__half{});
      break;
    case DType::F32:
      fn(float{});
      break;
    default:
      throw InternalError(::megazero::detail::concat("CUDA kernel: unsupported dtype ", dtype_name(t)));
  }
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

// The caller's scratch (megazero/kernels/gpu_scratch.h: allocated through the
// device, so counted and planned) as T*, after checking it holds `need` bytes.
template <typename T>
T* scratch_as(kernels::GpuScratch ws, std::size_t need, const char* what) {
  if (need == 0) return static_cast<T*>(ws.data);
  if (ws.data == nullptr || ws.bytes < need)
    throw InternalError(::megazero::detail::concat(what, ": given ", ws.bytes, " bytes of scratch, needs ", need,
                                                   " (megazero/kernels/gpu_scratch.h sizes it)"));
  return static_cast<T*>(ws.data);
}

}  // namespace megazero::cuda::detail_k
