// The layer kernels against independent references written here with plain
// loops in double: every forward against its reference (fp64 tightly, fp32
// within fp32 rounding of the same inputs), every backward against central
// finite differences in fp64 of a random linear functional L = sum(w * output).
// Plus the properties the parallel layers rely on: causal masking, dropout masks
// that do not depend on how a tensor is split over TP/DP ranks, embeddings and
// cross-entropy split over vocabulary slices with padding. Then every kernel
// with bf16 and fp16 storage (HalfStorage): within one rounding of the fp64
// reference on the same rounded inputs, fp32 statistics, fp32 or 16-bit
// gradient accumulators, the fp32 dropout mask, and the dtype rules enforced.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "megazero/core/error.h"
#include "megazero/core/tensor.h"
#include "megazero/kernels/fused_attention.h"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/layer_kernels.h"

using namespace megazero;
using namespace megazero::kernels;
using MC = MemoryCategory;
using Vec = std::vector<double>;
using i64 = std::int64_t;

namespace {

const std::shared_ptr<Device>& cpu() {
  static const auto device = make_device(DeviceKind::CPU);
  return device;
}

Tensor tensor(const Shape& shape, const Vec& values, DType t = DType::F64) {
  Tensor out = Tensor::empty(cpu(), shape, t, MC::Other);
  out.copy_from_doubles(values);
  return out;
}

Tensor empty(const Shape& shape, DType t = DType::F64) { return Tensor::empty(cpu(), shape, t, MC::Other); }

Tensor ids_tensor(const std::vector<i64>& ids) {
  Tensor out = Tensor::empty(cpu(), {static_cast<i64>(ids.size())}, DType::I64, MC::Other);
  std::copy(ids.begin(), ids.end(), out.host_data<i64>());
  return out;
}

Vec vals(const Tensor& t) { return t.to_double_vector(); }

Vec randn(std::size_t n, std::mt19937& rng, double sd = 1.0) {
  std::normal_distribution<double> d(0.0, sd);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Rounds to fp32 so that fp32 and fp64 runs see identical inputs.
Vec to_f32(Vec v) {
  for (auto& x : v) x = static_cast<float>(x);
  return v;
}

Vec minus(const Vec& a, const Vec& b) {
  Vec out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) out[i] = a[i] - b[i];
  return out;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

void expect_close(const Vec& got, const Vec& want, double rtol, double atol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool ok = std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i]);
    if (!ok && reported++ < 5) ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
  }
}

// Central differences of L(x) = sum(w * f(x)) at every element of x, against
// the analytic gradient `grad`. With h = 1e-6 in fp64 the difference quotient
// is good to ~1e-9 absolute for O(1) values, so a relative tolerance of 1e-6
// (floored at 1e-8 of the largest gradient) catches any wrong term.
void expect_fd_gradient(const std::string& what, const Vec& x, const std::function<Vec(const Vec&)>& f, const Vec& w,
                        const Vec& grad) {
  ASSERT_EQ(x.size(), grad.size()) << what;
  constexpr double h = 1e-6;
  double gmax = 0;
  for (double g : grad) gmax = std::max(gmax, std::fabs(g));
  int reported = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    Vec xp = x, xm = x;
    xp[i] += h;
    xm[i] -= h;
    const double fd = (dot(w, f(xp)) - dot(w, f(xm))) / (2 * h);
    const double tol = 1e-6 * (std::fabs(fd) + 0.01 * gmax) + 1e-12;
    if (std::fabs(grad[i] - fd) > tol && reported++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: analytic " << grad[i] << ", finite differences " << fd;
  }
}

// f must throw an InternalError whose message contains `needle`: the check
// meant, not some other one, rejected the call.
void expect_rejected(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    return;
  }
  ADD_FAILURE() << "no InternalError; expected one containing '" << needle << "'";
}

i64 numel(const Shape& s) { return shape_numel(s); }
std::size_t usize(i64 n) { return static_cast<std::size_t>(n); }

// ============================== LayerNorm ==============================

struct LayerNormOut {
  Vec y, mean, rstd;
};

LayerNormOut layernorm_ref(const Vec& x, const Vec& gamma, const Vec& beta, i64 rows, i64 cols, double eps) {
  LayerNormOut o{Vec(x.size()), Vec(usize(rows)), Vec(usize(rows))};
  for (i64 r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (i64 c = 0; c < cols; ++c) mean += x[usize(r * cols + c)] / static_cast<double>(cols);
    for (i64 c = 0; c < cols; ++c) var += std::pow(x[usize(r * cols + c)] - mean, 2) / static_cast<double>(cols);
    const double rstd = 1.0 / std::sqrt(var + eps);
    for (i64 c = 0; c < cols; ++c)
      o.y[usize(r * cols + c)] = (x[usize(r * cols + c)] - mean) * rstd * gamma[usize(c)] + beta[usize(c)];
    o.mean[usize(r)] = mean;
    o.rstd[usize(r)] = rstd;
  }
  return o;
}

struct LayerNormCase {
  Shape shape;
  Vec x, gamma, beta;
  double eps = 1e-5;
  i64 cols() const { return shape.back(); }
  i64 rows() const { return numel(shape) / cols(); }
};

LayerNormCase layernorm_case(const Shape& shape, unsigned seed, double row_offset) {
  std::mt19937 rng(seed);
  LayerNormCase c{shape, {}, {}, {}};
  c.x = randn(usize(numel(shape)), rng);
  for (std::size_t i = 0; i < c.x.size(); ++i)  // odd rows sit far from 0: a one-pass variance would cancel
    if ((static_cast<i64>(i) / c.cols()) % 2) c.x[i] += row_offset;
  c.gamma = randn(usize(c.cols()), rng);
  c.beta = randn(usize(c.cols()), rng);
  return c;
}

LayerNormOut layernorm_run(const LayerNormCase& c, DType t) {
  Tensor y = empty(c.shape, t), mean = empty({c.rows()}, t), rstd = empty({c.rows()}, t);
  layernorm_forward(tensor(c.shape, c.x, t), tensor({c.cols()}, c.gamma, t), tensor({c.cols()}, c.beta, t), c.eps, y,
                    mean, rstd);
  return {vals(y), vals(mean), vals(rstd)};
}

TEST(LayerNorm, ForwardMatchesReference) {
  const auto c = layernorm_case({3, 4, 37}, 1, 1000.0);
  const auto want = layernorm_ref(c.x, c.gamma, c.beta, c.rows(), c.cols(), c.eps);
  const auto got = layernorm_run(c, DType::F64);
  expect_close(got.y, want.y, 1e-11, 1e-11, "y");
  expect_close(got.mean, want.mean, 1e-14, 1e-14, "mean");
  expect_close(got.rstd, want.rstd, 1e-11, 0, "rstd");
}

TEST(LayerNorm, Fp32ForwardMatchesFp64) {
  auto c = layernorm_case({6, 50}, 2, 300.0);
  c.x = to_f32(c.x), c.gamma = to_f32(c.gamma), c.beta = to_f32(c.beta);
  const auto f64 = layernorm_run(c, DType::F64), f32 = layernorm_run(c, DType::F32);
  expect_close(f32.y, f64.y, 2e-6, 2e-6, "y");
  expect_close(f32.mean, f64.mean, 1e-7, 0, "mean");
  expect_close(f32.rstd, f64.rstd, 1e-7, 0, "rstd");
}

TEST(LayerNorm, BackwardMatchesFiniteDifferencesAndAccumulates) {
  auto c = layernorm_case({2, 3, 9}, 3, 2.0);
  std::mt19937 rng(30);
  const Vec w = randn(c.x.size(), rng), dgamma0 = randn(usize(c.cols()), rng), dbeta0 = randn(usize(c.cols()), rng);
  Tensor x = tensor(c.shape, c.x), gamma = tensor({c.cols()}, c.gamma), beta = tensor({c.cols()}, c.beta);
  Tensor y = empty(c.shape), mean = empty({c.rows()}), rstd = empty({c.rows()});
  layernorm_forward(x, gamma, beta, c.eps, y, mean, rstd);
  Tensor dx = tensor(c.shape, Vec(c.x.size(), 1e30));  // overwritten, whatever it held
  Tensor dgamma = tensor({c.cols()}, dgamma0), dbeta = tensor({c.cols()}, dbeta0);
  layernorm_backward(tensor(c.shape, w), x, gamma, mean, rstd, dx, dgamma, dbeta);

  auto with = [&](auto field) {
    return [=](const Vec& v) {
      LayerNormCase d = c;
      d.*field = v;
      return layernorm_run(d, DType::F64).y;
    };
  };
  expect_fd_gradient("dx", c.x, with(&LayerNormCase::x), w, vals(dx));
  expect_fd_gradient("dgamma", c.gamma, with(&LayerNormCase::gamma), w, minus(vals(dgamma), dgamma0));
  expect_fd_gradient("dbeta", c.beta, with(&LayerNormCase::beta), w, minus(vals(dbeta), dbeta0));
}

TEST(LayerNorm, BackwardAddsTheResidualGradientInTheSamePass) {
  auto c = layernorm_case({4, 12}, 3, 1.0);
  std::mt19937 rng(31);
  const Vec w = randn(c.x.size(), rng), r = randn(c.x.size(), rng);
  Tensor x = tensor(c.shape, c.x), gamma = tensor({c.cols()}, c.gamma), beta = tensor({c.cols()}, c.beta);
  Tensor y = empty(c.shape), mean = empty({c.rows()}), rstd = empty({c.rows()});
  layernorm_forward(x, gamma, beta, c.eps, y, mean, rstd);
  Tensor dx = empty(c.shape), dx_add = empty(c.shape), res = tensor(c.shape, r);
  Tensor dg = tensor({c.cols()}, Vec(usize(c.cols()), 0.0)), db = tensor({c.cols()}, Vec(usize(c.cols()), 0.0));
  layernorm_backward(tensor(c.shape, w), x, gamma, mean, rstd, dx, dg, db);
  layernorm_backward(tensor(c.shape, w), x, gamma, mean, rstd, dx_add, dg, db, &res);
  axpy(1.0, res, dx);  // what the fused form replaces: in fp64 the same sum
  EXPECT_EQ(vals(dx_add), vals(dx));
  Tensor wrong = empty({c.rows(), c.cols() + 1});
  expect_rejected([&] { layernorm_backward(tensor(c.shape, w), x, gamma, mean, rstd, dx, dg, db, &wrong); },
                  "add_to_dx");
}

TEST(LayerNorm, Fp32BackwardMatchesFp64) {
  auto c = layernorm_case({5, 40}, 4, 0.0);
  std::mt19937 rng(40);
  const Vec w = to_f32(randn(c.x.size(), rng));
  c.x = to_f32(c.x), c.gamma = to_f32(c.gamma), c.beta = to_f32(c.beta);
  auto run = [&](DType t) {
    Tensor x = tensor(c.shape, c.x, t), gamma = tensor({c.cols()}, c.gamma, t), beta = tensor({c.cols()}, c.beta, t);
    Tensor y = empty(c.shape, t), mean = empty({c.rows()}, t), rstd = empty({c.rows()}, t);
    layernorm_forward(x, gamma, beta, c.eps, y, mean, rstd);
    Tensor dx = empty(c.shape, t), dgamma = tensor({c.cols()}, Vec(usize(c.cols()), 0.0), t);
    Tensor dbeta = tensor({c.cols()}, Vec(usize(c.cols()), 0.0), t);
    layernorm_backward(tensor(c.shape, w, t), x, gamma, mean, rstd, dx, dgamma, dbeta);
    return std::vector<Vec>{vals(dx), vals(dgamma), vals(dbeta)};
  };
  const auto f32 = run(DType::F32), f64 = run(DType::F64);
  for (std::size_t k = 0; k < 3; ++k) expect_close(f32[k], f64[k], 1e-5, 1e-5, "gradient " + std::to_string(k));
}

// ================================ GeLU ================================

double gelu_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

Vec gelu_run(const Vec& x, DType t) {
  Tensor y = empty({static_cast<i64>(x.size())}, t);
  gelu_forward(tensor({static_cast<i64>(x.size())}, x, t), y);
  return vals(y);
}

TEST(Gelu, ForwardMatchesReferenceAndRunsInPlace) {
  std::mt19937 rng(5);
  Vec x = randn(999, rng, 3.0);
  x.insert(x.end(), {0.0, -0.0, 20.0, -20.0, 1e-8});
  x = to_f32(x);
  Vec want(x.size());
  std::transform(x.begin(), x.end(), want.begin(), gelu_ref);
  expect_close(gelu_run(x, DType::F64), want, 1e-15, 1e-15, "fp64");
  expect_close(gelu_run(x, DType::F32), want, 1e-6, 1e-6, "fp32");
  Tensor inplace = tensor({static_cast<i64>(x.size())}, x);
  gelu_forward(inplace, inplace);
  expect_close(vals(inplace), want, 1e-15, 1e-15, "in place");
}

TEST(Gelu, BackwardMatchesFiniteDifferencesAndAliases) {
  std::mt19937 rng(6);
  const Vec x = randn(60, rng, 2.5), w = randn(60, rng);
  const Shape shape{4, 15};
  Tensor dx = empty(shape);
  gelu_backward(tensor(shape, w), tensor(shape, x), dx);
  expect_fd_gradient(
      "dx", x, [](const Vec& v) { return gelu_run(v, DType::F64); }, w, vals(dx));
  Tensor d = tensor(shape, w);
  gelu_backward(d, tensor(shape, x), d);  // dx aliasing dy
  expect_close(vals(d), vals(dx), 0, 0, "aliased");
  Tensor dx32 = empty(shape, DType::F32);
  gelu_backward(tensor(shape, w, DType::F32), tensor(shape, to_f32(x), DType::F32), dx32);
  expect_close(vals(dx32), vals(dx), 1e-5, 1e-5, "fp32");
}

