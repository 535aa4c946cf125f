// LayerNorm's backward in one pass over dy and x: dx and the dgamma/dbeta
// partials together (the launcher, layernorm.cu, adds the partials with
// column_finish_kernel). Kernels only, plain enough for the CPU emulation in
// tests/cuda_emulation to run them as they are.
//
// Why: the split backward (a row kernel for dx, then column_partial_packed_kernel
// for dgamma/dbeta) reads dy and x twice: 1 GB of extra traffic per LayerNorm
// of the 100B layer ([32768, 8192] bf16), ~0.22 ms on an H200 each. Here a
// block holds `lanes` rows at a time, one per lane of `threads_per_row`
// threads; a thread keeps its columns' dgamma/dbeta sums in fp32 (in shared
// memory) over the rows of its lane (gpu_scratch::layernorm_fused_plan: 125
// for the 100B layer, 8 for GPT-2 medium), the lanes are added in lane order
// in double and each block writes one row of double partials. Fixed order
// everywhere, no atomics: a run repeats bit for bit. (Transformer Engine's
// LayerNorm backward keeps fp32 partials the same way.)
#pragma once

#include <cuda_pipeline_primitives.h>

#include <cstdint>

#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/packs.cuh"
#include "megazero/cuda/row_mask.cuh"
#include "megazero/kernels/dropout.h"
#include "megazero/kernels/gpu_scratch.h"

