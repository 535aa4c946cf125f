// The causal softmax on the GPU: the launchers of megazero/cuda/softmax.h
// (contracts: megazero/kernels/softmax.h). Rows of up to 1024 columns take one
// warp each (held in registers, fp32 sums); longer rows and fp64 one block
// each (sums in double).
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/layer_helpers.cuh"
#include "megazero/cuda/softmax.h"

namespace megazero::cuda {
using namespace detail_k;

namespace {

// ---------------------------------------------------------------- causal softmax

// The first key a row keeps: 0, or (per-document masks) its document's start,
// clamped to [0, i] as the CPU's (megazero/kernels/softmax.cpp).
__device__ __forceinline__ i64 first_key(const std::int64_t* starts, i64 rows_per_sample, i64 row, i64 i, i64 sq) {
  if (!starts) return 0;
  const i64 st = starts[row / rows_per_sample * sq + row % sq];
  return st < 0 ? 0 : st > i ? i : st;
}

template <typename S>
__global__ void causal_softmax_forward_kernel(const S* scores, double scale, S* probs, i64 sq, i64 n,
                                              const std::int64_t* starts, i64 rows_per_sample) {
  using C = compute_t<S>;
  const i64 row = blockIdx.x, i = row % sq + (n - sq);  // the query's position among the n keys
  const i64 lo = first_key(starts, rows_per_sample, row, i, sq);
  const S* sr = scores + row * n;
  S* pr = probs + row * n;
  const C sc = static_cast<C>(scale);
  C mx = -INFINITY;
  for (i64 j = lo + threadIdx.x; j <= i; j += blockDim.x) mx = max(mx, sc * ld(sr[j]));
  mx = block_max(mx);
  double sum = 0;
  for (i64 j = lo + threadIdx.x; j <= i; j += blockDim.x) sum += exp(sc * ld(sr[j]) - mx);
  const double inv = 1.0 / block_sum(sum);  // all reads of the row are done before any write (probs may alias)
  for (i64 j = threadIdx.x; j < n; j += blockDim.x)
    pr[j] = j >= lo && j <= i ? st<S>(static_cast<C>(exp(sc * ld(sr[j]) - mx)) * inv) : st<S>(C(0));
}

template <typename S>
__global__ void causal_softmax_backward_kernel(const S* dprobs, const S* probs, double scale, S* dscores, i64 n,
                                               const std::int64_t* starts, i64 rows_per_sample) {
  const i64 row = blockIdx.x, i = row % n;
  const i64 lo = first_key(starts, rows_per_sample, row, i, n);
  const S* dp = dprobs + row * n;
  const S* p = probs + row * n;
  S* ds = dscores + row * n;
  double dot = 0;
  for (i64 j = lo + threadIdx.x; j <= i; j += blockDim.x) dot += static_cast<double>(ld(dp[j])) * ld(p[j]);
  dot = block_sum(dot);
  for (i64 j = threadIdx.x; j < n; j += blockDim.x)
    ds[j] = j >= lo && j <= i ? st<S>(scale * ld(p[j]) * (ld(dp[j]) - dot)) : st<S>(compute_t<S>(0));
}

// ---------------------------------------------------------------- causal softmax, one warp per row
// For rows of at most 32 * N elements (attention up to N = 32: 1024 tokens):
// the row is read once into registers and written once; sums in fp32.

template <typename S, int N>
__global__ void softmax_warp_forward_kernel(const S* scores, float scale, S* probs, i64 rows, i64 sq, i64 n,
                                            const std::int64_t* starts, i64 rows_per_sample) {
  const i64 row = static_cast<i64>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const i64 i = row % sq + (n - sq);  // the query's position among the n keys
  const i64 lo = first_key(starts, rows_per_sample, row, i, sq);
  const S* sr = scores + row * n;
  S* pr = probs + row * n;
  float v[N];
  float mx = -INFINITY;
#pragma unroll
  for (int t = 0; t < N; ++t) {
    const i64 j = lane + 32 * t;
    v[t] = j >= lo && j <= i ? scale * ld(sr[j]) : -INFINITY;
    mx = fmaxf(mx, v[t]);
  }
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0;
#pragma unroll
  for (int t = 0; t < N; ++t) {
    const i64 j = lane + 32 * t;
    v[t] = j >= lo && j <= i ? expf(v[t] - mx) : 0.f;
    sum += v[t];
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float inv = 1.f / sum;
#pragma unroll
  for (int t = 0; t < N; ++t) {
    const i64 j = lane + 32 * t;
    if (j < n) pr[j] = st<S>(v[t] * inv);
  }
}

template <typename S, int N>
__global__ void softmax_warp_backward_kernel(const S* dprobs, const S* probs, float scale, S* dscores, i64 rows, i64 n,
                                             const std::int64_t* starts, i64 rows_per_sample) {
  const i64 row = static_cast<i64>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const i64 i = row % n;
  const i64 lo = first_key(starts, rows_per_sample, row, i, n);
  const S* dp = dprobs + row * n;
  const S* p = probs + row * n;
  S* ds = dscores + row * n;
  float g[N], q[N];
  float dot = 0;
#pragma unroll
  for (int t = 0; t < N; ++t) {
    const i64 j = lane + 32 * t;
    const bool kept = j >= lo && j <= i;
    g[t] = kept ? ld(dp[j]) : 0.f;
    q[t] = kept ? ld(p[j]) : 0.f;
    dot += g[t] * q[t];
  }
  for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
#pragma unroll
  for (int t = 0; t < N; ++t) {
    const i64 j = lane + 32 * t;
    if (j < n) ds[j] = st<S>(j >= lo && j <= i ? scale * q[t] * (g[t] - dot) : 0.f);
  }
}

// Launches the warp kernel with the smallest N that covers n; false when n is
// too long (or the dtype is fp64: its reference path keeps double sums).
template <typename S, typename Launch>
bool with_warp_width(i64 n, Launch&& launch) {
  if constexpr (std::is_same_v<S, double>) {
    return false;
  } else {
    if (n <= 32) return launch(std::integral_constant<int, 1>{}), true;
    if (n <= 64) return launch(std::integral_constant<int, 2>{}), true;
    if (n <= 128) return launch(std::integral_constant<int, 4>{}), true;
    if (n <= 256) return launch(std::integral_constant<int, 8>{}), true;
    if (n <= 512) return launch(std::integral_constant<int, 16>{}), true;
    if (n <= 1024) return launch(std::integral_constant<int, 32>{}), true;
    return false;
  }
}

// ---------------------------------------------------------------- document masks as a bias

template <typename S>
__global__ void document_mask_bias_kernel(const std::int64_t* starts, i64 rows, i64 s, float masked, S* bias) {
  const i64 n = rows * s;
  for (i64 e = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<i64>(gridDim.x) * blockDim.x) {
    const i64 row = e / s, j = e - row * s;  // row = b * s + i
    bias[e] = st<S>(j >= first_key(starts, s, row, row % s, s) ? 0.f : masked);
  }
}

}  // namespace

// fp16's lowest finite value; -1e9 for the wider types (the frontend's tests' value).
float document_mask_bias_value(DType t) { return t == DType::F16 ? -65504.f : -1e9f; }

void document_mask_bias(DType t, const std::int64_t* key_starts, i64 samples, i64 s, void* bias, cudaStream_t st) {
  if (samples * s == 0) return;
  const float masked = document_mask_bias_value(t);
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    document_mask_bias_kernel<S>
        <<<blocks_for(samples * s * s), kThreads, 0, st>>>(key_starts, samples * s, s, masked, static_cast<S*>(bias));
  });
  check_launch("document_mask_bias");
}

