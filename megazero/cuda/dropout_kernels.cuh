// The dropout backward with the bias gradient summed in the same pass (the
// launcher: dropout.cu; the contract: kernels::dropout_backward_bias_grad).
// Kept apart, kernels only, so that tests/cuda_emulation runs it on the CPU as
// it is.
#pragma once

#include <cstdint>

#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/philox.cuh"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/dropout.h"

namespace megazero::cuda::detail_k {

// dy, dx: [rows, cols] (dx may alias dy), covered by the dropout layout l.
// Each thread owns kDropoutColumns adjacent columns over a chunk of rows (one
// Philox block serves them when cols and the layout row length are multiples
// of 4): it loads them, then writes dx = dy * keep / (1 - p) rounded to
// storage, the CPU's mask and formula bit for bit, and sums those rounded
// values per column in double into partial[chunk * cols + c];
// column_finish_kernel adds the chunks in order. No atomics: a run repeats
// bit for bit.
template <typename S>
__global__ void dropout_backward_partial_kernel(const S* dy, double p, PhiloxKey key, kernels::DropoutLayout l,
                                                i64 rows, i64 cols, i64 rows_per_chunk, S* dx, double* partial) {
  using C = compute_t<S>;
  constexpr int Q = static_cast<int>(kernels::gpu_scratch::kDropoutColumns);
  const i64 c0 = (static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x) * Q;
  if (c0 >= cols) return;
  const int n = static_cast<int>(min(static_cast<i64>(Q), cols - c0));
  const i64 r0 = static_cast<i64>(blockIdx.y) * rows_per_chunk, r1 = min(rows, r0 + rows_per_chunk);
  const i64 inner = l.matrix_rows * l.matrix_cols;
  const C keep_scale = static_cast<C>(1.0 / (1.0 - p));
  // Global index of element (layout row lrow, offset k): divisions once per
  // row and per layout-row crossing, not per element.
  auto row_base = [&](i64 lrow) {
    const i64 global_row = (l.sample_offset + lrow / l.groups) * l.global_groups + l.group_offset + lrow % l.groups;
    return static_cast<std::uint64_t>(global_row) * static_cast<std::uint64_t>(inner);
  };
  double acc[Q] = {};
  for (i64 r = r0; r < r1; ++r) {
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
        keep = static_cast<double>(static_cast<float>(word(w, static_cast<unsigned>(idx & 3u)) >> 8) * 0x1p-24f) >= p;
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
#pragma unroll
  for (int j = 0; j < Q; ++j)  // a constant index: acc stays in registers
    if (j < n) partial[static_cast<i64>(blockIdx.y) * cols + c0 + j] = acc[j];
}

}  // namespace megazero::cuda::detail_k