// Megatron's bias-GeLU fusion: forward is gelu(y + bias) (fp32: add_bias then
// gelu_forward, bit for bit); backward's dx and dbias match finite differences
// in fp64 and, in fp32, the unfused gelu_backward then bias_grad exactly.
TEST(Gelu, BiasGeluFusionIsTheUnfusedSequence) {
  std::mt19937 rng(8);
  const i64 rows = 12, cols = 7;
  const Shape shape{rows, cols};
  const Vec y = randn(usize(rows * cols), rng, 2.0), bias = randn(usize(cols), rng), w = randn(usize(rows * cols), rng);
  const Vec dbias0 = randn(usize(cols), rng);
  auto fused = [&](const Vec& yv, const Vec& bv, DType t) {
    Tensor out = empty(shape, t);
    bias_gelu_forward(tensor(shape, yv, t), tensor({cols}, bv, t), out);
    return vals(out);
  };
  auto unfused = [&](const Vec& yv, const Vec& bv, DType t) {
    Tensor pre = tensor(shape, yv, t);
    add_bias(pre, tensor({cols}, bv, t));
    Tensor out = empty(shape, t);
    gelu_forward(pre, out);
    return vals(out);
  };
  Vec want(y.size());
  for (std::size_t i = 0; i < y.size(); ++i) want[i] = gelu_ref(y[i] + bias[i % usize(cols)]);
  expect_close(fused(y, bias, DType::F64), want, 1e-15, 1e-15, "fp64");
  expect_close(fused(to_f32(y), to_f32(bias), DType::F32), unfused(to_f32(y), to_f32(bias), DType::F32), 0, 0,
               "fp32 fused vs unfused");
  {  // in place
    Tensor yy = tensor(shape, y);
    bias_gelu_forward(yy, tensor({cols}, bias), yy);
    expect_close(vals(yy), want, 1e-15, 1e-15, "in place");
  }
  // Backward, fp64: dx and dbias against finite differences of the forward.
  Tensor dx = empty(shape), db = tensor({cols}, dbias0);
  bias_gelu_backward(tensor(shape, w), tensor(shape, y), tensor({cols}, bias), dx, db);
  expect_fd_gradient(
      "dx", y, [&](const Vec& v) { return fused(v, bias, DType::F64); }, w, vals(dx));
  expect_fd_gradient(
      "dbias", bias, [&](const Vec& b) { return fused(y, b, DType::F64); }, w, minus(vals(db), dbias0));
  // fp32 (and dx aliasing dy): the unfused gelu_backward then bias_grad, bit for bit.
  for (const DType t : {DType::F32, DType::BF16}) {
    const Vec y32 = to_f32(y), b32 = to_f32(bias), w32 = to_f32(w);
    Tensor d = tensor(shape, w32, t), dbf = tensor({cols}, dbias0, DType::F32);
    bias_gelu_backward(d, tensor(shape, y32, t), tensor({cols}, b32, t), d, dbf);
    Tensor pre = tensor(shape, y32, t);
    add_bias(pre, tensor({cols}, b32, t));
    Tensor du = tensor(shape, w32, t), dbu = tensor({cols}, dbias0, DType::F32);
    gelu_backward(du, pre, du);
    bias_grad(du, dbu);
    if (t == DType::F32) {
      expect_close(vals(d), vals(du), 0, 0, "fp32 dx");
      expect_close(vals(dbf), vals(dbu), 0, 0, "fp32 dbias");
    } else {  // 16-bit: y + bias is not rounded first, so one rounding of difference at most
      expect_close(vals(d), vals(du), 2e-2, 1e-2, "bf16 dx");
      expect_close(vals(dbf), vals(dbu), 2e-2, 5e-2, "bf16 dbias");
    }
  }
  expect_rejected(
      [&] {
        Tensor o = empty(shape);
        bias_gelu_forward(tensor(shape, y), tensor({cols + 1}, Vec(usize(cols + 1))), o);
      },
      "bias_gelu_forward: bias has shape");
}

// ======================== bias and element-wise ========================

TEST(Elementwise, AddBiasMatchesReferenceAndBiasGradIsItsBackward) {
  std::mt19937 rng(7);
  const Shape shape{3, 4, 5};
  const Vec y0 = randn(60, rng), bias = randn(5, rng), w = randn(60, rng), dbias0 = randn(5, rng);
  auto run = [&](const Vec& b, DType t) {
    Tensor y = tensor(shape, y0, t);
    add_bias(y, tensor({5}, b, t));
    return vals(y);
  };
  Vec want(60);
  for (std::size_t i = 0; i < 60; ++i) want[i] = y0[i] + bias[i % 5];
  expect_close(run(bias, DType::F64), want, 0, 0, "add_bias");
  expect_close(run(to_f32(bias), DType::F32), run(to_f32(bias), DType::F64), 1e-7, 1e-7, "add_bias fp32");
  Tensor dbias = tensor({5}, dbias0);
  bias_grad(tensor(shape, w), dbias);
  expect_fd_gradient(
      "dbias", bias, [&](const Vec& b) { return run(b, DType::F64); }, w, minus(vals(dbias), dbias0));
}

TEST(Elementwise, AddAxpyScale) {
  std::mt19937 rng(8);
  const Shape shape{7, 3};
  const Vec a = to_f32(randn(21, rng)), b = to_f32(randn(21, rng));
  for (DType t : {DType::F64, DType::F32}) {
    const double tol = t == DType::F32 ? 1e-6 : 0;
    Vec sum(21), ax(21), sc(21);
    for (std::size_t i = 0; i < 21; ++i) sum[i] = a[i] + b[i], ax[i] = b[i] + 0.75 * a[i], sc[i] = a[i] * -1.5;
    Tensor ta = tensor(shape, a, t), tb = tensor(shape, b, t), out = empty(shape, t);
    add(ta, tb, out);
    expect_close(vals(out), sum, tol, tol, "add");
    add(ta, tb, ta);  // out aliasing a
    expect_close(vals(ta), sum, tol, tol, "add aliased");
    ta = tensor(shape, a, t);
    axpy(0.75, ta, tb);
    expect_close(vals(tb), ax, tol, tol, "axpy");
    scale(ta, -1.5);
    expect_close(vals(ta), sc, tol, tol, "scale");
  }
}

// =========================== causal softmax ===========================

Vec causal_softmax_ref(const Vec& s, i64 mats, i64 n, double scale) {
  Vec p(s.size(), 0.0);
  for (i64 m = 0; m < mats; ++m)
    for (i64 i = 0; i < n; ++i) {
      const std::size_t row = usize((m * n + i) * n);
      double mx = -1e300, sum = 0;
      for (i64 j = 0; j <= i; ++j) mx = std::max(mx, scale * s[row + usize(j)]);
      for (i64 j = 0; j <= i; ++j) sum += std::exp(scale * s[row + usize(j)] - mx);
      for (i64 j = 0; j <= i; ++j) p[row + usize(j)] = std::exp(scale * s[row + usize(j)] - mx) / sum;
    }
  return p;
}

Vec softmax_run(const Shape& shape, const Vec& s, double scale, DType t) {
  Tensor p = empty(shape, t);
  causal_softmax_forward(tensor(shape, s, t), scale, p);
  return vals(p);
}

TEST(CausalSoftmax, ForwardMatchesReferenceWithExactZerosAboveTheDiagonal) {
  std::mt19937 rng(9);
  const Shape shape{2, 3, 7, 7};  // [batch, heads, sq, sk]: leading dims flatten
  const i64 n = 7, mats = 6;
  const Vec s = to_f32(randn(usize(numel(shape)), rng, 4.0));
  const Vec want = causal_softmax_ref(s, mats, n, 0.3);
  const Vec p = softmax_run(shape, s, 0.3, DType::F64);
  expect_close(p, want, 1e-14, 1e-15, "fp64");
  expect_close(softmax_run(shape, s, 0.3, DType::F32), want, 1e-6, 1e-7, "fp32");
  for (i64 row = 0; row < mats * n; ++row) {
    const i64 i = row % n;
    double sum = 0;
    for (i64 j = 0; j < n; ++j) {
      const double v = p[usize(row * n + j)];
      if (j > i)
        ASSERT_EQ(v, 0.0) << "row " << row << " col " << j;
      else
        sum += v;
    }
    EXPECT_NEAR(sum, 1.0, 1e-14) << "row " << row;
  }
  Tensor inplace = tensor(shape, s);
  causal_softmax_forward(inplace, 0.3, inplace);
  expect_close(vals(inplace), p, 0, 0, "in place");
}

TEST(CausalSoftmax, HugeScoresStayFinite) {
  const Shape shape{1, 4, 4};
  const Vec s = {1e30, 0, 0, 0, -1e30, 3e4, 0, 0, 5e4, 5e4, -5e4, 0, 1e4, 1e4, 1e4, 1e4};
  for (DType t : {DType::F32, DType::F64}) {
    const Vec p = softmax_run(shape, s, 1.0, t);
    const Vec want = {1, 0, 0, 0, 0, 1, 0, 0, 0.5, 0.5, 0, 0, 0.25, 0.25, 0.25, 0.25};
    expect_close(p, want, 1e-6, 1e-30, std::string(dtype_name(t)));
  }
}

TEST(CausalSoftmax, BackwardMatchesFiniteDifferencesWithZeroAboveTheDiagonal) {
  std::mt19937 rng(10);
  const Shape shape{3, 5, 5};
  const double scale = 0.7;
  const Vec s = randn(75, rng, 2.0);
  Vec w = randn(75, rng);
  const Tensor probs = tensor(shape, softmax_run(shape, s, scale, DType::F64));
  Tensor ds = tensor(shape, Vec(75, 1e30));
  causal_softmax_backward(tensor(shape, w), probs, scale, ds);
  const Vec grad = vals(ds);
  expect_fd_gradient(
      "dscores", s, [&](const Vec& v) { return softmax_run(shape, v, scale, DType::F64); }, w, grad);
  // Above the diagonal the gradient is exactly 0 even if dprobs holds NaN there.
  for (std::size_t k = 0; k < 75; ++k)
    if (k % 5 > (k / 5) % 5) w[k] = std::numeric_limits<double>::quiet_NaN();
  Tensor d = tensor(shape, w);
  causal_softmax_backward(d, probs, scale, d);  // dscores aliasing dprobs
  const Vec masked = vals(d);
  for (std::size_t k = 0; k < 75; ++k) {
    if (k % 5 > (k / 5) % 5)
      ASSERT_EQ(masked[k], 0.0) << k;
    else
      ASSERT_EQ(masked[k], grad[k]) << k;
  }
  Tensor ds32 = empty(shape, DType::F32);
  Vec w_finite = w;
  for (double& v : w_finite) v = std::isnan(v) ? 0.0 : v;
  causal_softmax_backward(tensor(shape, w_finite, DType::F32), tensor(shape, vals(probs), DType::F32), scale, ds32);
  expect_close(vals(ds32), grad, 1e-5, 1e-6, "fp32");
}

// =============================== dropout ===============================

std::uint64_t global_index(const DropoutLayout& l, i64 a, i64 b, i64 c, i64 d) {
  return static_cast<std::uint64_t>(((l.a0 + a) * l.GB + (l.b0 + b)) * l.C * l.D + c * l.D + d);
}

Vec dropout_run(const Vec& x, double p, const RngKey& key, const DropoutLayout& l, DType t = DType::F64) {
  const Shape shape{l.A, l.B, l.C, l.D};
  Tensor y = empty(shape, t);
  dropout_forward(tensor(shape, x, t), p, key, l, y);
  return vals(y);
}

TEST(Dropout, MaskIsUniformAtOfTheGlobalIndex) {
  std::mt19937 rng(11);
  const DropoutLayout l{3, 2, 5, 7, 2, 1, 4};  // A B C D, a0 b0 GB: odd sizes, blocks of 4 straddle rows
  // Every key word non-trivial, high halves included: the kernel's block-wise
  // generator must map keys exactly as uniform_at does.
  const RngKey key{(3ull << 40) | 2024, (5ull << 32) | 17, 3, kRngAttentionDropout};
  const double p = 0.3;
  const Vec x = to_f32(randn(210, rng));
  for (DType t : {DType::F64, DType::F32}) {
    const Vec y = dropout_run(x, p, key, l, t);
    std::size_t i = 0;
    for (i64 a = 0; a < l.A; ++a)
      for (i64 b = 0; b < l.B; ++b)
        for (i64 c = 0; c < l.C; ++c)
          for (i64 d = 0; d < l.D; ++d, ++i) {
            const bool keep = uniform_at(key, global_index(l, a, b, c, d)) >= p;
            const double want = t == DType::F64 ? x[i] * (1.0 / (1.0 - p))
                                                : static_cast<float>(x[i]) * static_cast<float>(1.0 / (1.0 - p));
            ASSERT_EQ(y[i], keep ? want : 0.0) << dtype_name(t) << " element " << i;
          }
  }
}

TEST(Dropout, DropsAFractionPAndBackwardReusesTheMask) {
  std::mt19937 rng(12);
  const DropoutLayout l{2, 1, 1000, 500, 0, 0, 1};  // hidden states: B = 1
  const RngKey key{7, 3, 1, kRngMlpOutputDropout};
  for (double p : {0.1, 0.5}) {
    const Vec x(usize(l.A * l.C * l.D), 1.0);
    const Vec y = dropout_run(x, p, key, l, DType::F32);
    const double dropped = static_cast<double>(std::count(y.begin(), y.end(), 0.0)) / static_cast<double>(y.size());
    EXPECT_NEAR(dropped, p, 0.003) << "p " << p;  // standard error <= 5e-4
  }
  const DropoutLayout small{3, 2, 4, 9, 1, 0, 2};
  const double p = 0.4;
  const Vec x = randn(216, rng), dy = randn(216, rng);
  const Vec y = dropout_run(x, p, key, small);
  const Shape shape{3, 2, 4, 9};
  Tensor d = tensor(shape, dy);
  dropout_backward(d, p, key, small, d);  // dx aliasing dy
  const Vec dx = vals(d);
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(dx[i] / dy[i], y[i] / x[i], 1e-12) << i;
  // Dropout is linear: its backward is its own transpose.
  expect_fd_gradient(
      "dx", x, [&](const Vec& v) { return dropout_run(v, p, key, small); }, dy, dx);
}

// The mask of a whole tensor equals the masks of its pieces computed with
// offsets: TP ranks (split along heads, B) and DP ranks (split along samples,
// A) draw exactly the values a single rank would.
TEST(Dropout, MaskDoesNotDependOnTheSplitAcrossRanks) {
  const RngKey key{99, 5, 2, kRngAttentionDropout};
  const double p = 0.5;
  const DropoutLayout whole{4, 8, 5, 7, 0, 0, 8};  // C * D = 35: pieces start inside a 4-value Philox block
  const Shape shape{4, 8, 5, 7};
  const Vec ones(usize(numel(shape)), 1.0);
  const Tensor y = tensor(shape, dropout_run(ones, p, key, whole));
  for (int dim : {0, 1}) {
    for (i64 half = 0; half < 2; ++half) {
      DropoutLayout part = whole;
      if (dim == 0) {
        part.A = 2;
        part.a0 = 2 * half;
      } else {
        part.B = 4;
        part.b0 = 4 * half;
      }
      const Vec piece(usize(part.A * part.B * part.C * part.D), 1.0);
      const Vec got = dropout_run(piece, p, key, part);
      const i64 len = dim == 0 ? part.A : part.B;
      const Vec want = vals(y.narrow(dim, half * len, len).clone(MC::Other));
      EXPECT_EQ(got, want) << "split along " << (dim == 0 ? "A (DP)" : "B (TP)") << ", half " << half;
    }
  }
  // A different iteration draws a different mask.
  RngKey next = key;
  next.iteration += 1;
  EXPECT_NE(dropout_run(ones, p, next, whole), vals(y));
}

