// LayerNorm on the GPU: the launchers of megazero/cuda/layernorm.h (contracts:
// megazero/kernels/layernorm.h). One block per row; 16-bit and fp32 rows that
// fit in registers take the fast kernels (read once, written once, fp32
// statistics), others the general ones (statistics in double). The backward
// of rows up to 1024 packs is one pass for dx, dgamma and dbeta
// (layernorm_kernels.cuh); otherwise dgamma and dbeta are column sums
// (column_sums.cuh), one packed pass for both when it applies, then dx.
#include <cuda_runtime.h>

#include <initializer_list>

#include "megazero/cuda/column_sums.cuh"
#include "megazero/cuda/dropout.h"
#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/layer_helpers.cuh"
#include "megazero/cuda/layernorm.h"
#include "megazero/cuda/layernorm_forward_kernels.cuh"
#include "megazero/cuda/layernorm_kernels.cuh"

namespace megazero::cuda {
using namespace detail_k;

namespace {

template <typename S, typename C>
__global__ void layernorm_forward_kernel(const S* x, const S* gamma, const S* beta, double eps, S* y, C* mean, C* rstd,
                                         i64 cols) {
  const i64 r = blockIdx.x;
  const S* xr = x + r * cols;
  S* yr = y + r * cols;
  double sum = 0;
  for (i64 c = threadIdx.x; c < cols; c += blockDim.x) sum += ld(xr[c]);
  const double m = block_sum(sum) / static_cast<double>(cols);
  double sq = 0;
  for (i64 c = threadIdx.x; c < cols; c += blockDim.x) {
    const double d = ld(xr[c]) - m;
    sq += d * d;
  }
  const double rs = 1.0 / sqrt(block_sum(sq) / static_cast<double>(cols) + eps);
  for (i64 c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = st<S>((ld(xr[c]) - m) * rs * ld(gamma[c]) + ld(beta[c]));
  if (threadIdx.x == 0) {
    mean[r] = static_cast<C>(m);
    rstd[r] = static_cast<C>(rs);
  }
}

template <typename S, typename C>
__global__ void layernorm_backward_dx_kernel(const S* dy, const S* x, const S* gamma, const C* mean, const C* rstd,
                                             S* dx, const S* add, i64 cols) {
  const i64 r = blockIdx.x;
  const S* dyr = dy + r * cols;
  const S* xr = x + r * cols;
  S* dxr = dx + r * cols;
  const double m = mean[r], rs = rstd[r];
  double sg = 0, sgx = 0;
  for (i64 c = threadIdx.x; c < cols; c += blockDim.x) {
    const double g = static_cast<double>(ld(dyr[c])) * ld(gamma[c]);
    sg += g;
    sgx += g * (ld(xr[c]) - m) * rs;
  }
  const double inv = 1.0 / static_cast<double>(cols);
  const double mean_g = block_sum(sg) * inv, mean_gx = block_sum(sgx) * inv;
  for (i64 c = threadIdx.x; c < cols; c += blockDim.x) {
    const double g = static_cast<double>(ld(dyr[c])) * ld(gamma[c]);
    const double v = rs * (g - mean_g - (ld(xr[c]) - m) * rs * mean_gx);
    dxr[c] = st<S>(add ? v + static_cast<double>(ld(add[r * cols + c])) : v);
  }
}

// ---------------------------------------------------------------- fast paths for 16-bit and fp32 rows
// load_row and the fast forward: layernorm_forward_kernels.cuh.

template <typename S, int P>
__global__ void layernorm_backward_dx_fast_kernel(const S* dy, const S* x, const S* gamma, const float* mean,
                                                  const float* rstd, S* dx, const S* add, i64 cols) {
  constexpr int V = kVec<S>;
  const i64 r = blockIdx.x;
  float g[P * V], xh[P * V];
  load_row<S, P>(dy + r * cols, cols, g);
  load_row<S, P>(x + r * cols, cols, xh);
  const float m = mean[r], rs = rstd[r];
  float sg = 0, sgx = 0;
#pragma unroll
  for (int q = 0; q < P; ++q) {
    const i64 c0 = (static_cast<i64>(q) * blockDim.x + threadIdx.x) * V;
    if (c0 >= cols) continue;
    const Pack<S> gm = *reinterpret_cast<const Pack<S>*>(gamma + c0);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int k = q * V + j;
      g[k] *= ld(gm.v[j]);
      xh[k] = (xh[k] - m) * rs;
      sg += g[k];
      sgx += g[k] * xh[k];
    }
  }
  const float inv = 1.f / static_cast<float>(cols);
  const float mean_g = block_sum(sg) * inv, mean_gx = block_sum(sgx) * inv;
#pragma unroll
  for (int q = 0; q < P; ++q) {
    const i64 c0 = (static_cast<i64>(q) * blockDim.x + threadIdx.x) * V;
    if (c0 >= cols) continue;
    Pack<S> o, a{};
    if (add) a = *reinterpret_cast<const Pack<S>*>(add + r * cols + c0);
#pragma unroll
    for (int j = 0; j < V; ++j)
      o.v[j] = st<S>(rs * (g[q * V + j] - mean_g - xh[q * V + j] * mean_gx) + (add ? ld(a.v[j]) : 0.f));
    *reinterpret_cast<Pack<S>*>(dx + r * cols + c0) = o;
  }
}

// Picks P (packs per thread) for a row and launches with 128..512 threads;
// false when the fast path does not apply (fp64, unaligned, odd widths, huge rows).
// `max_p_at_512`: the backward's P = 8 takes ~168 registers a thread, over
// what a 512-thread block may hold (65536), so its launch would fail: rows
// that would need it (16392-32768 16-bit columns) take the general kernel.
template <typename S, typename Launch>
bool with_row_packs(i64 cols, std::initializer_list<const void*> ptrs, Launch&& launch, int max_p_at_512 = 8) {
  if constexpr (std::is_same_v<S, double>) {
    return false;
  } else {
    constexpr int V = kVec<S>;
    if (cols % V != 0) return false;
    for (const void* p : ptrs)
      if (!aligned16(p)) return false;
    const i64 packs = cols / V;
    const unsigned threads = packs >= 2048 ? 512 : packs >= 512 ? 256 : 128;
    const i64 per = (packs + threads - 1) / threads;
    if (per <= 1) return launch(std::integral_constant<int, 1>{}, threads), true;
    if (per <= 2) return launch(std::integral_constant<int, 2>{}, threads), true;
    if (per <= 4) return launch(std::integral_constant<int, 4>{}, threads), true;
    if (per <= 8 && (threads < 512 || max_p_at_512 >= 8))
      return launch(std::integral_constant<int, 8>{}, threads), true;
    return false;
  }
}

// ---------------------------------------------------------------- typed bodies
// (nvcc allows __device__ lambdas in function templates but not in generic
// lambdas, so the dtype dispatch calls these templates.)

template <typename S, typename G>
void layernorm_param_grads_t(const void* dy, const void* x, const void* mean, const void* rstd, void* dgamma, i64 rows,
                             i64 cols, kernels::GpuScratch ws, cudaStream_t s) {
  using C = compute_t<S>;
  const S* dyp = static_cast<const S*>(dy);
  const S* xp = static_cast<const S*>(x);
  const C* mp = static_cast<const C*>(mean);
  const C* rp = static_cast<const C*>(rstd);
  column_sum(
      static_cast<G*>(dgamma), rows, cols,
      [=] __device__(i64 r, i64 c) {
        return static_cast<double>(ld(dyp[r * cols + c])) *
               ((ld(xp[r * cols + c]) - static_cast<double>(mp[r])) * rp[r]);
      },
      ws, s, "layernorm_backward dgamma");
}

// The dropout backward layernorm_backward_dropout adds to the one-pass kernel.
struct FusedDropout {
  double p = 0;
  RngKey key;
  kernels::DropoutLayout layout;
  void* dd = nullptr;
  void* dbias = nullptr;  // none: no bias gradient
};

// dx, dgamma and dbeta in one pass over dy and x (and, with `drop`, dx's
// dropout backward and its bias gradient), then the partials' finish; false
// when the plan or the operands' alignment rule it out.
template <typename S, typename G>
bool layernorm_backward_fused_t(DType t, const void* dy, const void* x, const void* gamma, const void* mean,
                                const void* rstd, void* dx, void* dgamma, void* dbeta, const void* add, i64 rows,
                                i64 cols, const FusedDropout* drop, bool prefetch, kernels::GpuScratch ws,
                                cudaStream_t s) {
  if constexpr (std::is_same_v<S, double>) {
    return false;
  } else {
    const auto plan = kernels::gpu_scratch::layernorm_fused_plan(t, rows, cols);
    if (!plan.fused()) return false;
    for (const void* p : std::initializer_list<const void*>{dy, x, gamma, dx, add ? add : dx, drop ? drop->dd : dx})
      if (!aligned16(p)) return false;
    // The bias gradient's sums join the kernel's with one pack a thread, and
    // with two when every row is prefetched (208 KB: one block an SM either
    // way); with two and no prefetch they would take the default's two blocks
    // an SM to one (144 KB).
    RowDropout<S> rd{};
    const bool sums = drop && drop->dbias && (plan.packs_per_thread == 1 || prefetch);
    const int nsums = sums ? 3 : 2;
    double* pg = scratch_as<double>(ws, plan.partial_bytes(cols, nsums), "layernorm_backward partials");
    double* pb = pg + plan.blocks * cols;
    if (drop) {
      if (!row_mask(drop->layout, rows, cols, drop->p, philox_key(drop->key), rd.mask)) return false;
      rd.dd = static_cast<S*>(drop->dd);
      rd.partial = pb + plan.blocks * cols;
    }
    const i64 threads = plan.lanes * plan.threads_per_row;
    const std::size_t smem =
        layernorm_fused_smem_bytes(plan.packs_per_thread, kVec<S>, nsums, drop != nullptr, prefetch);
    const auto launch = [&](auto kernel) {
      // Up to 112 KB (8192 16-bit columns with the dropout; 176 KB for the
      // prefetched alternative, 208 KB with the dropout and its bias sums):
      // over the 48 KB a launch gets unasked, so
      // ask (per call: it is per device, and costs microseconds).
      if (smem > std::size_t{48} << 10)
        check_call(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
                   "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
      kernel<<<static_cast<unsigned>(plan.blocks), static_cast<unsigned>(threads), smem, s>>>(
          static_cast<const S*>(dy), static_cast<const S*>(x), static_cast<const S*>(gamma),
          static_cast<const float*>(mean), static_cast<const float*>(rstd), static_cast<S*>(dx),
          static_cast<const S*>(add), rows, cols, static_cast<int>(plan.threads_per_row), plan.rows_per_lane, pg, pb,
          rd);
    };
    if (plan.packs_per_thread == 1) {
      if (sums)
        launch(layernorm_backward_fused_kernel<S, 1, true, true>);
      else if (drop)
        launch(layernorm_backward_fused_kernel<S, 1, true>);
      else
        launch(layernorm_backward_fused_kernel<S, 1>);
    } else if (prefetch) {
      if (sums)
        launch(layernorm_backward_fused_kernel<S, 2, true, true, true>);
      else if (drop)
        launch(layernorm_backward_fused_kernel<S, 2, true, false, true>);
      else
        launch(layernorm_backward_fused_kernel<S, 2, false, false, true>);
    } else {
      if (drop)
        launch(layernorm_backward_fused_kernel<S, 2, true>);
      else
        launch(layernorm_backward_fused_kernel<S, 2>);
    }
    check_launch(drop ? "layernorm_backward_dropout (fused)" : "layernorm_backward (fused)");
    // The partials lie back to back: dgamma's, dbeta's (, the bias's).
    if (sums) {
      finish_columns({static_cast<G*>(dgamma), static_cast<G*>(dbeta), static_cast<G*>(drop->dbias)}, cols, plan.blocks,
                     pg, s, "layernorm_backward_dropout sums");
    } else {
      finish_columns({static_cast<G*>(dgamma), static_cast<G*>(dbeta)}, cols, plan.blocks, pg, s,
                     "layernorm_backward sums");
      // After the finish on the stream: the scratch is free again.
      if (drop && drop->dbias)
        sum_rows_t<S, G>(drop->dd, drop->dbias, rows, cols, ws, s, "layernorm_backward_dropout dbias");
    }
    return true;
  }
}

}  // namespace

void layernorm_forward(DType t, const void* x, const void* gamma, const void* beta, double eps, void* y, void* mean,
                       void* rstd, i64 rows, i64 cols, cudaStream_t s) {
  if (rows == 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    const bool fast = with_row_packs<S>(cols, {x, gamma, beta, y}, [&](auto per, unsigned threads) {
      layernorm_forward_fast_kernel<S, decltype(per)::value><<<static_cast<unsigned>(rows), threads, 0, s>>>(
          static_cast<const S*>(x), static_cast<const S*>(gamma), static_cast<const S*>(beta), static_cast<float>(eps),
          static_cast<S*>(y), static_cast<float*>(mean), static_cast<float*>(rstd), cols, RowBiasDropoutAdd<S>{});
    });
    if (!fast)
      layernorm_forward_kernel<S, C><<<static_cast<unsigned>(rows), row_threads(cols), 0, s>>>(
          static_cast<const S*>(x), static_cast<const S*>(gamma), static_cast<const S*>(beta), eps, static_cast<S*>(y),
          static_cast<C*>(mean), static_cast<C*>(rstd), cols);
  });
  check_launch("layernorm_forward");
}

void bias_dropout_add_layernorm(DType t, const void* y, const void* bias, const void* residual, double p,
                                const RngKey& key, const kernels::DropoutLayout& layout, void* sum, const void* gamma,
                                const void* beta, double eps, void* y_ln, void* mean, void* rstd, i64 rows, i64 cols,
                                cudaStream_t s) {
  if (rows == 0) return;
  bool done = false;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    if constexpr (!std::is_same_v<S, double>) {
      RowBiasDropoutAdd<S> bda{static_cast<const S*>(residual), static_cast<const S*>(bias), static_cast<S*>(sum), {}};
      if (!row_mask(layout, rows, cols, p, philox_key(key), bda.mask)) return;
      done = with_row_packs<S>(cols, {y, bias, residual, sum, gamma, beta, y_ln}, [&](auto per, unsigned threads) {
        layernorm_forward_fast_kernel<S, decltype(per)::value, true><<<static_cast<unsigned>(rows), threads, 0, s>>>(
            static_cast<const S*>(y), static_cast<const S*>(gamma), static_cast<const S*>(beta),
            static_cast<float>(eps), static_cast<S*>(y_ln), static_cast<float*>(mean), static_cast<float*>(rstd), cols,
            bda);
      });
    }
  });
  if (done) {
    check_launch("bias_dropout_add_layernorm");
    return;
  }
  bias_dropout_add(t, y, bias, residual, p, key, layout, sum, cols, s);
  layernorm_forward(t, sum, gamma, beta, eps, y_ln, mean, rstd, rows, cols, s);
}

