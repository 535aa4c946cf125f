// Shape checking, device dispatch and the CPU implementations of the layer
// kernels (layer_kernels.h). Each public function validates its arguments (also
// on the meta device, where nothing is computed), then runs a template over
// float or double on raw pointers. Loops over rows are OpenMP-parallel; sums
// across rows (parameter gradients) are taken column block by column block in
// a fixed row order, so results are bitwise identical for any thread count.
#include "megazero/kernels/layer_kernels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <type_traits>
#include <utility>

#include "megazero/core/error.h"

namespace megazero::kernels {
namespace {

using i64 = std::int64_t;

// Below this many elements a parallel region costs more than it saves.
constexpr i64 kParallelMin = i64{1} << 15;

int threads() { return cpu_math_threads(); }

// ---- validation ----

void check_float(const char* op, const char* name, const Tensor& t) {
  MZ_CHECK(t.defined(), op, ": ", name, " is undefined");
  MZ_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::F64, op, ": ", name, " must be fp32 or fp64, got ",
           t.to_string());
}

// `t` is a contiguous tensor of `dtype` on the same device as `ref`.
void check_operand(const char* op, const char* name, const Tensor& t, const Tensor& ref, DType dtype) {
  MZ_CHECK(t.defined(), op, ": ", name, " is undefined");
  MZ_CHECK(t.dtype() == dtype, op, ": ", name, " must be ", dtype_name(dtype), ", got ", t.to_string());
  MZ_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous, got ", t.to_string(), " with strides ",
           shape_str(t.strides()));
  MZ_CHECK(t.device().kind() == ref.device().kind() && t.device().index() == ref.device().index(), op, ": ", name,
           " is on ", t.device().name(), " but the other operands are on ", ref.device().name());
}

void check_shape(const char* op, const char* name, const Tensor& t, const Shape& expected) {
  MZ_CHECK(t.shape() == expected, op, ": ", name, " has shape ", shape_str(t.shape()), ", expected ",
           shape_str(expected));
}

using Named = std::pair<const char*, const Tensor*>;

void check_operands(const char* op, const Tensor& ref, DType dtype, std::initializer_list<Named> operands) {
  for (const auto& [name, t] : operands) check_operand(op, name, *t, ref, dtype);
}

void check_shapes(const char* op, const Shape& shape, std::initializer_list<Named> operands) {
  for (const auto& [name, t] : operands) check_shape(op, name, *t, shape);
}

// A per-row vector (mean, rstd, row_max, ids, ...): one element per row.
void check_rows(const char* op, const char* name, const Tensor& t, i64 rows) {
  MZ_CHECK(t.dim() == 1 && t.size(0) == rows, op, ": ", name, " must have shape (", rows, "), got ",
           shape_str(t.shape()));
}

struct Rows {
  i64 rows, cols;
};

// "rows" = all leading dimensions flattened, "cols" = the last dimension.
Rows rows_of(const char* op, const char* name, const Tensor& t) {
  MZ_CHECK(t.dim() >= 1, op, ": ", name, " needs at least one dimension, got ", t.to_string());
  i64 rows = 1;
  for (int d = 0; d + 1 < t.dim(); ++d) rows *= t.size(d);
  return {rows, t.size(-1)};
}

// ---- dispatch ----

// True when the kernel runs on the host; false on the meta device (a dry run:
// shapes are checked, nothing is stored).
bool on_host(const char* op, const Tensor& t) {
  switch (t.device().kind()) {
    case DeviceKind::Meta: return false;
    case DeviceKind::CPU: return true;
    case DeviceKind::CUDA: break;
  }
  throw InternalError(detail::concat(op, " has no CUDA kernel yet (device ", t.device().name(), ")"));
}

// Calls fn(T{}) with T = float or double for the dtype (already validated).
template <typename Fn>
void with_float_type(DType t, Fn&& fn) {
  if (t == DType::F64)
    fn(double{});
  else
    fn(float{});
}

// Typed data pointer; ptr<const T> for inputs.
template <typename T>
T* ptr(const Tensor& t) {
  return t.data_as<std::remove_const_t<T>>();
}

