// The vocabulary-parallel cross-entropy's pieces on the GPU: the launchers of
// megazero/cuda/cross_entropy.h (contracts: megazero/kernels/cross_entropy.h;
// the row kernels: vocab_kernels.cuh, one block per row).
#include <cuda_runtime.h>

#include <cmath>

#include "megazero/cuda/cross_entropy.h"
#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/layer_helpers.cuh"
#include "megazero/cuda/vocab_kernels.cuh"

namespace megazero::cuda {
using namespace detail_k;

void cross_entropy_forward(DType t, const void* logits, const std::int64_t* targets, i64 vocab_start, i64 rows,
                           i64 cols, i64 valid, void* row_max, void* sum_exp, void* target_logit, cudaStream_t s) {
  if (rows == 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    const auto launch = [&](auto kernel) {
      kernel<<<static_cast<unsigned>(rows), 512, 0, s>>>(static_cast<const S*>(logits), targets, vocab_start, cols,
                                                         valid, static_cast<C*>(row_max), static_cast<C*>(sum_exp),
                                                         static_cast<C*>(target_logit));
    };
    if (cols % kVec<S> == 0 && aligned16(logits))
      launch(cross_entropy_forward_kernel<S, kVec<S>>);
    else
      launch(cross_entropy_forward_kernel<S, 1>);
  });
  check_launch("cross_entropy_forward");
}

namespace {
// (Typed bodies, not generic lambdas: nvcc allows no __device__ lambda there.)
template <typename C>
void rescale_sum_exp_t(const void* row_max, const void* global_max, i64 rows, void* sum_exp, cudaStream_t s) {
  const C* m = static_cast<const C*>(row_max);
  const C* g = static_cast<const C*>(global_max);
  C* se = static_cast<C*>(sum_exp);
  // A slice of only padding (sum 0, max -inf) stays 0.
  elementwise(
      se, rows,
      [=] __device__(i64 r) {
        return se[r] == C(0) ? C(0)
                             : static_cast<C>(static_cast<double>(se[r]) *
                                              exp(static_cast<double>(m[r]) - static_cast<double>(g[r])));
      },
      s, "rescale_sum_exp");
}

template <typename C>
void cross_entropy_loss_t(const void* global_max, const void* sum_exp, const void* target_logit, const void* weight,
                          i64 rows, void* loss, cudaStream_t s) {
  const C* m = static_cast<const C*>(global_max);
  const C* se = static_cast<const C*>(sum_exp);
  const C* tl = static_cast<const C*>(target_logit);
  const C* w = static_cast<const C*>(weight);
  elementwise(
      static_cast<C*>(loss), rows,
      [=] __device__(i64 r) {
        const double l = log(static_cast<double>(se[r])) + static_cast<double>(m[r]) - static_cast<double>(tl[r]);
        return static_cast<C>(w ? l * static_cast<double>(w[r]) : l);
      },
      s, "cross_entropy_loss");
}
}  // namespace

void rescale_sum_exp(DType stat, const void* row_max, const void* global_max, i64 rows, void* sum_exp, cudaStream_t s) {
  if (stat == DType::F64)
    rescale_sum_exp_t<double>(row_max, global_max, rows, sum_exp, s);
  else
    rescale_sum_exp_t<float>(row_max, global_max, rows, sum_exp, s);
}

void cross_entropy_loss(DType stat, const void* global_max, const void* sum_exp, const void* target_logit,
                        const void* weight, i64 rows, void* loss, cudaStream_t s) {
  if (stat == DType::F64)
    cross_entropy_loss_t<double>(global_max, sum_exp, target_logit, weight, rows, loss, s);
  else
    cross_entropy_loss_t<float>(global_max, sum_exp, target_logit, weight, rows, loss, s);
}

void cross_entropy_backward(DType t, const void* logits, const void* global_max, const void* sum_exp,
                            const std::int64_t* targets, i64 vocab_start, i64 rows, i64 cols, i64 valid, double scale,
                            const void* weight, void* dlogits, cudaStream_t s) {
  if (rows == 0) return;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    const auto launch = [&](auto kernel) {
      kernel<<<static_cast<unsigned>(rows), 512, 0, s>>>(
          static_cast<const S*>(logits), static_cast<const C*>(global_max), static_cast<const C*>(sum_exp), targets,
          vocab_start, cols, valid, scale, static_cast<const C*>(weight), static_cast<S*>(dlogits));
    };
    if (cols % kVec<S> == 0 && aligned16(logits) && aligned16(dlogits))
      launch(cross_entropy_backward_kernel<S, kVec<S>>);
    else
      launch(cross_entropy_backward_kernel<S, 1>);
  });
  check_launch("cross_entropy_backward");
}

bool cross_entropy_fuses(DType t, i64 cols) {
  // Four blocks an SM (at most a quarter of the opt-in maximum each), or the
  // two kernels. Measured on an H200 (2026-11-28, bench_kernels): with two
  // blocks an SM (GPT-2's 16-bit row, 100.6 KB) the one pass took 1.079 ms at
  // [8192, 50304] against the two kernels' 0.937 ms (0.87x): a block's reads
  // idle through its reductions and writes with one other block beside it;
  // with four (a 25216-column row, 50.4 KB) it took 0.071 ms against 0.077 ms
  // at [1024, 25216] (1.09x).
  int device = 0, optin = 0;
  check_call(cudaGetDevice(&device), "cudaGetDevice");
  check_call(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
             "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  return 4 * cols * static_cast<i64>(dtype_size(t)) <= optin;
}

bool cross_entropy_forward_backward(DType t, const void* logits, const std::int64_t* targets, i64 vocab_start, i64 rows,
                                    i64 cols, i64 valid, double scale, const void* weight, void* row_max, void* sum_exp,
                                    void* target_logit, void* dlogits, cudaStream_t s) {
  if (rows == 0) return true;
  if (!cross_entropy_fuses(t, cols)) {
    cross_entropy_forward(t, logits, targets, vocab_start, rows, cols, valid, row_max, sum_exp, target_logit, s);
    cross_entropy_backward(t, logits, row_max, sum_exp, targets, vocab_start, rows, cols, valid, scale, weight, dlogits,
                           s);
    return false;
  }
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    const std::size_t smem = static_cast<std::size_t>(cols) * sizeof(S);
    const auto launch = [&](auto kernel) {
      if (smem > std::size_t{48} << 10)  // over what a launch gets unasked
        check_call(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
                   "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
      kernel<<<static_cast<unsigned>(rows), 512, smem, s>>>(
          static_cast<const S*>(logits), targets, vocab_start, cols, valid, scale, static_cast<const C*>(weight),
          static_cast<C*>(row_max), static_cast<C*>(sum_exp), static_cast<C*>(target_logit), static_cast<S*>(dlogits));
    };
    if (cols % kVec<S> == 0 && aligned16(logits) && aligned16(dlogits))
      launch(cross_entropy_fused_kernel<S, kVec<S>>);
    else
      launch(cross_entropy_fused_kernel<S, 1>);
  });
  check_launch("cross_entropy_forward_backward");
  return true;
}

}  // namespace megazero::cuda
