// GeLU, bias and element-wise kernels (gelu_bias.h): shape checks, device
// dispatch and the CPU kernels. Each public function validates its arguments
// (also on the meta device, where nothing is computed), then runs a template
// over the storage type S (float, double, BFloat16 or Half) on raw pointers:
// elements are read with ld() into the compute type C = compute_t<S> and
// written with st<S>(), which rounds once to nearest even (kernel_support.h).
// The GeLU's tanh comes from vector_math's tanh_f32 for fp32 compute (fp64:
// std::tanh). Loops are OpenMP-parallel; bias gradients are summed column
// block by column block in a fixed row order, so results are bitwise
// identical for any thread count.
#include "megazero/kernels/gelu_bias.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "megazero/core/error.h"
#include "megazero/kernels/cpu_loops.h"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/kernel_support.h"
#include "megazero/kernels/vector_math.h"
#ifdef MEGAZERO_WITH_CUDA
#include "megazero/cuda/gelu_bias.h"
#endif

namespace megazero::kernels {

namespace {

using namespace detail;  // kernel_support.h, cpu_loops.h

// ---- GeLU (tanh form), in the compute type ----

constexpr double kGeluC = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kGeluA = 0.044715;

// gelu(x) = 0.5 x (1 + tanh(u)), u = c (x + a x^3), in three pieces so that the
// fp32 paths can take every tanh from one vector_math call (gelu_chunks).
template <typename T>
T gelu_arg(T x) {
  return static_cast<T>(kGeluC) * (x + static_cast<T>(kGeluA) * x * x * x);
}
template <typename T>
T gelu_of(T x, T t) {  // t = tanh(gelu_arg(x))
  return static_cast<T>(0.5) * x * (static_cast<T>(1) + t);
}
// d/dx of gelu: 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2), t = tanh(u).
template <typename T>
T gelu_grad_of(T x, T t) {
  const T du = static_cast<T>(kGeluC) * (static_cast<T>(1) + static_cast<T>(3 * kGeluA) * x * x);
  return static_cast<T>(0.5) * (static_cast<T>(1) + t) + static_cast<T>(0.5) * x * (static_cast<T>(1) - t * t) * du;
}

// The GeLU map over `rows` runs of `cols` elements (the last run may stop at
// `n`), 256 at a time: arg(r, c) gives the GeLU input in the compute type,
// then all the chunk's tanh come from one vector_math::tanh_f32 call, then
// out(r, c, x, t) stores the result. tanh_f32 computes every element with the
// same vector routine wherever it sits, so the fused and unfused GeLU paths
// (different runs over the same values) agree bit for bit. fp32 compute only
// (fp32 and 16-bit storage); fp64 keeps the scalar std::tanh.
template <typename Arg, typename Out>
void gelu_chunks(i64 rows, i64 cols, i64 n, Arg arg, Out out) {
  constexpr i64 kChunk = 256;
#pragma omp parallel for num_threads(threads()) schedule(static) if (n > kParallelMin)
  for (i64 r = 0; r < rows; ++r) {
    float x[kChunk], u[kChunk], t[kChunk];
    const i64 len = std::min(cols, n - r * cols);
    for (i64 c0 = 0; c0 < len; c0 += kChunk) {
      const i64 m = std::min(kChunk, len - c0);
      for (i64 k = 0; k < m; ++k) {
        x[k] = arg(r, c0 + k);
        u[k] = gelu_arg(x[k]);
      }
      tanh_f32(u, t, m);
      for (i64 k = 0; k < m; ++k) out(r, c0 + k, x[k], t[k]);
    }
  }
}

// max(v, 0) with a NaN kept NaN (PyTorch's relu; the CUDA kernel's form).
template <typename T>
T relu_keeping_nan(T v) {
  return v < T(0) ? T(0) : v;
}

// A flat run of n elements as gelu_chunks' rows (no division per element).
constexpr i64 kGeluFlatRow = 4096;
inline i64 flat_rows(i64 n) { return (n + kGeluFlatRow - 1) / kGeluFlatRow; }

}  // namespace

void gelu_forward(const Tensor& x, Tensor& y) {
  constexpr const char* op = "gelu_forward";
  check_float(op, "x", x);
  check_operands(op, x, x.dtype(), {{"x", &x}, {"y", &y}});
  check_shape(op, "y", y, x.shape());
  MZ_ON_CUDA(x, cuda::gelu_forward(x.dtype(), x.data(), y.data(), x.numel(), stream_of(x)));
  if (!on_host(op, x)) return;
  with_storage_type(x.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const S* xp = ptr<const S>(x);
    S* yp = ptr<S>(y);
    if constexpr (std::is_same_v<compute_t<S>, double>) {
      elementwise(yp, x.numel(), [=](i64 i) { return st<S>(gelu_of(ld(xp[i]), std::tanh(gelu_arg(ld(xp[i]))))); });
    } else {
      const i64 n = x.numel();
      gelu_chunks(
          flat_rows(n), kGeluFlatRow, n, [=](i64 r, i64 c) { return ld(xp[r * kGeluFlatRow + c]); },
          [=](i64 r, i64 c, float v, float t) { yp[r * kGeluFlatRow + c] = st<S>(gelu_of(v, t)); });
    }
  });
}

