// LayerNorm's fast forward (a row in registers: read once, written once,
// fp32 statistics; the CPU takes them in double, the difference is rounding),
// optionally with the bias-dropout-add that ends the sub-block before it in
// the same pass. Kernels only (the launcher: layernorm.cu), for
// tests/cuda_emulation too. P packs of kVec<S> values per thread; blockDim.x
// * P * kVec<S> >= cols; one block a row.
#pragma once

#include <cstdint>

#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/packs.cuh"
#include "megazero/cuda/row_mask.cuh"

namespace megazero::cuda::detail_k {

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

// The bias-dropout-add before the LayerNorm (a transformer layer's attention
// output: x1 = residual + dropout(y + bias), LN2's input), done as the row is
// loaded: sum = residual + dropout(y + bias) with bias_dropout_add's mask
// (RowMask), formula and rounding, written to `sum` (may alias y or the
// residual: a thread reads its packs before writing them), and the row the
// LayerNorm normalises is sum's rounded values, so the output is the plain
// kernel's on sum bit for bit. Saves the LayerNorm's read of x1 and a launch
// a layer (512 MB at the 100B layer's [32768, 8192]). bias is [cols].
template <typename S>
struct RowBiasDropoutAdd {
  const S* residual = nullptr;
  const S* bias = nullptr;
  S* sum = nullptr;
  RowMask<S> mask;
};

template <typename S, int P>
__device__ __forceinline__ void bias_dropout_add_row(const S* y, i64 r, i64 cols, const RowBiasDropoutAdd<S>& bda,
                                                     float (&v)[P * kVec<S>]) {
  using C = compute_t<S>;
  constexpr int V = kVec<S>;
#pragma unroll
  for (int q = 0; q < P; ++q) {
    const i64 c0 = (static_cast<i64>(q) * blockDim.x + threadIdx.x) * V;
    if (c0 < cols) {
      const Pack<S> yp = *reinterpret_cast<const Pack<S>*>(y + r * cols + c0);
      const Pack<S> rp = *reinterpret_cast<const Pack<S>*>(bda.residual + r * cols + c0);
      const Pack<S> bp = *reinterpret_cast<const Pack<S>*>(bda.bias + c0);
      const unsigned keep = keep_bits(bda.mask, r, cols, c0);
      Pack<S> out;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        // dropout_kernel's FUSED formula, in the compute type, rounded once.
        const C d = (keep >> j) & 1u ? (ld(yp.v[j]) + static_cast<C>(ld(bp.v[j]))) * bda.mask.keep_scale : C(0);
        out.v[j] = st<S>(ld(rp.v[j]) + d);
        v[q * V + j] = static_cast<float>(ld(out.v[j]));
      }
      *reinterpret_cast<Pack<S>*>(bda.sum + r * cols + c0) = out;
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) v[q * V + j] = 0.f;
    }
  }
}

// BDA: x is the bias-dropout-add's y, and the row is bda's sum (above).
template <typename S, int P, bool BDA = false>
__global__ void layernorm_forward_fast_kernel(const S* x, const S* gamma, const S* beta, float eps, S* y, float* mean,
                                              float* rstd, i64 cols, RowBiasDropoutAdd<S> bda) {
  constexpr int V = kVec<S>;
  const i64 r = blockIdx.x;
  float v[P * V];
  if constexpr (BDA)
    bias_dropout_add_row<S, P>(x, r, cols, bda, v);
  else
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

}  // namespace megazero::cuda::detail_k
