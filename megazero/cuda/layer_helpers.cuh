// Launch helpers shared by the layer kernel files (layernorm.cu, gelu_bias.cu,
// softmax.cu, dropout.cu, embedding.cu, cross_entropy.cu): 16-byte packs,
// grid-stride element-wise and periodic maps, the block size of row kernels,
// and the dtype dispatch of the launchers (MZ_BY_STORAGE,
// MZ_BY_STORAGE_AND_ACC). Included only by .cu files.
#pragma once

#include <cstdint>
#include <type_traits>

#include "megazero/core/dtype.h"
#include "megazero/core/error.h"
#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/map_kernels.cuh"
#include "megazero/cuda/packs.cuh"

namespace megazero::cuda::detail_k {

// Calls fn(G{}) with the accumulator type for storage S: fp32 when asked for
// 16-bit storage, else S.
template <typename S, typename Fn>
void with_accumulator(DType acc, Fn&& fn) {
  if constexpr (!std::is_same_v<S, float> && !std::is_same_v<S, double>) {
    if (acc == DType::F32) {
      fn(float{});
      return;
    }
  }
  fn(S{});
}

template <typename T, typename F>
__global__ void elementwise_kernel(T* out, i64 n, F f) {
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = f(i);
}

template <typename T, typename F>
void elementwise(T* out, i64 n, F f, cudaStream_t s, const char* what) {
  if (n == 0) return;
  elementwise_kernel<<<blocks_for(n), kThreads, 0, s>>>(out, n, f);
  check_launch(what);
}

// out[i] = round(f(a[i], b[i], i)) with a and b loaded into the compute type
// (b == nullptr: f gets 0). out may be a or b. Memory-bound, so each thread
// moves 16-byte packs; a scalar loop covers unaligned pointers and the tail.
template <typename S, typename F>
__global__ void map_kernel(S* out, const S* a, const S* b, i64 n, F f) {
  using C = compute_t<S>;
  constexpr int V = kVec<S>;
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  const i64 first = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  const i64 packs = n / V;
  for (i64 q = first; q < packs; q += stride) {
    const Pack<S> pa = reinterpret_cast<const Pack<S>*>(a)[q];
    Pack<S> pb{};
    if (b) pb = reinterpret_cast<const Pack<S>*>(b)[q];
    Pack<S> po;
#pragma unroll
    for (int j = 0; j < V; ++j) po.v[j] = st<S>(f(ld(pa.v[j]), b ? ld(pb.v[j]) : C(0), q * V + j));
    reinterpret_cast<Pack<S>*>(out)[q] = po;
  }
  for (i64 i = packs * V + first; i < n; i += stride) out[i] = st<S>(f(ld(a[i]), b ? ld(b[i]) : C(0), i));
}

template <typename S, typename F>
__global__ void map_scalar_kernel(S* out, const S* a, const S* b, i64 n, F f) {
  using C = compute_t<S>;
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = st<S>(f(ld(a[i]), b ? ld(b[i]) : C(0), i));
}

template <typename S, typename F>
void periodic_map(S* out, const S* a, const S* p, i64 n, i64 period, F f, cudaStream_t s, const char* what) {
  if (n == 0) return;
  constexpr int V = kVec<S>;
  if (period % V == 0 && n % period == 0 && aligned16(out) && aligned16(a) && aligned16(p))
    periodic_map_kernel<<<blocks_for(n / V), kThreads, 0, s>>>(out, a, p, n / V, period / V, f);
  else
    periodic_map_scalar_kernel<<<blocks_for(n), kThreads, 0, s>>>(out, a, p, n, period, f);
  check_launch(what);
}

template <typename S, typename F>
void map(S* out, const S* a, const S* b, i64 n, F f, cudaStream_t s, const char* what) {
  if (n == 0) return;
  if (aligned16(out) && aligned16(a) && (!b || aligned16(b)))
    map_kernel<<<blocks_for((n + kVec<S> - 1) / kVec<S>), kThreads, 0, s>>>(out, a, b, n, f);
  else
    map_scalar_kernel<<<blocks_for(n), kThreads, 0, s>>>(out, a, b, n, f);
  check_launch(what);
}

// Threads per block for a kernel that runs one block per row of `cols` elements.
inline unsigned row_threads(i64 cols) { return cols >= 2048 ? 512 : cols >= 512 ? 256 : 128; }

// y[i] += b[i % period]: bias (period = cols) and position embeddings (period = seq * H).
template <typename S>
void add_periodic_t(void* y, const void* b, i64 n, i64 period, cudaStream_t s, const char* what) {
  using C = compute_t<S>;
  periodic_map(
      static_cast<S*>(y), static_cast<const S*>(y), static_cast<const S*>(b), n, period,
      [] __device__(C v, C p) { return v + p; }, s, what);
}

}  // namespace megazero::cuda::detail_k

// Calls FN<S>(args...) for the storage type of dtype T.
#define MZ_BY_STORAGE(T, FN, ...)                                                     \
  switch (T) {                                                                        \
    case DType::F32:                                                                  \
      FN<float>(__VA_ARGS__);                                                         \
      break;                                                                          \
    case DType::F64:                                                                  \
      FN<double>(__VA_ARGS__);                                                        \
      break;                                                                          \
    case DType::BF16:                                                                 \
      FN<__nv_bfloat16>(__VA_ARGS__);                                                 \
      break;                                                                          \
    case DType::F16:                                                                  \
      FN<__half>(__VA_ARGS__);                                                        \
      break;                                                                          \
    default:                                                                          \
      throw InternalError(::megazero::detail::concat(#FN ": dtype ", dtype_name(T))); \
  }
// Calls FN<S, G>(args...): S the storage type of T, G the accumulator type
// (fp32 when ACC is F32 for 16-bit storage, else S).
#define MZ_BY_STORAGE_AND_ACC(T, ACC, FN, ...)                                        \
  switch (T) {                                                                        \
    case DType::F32:                                                                  \
      FN<float, float>(__VA_ARGS__);                                                  \
      break;                                                                          \
    case DType::F64:                                                                  \
      FN<double, double>(__VA_ARGS__);                                                \
      break;                                                                          \
    case DType::BF16:                                                                 \
      if ((ACC) == DType::F32)                                                        \
        FN<__nv_bfloat16, float>(__VA_ARGS__);                                        \
      else                                                                            \
        FN<__nv_bfloat16, __nv_bfloat16>(__VA_ARGS__);                                \
      break;                                                                          \
    case DType::F16:                                                                  \
      if ((ACC) == DType::F32)                                                        \
        FN<__half, float>(__VA_ARGS__);                                               \
      else                                                                            \
        FN<__half, __half>(__VA_ARGS__);                                              \
      break;                                                                          \
    default:                                                                          \
      throw InternalError(::megazero::detail::concat(#FN ": dtype ", dtype_name(T))); \
  }