// dst[c] += sum_r term(r, c) for c < cols. Each column's sum is taken in double
// and in row order by one thread, so the result does not depend on the number
// of threads (per-thread partial sums would).
template <typename T, typename Term>
void accumulate_columns(T* dst, i64 rows, i64 cols, Term term) {
  constexpr i64 kBlock = 64;
  const i64 blocks = (cols + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(threads()) schedule(static) if (rows * cols > kParallelMin)
  for (i64 blk = 0; blk < blocks; ++blk) {
    const i64 c0 = blk * kBlock, n = std::min(kBlock, cols - c0);
    double acc[kBlock] = {};
    for (i64 r = 0; r < rows; ++r)
      for (i64 k = 0; k < n; ++k) acc[k] += term(r, c0 + k);
    for (i64 k = 0; k < n; ++k) dst[c0 + k] = static_cast<T>(dst[c0 + k] + acc[k]);
  }
}

// ---- LayerNorm ----

// Two-pass mean and variance in double: no cancellation for rows with a large
// mean, and fp32 statistics are rounded once.
template <typename T>
void layernorm_forward_cpu(const T* x, const T* gamma, const T* beta, double eps, T* y, T* mean, T* rstd, Rows s) {
#pragma omp parallel for num_threads(threads()) schedule(static) if (s.rows * s.cols > kParallelMin)
  for (i64 r = 0; r < s.rows; ++r) {
    const T* xr = x + r * s.cols;
    T* yr = y + r * s.cols;
    double sum = 0;
    for (i64 c = 0; c < s.cols; ++c) sum += xr[c];
    const double m = sum / static_cast<double>(s.cols);
    double sq = 0;
    for (i64 c = 0; c < s.cols; ++c) sq += (xr[c] - m) * (xr[c] - m);
    const double rs = 1.0 / std::sqrt(sq / static_cast<double>(s.cols) + eps);
    for (i64 c = 0; c < s.cols; ++c) yr[c] = static_cast<T>((xr[c] - m) * rs * gamma[c] + beta[c]);
    mean[r] = static_cast<T>(m);
    rstd[r] = static_cast<T>(rs);
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma.
// Reads dy[c] before writing dx[c], so dx may alias dy.
template <typename T>
void layernorm_backward_cpu(const T* dy, const T* x, const T* gamma, const T* mean, const T* rstd, T* dx, T* dgamma,
                            T* dbeta, Rows s) {
  const double inv_cols = 1.0 / static_cast<double>(s.cols);
  // Parameter gradients first: dx may overwrite dy.
  accumulate_columns(dgamma, s.rows, s.cols, [&](i64 r, i64 c) {
    return static_cast<double>(dy[r * s.cols + c]) * ((x[r * s.cols + c] - static_cast<double>(mean[r])) * rstd[r]);
  });
  accumulate_columns(dbeta, s.rows, s.cols, [&](i64 r, i64 c) { return static_cast<double>(dy[r * s.cols + c]); });
#pragma omp parallel for num_threads(threads()) schedule(static) if (s.rows * s.cols > kParallelMin)
  for (i64 r = 0; r < s.rows; ++r) {
    const T* dyr = dy + r * s.cols;
    const T* xr = x + r * s.cols;
    T* dxr = dx + r * s.cols;
    const double m = mean[r], rs = rstd[r];
    double sum_g = 0, sum_gx = 0;
    for (i64 c = 0; c < s.cols; ++c) {
      const double g = static_cast<double>(dyr[c]) * gamma[c];
      sum_g += g;
      sum_gx += g * (xr[c] - m) * rs;
    }
    const double mean_g = sum_g * inv_cols, mean_gx = sum_gx * inv_cols;
    for (i64 c = 0; c < s.cols; ++c) {
      const double g = static_cast<double>(dyr[c]) * gamma[c];
      dxr[c] = static_cast<T>(rs * (g - mean_g - (xr[c] - m) * rs * mean_gx));
    }
  }
}

// ---- GeLU (tanh form) ----

constexpr double kGeluC = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kGeluA = 0.044715;

template <typename T>
T gelu(T x) {
  const T u = static_cast<T>(kGeluC) * (x + static_cast<T>(kGeluA) * x * x * x);
  return static_cast<T>(0.5) * x * (static_cast<T>(1) + std::tanh(u));
}

// d/dx of gelu: 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2), t = tanh(u).
template <typename T>
T gelu_grad(T x) {
  const T u = static_cast<T>(kGeluC) * (x + static_cast<T>(kGeluA) * x * x * x);
  const T t = std::tanh(u);
  const T du = static_cast<T>(kGeluC) * (static_cast<T>(1) + static_cast<T>(3 * kGeluA) * x * x);
  return static_cast<T>(0.5) * (static_cast<T>(1) + t) + static_cast<T>(0.5) * x * (static_cast<T>(1) - t * t) * du;
}

// Applies out[i] = f(i) over n elements; f reads only index i, so outputs may
// alias inputs.
template <typename T, typename F>
void elementwise(T* out, i64 n, F f) {
#pragma omp parallel for num_threads(threads()) schedule(static) if (n > kParallelMin)
  for (i64 i = 0; i < n; ++i) out[i] = f(i);
}

// ---- causal softmax ----

// Row i of each [n, n] matrix is softmax over j <= i of scale * s; the max is
// subtracted before exp and the sum is taken in double.
template <typename T>
void causal_softmax_forward_cpu(const T* scores, double scale, T* probs, i64 mats, i64 n) {
  const T sc = static_cast<T>(scale);
#pragma omp parallel for num_threads(threads()) schedule(static) if (mats * n * n > kParallelMin)
  for (i64 row = 0; row < mats * n; ++row) {
    const i64 i = row % n;
    const T* s = scores + row * n;
    T* p = probs + row * n;
    T mx = -std::numeric_limits<T>::infinity();
    for (i64 j = 0; j <= i; ++j) mx = std::max(mx, sc * s[j]);
    double sum = 0;
    for (i64 j = 0; j <= i; ++j) {  // overwrites s[j] after reading it when probs aliases scores
      p[j] = std::exp(sc * s[j] - mx);
      sum += p[j];
    }
    const double inv = 1.0 / sum;
    for (i64 j = 0; j <= i; ++j) p[j] = static_cast<T>(p[j] * inv);
    for (i64 j = i + 1; j < n; ++j) p[j] = 0;
  }
}

// Masked columns get an exact 0 whatever dprobs holds there (even NaN).
template <typename T>
void causal_softmax_backward_cpu(const T* dprobs, const T* probs, double scale, T* dscores, i64 mats, i64 n) {
#pragma omp parallel for num_threads(threads()) schedule(static) if (mats * n * n > kParallelMin)
  for (i64 row = 0; row < mats * n; ++row) {
    const i64 i = row % n;
    const T* dp = dprobs + row * n;
    const T* p = probs + row * n;
    T* ds = dscores + row * n;
    double dot = 0;
    for (i64 j = 0; j <= i; ++j) dot += static_cast<double>(dp[j]) * p[j];
    for (i64 j = 0; j <= i; ++j) ds[j] = static_cast<T>(scale * p[j] * (dp[j] - dot));
    for (i64 j = i + 1; j < n; ++j) ds[j] = 0;
  }
}

// ---- dropout ----

void check_layout(const char* op, const DropoutLayout& l, i64 numel) {
  MZ_CHECK(l.A >= 0 && l.B >= 0 && l.C >= 0 && l.D >= 0, op, ": negative dropout layout size");
  MZ_CHECK(l.A * l.B * l.C * l.D == numel, op, ": layout [", l.A, ", ", l.B, ", ", l.C, ", ", l.D,
           "] does not cover the tensor's ", numel, " elements");
  MZ_CHECK(l.a0 >= 0 && l.b0 >= 0 && l.b0 + l.B <= l.GB, op, ": offsets a0 ", l.a0, ", b0 ", l.b0, " with B ", l.B,
           " must satisfy a0 >= 0, 0 <= b0, b0 + B <= GB = ", l.GB);
}

// out = in * keep / (1 - p), keep = uniform_at(key, global index) >= p. Work is
// split into chunks of a [C, D] block so that every thread has some even when
// A * B is small (hidden states have B = 1).
template <typename T>
void dropout_cpu(const T* in, double p, const RngKey& key, const DropoutLayout& l, T* out) {
  constexpr i64 kChunk = 4096;
  const i64 inner = l.C * l.D;
  const i64 chunks = (inner + kChunk - 1) / kChunk;
  const T keep_scale = static_cast<T>(1.0 / (1.0 - p));
#pragma omp parallel for num_threads(threads()) schedule(static) if (l.A * l.B * inner > kParallelMin / 8)
  for (i64 item = 0; item < l.A * l.B * chunks; ++item) {
    const i64 row = item / chunks, k0 = (item % chunks) * kChunk, k1 = std::min(inner, k0 + kChunk);
    const i64 global_row = (l.a0 + row / l.B) * l.GB + l.b0 + row % l.B;
    const auto base = static_cast<std::uint64_t>(global_row) * static_cast<std::uint64_t>(inner);
    UniformStream uniform(key);
    for (i64 k = k0; k < k1; ++k) {
      const i64 idx = row * inner + k;
      const bool keep = uniform.at(base + static_cast<std::uint64_t>(k)) >= p;
      out[idx] = keep ? in[idx] * keep_scale : static_cast<T>(0);
    }
  }
}

void dropout(const char* op, const Tensor& in, double p, const RngKey& key, const DropoutLayout& layout, Tensor& out) {
  check_float(op, "input", in);
  check_operands(op, in, in.dtype(), {{"input", &in}, {"output", &out}});
  check_shape(op, "output", out, in.shape());
  MZ_CHECK(p >= 0.0 && p < 1.0, op, ": dropout probability ", p, " must be in [0, 1)");
  check_layout(op, layout, in.numel());
  if (!on_host(op, in)) return;
  with_float_type(in.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (p == 0.0) {  // no RNG at all: an identity, also in cost
      if (ptr<T>(out) != ptr<T>(in)) std::copy_n(ptr<T>(in), in.numel(), ptr<T>(out));
      return;
    }
    dropout_cpu(ptr<const T>(in), p, key, layout, ptr<T>(out));
  });
}

// ---- cross-entropy pieces ----

struct VocabSlice {
  i64 rows, cols, valid;
};

VocabSlice check_logits(const char* op, const Tensor& logits, i64 valid) {
  check_float(op, "logits", logits);
  check_operand(op, "logits", logits, logits, logits.dtype());
  MZ_CHECK(logits.dim() == 2, op, ": logits must be [N, V_local], got ", logits.to_string());
  MZ_CHECK(valid >= 0 && valid <= logits.size(1), op, ": valid columns ", valid, " must be in [0, ", logits.size(1),
           "]");
  return {logits.size(0), logits.size(1), valid};
}

template <typename T>
void rowwise_max_cpu(const T* logits, VocabSlice s, T* out) {
#pragma omp parallel for num_threads(threads()) schedule(static) if (s.rows * s.valid > kParallelMin)
  for (i64 r = 0; r < s.rows; ++r) {
    const T* lr = logits + r * s.cols;
    T mx = -std::numeric_limits<T>::infinity();  // a slice of only padding contributes nothing
    for (i64 c = 0; c < s.valid; ++c) mx = std::max(mx, lr[c]);
    out[r] = mx;
  }
}

template <typename T>
void rowwise_sum_exp_cpu(const T* logits, const T* row_max, VocabSlice s, T* out) {
#pragma omp parallel for num_threads(threads()) schedule(static) if (s.rows * s.valid > kParallelMin)
  for (i64 r = 0; r < s.rows; ++r) {
    const T* lr = logits + r * s.cols;
    double sum = 0;
    for (i64 c = 0; c < s.valid; ++c) sum += std::exp(lr[c] - row_max[r]);
    out[r] = static_cast<T>(sum);
  }
}

// Local column of a global target, or -1 when another rank holds it.
inline i64 local_column(std::int64_t target, i64 vocab_start, i64 valid) {
  const i64 c = target - vocab_start;
  return c >= 0 && c < valid ? c : -1;
}

template <typename T>
void cross_entropy_backward_cpu(const T* logits, const T* row_max, const T* sum_exp, const std::int64_t* targets,
                                i64 vocab_start, VocabSlice s, double scale, T* dlogits) {
#pragma omp parallel for num_threads(threads()) schedule(static) if (s.rows * s.cols > kParallelMin)
  for (i64 r = 0; r < s.rows; ++r) {
    const T* lr = logits + r * s.cols;
    T* dr = dlogits + r * s.cols;
    const double inv_sum = 1.0 / static_cast<double>(sum_exp[r]);
    const i64 t = local_column(targets[r], vocab_start, s.valid);
    const auto prob = [&](i64 c) { return std::exp(lr[c] - row_max[r]) * inv_sum; };
    // Taken before the loop (dlogits may alias logits) and in double, so the
    // one-hot subtraction is not rounded twice.
    const double target_grad = t >= 0 ? scale * (prob(t) - 1.0) : 0.0;
    for (i64 c = 0; c < s.valid; ++c) dr[c] = static_cast<T>(scale * prob(c));
    if (t >= 0) dr[t] = static_cast<T>(target_grad);
    for (i64 c = s.valid; c < s.cols; ++c) dr[c] = 0;
  }
}

}  // namespace

// ======================= public entry points =======================

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps, Tensor& y, Tensor& mean,
                       Tensor& rstd) {
  constexpr const char* op = "layernorm_forward";
  check_float(op, "x", x);
  const DType dt = x.dtype();
  const Rows s = rows_of(op, "x", x);
  MZ_CHECK(s.cols > 0, op, ": x has no columns: ", x.to_string());
  MZ_CHECK(eps >= 0, op, ": eps must be non-negative, got ", eps);
  check_operands(op, x, dt,
                 {{"x", &x}, {"gamma", &gamma}, {"beta", &beta}, {"y", &y}, {"mean", &mean}, {"rstd", &rstd}});
  check_shapes(op, {s.cols}, {{"gamma", &gamma}, {"beta", &beta}});
  check_shape(op, "y", y, x.shape());
  check_rows(op, "mean", mean, s.rows);
  check_rows(op, "rstd", rstd, s.rows);
  if (!on_host(op, x)) return;
  with_float_type(dt, [&](auto tag) {
    using T = decltype(tag);
    layernorm_forward_cpu(ptr<const T>(x), ptr<const T>(gamma), ptr<const T>(beta), eps, ptr<T>(y), ptr<T>(mean),
                          ptr<T>(rstd), s);
  });
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                        Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  constexpr const char* op = "layernorm_backward";
  check_float(op, "x", x);
  const DType dt = x.dtype();
  const Rows s = rows_of(op, "x", x);
  check_operands(op, x, dt,
                 {{"dy", &dy},
                  {"x", &x},
                  {"gamma", &gamma},
                  {"mean", &mean},
                  {"rstd", &rstd},
                  {"dx", &dx},
                  {"dgamma", &dgamma},
                  {"dbeta", &dbeta}});
  check_shapes(op, x.shape(), {{"dy", &dy}, {"dx", &dx}});
  check_shapes(op, {s.cols}, {{"gamma", &gamma}, {"dgamma", &dgamma}, {"dbeta", &dbeta}});
  check_rows(op, "mean", mean, s.rows);
  check_rows(op, "rstd", rstd, s.rows);
  if (!on_host(op, x)) return;
  with_float_type(dt, [&](auto tag) {
    using T = decltype(tag);
    layernorm_backward_cpu(ptr<const T>(dy), ptr<const T>(x), ptr<const T>(gamma), ptr<const T>(mean),
                           ptr<const T>(rstd), ptr<T>(dx), ptr<T>(dgamma), ptr<T>(dbeta), s);
  });
}

