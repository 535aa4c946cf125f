// CUDA layer kernels (contracts in megazero/kernels/layer_kernels.h, device
// entry points in layer_kernels_cuda.h). Row kernels run one block per row;
// element-wise kernels use grid-stride loops; sums over rows (parameter
// gradients) go through column_sum, a two-pass reduction in a fixed order.
#include <cuda_runtime.h>
#include <cub/device/device_radix_sort.cuh>

#include <cmath>
#include <initializer_list>
#include <vector>

#include "megazero/cuda/cuda_kernels.h"
#include "megazero/cuda/dropout_kernels.cuh"
#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/philox.cuh"
#include "megazero/cuda/layer_kernels_cuda.h"
#include "megazero/cuda/vocab_kernels.cuh"

namespace megazero::cuda {
using namespace detail_k;

namespace {

// ---------------------------------------------------------------- helpers

// dst[c] = round(dst[c] + sum_r term(r, c)) for c < cols, the sum in double:
// pass 1 sums row chunks per column (coalesced along c), pass 2 adds the
// chunks in chunk order. Fixed order, no atomics.
template <typename G, typename Term>
__global__ void column_partial_kernel(i64 rows, i64 cols, i64 rows_per_chunk, Term term, double* partial) {
  const i64 c = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const i64 r0 = static_cast<i64>(blockIdx.y) * rows_per_chunk, r1 = min(rows, r0 + rows_per_chunk);
  double acc = 0;
  for (i64 r = r0; r < r1; ++r) acc += term(r, c);
  partial[static_cast<i64>(blockIdx.y) * cols + c] = acc;
}

// One chunk holds every row: dst[c] = round(dst[c] + sum_r term(r, c)) with
// no partials (the same sums, in the same order, as partial + finish: the
// same bits up to the sign of a zero sum).
template <typename G, typename Term>
__global__ void column_direct_kernel(i64 rows, i64 cols, Term term, G* dst) {
  const i64 c = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  double acc = 0;
  for (i64 r = 0; r < rows; ++r) acc += term(r, c);
  dst[c] = st<G>(static_cast<double>(ld(dst[c])) + acc);
}

template <typename G>
__global__ void column_finish_kernel(i64 cols, i64 chunks, const double* partial, G* dst) {
  const i64 c = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  double acc = 0;
  for (i64 k = 0; k < chunks; ++k) acc += partial[k * cols + c];
  dst[c] = st<G>(static_cast<double>(ld(dst[c])) + acc);
}

// dst[c] = round(dst[c] + the `chunks` partial sums of column c, in order).
template <typename G>
void finish_columns(G* dst, i64 cols, i64 chunks, const double* partial, cudaStream_t s, const char* what) {
  column_finish_kernel<G>
      <<<static_cast<unsigned>((cols + kThreads - 1) / kThreads), kThreads, 0, s>>>(cols, chunks, partial, dst);
  check_launch(what);
}

template <typename G, typename Term>
void column_sum(G* dst, i64 rows, i64 cols, Term term, kernels::GpuScratch ws, cudaStream_t s, const char* what) {
  if (cols == 0) return;
  const auto c = kernels::gpu_scratch::column_chunks(rows, cols);
  if (c.used == 1) {
    column_direct_kernel<G><<<static_cast<unsigned>(c.col_blocks), kThreads, 0, s>>>(rows, cols, term, dst);
    check_launch(what);
    return;
  }
  double* partial = scratch_as<double>(ws, static_cast<std::size_t>(c.used * cols) * sizeof(double), what);
  column_partial_kernel<G>
      <<<dim3(static_cast<unsigned>(c.col_blocks), static_cast<unsigned>(c.used)), kThreads, 0, s>>>(
          rows, cols, c.per_chunk, term, partial);
  check_launch(what);
  finish_columns(dst, cols, c.used, partial, s, what);
}

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

// 16-byte packs: 8 bf16/fp16, 4 fp32 or 2 fp64 values per load and store.
template <typename S>
constexpr int kVec = static_cast<int>(16 / sizeof(S));
template <typename S>
struct alignas(16) Pack {
  S v[kVec<S>];
};

inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

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

// out[i] = round(f(a[i], p[i % period])) for a periodic operand p (a bias:
// period = cols; position embeddings: seq * H). The period is whole packs, so
// each pack has one p pack: one division per pack, not a 64-bit modulo per
// element (the GPU emulates those in software). out may be a.
template <typename S, typename F>
__global__ void periodic_map_kernel(S* out, const S* a, const S* p, i64 packs, i64 period_packs, F f) {
  constexpr int V = kVec<S>;
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 t = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; t < packs; t += stride) {
    const i64 q = t - (t / period_packs) * period_packs;
    const Pack<S> pa = reinterpret_cast<const Pack<S>*>(a)[t];
    const Pack<S> pp = reinterpret_cast<const Pack<S>*>(p)[q];
    Pack<S> po;
#pragma unroll
    for (int j = 0; j < V; ++j) po.v[j] = st<S>(f(ld(pa.v[j]), ld(pp.v[j])));
    reinterpret_cast<Pack<S>*>(out)[t] = po;
  }
}

// The same with a scalar loop (unaligned pointers, a period of partial packs).
template <typename S, typename F>
__global__ void periodic_map_scalar_kernel(S* out, const S* a, const S* p, i64 n, i64 period, F f) {
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = st<S>(f(ld(a[i]), ld(p[i % period])));
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

// ---------------------------------------------------------------- LayerNorm

template <typename S, typename C>
__global__ void layernorm_forward_kernel(const S* x, const S* gamma, const S* beta, double eps, S* y, C* mean, C* rstd,
                                         i64 cols) {
  const i64 r = blockIdx.x;
  const S* xr = x + r * cols;
  S* yr = y + r * cols;
  double sum = 0;
  for (i64 c = threadIdx.x; c < cols; c += blockDim.x) sum += ld(xr[c]);
  const double m = block_sum(sum) / static_cast<double>(cols);
  double sq = 0;
  for (i64 c = threadIdx.x; c < cols; c += blockDim.x) {
    const double d = ld(xr[c]) - m;
    sq += d * d;
  }
  const double rs = 1.0 / sqrt(block_sum(sq) / static_cast<double>(cols) + eps);
  for (i64 c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = st<S>((ld(xr[c]) - m) * rs * ld(gamma[c]) + ld(beta[c]));
  if (threadIdx.x == 0) {
    mean[r] = static_cast<C>(m);
    rstd[r] = static_cast<C>(rs);
  }
}

template <typename S, typename C>
__global__ void layernorm_backward_dx_kernel(const S* dy, const S* x, const S* gamma, const C* mean, const C* rstd,
                                             S* dx, const S* add, i64 cols) {
  const i64 r = blockIdx.x;
  const S* dyr = dy + r * cols;
  const S* xr = x + r * cols;
  S* dxr = dx + r * cols;
  const double m = mean[r], rs = rstd[r];
  double sg = 0, sgx = 0;
  for (i64 c = threadIdx.x; c < cols; c += blockDim.x) {
    const double g = static_cast<double>(ld(dyr[c])) * ld(gamma[c]);
    sg += g;
    sgx += g * (ld(xr[c]) - m) * rs;
  }
  const double inv = 1.0 / static_cast<double>(cols);
  const double mean_g = block_sum(sg) * inv, mean_gx = block_sum(sgx) * inv;
  for (i64 c = threadIdx.x; c < cols; c += blockDim.x) {
    const double g = static_cast<double>(ld(dyr[c])) * ld(gamma[c]);
    const double v = rs * (g - mean_g - (ld(xr[c]) - m) * rs * mean_gx);
    dxr[c] = st<S>(add ? v + static_cast<double>(ld(add[r * cols + c])) : v);
  }
}

unsigned row_threads(i64 cols) { return cols >= 2048 ? 512 : cols >= 512 ? 256 : 128; }

// ---------------------------------------------------------------- GeLU

constexpr double kGeluC = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kGeluA = 0.044715;

template <typename T>
__device__ __forceinline__ T gelu(T x) {
  const T u = static_cast<T>(kGeluC) * (x + static_cast<T>(kGeluA) * x * x * x);
  return static_cast<T>(0.5) * x * (static_cast<T>(1) + tanh(u));
}

template <typename T>
__device__ __forceinline__ T gelu_grad(T x) {
  const T u = static_cast<T>(kGeluC) * (x + static_cast<T>(kGeluA) * x * x * x);
  const T t = tanh(u);
  const T du = static_cast<T>(kGeluC) * (static_cast<T>(1) + static_cast<T>(3 * kGeluA) * x * x);
  return static_cast<T>(0.5) * (static_cast<T>(1) + t) + static_cast<T>(0.5) * x * (static_cast<T>(1) - t * t) * du;
}

// ---------------------------------------------------------------- causal softmax

template <typename S>
__global__ void causal_softmax_forward_kernel(const S* scores, double scale, S* probs, i64 n) {
  using C = compute_t<S>;
  const i64 row = blockIdx.x, i = row % n;
  const S* sr = scores + row * n;
  S* pr = probs + row * n;
  const C sc = static_cast<C>(scale);
  C mx = -INFINITY;
  for (i64 j = threadIdx.x; j <= i; j += blockDim.x) mx = max(mx, sc * ld(sr[j]));
  mx = block_max(mx);
  double sum = 0;
  for (i64 j = threadIdx.x; j <= i; j += blockDim.x) sum += exp(sc * ld(sr[j]) - mx);
  const double inv = 1.0 / block_sum(sum);  // all reads of the row are done before any write (probs may alias)
  for (i64 j = threadIdx.x; j < n; j += blockDim.x)
    pr[j] = j <= i ? st<S>(static_cast<C>(exp(sc * ld(sr[j]) - mx)) * inv) : st<S>(C(0));
}

template <typename S>
__global__ void causal_softmax_backward_kernel(const S* dprobs, const S* probs, double scale, S* dscores, i64 n) {
  const i64 row = blockIdx.x, i = row % n;
  const S* dp = dprobs + row * n;
  const S* p = probs + row * n;
  S* ds = dscores + row * n;
  double dot = 0;
  for (i64 j = threadIdx.x; j <= i; j += blockDim.x) dot += static_cast<double>(ld(dp[j])) * ld(p[j]);
  dot = block_sum(dot);
  for (i64 j = threadIdx.x; j < n; j += blockDim.x)
    ds[j] = j <= i ? st<S>(scale * ld(p[j]) * (ld(dp[j]) - dot)) : st<S>(compute_t<S>(0));
}

// ---------------------------------------------------------------- dropout (Philox-4x32-10, as rng.cpp)

// out = dropout(y) (FUSED false), or out = residual + dropout(y + bias)
// (FUSED: bias-dropout-add). Each thread handles G consecutive elements of one
// [C*D] row (G = a 16-byte pack; a Philox block gives 4 values, so G/4 blocks,
// or one more when the row's global start is not a multiple of 4). VEC: packs
// are aligned and the row length is a multiple of G, so loads and stores are
// 16 bytes wide. The keep test compares the float uniform with the double p,
// as the CPU does, so the mask is the CPU's bit for bit.
template <typename S, bool VEC, bool FUSED>
__global__ void dropout_kernel(const S* y, const S* bias, const S* res, double p, PhiloxKey key,
                               kernels::DropoutLayout l, S* out, i64 inner, i64 cols, i64 groups_per_row,
                               i64 total_groups) {
  using C = compute_t<S>;
  constexpr int G = kVec<S> < 4 ? 4 : kVec<S>;
  const C keep_scale = static_cast<C>(p > 0 ? 1.0 / (1.0 - p) : 1.0);
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 g = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; g < total_groups; g += stride) {
    const i64 row = g / groups_per_row, k0 = (g % groups_per_row) * G;
    const i64 global_row = (l.a0 + row / l.B) * l.GB + l.b0 + row % l.B;
    const std::uint64_t base = static_cast<std::uint64_t>(global_row) * static_cast<std::uint64_t>(inner);
    const i64 e0 = row * inner + k0;
    S yv[G], rv[G];
    if constexpr (VEC) {
#pragma unroll
      for (int q = 0; q < G / kVec<S>; ++q) {
        const Pack<S> a = reinterpret_cast<const Pack<S>*>(y + e0)[q];
#pragma unroll
        for (int j = 0; j < kVec<S>; ++j) yv[q * kVec<S> + j] = a.v[j];
        if constexpr (FUSED) {
          const Pack<S> b = reinterpret_cast<const Pack<S>*>(res + e0)[q];
#pragma unroll
          for (int j = 0; j < kVec<S>; ++j) rv[q * kVec<S> + j] = b.v[j];
        }
      }
    } else {
      for (int j = 0; j < G && k0 + j < inner; ++j) {
        yv[j] = y[e0 + j];
        if constexpr (FUSED) rv[j] = res[e0 + j];
      }
    }
    std::uint64_t have = ~std::uint64_t{0};
    uint4 w{};
    i64 c = FUSED ? e0 % cols : 0;
#pragma unroll
    for (int j = 0; j < G; ++j) {
      if (!VEC && k0 + j >= inner) break;
      bool keep = true;
      if (p > 0) {
        const std::uint64_t idx = base + static_cast<std::uint64_t>(k0 + j);
        if ((idx >> 2) != have) {
          have = idx >> 2;
          w = philox(have, key);
        }
        keep = static_cast<double>(static_cast<float>(word(w, static_cast<unsigned>(idx & 3u)) >> 8) * 0x1p-24f) >= p;
      }
      if constexpr (FUSED) {
        const C v = keep ? (ld(yv[j]) + ld(bias[c])) * keep_scale : C(0);
        yv[j] = st<S>(ld(rv[j]) + v);
        if (++c == cols) c = 0;
      } else {
        yv[j] = keep ? st<S>(ld(yv[j]) * keep_scale) : st<S>(C(0));
      }
    }
    if constexpr (VEC) {
#pragma unroll
      for (int q = 0; q < G / kVec<S>; ++q) {
        Pack<S> pk;
#pragma unroll
        for (int j = 0; j < kVec<S>; ++j) pk.v[j] = yv[q * kVec<S> + j];
        reinterpret_cast<Pack<S>*>(out + e0)[q] = pk;
      }
    } else {
      for (int j = 0; j < G && k0 + j < inner; ++j) out[e0 + j] = yv[j];
    }
  }
}

// ---------------------------------------------------------------- causal softmax, one warp per row
// For rows of at most 32 * N elements (attention up to N = 32: 1024 tokens):
// the row is read once into registers and written once; sums in fp32.

template <typename S, int N>
__global__ void softmax_warp_forward_kernel(const S* scores, float scale, S* probs, i64 rows, i64 n) {
  const i64 row = static_cast<i64>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const i64 i = row % n;
  const S* sr = scores + row * n;
  S* pr = probs + row * n;
  float v[N];
  float mx = -INFINITY;
#pragma unroll
  for (int t = 0; t < N; ++t) {
    const i64 j = lane + 32 * t;
    v[t] = j <= i ? scale * ld(sr[j]) : -INFINITY;
    mx = fmaxf(mx, v[t]);
  }
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0;
#pragma unroll
  for (int t = 0; t < N; ++t) {
    const i64 j = lane + 32 * t;
    v[t] = j <= i ? expf(v[t] - mx) : 0.f;
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
__global__ void softmax_warp_backward_kernel(const S* dprobs, const S* probs, float scale, S* dscores, i64 rows,
                                             i64 n) {
  const i64 row = static_cast<i64>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const i64 i = row % n;
  const S* dp = dprobs + row * n;
  const S* p = probs + row * n;
  S* ds = dscores + row * n;
  float g[N], q[N];
  float dot = 0;
#pragma unroll
  for (int t = 0; t < N; ++t) {
    const i64 j = lane + 32 * t;
    g[t] = j <= i ? ld(dp[j]) : 0.f;
    q[t] = j <= i ? ld(p[j]) : 0.f;
    dot += g[t] * q[t];
  }
  for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
#pragma unroll
  for (int t = 0; t < N; ++t) {
    const i64 j = lane + 32 * t;
    if (j < n) ds[j] = st<S>(j <= i ? scale * q[t] * (g[t] - dot) : 0.f);
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

// ---------------------------------------------------------------- embeddings and cross-entropy

// ---------------------------------------------------------------- optimizer

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

// ---------------------------------------------------------------- strided copy

struct CopyGeometry {
  i64 shape[kMaxCopyDims];
  i64 src_stride[kMaxCopyDims];
  i64 dst_stride[kMaxCopyDims];
  int ndim;
};

template <typename A, typename B>
__device__ __forceinline__ B convert_value(A x) {
  if constexpr (std::is_same_v<A, B>)
    return x;
  else
    return st<B>(ld(x));
}

// Element offsets on both sides of the flat index `i` over dimensions [0, ndim).
__device__ __forceinline__ void offsets_of(const CopyGeometry& geo, int ndim, i64 i, i64& so, i64& dof) {
  so = dof = 0;
  for (int d = ndim - 1; d >= 0; --d) {
    const i64 idx = i % geo.shape[d];
    i /= geo.shape[d];
    so += idx * geo.src_stride[d];
    dof += idx * geo.dst_stride[d];
  }
}

template <typename A, typename B>
__global__ void strided_copy_kernel(const A* src, B* dst, CopyGeometry geo, i64 n) {
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    i64 so, dof;
    offsets_of(geo, geo.ndim, i, so, dof);
    dst[dof] = convert_value<A, B>(src[so]);
  }
}

// ---------------------------------------------------------------- fast paths for 16-bit and fp32 rows
// LayerNorm with the row held in registers: read once, written once, fp32
// statistics (the CPU takes them in double; the difference is rounding).
// P packs of kVec<S> values per thread; blockDim.x * P * kVec<S> >= cols.

template <typename S, int P>
__device__ __forceinline__ void load_row(const S* row, i64 cols, float (&v)[P * kVec<S>]) {
#pragma unroll
  for (int q = 0; q < P; ++q) {
    const i64 c0 = (static_cast<i64>(q) * blockDim.x + threadIdx.x) * kVec<S>;
    if (c0 < cols) {
      const Pack<S> pk = *reinterpret_cast<const Pack<S>*>(row + c0);
#pragma unroll
      for (int j = 0; j < kVec<S>; ++j) v[q * kVec<S> + j] = static_cast<float>(ld(pk.v[j]));
    } else {
#pragma unroll
      for (int j = 0; j < kVec<S>; ++j) v[q * kVec<S> + j] = 0.f;
    }
  }
}

template <typename S, int P>
__global__ void layernorm_forward_fast_kernel(const S* x, const S* gamma, const S* beta, float eps, S* y, float* mean,
                                              float* rstd, i64 cols) {
  constexpr int V = kVec<S>;
  const i64 r = blockIdx.x;
  float v[P * V];
  load_row<S, P>(x + r * cols, cols, v);
  float sum = 0;
#pragma unroll
  for (int k = 0; k < P * V; ++k) sum += v[k];
  const float m = block_sum(sum) / static_cast<float>(cols);
  float sq = 0;
#pragma unroll
  for (int q = 0; q < P; ++q) {
    const i64 c0 = (static_cast<i64>(q) * blockDim.x + threadIdx.x) * V;
    if (c0 < cols)
#pragma unroll
      for (int j = 0; j < V; ++j) sq += (v[q * V + j] - m) * (v[q * V + j] - m);
  }
  const float rs = 1.f / sqrtf(block_sum(sq) / static_cast<float>(cols) + eps);
#pragma unroll
  for (int q = 0; q < P; ++q) {
    const i64 c0 = (static_cast<i64>(q) * blockDim.x + threadIdx.x) * V;
    if (c0 >= cols) continue;
    const Pack<S> g = *reinterpret_cast<const Pack<S>*>(gamma + c0);
    const Pack<S> b = *reinterpret_cast<const Pack<S>*>(beta + c0);
    Pack<S> o;
#pragma unroll
    for (int j = 0; j < V; ++j) o.v[j] = st<S>((v[q * V + j] - m) * rs * ld(g.v[j]) + ld(b.v[j]));
    *reinterpret_cast<Pack<S>*>(y + r * cols + c0) = o;
  }
  if (threadIdx.x == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
}

template <typename S, int P>
__global__ void layernorm_backward_dx_fast_kernel(const S* dy, const S* x, const S* gamma, const float* mean,
                                                  const float* rstd, S* dx, const S* add, i64 cols) {
  constexpr int V = kVec<S>;
  const i64 r = blockIdx.x;
  float g[P * V], xh[P * V];
  load_row<S, P>(dy + r * cols, cols, g);
  load_row<S, P>(x + r * cols, cols, xh);
  const float m = mean[r], rs = rstd[r];
  float sg = 0, sgx = 0;
#pragma unroll
  for (int q = 0; q < P; ++q) {
    const i64 c0 = (static_cast<i64>(q) * blockDim.x + threadIdx.x) * V;
    if (c0 >= cols) continue;
    const Pack<S> gm = *reinterpret_cast<const Pack<S>*>(gamma + c0);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int k = q * V + j;
      g[k] *= ld(gm.v[j]);
      xh[k] = (xh[k] - m) * rs;
      sg += g[k];
      sgx += g[k] * xh[k];
    }
  }
  const float inv = 1.f / static_cast<float>(cols);
  const float mean_g = block_sum(sg) * inv, mean_gx = block_sum(sgx) * inv;
#pragma unroll
  for (int q = 0; q < P; ++q) {
    const i64 c0 = (static_cast<i64>(q) * blockDim.x + threadIdx.x) * V;
    if (c0 >= cols) continue;
    Pack<S> o, a{};
    if (add) a = *reinterpret_cast<const Pack<S>*>(add + r * cols + c0);
#pragma unroll
    for (int j = 0; j < V; ++j)
      o.v[j] = st<S>(rs * (g[q * V + j] - mean_g - xh[q * V + j] * mean_gx) + (add ? ld(a.v[j]) : 0.f));
    *reinterpret_cast<Pack<S>*>(dx + r * cols + c0) = o;
  }
}

// Picks P (packs per thread) for a row and launches with 128..512 threads;
// false when the fast path does not apply (fp64, unaligned, odd widths, huge rows).
template <typename S, typename Launch>
bool with_row_packs(i64 cols, std::initializer_list<const void*> ptrs, Launch&& launch) {
  if constexpr (std::is_same_v<S, double>) {
    return false;
  } else {
    constexpr int V = kVec<S>;
    if (cols % V != 0) return false;
    for (const void* p : ptrs)
      if (!aligned16(p)) return false;
    const i64 packs = cols / V;
    const unsigned threads = packs >= 2048 ? 512 : packs >= 512 ? 256 : 128;
    const i64 per = (packs + threads - 1) / threads;
    if (per <= 1) return launch(std::integral_constant<int, 1>{}, threads), true;
    if (per <= 2) return launch(std::integral_constant<int, 2>{}, threads), true;
    if (per <= 4) return launch(std::integral_constant<int, 4>{}, threads), true;
    if (per <= 8) return launch(std::integral_constant<int, 8>{}, threads), true;
    return false;
  }
}

// Column sums over rows with 16-byte loads: each thread owns one pack of
// columns over a chunk of rows (double accumulators), then column_finish_kernel
// adds the chunks in order. With LN, it also forms dy * xhat for dgamma in the
// same pass over dy.
template <typename S, bool LN>
__global__ void column_partial_packed_kernel(const S* dy, const S* x, const float* mean, const float* rstd, i64 rows,
                                             i64 cols, i64 rows_per_chunk, double* partial_b, double* partial_g) {
  constexpr int V = kVec<S>;
  const i64 q = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q * V >= cols) return;
  const i64 r0 = static_cast<i64>(blockIdx.y) * rows_per_chunk, r1 = min(rows, r0 + rows_per_chunk);
  double ab[V] = {}, ag[V] = {};
  for (i64 r = r0; r < r1; ++r) {
    const Pack<S> d = reinterpret_cast<const Pack<S>*>(dy + r * cols)[q];
    if constexpr (LN) {
      const Pack<S> xv = reinterpret_cast<const Pack<S>*>(x + r * cols)[q];
      const double m = mean[r], rs = rstd[r];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        ab[j] += ld(d.v[j]);
        ag[j] += static_cast<double>(ld(d.v[j])) * ((ld(xv.v[j]) - m) * rs);
      }
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) ab[j] += ld(d.v[j]);
    }
  }
  const i64 base = static_cast<i64>(blockIdx.y) * cols + q * V;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    partial_b[base + j] = ab[j];
    if constexpr (LN) partial_g[base + j] = ag[j];
  }
}

// dbeta (+= sum_r dy) and, with LN, dgamma (+= sum_r dy * xhat), packed; false
// when the fast path does not apply.
template <typename S, typename GB, typename GG>
bool packed_column_sums(const S* dy, const S* x, const float* mean, const float* rstd, i64 rows, i64 cols, GB* dbeta,
                        GG* dgamma, kernels::GpuScratch ws, cudaStream_t s) {
  if constexpr (std::is_same_v<S, double>) {
    return false;
  } else {
    constexpr int V = kVec<S>;
    if (cols == 0 || cols % V != 0 || !aligned16(dy) || (x && !aligned16(x)) || rows == 0) return false;
    const auto c = kernels::gpu_scratch::packed_column_chunks(rows, cols, V);
    if (c.used == 1) return false;  // one chunk: the plain path adds straight into the sums
    const i64 used = c.used, per_chunk = c.per_chunk;
    double* pb = scratch_as<double>(ws, static_cast<std::size_t>(used * cols * (dgamma ? 2 : 1)) * sizeof(double),
                                    "column sums");
    double* pg = dgamma ? pb + used * cols : nullptr;
    const dim3 grid(static_cast<unsigned>(c.col_blocks), static_cast<unsigned>(used));
    if (dgamma)
      column_partial_packed_kernel<S, true><<<grid, kThreads, 0, s>>>(dy, x, mean, rstd, rows, cols, per_chunk, pb, pg);
    else
      column_partial_packed_kernel<S, false>
          <<<grid, kThreads, 0, s>>>(dy, x, mean, rstd, rows, cols, per_chunk, pb, pg);
    check_launch("column sums");
    finish_columns(dbeta, cols, used, pb, s, "column sums");
    if (dgamma) finish_columns(dgamma, cols, used, pg, s, "column sums");
    return true;
  }
}

// ---------------------------------------------------------------- typed bodies
// (nvcc allows __device__ lambdas in function templates but not in generic
// lambdas, so the dtype dispatch calls these templates.)

template <typename S, typename G>
void layernorm_param_grads_t(const void* dy, const void* x, const void* mean, const void* rstd, void* dgamma, i64 rows,
                             i64 cols, kernels::GpuScratch ws, cudaStream_t s) {
  using C = compute_t<S>;
  const S* dyp = static_cast<const S*>(dy);
  const S* xp = static_cast<const S*>(x);
  const C* mp = static_cast<const C*>(mean);
  const C* rp = static_cast<const C*>(rstd);
  column_sum(
      static_cast<G*>(dgamma), rows, cols,
      [=] __device__(i64 r, i64 c) {
        return static_cast<double>(ld(dyp[r * cols + c])) *
               ((ld(xp[r * cols + c]) - static_cast<double>(mp[r])) * rp[r]);
      },
      ws, s, "layernorm_backward dgamma");
}

// dst[c] += sum_r src[r * cols + c] (bias gradients, LayerNorm's dbeta, position embeddings).
template <typename S, typename G>
void sum_rows_t(const void* src, void* dst, i64 rows, i64 cols, kernels::GpuScratch ws, cudaStream_t s,
                const char* what) {
  const S* g = static_cast<const S*>(src);
  if (packed_column_sums<S, G, G>(g, nullptr, nullptr, nullptr, rows, cols, static_cast<G*>(dst),
                                  static_cast<G*>(nullptr), ws, s))
    return;
  column_sum(
      static_cast<G*>(dst), rows, cols,
      [=] __device__(i64 r, i64 c) { return static_cast<double>(ld(g[r * cols + c])); }, ws, s, what);
}

template <typename S>
void gelu_forward_t(const void* x, void* y, i64 n, cudaStream_t s) {
  using C = compute_t<S>;
  map(
      static_cast<S*>(y), static_cast<const S*>(x), static_cast<const S*>(nullptr), n,
      [] __device__(C v, C, i64) { return gelu(v); }, s, "gelu_forward");
}

template <typename S>
void gelu_backward_t(const void* dy, const void* x, void* dx, i64 n, cudaStream_t s) {
  using C = compute_t<S>;
  map(
      static_cast<S*>(dx), static_cast<const S*>(dy), static_cast<const S*>(x), n,
      [] __device__(C g, C v, i64) { return g * gelu_grad(v); }, s, "gelu_backward");
}

template <typename S>
void bias_gelu_forward_t(const void* y, const void* bias, void* out, i64 rows, i64 cols, cudaStream_t s) {
  using C = compute_t<S>;
  periodic_map(
      static_cast<S*>(out), static_cast<const S*>(y), static_cast<const S*>(bias), rows * cols, cols,
      [] __device__(C v, C b) { return gelu(v + b); }, s, "bias_gelu_forward");
}

// bias_gelu_backward with 16-byte packs: each thread owns kVec<S> columns over
// a chunk of rows, loads a row's dy and y packs, writes its dx pack, and sums
// the rounded dx per column in double (column_finish_kernel adds the chunks).
template <typename S>
__global__ void bias_gelu_backward_packed_kernel(const S* dy, const S* y, const S* bias, S* dx, i64 rows, i64 cols,
                                                 i64 rows_per_chunk, double* partial) {
  constexpr int V = kVec<S>;
  const i64 q = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q * V >= cols) return;
  const i64 r0 = static_cast<i64>(blockIdx.y) * rows_per_chunk, r1 = min(rows, r0 + rows_per_chunk);
  const Pack<S> b = reinterpret_cast<const Pack<S>*>(bias)[q];
  double acc[V] = {};
  for (i64 r = r0; r < r1; ++r) {
    const Pack<S> d = reinterpret_cast<const Pack<S>*>(dy + r * cols)[q];
    const Pack<S> x = reinterpret_cast<const Pack<S>*>(y + r * cols)[q];
    Pack<S> o;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      o.v[j] = st<S>(ld(d.v[j]) * gelu_grad(ld(x.v[j]) + ld(b.v[j])));
      acc[j] += static_cast<double>(ld(o.v[j]));
    }
    reinterpret_cast<Pack<S>*>(dx + r * cols)[q] = o;
  }
  const i64 base = static_cast<i64>(blockIdx.y) * cols + q * V;
