// The device kernels of the vocabulary-parallel embedding gradient and
// cross-entropy (their launchers: embedding.cu and cross_entropy.cu; contracts:
// megazero/kernels/embedding.h and cross_entropy.h). Kept apart, kernels only, so that
// tests/cuda_emulation can run them on the CPU as they are.
#pragma once

#include <cstdint>

#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/packs.cuh"

namespace megazero::cuda::detail_k {

__device__ __forceinline__ i64 local_column(std::int64_t target, i64 vocab_start, i64 valid) {
  const i64 c = target - vocab_start;
  return c >= 0 && c < valid ? c : -1;
}

// The embedding gradient without a host round trip: the (local row, token)
// pairs are radix-sorted on the device (stable, so each row's tokens stay in
// token order), and the first position of each row's run sums the run. The
// CPU kernel's order, no atomics: runs repeat bit for bit.
static __global__ void embedding_keys_kernel(const std::int64_t* ids, i64 vocab_start, i64 v, i64 n, int* keys,
                                             int* tokens) {
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const i64 c = local_column(ids[i], vocab_start, v);
    keys[i] = static_cast<int>(c >= 0 ? c : v);  // v: held by another rank, sorts last and is skipped
    tokens[i] = static_cast<int>(i);
  }
}

// Columns of the table a thread of embedding_backward_runs_kernel adds: the
// block covers blockDim.x * kEmbeddingColumnsPerThread of them (gridDim.y
// tiles span the row), so a frequent token's long run is spread over many
// blocks instead of walked by one.
constexpr int kEmbeddingColumnsPerThread = 4;

// One block per (sorted position, tile of columns); only the first position
// of a run does any work: it adds the run's gradient rows, in sorted (token)
// order — the CPU's order, so the sums are its bits — to its tile of the
// table row. The run's end is found by binary search over the sorted keys, so
// the loop over the run has a known trip count and its loads (several columns
// a thread) need not wait for one another.
template <typename S, typename G>
__global__ void embedding_backward_runs_kernel(const S* g, const int* keys, const int* tokens, i64 n, i64 v, i64 h,
                                               G* dt) {
  constexpr int Q = kEmbeddingColumnsPerThread;
  const i64 j = blockIdx.x;
  const int row = keys[j];
  if (row >= v || (j > 0 && keys[j - 1] == row)) return;
  i64 lo = j + 1, hi = n;  // the first position past the run
  while (lo < hi) {
    const i64 mid = lo + (hi - lo) / 2;
    if (keys[mid] == row)
      lo = mid + 1;
    else
      hi = mid;
  }
  const i64 end = lo;
  const i64 c0 = static_cast<i64>(blockIdx.y) * blockDim.x * Q + threadIdx.x;
  G* out = dt + static_cast<i64>(row) * h;
  compute_t<G> acc[Q];
#pragma unroll
  for (int q = 0; q < Q; ++q) {
    const i64 c = c0 + static_cast<i64>(q) * blockDim.x;
    acc[q] = c < h ? ld(out[c]) : compute_t<G>(0);
  }
  for (i64 k = j; k < end; ++k) {
    const S* src = g + static_cast<i64>(tokens[k]) * h;
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      const i64 c = c0 + static_cast<i64>(q) * blockDim.x;
      if (c < h) acc[q] += ld(src[c]);
    }
  }
#pragma unroll
  for (int q = 0; q < Q; ++q) {
    const i64 c = c0 + static_cast<i64>(q) * blockDim.x;
    if (c < h) out[c] = st<G>(acc[q]);
  }
}

// One block per row, each thread loading V adjacent logits at a time (the
// launcher picks V = kVec<S> when cols is whole 16-byte packs and the rows are
// aligned, else 1). The row is read once and nothing is written over it: each
// thread keeps a running max and the sum of exp(logit - that max), rescaling
// the sum (in double) when a pack raises the max; the threads' sums are then
// rescaled to the row's max and added. (Two sweeps read a GPT-2 row of 100 KB
// twice and wrote it once, with ~500 rows in flight: more than L2 holds.)
// Returns the row's max (every thread) and sum (double, every thread). With
// `kept`, each pack read is also stored there at its index (the fused kernel's
// copy of the row in shared memory).
template <typename S, int V>
__device__ __forceinline__ compute_t<S> row_max_and_sum(const Vec<S, V>* pr, i64 packs, i64 valid, double& sum_out,
                                                        Vec<S, V>* kept) {
  using C = compute_t<S>;
  using P = Vec<S, V>;
  C mx = -INFINITY;  // a slice of only padding contributes nothing
  double sum = 0;
  // The next pack is loaded before this one's exponentials are computed (in
  // float, added in double: compute the H200 did not overlap with the reads,
  // 2049 GB/s over GPT-2's [8192, 50304] logits), so a thread keeps a load in
  // flight while it computes.
  const i64 step = blockDim.x;
  i64 q = threadIdx.x;
  P next{};
  if (q < packs) next = pr[q];
  for (; q < packs; q += step) {
    const P p = next;
    if (q + step < packs) next = pr[q + step];
    if (kept) kept[q] = p;
    C pm = -INFINITY;
#pragma unroll
    for (int j = 0; j < V; ++j)
      if (q * V + j < valid) pm = max(pm, ld(p.v[j]));
    if (pm > mx) {  // rare after the first packs; exp(-inf) = 0 the first time
      sum *= exp(static_cast<double>(mx) - static_cast<double>(pm));
      mx = pm;
    }
#pragma unroll
    for (int j = 0; j < V; ++j)
      if (q * V + j < valid) sum += exp(ld(p.v[j]) - mx);
  }
  const C row = block_max(mx);
  sum = mx == -INFINITY ? 0.0 : sum * exp(static_cast<double>(mx) - static_cast<double>(row));
  sum_out = block_sum(sum);
  return row;
}

