// The shm transport's reduction over device slots (comm/shm_collectives.h):
// dst[i] = src[0][i] (op) src[1][i] ... in rank order, accumulated in fp32
// (fp64 for fp64, int64 for integers) and rounded once, Avg then dividing the
// rounded sum by the rank count in fp32 — reduce_host's formula, so a group's
// ranks get the host path's bits whichever path a collective takes. Kernels
// only, plain enough for tests/cuda_emulation to run them as they are.
#pragma once

#include <cstdint>
#include <type_traits>

#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/packs.cuh"

namespace megazero::cuda::detail_k {

// Sources by value in the kernel's parameters (no device array to fill first).
constexpr int kMaxSlotSources = 32;
struct SlotSources {
  const void* p[kMaxSlotSources];
};
enum class SlotOp : int { Sum, Avg, Max };

// The accumulator of a storage type and the conversions to and from it.
template <typename S>
using slot_acc_t = std::conditional_t<std::is_integral_v<S>, std::int64_t,
                                      std::conditional_t<std::is_same_v<S, double>, double, float>>;
template <typename S>
__device__ __forceinline__ slot_acc_t<S> slot_widen(S v) {
  if constexpr (std::is_integral_v<S>)
    return static_cast<std::int64_t>(v);
  else
    return ld(v);
}
template <typename S>
__device__ __forceinline__ S slot_narrow(slot_acc_t<S> a) {
  if constexpr (std::is_integral_v<S>)
    return static_cast<S>(a);
  else
    return st<S>(a);
}

// V elements a thread at a time (V = kVec<S>: 16-byte accesses, every
// pointer aligned; V = 1 elsewhere), grid-stride over n / V units. dst may
// be one of the sources: each unit is read whole before it is written.
template <typename S, int V>
__global__ void slot_reduce_kernel(S* dst, SlotSources srcs, int nsrc, i64 units, SlotOp op, int ranks) {
  using A = slot_acc_t<S>;
  using U = Vec<S, V>;
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 u = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += stride) {
    A acc[V];
    const U first = static_cast<const U*>(srcs.p[0])[u];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = slot_widen<S>(first.v[j]);
    for (int q = 1; q < nsrc; ++q) {
      const U x = static_cast<const U*>(srcs.p[q])[u];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const A v = slot_widen<S>(x.v[j]);
        if (op == SlotOp::Max)
          acc[j] = (v != v || v > acc[j]) ? v : acc[j];  // NaN-propagating
        else
          acc[j] += v;
      }
    }
    U out;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if constexpr (std::is_floating_point_v<A>) {
        if (op == SlotOp::Avg) {
          if constexpr (std::is_same_v<S, double>) {
            out.v[j] = acc[j] / ranks;
          } else {
            const float rounded = ld(slot_narrow<S>(acc[j]));
            out.v[j] = st<S>(rounded / static_cast<float>(ranks));
          }
          continue;
        }
      }
      out.v[j] = slot_narrow<S>(acc[j]);
    }
    reinterpret_cast<U*>(dst)[u] = out;
  }
}

}  // namespace megazero::cuda::detail_k
