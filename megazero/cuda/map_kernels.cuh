// Periodic maps, out[i] = round(f(a[i], p[i % period])), for a periodic
// operand p (a bias: period = cols; position embeddings: seq * H): the
// kernels only (launched by layer_helpers.cuh's periodic_map), plain enough
// for tests/cuda_emulation to run them as they are.
#pragma once

#include <cstdint>

#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/packs.cuh"

namespace megazero::cuda::detail_k {

// The period is whole packs, so each pack has one p pack. A thread's packs
// are t, t + stride, ...: their p pack advances by stride mod period_packs
// with one wrap (one division a thread, not one a pack: the GPU emulates
// 64-bit division in software), and the next pack of a is loaded before this
// one is computed, so a thread keeps a load in flight while it computes (the
// bias-GeLU forward's tanh). out may be a: the next pack is other elements.
template <typename S, typename F>
__global__ void periodic_map_kernel(S* out, const S* a, const S* p, i64 packs, i64 period_packs, F f) {
  constexpr int V = kVec<S>;
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  i64 t = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= packs) return;
  const Pack<S>* A = reinterpret_cast<const Pack<S>*>(a);
  const Pack<S>* Pp = reinterpret_cast<const Pack<S>*>(p);
  i64 q = t % period_packs;
  const i64 dq = stride % period_packs;
  Pack<S> next = A[t];
  for (; t < packs; t += stride) {
    const Pack<S> pa = next;
    if (t + stride < packs) next = A[t + stride];
    const Pack<S> pp = Pp[q];
    Pack<S> po;
#pragma unroll
    for (int j = 0; j < V; ++j) po.v[j] = st<S>(f(ld(pa.v[j]), ld(pp.v[j])));
    reinterpret_cast<Pack<S>*>(out)[t] = po;
    q += dq;
    if (q >= period_packs) q -= period_packs;
  }
}

// The same with a scalar loop (unaligned pointers, a period of partial packs).
template <typename S, typename F>
__global__ void periodic_map_scalar_kernel(S* out, const S* a, const S* p, i64 n, i64 period, F f) {
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = st<S>(f(ld(a[i]), ld(p[i % period])));
}

}  // namespace megazero::cuda::detail_k