TEST(Dropout, ZeroProbabilityCopiesAndInvalidProbabilityIsRejected) {
  std::mt19937 rng(13);
  const DropoutLayout l{2, 3, 1, 5, 0, 0, 3};
  const Vec x = randn(30, rng);
  EXPECT_EQ(dropout_run(x, 0.0, RngKey{}, l), x);
  Tensor t = tensor({2, 3, 1, 5}, x);
  dropout_forward(t, 0.0, RngKey{}, l, t);
  EXPECT_EQ(vals(t), x);
  Tensor y = empty({2, 3, 1, 5});
  expect_rejected([&] { dropout_forward(t, 1.0, RngKey{}, l, y); }, "dropout_forward: dropout probability 1");
  expect_rejected([&] { dropout_forward(t, -0.1, RngKey{}, l, y); }, "dropout_forward: dropout probability -0.1");
  expect_rejected([&] { dropout_backward(t, 1.5, RngKey{}, l, y); }, "dropout_backward: dropout probability 1.5");
  DropoutLayout bad = l;
  bad.D = 4;  // does not cover the tensor
  expect_rejected([&] { dropout_forward(t, 0.1, RngKey{}, bad, y); }, "does not cover");
  bad = l, bad.b0 = 1;  // b0 + B > GB
  expect_rejected([&] { dropout_forward(t, 0.1, RngKey{}, bad, y); }, "b0 + B <= GB");
}

TEST(Dropout, BiasDropoutAddIsTheUnfusedSequenceBitForBit) {
  // residual + dropout(y + bias): the same operations in the same order as
  // add_bias, dropout_forward and add, so fp64 and fp32 agree exactly; the
  // result may overwrite y. p = 0 is a plain bias add and residual add.
  std::mt19937 rng(21);
  const DropoutLayout l{2, 1, 6, 10, 3, 0, 1};  // [samples, 1, seq, hidden]
  const RngKey key{99, 4, 2, kRngMlpOutputDropout};
  for (DType t : {DType::F64, DType::F32, DType::BF16})
    for (double p : {0.0, 0.25}) {
      const Vec yv = randn(120, rng), bv = randn(10, rng), rv = randn(120, rng);
      Tensor y = tensor({12, 10}, yv, t), bias = tensor({10}, bv, t), res = tensor({12, 10}, rv, t);
      Tensor ref = tensor({12, 10}, yv, t);
      add_bias(ref, bias);
      dropout_forward(ref, p, key, l, ref);
      add(res, ref, ref);
      bias_dropout_add(y, bias, res, p, key, l, y);
      if (t == DType::BF16) {  // one rounding instead of three: within two bf16 ulps
        const Vec a = vals(y), b = vals(ref);
        for (std::size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 2 * 0.0078125 * std::fabs(b[i]) + 1e-2);
      } else {
        EXPECT_EQ(vals(y), vals(ref)) << dtype_name(t) << " p " << p;
      }
    }
  Tensor y = empty({12, 10}), bias = empty({9}), res = empty({12, 10});
  expect_rejected([&] { bias_dropout_add(y, bias, res, 0.1, key, l, y); }, "bias_dropout_add: bias");
}

// bias-dropout-add's backward with the bias gradient in the same call: dx is
// dropout_backward's (also written over dy), and dbias gains the column sums
// of that rounded dx, with fp32 accumulators for 16-bit storage. FD of the
// forward in fp64 checks both.
TEST(Dropout, BackwardWithTheBiasGradientIsBiasDropoutAddsGradient) {
  std::mt19937 rng(22);
  const DropoutLayout l{2, 1, 6, 10, 3, 0, 1};
  const RngKey key{99, 4, 2, kRngMlpOutputDropout};
  for (double p : {0.0, 0.25}) {
    const Vec yv = randn(120, rng), bv = randn(10, rng), rv = randn(120, rng), w = randn(120, rng),
              db0 = randn(10, rng);
    auto forward = [&](const Vec& y, const Vec& b) {
      Tensor out = empty({12, 10});
      bias_dropout_add(tensor({12, 10}, y), tensor({10}, b), tensor({12, 10}, rv), p, key, l, out);
      return vals(out);
    };
    Tensor dx = empty({12, 10}), db = tensor({10}, db0);
    dropout_backward_bias_grad(tensor({12, 10}, w), p, key, l, dx, db);
    expect_fd_gradient(
        "dy", yv, [&](const Vec& y) { return forward(y, bv); }, w, vals(dx));
    expect_fd_gradient(
        "dbias", bv, [&](const Vec& b) { return forward(yv, b); }, w, minus(vals(db), db0));
    for (DType t : {DType::F32, DType::BF16}) {  // the two kernels it stands for, bit for bit
      Tensor d = tensor({12, 10}, w, t), dbf = tensor({10}, db0, DType::F32);
      dropout_backward_bias_grad(d, p, key, l, d, dbf);
      Tensor du = empty({12, 10}, t), dbu = tensor({10}, db0, DType::F32);
      dropout_backward(tensor({12, 10}, w, t), p, key, l, du);
      bias_grad(du, dbu);
      EXPECT_EQ(vals(d), vals(du)) << dtype_name(t) << " p " << p;
      EXPECT_EQ(vals(dbf), vals(dbu)) << dtype_name(t) << " p " << p;
    }
  }
  Tensor dy = empty({12, 10}), db = empty({9});
  expect_rejected([&] { dropout_backward_bias_grad(dy, 0.1, key, l, dy, db); }, "dropout_backward_bias_grad: dbias");
  Tensor db10 = empty({10});
  expect_rejected([&] { dropout_backward_bias_grad(dy, 1.0, key, l, dy, db10); }, "must be in [0, 1)");
}

// ============================== embeddings ==============================

TEST(Embedding, RowsOfTheSliceAndZerosForOtherIds) {
  std::mt19937 rng(14);
  const i64 v = 5, h = 6, start = 10;
  const Vec table = to_f32(randn(usize(v * h), rng));
  const std::vector<i64> ids = {10, 14, 9, 15, 12, 12, -1, 100, 11};
  for (DType t : {DType::F64, DType::F32}) {
    Tensor out = tensor({9, h}, Vec(usize(9 * h), 7.0), t);  // overwritten
    embedding_forward(ids_tensor(ids), tensor({v, h}, table, t), start, out);
    const Vec got = vals(out);
    for (std::size_t n = 0; n < ids.size(); ++n) {
      const bool mine = ids[n] >= start && ids[n] < start + v;
      for (i64 c = 0; c < h; ++c)
        ASSERT_EQ(got[n * usize(h) + usize(c)], mine ? table[usize((ids[n] - start) * h + c)] : 0.0) << n << "," << c;
    }
  }
}

TEST(Embedding, SlicesSumToTheFullTable) {  // what the TP all-reduce of the embedding output relies on
  std::mt19937 rng(15);
  const i64 vocab = 12, h = 4;
  const Vec table = randn(usize(vocab * h), rng);
  const std::vector<i64> ids = {0, 11, 5, 6, 3, 3, 8};
  const Tensor id = ids_tensor(ids);
  Tensor full = empty({7, h});
  embedding_forward(id, tensor({vocab, h}, table), 0, full);
  Vec sum(usize(7 * h), 0.0);
  for (i64 r = 0; r < 3; ++r) {  // 3 slices of 4 rows
    Tensor out = empty({7, h});
    const Vec part(table.begin() + r * 4 * h, table.begin() + (r + 1) * 4 * h);
    embedding_forward(id, tensor({4, h}, part), 4 * r, out);
    const Vec o = vals(out);
    for (std::size_t k = 0; k < sum.size(); ++k) sum[k] += o[k];
  }
  EXPECT_EQ(sum, vals(full));
}

TEST(Embedding, BackwardAccumulatesRepeatedIdsAndSkipsOtherSlices) {
  std::mt19937 rng(16);
  const i64 v = 4, h = 70, start = 3;  // h > 64: more than one column block
  const std::vector<i64> ids = {3, 6, 6, 2, 7, 3, 5, 6};
  const i64 n = static_cast<i64>(ids.size());
  const Vec dout = randn(usize(n * h), rng), dtable0 = randn(usize(v * h), rng), table = randn(usize(v * h), rng);
  Tensor dtable = tensor({v, h}, dtable0);
  embedding_backward(ids_tensor(ids), tensor({n, h}, dout), start, dtable);
  Vec want = dtable0;
  for (i64 i = 0; i < n; ++i)
    if (ids[usize(i)] >= start && ids[usize(i)] < start + v)
      for (i64 c = 0; c < h; ++c) want[usize((ids[usize(i)] - start) * h + c)] += dout[usize(i * h + c)];
  expect_close(vals(dtable), want, 1e-15, 1e-15, "dtable");
  const auto forward = [&](const Vec& tab) {
    Tensor out = empty({n, h});
    embedding_forward(ids_tensor(ids), tensor({v, h}, tab), start, out);
    return vals(out);
  };
  expect_fd_gradient("dtable", table, forward, dout, minus(vals(dtable), dtable0));
}

TEST(PositionEmbedding, AddAndBackward) {
  std::mt19937 rng(17);
  const i64 b = 3, s = 4, h = 5, positions = 6;  // the table has more positions than the sequence
  const Vec out0 = randn(usize(b * s * h), rng), pos = randn(usize(positions * h), rng);
  const Vec dout = randn(out0.size(), rng), dpos0 = randn(pos.size(), rng);
  const auto forward = [&](const Vec& table) {
    Tensor out = tensor({b * s, h}, out0);
    add_position_embedding(out, tensor({positions, h}, table), s);
    return vals(out);
  };
  Vec want = out0;
  for (i64 r = 0; r < b * s; ++r)
    for (i64 c = 0; c < h; ++c) want[usize(r * h + c)] += pos[usize((r % s) * h + c)];
  expect_close(forward(pos), want, 0, 0, "add_position_embedding");
  Tensor dpos = tensor({positions, h}, dpos0);
  position_embedding_backward(tensor({b * s, h}, dout), s, dpos);
  const Vec grad = minus(vals(dpos), dpos0);
  expect_fd_gradient("dpos", pos, forward, dout, grad);
  for (std::size_t k = usize(s * h); k < grad.size(); ++k) EXPECT_EQ(vals(dpos)[k], dpos0[k]) << "unused position";
  Tensor out32 = tensor({b * s, h}, to_f32(out0), DType::F32);
  add_position_embedding(out32, tensor({positions, h}, to_f32(pos), DType::F32), s);
  Vec want32 = to_f32(out0);
  for (i64 r = 0; r < b * s; ++r)
    for (i64 c = 0; c < h; ++c) want32[usize(r * h + c)] += static_cast<float>(pos[usize((r % s) * h + c)]);
  expect_close(vals(out32), want32, 1e-6, 1e-6, "fp32");
  Tensor out = tensor({b * s, h}, out0);
  const Tensor short_table = tensor({3, h}, Vec(usize(3 * h), 0.0));
  expect_rejected([&] { add_position_embedding(out, short_table, s); },
                  "exceeds the 3 positions");  // 3 positions < seq 4
}

// ====================== vocab-parallel cross-entropy ======================

struct CeProblem {
  i64 n, vocab;
  Vec logits;  // [n, vocab]
  std::vector<i64> targets;
};

CeProblem ce_problem(unsigned seed) {
  std::mt19937 rng(seed);
  CeProblem p{6, 11, {}, {}};
  p.logits = to_f32(randn(usize(p.n * p.vocab), rng, 3.0));
  std::uniform_int_distribution<i64> pick(0, p.vocab - 1);
  for (i64 i = 0; i < p.n; ++i) p.targets.push_back(pick(rng));
  return p;
}

// Mean over rows of -log softmax(logits)[target], and its gradient.
double ce_loss_ref(const CeProblem& p, const Vec& logits) {
  double loss = 0;
  for (i64 r = 0; r < p.n; ++r) {
    double mx = -1e300, sum = 0;
    for (i64 c = 0; c < p.vocab; ++c) mx = std::max(mx, logits[usize(r * p.vocab + c)]);
    for (i64 c = 0; c < p.vocab; ++c) sum += std::exp(logits[usize(r * p.vocab + c)] - mx);
    loss += std::log(sum) + mx - logits[usize(r * p.vocab + p.targets[usize(r)])];
  }
  return loss / static_cast<double>(p.n);
}

Vec ce_grad_ref(const CeProblem& p) {
  Vec g(p.logits.size());
  for (i64 r = 0; r < p.n; ++r) {
    double mx = -1e300, sum = 0;
    for (i64 c = 0; c < p.vocab; ++c) mx = std::max(mx, p.logits[usize(r * p.vocab + c)]);
    for (i64 c = 0; c < p.vocab; ++c) sum += std::exp(p.logits[usize(r * p.vocab + c)] - mx);
    for (i64 c = 0; c < p.vocab; ++c)
      g[usize(r * p.vocab + c)] = (std::exp(p.logits[usize(r * p.vocab + c)] - mx) / sum - (c == p.targets[usize(r)])) /
                                  static_cast<double>(p.n);
  }
  return g;
}

// One rank's slice: global columns [start, start + valid), stored in
// `local` >= valid columns whose tail is padding (filled with huge values, which
// must not leak into max, sum or gradient).
struct Slice {
  i64 start, valid, local;
};

struct CeResult {
  double loss;
  Vec grad;  // [n, vocab], the valid columns of every slice put back together
};