#pragma unroll
  for (int j = 0; j < V; ++j) partial[base + j] = acc[j];
}

// dx and dbias in one pass: packed when the row is whole packs and the
// pointers are aligned (scratch: column_sums_bytes covers both forms), else
// the column sum's term writes the rounded dx and returns it. Either way dbias
// sums exactly the values gelu_backward then bias_grad would.
template <typename S, typename G>
void bias_gelu_backward_t(const void* dy, const void* y, const void* bias, void* dx, void* dbias, i64 rows, i64 cols,
                          kernels::GpuScratch ws, cudaStream_t s) {
  const S* dyp = static_cast<const S*>(dy);
  const S* yp = static_cast<const S*>(y);
  const S* bp = static_cast<const S*>(bias);
  S* dxp = static_cast<S*>(dx);
  if (cols == 0) return;
  if constexpr (!std::is_same_v<S, double>) {
    constexpr int V = kVec<S>;
    const auto c = kernels::gpu_scratch::packed_column_chunks(rows, cols, V);
    if (rows > 0 && c.used > 1 && cols % V == 0 && aligned16(dy) && aligned16(y) && aligned16(bias) && aligned16(dx)) {
      double* partial =
          scratch_as<double>(ws, static_cast<std::size_t>(c.used * cols) * sizeof(double), "bias_gelu_backward");
      bias_gelu_backward_packed_kernel<S>
          <<<dim3(static_cast<unsigned>(c.col_blocks), static_cast<unsigned>(c.used)), kThreads, 0, s>>>(
              dyp, yp, bp, dxp, rows, cols, c.per_chunk, partial);
      check_launch("bias_gelu_backward");
      finish_columns(static_cast<G*>(dbias), cols, c.used, partial, s, "bias_gelu_backward");
      return;
    }
  }
  column_sum(
      static_cast<G*>(dbias), rows, cols,
      [=] __device__(i64 r, i64 c) {
        const i64 i = r * cols + c;
        const S v = st<S>(ld(dyp[i]) * gelu_grad(ld(yp[i]) + ld(bp[c])));
        dxp[i] = v;
        return static_cast<double>(ld(v));
      },
      ws, s, "bias_gelu_backward");
}