namespace megazero::cuda::detail_k {

// The largest block the fused kernel is launched with.
constexpr int kLayerNormFusedMaxThreads = static_cast<int>(kernels::gpu_scratch::kLayerNormFusedMaxThreads);

// Sums a and b over each lane's T threads (lane = threadIdx.x / T, T a
// multiple of 32); every thread gets its lane's two sums. A xor butterfly
// leaves every thread of a warp the same value, then the lane's warps are
// added in order. `parts` (shared, [kLayerNormFusedMaxThreads / 32]) must not
// be written again before every thread has returned: callers alternate two.
__device__ __forceinline__ void lane_sums(float& a, float& b, int T, float (*parts)[2]) {
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
  const int warp = static_cast<int>(threadIdx.x >> 5), warps = T >> 5;
  if ((threadIdx.x & 31) == 0) {
    parts[warp][0] = a;
    parts[warp][1] = b;
  }
  __syncthreads();
  const int first = warp / warps * warps;
  a = parts[first][0];
  b = parts[first][1];
  for (int w = 1; w < warps; ++w) {
    a += parts[first + w][0];
    b += parts[first + w][1];
  }
}

// The dropout backward of the kernel's dx (the residual stream's gradient as
// it enters the sub-block below, e.g. a transformer layer's attention output
// dropout), written in the same pass: dd = dx * keep / (1 - p), dx's rounded
// values with dropout_backward's mask, formula and rounding (bit for bit), for
// a layout whose layout rows are the tensor's rows (row_mask.cuh). Saves the
// dropout backward's own pass (a read of dx, 512 MB at the 100B layer's
// [32768, 8192]) and launch. partial (the kernel's SUMS): dd's column sums,
// written as dgamma's.
template <typename S>
struct RowDropout {
  S* dd = nullptr;
  double* partial = nullptr;
  RowMask<S> mask;
};

// dx (over dy, + add when given) for the rows of this block, and its partial
// dgamma/dbeta sums: partial_g[blockIdx.x * cols + c] = sum over the block's
// rows of dy * xhat, partial_b likewise of dy. Block b covers rows
// [b * lanes * rows_per_lane, ...); lane l of it takes rows first + l,
// first + l + lanes, ... (rows_per_lane of them). threads_per_row * P *
// kVec<S> >= cols; blockDim.x = lanes * threads_per_row; mean/rstd fp32 (the
// fast forward's). The lanes run in step (each row ends in a block barrier),
// a lane past the last row with zeros.
//
// Registers hold the row's dy and x as 16-byte packs, converted where used;
// the rest lives in dynamic shared memory, layernorm_fused_smem_bytes of it,
// in slots each thread alone touches (no bank conflicts, no barriers):
// - the column sums, [sum][k][thread] floats. In registers they took the
//   8192-column kernel to 122 registers a thread, one 512-thread block an SM;
//   this way the kernel needs what the split path's dx kernel needs;
// - the thread's gamma packs, [q][thread], copied once: the row loop read
//   them from L2 twice a row;
// - the row's residual-gradient packs, [q][thread], copied asynchronously
//   (cp.async: no registers held) when the row's dy and x are loaded, and
//   waited for after the lane's barrier. Loaded after the barrier (two packs
//   a thread have no registers to spare before it), they were a second
//   memory round trip a row in series with the first: at the 100B layer's
//   width the one-pass backward ran ~5.5 us a row, latency-bound.
// DROP: dx's dropout backward too (RowDropout; dd must not alias dx or dy);
// SUMS: and dd's column sums, a third [N][thread] array of shared memory
// (+16 KB at one pack a thread: 104 KB, still two blocks an SM; at two packs
// it would be 128 KB, one block an SM, so the launcher sums dd afterwards).
// PF: dy, x and the residual gradient copied a row ahead into double buffers
// (the default with one pack a thread; with two, 176 KB of shared memory a
// block, one block an SM, so up to 128 registers: 91 for bf16, no spills; an
// alternative bench_kernels times against the default's two blocks without it).
template <typename S, int P, bool DROP = false, bool SUMS = false, bool PF = (P == 1)>
__global__ void __launch_bounds__(kLayerNormFusedMaxThreads, PF&& P > 1 ? 1 : 2)
    layernorm_backward_fused_kernel(const S* dy, const S* x, const S* gamma, const float* mean, const float* rstd,
                                    S* dx, const S* add, i64 rows, i64 cols, int threads_per_row, i64 rows_per_lane,
                                    double* partial_g, double* partial_b, RowDropout<S> drop) {
  static_assert(DROP || !SUMS, "dd's sums need dd");
  constexpr int V = kVec<S>;
  constexpr int N = P * V;
  constexpr int NS = SUMS ? 3 : 2;  // column sums a column: dgamma's, dbeta's (, dd's)
  static_assert(V % 4 == 0, "a pack is whole Philox blocks");
  __shared__ float parts[2][kLayerNormFusedMaxThreads / 32][2];
  // [NS][N][kLayerNormFusedMaxThreads]: dgamma's, then dbeta's (, dd's); a
  // constant stride, so the slots' addresses are immediates, not registers.
  // Then gamma's and the residual gradient's [P][kLayerNormFusedMaxThreads] packs.
  constexpr int kStride = kLayerNormFusedMaxThreads;
  float* const sums = dynamic_shared<float>() + threadIdx.x;
  Pack<S>* const gam = reinterpret_cast<Pack<S>*>(dynamic_shared<float>() + NS * N * kStride) + threadIdx.x;
  // Row i's copies land in buffer b: with one pack a thread (kPrefetch) dy, x
  // and the residual gradient, issued a row ahead, so they are in flight
  // while the previous row is computed; with two, only this row's residual
  // gradient (dy and x go to registers: double buffers for them would leave
  // one block an SM).
  constexpr bool kPrefetch = PF;
  constexpr int kBuffers = kPrefetch ? 2 : 1;
  Pack<S>* const res = gam + P * kStride;             // [kBuffers][P][kStride]
  Pack<S>* const dyb = res + kBuffers * P * kStride;  // kPrefetch: [2][P][kStride]
  Pack<S>* const xb = dyb + kBuffers * P * kStride;   // kPrefetch: [2][P][kStride]
  // DROP with two packs a thread: the row's dx packs wait here ([P][kStride],
  // where the prefetch buffers would be) while the Philox rounds run; held in
  // registers they spilled. Not the residual gradient's slots: cp.async
  // writes those again, unordered with this thread's own stores.
  constexpr bool kStash = DROP && !kPrefetch;
  Pack<S>* const stash = dyb;
  const unsigned bd = blockDim.x, me = threadIdx.x;
  const int T = threads_per_row;
  const int lanes = static_cast<int>(bd) / T;
  const int lane = static_cast<int>(me) / T;
  const i64 t = static_cast<i64>(me) % T;
  const i64 first = static_cast<i64>(blockIdx.x) * lanes * rows_per_lane;
  const float inv = 1.f / static_cast<float>(cols);
  using C = compute_t<S>;
#pragma unroll
  for (int k = 0; k < NS * N; ++k) sums[k * kStride] = 0.f;
#pragma unroll
  for (int q = 0; q < P; ++q) {
    const i64 c0 = (static_cast<i64>(q) * T + t) * V;
    if (c0 < cols) gam[q * kStride] = *reinterpret_cast<const Pack<S>*>(gamma + c0);
  }
  const auto issue = [&](i64 i, int b) {  // one commit group, empty past the lane's rows
    const i64 r = first + i * lanes + lane;
    if (i < rows_per_lane && r < rows) {
#pragma unroll
      for (int q = 0; q < P; ++q) {
        const i64 c0 = (static_cast<i64>(q) * T + t) * V;
        if (c0 >= cols) continue;
        const int slot = (b * P + q) * kStride;
        if constexpr (kPrefetch) {
          __pipeline_memcpy_async(dyb + slot, dy + r * cols + c0, sizeof(Pack<S>));
          __pipeline_memcpy_async(xb + slot, x + r * cols + c0, sizeof(Pack<S>));
        }
        if (add) __pipeline_memcpy_async(res + slot, add + r * cols + c0, sizeof(Pack<S>));
      }
    }
    __pipeline_commit();
  };
  if constexpr (kPrefetch) issue(0, 0);
  for (i64 i = 0; i < rows_per_lane; ++i) {
    const i64 r = first + i * lanes + lane;
    const bool live = r < rows;
    const i64 row = (live ? r : 0) * cols;
    const int b = kPrefetch ? static_cast<int>(i & 1) : 0;
    if constexpr (kPrefetch) {
      issue(i + 1, b ^ 1);       // buffer b ^ 1 was row i - 1's, read to the end last iteration
      __pipeline_wait_prior(1);  // row i's copies have landed
    }
    Pack<S> pd[P], px[P];
    float m = 0.f, rs = 0.f;
#pragma unroll
    for (int q = 0; q < P; ++q) {
      const i64 c0 = (static_cast<i64>(q) * T + t) * V;
      if (live && c0 < cols) {
        if constexpr (kPrefetch) {
          pd[q] = dyb[(b * P + q) * kStride];
          px[q] = xb[(b * P + q) * kStride];
        } else {
          pd[q] = *reinterpret_cast<const Pack<S>*>(dy + row + c0);
          px[q] = *reinterpret_cast<const Pack<S>*>(x + row + c0);
        }
      }
    }
    if constexpr (!kPrefetch) issue(i, 0);
    if (live) {
      m = mean[r];
      rs = rstd[r];
    }
    float sg = 0.f, sgx = 0.f;
#pragma unroll
    for (int q = 0; q < P; ++q) {
      const i64 c0 = (static_cast<i64>(q) * T + t) * V;
      if (!live || c0 >= cols) continue;
      const Pack<S> gm = gam[q * kStride];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int k = q * V + j;
        const float d = ld(pd[q].v[j]), xh = (ld(px[q].v[j]) - m) * rs, g = d * ld(gm.v[j]);
        sums[k * kStride] += d * xh;
        sums[(N + k) * kStride] += d;
        sg += g;
        sgx += g * xh;
      }
    }
    lane_sums(sg, sgx, T, parts[i & 1]);
    if (!live) continue;                                 // it copied nothing
    if constexpr (!kPrefetch) __pipeline_wait_prior(0);  // this row's residual-gradient packs
    const float mean_g = sg * inv, mean_gx = sgx * inv;
    Pack<S> kept_dx[kStash ? 1 : P];  // one pack a thread: dx's pack stays in registers
#pragma unroll
    for (int q = 0; q < P; ++q) {
      const i64 c0 = (static_cast<i64>(q) * T + t) * V;
      if (c0 >= cols) continue;
      const Pack<S> gm = gam[q * kStride];
      const Pack<S> a = add ? res[(b * P + q) * kStride] : Pack<S>{};
      Pack<S> o;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float xh = (ld(px[q].v[j]) - m) * rs, g = ld(pd[q].v[j]) * ld(gm.v[j]);
        o.v[j] = st<S>(rs * (g - mean_g - xh * mean_gx) + (add ? ld(a.v[j]) : 0.f));
      }
      *reinterpret_cast<Pack<S>*>(dx + row + c0) = o;
      if constexpr (kStash)
        stash[q * kStride] = o;
      else if constexpr (DROP)
        kept_dx[q] = o;
    }
    if constexpr (DROP) {
      // After all of the row's dx, one pack at a time: dy's and x's packs
      // are dead by then, which leaves the Philox rounds registers. (ptxas,
      // sm_90, 64 registers: 22 bytes spilled with two bf16 packs a thread,
      // more unrolled; none in the other instances.)
#pragma unroll 1
      for (int q = 0; q < P; ++q) {
        const i64 c0 = (static_cast<i64>(q) * T + t) * V;
        if (c0 >= cols) continue;
        const Pack<S> o = kStash ? stash[q * kStride] : kept_dx[kStash ? 0 : q];
        const unsigned keep = keep_bits(drop.mask, r, cols, c0);
        Pack<S> od;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          od.v[j] = (keep >> j) & 1u ? st<S>(ld(o.v[j]) * drop.mask.keep_scale) : st<S>(C(0));
          if constexpr (SUMS) sums[(2 * N + q * V + j) * kStride] += ld(od.v[j]);
        }
        *reinterpret_cast<Pack<S>*>(drop.dd + row + c0) = od;
      }
    }
  }
  // Lane 0's threads add the other lanes' sums in lane order, in double.
  __syncthreads();
  if (lane != 0) return;
  for (int s = 0; s < NS; ++s) {
    double* out = (s == 0 ? partial_g : s == 1 ? partial_b : drop.partial) + static_cast<i64>(blockIdx.x) * cols;
    for (int k = 0; k < N; ++k) {
      const i64 c = (static_cast<i64>(k / V) * T + t) * V + k % V;
      if (c >= cols) continue;
      const float* col = sums - me + (s * N + k) * kStride + t;
      double sum = col[0];
      for (int l = 1; l < lanes; ++l) sum += col[l * T];
      out[c] = sum;
    }
  }
}

// The dynamic shared memory the kernel above needs: the column sums (`sums`
// of them: 2, or 3 with SUMS), then 16-byte packs a thread: gamma's, and the
// residual gradient's (one pack a thread: dy's, x's and the residual
// gradient's, double-buffered; two with `drop`, DROP: dx's stash too).
// GPT-2 medium: 32 + 56 KB (48 + 56 with SUMS); the 100B layer: 64 + 32 KB
// (64 + 48 with DROP: 112 KB, the most that still fits two blocks an SM of
// 228 KB with the 1 KB a block the driver keeps; `prefetch` with two packs:
// 64 + 112 KB, one block an SM).
inline std::size_t layernorm_fused_smem_bytes(int packs_per_thread, int vec, int sums = 2, bool drop = false,
                                              bool prefetch = false) {
  const bool pf = prefetch || packs_per_thread == 1;
  const int packs = pf ? packs_per_thread * (1 + 3 * 2) : packs_per_thread * (drop ? 3 : 2);
  return static_cast<std::size_t>(sums * packs_per_thread * vec * kLayerNormFusedMaxThreads) * sizeof(float) +
         static_cast<std::size_t>(packs * kLayerNormFusedMaxThreads) * 16;
}

}  // namespace megazero::cuda::detail_k