// Runs the kernels per slice and combines the statistics as the TP
// all-reduces do (max; then the rescaled sums and the target logits).
// Statistics are kept in row_stat_dtype(t): fp32 for 16-bit logits.
CeResult ce_split(const CeProblem& p, const std::vector<Slice>& slices, DType t) {
  const DType stat = row_stat_dtype(t);
  const Tensor targets = ids_tensor(p.targets);
  const auto rows = usize(p.n);
  std::vector<Tensor> logits, maxes, sums;
  Vec gmax(rows, -std::numeric_limits<double>::infinity()), gsum(rows, 0.0), target(rows, 0.0);
  for (const auto& s : slices) {
    Vec local(rows * usize(s.local), 1e4);
    for (i64 r = 0; r < p.n; ++r)
      for (i64 c = 0; c < s.valid; ++c) local[usize(r * s.local + c)] = p.logits[usize(r * p.vocab + s.start + c)];
    logits.push_back(tensor({p.n, s.local}, local, t));
    Tensor mx = empty({p.n}, stat), se = empty({p.n}, stat), tl = empty({p.n}, stat);
    cross_entropy_forward(logits.back(), targets, s.start, s.valid, mx, se, tl);  // local max; logits -> exp
    const Vec mv = vals(mx), tv = vals(tl), ev = vals(logits.back());
    for (i64 r = 0; r < p.n; ++r)
      for (i64 c = s.valid; c < s.local; ++c) EXPECT_EQ(ev[usize(r * s.local + c)], 0.0) << "padding exponential";
    for (std::size_t r = 0; r < rows; ++r) gmax[r] = std::max(gmax[r], mv[r]), target[r] += tv[r];
    maxes.push_back(mx), sums.push_back(se);
  }
  const Tensor global_max = tensor({p.n}, gmax, stat);
  for (std::size_t k = 0; k < slices.size(); ++k) {
    rescale_sum_exp(maxes[k], global_max, sums[k]);  // a slice of padding only stays 0
    const Vec sv = vals(sums[k]);
    for (std::size_t r = 0; r < rows; ++r) gsum[r] += sv[r];
  }
  const Tensor global_sum = tensor({p.n}, gsum, stat);
  Tensor loss = empty({p.n}, stat);
  cross_entropy_loss(global_max, global_sum, tensor({p.n}, target, stat), loss);
  CeResult out{0.0, Vec(p.logits.size(), 0.0)};
  for (double l : vals(loss)) out.loss += l / static_cast<double>(p.n);
  for (std::size_t k = 0; k < slices.size(); ++k) {
    const auto& s = slices[k];
    Tensor d = tensor({p.n, s.local}, Vec(rows * usize(s.local), 1e30), t);
    cross_entropy_backward(logits[k], maxes[k], global_max, global_sum, targets, s.start, s.valid,
                           1.0 / static_cast<double>(p.n), d);
    const Vec dv = vals(d);
    for (i64 r = 0; r < p.n; ++r) {
      for (i64 c = 0; c < s.valid; ++c) out.grad[usize(r * p.vocab + s.start + c)] = dv[usize(r * s.local + c)];
      for (i64 c = s.valid; c < s.local; ++c) EXPECT_EQ(dv[usize(r * s.local + c)], 0.0) << "padding column";
    }
  }
  return out;
}

// `per` columns per rank, each slice padded with 2 extra columns.
std::vector<Slice> slices_of(i64 vocab, i64 per, i64 ranks) {
  std::vector<Slice> out;
  for (i64 r = 0; r < ranks; ++r) out.push_back({r * per, std::clamp(vocab - r * per, i64{0}, per), per + 2});
  return out;
}

TEST(CrossEntropy, VocabSlicesCombineToTheUnsplitLossAndGradient) {
  const CeProblem p = ce_problem(18);
  const double loss = ce_loss_ref(p, p.logits);
  const Vec grad = ce_grad_ref(p);
  // {ranks, columns per rank}: 11 = 11, 6 + 5, 3 + 3 + 3 + 2, and 6 + 5 + 0 (a rank of padding only).
  for (auto [ranks, per] : {std::pair<i64, i64>{1, 11}, {2, 6}, {4, 3}, {3, 6}}) {
    SCOPED_TRACE(testing::Message() << ranks << " slices of " << per);
    const CeResult r64 = ce_split(p, slices_of(p.vocab, per, ranks), DType::F64);
    EXPECT_NEAR(r64.loss, loss, 1e-13);
    expect_close(r64.grad, grad, 1e-13, 1e-15, "fp64 gradient");
    const CeResult r32 = ce_split(p, slices_of(p.vocab, per, ranks), DType::F32);
    EXPECT_NEAR(r32.loss, loss, 1e-5);
    expect_close(r32.grad, grad, 1e-5, 1e-7, "fp32 gradient");
  }
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferencesOfTheKernelLoss) {
  const CeProblem p = ce_problem(19);
  const auto slices = slices_of(p.vocab, 3, 4);
  const Vec grad = ce_split(p, slices, DType::F64).grad;
  const Vec one = {1.0};
  expect_fd_gradient(
      "dlogits", p.logits,
      [&](const Vec& l) {
        CeProblem q = p;
        q.logits = l;
        return Vec{ce_split(q, slices, DType::F64).loss};
      },
      one, grad);
}

// The forward leaves exp(logit - row max) in the logits tensor, and the
// backward may write the gradient over it (what the GPT head does).
TEST(CrossEntropy, ForwardKeepsExponentialsInPlaceAndBackwardOverwritesThem) {
  const CeProblem p = ce_problem(20);
  const Tensor targets = ids_tensor(p.targets);
  Tensor d = tensor({p.n, p.vocab}, p.logits);
  Tensor mx = empty({p.n}), se = empty({p.n}), tl = empty({p.n}), loss = empty({p.n});
  cross_entropy_forward(d, targets, 0, p.vocab, mx, se, tl);
  const Vec ev = vals(d), mv = vals(mx), sv = vals(se), tv = vals(tl);
  for (i64 r = 0; r < p.n; ++r) {
    double mref = -1e300, sref = 0;
    for (i64 c = 0; c < p.vocab; ++c) mref = std::max(mref, p.logits[usize(r * p.vocab + c)]);
    EXPECT_EQ(mv[usize(r)], mref) << "row max is exact";
    EXPECT_EQ(tv[usize(r)], p.logits[usize(r * p.vocab + p.targets[usize(r)])]) << "target logit is exact";
    for (i64 c = 0; c < p.vocab; ++c) {
      const double e = std::exp(p.logits[usize(r * p.vocab + c)] - mref);
      EXPECT_NEAR(ev[usize(r * p.vocab + c)], e, 1e-15 * e + 1e-300);
      sref += e;
    }
    EXPECT_NEAR(sv[usize(r)], sref, 1e-14 * sref);
  }
  cross_entropy_loss(mx, se, tl, loss);
  double mean_loss = 0;
  for (double l : vals(loss)) mean_loss += l / static_cast<double>(p.n);
  EXPECT_NEAR(mean_loss, ce_loss_ref(p, p.logits), 1e-13);
  cross_entropy_backward(d, mx, mx, se, targets, 0, p.vocab, 1.0 / static_cast<double>(p.n), d);  // in place
  expect_close(vals(d), ce_grad_ref(p), 1e-13, 1e-15, "in place");
}

// ======================= dispatch, meta, validation =======================

TEST(LayerKernels, MetaDeviceChecksShapesAndComputesNothing) {
  auto meta = make_device(DeviceKind::Meta);
  Tensor x = Tensor::empty(meta, {4, 8}, DType::F32, MC::Other);
  Tensor g = Tensor::empty(meta, {8}, DType::F32, MC::Other), m = Tensor::empty(meta, {4}, DType::F32, MC::Other);
  layernorm_forward(x, g, g, 1e-5, x, m, m);
  gelu_forward(x, x);
  dropout_forward(x, 0.1, RngKey{}, DropoutLayout{4, 1, 1, 8, 0, 0, 1}, x);
  Tensor bad = Tensor::empty(meta, {7}, DType::F32, MC::Other);
  expect_rejected([&] { layernorm_forward(x, bad, g, 1e-5, x, m, m); }, "layernorm_forward: gamma has shape");
}

// The CUDA kernels' scratch (gpu_scratch.h) goes through the device: a meta
// device standing in for CUDA allocates exactly what the launchers will be
// given (so a plan counts it and the arena holds it), and the CPU kernels,
// or a meta device standing in for them, allocate none.
TEST(LayerKernels, GpuScratchIsAllocatedThroughTheDeviceOnlyForCudaKernels) {
  namespace gs = gpu_scratch;
  const i64 rows = 96, cols = 40, seq = 16, vocab = 50, bh = 4, d = 64;
  struct Case {
    const char* name;
    std::function<void(const std::shared_ptr<Device>&)> run;
    std::size_t cuda_bytes;
  };
  auto t = [](const std::shared_ptr<Device>& dev, const Shape& shape, DType dt) {
    Tensor x = Tensor::empty(dev, shape, dt, MC::Other);
    if (dev->has_storage()) x.zero_();
    return x;
  };
  const std::vector<Case> cases = {
      {"layernorm_backward",
       [&](const std::shared_ptr<Device>& dev) {
         Tensor x = t(dev, {rows, cols}, DType::BF16), g = t(dev, {cols}, DType::BF16);
         Tensor st = t(dev, {rows}, DType::F32), dg = t(dev, {cols}, DType::F32), db = t(dev, {cols}, DType::F32);
         Tensor dx = t(dev, {rows, cols}, DType::BF16);
         layernorm_backward(x, x, g, st, st, dx, dg, db);
       },
       gs::column_sums_bytes(DType::BF16, rows, cols, 2)},
      {"bias_gelu_backward",
       [&](const std::shared_ptr<Device>& dev) {
         Tensor dy = t(dev, {rows, cols}, DType::BF16), b = t(dev, {cols}, DType::BF16);
         Tensor db = t(dev, {cols}, DType::F32);
         bias_gelu_backward(dy, dy, b, dy, db);
       },
       gs::column_sums_bytes(DType::BF16, rows, cols, 1)},
      {"dropout_backward_bias_grad",
       [&](const std::shared_ptr<Device>& dev) {
         Tensor dy = t(dev, {rows, cols}, DType::BF16), db = t(dev, {cols}, DType::F32);
         dropout_backward_bias_grad(dy, 0.1, RngKey{}, DropoutLayout{rows, 1, 1, cols, 0, 0, 1}, dy, db);
       },
       gs::dropout_bias_grad_bytes(rows, cols)},
      {"bias_grad",
       [&](const std::shared_ptr<Device>& dev) {
         Tensor dy = t(dev, {rows, cols}, DType::F32), db = t(dev, {cols}, DType::F32);
         bias_grad(dy, db);
       },
       gs::column_sums_bytes(DType::F32, rows, cols, 1)},
      {"position_embedding_backward",
       [&](const std::shared_ptr<Device>& dev) {
         Tensor dy = t(dev, {40 * seq, cols}, DType::F32), dp = t(dev, {seq, cols}, DType::F32);
         position_embedding_backward(dy, seq, dp);  // 40 samples: two chunks of rows, so partials
       },
       gs::column_sums_bytes(DType::F32, 40, seq * cols, 1)},
      {"embedding_backward",
       [&](const std::shared_ptr<Device>& dev) {
         Tensor ids = t(dev, {rows}, DType::I64), dy = t(dev, {rows, cols}, DType::F32);
         Tensor table = t(dev, {vocab, cols}, DType::F32);
         embedding_backward(ids, dy, 0, table);
       },
       gs::embedding_sort_bytes(rows)},
      {"fused_attention_backward",
       [&](const std::shared_ptr<Device>& dev) {
         Tensor q = t(dev, {bh, seq, d}, DType::BF16), lse = t(dev, {bh, seq}, DType::F32);
         Tensor dq = t(dev, {bh, seq, d}, DType::BF16), dk = t(dev, {bh, seq, d}, DType::BF16),
                dv = t(dev, {bh, seq, d}, DType::BF16);
         fused_attention_backward(q, q, q, q, q, lse, 0.125, 0.0, RngKey{}, DropoutLayout{bh, 1, seq, seq, 0, 0, 1}, dq,
                                  dk, dv);
       },
       gs::flash_backward_bytes(bh, seq)},
  };
  auto workspace_traffic = [](const std::shared_ptr<Device>& dev, const Case& c) {
    const auto before = dev->memory().snapshot()[MC::Workspace];
    c.run(dev);
    const auto after = dev->memory().snapshot()[MC::Workspace];
    EXPECT_EQ(after.live_bytes, before.live_bytes) << "scratch outlives the call";
    return std::pair{after.allocations - before.allocations, after.allocated_bytes - before.allocated_bytes};
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_GT(c.cuda_bytes, 0u);
    // Standing in for CUDA: exactly the launcher's scratch, nothing else.
    const auto [cuda_allocs, cuda_bytes] = workspace_traffic(make_meta_device(DeviceKind::CUDA), c);
    EXPECT_EQ(cuda_allocs, 1);
    EXPECT_EQ(cuda_bytes, static_cast<i64>(c.cuda_bytes));
    // The CPU kernels: none of it (the CPU attention backward has workspace
    // of its own, which a meta device standing in for the CPU reproduces).
    const auto cpu_traffic = workspace_traffic(make_device(DeviceKind::CPU), c);
    EXPECT_EQ(workspace_traffic(make_meta_device(DeviceKind::CPU), c), cpu_traffic);
    if (std::string(c.name) != "fused_attention_backward") {
      EXPECT_EQ(cpu_traffic, (std::pair<i64, i64>{0, 0}));
    }
  }
  // A position-embedding gradient over a few samples of seq x h columns (one
  // chunk of rows) takes no scratch: not 8 bytes a column for nothing.
  const auto meta = make_meta_device(DeviceKind::CUDA);
  Tensor dy = t(meta, {4 * seq, 4096}, DType::BF16), dp = t(meta, {seq, 4096}, DType::F32);
  const auto before = meta->memory().snapshot()[MC::Workspace];
  position_embedding_backward(dy, seq, dp);
  EXPECT_EQ(meta->memory().snapshot()[MC::Workspace].allocations, before.allocations);
}