template <typename S, typename G>
void dropout_bias_grad_t(const void* dy, double p, const RngKey& key, const kernels::DropoutLayout& layout, void* dx,
                         void* dbias, i64 rows, i64 cols, kernels::GpuScratch ws, cudaStream_t s) {
  const auto c = kernels::gpu_scratch::dropout_column_chunks(rows, cols);
  double* partial =
      scratch_as<double>(ws, kernels::gpu_scratch::dropout_bias_grad_bytes(rows, cols), "dropout_backward_bias_grad");
  dropout_backward_partial_kernel<S>
      <<<dim3(static_cast<unsigned>(c.col_blocks), static_cast<unsigned>(c.used)), kThreads, 0, s>>>(
          static_cast<const S*>(dy), p, philox_key(key), layout, rows, cols, c.per_chunk, static_cast<S*>(dx), partial);
  check_launch("dropout_backward_bias_grad");
  finish_columns(static_cast<G*>(dbias), cols, c.used, partial, s, "dropout_backward_bias_grad");
}

// y[i] += b[i % period]: bias (period = cols) and position embeddings (period = seq * H).
template <typename S>
void add_periodic_t(void* y, const void* b, i64 n, i64 period, cudaStream_t s, const char* what) {
  using C = compute_t<S>;
  periodic_map(
      static_cast<S*>(y), static_cast<const S*>(y), static_cast<const S*>(b), n, period,
      [] __device__(C v, C p) { return v + p; }, s, what);
}

