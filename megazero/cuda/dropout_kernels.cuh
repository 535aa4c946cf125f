// The dropout backward with the bias gradient summed in the same pass (the
// launcher: layer_kernels.cu; the contract: kernels::dropout_backward_bias_grad).
// Kept apart, kernels only, so that tests/cuda_emulation runs it on the CPU as
// it is.
#pragma once

#include <cstdint>

#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/philox.cuh"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/layer_kernels.h"

namespace megazero::cuda::detail_k {

// dy, dx: [rows, cols] (dx may alias dy), covered by the dropout layout l.
// Each thread owns kDropoutColumns adjacent columns (one Philox block serves
// them when the layout row length is a multiple of 4) over a chunk of rows:
// it writes dx = dy * keep / (1 - p) rounded to storage, the CPU's mask and
// formula bit for bit, and sums those rounded values per column in double
// into partial[chunk * cols + c]; column_finish_kernel adds the chunks in
// order. No atomics: a run repeats bit for bit.
template <typename S>
__global__ void dropout_backward_partial_kernel(const S* dy, double p, PhiloxKey key, kernels::DropoutLayout l,
                                                i64 rows, i64 cols, i64 rows_per_chunk, S* dx, double* partial) {
  using C = compute_t<S>;
  constexpr int Q = static_cast<int>(kernels::gpu_scratch::kDropoutColumns);
  const i64 c0 = (static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x) * Q;
  if (c0 >= cols) return;
  const i64 r0 = static_cast<i64>(blockIdx.y) * rows_per_chunk, r1 = min(rows, r0 + rows_per_chunk);
  const i64 inner = l.C * l.D;
  const C keep_scale = static_cast<C>(1.0 / (1.0 - p));
  double acc[Q] = {};
  for (i64 r = r0; r < r1; ++r) {
    const i64 e0 = r * cols + c0;
    i64 lrow = e0 / inner, k = e0 - lrow * inner;  // layout row and offset in it, stepped below
    std::uint64_t have = ~std::uint64_t{0};
    uint4 w{};
    for (int j = 0; j < Q && c0 + j < cols; ++j) {
      bool keep = true;
      if (p > 0) {
        const i64 global_row = (l.a0 + lrow / l.B) * l.GB + l.b0 + lrow % l.B;
        const std::uint64_t idx =
            static_cast<std::uint64_t>(global_row) * static_cast<std::uint64_t>(inner) + static_cast<std::uint64_t>(k);
        if ((idx >> 2) != have) {
          have = idx >> 2;
          w = philox(have, key);
        }
        keep = static_cast<double>(static_cast<float>(word(w, static_cast<unsigned>(idx & 3u)) >> 8) * 0x1p-24f) >= p;
      }
      const S v = keep ? st<S>(ld(dy[e0 + j]) * keep_scale) : st<S>(C(0));
      dx[e0 + j] = v;
      acc[j] += static_cast<double>(ld(v));
      if (++k == inner) {
        k = 0;
        ++lrow;
      }
    }
  }
  for (int j = 0; j < Q && c0 + j < cols; ++j) partial[static_cast<i64>(blockIdx.y) * cols + c0 + j] = acc[j];
}

}  // namespace megazero::cuda::detail_k