// The chunking the column-sum launchers use: every row in exactly one chunk,
// within CUDA's grid limits, and the scratch holds every chunk's partials.
TEST(LayerKernels, GpuColumnSumChunksCoverEveryRowOnce) {
  namespace gs = gpu_scratch;
  for (const i64 rows : {i64{0}, i64{1}, i64{31}, i64{32}, i64{33}, i64{1000}, i64{8192}, i64{1} << 20, i64{100000007}})
    for (const i64 cols : {i64{1}, i64{8}, i64{40}, i64{1536}, i64{50304}, i64{400000}}) {
      SCOPED_TRACE(testing::Message() << rows << " x " << cols);
      auto check = [&](const gs::Chunks& c, i64 per_thread) {
        EXPECT_GE(c.col_blocks * gs::kThreads * per_thread, cols);
        EXPECT_GE(c.used, 1);
        EXPECT_LE(c.used, 65535);
        EXPECT_GE(c.used * c.per_chunk, rows);
        if (rows > 0) {
          EXPECT_LT((c.used - 1) * c.per_chunk, rows);  // no empty chunk
        }
      };
      const auto plain = gs::column_chunks(rows, cols);
      check(plain, 1);
      const auto dropout = gs::dropout_column_chunks(rows, cols);  // any cols: four a thread, the last partly
      check(dropout, gs::kDropoutColumns);
      EXPECT_EQ(gs::dropout_bias_grad_bytes(rows, cols),
                static_cast<std::size_t>(dropout.used * cols) * sizeof(double));
      for (const DType dt : {DType::F32, DType::BF16, DType::F64}) {
        const std::size_t bytes = gs::column_sums_bytes(dt, rows, cols, 2);
        // One chunk (every row in it) needs no scratch: the sums go straight into the result.
        EXPECT_GE(bytes, plain.used > 1 ? static_cast<std::size_t>(plain.used * cols) * sizeof(double) : 0);
        const i64 vec = static_cast<i64>(16 / dtype_size(dt));
        std::size_t packed_bytes = 0;
        if (dt != DType::F64 && cols % vec == 0 && rows > 0) {
          const auto packed = gs::packed_column_chunks(rows, cols, vec);
          check(packed, vec);
          if (packed.used > 1) packed_bytes = static_cast<std::size_t>(packed.used * cols * 2) * sizeof(double);
          EXPECT_GE(bytes, packed_bytes);
        }
        if (plain.used == 1 && packed_bytes == 0) {
          EXPECT_EQ(bytes, 0u);
        }
      }
    }
}

TEST(LayerKernels, RejectsBadShapesAndDtypes) {
  Tensor x = empty({4, 8}), y = empty({4, 8}), g = empty({8}), m = empty({4});
  expect_rejected([&] { layernorm_forward(x, empty({7}), g, 1e-5, y, m, m); }, "layernorm_forward: gamma has shape");
  Tensor m3 = empty({3});
  expect_rejected([&] { layernorm_forward(x, g, g, 1e-5, y, m3, m); }, "layernorm_forward: mean must have shape");
  expect_rejected([&] { layernorm_forward(x, empty({8}, DType::F32), g, 1e-5, y, m, m); },
                  "layernorm_forward: gamma must be");  // mixed dtypes
  Tensor h = empty({4}, DType::I32), transposed = empty({8, 4}), scores = empty({2, 3, 4});
  expect_rejected([&] { gelu_forward(h, h); }, "gelu_forward: x must be fp32, fp64, bf16 or fp16");  // not a float
  expect_rejected([&] { gelu_forward(x, transposed); }, "gelu_forward: y has shape");                // shape differs
  expect_rejected([&] { causal_softmax_forward(scores, 1.0, scores); }, "sq == sk");                 // sq != sk
  Tensor out = empty({3, 8});
  const Tensor fp64_ids = tensor({3}, {0, 1, 2}), two_ids = ids_tensor({0, 1});
  expect_rejected([&] { embedding_forward(fp64_ids, x, 0, out); }, "embedding_forward: ids must be int64");
  expect_rejected([&] { embedding_forward(two_ids, x, 0, out); }, "embedding_forward: out has shape");
  const Tensor four_ids = ids_tensor({0, 1, 2, 3});
  expect_rejected([&] { cross_entropy_forward(x, four_ids, 0, 9, m, m, m); },
                  "cross_entropy_forward: valid columns 9");  // valid > V_local
  Tensor strided = empty({4, 16}).narrow(1, 0, 8);
  expect_rejected([&] { gelu_forward(strided, y); }, "gelu_forward: x must be contiguous");
  expect_rejected([&] { add_bias(y, empty({4})); }, "add_bias: bias has shape");
}

// Results are bitwise identical for any number of threads, and the parallel
// paths (taken above the size threshold) agree with the serial ones.
TEST(LayerKernels, SameBitsForAnyThreadCount) {
  std::mt19937 rng(21);
  const i64 rows = 600, cols = 130;
  const Vec x = randn(usize(rows * cols), rng), w = randn(usize(rows * cols), rng), sc = randn(120000, rng, 3.0);
  auto run_all = [&]() {
    std::vector<Vec> out;
    Tensor xt = tensor({rows, cols}, x), wt = tensor({rows, cols}, w);
    Tensor y = empty({rows, cols}), mean = empty({rows}), rstd = empty({rows}),
           gamma = tensor({cols}, Vec(usize(cols), 1.5));
    Tensor dg = tensor({cols}, Vec(usize(cols), 0.0)), db = tensor({cols}, Vec(usize(cols), 0.0)),
           dx = empty({rows, cols});
    layernorm_forward(xt, gamma, gamma, 1e-5, y, mean, rstd);
    layernorm_backward(wt, xt, gamma, mean, rstd, dx, dg, db);
    out.push_back(vals(y)), out.push_back(vals(dx)), out.push_back(vals(dg)), out.push_back(vals(db));
    Tensor d = empty({rows, cols});
    dropout_forward(xt, 0.3, RngKey{1, 2, 3, kRngEmbeddingDropout}, DropoutLayout{1, 1, rows, cols, 0, 0, 1}, d);
    out.push_back(vals(d));
    Tensor s = tensor({3, 200, 200}, sc), pr = empty({3, 200, 200});
    causal_softmax_forward(s, 0.5, pr);
    out.push_back(vals(pr));
    Tensor dpos = tensor({100, cols}, Vec(usize(100 * cols), 0.0));
    position_embedding_backward(tensor({rows, cols}, w), 100, dpos);
    out.push_back(vals(dpos));
    return out;
  };
  const int before = cpu_math_threads();
  set_cpu_math_threads(1);
  const auto one = run_all();
  set_cpu_math_threads(4);
  const auto four = run_all();
  set_cpu_math_threads(before);
  for (std::size_t k = 0; k < one.size(); ++k) EXPECT_EQ(one[k], four[k]) << "output " << k;
}

// =========================== 16-bit storage ===========================
// Every kernel again with bf16 and fp16 tensors. Inputs are rounded to the
// dtype first and the fp64 reference sees the same rounded values, so what may
// differ is the one rounding of each output (plus the fp32 arithmetic where a
// kernel computes in fp32). Where the kernel's arithmetic is exactly that of the
// fp32 path (elementwise kernels) or the fp64 path (LayerNorm, sums in double),
// the 16-bit result is also checked bit for bit against that result rounded
// once to nearest even.

constexpr DType kHalfDtypes[] = {DType::BF16, DType::F16};

// Unit roundoff: rounding to nearest errs by at most u |value| ...
double unit_roundoff(DType t) { return t == DType::BF16 ? 0x1p-8 : 0x1p-11; }
// ... or, below the normal range, by half the (fixed) subnormal spacing.
double subnormal_error(DType t) { return t == DType::BF16 ? 0x1p-134 : 0x1p-25; }

// The values a tensor of dtype t holds for `v` (the test inputs).
Vec rounded(const Vec& v, DType t) { return vals(tensor({static_cast<i64>(v.size())}, v, t)); }

// The 16-bit value nearest to each (finite, in-range) v, ties to even, chosen
// among the neighbours of the double -> fp32 -> 16-bit conversion (which may be
// one off after its double rounding). Written independently of the kernels.
Vec round_once(const Vec& v, DType t) {
  const auto decode = [t](std::uint16_t b) {
    return t == DType::BF16 ? static_cast<double>(bf16_to_float(BFloat16{b})) : half_to_float(Half{b});
  };
  Vec out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const float f = static_cast<float>(v[i]);
    std::uint16_t best = t == DType::BF16 ? float_to_bf16(f).bits : float_to_half(f).bits;
    for (int d : {-1, 1}) {
      const auto nb = static_cast<std::uint16_t>(best + d);
      const double e = std::fabs(decode(nb) - v[i]), eb = std::fabs(decode(best) - v[i]);
      if (e < eb || (e == eb && (nb & 1u) == 0)) best = nb;  // NaN neighbours compare false
    }
    out[i] = decode(best);
  }
  return out;
}

// |got - want| <= factor * u * |want| + atol + subnormal_error, element-wise.
// factor 1.01 leaves 1% of a rounding for fp32 arithmetic before it (an fp32
// operation errs by 2^-24 relative: 2^-16 of a bf16 and 2^-13 of an fp16
// rounding); a conversion that truncates errs by up to 2u and fails.
void expect_one_rounding(const Vec& got, const Vec& want, DType t, const std::string& what, const Vec& atol,
                         double factor = 1.01) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double tol = factor * unit_roundoff(t) * std::fabs(want[i]) + atol[i] + subnormal_error(t);
    if (!(std::fabs(got[i] - want[i]) <= tol) && reported++ < 5)
      ADD_FAILURE() << what << " (" << dtype_name(t) << ")[" << i << "]: got " << got[i] << ", want " << want[i]
                    << ", error " << std::fabs(got[i] - want[i]) / (unit_roundoff(t) * std::fabs(want[i]))
                    << " roundings";
  }
}
void expect_one_rounding(const Vec& got, const Vec& want, DType t, const std::string& what, double atol = 0) {
  expect_one_rounding(got, want, t, what, Vec(want.size(), atol));
}

// Bit-for-bit equality (as doubles), reporting the first few differences.
void expect_same(const Vec& got, const Vec& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && reported++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
}

TEST(HalfStorage, DtypeRules) {
  EXPECT_EQ(row_stat_dtype(DType::BF16), DType::F32);
  EXPECT_EQ(row_stat_dtype(DType::F16), DType::F32);
  EXPECT_EQ(row_stat_dtype(DType::F32), DType::F32);
  EXPECT_EQ(row_stat_dtype(DType::F64), DType::F64);
  for (DType t : kHalfDtypes) {
    EXPECT_TRUE(is_grad_accumulator_dtype(t, t));
    EXPECT_TRUE(is_grad_accumulator_dtype(t, DType::F32));
    EXPECT_FALSE(is_grad_accumulator_dtype(t, DType::F64));
  }
  EXPECT_FALSE(is_grad_accumulator_dtype(DType::BF16, DType::F16));
  EXPECT_FALSE(is_grad_accumulator_dtype(DType::F64, DType::F32));
  EXPECT_FALSE(is_grad_accumulator_dtype(DType::F32, DType::BF16));
}

// ----------------------------- LayerNorm -----------------------------

struct LayerNormGrads {
  Vec dx, dgamma, dbeta;
};

// dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma, xhat = (x - mean) rstd;
// dgamma0 + sum_r dy xhat; dbeta0 + sum_r dy. In double, from the given statistics.
LayerNormGrads layernorm_backward_ref(const Vec& dy, const Vec& x, const Vec& gamma, const Vec& mean, const Vec& rstd,
                                      const Vec& dgamma0, const Vec& dbeta0, i64 rows, i64 cols) {
  LayerNormGrads o{Vec(x.size()), dgamma0, dbeta0};
  for (i64 r = 0; r < rows; ++r) {
    double mg = 0, mgx = 0;
    for (i64 c = 0; c < cols; ++c) {
      const std::size_t k = usize(r * cols + c);
      const double xhat = (x[k] - mean[usize(r)]) * rstd[usize(r)], g = dy[k] * gamma[usize(c)];
      mg += g / static_cast<double>(cols), mgx += g * xhat / static_cast<double>(cols);
      o.dgamma[usize(c)] += dy[k] * xhat;
      o.dbeta[usize(c)] += dy[k];
    }
    for (i64 c = 0; c < cols; ++c) {
      const std::size_t k = usize(r * cols + c);
      const double xhat = (x[k] - mean[usize(r)]) * rstd[usize(r)];
      o.dx[k] = rstd[usize(r)] * (dy[k] * gamma[usize(c)] - mg - xhat * mgx);
    }
  }
  return o;
}

TEST(HalfStorage, LayerNormForwardRoundsOnceWithFp32Statistics) {
  for (DType t : kHalfDtypes) {
    SCOPED_TRACE(dtype_name(t));
    auto c = layernorm_case({3, 5, 40}, 50, 30.0);
    c.x = rounded(c.x, t), c.gamma = rounded(c.gamma, t), c.beta = rounded(c.beta, t);
    const auto want = layernorm_ref(c.x, c.gamma, c.beta, c.rows(), c.cols(), c.eps);
    Tensor x = tensor(c.shape, c.x, t), y = empty(c.shape, t);
    Tensor mean = empty({c.rows()}, DType::F32), rstd = empty({c.rows()}, DType::F32);
    layernorm_forward(x, tensor({c.cols()}, c.gamma, t), tensor({c.cols()}, c.beta, t), c.eps, y, mean, rstd);
    expect_one_rounding(vals(y), want.y, t, "y");
    expect_close(vals(mean), want.mean, 0x1p-24, 1e-12, "mean (fp32: one fp32 rounding)");
    expect_close(vals(rstd), want.rstd, 0x1p-24, 0, "rstd (fp32: one fp32 rounding)");
    // The math is the fp64 path's on the same values; y is its result rounded once.
    const auto f64 = layernorm_run(c, DType::F64);
    expect_same(vals(y), round_once(f64.y, t), "y == fp64 y rounded once");
    expect_same(vals(mean), to_f32(f64.mean), "mean == fp64 mean rounded to fp32");
    expect_same(vals(rstd), to_f32(f64.rstd), "rstd == fp64 rstd rounded to fp32");
    layernorm_forward(x, tensor({c.cols()}, c.gamma, t), tensor({c.cols()}, c.beta, t), c.eps, x, mean, rstd);
    expect_same(vals(x), vals(y), "in place");
  }
}