template <typename S>
void add_t(const void* a, const void* b, void* out, i64 n, cudaStream_t s) {
  using C = compute_t<S>;
  map(
      static_cast<S*>(out), static_cast<const S*>(a), static_cast<const S*>(b), n,
      [] __device__(C u, C v, i64) { return u + v; }, s, "add");
}

template <typename S>
void axpy_t(double alpha, const void* x, void* y, i64 n, cudaStream_t s) {
  using C = compute_t<S>;
  const C a = static_cast<C>(alpha);
  map(
      static_cast<S*>(y), static_cast<const S*>(y), static_cast<const S*>(x), n,
      [=] __device__(C u, C v, i64) { return u + a * v; }, s, "axpy");
}

template <typename S>
void scale_t(void* x, i64 n, double alpha, cudaStream_t s) {
  using C = compute_t<S>;
  const C a = static_cast<C>(alpha);
  map(
      static_cast<S*>(x), static_cast<const S*>(x), static_cast<const S*>(nullptr), n,
      [=] __device__(C v, C, i64) { return v * a; }, s, "scale");
}

template <typename S>
void embedding_forward_t(const std::int64_t* ids, const void* table, i64 vocab_start, i64 v, i64 h, void* out, i64 n,
                         cudaStream_t s) {
  const S* tab = static_cast<const S*>(table);
  elementwise(
      static_cast<S*>(out), n * h,
      [=] __device__(i64 i) {
        const i64 row = local_column(ids[i / h], vocab_start, v);
        return row >= 0 ? tab[row * h + i % h] : st<S>(compute_t<S>(0));
      },
      s, "embedding_forward");
}

