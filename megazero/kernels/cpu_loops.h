// Internal to the CPU layer kernels (layernorm.cpp, gelu_bias.cpp,
// softmax.cpp, dropout.cpp, embedding.cpp, cross_entropy.cpp): the shapes of
// their OpenMP loops, each of which gives the same bits for any thread count,
// and the per-thread rows the softmaxes widen 16-bit values into. Not part of
// the public kernel API; kernel_support.h has the element types, validation
// and dispatch.
#pragma once

#include <algorithm>
#include <vector>

#include "megazero/kernels/kernel_support.h"

namespace megazero::kernels::detail {

// dst[c] += sum_r term(r, c) for c < cols. Each column's sum is taken in double
// and in row order by one thread, so the result does not depend on the number
// of threads (per-thread partial sums would); it is rounded once into G.
template <typename G, typename Term>
void accumulate_columns(G* dst, i64 rows, i64 cols, Term term) {
  constexpr i64 kBlock = 64;
  const i64 blocks = (cols + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(threads()) schedule(static) if (rows * cols > kParallelMin)
  for (i64 blk = 0; blk < blocks; ++blk) {
    const i64 c0 = blk * kBlock, n = std::min(kBlock, cols - c0);
    double acc[kBlock] = {};
    for (i64 r = 0; r < rows; ++r)
      for (i64 k = 0; k < n; ++k) acc[k] += term(r, c0 + k);
    for (i64 k = 0; k < n; ++k) dst[c0 + k] = st<G>(ld(dst[c0 + k]) + acc[k]);
  }
}

// Applies out[i] = f(i) over n elements; f reads only index i, so outputs may
// alias inputs.
template <typename T, typename F>
void elementwise(T* out, i64 n, F f) {
#pragma omp parallel for num_threads(threads()) schedule(static) if (n > kParallelMin)
  for (i64 i = 0; i < n; ++i) out[i] = f(i);
}

// Applies out[r * cols + c] = f(r, c) row by row (a bias indexed by c without
// a division per element); f reads only that element, so outputs may alias inputs.
template <typename T, typename F>
void rowwise(T* out, i64 rows, i64 cols, F f) {
#pragma omp parallel for num_threads(threads()) schedule(static) if (rows * cols > kParallelMin)
  for (i64 r = 0; r < rows; ++r)
    for (i64 c = 0; c < cols; ++c) out[r * cols + c] = f(r, c);
}

// A per-thread compute-type row of at least n elements, for the 16-bit rows
// the softmaxes widen before their vector exponentials (a few hundred KB at
// most, outside the memory tracker, as a library's thread buffer would be).
template <typename C>
C* row_scratch(i64 n) {
  thread_local std::vector<C> scratch;
  if (static_cast<i64>(scratch.size()) < n) scratch.resize(static_cast<std::size_t>(n));
  return scratch.data();
}

}  // namespace megazero::kernels::detail
