// The dropout forward and bias-dropout-add, and the dropout backward with the
// bias gradient summed in the same pass (the launchers: dropout.cu; the
// contracts: kernels::dropout_forward, bias_dropout_add,
// dropout_backward_bias_grad). Kept apart, kernels only, so that
// tests/cuda_emulation runs them on the CPU as they are.
#pragma once

#include <cstdint>

#include "megazero/cuda/column_tiles.cuh"
#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/philox.cuh"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/dropout.h"

namespace megazero::cuda::detail_k {

// out = dropout(y) (FUSED false), or out = residual + dropout(y + bias)
// (FUSED: bias-dropout-add; bias is indexed by the flat element index modulo
// cols). Each thread handles G consecutive elements of one [matrix_rows *
// matrix_cols] row (G = a 16-byte pack; a Philox block gives 4 values, so G/4
// blocks, or one more when the row's global start is not a multiple of 4).
// VEC: packs are aligned and the row length is a multiple of G, so y, residual
// and out move 16 bytes at a time. BIAS_VEC (FUSED and VEC only): cols is a
// multiple of G and bias aligned, so a group's bias values are one aligned
// pack (the 2026-11-24 H100 profile had this kernel at ~1.4 TB/s with eight
// 2-byte bias loads and a wrap test per group). The keep test is the CPU's
// float uniform against the double p, decided on the integer (kept,
// philox.cuh), so the mask is the CPU's bit for bit.
template <typename S, bool VEC, bool FUSED, bool BIAS_VEC = false>
__global__ void dropout_kernel(const S* y, const S* bias, const S* res, double p, PhiloxKey key,
                               kernels::DropoutLayout l, S* out, i64 inner, i64 cols, i64 groups_per_row,
                               i64 total_groups) {
  static_assert(!BIAS_VEC || (VEC && FUSED), "BIAS_VEC needs VEC and FUSED");
  using C = compute_t<S>;
  constexpr int G = kVec<S> < 4 ? 4 : kVec<S>;
  const C keep_scale = static_cast<C>(p > 0 ? 1.0 / (1.0 - p) : 1.0);
  const std::uint32_t threshold = keep_threshold(p);
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 g = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; g < total_groups; g += stride) {
    const i64 row = g / groups_per_row, k0 = (g % groups_per_row) * G;
    const i64 e0 = row * inner + k0;
    S yv[G], rv[G];
    C bv[G];
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
    if constexpr (FUSED) {
      const i64 c0 = e0 % cols;
      if constexpr (BIAS_VEC) {
#pragma unroll
        for (int q = 0; q < G / kVec<S>; ++q) {
          const Pack<S> b = reinterpret_cast<const Pack<S>*>(bias + c0)[q];
#pragma unroll
          for (int j = 0; j < kVec<S>; ++j) bv[q * kVec<S> + j] = ld(b.v[j]);
        }
      } else {
        i64 c = c0;  // every c stays below cols, also past a row's tail
#pragma unroll
        for (int j = 0; j < G; ++j) {
          bv[j] = ld(bias[c]);
          if (++c == cols) c = 0;
        }
      }
    }
    std::uint64_t base = 0, have = ~std::uint64_t{0};
    if (p > 0) {
      const i64 global_row = (l.sample_offset + row / l.groups) * l.global_groups + l.group_offset + row % l.groups;
      base = static_cast<std::uint64_t>(global_row) * static_cast<std::uint64_t>(inner);
    }
    uint4 w{};
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
        keep = kept(word(w, static_cast<unsigned>(idx & 3u)), threshold);
      }
      if constexpr (FUSED) {
        const C v = keep ? (ld(yv[j]) + bv[j]) * keep_scale : C(0);
        yv[j] = st<S>(ld(rv[j]) + v);
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

// dy, dx: [rows, cols] (dx may alias dy), covered by the dropout layout l.
// Tiled (column_tiles.cuh): a thread's column group is kDropoutColumns
// adjacent columns (one Philox block serves them when cols and the layout row
// length are multiples of 4) over its lane's rows of the chunk: it loads them,
// then writes dx = dy * keep / (1 - p) rounded to storage, the CPU's mask and
// formula bit for bit, and sums those rounded values per column in double;
// the block stores one row of partials per chunk and column_finish_kernel
// adds the chunks. No atomics: a run repeats bit for bit.
template <typename S>
__global__ void dropout_backward_partial_kernel(const S* dy, double p, PhiloxKey key, kernels::DropoutLayout l,
                                                i64 rows, i64 cols, i64 rows_per_chunk, S* dx, double* partial) {
  using C = compute_t<S>;
  constexpr int Q = static_cast<int>(kernels::gpu_scratch::kDropoutColumns);
  const TileSeat me = tile_seat();
  const i64 c0 = me.group * Q;
  const int n = c0 < cols ? static_cast<int>(min(static_cast<i64>(Q), cols - c0)) : 0;
  const i64 inner = l.matrix_rows * l.matrix_cols;
  const C keep_scale = static_cast<C>(1.0 / (1.0 - p));
  const std::uint32_t threshold = keep_threshold(p);
  // Global index of element (layout row lrow, offset k): divisions once per
  // row and per layout-row crossing, not per element.
  auto row_base = [&](i64 lrow) {
    const i64 global_row = (l.sample_offset + lrow / l.groups) * l.global_groups + l.group_offset + lrow % l.groups;
    return static_cast<std::uint64_t>(global_row) * static_cast<std::uint64_t>(inner);
  };
  double acc[Q] = {};
  const i64 r1 = n > 0 ? chunk_end(rows, rows_per_chunk) : 0;
  for (i64 r = chunk_begin(rows_per_chunk) + me.lane; r < r1; r += me.lanes) {
    const i64 e0 = r * cols + c0;
    S in[Q];
#pragma unroll
    for (int j = 0; j < Q; ++j)
      if (j < n) in[j] = dy[e0 + j];  // all loads before the stores (dx may alias dy)
    i64 lrow = e0 / inner, k = e0 - lrow * inner;
    std::uint64_t base = p > 0 ? row_base(lrow) : 0, have = ~std::uint64_t{0};
    uint4 w{};
#pragma unroll
    for (int j = 0; j < Q; ++j) {
      if (j >= n) break;
      bool keep = true;
      if (p > 0) {
        const std::uint64_t idx = base + static_cast<std::uint64_t>(k);
        if ((idx >> 2) != have) {
          have = idx >> 2;
          w = philox(have, key);
        }
        keep = kept(word(w, static_cast<unsigned>(idx & 3u)), threshold);
      }
      const S v = keep ? st<S>(ld(in[j]) * keep_scale) : st<S>(C(0));
      dx[e0 + j] = v;
      acc[j] += static_cast<double>(ld(v));
      if (++k == inner) {
        k = 0;
        ++lrow;
        if (p > 0) base = row_base(lrow);
      }
    }
  }
  store_tile_sums<Q>(acc, cols, partial + static_cast<i64>(blockIdx.y) * cols);
}

}  // namespace megazero::cuda::detail_k