// Rows of contiguous elements (the last dimension has unit stride on both
// sides: head splits and merges): one warp per row, whose offsets take one
// index decomposition instead of one per element.
template <typename A, typename B>
__global__ void row_copy_kernel(const A* src, B* dst, CopyGeometry geo, i64 rows, i64 inner) {
  const i64 row = static_cast<i64>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  i64 so, dof;
  offsets_of(geo, geo.ndim - 1, row, so, dof);
  for (i64 j = threadIdx.x & 31; j < inner; j += 32) dst[dof + j] = convert_value<A, B>(src[so + j]);
}

// Whether `stride` is the contiguous (row-major) layout of `geo.shape`.
bool contiguous_layout(const CopyGeometry& geo, const i64* stride) {
  i64 expect = 1;
  for (int d = geo.ndim - 1; d >= 0; --d) {
    if (geo.shape[d] != 1 && stride[d] != expect) return false;
    expect *= geo.shape[d];
  }
  return true;
}

template <typename A, typename B>
void launch_copy(const void* src, void* dst, const CopyGeometry& geo, i64 n, cudaStream_t s) {
  const int last = geo.ndim - 1;
  // Enough rows to give every SM warps; otherwise the element-wise kernel.
  if (last >= 0 && geo.shape[last] >= 16 && n / geo.shape[last] >= 1024 && geo.src_stride[last] == 1 &&
      geo.dst_stride[last] == 1) {
    const i64 rows = n / geo.shape[last];
    row_copy_kernel<A, B><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, s>>>(
        static_cast<const A*>(src), static_cast<B*>(dst), geo, rows, geo.shape[last]);
  } else {
    strided_copy_kernel<A, B>
        <<<blocks_for(n), kThreads, 0, s>>>(static_cast<const A*>(src), static_cast<B*>(dst), geo, n);
  }
}

}  // namespace

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