void gelu_forward(const Tensor& x, Tensor& y) {
  constexpr const char* op = "gelu_forward";
  check_float(op, "x", x);
  check_operands(op, x, x.dtype(), {{"x", &x}, {"y", &y}});
  check_shape(op, "y", y, x.shape());
  if (!on_host(op, x)) return;
  with_float_type(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* xp = ptr<const T>(x);
    elementwise(ptr<T>(y), x.numel(), [=](i64 i) { return gelu(xp[i]); });
  });
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  constexpr const char* op = "gelu_backward";
  check_float(op, "x", x);
  check_operands(op, x, x.dtype(), {{"dy", &dy}, {"x", &x}, {"dx", &dx}});
  check_shapes(op, x.shape(), {{"dy", &dy}, {"dx", &dx}});
  if (!on_host(op, x)) return;
  with_float_type(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* xp = ptr<const T>(x);
    const T* dyp = ptr<const T>(dy);
    elementwise(ptr<T>(dx), x.numel(), [=](i64 i) { return dyp[i] * gelu_grad(xp[i]); });
  });
}

void add_bias(Tensor& y, const Tensor& bias) {
  constexpr const char* op = "add_bias";
  check_float(op, "y", y);
  const Rows s = rows_of(op, "y", y);
  check_operands(op, y, y.dtype(), {{"y", &y}, {"bias", &bias}});
  check_shape(op, "bias", bias, {s.cols});
  if (!on_host(op, y)) return;
  with_float_type(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* yp = ptr<T>(y);
    const T* bp = ptr<const T>(bias);
    elementwise(yp, y.numel(), [=](i64 i) { return yp[i] + bp[i % s.cols]; });
  });
}