template <typename S, int V>
__global__ void cross_entropy_forward_kernel(const S* logits, const std::int64_t* targets, i64 vocab_start, i64 cols,
                                             i64 valid, compute_t<S>* row_max, compute_t<S>* sum_exp,
                                             compute_t<S>* target_logit) {
  using C = compute_t<S>;
  using P = Vec<S, V>;
  const i64 r = blockIdx.x, packs = cols / V;
  const S* lr = logits + r * cols;
  if (threadIdx.x == 0) {
    const i64 t = local_column(targets[r], vocab_start, valid);
    target_logit[r] = t >= 0 ? ld(lr[t]) : C(0);  // 0: the all-reduce sums over ranks
  }
  double sum;
  const C row = row_max_and_sum<S, V>(reinterpret_cast<const P*>(lr), packs, valid, sum, nullptr);
  if (threadIdx.x == 0) {
    row_max[r] = row;
    sum_exp[r] = static_cast<C>(sum);
  }
}

// The gradient of one row from its packs `src` (the logits, or the fused
// kernel's copy of them) into `dst`: the CPU kernel's expression, operation
// for operation — exp(logit - gm) in the compute type, times f = scale /
// sum_exp in double, the target's column (t, -1 off the slice) `target_grad`,
// padding 0. A thread writes only the packs it reads.
template <typename S, int V>
__device__ __forceinline__ void write_row_gradient(const Vec<S, V>* src, Vec<S, V>* dst, i64 packs, i64 valid, i64 t,
                                                   compute_t<S> gm, double f, double target_grad) {
  using C = compute_t<S>;
  using P = Vec<S, V>;
  for (i64 q = threadIdx.x; q < packs; q += blockDim.x) {
    const P e = src[q];
    P d;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const i64 c = q * V + j;
      if (c >= valid)
        d.v[j] = st<S>(C(0));
      else if (c == t)
        d.v[j] = st<S>(target_grad);
      else
        d.v[j] = st<S>(static_cast<double>(exp(ld(e.v[j]) - gm)) * f);
    }
    dst[q] = d;
  }
}

// V as for the forward. The softmax's exponentials are recomputed from the
// logits, exp(logit - global_max) in the compute type, and scaled in double.
template <typename S, int V>
__global__ void cross_entropy_backward_kernel(const S* logits, const compute_t<S>* global_max,
                                              const compute_t<S>* sum_exp, const std::int64_t* targets, i64 vocab_start,
                                              i64 cols, i64 valid, double scale, const compute_t<S>* weight,
                                              S* dlogits) {
  using C = compute_t<S>;
  using P = Vec<S, V>;
  const i64 r = blockIdx.x, packs = cols / V;
  const S* lr = logits + r * cols;
  const double row_scale = weight ? scale * static_cast<double>(weight[r]) : scale;
  const double f = row_scale / static_cast<double>(sum_exp[r]);
  const C gm = global_max[r];
  const i64 t = local_column(targets[r], vocab_start, valid);
  // Every thread reads the target's logit before any thread writes (dlogits may alias the logits).
  const double target_grad = t >= 0 ? static_cast<double>(exp(ld(lr[t]) - gm)) * f - row_scale : 0.0;
  __syncthreads();
  write_row_gradient<S, V>(reinterpret_cast<const P*>(lr), reinterpret_cast<P*>(dlogits + r * cols), packs, valid, t,
                           gm, f, target_grad);
}

// The forward and the backward of a row in one pass, for a slice that is the
// whole vocabulary (tensor parallel size 1: the row's max and sum are the
// global ones, no all-reduce between them). The forward kernel's statistics,
// then the backward kernel's gradient with global_max = the row's max and
// sum_exp = the rounded sum: both kernels' bits. The row is read from memory
// once: each thread keeps the packs it reads in the block's dynamic shared
// memory (cols * sizeof(S) bytes) and computes its gradient from them, where
// the two kernels read the [N, V] logits twice (GPT-2's 824 MB at B=8). The
// target's logit is read by every thread before the reductions' barriers, so
// dlogits may alias the logits.
template <typename S, int V>
__global__ void cross_entropy_fused_kernel(const S* logits, const std::int64_t* targets, i64 vocab_start, i64 cols,
                                           i64 valid, double scale, const compute_t<S>* weight, compute_t<S>* row_max,
                                           compute_t<S>* sum_exp, compute_t<S>* target_logit, S* dlogits) {
  using C = compute_t<S>;
  using P = Vec<S, V>;
  const i64 r = blockIdx.x, packs = cols / V;
  const S* lr = logits + r * cols;
  const i64 t = local_column(targets[r], vocab_start, valid);
  const C tl = t >= 0 ? ld(lr[t]) : C(0);
  P* kept = dynamic_shared<P>();
  double sum;
  const C row = row_max_and_sum<S, V>(reinterpret_cast<const P*>(lr), packs, valid, sum, kept);
  const C se = static_cast<C>(sum);
  if (threadIdx.x == 0) {
    row_max[r] = row;
    sum_exp[r] = se;
    target_logit[r] = tl;
  }
  const double row_scale = weight ? scale * static_cast<double>(weight[r]) : scale;
  const double f = row_scale / static_cast<double>(se);
  const double target_grad = t >= 0 ? static_cast<double>(exp(tl - row)) * f - row_scale : 0.0;
  write_row_gradient<S, V>(kept, reinterpret_cast<P*>(dlogits + r * cols), packs, valid, t, row, f, target_grad);
}

}  // namespace megazero::cuda::detail_k