// ======================================================================= entry points

void layernorm_forward(DType t, const void* x, const void* gamma, const void* beta, double eps, void* y, void* mean,
                       void* rstd, i64 rows, i64 cols, cudaStream_t s) {
  if (rows == 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    const bool fast = with_row_packs<S>(cols, {x, gamma, beta, y}, [&](auto per, unsigned threads) {
      layernorm_forward_fast_kernel<S, decltype(per)::value><<<static_cast<unsigned>(rows), threads, 0, s>>>(
          static_cast<const S*>(x), static_cast<const S*>(gamma), static_cast<const S*>(beta), static_cast<float>(eps),
          static_cast<S*>(y), static_cast<float*>(mean), static_cast<float*>(rstd), cols);
    });
    if (!fast)
      layernorm_forward_kernel<S, C><<<static_cast<unsigned>(rows), row_threads(cols), 0, s>>>(
          static_cast<const S*>(x), static_cast<const S*>(gamma), static_cast<const S*>(beta), eps, static_cast<S*>(y),
          static_cast<C*>(mean), static_cast<C*>(rstd), cols);
  });
  check_launch("layernorm_forward");
}

void layernorm_backward(DType t, const void* dy, const void* x, const void* gamma, const void* mean, const void* rstd,
                        void* dx, void* dgamma, DType dgamma_type, void* dbeta, DType dbeta_type, const void* add,
                        i64 rows, i64 cols, kernels::GpuScratch ws, cudaStream_t s) {
  // Parameter gradients first: dx may overwrite dy. One packed pass over dy
  // and x for both when the accumulators are fp32 (Megatron's main grads).
  bool fused = false;
  if (dgamma_type == dbeta_type && t != DType::F64) {
    with_storage(t, [&](auto tag) {
      using S = decltype(tag);
      if constexpr (!std::is_same_v<S, double>) {
        const auto run = [&](auto acc) {
          using G = decltype(acc);
          fused = packed_column_sums<S, G, G>(static_cast<const S*>(dy), static_cast<const S*>(x),
                                              static_cast<const float*>(mean), static_cast<const float*>(rstd), rows,
                                              cols, static_cast<G*>(dbeta), static_cast<G*>(dgamma), ws, s);
        };
        if (dgamma_type == DType::F32)
          run(float{});
        else
          run(S{});
      }
    });
  }
  if (!fused) {
    // One after the other on the stream, so they share the scratch.
    MZ_BY_STORAGE_AND_ACC(t, dgamma_type, layernorm_param_grads_t, dy, x, mean, rstd, dgamma, rows, cols, ws, s);
    MZ_BY_STORAGE_AND_ACC(t, dbeta_type, sum_rows_t, dy, dbeta, rows, cols, ws, s, "layernorm_backward dbeta");
  }
  if (rows == 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    const bool fast = with_row_packs<S>(cols, {dy, x, gamma, dx, add ? add : dx}, [&](auto per, unsigned threads) {
      layernorm_backward_dx_fast_kernel<S, decltype(per)::value><<<static_cast<unsigned>(rows), threads, 0, s>>>(
          static_cast<const S*>(dy), static_cast<const S*>(x), static_cast<const S*>(gamma),
          static_cast<const float*>(mean), static_cast<const float*>(rstd), static_cast<S*>(dx),
          static_cast<const S*>(add), cols);
    });
    if (!fast)
      layernorm_backward_dx_kernel<S, C><<<static_cast<unsigned>(rows), row_threads(cols), 0, s>>>(
          static_cast<const S*>(dy), static_cast<const S*>(x), static_cast<const S*>(gamma),
          static_cast<const C*>(mean), static_cast<const C*>(rstd), static_cast<S*>(dx), static_cast<const S*>(add),
          cols);
  });
  check_launch("layernorm_backward");
}

void gelu_forward(DType t, const void* x, void* y, i64 n, cudaStream_t s) {
  MZ_BY_STORAGE(t, gelu_forward_t, x, y, n, s);
}

void gelu_backward(DType t, const void* dy, const void* x, void* dx, i64 n, cudaStream_t s) {
  MZ_BY_STORAGE(t, gelu_backward_t, dy, x, dx, n, s);
}

void dropout_backward_bias_grad(DType t, const void* dy, double p, const RngKey& key,
                                const kernels::DropoutLayout& layout, void* dx, void* dbias, DType dbias_type, i64 rows,
                                i64 cols, kernels::GpuScratch ws, cudaStream_t s) {
  if (cols == 0) return;
  MZ_BY_STORAGE_AND_ACC(t, dbias_type, dropout_bias_grad_t, dy, p, key, layout, dx, dbias, rows, cols, ws, s);
}

void bias_gelu_forward(DType t, const void* y, const void* bias, void* out, i64 rows, i64 cols, cudaStream_t s) {
  MZ_BY_STORAGE(t, bias_gelu_forward_t, y, bias, out, rows, cols, s);
}