void bias_grad(const Tensor& dy, Tensor& dbias) {
  constexpr const char* op = "bias_grad";
  check_float(op, "dy", dy);
  const Rows s = rows_of(op, "dy", dy);
  check_operands(op, dy, dy.dtype(), {{"dy", &dy}, {"dbias", &dbias}});
  check_shape(op, "dbias", dbias, {s.cols});
  if (!on_host(op, dy)) return;
  with_float_type(dy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* g = ptr<const T>(dy);
    accumulate_columns(ptr<T>(dbias), s.rows, s.cols,
                       [=](i64 r, i64 c) { return static_cast<double>(g[r * s.cols + c]); });
  });
}

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  constexpr const char* op = "add";
  check_float(op, "a", a);
  check_operands(op, a, a.dtype(), {{"a", &a}, {"b", &b}, {"out", &out}});
  check_shapes(op, a.shape(), {{"b", &b}, {"out", &out}});
  if (!on_host(op, a)) return;
  with_float_type(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* ap = ptr<const T>(a);
    const T* bp = ptr<const T>(b);
    elementwise(ptr<T>(out), a.numel(), [=](i64 i) { return ap[i] + bp[i]; });
  });
}

void axpy(double alpha, const Tensor& x, Tensor& y) {
  constexpr const char* op = "axpy";
  check_float(op, "x", x);
  check_operands(op, x, x.dtype(), {{"x", &x}, {"y", &y}});
  check_shape(op, "y", y, x.shape());
  if (!on_host(op, x)) return;
  with_float_type(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* xp = ptr<const T>(x);
    T* yp = ptr<T>(y);
    const T a = static_cast<T>(alpha);
    elementwise(yp, x.numel(), [=](i64 i) { return yp[i] + a * xp[i]; });
  });
}