void squared_relu_forward(const Tensor& x, Tensor& y) {
  constexpr const char* op = "squared_relu_forward";
  check_float(op, "x", x);
  check_operands(op, x, x.dtype(), {{"x", &x}, {"y", &y}});
  check_shape(op, "y", y, x.shape());
  MZ_ON_CUDA(x, cuda::squared_relu_forward(x.dtype(), x.data(), y.data(), x.numel(), stream_of(x)));
  if (!on_host(op, x)) return;
  with_storage_type(x.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const S* xp = ptr<const S>(x);
    elementwise(ptr<S>(y), x.numel(), [=](i64 i) {
      const auto r = relu_keeping_nan(ld(xp[i]));
      return st<S>(r * r);
    });
  });
}

void squared_relu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  constexpr const char* op = "squared_relu_backward";
  check_float(op, "x", x);
  check_operands(op, x, x.dtype(), {{"dy", &dy}, {"x", &x}, {"dx", &dx}});
  check_shapes(op, x.shape(), {{"dy", &dy}, {"dx", &dx}});
  MZ_ON_CUDA(x, cuda::squared_relu_backward(x.dtype(), dy.data(), x.data(), dx.data(), x.numel(), stream_of(x)));
  if (!on_host(op, x)) return;
  with_storage_type(x.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const S* xp = ptr<const S>(x);
    const S* dyp = ptr<const S>(dy);
    elementwise(ptr<S>(dx), x.numel(), [=](i64 i) {
      using C = decltype(ld(xp[i]));
      return st<S>(ld(dyp[i]) * (C{2} * relu_keeping_nan(ld(xp[i]))));
    });
  });
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  constexpr const char* op = "gelu_backward";
  check_float(op, "x", x);
  check_operands(op, x, x.dtype(), {{"dy", &dy}, {"x", &x}, {"dx", &dx}});
  check_shapes(op, x.shape(), {{"dy", &dy}, {"dx", &dx}});
  MZ_ON_CUDA(x, cuda::gelu_backward(x.dtype(), dy.data(), x.data(), dx.data(), x.numel(), stream_of(x)));
  if (!on_host(op, x)) return;
  with_storage_type(x.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const S* xp = ptr<const S>(x);
    const S* dyp = ptr<const S>(dy);
    S* dxp = ptr<S>(dx);
    if constexpr (std::is_same_v<compute_t<S>, double>) {
      elementwise(dxp, x.numel(), [=](i64 i) {
        const double v = ld(xp[i]);
        return st<S>(ld(dyp[i]) * gelu_grad_of(v, std::tanh(gelu_arg(v))));
      });
    } else {
      const i64 n = x.numel();
      gelu_chunks(
          flat_rows(n), kGeluFlatRow, n, [=](i64 r, i64 c) { return ld(xp[r * kGeluFlatRow + c]); },
          [=](i64 r, i64 c, float v, float t) {
            const i64 i = r * kGeluFlatRow + c;
            dxp[i] = st<S>(ld(dyp[i]) * gelu_grad_of(v, t));
          });
    }
  });
}