void bias_gelu_backward(DType t, const void* dy, const void* y, const void* bias, void* dx, void* dbias,
                        DType dbias_type, i64 rows, i64 cols, kernels::GpuScratch ws, cudaStream_t s) {
  MZ_BY_STORAGE_AND_ACC(t, dbias_type, bias_gelu_backward_t, dy, y, bias, dx, dbias, rows, cols, ws, s);
}

void add_bias(DType t, void* y, const void* bias, i64 rows, i64 cols, cudaStream_t s) {
  MZ_BY_STORAGE(t, add_periodic_t, y, bias, rows * cols, cols, s, "add_bias");
}

void bias_grad(DType t, const void* dy, void* dbias, DType dbias_type, i64 rows, i64 cols, kernels::GpuScratch ws,
               cudaStream_t s) {
  MZ_BY_STORAGE_AND_ACC(t, dbias_type, sum_rows_t, dy, dbias, rows, cols, ws, s, "bias_grad");
}

void add(DType t, const void* a, const void* b, void* out, i64 n, cudaStream_t s) {
  MZ_BY_STORAGE(t, add_t, a, b, out, n, s);
}

void axpy(DType t, double alpha, const void* x, void* y, i64 n, cudaStream_t s) {
  MZ_BY_STORAGE(t, axpy_t, alpha, x, y, n, s);
}

void scale_elements(DType t, void* x, i64 n, double alpha, cudaStream_t s) {
  MZ_BY_STORAGE(t, scale_t, x, n, alpha, s);
}

void causal_softmax_forward(DType t, const void* scores, double scale, void* probs, i64 mats, i64 n, cudaStream_t s) {
  if (mats * n == 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    const i64 rows = mats * n;
    const bool warp = with_warp_width<S>(n, [&](auto width) {
      softmax_warp_forward_kernel<S, decltype(width)::value><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, s>>>(
          static_cast<const S*>(scores), static_cast<float>(scale), static_cast<S*>(probs), rows, n);
    });
    if (!warp)
      causal_softmax_forward_kernel<S><<<static_cast<unsigned>(rows), row_threads(n), 0, s>>>(
          static_cast<const S*>(scores), scale, static_cast<S*>(probs), n);
  });
  check_launch("causal_softmax_forward");
}

void causal_softmax_backward(DType t, const void* dprobs, const void* probs, double scale, void* dscores, i64 mats,
                             i64 n, cudaStream_t s) {
  if (mats * n == 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    const i64 rows = mats * n;
    const bool warp = with_warp_width<S>(n, [&](auto width) {
      softmax_warp_backward_kernel<S, decltype(width)::value><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, s>>>(
          static_cast<const S*>(dprobs), static_cast<const S*>(probs), static_cast<float>(scale),
          static_cast<S*>(dscores), rows, n);
    });
    if (!warp)
      causal_softmax_backward_kernel<S><<<static_cast<unsigned>(rows), row_threads(n), 0, s>>>(
          static_cast<const S*>(dprobs), static_cast<const S*>(probs), scale, static_cast<S*>(dscores), n);
  });
  check_launch("causal_softmax_backward");
}

void dropout(DType t, const void* in, double p, const RngKey& key, const kernels::DropoutLayout& layout, void* out,
             cudaStream_t s) {
  const i64 inner = layout.C * layout.D, rows = layout.A * layout.B;
  if (inner * rows == 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    if (p == 0.0) {
      if (in != out)
        MZ_CHECK(cudaMemcpyAsync(out, in, static_cast<std::size_t>(inner * rows) * sizeof(S), cudaMemcpyDeviceToDevice,
                                 s) == cudaSuccess,
                 "dropout: device copy failed");
      return;
    }
    constexpr int G = kVec<S> < 4 ? 4 : kVec<S>;
    const i64 groups = (inner + G - 1) / G;
    const unsigned blocks = blocks_for(rows * groups);
    const S* x = static_cast<const S*>(in);
    const auto launch = [&](auto vec) {
      dropout_kernel<S, decltype(vec)::value, false><<<blocks, kThreads, 0, s>>>(
          x, nullptr, nullptr, p, philox_key(key), layout, static_cast<S*>(out), inner, 1, groups, rows * groups);
    };
    if (inner % G == 0 && aligned16(in) && aligned16(out))
      launch(std::true_type{});
    else
      launch(std::false_type{});
  });
  check_launch("dropout");
}

void bias_dropout_add(DType t, const void* y, const void* bias, const void* residual, double p, const RngKey& key,
                      const kernels::DropoutLayout& layout, void* out, i64 cols, cudaStream_t s) {
  const i64 inner = layout.C * layout.D, rows = layout.A * layout.B;
  if (inner * rows == 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    constexpr int G = kVec<S> < 4 ? 4 : kVec<S>;
    const i64 groups = (inner + G - 1) / G;
    const unsigned blocks = blocks_for(rows * groups);
    const auto* yp = static_cast<const S*>(y);
    const auto* bp = static_cast<const S*>(bias);
    const auto* rp = static_cast<const S*>(residual);
    auto* op = static_cast<S*>(out);
    const auto launch = [&](auto vec) {
      dropout_kernel<S, decltype(vec)::value, true>
          <<<blocks, kThreads, 0, s>>>(yp, bp, rp, p, philox_key(key), layout, op, inner, cols, groups, rows * groups);
    };
    if (inner % G == 0 && aligned16(y) && aligned16(residual) && aligned16(out))
      launch(std::true_type{});
    else
      launch(std::false_type{});
  });
  check_launch("bias_dropout_add");
}

void embedding_forward(DType t, const std::int64_t* ids, const void* table, i64 vocab_start, i64 v, i64 h, void* out,
                       i64 n, cudaStream_t s) {
  MZ_BY_STORAGE(t, embedding_forward_t, ids, table, vocab_start, v, h, out, n, s);
}

void embedding_backward(DType t, const std::int64_t* ids, const void* dout, i64 vocab_start, i64 n, i64 v, i64 h,
                        void* dtable, DType dtable_type, kernels::GpuScratch ws, cudaStream_t s) {
  if (n == 0 || h == 0) return;
  MZ_CHECK(n < (i64{1} << 31) && v < (i64{1} << 31) - 1, "embedding_backward: ", n, " tokens or ", v,
           " rows exceed the 32-bit sort keys");
  int end_bit = 1;  // keys are in [0, v]
  while (end_bit < 31 && (i64{1} << end_bit) <= v) ++end_bit;
  const int items = static_cast<int>(n);
  // The sort's workspace first (256-byte aligned), then the four lists: the
  // keys and token indices, each double-buffered (the sort may leave its
  // result in either buffer).
  char* base = scratch_as<char>(ws, kernels::gpu_scratch::embedding_sort_bytes(n), "embedding_backward");
  const std::size_t lists_at = kernels::gpu_scratch::embedding_sort_lists_offset(n);
  int* lists = reinterpret_cast<int*>(base + lists_at);
  cub::DoubleBuffer<int> keys(lists, lists + n), tokens(lists + 2 * n, lists + 3 * n);
  std::size_t sort_bytes = 0;
  check_call(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, tokens, items, 0, end_bit, s),
             "embedding_backward: sort size");
  MZ_CHECK(sort_bytes <= lists_at, "embedding_backward: CUB's radix sort wants ", sort_bytes,
           " bytes of workspace for ", n, " tokens, more than the ", lists_at,
           " of megazero/kernels/gpu_scratch.cpp's bound (embedding_sort_lists_offset): raise the bound");
  embedding_keys_kernel<<<blocks_for(n), kThreads, 0, s>>>(ids, vocab_start, v, n, keys.Current(), tokens.Current());
  check_launch("embedding_backward keys");
  check_call(cub::DeviceRadixSort::SortPairs(base, sort_bytes, keys, tokens, items, 0, end_bit, s),
             "embedding_backward: sort");
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    with_accumulator<S>(dtable_type, [&](auto acc) {
      using G = decltype(acc);
      embedding_backward_runs_kernel<S, G><<<static_cast<unsigned>(n), row_threads(h), 0, s>>>(
          static_cast<const S*>(dout), keys.Current(), tokens.Current(), n, v, h, static_cast<G*>(dtable));
    });
  });
  check_launch("embedding_backward");
}