void causal_softmax_forward(DType t, const void* scores, double scale, void* probs, i64 mats, i64 sq, i64 n,
                            cudaStream_t s, const std::int64_t* key_starts, i64 rows_per_sample) {
  if (mats * sq * n == 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    const i64 rows = mats * sq;
    const bool warp = with_warp_width<S>(n, [&](auto width) {
      softmax_warp_forward_kernel<S, decltype(width)::value><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, s>>>(
          static_cast<const S*>(scores), static_cast<float>(scale), static_cast<S*>(probs), rows, sq, n, key_starts,
          rows_per_sample);
    });
    if (!warp)
      causal_softmax_forward_kernel<S><<<static_cast<unsigned>(rows), row_threads(n), 0, s>>>(
          static_cast<const S*>(scores), scale, static_cast<S*>(probs), sq, n, key_starts, rows_per_sample);
  });
  check_launch("causal_softmax_forward");
}

void causal_softmax_backward(DType t, const void* dprobs, const void* probs, double scale, void* dscores, i64 mats,
                             i64 n, cudaStream_t s, const std::int64_t* key_starts, i64 rows_per_sample) {
  if (mats * n == 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    const i64 rows = mats * n;
    const bool warp = with_warp_width<S>(n, [&](auto width) {
      softmax_warp_backward_kernel<S, decltype(width)::value><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, s>>>(
          static_cast<const S*>(dprobs), static_cast<const S*>(probs), static_cast<float>(scale),
          static_cast<S*>(dscores), rows, n, key_starts, rows_per_sample);
    });
    if (!warp)
      causal_softmax_backward_kernel<S><<<static_cast<unsigned>(rows), row_threads(n), 0, s>>>(
          static_cast<const S*>(dprobs), static_cast<const S*>(probs), scale, static_cast<S*>(dscores), n, key_starts,
          rows_per_sample);
  });
  check_launch("causal_softmax_backward");
}

}  // namespace megazero::cuda