TEST(HalfStorage, LayerNormBackwardRoundsOnceIntoStorageOrFp32Accumulators) {
  for (DType t : kHalfDtypes) {
    SCOPED_TRACE(dtype_name(t));
    auto c = layernorm_case({4, 3, 70}, 52, 3.0);  // 70 columns: two column blocks of the parameter sums
    c.x = rounded(c.x, t), c.gamma = rounded(c.gamma, t), c.beta = rounded(c.beta, t);
    std::mt19937 rng(53);
    const Vec w = rounded(randn(c.x.size(), rng), t), dgamma0 = rounded(randn(usize(c.cols()), rng), t),
              dbeta0 = rounded(randn(usize(c.cols()), rng), t);
    Tensor x = tensor(c.shape, c.x, t), gamma = tensor({c.cols()}, c.gamma, t), y = empty(c.shape, t);
    Tensor mean = empty({c.rows()}, DType::F32), rstd = empty({c.rows()}, DType::F32);
    layernorm_forward(x, gamma, tensor({c.cols()}, c.beta, t), c.eps, y, mean, rstd);
    Tensor dx = tensor(c.shape, Vec(c.x.size(), 1e4), t);  // overwritten
    Tensor dgamma = tensor({c.cols()}, dgamma0, t), dbeta = tensor({c.cols()}, dbeta0, t);
    Tensor dgamma32 = tensor({c.cols()}, dgamma0, DType::F32), dbeta32 = tensor({c.cols()}, dbeta0, DType::F32);
    layernorm_backward(tensor(c.shape, w, t), x, gamma, mean, rstd, dx, dgamma, dbeta);
    Tensor dx2 = empty(c.shape, t);
    layernorm_backward(tensor(c.shape, w, t), x, gamma, mean, rstd, dx2, dgamma32, dbeta32);  // fp32 main grads
    // Reference: the same values and the fp32 statistics the forward saved.
    const auto want =
        layernorm_backward_ref(w, c.x, c.gamma, vals(mean), vals(rstd), dgamma0, dbeta0, c.rows(), c.cols());
    expect_one_rounding(vals(dx), want.dx, t, "dx");
    expect_one_rounding(vals(dgamma), want.dgamma, t, "dgamma (16-bit)");
    expect_one_rounding(vals(dbeta), want.dbeta, t, "dbeta (16-bit)");
    expect_close(vals(dgamma32), want.dgamma, 0x1p-23, 1e-12, "dgamma (fp32)");
    expect_close(vals(dbeta32), want.dbeta, 0x1p-23, 1e-12, "dbeta (fp32)");
    expect_same(vals(dx2), vals(dx), "dx does not depend on the accumulator dtype");
    // Bit for bit: the fp64 path on the same values and statistics, rounded once.
    Tensor dx64 = empty(c.shape), dg64 = tensor({c.cols()}, dgamma0), db64 = tensor({c.cols()}, dbeta0);
    layernorm_backward(tensor(c.shape, w), tensor(c.shape, c.x), tensor({c.cols()}, c.gamma),
                       tensor({c.rows()}, vals(mean)), tensor({c.rows()}, vals(rstd)), dx64, dg64, db64);
    expect_same(vals(dx), round_once(vals(dx64), t), "dx == fp64 dx rounded once");
    expect_same(vals(dgamma), round_once(vals(dg64), t), "dgamma == fp64 dgamma rounded once");
    expect_same(vals(dbeta), round_once(vals(db64), t), "dbeta == fp64 dbeta rounded once");
    // dx may alias dy.
    Tensor d = tensor(c.shape, w, t), dg = tensor({c.cols()}, dgamma0, t), db = tensor({c.cols()}, dbeta0, t);
    layernorm_backward(d, x, gamma, mean, rstd, d, dg, db);
    expect_same(vals(d), vals(dx), "dx aliasing dy");
    expect_same(vals(dg), vals(dgamma), "dgamma with dx aliasing dy");
  }
}

// fp32 main grads: two micro-batches of 16-bit activations accumulate into fp32
// dgamma/dbeta exactly as the fp32 kernels accumulate the same values.
TEST(HalfStorage, Fp32ParameterGradientsFromHalfInputsMatchTheFp32Path) {
  for (DType t : kHalfDtypes) {
    SCOPED_TRACE(dtype_name(t));
    auto c = layernorm_case({6, 50}, 54, 10.0);
    c.x = rounded(c.x, t), c.gamma = rounded(c.gamma, t), c.beta = rounded(c.beta, t);
    std::mt19937 rng(55);
    const Vec w1 = rounded(randn(c.x.size(), rng), t), w2 = rounded(randn(c.x.size(), rng), t);
    const Vec zero(usize(c.cols()), 0.0);
    auto run = [&](DType storage) {  // returns dgamma, dbeta after two micro-batches
      Tensor x = tensor(c.shape, c.x, storage), gamma = tensor({c.cols()}, c.gamma, storage);
      Tensor y = empty(c.shape, storage), dx = empty(c.shape, storage);
      Tensor mean = empty({c.rows()}, DType::F32), rstd = empty({c.rows()}, DType::F32);
      Tensor dgamma = tensor({c.cols()}, zero, DType::F32), dbeta = tensor({c.cols()}, zero, DType::F32);
      layernorm_forward(x, gamma, tensor({c.cols()}, c.beta, storage), c.eps, y, mean, rstd);
      for (const Vec* w : {&w1, &w2})
        layernorm_backward(tensor(c.shape, *w, storage), x, gamma, mean, rstd, dx, dgamma, dbeta);
      return std::pair{vals(dgamma), vals(dbeta)};
    };
    const auto half = run(t), f32 = run(DType::F32);
    // fp32 tolerance: each is the double sum rounded to fp32 (in fact the same bits).
    expect_close(half.first, f32.first, 0x1p-22, 1e-12, "dgamma");
    expect_close(half.second, f32.second, 0x1p-22, 1e-12, "dbeta");
  }
}

// -------------------------------- GeLU --------------------------------

// d/dx of gelu_ref.
double gelu_grad_ref(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi), th = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * k * (1.0 + 3 * 0.044715 * x * x);
}

TEST(HalfStorage, Gelu) {
  for (DType t : kHalfDtypes) {
    SCOPED_TRACE(dtype_name(t));
    std::mt19937 rng(56);
    Vec x = randn(600, rng, 3.0);
    x.insert(x.end(), {0.0, -0.0, 12.0, -12.0, 1e-3});
    x = rounded(x, t);
    const Vec dy = rounded(randn(x.size(), rng), t);
    const Shape shape{static_cast<i64>(x.size())};
    Vec want(x.size()), dwant(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) want[i] = gelu_ref(x[i]), dwant[i] = dy[i] * gelu_grad_ref(x[i]);
    // atol: the fp32 evaluation itself (tanh near -1 cancels in 1 + tanh), as in the fp32 test.
    const Vec y = gelu_run(x, t);
    expect_one_rounding(y, want, t, "gelu", 2e-6);
    expect_same(y, rounded(gelu_run(x, DType::F32), t), "gelu == fp32 gelu rounded once");
    Tensor inplace = tensor(shape, x, t);
    gelu_forward(inplace, inplace);
    expect_same(vals(inplace), y, "gelu in place");
    Tensor dx = empty(shape, t), dx32 = empty(shape, DType::F32);
    gelu_backward(tensor(shape, dy, t), tensor(shape, x, t), dx);
    expect_one_rounding(vals(dx), dwant, t, "gelu_backward", 4e-6);
    gelu_backward(tensor(shape, dy, DType::F32), tensor(shape, x, DType::F32), dx32);
    expect_same(vals(dx), rounded(vals(dx32), t), "gelu_backward == fp32 rounded once");
    Tensor d = tensor(shape, dy, t);
    gelu_backward(d, tensor(shape, x, t), d);
    expect_same(vals(d), vals(dx), "gelu_backward aliased");
  }
}

// Tensors large enough for every path of the chunked GeLU: several 4096-element
// runs and a partial one (flat kernels), rows of 300 (a second 256-element
// chunk), above the threading threshold; 1 and 4 threads give the same bits,
// and the fused kernels are the unfused sequence bit for bit in fp32.
TEST(HalfStorage, GeluLargeTensorsTakeEveryChunkAndThreadPath) {
  const i64 n = 9 * 4096 + 37;
  std::mt19937 rng(71);
  const Vec x32 = to_f32(randn(usize(n), rng, 3.0)), dy32 = to_f32(randn(usize(n), rng));
  const int before = cpu_math_threads();
  for (DType t : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(t));
    const Vec x = t == DType::F32 ? x32 : rounded(x32, t), dy = t == DType::F32 ? dy32 : rounded(dy32, t);
    Vec want(x.size()), dwant(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) want[i] = gelu_ref(x[i]), dwant[i] = dy[i] * gelu_grad_ref(x[i]);
    std::vector<Vec> runs;
    for (int threads : {1, 4}) {
      set_cpu_math_threads(threads);
      Tensor y = empty({n}, t), dx = empty({n}, t);
      gelu_forward(tensor({n}, x, t), y);
      gelu_backward(tensor({n}, dy, t), tensor({n}, x, t), dx);
      Vec both = vals(y);
      const Vec dv = vals(dx);
      both.insert(both.end(), dv.begin(), dv.end());
      runs.push_back(both);
    }
    set_cpu_math_threads(before);
    expect_same(runs[1], runs[0], "4 threads vs 1");
    const Vec y(runs[0].begin(), runs[0].begin() + n), dx(runs[0].begin() + n, runs[0].end());
    if (t == DType::F32) {
      expect_close(y, want, 1e-6, 1e-6, "gelu");
      expect_close(dx, dwant, 1e-5, 1e-5, "gelu_backward");
    } else {
      expect_one_rounding(y, want, t, "gelu", 2e-6);
      expect_one_rounding(dx, dwant, t, "gelu_backward", 4e-6);
    }
  }
  // Fused vs unfused, fp32, rows of 300 columns.
  const i64 rows = 130, cols = 300;
  const Shape shape{rows, cols};
  const Vec yv = to_f32(randn(usize(rows * cols), rng, 2.0)), bv = to_f32(randn(usize(cols), rng));
  const Vec w = to_f32(randn(usize(rows * cols), rng));
  Tensor fused = empty(shape, DType::F32), pre = tensor(shape, yv, DType::F32), unfused = empty(shape, DType::F32);
  bias_gelu_forward(tensor(shape, yv, DType::F32), tensor({cols}, bv, DType::F32), fused);
  add_bias(pre, tensor({cols}, bv, DType::F32));
  gelu_forward(pre, unfused);
  expect_same(vals(fused), vals(unfused), "fused forward");
  Tensor dxf = empty(shape, DType::F32), dbf = tensor({cols}, Vec(usize(cols), 0.0), DType::F32);
  bias_gelu_backward(tensor(shape, w, DType::F32), tensor(shape, yv, DType::F32), tensor({cols}, bv, DType::F32), dxf,
                     dbf);
  Tensor dxu = empty(shape, DType::F32);
  gelu_backward(tensor(shape, w, DType::F32), pre, dxu);
  expect_same(vals(dxf), vals(dxu), "fused backward dx");
}

// ------------------------- bias and element-wise -------------------------

TEST(HalfStorage, BiasAndElementwise) {
  for (DType t : kHalfDtypes) {
    SCOPED_TRACE(dtype_name(t));
    std::mt19937 rng(57);
    const Shape shape{3, 4, 70};  // 70 columns: two column blocks in bias_grad
    const std::size_t n = 840, cols = 70;
    const Vec a = rounded(randn(n, rng), t), b = rounded(randn(n, rng), t), bias = rounded(randn(cols, rng), t);
    const Vec dbias0 = rounded(randn(cols, rng), t);
    Vec want(n);
    for (std::size_t i = 0; i < n; ++i) want[i] = a[i] + bias[i % cols];
    Tensor y = tensor(shape, a, t), y32 = tensor(shape, a, DType::F32);
    add_bias(y, tensor({70}, bias, t));
    add_bias(y32, tensor({70}, bias, DType::F32));
    expect_one_rounding(vals(y), want, t, "add_bias");
    expect_same(vals(y), rounded(vals(y32), t), "add_bias == fp32 rounded once");

    // bias_grad: the column sums in double, added to the accumulator, rounded once.
    Vec sums(cols, 0.0);
    for (std::size_t i = 0; i < n; ++i) sums[i % cols] += b[i];
    Vec dwant(cols);
    for (std::size_t c = 0; c < cols; ++c) dwant[c] = dbias0[c] + sums[c];
    Tensor dbias = tensor({70}, dbias0, t), dbias32 = tensor({70}, dbias0, DType::F32);
    bias_grad(tensor(shape, b, t), dbias);
    bias_grad(tensor(shape, b, t), dbias32);
    expect_one_rounding(vals(dbias), dwant, t, "bias_grad");
    expect_same(vals(dbias), round_once(dwant, t), "bias_grad rounded once");
    expect_same(vals(dbias32), to_f32(dwant), "bias_grad into fp32");

    Vec sum(n), ax(n), sc(n);
    for (std::size_t i = 0; i < n; ++i) sum[i] = a[i] + b[i], ax[i] = b[i] + 0.75 * a[i], sc[i] = a[i] * -1.5;
    Tensor ta = tensor(shape, a, t), tb = tensor(shape, b, t), out = empty(shape, t);
    Tensor ta32 = tensor(shape, a, DType::F32), tb32 = tensor(shape, b, DType::F32), out32 = empty(shape, DType::F32);
    add(ta, tb, out);
    add(ta32, tb32, out32);
    expect_one_rounding(vals(out), sum, t, "add");
    expect_same(vals(out), rounded(vals(out32), t), "add == fp32 rounded once");
    add(ta, tb, ta);  // out aliasing a
    expect_same(vals(ta), vals(out), "add aliased");
    ta = tensor(shape, a, t);
    axpy(0.75, ta, tb);
    axpy(0.75, ta32, tb32);
    expect_one_rounding(vals(tb), ax, t, "axpy");
    expect_same(vals(tb), rounded(vals(tb32), t), "axpy == fp32 rounded once");
    scale(ta, -1.5);
    expect_one_rounding(vals(ta), sc, t, "scale");
    expect_same(vals(ta), rounded(sc, t), "scale");
  }
}

// ---------------------------- causal softmax ----------------------------

TEST(HalfStorage, CausalSoftmax) {
  for (DType t : kHalfDtypes) {
    SCOPED_TRACE(dtype_name(t));
    std::mt19937 rng(58);
    const Shape shape{2, 3, 9, 9};
    const i64 n = 9, mats = 6;
    const double sc = 0.3;
    const Vec s = rounded(randn(usize(numel(shape)), rng, 4.0), t);
    const Vec want = causal_softmax_ref(s, mats, n, sc);
    // Each probability is fp32 exp (libmvec's: <= 4 ulp; its argument rounded
    // once in fp32) over a double sum: well within the 1% slack of one rounding.
    const Vec p = softmax_run(shape, s, sc, t);
    expect_one_rounding(p, want, t, "probs");
    for (i64 row = 0; row < mats * n; ++row) {
      double sum = 0;
      for (i64 j = 0; j < n; ++j) {
        const double v = p[usize(row * n + j)];
        if (j > row % n)
          ASSERT_EQ(v, 0.0) << "row " << row << " col " << j;
        else
          sum += v;
      }
      EXPECT_NEAR(sum, 1.0, static_cast<double>(row % n + 1) * unit_roundoff(t)) << "row " << row;
    }
    Tensor inplace = tensor(shape, s, t);
    causal_softmax_forward(inplace, sc, inplace);
    expect_same(vals(inplace), p, "in place");

    // Backward from the 16-bit probabilities: dot and difference in double, rounded once.
    Vec w = rounded(randn(p.size(), rng), t);
    Vec dwant(p.size(), 0.0);
    for (i64 row = 0; row < mats * n; ++row) {
      const std::size_t base = usize(row * n);
      double dot = 0;
      for (i64 j = 0; j <= row % n; ++j) dot += w[base + usize(j)] * p[base + usize(j)];
      for (i64 j = 0; j <= row % n; ++j) dwant[base + usize(j)] = sc * p[base + usize(j)] * (w[base + usize(j)] - dot);
    }
    const Tensor probs = tensor(shape, p, t);
    Tensor ds = tensor(shape, Vec(p.size(), 1e4), t);
    causal_softmax_backward(tensor(shape, w, t), probs, sc, ds);
    const Vec grad = vals(ds);
    expect_one_rounding(grad, dwant, t, "dscores");
    expect_same(grad, round_once(dwant, t), "dscores == the double result rounded once");
    for (std::size_t k = 0; k < w.size(); ++k)
      if (k % usize(n) > (k / usize(n)) % usize(n)) w[k] = std::numeric_limits<double>::quiet_NaN();
    Tensor d = tensor(shape, w, t);
    causal_softmax_backward(d, probs, sc, d);  // aliased, NaN above the diagonal
    expect_same(vals(d), grad, "dscores aliased, masked NaN");
  }
}