void add_position_embedding(DType t, void* out, const void* pos, i64 numel, i64 per_sample, cudaStream_t s) {
  MZ_BY_STORAGE(t, add_periodic_t, out, pos, numel, per_sample, s, "add_position_embedding");
}

void position_embedding_backward(DType t, const void* dout, i64 batch, i64 per_sample, void* dpos, DType dpos_type,
                                 kernels::GpuScratch ws, cudaStream_t s) {
  MZ_BY_STORAGE_AND_ACC(t, dpos_type, sum_rows_t, dout, dpos, batch, per_sample, ws, s, "position_embedding_backward");
}

void cross_entropy_forward(DType t, void* logits, const std::int64_t* targets, i64 vocab_start, i64 rows, i64 cols,
                           i64 valid, void* row_max, void* sum_exp, void* target_logit, cudaStream_t s) {
  if (rows == 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    cross_entropy_forward_kernel<S><<<static_cast<unsigned>(rows), 512, 0, s>>>(
        static_cast<S*>(logits), targets, vocab_start, cols, valid, static_cast<C*>(row_max), static_cast<C*>(sum_exp),
        static_cast<C*>(target_logit));
  });
  check_launch("cross_entropy_forward");
}

namespace {
// (Typed bodies, not generic lambdas: nvcc allows no __device__ lambda there.)
template <typename C>
void rescale_sum_exp_t(const void* row_max, const void* global_max, i64 rows, void* sum_exp, cudaStream_t s) {
  const C* m = static_cast<const C*>(row_max);
  const C* g = static_cast<const C*>(global_max);
  C* se = static_cast<C*>(sum_exp);
  // A slice of only padding (sum 0, max -inf) stays 0.
  elementwise(
      se, rows,
      [=] __device__(i64 r) {
        return se[r] == C(0) ? C(0)
                             : static_cast<C>(static_cast<double>(se[r]) *
                                              exp(static_cast<double>(m[r]) - static_cast<double>(g[r])));
      },
      s, "rescale_sum_exp");
}

template <typename C>
void cross_entropy_loss_t(const void* global_max, const void* sum_exp, const void* target_logit, i64 rows, void* loss,
                          cudaStream_t s) {
  const C* m = static_cast<const C*>(global_max);
  const C* se = static_cast<const C*>(sum_exp);
  const C* tl = static_cast<const C*>(target_logit);
  elementwise(
      static_cast<C*>(loss), rows,
      [=] __device__(i64 r) {
        return static_cast<C>(log(static_cast<double>(se[r])) + static_cast<double>(m[r]) - static_cast<double>(tl[r]));
      },
      s, "cross_entropy_loss");
}
}  // namespace

void rescale_sum_exp(DType stat, const void* row_max, const void* global_max, i64 rows, void* sum_exp, cudaStream_t s) {
  if (stat == DType::F64)
    rescale_sum_exp_t<double>(row_max, global_max, rows, sum_exp, s);
  else
    rescale_sum_exp_t<float>(row_max, global_max, rows, sum_exp, s);
}

void cross_entropy_loss(DType stat, const void* global_max, const void* sum_exp, const void* target_logit, i64 rows,
                        void* loss, cudaStream_t s) {
  if (stat == DType::F64)
    cross_entropy_loss_t<double>(global_max, sum_exp, target_logit, rows, loss, s);
  else
    cross_entropy_loss_t<float>(global_max, sum_exp, target_logit, rows, loss, s);
}

void cross_entropy_backward(DType t, const void* exp_logits, const void* row_max, const void* global_max,
                            const void* sum_exp, const std::int64_t* targets, i64 vocab_start, i64 rows, i64 cols,
                            i64 valid, double scale, void* dlogits, cudaStream_t s) {
  if (rows == 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    cross_entropy_backward_kernel<S><<<static_cast<unsigned>(rows), 512, 0, s>>>(
        static_cast<const S*>(exp_logits), static_cast<const C*>(row_max), static_cast<const C*>(global_max),
        static_cast<const C*>(sum_exp), targets, vocab_start, cols, valid, scale, static_cast<S*>(dlogits));
  });
  check_launch("cross_entropy_backward");
}

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

void strided_copy(const void* src, DType src_type, const i64* src_strides, void* dst, DType dst_type,
                  const i64* dst_strides, const i64* shape, int ndim, cudaStream_t s) {
  MZ_CHECK(ndim >= 0 && ndim <= kMaxCopyDims, "strided copy of ", ndim, " dimensions (at most ", kMaxCopyDims, ")");
  CopyGeometry geo{};
  geo.ndim = ndim;
  i64 n = 1;
  for (int d = 0; d < ndim; ++d) {
    geo.shape[d] = shape[d];
    geo.src_stride[d] = src_strides[d];
    geo.dst_stride[d] = dst_strides[d];
    n *= shape[d];
  }
  if (n == 0) return;
  if (contiguous_layout(geo, geo.src_stride) && contiguous_layout(geo, geo.dst_stride)) {
    // Flat (fp32 master weights into 16-bit parameters): a device memcpy or the plain cast kernel,
    // which rounds as the host's megazero::convert does.
    if (src_type == dst_type)
      MZ_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * dtype_size(src_type), cudaMemcpyDeviceToDevice,
                               s) == cudaSuccess,
               "strided copy: device copy failed");
    else
      convert(src, src_type, dst, dst_type, static_cast<std::size_t>(n), s);
    return;
  }
  if (src_type == dst_type && !is_floating(src_type)) {  // ids and other integers: a byte-exact move
    const auto launch = [&](auto tag) {
      using T = decltype(tag);
      launch_copy<T, T>(src, dst, geo, n, s);
    };
    switch (dtype_size(src_type)) {
      case 1:
        launch(std::uint8_t{});
        break;
      case 2:
        launch(std::uint16_t{});
        break;
      case 4:
        launch(std::uint32_t{});
        break;
      default:
        launch(std::uint64_t{});
        break;
    }
    check_launch("strided copy");
    return;
  }
  with_storage(src_type, [&](auto a) {
    using A = decltype(a);
    with_storage(dst_type, [&](auto b) {
      using B = decltype(b);
      launch_copy<A, B>(src, dst, geo, n, s);
    });
  });
  check_launch("strided copy");
}

}  // namespace megazero::cuda
