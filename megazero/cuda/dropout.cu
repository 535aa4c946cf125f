// Dropout and bias-dropout-add on the GPU: the launchers of
// megazero/cuda/dropout.h (contracts: megazero/kernels/dropout.h). The keep
// mask is Philox-4x32-10 at the element's global index, the CPU's bit for bit.
// The kernels are dropout_kernels.cuh's; the backward with the bias gradient
// adds its chunks with column_sums.cuh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "megazero/cuda/column_sums.cuh"
#include "megazero/cuda/dropout.h"
#include "megazero/cuda/dropout_kernels.cuh"
#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/layer_helpers.cuh"
#include "megazero/cuda/philox.cuh"

namespace megazero::cuda {
using namespace detail_k;

namespace {

// Blocks of the forward kernels over `groups` groups. The packed kernel walks
// the layout from group to group and divides only to start, so it gets one
// wave (gpu_scratch::kTargetBlocks: four blocks on each of 132 SMs) and a
// thread takes several groups; element by element, a thread a group.
unsigned dropout_blocks(i64 groups, bool packed) {
  const unsigned b = blocks_for(groups);
  return packed ? std::min(b, static_cast<unsigned>(kernels::gpu_scratch::kTargetBlocks)) : b;
}

template <typename S, typename G>
void dropout_bias_grad_t(const void* dy, double p, const RngKey& key, const kernels::DropoutLayout& layout, void* dx,
                         void* dbias, i64 rows, i64 cols, kernels::GpuScratch ws, cudaStream_t s) {
  const auto c = kernels::gpu_scratch::dropout_column_chunks(rows, cols);
  double* partial =
      scratch_as<double>(ws, kernels::gpu_scratch::dropout_bias_grad_bytes(rows, cols), "dropout_backward_bias_grad");
  const dim3 grid(static_cast<unsigned>(c.col_blocks), static_cast<unsigned>(c.used));
  const ColumnFold<G> fold = column_fold<G>({static_cast<G*>(dbias)}, c.col_blocks, s);
  const auto launch = [&](auto aligned) {
    dropout_backward_partial_kernel<S, decltype(aligned)::value>
        <<<grid, kThreads, 0, s>>>(static_cast<const S*>(dy), p, philox_key(key), layout, rows, cols, c.per_chunk,
                                   static_cast<S*>(dx), partial, fold);
  };
  // Whole groups of four inside layout rows, as aligned Vec<S, 4> accesses
  // (dropout_backward_partial_kernel's ALIGNED); else element by element.
  constexpr i64 Q = kernels::gpu_scratch::kDropoutColumns;
  const auto fits = [](const void* q) { return reinterpret_cast<std::uintptr_t>(q) % sizeof(Vec<S, Q>) == 0; };
  if (cols % Q == 0 && (layout.matrix_rows * layout.matrix_cols) % Q == 0 && fits(dy) && fits(dx))
    launch(std::true_type{});
  else
    launch(std::false_type{});
  check_launch("dropout_backward_bias_grad");
  if (!fold.tickets) finish_columns(static_cast<G*>(dbias), cols, c.used, partial, s, "dropout_backward_bias_grad");
}

}  // namespace

void dropout_backward_bias_grad(DType t, const void* dy, double p, const RngKey& key,
                                const kernels::DropoutLayout& layout, void* dx, void* dbias, DType dbias_type, i64 rows,
                                i64 cols, kernels::GpuScratch ws, cudaStream_t s) {
  if (cols == 0) return;
  MZ_BY_STORAGE_AND_ACC(t, dbias_type, dropout_bias_grad_t, dy, p, key, layout, dx, dbias, rows, cols, ws, s);
}

void dropout(DType t, const void* in, double p, const RngKey& key, const kernels::DropoutLayout& layout, void* out,
             cudaStream_t s) {
  const i64 inner = layout.matrix_rows * layout.matrix_cols, rows = layout.samples * layout.groups;
  if (inner * rows == 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    if (p == 0.0) {
      if (in != out)
        MZ_CHECK(cudaMemcpyAsync(out, in, static_cast<std::size_t>(inner * rows) * sizeof(S), cudaMemcpyDeviceToDevice,
                                 s) == cudaSuccess,
                 "dropout: device copy failed");
      return;
    }
    constexpr int G = kVec<S> < 4 ? 4 : kVec<S>;
    const i64 groups = (inner + G - 1) / G;
    const S* x = static_cast<const S*>(in);
    const auto launch = [&](auto vec) {
      dropout_kernel<S, decltype(vec)::value, false>
          <<<dropout_blocks(rows * groups, decltype(vec)::value), kThreads, 0, s>>>(
              x, nullptr, nullptr, p, philox_key(key), layout, static_cast<S*>(out), inner, 1, groups, rows * groups);
    };
    if (inner % G == 0 && aligned16(in) && aligned16(out))
      launch(std::true_type{});
    else
      launch(std::false_type{});
  });
  check_launch("dropout");
}

void bias_dropout_add(DType t, const void* y, const void* bias, const void* residual, double p, const RngKey& key,
                      const kernels::DropoutLayout& layout, void* out, i64 cols, cudaStream_t s) {
  const i64 inner = layout.matrix_rows * layout.matrix_cols, rows = layout.samples * layout.groups;
  if (inner * rows == 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    constexpr int G = kVec<S> < 4 ? 4 : kVec<S>;
    const i64 groups = (inner + G - 1) / G;
    const auto* yp = static_cast<const S*>(y);
    const auto* bp = static_cast<const S*>(bias);
    const auto* rp = static_cast<const S*>(residual);
    auto* op = static_cast<S*>(out);
    const auto launch = [&](auto vec, auto bias_vec) {
      dropout_kernel<S, decltype(vec)::value, true, decltype(bias_vec)::value>
          <<<dropout_blocks(rows * groups, decltype(vec)::value), kThreads, 0, s>>>(
              yp, bp, rp, p, philox_key(key), layout, op, inner, cols, groups, rows * groups);
    };
    if (inner % G == 0 && aligned16(y) && aligned16(residual) && aligned16(out)) {
      if (cols % G == 0 && aligned16(bias))
        launch(std::true_type{}, std::true_type{});
      else
        launch(std::true_type{}, std::false_type{});
    } else {
      launch(std::false_type{}, std::false_type{});
    }
  });
  check_launch("bias_dropout_add");
}

}  // namespace megazero::cuda