void scale(Tensor& x, double alpha) {
  constexpr const char* op = "scale";
  check_float(op, "x", x);
  check_operand(op, "x", x, x, x.dtype());
  if (!on_host(op, x)) return;
  with_float_type(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* xp = ptr<T>(x);
    const T a = static_cast<T>(alpha);
    elementwise(xp, x.numel(), [=](i64 i) { return xp[i] * a; });
  });
}

namespace {
// Attention scores are [..., n, n]; returns the number of n x n matrices.
i64 check_square(const char* op, const char* name, const Tensor& t) {
  MZ_CHECK(t.dim() >= 2 && t.size(-1) == t.size(-2), op, ": ", name, " must be [batch, sq, sk] with sq == sk, got ",
           t.to_string());
  return t.size(-1) == 0 ? 0 : t.numel() / (t.size(-1) * t.size(-1));
}
}  // namespace

void causal_softmax_forward(const Tensor& scores, double scale, Tensor& probs) {
  constexpr const char* op = "causal_softmax_forward";
  check_float(op, "scores", scores);
  const i64 mats = check_square(op, "scores", scores);
  check_operands(op, scores, scores.dtype(), {{"scores", &scores}, {"probs", &probs}});
  check_shape(op, "probs", probs, scores.shape());
  if (!on_host(op, scores)) return;
  with_float_type(scores.dtype(), [&](auto tag) {
    using T = decltype(tag);
    causal_softmax_forward_cpu(ptr<const T>(scores), scale, ptr<T>(probs), mats, scores.size(-1));
  });
}

