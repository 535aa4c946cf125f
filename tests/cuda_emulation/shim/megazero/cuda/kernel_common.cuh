// Stand-in for megazero/cuda/kernel_common.cuh in the CPU emulation: the
// device pieces the emulated kernels use (element load/store with the real
// rounding of bf16/fp16, the compute type, the block reductions — the last
// copied from the real header, whose shuffles and barriers the shim
// emulates), and the real header's host half, launch_common.h, itself.
#pragma once
#include <type_traits>

#include "emu_runtime.h"
#include "megazero/cuda/launch_common.h"
#include "megazero/kernels/dropout.h"

namespace megazero::cuda::detail_k {
using i64 = std::int64_t;
using ::ld;
template <typename S>
S st(float v) {
  if constexpr (std::is_same_v<S, __half>)
    return __half{static_cast<_Float16>(v)};
  else if constexpr (std::is_same_v<S, __nv_bfloat16>)
    return to_bf16(v);
  else
    return static_cast<S>(v);
}
// A double result: through fp32 (the real header rounds once, to odd first;
// the emulated tests allow one 16-bit rounding step either way).
template <typename S>
S st(double v) {
  if constexpr (std::is_same_v<S, double>)
    return v;
  else
    return st<S>(static_cast<float>(v));
}

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

// The launch's dynamic shared memory: the emulated block's buffer.
template <typename T>
T* dynamic_shared() {
  return reinterpret_cast<T*>(emu_smem);
}

template <typename T>
T block_sum(T v) {
  __shared__ T warp_part[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
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
T block_max(T v) {
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
}  // namespace megazero::cuda::detail_k