void layernorm_backward(DType t, const void* dy, const void* x, const void* gamma, const void* mean, const void* rstd,
                        void* dx, void* dgamma, DType dgamma_type, void* dbeta, DType dbeta_type, const void* add,
                        i64 rows, i64 cols, kernels::LayerNormBackwardPasses passes, kernels::GpuScratch ws,
                        cudaStream_t s) {
  if (rows == 0) return;
  if (passes != kernels::LayerNormBackwardPasses::Split && dgamma_type == dbeta_type) {
    const bool prefetch = passes == kernels::LayerNormBackwardPasses::OnePassPrefetched;
    bool done = false;
    with_storage(t, [&](auto tag) {
      using S = decltype(tag);
      const auto run = [&](auto acc) {
        done = layernorm_backward_fused_t<S, decltype(acc)>(t, dy, x, gamma, mean, rstd, dx, dgamma, dbeta, add, rows,
                                                            cols, nullptr, prefetch, ws, s);
      };
      if (dgamma_type == DType::F32)
        run(float{});
      else if (dgamma_type == t)
        run(S{});
    });
    if (done) return;
  }
  // Parameter gradients first: dx may overwrite dy. One packed pass over dy
  // and x for both when the accumulators are fp32 (Megatron's main grads).
  bool fused = false;
  if (dgamma_type == dbeta_type && t != DType::F64) {
    with_storage(t, [&](auto tag) {
      using S = decltype(tag);
      if constexpr (!std::is_same_v<S, double>) {
        const auto run = [&](auto acc) {
          using G = decltype(acc);
          fused = packed_column_sums<S, G, G>(static_cast<const S*>(dy), static_cast<const S*>(x),
                                              static_cast<const float*>(mean), static_cast<const float*>(rstd), rows,
                                              cols, static_cast<G*>(dbeta), static_cast<G*>(dgamma), ws, s);
        };
        if (dgamma_type == DType::F32)
          run(float{});
        else
          run(S{});
      }
    });
  }
  if (!fused) {
    // One after the other on the stream, so they share the scratch.
    MZ_BY_STORAGE_AND_ACC(t, dgamma_type, layernorm_param_grads_t, dy, x, mean, rstd, dgamma, rows, cols, ws, s);
    MZ_BY_STORAGE_AND_ACC(t, dbeta_type, sum_rows_t, dy, dbeta, rows, cols, ws, s, "layernorm_backward dbeta");
  }
  if (rows == 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    const bool fast = with_row_packs<S>(
        cols, {dy, x, gamma, dx, add ? add : dx},
        [&](auto per, unsigned threads) {
          layernorm_backward_dx_fast_kernel<S, decltype(per)::value><<<static_cast<unsigned>(rows), threads, 0, s>>>(
              static_cast<const S*>(dy), static_cast<const S*>(x), static_cast<const S*>(gamma),
              static_cast<const float*>(mean), static_cast<const float*>(rstd), static_cast<S*>(dx),
              static_cast<const S*>(add), cols);
        },
        /*max_p_at_512=*/4);
    if (!fast)
      layernorm_backward_dx_kernel<S, C><<<static_cast<unsigned>(rows), row_threads(cols), 0, s>>>(
          static_cast<const S*>(dy), static_cast<const S*>(x), static_cast<const S*>(gamma),
          static_cast<const C*>(mean), static_cast<const C*>(rstd), static_cast<S*>(dx), static_cast<const S*>(add),
          cols);
  });
  check_launch("layernorm_backward");
}