void causal_softmax_backward(const Tensor& dprobs, const Tensor& probs, double scale, Tensor& dscores) {
  constexpr const char* op = "causal_softmax_backward";
  check_float(op, "probs", probs);
  const i64 mats = check_square(op, "probs", probs);
  check_operands(op, probs, probs.dtype(), {{"dprobs", &dprobs}, {"probs", &probs}, {"dscores", &dscores}});
  check_shapes(op, probs.shape(), {{"dprobs", &dprobs}, {"dscores", &dscores}});
  if (!on_host(op, probs)) return;
  with_float_type(probs.dtype(), [&](auto tag) {
    using T = decltype(tag);
    causal_softmax_backward_cpu(ptr<const T>(dprobs), ptr<const T>(probs), scale, ptr<T>(dscores), mats,
                                probs.size(-1));
  });
}

void dropout_forward(const Tensor& x, double p, const RngKey& key, const DropoutLayout& layout, Tensor& y) {
  dropout("dropout_forward", x, p, key, layout, y);
}

// The mask is a pure function of (key, global index): regenerating it costs
// compute but no memory, and matches the forward bit for bit.
void dropout_backward(const Tensor& dy, double p, const RngKey& key, const DropoutLayout& layout, Tensor& dx) {
  dropout("dropout_backward", dy, p, key, layout, dx);
}