void bias_gelu_forward(const Tensor& y, const Tensor& bias, Tensor& out) {
  constexpr const char* op = "bias_gelu_forward";
  check_float(op, "y", y);
  const Rows s = rows_of(op, "y", y);
  check_operands(op, y, y.dtype(), {{"y", &y}, {"bias", &bias}, {"out", &out}});
  check_shape(op, "bias", bias, {s.cols});
  check_shape(op, "out", out, y.shape());
  MZ_ON_CUDA(y, cuda::bias_gelu_forward(y.dtype(), y.data(), bias.data(), out.data(), s.rows, s.cols, stream_of(y)));
  if (!on_host(op, y)) return;
  with_storage_type(y.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const S* yp = ptr<const S>(y);
    const S* bp = ptr<const S>(bias);
    S* op_ = ptr<S>(out);
    if constexpr (std::is_same_v<compute_t<S>, double>) {
      rowwise(op_, s.rows, s.cols, [=](i64 r, i64 c) {
        const double v = ld(yp[r * s.cols + c]) + ld(bp[c]);
        return st<S>(gelu_of(v, std::tanh(gelu_arg(v))));
      });
    } else {
      gelu_chunks(
          s.rows, s.cols, s.rows * s.cols, [=](i64 r, i64 c) { return ld(yp[r * s.cols + c]) + ld(bp[c]); },
          [=](i64 r, i64 c, float v, float t) { op_[r * s.cols + c] = st<S>(gelu_of(v, t)); });
    }
  });
}

void bias_gelu_backward(const Tensor& dy, const Tensor& y, const Tensor& bias, Tensor& dx, Tensor& dbias) {
  constexpr const char* op = "bias_gelu_backward";
  check_float(op, "y", y);
  const Rows s = rows_of(op, "y", y);
  check_operands(op, y, y.dtype(), {{"dy", &dy}, {"y", &y}, {"dx", &dx}});
  const bool has_bias = bias.defined();
  if (has_bias) {
    check_operands(op, y, y.dtype(), {{"bias", &bias}});
    check_shape(op, "bias", bias, {s.cols});
  }
  check_shapes(op, y.shape(), {{"dy", &dy}, {"dx", &dx}});
  check_accumulator(op, "dbias", dbias, y, y.dtype());
  check_shape(op, "dbias", dbias, {s.cols});
  const Tensor ws = allocate_gpu_scratch(y, gpu_scratch::column_sums_bytes(y.dtype(), s.rows, s.cols, 1),
                                         "bias_gelu_backward scratch");
  MZ_ON_CUDA(y, cuda::bias_gelu_backward(y.dtype(), dy.data(), y.data(), has_bias ? bias.data() : nullptr, dx.data(),
                                         dbias.data(), dbias.dtype(), s.rows, s.cols, scratch_of(ws), stream_of(y)));
  if (!on_host(op, y)) return;
  with_storage_type(y.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const S* yp = ptr<const S>(y);
    const S* bp = has_bias ? ptr<const S>(bias) : nullptr;
    const S* dyp = ptr<const S>(dy);
    S* dxp = ptr<S>(dx);
    if constexpr (std::is_same_v<compute_t<S>, double>) {
      rowwise(dxp, s.rows, s.cols, [=](i64 r, i64 c) {
        const i64 i = r * s.cols + c;
        const double v = bp ? ld(yp[i]) + ld(bp[c]) : ld(yp[i]);
        return st<S>(ld(dyp[i]) * gelu_grad_of(v, std::tanh(gelu_arg(v))));
      });
    } else {
      const auto out = [=](i64 r, i64 c, float v, float t) {
        const i64 i = r * s.cols + c;
        dxp[i] = st<S>(ld(dyp[i]) * gelu_grad_of(v, t));
      };
      if (bp)
        gelu_chunks(
            s.rows, s.cols, s.rows * s.cols, [=](i64 r, i64 c) { return ld(yp[r * s.cols + c]) + ld(bp[c]); }, out);
      else  // y holds the bias
        gelu_chunks(
            s.rows, s.cols, s.rows * s.cols, [=](i64 r, i64 c) { return ld(yp[r * s.cols + c]); }, out);
    }
  });
  bias_grad(dx, dbias);  // the CPU gains nothing from fusing this pass
}

void add_bias(Tensor& y, const Tensor& bias) {
  constexpr const char* op = "add_bias";
  check_float(op, "y", y);
  const Rows s = rows_of(op, "y", y);
  check_operands(op, y, y.dtype(), {{"y", &y}, {"bias", &bias}});
  check_shape(op, "bias", bias, {s.cols});
  MZ_ON_CUDA(y, cuda::add_bias(y.dtype(), y.data(), bias.data(), s.rows, s.cols, stream_of(y)));
  if (!on_host(op, y)) return;
  with_storage_type(y.dtype(), [&](auto tag) {
    using S = decltype(tag);
    S* yp = ptr<S>(y);
    const S* bp = ptr<const S>(bias);
    rowwise(yp, s.rows, s.cols, [=](i64 r, i64 c) { return st<S>(ld(yp[r * s.cols + c]) + ld(bp[c])); });
  });
}

