// The GeLU (tanh approximation) and the bias-GeLU backward's packed kernel
// (dx written and the bias gradient summed in one pass). The launchers:
// gelu_bias.cu; the contracts: megazero/kernels/gelu_bias.h. Kept apart,
// kernels only, so tests/cuda_emulation runs them on the CPU as they are.
#pragma once

#include "megazero/cuda/column_tiles.cuh"
#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/packs.cuh"

namespace megazero::cuda::detail_k {

constexpr double kGeluC = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kGeluA = 0.044715;

template <typename T>
__device__ __forceinline__ T gelu(T x) {
  const T u = static_cast<T>(kGeluC) * (x + static_cast<T>(kGeluA) * x * x * x);
  return static_cast<T>(0.5) * x * (static_cast<T>(1) + tanh(u));
}

template <typename T>
__device__ __forceinline__ T gelu_grad(T x) {
  const T u = static_cast<T>(kGeluC) * (x + static_cast<T>(kGeluA) * x * x * x);
  const T t = tanh(u);
  const T du = static_cast<T>(kGeluC) * (static_cast<T>(1) + static_cast<T>(3 * kGeluA) * x * x);
  return static_cast<T>(0.5) * (static_cast<T>(1) + t) + static_cast<T>(0.5) * x * (static_cast<T>(1) - t * t) * du;
}

// bias_gelu_backward with 16-byte packs, tiled (column_tiles.cuh): a
// thread's column group is one pack over its lane's rows of the chunk; it
// loads the row's dy and y packs, writes its dx pack, and sums the rounded dx
// per column in double; the last block of its block column to arrive adds
// the chunks into dbias (`fold`; without tickets, column_finish_kernel).
template <typename S, typename G = float>
__global__ void __launch_bounds__(kernels::gpu_scratch::kThreads, 4)
    bias_gelu_backward_packed_kernel(const S* dy, const S* y, const S* bias, S* dx, i64 rows, i64 cols,
                                     i64 rows_per_chunk, double* partial, ColumnFold<G> fold = {}) {
  constexpr int V = kVec<S>;
  const TileSeat me = tile_seat();
  const i64 q = me.group;
  double acc[V] = {};
  if (q * V < cols) {
    // bias null: y holds it already (kernels/gelu_bias.h); y + 0 is y for gelu'.
    compute_t<S> b[V] = {};
    if (bias != nullptr) {
      const Pack<S> bp = reinterpret_cast<const Pack<S>*>(bias)[q];
#pragma unroll
      for (int j = 0; j < V; ++j) b[j] = ld(bp.v[j]);
    }
    // Software-pipelined: the next row's packs are loaded before this row's
    // gelu' (a tanh an element) is computed, so a thread always has a load in
    // flight while it computes. Loaded then computed, the H200 ran this pass
    // at about the sum of its compute and memory times (88 us at GPT-2
    // medium's [8192, 4096]). dx may alias dy: row r + lanes is read before
    // row r is written, and they are different rows. Rows are summed in order.
    const i64 end = chunk_end(rows, rows_per_chunk), lanes = me.lanes;
    i64 r = chunk_begin(rows_per_chunk) + me.lane;
    Pack<S> dn{}, xn{};
    if (r < end) {
      dn = reinterpret_cast<const Pack<S>*>(dy + r * cols)[q];
      xn = reinterpret_cast<const Pack<S>*>(y + r * cols)[q];
    }
    for (; r < end; r += lanes) {
      const Pack<S> d = dn, x = xn;
      if (r + lanes < end) {
        dn = reinterpret_cast<const Pack<S>*>(dy + (r + lanes) * cols)[q];
        xn = reinterpret_cast<const Pack<S>*>(y + (r + lanes) * cols)[q];
      }
      Pack<S> o;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        o.v[j] = st<S>(ld(d.v[j]) * gelu_grad(ld(x.v[j]) + b[j]));
        acc[j] += static_cast<double>(ld(o.v[j]));
      }
      reinterpret_cast<Pack<S>*>(dx + r * cols)[q] = o;
    }
  }
  store_tile_sums<V>(acc, cols, partial + static_cast<i64>(blockIdx.y) * cols);
  finish_tile_if_last(fold, 1, cols, V, partial);
}

}  // namespace megazero::cuda::detail_k