void embedding_forward(const Tensor& ids, const Tensor& table, std::int64_t vocab_start, Tensor& out) {
  constexpr const char* op = "embedding_forward";
  check_float(op, "table", table);
  MZ_CHECK(table.dim() == 2, op, ": table must be [V_local, H], got ", table.to_string());
  const i64 v = table.size(0), h = table.size(1);
  check_operand(op, "table", table, table, table.dtype());
  check_operand(op, "ids", ids, table, DType::I64);
  MZ_CHECK(ids.dim() == 1, op, ": ids must be [N], got ", ids.to_string());
  const i64 n = ids.size(0);
  check_operand(op, "out", out, table, table.dtype());
  check_shape(op, "out", out, {n, h});
  if (!on_host(op, table)) return;
  with_float_type(table.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t* id = ptr<const std::int64_t>(ids);
    const T* tab = ptr<const T>(table);
    T* o = ptr<T>(out);
#pragma omp parallel for num_threads(threads()) schedule(static) if (n * h > kParallelMin)
    for (i64 i = 0; i < n; ++i) {
      const i64 row = local_column(id[i], vocab_start, v);
      if (row >= 0)
        std::copy_n(tab + row * h, h, o + i * h);
      else
        std::fill_n(o + i * h, h, static_cast<T>(0));  // another rank's row; the all-reduce fills it
    }
  });
}

void embedding_backward(const Tensor& ids, const Tensor& dout, std::int64_t vocab_start, Tensor& dtable) {
  constexpr const char* op = "embedding_backward";
  check_float(op, "dtable", dtable);
  MZ_CHECK(dtable.dim() == 2, op, ": dtable must be [V_local, H], got ", dtable.to_string());
  const i64 v = dtable.size(0), h = dtable.size(1);
  check_operand(op, "dtable", dtable, dtable, dtable.dtype());
  check_operand(op, "ids", ids, dtable, DType::I64);
  MZ_CHECK(ids.dim() == 1, op, ": ids must be [N], got ", ids.to_string());
  const i64 n = ids.size(0);
  check_operand(op, "dout", dout, dtable, dtable.dtype());
  check_shape(op, "dout", dout, {n, h});
  if (!on_host(op, dtable)) return;
  with_float_type(dtable.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const std::int64_t* id = ptr<const std::int64_t>(ids);
    const T* g = ptr<const T>(dout);
    T* dt = ptr<T>(dtable);
    // Repeated ids add into one row: threads split the columns, never the
    // tokens, so there are no races and the order of additions is fixed.
    constexpr i64 kBlock = 64;
    const i64 blocks = (h + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(threads()) schedule(static) if (n * h > kParallelMin)
    for (i64 blk = 0; blk < blocks; ++blk) {
      const i64 c0 = blk * kBlock, c1 = std::min(h, c0 + kBlock);
      for (i64 i = 0; i < n; ++i) {
        const i64 row = local_column(id[i], vocab_start, v);
        if (row < 0) continue;
        for (i64 c = c0; c < c1; ++c) dt[row * h + c] += g[i * h + c];
      }
    }
  });
}

namespace {
// out/dout is [B * seq, H]; pos_table/dpos holds at least `seq` positions of H.
Rows check_positions(const char* op, const Tensor& act, const Tensor& pos, std::int64_t seq) {
  check_float(op, "activations", act);
  check_operand(op, "activations", act, act, act.dtype());
  check_operand(op, "position table", pos, act, act.dtype());
  MZ_CHECK(act.dim() == 2, op, ": activations must be [B*S, H], got ", act.to_string());
  MZ_CHECK(pos.dim() == 2 && pos.size(1) == act.size(1), op, ": position table must be [P, ", act.size(1), "], got ",
           pos.to_string());
  MZ_CHECK(seq > 0 && act.size(0) % seq == 0, op, ": ", act.size(0), " rows are not a whole number of sequences of ",
           seq);
  MZ_CHECK(pos.size(0) >= seq, op, ": sequence length ", seq, " exceeds the ", pos.size(0), " positions of the table");
  return {act.size(0) / seq, act.size(1)};  // {batch, hidden}
}
}  // namespace

