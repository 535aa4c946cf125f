// Dropout and bias-dropout-add on the GPU: the launchers of
// megazero/cuda/dropout.h (contracts: megazero/kernels/dropout.h). The keep
// mask is Philox-4x32-10 at the element's global index, the CPU's bit for bit;
// the backward with the bias gradient runs dropout_kernels.cuh's one-pass
// kernel and adds its chunks with column_sums.cuh.
#include <cuda_runtime.h>

#include "megazero/cuda/column_sums.cuh"
#include "megazero/cuda/dropout.h"
#include "megazero/cuda/dropout_kernels.cuh"
#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/layer_helpers.cuh"
#include "megazero/cuda/philox.cuh"

namespace megazero::cuda {
using namespace detail_k;

namespace {

// ---------------------------------------------------------------- dropout (Philox-4x32-10, as rng.cpp)

// out = dropout(y) (FUSED false), or out = residual + dropout(y + bias)
// (FUSED: bias-dropout-add). Each thread handles G consecutive elements of one
// [matrix_rows * matrix_cols] row (G = a 16-byte pack; a Philox block gives 4 values, so G/4 blocks,
// or one more when the row's global start is not a multiple of 4). VEC: packs
// are aligned and the row length is a multiple of G, so loads and stores are
// 16 bytes wide. The keep test compares the float uniform with the double p,
// as the CPU does, so the mask is the CPU's bit for bit.
template <typename S, bool VEC, bool FUSED>
__global__ void dropout_kernel(const S* y, const S* bias, const S* res, double p, PhiloxKey key,
                               kernels::DropoutLayout l, S* out, i64 inner, i64 cols, i64 groups_per_row,
                               i64 total_groups) {
  using C = compute_t<S>;
  constexpr int G = kVec<S> < 4 ? 4 : kVec<S>;
  const C keep_scale = static_cast<C>(p > 0 ? 1.0 / (1.0 - p) : 1.0);
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 g = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; g < total_groups; g += stride) {
    const i64 row = g / groups_per_row, k0 = (g % groups_per_row) * G;
    const i64 global_row = (l.sample_offset + row / l.groups) * l.global_groups + l.group_offset + row % l.groups;
    const std::uint64_t base = static_cast<std::uint64_t>(global_row) * static_cast<std::uint64_t>(inner);
    const i64 e0 = row * inner + k0;
    S yv[G], rv[G];
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
    std::uint64_t have = ~std::uint64_t{0};
    uint4 w{};
    i64 c = FUSED ? e0 % cols : 0;
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
        keep = static_cast<double>(static_cast<float>(word(w, static_cast<unsigned>(idx & 3u)) >> 8) * 0x1p-24f) >= p;
      }
      if constexpr (FUSED) {
        const C v = keep ? (ld(yv[j]) + ld(bias[c])) * keep_scale : C(0);
        yv[j] = st<S>(ld(rv[j]) + v);
        if (++c == cols) c = 0;
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

template <typename S, typename G>
void dropout_bias_grad_t(const void* dy, double p, const RngKey& key, const kernels::DropoutLayout& layout, void* dx,
                         void* dbias, i64 rows, i64 cols, kernels::GpuScratch ws, cudaStream_t s) {
  const auto c = kernels::gpu_scratch::dropout_column_chunks(rows, cols);
  double* partial =
      scratch_as<double>(ws, kernels::gpu_scratch::dropout_bias_grad_bytes(rows, cols), "dropout_backward_bias_grad");
  dropout_backward_partial_kernel<S>
      <<<dim3(static_cast<unsigned>(c.col_blocks), static_cast<unsigned>(c.used)), kThreads, 0, s>>>(
          static_cast<const S*>(dy), p, philox_key(key), layout, rows, cols, c.per_chunk, static_cast<S*>(dx), partial);
  check_launch("dropout_backward_bias_grad");
  finish_columns(static_cast<G*>(dbias), cols, c.used, partial, s, "dropout_backward_bias_grad");
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
    const unsigned blocks = blocks_for(rows * groups);
    const S* x = static_cast<const S*>(in);
    const auto launch = [&](auto vec) {
      dropout_kernel<S, decltype(vec)::value, false><<<blocks, kThreads, 0, s>>>(
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
    const unsigned blocks = blocks_for(rows * groups);
    const auto* yp = static_cast<const S*>(y);
    const auto* bp = static_cast<const S*>(bias);
    const auto* rp = static_cast<const S*>(residual);
    auto* op = static_cast<S*>(out);
    const auto launch = [&](auto vec) {
      dropout_kernel<S, decltype(vec)::value, true>
          <<<blocks, kThreads, 0, s>>>(yp, bp, rp, p, philox_key(key), layout, op, inner, cols, groups, rows * groups);
    };
    if (inner % G == 0 && aligned16(y) && aligned16(residual) && aligned16(out))
      launch(std::true_type{});
    else
      launch(std::false_type{});
  });
  check_launch("bias_dropout_add");
}

}  // namespace megazero::cuda
