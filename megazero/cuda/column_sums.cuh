// Sums over rows on the GPU, shared by the layer kernel files (layernorm.cu,
// gelu_bias.cu, dropout.cu, embedding.cu): dst[c] += sum_r term(r, c) in
// double, in a fixed order (no atomics), so a run repeats bit for bit; the
// partials live in the caller's scratch (megazero/kernels/gpu_scratch.h sizes
// it). Included only by .cu files.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "megazero/cuda/column_tickets.h"
#include "megazero/cuda/column_tiles.cuh"
#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/layer_helpers.cuh"
#include "megazero/kernels/gpu_scratch.h"

namespace megazero::cuda::detail_k {

// dst[c] = round(dst[c] + sum_r term(r, c)) for c < cols, the sum in double:
// pass 1 sums row chunks per column (coalesced along c), then the last block
// of each block column adds the chunks as column_finish_kernel would (`fold`,
// column_tiles.cuh; without tickets that kernel runs after). Fixed order, no
// atomic additions.
template <typename G, typename Term>
__global__ void column_partial_kernel(i64 rows, i64 cols, i64 rows_per_chunk, Term term, double* partial,
                                      ColumnFold<G> fold = {}) {
  const i64 first = static_cast<i64>(blockIdx.x) * blockDim.x, c = first + threadIdx.x;
  if (c < cols) {  // every thread goes on to the fold's barriers
    const i64 r0 = static_cast<i64>(blockIdx.y) * rows_per_chunk, r1 = min(rows, r0 + rows_per_chunk);
    double acc = 0;
    for (i64 r = r0; r < r1; ++r) acc += term(r, c);
    partial[static_cast<i64>(blockIdx.y) * cols + c] = acc;
  }
  finish_if_last(fold, 1, cols, first, blockDim.x, partial);
}

// One chunk holds every row: dst[c] = round(dst[c] + sum_r term(r, c)) with
// no partials (row order: what partial + finish compute, up to the order of
// the double additions).
template <typename G, typename Term>
__global__ void column_direct_kernel(i64 rows, i64 cols, Term term, G* dst) {
  const i64 c = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  double acc = 0;
  for (i64 r = 0; r < rows; ++r) acc += term(r, c);
  dst[c] = st<G>(static_cast<double>(ld(dst[c])) + acc);
}

// dst[c] = round(dst[c] + the `chunks` partial sums of column c), added as
// column_finish_kernel (column_tiles.cuh) says.
template <typename G>
void finish_columns(G* dst, i64 cols, i64 chunks, const double* partial, cudaStream_t s, const char* what) {
  column_finish_kernel<G><<<finish_blocks(cols), kThreads, 0, s>>>(cols, chunks, partial, dst);
  check_launch(what);
}

// The accumulators of up to kMaxFinishSums sums finished together, in order.
template <typename G>
FinishTargets<G> finish_targets(std::initializer_list<G*> dsts, const char* what) {
  MZ_CHECK(dsts.size() <= static_cast<std::size_t>(kMaxFinishSums), what, ": more than ", kMaxFinishSums,
           " sums to finish together");
  FinishTargets<G> t;
  int n = 0;
  for (G* d : dsts) t.dst[n++] = d;
  return t;
}

// finish_columns for the sums whose partials lie back to back in `partial`
// ([dsts.size()][chunks][cols]), dsts[y] the y-th: one launch.
template <typename G>
void finish_columns(std::initializer_list<G*> dsts, i64 cols, i64 chunks, const double* partial, cudaStream_t s,
                    const char* what) {
  const FinishTargets<G> t = finish_targets(dsts, what);
  column_finish_many_kernel<G>
      <<<dim3(finish_blocks(cols), static_cast<unsigned>(dsts.size())), kThreads, 0, s>>>(cols, chunks, partial, t);
  check_launch(what);
}

// The fold of a partial kernel over `col_blocks` block columns on
// stream s into `dsts` (their partials back to back): tickets null when the
// launcher is to finish the sums itself (finish_columns).
template <typename G>
ColumnFold<G> column_fold(std::initializer_list<G*> dsts, i64 col_blocks, cudaStream_t s) {
  ColumnFold<G> f;
  f.targets = finish_targets(dsts, "a folded column sum");
  f.tickets = column_tickets(s, col_blocks);
  return f;
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
  const ColumnFold<G> fold = column_fold<G>({dst}, c.col_blocks, s);
  column_partial_kernel<G>
      <<<dim3(static_cast<unsigned>(c.col_blocks), static_cast<unsigned>(c.used)), kThreads, 0, s>>>(
          rows, cols, c.per_chunk, term, partial, fold);
  check_launch(what);
  if (!fold.tickets) finish_columns(dst, cols, c.used, partial, s, what);
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
    // Folded where one accumulator type serves both sums (pg follows pb).
    ColumnFold<GB> fold;
    if (!dgamma)
      fold = column_fold<GB>({dbeta}, c.col_blocks, s);
    else if constexpr (std::is_same_v<GB, GG>)
      fold = column_fold<GB>({dbeta, dgamma}, c.col_blocks, s);
    if (dgamma)
      column_partial_packed_kernel<S, true>
          <<<grid, kThreads, 0, s>>>(dy, x, mean, rstd, rows, cols, per_chunk, pb, pg, fold);
    else
      column_partial_packed_kernel<S, false>
          <<<grid, kThreads, 0, s>>>(dy, x, mean, rstd, rows, cols, per_chunk, pb, pg, fold);
    check_launch("column sums");
    if (fold.tickets) return true;
    if constexpr (std::is_same_v<GB, GG>) {
      if (dgamma) {
        finish_columns({dbeta, dgamma}, cols, used, pb, s, "column sums");  // pg follows pb
        return true;
      }
    }
    finish_columns(dbeta, cols, used, pb, s, "column sums");
    if (dgamma) finish_columns(dgamma, cols, used, pg, s, "column sums");
    return true;
  }
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

}  // namespace megazero::cuda::detail_k
