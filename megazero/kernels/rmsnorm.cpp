// RMSNorm (rmsnorm.h): argument checks, the CUDA dispatch (cuda/rmsnorm.cu) and
// the CPU kernels. The CPU follows layernorm.cpp: per-row sums
// in double, each result computed in double from the exactly loaded inputs and
// rounded once into the storage type; rows are split over threads, and
// dgamma's column sums are taken column block by column block in row order, so
// no result depends on the thread count.
#include "megazero/kernels/rmsnorm.h"

#include <algorithm>
#include <cmath>

#include "megazero/core/error.h"
#include "megazero/kernels/kernel_support.h"
#ifdef MEGAZERO_WITH_CUDA
#include "megazero/cuda/rmsnorm_cuda.h"
#endif

namespace megazero::kernels {

namespace {

using namespace detail;  // kernel_support.h

// y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + eps). Reads a whole row
// before writing it, so y may alias x.
template <typename S, typename C = compute_t<S>>
void rmsnorm_forward_cpu(const S* x, const S* gamma, double eps, S* y, C* rstd, Rows s) {
  const double cols = static_cast<double>(s.cols);
#pragma omp parallel for num_threads(threads()) schedule(static) if (s.rows * s.cols > kParallelMin)
  for (i64 r = 0; r < s.rows; ++r) {
    const S* xr = x + r * s.cols;
    S* yr = y + r * s.cols;
    double sq = 0;
    for (i64 c = 0; c < s.cols; ++c) {
      const double v = ld(xr[c]);
      sq += v * v;
    }
    const double rs = 1.0 / std::sqrt(sq / cols + eps);
    for (i64 c = 0; c < s.cols; ++c) yr[c] = st<S>(static_cast<double>(ld(xr[c])) * rs * ld(gamma[c]));
    rstd[r] = static_cast<C>(rs);
  }
}

// dgamma[c] += sum_r dy[r, c] * x[r, c] * rstd[r]: each column's sum in double,
// in row order, by one thread (as layernorm.cpp and cpu_loops.h do), and
// rounded once into the accumulator type G.
template <typename S, typename G, typename C = compute_t<S>>
void rmsnorm_dgamma_cpu(const S* dy, const S* x, const C* rstd, G* dgamma, Rows s) {
  constexpr i64 kBlock = 64;
  const i64 blocks = (s.cols + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(threads()) schedule(static) if (s.rows * s.cols > kParallelMin)
  for (i64 blk = 0; blk < blocks; ++blk) {
    const i64 c0 = blk * kBlock, n = std::min(kBlock, s.cols - c0);
    double acc[kBlock] = {};
    for (i64 r = 0; r < s.rows; ++r) {
      const S* dyr = dy + r * s.cols + c0;
      const S* xr = x + r * s.cols + c0;
      const double rs = rstd[r];
      for (i64 k = 0; k < n; ++k) acc[k] += static_cast<double>(ld(dyr[k])) * (ld(xr[k]) * rs);
    }
    for (i64 k = 0; k < n; ++k) dgamma[c0 + k] = st<G>(ld(dgamma[c0 + k]) + acc[k]);
  }
}

// dx = rstd * (g - x * rstd^2 * mean(g * x)), g = gamma * dy, plus add.
// Reads dy[c] before writing dx[c], so dx may alias dy.
template <typename S, typename C = compute_t<S>>
void rmsnorm_backward_dx_cpu(const S* dy, const S* x, const S* gamma, const C* rstd, S* dx, const S* add, Rows s) {
  const double cols = static_cast<double>(s.cols);
#pragma omp parallel for num_threads(threads()) schedule(static) if (s.rows * s.cols > kParallelMin)
  for (i64 r = 0; r < s.rows; ++r) {
    const S* dyr = dy + r * s.cols;
    const S* xr = x + r * s.cols;
    S* dxr = dx + r * s.cols;
    const S* addr = add ? add + r * s.cols : nullptr;
    const double rs = rstd[r];
    double sum_gx = 0;
    for (i64 c = 0; c < s.cols; ++c) sum_gx += static_cast<double>(ld(dyr[c])) * ld(gamma[c]) * ld(xr[c]);
    const double k = rs * rs * (sum_gx / cols);
    for (i64 c = 0; c < s.cols; ++c) {
      const double g = static_cast<double>(ld(dyr[c])) * ld(gamma[c]);
      const double v = rs * (g - ld(xr[c]) * k);
      dxr[c] = st<S>(addr ? v + static_cast<double>(ld(addr[c])) : v);
    }
  }
}

// The CUDA launcher's scratch (cuda/rmsnorm.cu): dgamma's partial sums, one
// double per column and chunk of gpu_scratch::column_chunks, when the rows
// take more than one chunk (none otherwise: one pass adds into dgamma).
std::size_t dgamma_scratch_bytes(i64 rows, i64 cols) {
  const gpu_scratch::Chunks ch = gpu_scratch::column_chunks(rows, cols);
  return ch.used > 1 ? static_cast<std::size_t>(ch.used * cols) * sizeof(double) : 0;
}

}  // namespace

void rmsnorm_forward(const Tensor& x, const Tensor& gamma, double eps, Tensor& y, Tensor& rstd) {
  constexpr const char* op = "rmsnorm_forward";
  check_float(op, "x", x);
  const DType dt = x.dtype();
  const Rows s = rows_of(op, "x", x);
  MZ_CHECK(s.cols > 0, op, ": x has no columns: ", x.to_string());
  MZ_CHECK(eps >= 0 && std::isfinite(eps), op, ": eps must be finite and non-negative, got ", eps);
  check_operands(op, x, dt, {{"x", &x}, {"gamma", &gamma}, {"y", &y}});
  check_stat(op, "rstd", rstd, x, dt);
  check_shape(op, "gamma", gamma, {s.cols});
  check_shape(op, "y", y, x.shape());
  check_rows(op, "rstd", rstd, s.rows);
  MZ_ON_CUDA(
      x, cuda::rmsnorm_forward(dt, x.data(), gamma.data(), eps, y.data(), rstd.data(), s.rows, s.cols, stream_of(x)));
  if (!on_host(op, x)) return;
  with_storage_type(dt, [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    rmsnorm_forward_cpu<S>(ptr<const S>(x), ptr<const S>(gamma), eps, ptr<S>(y), ptr<C>(rstd), s);
  });
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd, Tensor& dx,
                      Tensor& dgamma, const Tensor* add_to_dx) {
  constexpr const char* op = "rmsnorm_backward";
  check_float(op, "x", x);
  const DType dt = x.dtype();
  const Rows s = rows_of(op, "x", x);
  MZ_CHECK(s.cols > 0, op, ": x has no columns: ", x.to_string());
  check_operands(op, x, dt, {{"dy", &dy}, {"x", &x}, {"gamma", &gamma}, {"dx", &dx}});
  check_stat(op, "rstd", rstd, x, dt);
  check_accumulator(op, "dgamma", dgamma, x, dt);
  check_shapes(op, x.shape(), {{"dy", &dy}, {"dx", &dx}});
  if (add_to_dx) {
    check_operand(op, "add_to_dx", *add_to_dx, x, dt);
    check_shape(op, "add_to_dx", *add_to_dx, x.shape());
  }
  check_shapes(op, {s.cols}, {{"gamma", &gamma}, {"dgamma", &dgamma}});
  check_rows(op, "rstd", rstd, s.rows);
  const Tensor ws = allocate_gpu_scratch(x, dgamma_scratch_bytes(s.rows, s.cols), "rmsnorm_backward scratch");
  MZ_ON_CUDA(x, cuda::rmsnorm_backward(dt, dy.data(), x.data(), gamma.data(), rstd.data(), dx.data(), dgamma.data(),
                                       dgamma.dtype(), add_to_dx ? add_to_dx->data() : nullptr, s.rows, s.cols,
                                       scratch_of(ws), stream_of(x)));
  if (!on_host(op, x)) return;
  with_storage_type(dt, [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    // dgamma first: dx may overwrite dy.
    with_accumulator_type<S>(dgamma, [&](auto acc_tag) {
      using G = decltype(acc_tag);
      rmsnorm_dgamma_cpu<S>(ptr<const S>(dy), ptr<const S>(x), ptr<const C>(rstd), ptr<G>(dgamma), s);
    });
    rmsnorm_backward_dx_cpu<S>(ptr<const S>(dy), ptr<const S>(x), ptr<const S>(gamma), ptr<const C>(rstd), ptr<S>(dx),
                               add_to_dx ? ptr<const S>(*add_to_dx) : nullptr, s);
  });
}

}  // namespace megazero::kernels
