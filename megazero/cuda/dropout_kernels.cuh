// The dropout forward and bias-dropout-add, and the dropout backward with the
// bias gradient summed in the same pass (the launchers: dropout.cu; the
// contracts: kernels::dropout_forward, bias_dropout_add,
// dropout_backward_bias_grad). Kept apart, kernels only, so that
// tests/cuda_emulation runs them on the CPU as they are.
#pragma once

#include <cstdint>

#include "megazero/cuda/column_tiles.cuh"
#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/packs.cuh"
#include "megazero/cuda/philox.cuh"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/dropout.h"

namespace megazero::cuda::detail_k {

// Where a walk over the elements e, e + step, e + 2 step, ... of a tensor sits
// in the dropout layout l: at offset k of layout row sample * groups + group.
// Each step adds and compares once per coordinate, no division: the kernels
// below divided two or three times per group in 64 bits (the layout row, its
// sample and group, the bias column), which with one Philox block per four
// elements made the backward compute-bound (the 2026-11-26 H200 bench: 998 GB/s at the 100B layer's
// shape, where bias-dropout-add, which moves more bytes, ran at 2350 GB/s).
// Needs step >= 0; every coordinate stays in range because each step's part
// is below its modulus and adds at most one carry.
struct LayoutWalk {
  i64 inner, groups;        // layout row length, groups per sample
  i64 k, sample, group;     // where the current element sits
  i64 dk, dsample, dgroup;  // the step, in the same terms

