// A dropout mask over whole rows, for the row kernels that apply a hidden
// state's dropout inside their own pass (LayerNorm's backward writing the
// attention output dropout's gradient, LayerNorm's forward doing the
// bias-dropout-add before it): the dropout kernels' mask (dropout_kernels.cuh,
// the CPU's bit for bit) where each layout row is one row of the tensor.
// Kernels only, for tests/cuda_emulation too.
#pragma once

#include <cstdint>

#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/packs.cuh"
#include "megazero/cuda/philox.cuh"
#include "megazero/kernels/dropout.h"

namespace megazero::cuda::detail_k {

// Row r's element c has the global index (row0 + r * row_step) * cols + c.
// keep_scale and threshold come computed (row_mask below): as kernel
// parameters they stay in the constant bank, where the two-pack LayerNorm
// backward has no registers to hold them.
template <typename S>
struct RowMask {
  PhiloxKey key{};
  i64 row0 = 0, row_step = 1;
  compute_t<S> keep_scale = 1;  // the dropout kernels' 1 / (1 - p), rounded the same way
  std::uint32_t threshold = 0;  // keep_threshold(p)
  bool on = false;              // p > 0
};

// The mask of dropout layout l over `rows` rows of `cols`: false unless each
// layout row is one of them (a hidden-state layout: one group, a sample a
// row), whose global row is then (sample_offset + r) * global_groups +
// group_offset.
template <typename S>
bool row_mask(const kernels::DropoutLayout& l, i64 rows, i64 cols, double p, const PhiloxKey& key, RowMask<S>& out) {
  if (l.groups != 1 || l.samples != rows || l.matrix_rows * l.matrix_cols != cols) return false;
  out = {key,
         l.sample_offset * l.global_groups + l.group_offset,
         l.global_groups,
         static_cast<compute_t<S>>(1.0 / (1.0 - p)),
         keep_threshold(p),
         p > 0};
  return true;
}

// The keep bits of the pack of kVec<S> elements at columns c0.. of row r
// (c0 and cols multiples of kVec<S>, so of 4: whole Philox blocks), bit j
// for element c0 + j.
template <typename S>
__device__ __forceinline__ unsigned keep_bits(const RowMask<S>& m, i64 r, i64 cols, i64 c0) {
  constexpr int V = kVec<S>;
  static_assert(V % 4 == 0, "a pack is whole Philox blocks");
  if (!m.on) return (1u << V) - 1u;
  const std::uint64_t block0 = (static_cast<std::uint64_t>(m.row0 + r * m.row_step) * static_cast<std::uint64_t>(cols) +
                                static_cast<std::uint64_t>(c0)) >>
                               2;
  unsigned bits = 0;
#pragma unroll
  for (int b = 0; b < V / 4; ++b) {
    const uint4 w = philox(block0 + static_cast<std::uint64_t>(b), m.key);
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (kept(word(w, static_cast<unsigned>(u)), m.threshold)) bits |= 1u << (4 * b + u);
  }
  return bits;
}

}  // namespace megazero::cuda::detail_k