TEST(HalfStorage, CausalSoftmaxHugeScoresStayFinite) {
  const Shape shape{1, 4, 4};
  const Vec want = {1, 0, 0, 0, 0, 1, 0, 0, 0.5, 0.5, 0, 0, 0.25, 0.25, 0.25, 0.25};
  // bf16 has fp32's range; fp16 tops out at 65504.
  const Vec bf16_scores = {1e30, 0, 0, 0, -1e30, 3e4, 0, 0, 5e4, 5e4, -5e4, 0, 1e4, 1e4, 1e4, 1e4};
  const Vec fp16_scores = {6e4, 0, 0, 0, -6e4, 3e4, 0, 0, 5e4, 5e4, -5e4, 0, 1e4, 1e4, 1e4, 1e4};
  expect_same(softmax_run(shape, rounded(bf16_scores, DType::BF16), 1.0, DType::BF16), want, "bf16");
  expect_same(softmax_run(shape, rounded(fp16_scores, DType::F16), 1.0, DType::F16), want, "fp16");
}

// ------------------------------- dropout -------------------------------

TEST(HalfStorage, DropoutMaskEqualsTheFp32Mask) {
  const DropoutLayout l{3, 2, 5, 7, 2, 1, 4};
  const RngKey key{(3ull << 40) | 2024, (5ull << 32) | 17, 3, kRngAttentionDropout};
  const double p = 0.3;
  const Shape shape{l.A, l.B, l.C, l.D};
  for (DType t : kHalfDtypes) {
    SCOPED_TRACE(dtype_name(t));
    std::mt19937 rng(59);
    const Vec x = rounded(randn(210, rng), t), dy = rounded(randn(210, rng), t);  // no exact zeros
    const Vec y = dropout_run(x, p, key, l, t), y32 = dropout_run(x, p, key, l, DType::F32);
    std::vector<bool> mask, mask32;
    for (std::size_t i = 0; i < y.size(); ++i) mask.push_back(y[i] != 0), mask32.push_back(y32[i] != 0);
    EXPECT_EQ(mask, mask32) << "the keep mask of " << dtype_name(t) << " differs from fp32's";
    Vec want(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) want[i] = mask32[i] ? x[i] / (1 - p) : 0.0;
    expect_one_rounding(y, want, t, "dropout");
    expect_same(y, rounded(y32, t), "dropout == fp32 rounded once");
    Tensor d = tensor(shape, dy, t), d32 = tensor(shape, dy, DType::F32);
    dropout_backward(d, p, key, l, d);  // aliased
    dropout_backward(d32, p, key, l, d32);
    expect_same(vals(d), rounded(vals(d32), t), "dropout_backward == fp32 rounded once");
    for (std::size_t i = 0; i < dy.size(); ++i) ASSERT_EQ(vals(d)[i] != 0, mask32[i]) << "backward mask " << i;
    EXPECT_EQ(dropout_run(x, 0.0, key, l, t), x) << "p = 0 copies";
  }
  // The parallel path (hidden states, B = 1), a million elements.
  const DropoutLayout big{2, 1, 1000, 500, 0, 0, 1};
  const RngKey k2{7, 3, 1, kRngMlpOutputDropout};
  const Vec ones(usize(big.A * big.C * big.D), 1.0);
  const Vec y32 = dropout_run(ones, 0.1, k2, big, DType::F32);
  for (DType t : kHalfDtypes) {
    const Vec y = dropout_run(ones, 0.1, k2, big, t);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < y.size(); ++i) differ += (y[i] == 0) != (y32[i] == 0);
    EXPECT_EQ(differ, 0u) << dtype_name(t);
  }
}

// ------------------------------ embeddings ------------------------------

TEST(HalfStorage, Embeddings) {
  const i64 v = 4, h = 70, start = 3;                     // h > 64: more than one column block
  const std::vector<i64> ids = {3, 6, 6, 2, 7, 3, 5, 6};  // id 4 (local row 1) is never used
  const i64 n = static_cast<i64>(ids.size());
  for (DType t : kHalfDtypes) {
    SCOPED_TRACE(dtype_name(t));
    std::mt19937 rng(60);
    const Vec table = rounded(randn(usize(v * h), rng), t), dout = rounded(randn(usize(n * h), rng), t),
              dtable0 = rounded(randn(usize(v * h), rng), t);
    Tensor out = tensor({n, h}, Vec(usize(n * h), 7.0), t);
    embedding_forward(ids_tensor(ids), tensor({v, h}, table, t), start, out);
    Vec want(usize(n * h), 0.0);
    for (i64 i = 0; i < n; ++i)
      if (ids[usize(i)] >= start && ids[usize(i)] < start + v)
        for (i64 c = 0; c < h; ++c) want[usize(i * h + c)] = table[usize((ids[usize(i)] - start) * h + c)];
    expect_same(vals(out), want, "embedding_forward copies rows exactly");

    // dtable += dout rows: summed in fp32 (<= 3 additions, each erring by
    // 2^-24 of the partial sums: atol 2^-22 sum|terms|), rounded once.
    Vec dwant = dtable0, abs_sum(dtable0.size());
    for (std::size_t k = 0; k < abs_sum.size(); ++k) abs_sum[k] = std::fabs(dtable0[k]);
    for (i64 i = 0; i < n; ++i)
      if (ids[usize(i)] >= start && ids[usize(i)] < start + v)
        for (i64 c = 0; c < h; ++c) {
          const std::size_t k = usize((ids[usize(i)] - start) * h + c);
          dwant[k] += dout[usize(i * h + c)], abs_sum[k] += std::fabs(dout[usize(i * h + c)]);
        }
    Vec atol(abs_sum.size());
    for (std::size_t k = 0; k < atol.size(); ++k) atol[k] = 0x1p-22 * abs_sum[k];
    Tensor dtable = tensor({v, h}, dtable0, t), dtable32 = tensor({v, h}, dtable0, DType::F32);
    embedding_backward(ids_tensor(ids), tensor({n, h}, dout, t), start, dtable);
    embedding_backward(ids_tensor(ids), tensor({n, h}, dout, t), start, dtable32);
    expect_one_rounding(vals(dtable), dwant, t, "dtable (16-bit)", atol);
    expect_close(vals(dtable32), dwant, 0x1p-22, 0x1p-22 * 16, "dtable (fp32)");
    // The 16-bit accumulator is the fp32 accumulation rounded once (not once per token).
    expect_same(vals(dtable), rounded(vals(dtable32), t), "dtable == fp32 accumulation rounded once");
    for (i64 c = 0; c < h; ++c) EXPECT_EQ(vals(dtable)[usize(h + c)], dtable0[usize(h + c)]) << "unused row";

    // Position embeddings.
    const i64 b = 3, s = 4, positions = 6;
    const Vec out0 = rounded(randn(usize(b * s * h), rng), t), pos = rounded(randn(usize(positions * h), rng), t);
    const Vec pdout = rounded(randn(out0.size(), rng), t), dpos0 = rounded(randn(pos.size(), rng), t);
    Tensor po = tensor({b * s, h}, out0, t), po32 = tensor({b * s, h}, out0, DType::F32);
    add_position_embedding(po, tensor({positions, h}, pos, t), s);
    add_position_embedding(po32, tensor({positions, h}, pos, DType::F32), s);
    Vec pwant = out0;
    for (i64 r = 0; r < b * s; ++r)
      for (i64 c = 0; c < h; ++c) pwant[usize(r * h + c)] += pos[usize((r % s) * h + c)];
    expect_one_rounding(vals(po), pwant, t, "add_position_embedding");
    expect_same(vals(po), rounded(vals(po32), t), "add_position_embedding == fp32 rounded once");
    Vec dpwant(dpos0.size(), 0.0);  // the kernel's sums: over samples in order, in double, then + dpos0
    for (i64 r = 0; r < b * s; ++r)
      for (i64 c = 0; c < h; ++c) dpwant[usize((r % s) * h + c)] += pdout[usize(r * h + c)];
    for (std::size_t k = 0; k < dpwant.size(); ++k) dpwant[k] = k < usize(s * h) ? dpos0[k] + dpwant[k] : dpos0[k];
    Tensor dpos = tensor({positions, h}, dpos0, t), dpos32 = tensor({positions, h}, dpos0, DType::F32);
    position_embedding_backward(tensor({b * s, h}, pdout, t), s, dpos);
    position_embedding_backward(tensor({b * s, h}, pdout, t), s, dpos32);
    expect_one_rounding(vals(dpos), dpwant, t, "dpos (16-bit)");
    expect_same(vals(dpos), round_once(dpwant, t), "dpos rounded once");
    expect_same(vals(dpos32), to_f32(dpwant), "dpos (fp32)");
  }
}

// ---------------------- vocab-parallel cross-entropy ----------------------

TEST(HalfStorage, CrossEntropyPiecesWithFp32Statistics) {
  for (DType t : kHalfDtypes) {
    SCOPED_TRACE(dtype_name(t));
    CeProblem p = ce_problem(61);
    p.logits = rounded(p.logits, t);
    const double loss = ce_loss_ref(p, p.logits);
    const Vec grad = ce_grad_ref(p);
    for (auto [ranks, per] : {std::pair<i64, i64>{1, 11}, {2, 6}, {3, 6}}) {
      SCOPED_TRACE(testing::Message() << ranks << " slices of " << per);
      const CeResult r = ce_split(p, slices_of(p.vocab, per, ranks), t);
      // Max and target logit are exact, sum_exp and the combination fp32.
      EXPECT_NEAR(r.loss, loss, 1e-6 * std::fabs(loss));
      // The exponentials are kept in the logits tensor, so in 16 bits
      // (relative error <= 2^-9 bf16 / 2^-12 fp16, Megatron's in-place
      // softmax); dlogits is rounded once more: two 16-bit roundings.
      const double eps = t == DType::BF16 ? 0x1p-8 : 0x1p-11;
      expect_close(r.grad, grad, eps, eps / static_cast<double>(p.n), "dlogits");
    }
    // The pieces one by one, against double on the same values.
    const Tensor targets = ids_tensor(p.targets);
    Tensor logits = tensor({p.n, p.vocab}, p.logits, t);
    const i64 valid = p.vocab - 2;  // the last two columns act as padding
    Tensor mx = empty({p.n}, DType::F32), se = empty({p.n}, DType::F32), tl = empty({p.n}, DType::F32);
    cross_entropy_forward(logits, targets, 0, valid, mx, se, tl);
    Vec want_mx(usize(p.n), -1e300), want_se(usize(p.n), 0.0), want_tl(usize(p.n), 0.0), want_e(p.logits.size(), 0.0);
    for (i64 r = 0; r < p.n; ++r) {
      for (i64 c = 0; c < valid; ++c) want_mx[usize(r)] = std::max(want_mx[usize(r)], p.logits[usize(r * p.vocab + c)]);
      for (i64 c = 0; c < valid; ++c) {
        // fp32 exp of an exact difference, rounded once to 16 bits for storage.
        const float e = std::exp(static_cast<float>(p.logits[usize(r * p.vocab + c)] - want_mx[usize(r)]));
        want_e[usize(r * p.vocab + c)] = static_cast<double>(e);
        want_se[usize(r)] += e;
      }
      if (p.targets[usize(r)] < valid) want_tl[usize(r)] = p.logits[usize(r * p.vocab + p.targets[usize(r)])];
    }
    expect_same(vals(mx), want_mx, "row max is exact");
    expect_same(vals(tl), want_tl, "target logit is exact");
    expect_close(vals(se), want_se, 1e-7, 0, "sum_exp (fp32 exp per term, double sum)");
    expect_same(vals(logits), round_once(want_e, t), "exponentials rounded once; padding 0");
    Tensor d = empty({p.n, p.vocab}, t), inplace = tensor({p.n, p.vocab}, vals(logits), t);
    cross_entropy_backward(logits, mx, mx, se, targets, 0, valid, 0.5, d);
    cross_entropy_backward(inplace, mx, mx, se, targets, 0, valid, 0.5, inplace);
    expect_same(vals(inplace), vals(d), "cross_entropy_backward in place");
    for (i64 r = 0; r < p.n; ++r)
      for (i64 c = valid; c < p.vocab; ++c) EXPECT_EQ(vals(d)[usize(r * p.vocab + c)], 0.0) << "padding";
  }
}