void add_position_embedding(Tensor& out, const Tensor& pos_table, std::int64_t seq) {
  constexpr const char* op = "add_position_embedding";
  const Rows s = check_positions(op, out, pos_table, seq);
  if (!on_host(op, out)) return;
  with_float_type(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* o = ptr<T>(out);
    const T* pos = ptr<const T>(pos_table);
    const i64 per_sample = seq * s.cols;  // out[b*S + s, :] is element b * per_sample + (s * H + h)
    elementwise(o, out.numel(), [=](i64 i) { return o[i] + pos[i % per_sample]; });
  });
}

void position_embedding_backward(const Tensor& dout, std::int64_t seq, Tensor& dpos) {
  constexpr const char* op = "position_embedding_backward";
  const Rows s = check_positions(op, dout, dpos, seq);
  if (!on_host(op, dout)) return;
  with_float_type(dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* g = ptr<const T>(dout);
    const i64 per_sample = seq * s.cols;
    // The first seq rows of dpos, flattened, are a sum over samples b of dout's
    // b-th [seq * H] block.
    accumulate_columns(ptr<T>(dpos), s.rows, per_sample,
                       [=](i64 b, i64 j) { return static_cast<double>(g[b * per_sample + j]); });
  });
}

void rowwise_max(const Tensor& logits, std::int64_t valid, Tensor& out) {
  constexpr const char* op = "rowwise_max";
  const VocabSlice s = check_logits(op, logits, valid);
  check_operand(op, "out", out, logits, logits.dtype());
  check_rows(op, "out", out, s.rows);
  if (!on_host(op, logits)) return;
  with_float_type(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    rowwise_max_cpu(ptr<const T>(logits), s, ptr<T>(out));
  });
}

void rowwise_sum_exp(const Tensor& logits, const Tensor& row_max, std::int64_t valid, Tensor& out) {
  constexpr const char* op = "rowwise_sum_exp";
  const VocabSlice s = check_logits(op, logits, valid);
  check_operand(op, "row_max", row_max, logits, logits.dtype());
  check_rows(op, "row_max", row_max, s.rows);
  check_operand(op, "out", out, logits, logits.dtype());
  check_rows(op, "out", out, s.rows);
  if (!on_host(op, logits)) return;
  with_float_type(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    rowwise_sum_exp_cpu(ptr<const T>(logits), ptr<const T>(row_max), s, ptr<T>(out));
  });
}

void gather_target_logit(const Tensor& logits, const Tensor& targets, std::int64_t vocab_start, std::int64_t valid,
                         Tensor& out) {
  constexpr const char* op = "gather_target_logit";
  const VocabSlice s = check_logits(op, logits, valid);
  check_operand(op, "targets", targets, logits, DType::I64);
  check_rows(op, "targets", targets, s.rows);
  check_operand(op, "out", out, logits, logits.dtype());
  check_rows(op, "out", out, s.rows);
  if (!on_host(op, logits)) return;
  with_float_type(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* l = ptr<const T>(logits);
    const std::int64_t* t = ptr<const std::int64_t>(targets);
    elementwise(ptr<T>(out), s.rows, [=](i64 r) {
      const i64 c = local_column(t[r], vocab_start, s.valid);
      return c >= 0 ? l[r * s.cols + c] : static_cast<T>(0);  // 0: the all-reduce sums over ranks
    });
  });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& row_max, const Tensor& sum_exp, const Tensor& targets,
                            std::int64_t vocab_start, std::int64_t valid, double scale, Tensor& dlogits) {
  constexpr const char* op = "cross_entropy_backward";
  const VocabSlice s = check_logits(op, logits, valid);
  check_operands(op, logits, logits.dtype(), {{"row_max", &row_max}, {"sum_exp", &sum_exp}, {"dlogits", &dlogits}});
  check_operand(op, "targets", targets, logits, DType::I64);
  for (const auto& [name, t] : {Named{"row_max", &row_max}, {"sum_exp", &sum_exp}, {"targets", &targets}})
    check_rows(op, name, *t, s.rows);
  check_shape(op, "dlogits", dlogits, logits.shape());
  if (!on_host(op, logits)) return;
  with_float_type(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_backward_cpu(ptr<const T>(logits), ptr<const T>(row_max), ptr<const T>(sum_exp),
                               ptr<const std::int64_t>(targets), vocab_start, s, scale, ptr<T>(dlogits));
  });
}

}  // namespace megazero::kernels
