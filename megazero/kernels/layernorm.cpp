// LayerNorm (layernorm.h): shape checks, device dispatch and the CPU kernels.
// Each public function validates its arguments (also on the meta device, where
// nothing is computed), then runs a template over the storage type S (float,
// double, BFloat16 or Half) on raw pointers: elements are read with ld() into
// the compute type C = compute_t<S> and written with st<S>(), which rounds
// once to nearest even (kernel_support.h). Rows are OpenMP-parallel; dgamma
// and dbeta are summed column block by column block in a fixed row order, so
// results are bitwise identical for any thread count.
#include "megazero/kernels/layernorm.h"

#include <cmath>

#include "megazero/core/error.h"
#include "megazero/kernels/cpu_loops.h"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/kernel_support.h"
#ifdef MEGAZERO_WITH_CUDA
#include "megazero/cuda/layernorm.h"
#endif

namespace megazero::kernels {

namespace {

using namespace detail;  // kernel_support.h, cpu_loops.h

// Two-pass mean and variance in double: no cancellation for rows with a large
// mean, and fp32 statistics are rounded once. Reads x[c] before writing y[c].
template <typename S, typename C = compute_t<S>>
void layernorm_forward_cpu(const S* x, const S* gamma, const S* beta, double eps, S* y, C* mean, C* rstd, Rows s) {
#pragma omp parallel for num_threads(threads()) schedule(static) if (s.rows * s.cols > kParallelMin)
  for (i64 r = 0; r < s.rows; ++r) {
    const S* xr = x + r * s.cols;
    S* yr = y + r * s.cols;
    double sum = 0;
    for (i64 c = 0; c < s.cols; ++c) sum += ld(xr[c]);
    const double m = sum / static_cast<double>(s.cols);
    double sq = 0;
    for (i64 c = 0; c < s.cols; ++c) sq += (ld(xr[c]) - m) * (ld(xr[c]) - m);
    const double rs = 1.0 / std::sqrt(sq / static_cast<double>(s.cols) + eps);
    for (i64 c = 0; c < s.cols; ++c) yr[c] = st<S>((ld(xr[c]) - m) * rs * ld(gamma[c]) + ld(beta[c]));
    mean[r] = static_cast<C>(m);
    rstd[r] = static_cast<C>(rs);
  }
}

// dgamma += sum_r dy * xhat, dbeta += sum_r dy, each into its own accumulator type.
template <typename S, typename C = compute_t<S>>
void layernorm_param_grads_cpu(const S* dy, const S* x, const C* mean, const C* rstd, const Tensor& dgamma,
                               const Tensor& dbeta, Rows s) {
  with_accumulator_type<S>(dgamma, [&](auto tag) {
    using G = decltype(tag);
    accumulate_columns(ptr<G>(dgamma), s.rows, s.cols, [&](i64 r, i64 c) {
      return static_cast<double>(ld(dy[r * s.cols + c])) *
             ((ld(x[r * s.cols + c]) - static_cast<double>(mean[r])) * rstd[r]);
    });
  });
  with_accumulator_type<S>(dbeta, [&](auto tag) {
    using G = decltype(tag);
    accumulate_columns(ptr<G>(dbeta), s.rows, s.cols,
                       [&](i64 r, i64 c) { return static_cast<double>(ld(dy[r * s.cols + c])); });
  });
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma.
// Reads dy[c] before writing dx[c], so dx may alias dy.
template <typename S, typename C = compute_t<S>>
void layernorm_backward_dx_cpu(const S* dy, const S* x, const S* gamma, const C* mean, const C* rstd, S* dx,
                               const S* add, Rows s) {
  const double inv_cols = 1.0 / static_cast<double>(s.cols);
#pragma omp parallel for num_threads(threads()) schedule(static) if (s.rows * s.cols > kParallelMin)
  for (i64 r = 0; r < s.rows; ++r) {
    const S* dyr = dy + r * s.cols;
    const S* xr = x + r * s.cols;
    S* dxr = dx + r * s.cols;
    const double m = mean[r], rs = rstd[r];
    double sum_g = 0, sum_gx = 0;
    for (i64 c = 0; c < s.cols; ++c) {
      const double g = static_cast<double>(ld(dyr[c])) * ld(gamma[c]);
      sum_g += g;
      sum_gx += g * (ld(xr[c]) - m) * rs;
    }
    const double mean_g = sum_g * inv_cols, mean_gx = sum_gx * inv_cols;
    const S* addr = add ? add + r * s.cols : nullptr;
    for (i64 c = 0; c < s.cols; ++c) {
      const double g = static_cast<double>(ld(dyr[c])) * ld(gamma[c]);
      const double v = rs * (g - mean_g - (ld(xr[c]) - m) * rs * mean_gx);
      dxr[c] = st<S>(addr ? v + static_cast<double>(ld(addr[c])) : v);
    }
  }
}

}  // namespace

namespace {

// layernorm_forward's argument checks; its rows and columns.
Rows check_forward(const char* op, const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps,
                   const Tensor& y, const Tensor& mean, const Tensor& rstd) {
  check_float(op, "x", x);
  const DType dt = x.dtype();
  const Rows s = rows_of(op, "x", x);
  MZ_CHECK(s.cols > 0, op, ": x has no columns: ", x.to_string());
  MZ_CHECK(eps >= 0, op, ": eps must be non-negative, got ", eps);
  check_operands(op, x, dt, {{"x", &x}, {"gamma", &gamma}, {"beta", &beta}, {"y", &y}});
  check_stat(op, "mean", mean, x, dt);
  check_stat(op, "rstd", rstd, x, dt);
  check_shapes(op, {s.cols}, {{"gamma", &gamma}, {"beta", &beta}});
  check_shape(op, "y", y, x.shape());
  check_rows(op, "mean", mean, s.rows);
  check_rows(op, "rstd", rstd, s.rows);
  return s;
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& y, Tensor& mean,
                       Tensor& rstd) {
  constexpr const char* op = "layernorm_forward";
  const Rows s = check_forward(op, x, gamma, beta, eps, y, mean, rstd);
  const DType dt = x.dtype();
  MZ_ON_CUDA(x, cuda::layernorm_forward(dt, x.data(), gamma.data(), beta.data(), eps, y.data(), mean.data(),
                                        rstd.data(), s.rows, s.cols, stream_of(x)));
  if (!on_host(op, x)) return;
  with_storage_type(dt, [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    layernorm_forward_cpu<S>(ptr<const S>(x), ptr<const S>(gamma), ptr<const S>(beta), eps, ptr<S>(y), ptr<C>(mean),
                             ptr<C>(rstd), s);
  });
}

namespace {

// layernorm_backward's argument checks; its rows and columns.
Rows check_backward(const char* op, const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                    const Tensor& rstd, const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta,
                    const Tensor* add_to_dx) {
  check_float(op, "x", x);
  const DType dt = x.dtype();
  const Rows s = rows_of(op, "x", x);
  check_operands(op, x, dt, {{"dy", &dy}, {"x", &x}, {"gamma", &gamma}, {"dx", &dx}});
  check_stat(op, "mean", mean, x, dt);
  check_stat(op, "rstd", rstd, x, dt);
  check_accumulator(op, "dgamma", dgamma, x, dt);
  check_accumulator(op, "dbeta", dbeta, x, dt);
  check_shapes(op, x.shape(), {{"dy", &dy}, {"dx", &dx}});
  if (add_to_dx) {
    check_operand(op, "add_to_dx", *add_to_dx, x, dt);
    check_shape(op, "add_to_dx", *add_to_dx, x.shape());
  }
  check_shapes(op, {s.cols}, {{"gamma", &gamma}, {"dgamma", &dgamma}, {"dbeta", &dbeta}});
  check_rows(op, "mean", mean, s.rows);
  check_rows(op, "rstd", rstd, s.rows);
  return s;
}

}  // namespace

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                        Tensor& dx, Tensor& dgamma, Tensor& dbeta, const Tensor* add_to_dx,
                        [[maybe_unused]] LayerNormBackwardPasses passes) {
  constexpr const char* op = "layernorm_backward";
  const Rows s = check_backward(op, dy, x, gamma, mean, rstd, dx, dgamma, dbeta, add_to_dx);
  const DType dt = x.dtype();
  const Tensor ws =
      allocate_gpu_scratch(x, gpu_scratch::layernorm_backward_bytes(dt, s.rows, s.cols), "layernorm_backward scratch");
  MZ_ON_CUDA(x, cuda::layernorm_backward(dt, dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(), dx.data(),
                                         dgamma.data(), dgamma.dtype(), dbeta.data(), dbeta.dtype(),
                                         add_to_dx ? add_to_dx->data() : nullptr, s.rows, s.cols, passes,
                                         scratch_of(ws), stream_of(x)));
  if (!on_host(op, x)) return;
  with_storage_type(dt, [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    // Parameter gradients first: dx may overwrite dy.
    layernorm_param_grads_cpu<S>(ptr<const S>(dy), ptr<const S>(x), ptr<const C>(mean), ptr<const C>(rstd), dgamma,
                                 dbeta, s);
    layernorm_backward_dx_cpu<S>(ptr<const S>(dy), ptr<const S>(x), ptr<const S>(gamma), ptr<const C>(mean),
                                 ptr<const C>(rstd), ptr<S>(dx), add_to_dx ? ptr<const S>(*add_to_dx) : nullptr, s);
  });
}

void layernorm_backward_dropout(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta, const Tensor* add_to_dx,
                                const DropoutBackwardOf& then, LayerNormBackwardPasses passes) {
  constexpr const char* op = "layernorm_backward_dropout";
  MZ_CHECK(then.out != nullptr, op, ": no tensor for the dropout's gradient (DropoutBackwardOf::out)");
  const Rows s = check_backward(op, dy, x, gamma, mean, rstd, dx, dgamma, dbeta, add_to_dx);
  const DType dt = x.dtype();
  Tensor& out = *then.out;
  check_operand(op, "the dropout's gradient", out, x, dt);
  check_shape(op, "the dropout's gradient", out, x.shape());
  MZ_CHECK(!storage_overlaps(out, dx) && !storage_overlaps(out, dy), op,
           ": the dropout's gradient must not share dx's or dy's storage (dx is read as the residual's gradient after "
           "it)");
  if (then.dbias) {
    check_accumulator(op, "dbias", *then.dbias, x, dt);
    check_shape(op, "dbias", *then.dbias, {s.cols});
  }
  MZ_CHECK(then.p >= 0.0 && then.p < 1.0, op, ": dropout probability ", then.p, " must be in [0, 1)");
  check_layout(op, then.layout, x.numel());
  // One kernel writes dx and the dropout's gradient and sums three columns'
  // worth into accumulators of one dtype; anything else is the two calls.
  const DType acc = dgamma.dtype();
  if (runs_cuda_kernels(x.device()) && passes != LayerNormBackwardPasses::Split && dbeta.dtype() == acc &&
      (!then.dbias || then.dbias->dtype() == acc)) {
    const Tensor ws = allocate_gpu_scratch(x, gpu_scratch::layernorm_dropout_backward_bytes(dt, s.rows, s.cols),
                                           "layernorm_backward_dropout scratch");
    MZ_ON_CUDA(x, cuda::layernorm_backward_dropout(
                      dt, dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(), dx.data(), dgamma.data(),
                      dbeta.data(), acc, add_to_dx ? add_to_dx->data() : nullptr, s.rows, s.cols, then.p, then.key,
                      then.layout, out.data(), then.dbias ? then.dbias->data() : nullptr,
                      passes == LayerNormBackwardPasses::OnePassPrefetched || passes == LayerNormBackwardPasses::Auto,
                      scratch_of(ws), stream_of(x)));
    if (!on_host(op, x)) return;  // the meta device standing in for a GPU: sizes only
  }
  layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, add_to_dx, passes);
  dropout_backward_of(dx, then);
}

void bias_dropout_add_layernorm(const Tensor& y, const BiasDropoutAddOf& before, const Tensor& gamma,
                                const Tensor& beta, double eps, Tensor& y_ln, Tensor& mean, Tensor& rstd) {
  constexpr const char* op = "bias_dropout_add_layernorm";
  MZ_CHECK(before.bias && before.residual && before.out, op,
           ": the bias-dropout-add needs its bias, residual and output (BiasDropoutAddOf)");
  Tensor& sum = *before.out;
  MZ_CHECK(!storage_overlaps(y_ln, sum), op,
           ": the LayerNorm's output must not share the sum's storage (the sum is the residual stream)");
  if (y.device().kind() == DeviceKind::CUDA) {
    // bias_dropout_add's checks, then layernorm_forward's on the sum.
    check_float(op, "y", y);
    const Rows s = rows_of(op, "y", y);
    check_operands(op, y, y.dtype(),
                   {{"y", &y}, {"bias", before.bias}, {"residual", before.residual}, {"the sum", &sum}});
    check_shape(op, "bias", *before.bias, {s.cols});
    check_shapes(op, y.shape(), {{"residual", before.residual}, {"the sum", &sum}});
    MZ_CHECK(before.p >= 0.0 && before.p < 1.0, op, ": dropout probability ", before.p, " must be in [0, 1)");
    check_layout(op, before.layout, y.numel());
    check_forward(op, sum, gamma, beta, eps, y_ln, mean, rstd);
    MZ_ON_CUDA(
        y, cuda::bias_dropout_add_layernorm(y.dtype(), y.data(), before.bias->data(), before.residual->data(), before.p,
                                            before.key, before.layout, sum.data(), gamma.data(), beta.data(), eps,
                                            y_ln.data(), mean.data(), rstd.data(), s.rows, s.cols, stream_of(y)));
  }
  bias_dropout_add(y, *before.bias, *before.residual, before.p, before.key, before.layout, sum);
  layernorm_forward(sum, gamma, beta, eps, y_ln, mean, rstd);
}

}  // namespace megazero::kernels