// Rows long enough for the vector exponentials' body and remainder (16 lanes
// with AVX-512; the tests above use rows of at most 11): the vocab-parallel
// cross-entropy on 1037-column slices (1030 valid) and the causal softmax on
// 40-column rows, in fp32 and 16 bits (whose rows go through a per-thread fp32
// copy). Each exponential is libmvec's, within 4 fp32 ulp of exp of the fp32
// argument: for 16-bit storage, well within the 1% slack of one rounding.
TEST(HalfStorage, LongRowsTakeTheVectorExponentialsWithinTheirBound) {
  const i64 n = 3, vocab = 1037, valid = 1030;
  std::mt19937 rng(77);
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(t));
    const Vec x = rounded(to_f32(randn(usize(n * vocab), rng, 4.0)), t);
    const std::vector<i64> targets = {5, 1029, 1033};  // the last is another rank's (>= valid)
    Tensor logits = tensor({n, vocab}, x, t);
    Tensor mx = empty({n}, DType::F32), se = empty({n}, DType::F32), tl = empty({n}, DType::F32);
    cross_entropy_forward(logits, ids_tensor(targets), 0, valid, mx, se, tl);
    const Vec e = vals(logits), m = vals(mx), sum = vals(se), target = vals(tl);
    Vec want_e(e.size(), 0.0), unrounded(e.size(), 0.0);
    for (i64 r = 0; r < n; ++r) {
      double want_m = -1e300, want_sum = 0;
      for (i64 c = 0; c < valid; ++c) want_m = std::max(want_m, x[usize(r * vocab + c)]);
      EXPECT_EQ(m[usize(r)], want_m) << "row max is exact";
      for (i64 c = 0; c < valid; ++c) {
        // The fp32 argument the kernel exponentiates, then exp in double.
        const float arg = static_cast<float>(x[usize(r * vocab + c)]) - static_cast<float>(want_m);
        const double w = std::exp(static_cast<double>(arg));
        unrounded[usize(r * vocab + c)] = w;
        want_sum += w;
      }
      EXPECT_NEAR(sum[usize(r)], want_sum, 1e-6 * want_sum) << "sum_exp, row " << r;
      EXPECT_EQ(target[usize(r)], targets[usize(r)] < valid ? x[usize(r * vocab + targets[usize(r)])] : 0.0);
    }
    // The backward over the same rows (the cloned, vectorised store): each
    // gradient is the double product rounded once, bit for bit.
    Tensor d = empty({n, vocab}, t);
    cross_entropy_backward(logits, mx, mx, se, ids_tensor(targets), 0, valid, 0.5, d);
    Vec want_d(e.size(), 0.0);
    for (i64 r = 0; r < n; ++r) {
      const double f = 0.5 * (std::exp(0.0) / sum[usize(r)]);  // scale * softmax_factor, as the kernel has it
      for (i64 c = 0; c < valid; ++c) {
        const double g = e[usize(r * vocab + c)] * f;
        want_d[usize(r * vocab + c)] = c == targets[usize(r)] ? e[usize(r * vocab + c)] * f - 0.5 : g;
      }
    }
    expect_same(vals(d), t == DType::F32 ? to_f32(want_d) : round_once(want_d, t), "dlogits rounded once");
    if (t == DType::F32) {
      for (std::size_t i = 0; i < e.size(); ++i) {
        if (static_cast<i64>(i) % vocab >= valid) {
          ASSERT_EQ(e[i], 0.0) << "padding " << i;
          continue;
        }
        const double tol = 4 * 0x1p-23 * unrounded[i] + 0x1p-149;  // 4 ulp: an ulp is at most 2^-23 relative
        ASSERT_NEAR(e[i], unrounded[i], tol) << "exponential " << i;
      }
    } else {
      expect_one_rounding(e, unrounded, t, "exponentials");  // padding: both 0
    }

    const i64 sn = 40;
    const Shape shape{1, 2, sn, sn};
    const Vec scores = rounded(to_f32(randn(usize(numel(shape)), rng, 4.0)), t);
    const Vec want = causal_softmax_ref(scores, 2, sn, 0.3);
    const Vec p = softmax_run(shape, scores, 0.3, t);
    if (t == DType::F32)
      expect_close(p, want, 2e-6, 1e-8, "causal softmax");
    else
      expect_one_rounding(p, want, t, "causal softmax");
  }
}

// The cross-entropy backward's 16-bit store in its vector loop, next to
// 16-bit midpoints (times powers of two of both signs). Just above the
// midpoint between 1 and the next value (1 + half an ulp + 2^-30) must round
// up; just below the midpoint between that value and the one after
// (1 + 3 half ulps - 2^-30) must round down. Rounded to fp32 first, both would
// land on the midpoint and round to even: the wrong way in both cases. The
// kernel rounds to odd in fp32 first.
TEST(HalfStorage, CrossEntropyBackwardRoundsLongRowsOnceNextToMidpoints) {
  for (auto [t, half_ulp] : {std::pair{DType::BF16, 0x1p-8}, std::pair{DType::F16, 0x1p-11}}) {
    SCOPED_TRACE(dtype_name(t));
    const i64 vocab = 1037;
    Vec e(usize(vocab));
    for (i64 c = 0; c < vocab; ++c) e[usize(c)] = std::ldexp(c % 2 ? 1.0 : -1.0, -static_cast<int>(c % 13));
    Tensor zero_max = tensor({1}, {0.0}, DType::F32), one_sum = tensor({1}, {1.0}, DType::F32);
    // {the product's factor (exp(0) / 1 * scale), what it rounds to}
    for (auto [scale, rounded] : {std::pair{1.0 + half_ulp + 0x1p-30, 1.0 + 2 * half_ulp},
                                  std::pair{1.0 + 3 * half_ulp - 0x1p-30, 1.0 + 2 * half_ulp}}) {
      Tensor d = empty({1, vocab}, t);
      cross_entropy_backward(tensor({1, vocab}, e, t), zero_max, zero_max, one_sum, ids_tensor({vocab}), 0, vocab,
                             scale, d);
      Vec want(e.size());
      for (std::size_t c = 0; c < e.size(); ++c) want[c] = e[c] * rounded;
      expect_same(vals(d), want, scale < 1.0 + 2 * half_ulp ? "just above a midpoint" : "just below a midpoint");
    }
  }
}

// ------------------- rounding, validation, determinism -------------------

// A result computed in double is rounded to 16 bits once: rounding it to fp32
// first would turn a value just above a 16-bit midpoint into the midpoint itself,
// which then rounds to even, i.e. down.
TEST(HalfStorage, DoubleResultsAreNotRoundedThroughFp32) {
  // dbias = 1 + (2^-8 + 2^-30) for bf16 (spacing 2^-7 at 1), 1 + (2^-11 + 2^-24) for fp16 (2^-10).
  for (auto [t, half_ulp, tiny] :
       {std::tuple{DType::BF16, 0x1p-8, 0x1p-30}, std::tuple{DType::F16, 0x1p-11, 0x1p-24}}) {
    SCOPED_TRACE(dtype_name(t));
    Tensor dbias = tensor({1}, {1.0}, t);
    bias_grad(tensor({2, 1}, {half_ulp, tiny}, t), dbias);
    EXPECT_EQ(vals(dbias)[0], 1.0 + 2 * half_ulp) << "rounded up, as 1 + half_ulp + tiny is above the midpoint";
    EXPECT_EQ(round_once({1.0 + half_ulp + tiny}, t)[0], 1.0 + 2 * half_ulp);
    EXPECT_EQ(rounded({1.0 + half_ulp + tiny}, t)[0], 1.0) << "double -> fp32 -> 16-bit rounds twice";
  }
}

TEST(HalfStorage, StatisticsMustBeFp32AndAccumulatorsStorageOrFp32) {
  for (DType t : kHalfDtypes) {
    SCOPED_TRACE(dtype_name(t));
    const DType other = t == DType::BF16 ? DType::F16 : DType::BF16;
    const auto zeros = [](const Shape& shape, DType dt) { return Tensor::zeros(cpu(), shape, dt, MC::Other); };
    Tensor x = zeros({4, 8}, t), y = zeros({4, 8}, t), g = zeros({8}, t), m = zeros({4}, DType::F32);
    Tensor m16 = zeros({4}, t), m64 = zeros({4}, DType::F64), g64 = zeros({8}, DType::F64), g_other = zeros({8}, other);
    Tensor y_other = zeros({4, 8}, other);
    layernorm_forward(x, g, g, 1e-5, y, m, m);  // fp32 statistics: accepted
    expect_rejected([&] { layernorm_forward(x, g, g, 1e-5, y, m16, m); },
                    "layernorm_forward: mean must be fp32 (per-row statistics of 16-bit activations are kept in fp32)");
    expect_rejected([&] { layernorm_forward(x, g, g, 1e-5, y, m, m64); }, "layernorm_forward: rstd must be fp32");
    expect_rejected([&] { layernorm_forward(x, empty({8}, other), g, 1e-5, y, m, m); },
                    std::string("layernorm_forward: gamma must be ") + std::string(dtype_name(t)));
    Tensor dg = zeros({8}, t), dg32 = zeros({8}, DType::F32);
    layernorm_backward(x, x, g, m, m, y, dg, dg32);  // storage-dtype and fp32 accumulators, mixed
    expect_rejected([&] { layernorm_backward(x, x, g, m, m16, y, dg, dg); }, "layernorm_backward: rstd must be fp32");
    expect_rejected([&] { layernorm_backward(x, x, g, m, m, y, g64, dg); },
                    std::string("layernorm_backward: dgamma must be ") + std::string(dtype_name(t)) + " or fp32");
    expect_rejected([&] { layernorm_backward(x, x, g, m, m, y, dg, g_other); }, "layernorm_backward: dbeta must be");
    expect_rejected([&] { bias_grad(x, g_other); }, "bias_grad: dbias must be");
    expect_rejected(
        [&] {
          add(x, empty({4, 8}, other), y);
        },
        std::string("add: b must be ") + std::string(dtype_name(t)));
    expect_rejected([&] { gelu_backward(empty({4, 8}, DType::F32), x, y); }, "gelu_backward: dy must be");
    Tensor ids = ids_tensor({0, 1, 2, 3});
    expect_rejected([&] { embedding_backward(ids, x, 0, m64); }, "embedding_backward: dtable must be");
    Tensor dpos16 = empty({2, 8}, other);
    expect_rejected([&] { position_embedding_backward(x, 2, dpos16); },
                    "position_embedding_backward: position gradient must be");
    expect_rejected([&] { cross_entropy_forward(x, ids, 0, 8, m16, m, m); },
                    "cross_entropy_forward: row_max must be fp32");
    expect_rejected([&] { cross_entropy_forward(x, ids, 0, 8, m, m16, m); },
                    "cross_entropy_forward: sum_exp must be fp32");
    expect_rejected([&] { cross_entropy_forward(x, ids, 0, 8, m, m, m16); },
                    "cross_entropy_forward: target_logit must be fp32");
    expect_rejected([&] { rescale_sum_exp(m, m16, m); }, "rescale_sum_exp: global_max must be fp32");
    expect_rejected([&] { cross_entropy_loss(m, m, m, m16); }, "cross_entropy_loss: statistics must be fp32 or fp64");
    expect_rejected([&] { cross_entropy_backward(x, m, m, m16, ids, 0, 8, 1.0, y); },
                    "cross_entropy_backward: sum_exp must be fp32");
    expect_rejected([&] { cross_entropy_backward(x, m, m16, m, ids, 0, 8, 1.0, y); },
                    "cross_entropy_backward: global_max must be fp32");
    expect_rejected([&] { cross_entropy_backward(x, m, m, m, ids, 0, 8, 1.0, y_other); },
                    std::string("cross_entropy_backward: dlogits must be ") + std::string(dtype_name(t)));
  }
  // fp32/fp64 storage: statistics and accumulators keep the storage dtype.
  Tensor x = empty({4, 8}, DType::F32), dbias16 = empty({8}, DType::BF16);
  expect_rejected([&] { bias_grad(x, dbias16); }, "bias_grad: dbias must be fp32 (a gradient");
  Tensor x64 = empty({4, 8}), m32 = empty({4}, DType::F32);
  const Tensor ids4 = ids_tensor({0, 1, 2, 3});
  expect_rejected([&] { cross_entropy_forward(x64, ids4, 0, 8, m32, m32, m32); },
                  "cross_entropy_forward: row_max must be fp64");
  Tensor dpos32 = empty({2, 8}, DType::F32);
  expect_rejected([&] { position_embedding_backward(x64, 2, dpos32); }, "position gradient must be fp64");
  // The meta device validates the same rules.
  auto meta = make_device(DeviceKind::Meta);
  Tensor mx = Tensor::empty(meta, {4, 8}, DType::BF16, MC::Other),
         mg = Tensor::empty(meta, {8}, DType::BF16, MC::Other);
  Tensor mm = Tensor::empty(meta, {4}, DType::F32, MC::Other), mm16 = Tensor::empty(meta, {4}, DType::BF16, MC::Other);
  layernorm_forward(mx, mg, mg, 1e-5, mx, mm, mm);
  expect_rejected([&] { layernorm_forward(mx, mg, mg, 1e-5, mx, mm16, mm); }, "mean must be fp32");
}

TEST(HalfStorage, SameBitsForAnyThreadCount) {
  std::mt19937 rng(62);
  const i64 rows = 600, cols = 130, v = 50;
  const Vec x = randn(usize(rows * cols), rng), w = randn(usize(rows * cols), rng), sc = randn(120000, rng, 3.0);
  std::vector<i64> idv(usize(rows));
  for (auto& id : idv) id = std::uniform_int_distribution<i64>(0, v - 1)(rng);
  auto run_all = [&](DType t) {
    std::vector<Vec> out;
    Tensor xt = tensor({rows, cols}, x, t), wt = tensor({rows, cols}, w, t);
    Tensor y = empty({rows, cols}, t), mean = empty({rows}, DType::F32), rstd = empty({rows}, DType::F32),
           gamma = tensor({cols}, Vec(usize(cols), 1.5), t);
    Tensor dg = tensor({cols}, Vec(usize(cols), 0.0), t), db = tensor({cols}, Vec(usize(cols), 0.0), DType::F32),
           dx = empty({rows, cols}, t);
    layernorm_forward(xt, gamma, gamma, 1e-5, y, mean, rstd);
    layernorm_backward(wt, xt, gamma, mean, rstd, dx, dg, db);
    out.push_back(vals(y)), out.push_back(vals(dx)), out.push_back(vals(dg)), out.push_back(vals(db));
    Tensor d = empty({rows, cols}, t);
    dropout_forward(xt, 0.3, RngKey{1, 2, 3, kRngEmbeddingDropout}, DropoutLayout{1, 1, rows, cols, 0, 0, 1}, d);
    out.push_back(vals(d));
    Tensor s = tensor({3, 200, 200}, sc, t), pr = empty({3, 200, 200}, t);
    causal_softmax_forward(s, 0.5, pr);
    out.push_back(vals(pr));
    Tensor dpos = tensor({100, cols}, Vec(usize(100 * cols), 0.0), t);
    position_embedding_backward(wt, 100, dpos);
    out.push_back(vals(dpos));
    for (DType acc : {t, DType::F32}) {
      Tensor dtable = tensor({v, cols}, Vec(usize(v * cols), 0.0), acc);
      embedding_backward(ids_tensor(idv), wt, 0, dtable);
      out.push_back(vals(dtable));
    }
    return out;
  };
  const int before = cpu_math_threads();
  for (DType t : kHalfDtypes) {
    set_cpu_math_threads(1);
    const auto one = run_all(t);
    set_cpu_math_threads(4);
    const auto four = run_all(t);
    for (std::size_t k = 0; k < one.size(); ++k) EXPECT_EQ(one[k], four[k]) << dtype_name(t) << " output " << k;
  }
  set_cpu_math_threads(before);
}

}  // namespace