void layernorm_backward_dropout(DType t, const void* dy, const void* x, const void* gamma, const void* mean,
                                const void* rstd, void* dx, void* dgamma, void* dbeta, DType acc_type, const void* add,
                                i64 rows, i64 cols, double p, const RngKey& key, const kernels::DropoutLayout& layout,
                                void* dd, void* dbias, bool prefetch, kernels::GpuScratch ws, cudaStream_t s) {
  if (rows == 0) return;
  const FusedDropout drop{p, key, layout, dd, dbias};
  bool done = false;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    const auto run = [&](auto acc) {
      done = layernorm_backward_fused_t<S, decltype(acc)>(t, dy, x, gamma, mean, rstd, dx, dgamma, dbeta, add, rows,
                                                          cols, &drop, prefetch, ws, s);
    };
    if (acc_type == DType::F32)
      run(float{});
    else if (acc_type == t)
      run(S{});
  });
  if (done) return;
  // The LayerNorm alone: its own fastest way (Auto), whatever `prefetch` said
  // of the fused one.
  layernorm_backward(t, dy, x, gamma, mean, rstd, dx, dgamma, acc_type, dbeta, acc_type, add, rows, cols,
                     kernels::LayerNormBackwardPasses::Auto, ws, s);
  if (dbias)
    dropout_backward_bias_grad(t, dx, p, key, layout, dd, dbias, acc_type, rows, cols, ws, s);
  else
    dropout(t, dx, p, key, layout, dd, s);
}

}  // namespace megazero::cuda