  __device__ LayoutWalk(const kernels::DropoutLayout& l, i64 e, i64 step)
      : inner(l.matrix_rows * l.matrix_cols), groups(l.groups) {
    const i64 lrow = e / inner, q = step / inner;
    k = e - lrow * inner;
    sample = lrow / groups;
    group = lrow - sample * groups;
    dk = step - q * inner;
    dsample = q / groups;
    dgroup = q - dsample * groups;
  }
  // The current element's global index (what the CPU's uniform_at takes).
  __device__ std::uint64_t index(const kernels::DropoutLayout& l) const {
    const i64 global_row = (l.sample_offset + sample) * l.global_groups + l.group_offset + group;
    return static_cast<std::uint64_t>(global_row) * static_cast<std::uint64_t>(inner) + static_cast<std::uint64_t>(k);
  }
  __device__ void advance() {
    k += dk;
    i64 carry = 0;
    if (k >= inner) {
      k -= inner;
      carry = 1;
    }
    group += dgroup + carry;
    sample += dsample;
    if (group >= groups) {
      group -= groups;
      ++sample;
    }
  }
};

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
// VEC: the group's element index is g * G and its layout offset a multiple of
// G (so of 4: whole Philox blocks), so a thread walks the layout and the bias
// column from group to group (LayoutWalk) and divides only to start; the
// launcher sizes the grid so that a thread takes several groups.
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
  if constexpr (VEC) {
    static_assert(G % 4 == 0, "a group is whole Philox blocks");
    i64 g = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (g >= total_groups) return;
    LayoutWalk walk(l, g * G, stride * G);
    i64 c = FUSED ? (g * G) % cols : 0;  // the group's first bias column
    const i64 dc = FUSED ? (stride * G) % cols : 0;
    // Software-pipelined: the next group's packs are loaded before this
    // group's mask (two Philox blocks for 16-bit packs) is computed, so a
    // thread keeps a load in flight while it computes. out may alias y or
    // the residual: the next group is other elements.
    constexpr int NP = G / kVec<S>;
    Pack<S> yn[NP], rn[NP];
    const auto load = [&](i64 e, Pack<S>(&ya)[NP], Pack<S>(&ra)[NP]) {
#pragma unroll
      for (int q = 0; q < NP; ++q) {
        ya[q] = reinterpret_cast<const Pack<S>*>(y + e)[q];
        if constexpr (FUSED) ra[q] = reinterpret_cast<const Pack<S>*>(res + e)[q];
      }
    };
    load(g * G, yn, rn);
    for (; g < total_groups; g += stride) {
      const i64 e0 = g * G;
      S yv[G], rv[G];
      C bv[G];
#pragma unroll
      for (int q = 0; q < NP; ++q)
#pragma unroll
        for (int j = 0; j < kVec<S>; ++j) {
          yv[q * kVec<S> + j] = yn[q].v[j];
          if constexpr (FUSED) rv[q * kVec<S> + j] = rn[q].v[j];
        }
      if (g + stride < total_groups) load(e0 + stride * G, yn, rn);
      if constexpr (FUSED) {
        if constexpr (BIAS_VEC) {
#pragma unroll
          for (int q = 0; q < G / kVec<S>; ++q) {
            const Pack<S> b = reinterpret_cast<const Pack<S>*>(bias + c)[q];
#pragma unroll
            for (int j = 0; j < kVec<S>; ++j) bv[q * kVec<S> + j] = ld(b.v[j]);
          }
        } else {
          i64 cj = c;
#pragma unroll
          for (int j = 0; j < G; ++j) {
            bv[j] = ld(bias[cj]);
            if (++cj == cols) cj = 0;
          }
        }
      }
      const std::uint64_t block0 = p > 0 ? walk.index(l) >> 2 : 0;
#pragma unroll
      for (int b = 0; b < G / 4; ++b) {
        const uint4 w = p > 0 ? philox(block0 + static_cast<std::uint64_t>(b), key) : uint4{};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = 4 * b + i;
          const bool keep = p <= 0 || kept(word(w, static_cast<unsigned>(i)), threshold);
          if constexpr (FUSED) {
            const C v = keep ? (ld(yv[j]) + bv[j]) * keep_scale : C(0);
            yv[j] = st<S>(ld(rv[j]) + v);
          } else {
            yv[j] = keep ? st<S>(ld(yv[j]) * keep_scale) : st<S>(C(0));
          }
        }
      }
#pragma unroll
      for (int q = 0; q < G / kVec<S>; ++q) {
        Pack<S> pk;
#pragma unroll
        for (int j = 0; j < kVec<S>; ++j) pk.v[j] = yv[q * kVec<S> + j];
        reinterpret_cast<Pack<S>*>(out + e0)[q] = pk;
      }
      walk.advance();
      if constexpr (FUSED) {
        c += dc;
        if (c >= cols) c -= cols;
      }
    }
  } else {  // element by element: rows of any length, any alignment
    for (i64 g = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; g < total_groups; g += stride) {
      const i64 row = g / groups_per_row, k0 = (g % groups_per_row) * G;
      const i64 e0 = row * inner + k0;
      S yv[G], rv[G];
      C bv[G];
      for (int j = 0; j < G && k0 + j < inner; ++j) {
        yv[j] = y[e0 + j];
        if constexpr (FUSED) rv[j] = res[e0 + j];
      }
      if constexpr (FUSED) {
        i64 c = e0 % cols;  // every c stays below cols, also past a row's tail
#pragma unroll
        for (int j = 0; j < G; ++j) {
          bv[j] = ld(bias[c]);
          if (++c == cols) c = 0;
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
        if (k0 + j >= inner) break;
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
      for (int j = 0; j < G && k0 + j < inner; ++j) out[e0 + j] = yv[j];
    }
  }
}

// Rows a thread of the aligned backward loads before it computes any: with one
// row (8 bytes of bf16) in flight a thread, the SMs held too few bytes in
// flight to cover the memory's latency.
constexpr int kDropoutRowBatch = 4;

// dy, dx: [rows, cols] (dx may alias dy), covered by the dropout layout l.
// Tiled (column_tiles.cuh): a thread's column group is kDropoutColumns
// adjacent columns (one Philox block serves them when cols and the layout row
// length are multiples of 4) over its lane's rows of the chunk: it loads them,
// then writes dx = dy * keep / (1 - p) rounded to storage, the CPU's mask and
// formula bit for bit, and sums those rounded values per column in double;
// the block stores one row of partials per chunk, and the last block of its
// block column to arrive adds the chunks into the bias gradient (`fold`,
// column_tiles.cuh; or, without tickets, column_finish_kernel after it). No
// atomic additions: a run repeats bit for bit.
// ALIGNED (the launcher checks): cols and the layout row length are multiples
// of 4 and dy, dx aligned to four elements, so a thread's group is one
// Vec<S, 4> access inside one layout row, and its four elements are one
// Philox block (their global index is a multiple of 4). Then a thread loads
// kDropoutRowBatch rows before computing, and walks the layout (LayoutWalk)
// instead of dividing; the rows are summed in the same order, so the partials
// are the same bits as the element-by-element loop's.
template <typename S, bool ALIGNED = false, typename G = float>
__global__ void __launch_bounds__(kernels::gpu_scratch::kThreads, kernels::gpu_scratch::kDropoutBlocksPerSm)
    dropout_backward_partial_kernel(const S* dy, double p, PhiloxKey key, kernels::DropoutLayout l, i64 rows, i64 cols,
                                    i64 rows_per_chunk, S* dx, double* partial, ColumnFold<G> fold = {}) {
  using C = compute_t<S>;
  constexpr int Q = static_cast<int>(kernels::gpu_scratch::kDropoutColumns);
  const TileSeat me = tile_seat();
  const i64 c0 = me.group * Q;
  const int n = c0 < cols ? static_cast<int>(min(static_cast<i64>(Q), cols - c0)) : 0;
  const i64 inner = l.matrix_rows * l.matrix_cols;
  const C keep_scale = static_cast<C>(1.0 / (1.0 - p));
  const std::uint32_t threshold = keep_threshold(p);
  if constexpr (ALIGNED) {
    static_assert(Q == 4, "one Philox block serves a group of four columns");
    constexpr int U = kDropoutRowBatch;
    using V4 = Vec<S, Q>;
    double acc[Q] = {};
    const i64 r0 = chunk_begin(rows_per_chunk) + me.lane, r1 = n == Q ? chunk_end(rows, rows_per_chunk) : 0;
    if (r0 < r1) {
      const i64 lanes = me.lanes;
      LayoutWalk walk(l, r0 * cols + c0, lanes * cols);
      for (i64 r = r0; r < r1; r += U * lanes) {
        V4 in[U];
#pragma unroll
        for (int u = 0; u < U; ++u)  // all loads before the stores (dx may alias dy)
          if (r + u * lanes < r1) in[u] = *reinterpret_cast<const V4*>(dy + (r + u * lanes) * cols + c0);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (r + u * lanes >= r1) break;
          const uint4 w = p > 0 ? philox(walk.index(l) >> 2, key) : uint4{};
          walk.advance();
          V4 out;
#pragma unroll
          for (int j = 0; j < Q; ++j) {
            const bool keep = p <= 0 || kept(word(w, static_cast<unsigned>(j)), threshold);
            out.v[j] = keep ? st<S>(ld(in[u].v[j]) * keep_scale) : st<S>(C(0));
            acc[j] += static_cast<double>(ld(out.v[j]));
          }
          *reinterpret_cast<V4*>(dx + (r + u * lanes) * cols + c0) = out;
        }
      }
    }
    store_tile_sums<Q>(acc, cols, partial + static_cast<i64>(blockIdx.y) * cols);
    finish_tile_if_last(fold, 1, cols, Q, partial);
  } else {  // element by element
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
    finish_tile_if_last(fold, 1, cols, Q, partial);
  }
}

}  // namespace megazero::cuda::detail_k