namespace {
// sums[c] += sum_r x[r, c], each column in double and in row order, rounded
// once into the accumulator: column_sums, and bias_grad under its own name
// (op, operand names and scratch label are the caller's, for its messages).
void sum_columns_into(const char* op, const char* x_name, const char* sums_name, const char* scratch_label,
                      const Tensor& x, Tensor& sums) {
  check_float(op, x_name, x);
  const Rows s = rows_of(op, x_name, x);
  check_operand(op, x_name, x, x, x.dtype());
  check_accumulator(op, sums_name, sums, x, x.dtype());
  check_shape(op, sums_name, sums, {s.cols});
  const Tensor ws =
      allocate_gpu_scratch(x, gpu_scratch::column_sums_bytes(x.dtype(), s.rows, s.cols, 1), scratch_label);
  MZ_ON_CUDA(x, cuda::column_sums(x.dtype(), x.data(), sums.data(), sums.dtype(), s.rows, s.cols, scratch_of(ws),
                                  stream_of(x), op));
  if (!on_host(op, x)) return;
  with_storage_type(x.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const S* g = ptr<const S>(x);
    with_accumulator_type<S>(sums, [&](auto acc_tag) {
      using G = decltype(acc_tag);
      accumulate_columns(ptr<G>(sums), s.rows, s.cols,
                         [=](i64 r, i64 c) { return static_cast<double>(ld(g[r * s.cols + c])); });
    });
  });
}
}  // namespace

void column_sums(const Tensor& x, Tensor& sums) {
  sum_columns_into("column_sums", "x", "sums", "column_sums scratch", x, sums);
}

void bias_grad(const Tensor& dy, Tensor& dbias) {
  sum_columns_into("bias_grad", "dy", "dbias", "bias_grad scratch", dy, dbias);
}

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  constexpr const char* op = "add";
  check_float(op, "a", a);
  check_operands(op, a, a.dtype(), {{"a", &a}, {"b", &b}, {"out", &out}});
  check_shapes(op, a.shape(), {{"b", &b}, {"out", &out}});
  MZ_ON_CUDA(a, cuda::add(a.dtype(), a.data(), b.data(), out.data(), a.numel(), stream_of(a)));
  if (!on_host(op, a)) return;
  with_storage_type(a.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const S* ap = ptr<const S>(a);
    const S* bp = ptr<const S>(b);
    elementwise(ptr<S>(out), a.numel(), [=](i64 i) { return st<S>(ld(ap[i]) + ld(bp[i])); });
  });
}

void axpy(double alpha, const Tensor& x, Tensor& y) {
  constexpr const char* op = "axpy";
  check_float(op, "x", x);
  check_operands(op, x, x.dtype(), {{"x", &x}, {"y", &y}});
  check_shape(op, "y", y, x.shape());
  MZ_ON_CUDA(x, cuda::axpy(x.dtype(), alpha, x.data(), y.data(), x.numel(), stream_of(x)));
  if (!on_host(op, x)) return;
  with_storage_type(x.dtype(), [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    const S* xp = ptr<const S>(x);
    S* yp = ptr<S>(y);
    const C a = static_cast<C>(alpha);
    elementwise(yp, x.numel(), [=](i64 i) { return st<S>(ld(yp[i]) + a * ld(xp[i])); });
  });
}

void scale(Tensor& x, double alpha) {
  constexpr const char* op = "scale";
  check_float(op, "x", x);
  check_operand(op, "x", x, x, x.dtype());
  MZ_ON_CUDA(x, cuda::scale_elements(x.dtype(), x.data(), x.numel(), alpha, stream_of(x)));
  if (!on_host(op, x)) return;
  with_storage_type(x.dtype(), [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    S* xp = ptr<S>(x);
    const C a = static_cast<C>(alpha);
    elementwise(xp, x.numel(), [=](i64 i) { return st<S>(ld(xp[i]) * a); });
  });
}

}  // namespace megazero::kernels
