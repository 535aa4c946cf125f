// Launchers of the CUDA RMSNorm (rmsnorm_cuda.h; kernels: rmsnorm_kernels.cuh).
// Rows run one block each; dgamma's column sum is gpu_scratch::column_chunks'
// split (as column_sums.cuh does for LayerNorm): one pass straight into dgamma when
// one chunk holds every row, else partial sums per chunk in the caller's
// scratch, added in order by the last block of each block column (or, with
// MEGAZERO_COLUMN_FINISH=kernel, by a finish pass).
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "megazero/cuda/column_sums.cuh"
#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/rmsnorm_cuda.h"
#include "megazero/cuda/rmsnorm_kernels.cuh"

namespace megazero::cuda {
using namespace detail_k;

namespace {

// Rows per grid (the kernels stride over the rest).
constexpr i64 kMaxRowBlocks = i64{1} << 20;

unsigned row_blocks(i64 rows) { return static_cast<unsigned>(std::min(rows, kMaxRowBlocks)); }

template <typename S, typename C, typename G>
void dgamma_sum(const S* dy, const S* x, const C* rstd, G* dgamma, i64 rows, i64 cols, kernels::GpuScratch ws,
                cudaStream_t s) {
  constexpr const char* what = "rmsnorm_backward dgamma";
  const auto ch = kernels::gpu_scratch::column_chunks(rows, cols);
  const unsigned col_blocks = static_cast<unsigned>(ch.col_blocks);
  if (ch.used == 1) {
    rmsnorm_dgamma_direct_kernel<S, C, G><<<col_blocks, kThreads, 0, s>>>(dy, x, rstd, rows, cols, dgamma);
    check_launch(what);
    return;
  }
  double* partial = scratch_as<double>(ws, static_cast<std::size_t>(ch.used * cols) * sizeof(double), what);
  const ColumnFold<G> fold = column_fold<G>({dgamma}, ch.col_blocks, s);
  rmsnorm_dgamma_partial_kernel<S, C><<<dim3(col_blocks, static_cast<unsigned>(ch.used)), kThreads, 0, s>>>(
      dy, x, rstd, rows, cols, ch.per_chunk, partial, fold);
  check_launch(what);
  if (!fold.tickets) finish_columns(dgamma, cols, ch.used, partial, s, what);
}

}  // namespace

void rmsnorm_forward(DType t, const void* x, const void* gamma, double eps, void* y, void* rstd, i64 rows, i64 cols,
                     cudaStream_t s) {
  if (rows == 0 || cols == 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    rmsnorm_forward_kernel<S, C>
        <<<row_blocks(rows), row_threads(cols), 0, s>>>(static_cast<const S*>(x), static_cast<const S*>(gamma), eps,
                                                        static_cast<S*>(y), static_cast<C*>(rstd), rows, cols);
  });
  check_launch("rmsnorm_forward");
}

void rmsnorm_backward(DType t, const void* dy, const void* x, const void* gamma, const void* rstd, void* dx,
                      void* dgamma, DType dgamma_type, const void* add, i64 rows, i64 cols, kernels::GpuScratch ws,
                      cudaStream_t s) {
  if (cols == 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    const S* dyp = static_cast<const S*>(dy);
    const S* xp = static_cast<const S*>(x);
    const C* rp = static_cast<const C*>(rstd);
    // dgamma first: dx may overwrite dy (the stream orders the kernels).
    if constexpr (!std::is_same_v<S, C>) {
      if (dgamma_type == DType::F32)
        dgamma_sum<S, C, float>(dyp, xp, rp, static_cast<float*>(dgamma), rows, cols, ws, s);
      else
        dgamma_sum<S, C, S>(dyp, xp, rp, static_cast<S*>(dgamma), rows, cols, ws, s);
    } else {
      dgamma_sum<S, C, S>(dyp, xp, rp, static_cast<S*>(dgamma), rows, cols, ws, s);
    }
    if (rows == 0) return;
    rmsnorm_backward_dx_kernel<S, C><<<row_blocks(rows), row_threads(cols), 0, s>>>(
        dyp, xp, static_cast<const S*>(gamma), rp, static_cast<S*>(dx), static_cast<const S*>(add), rows, cols);
  });
  check_launch("rmsnorm_backward");
}

}  // namespace megazero::cuda
