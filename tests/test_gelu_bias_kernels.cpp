// GeLU, bias and element-wise kernels (megazero/kernels/gelu_bias.h) against
// independent references written here in double: forwards against them (fp64
// tightly, fp32 within fp32 rounding), backwards against central finite
// differences in fp64 of a random linear functional L = sum(w * output),
// Megatron's bias-GeLU fusion against the unfused sequence; then bf16 and
// fp16 storage (HalfStorage): one rounding, the fp32 result rounded once, fp32
// or 16-bit bias accumulators, every chunk and thread path of the GeLU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernel_test_util.h"
#include "megazero/kernels/cpu_threads.h"
#include "megazero/kernels/gelu_bias.h"

using namespace megazero;
using namespace megazero::kernels;
using namespace kernel_test;

namespace {

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

// Squared ReLU (--squared-relu): relu(x)^2 exactly (a square of a stored
// value rounds once), its backward dy * 2 relu(x) against finite differences
// away from the kink, in place, 16-bit storage rounded once, a NaN kept NaN.
TEST(SquaredRelu, ForwardBackwardAndStorage) {
  std::mt19937 rng(8);
  Vec x = randn(500, rng, 2.0);
  for (double& v : x)
    if (std::fabs(v) < 1e-3) v = 0.5;  // finite differences stay off the kink at 0
  const Shape shape{20, 25};
  for (DType t : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor xt = tensor(shape, x, t);
    const Vec xs = vals(xt);  // x as stored
    Tensor y = empty(shape, t);
    squared_relu_forward(xt, y);
    Vec want(xs.size());
    for (std::size_t i = 0; i < xs.size(); ++i) want[i] = xs[i] > 0 ? xs[i] * xs[i] : 0.0;
    const double storage = t == DType::BF16 ? 1.0 / 256 : t == DType::F16 ? 1.0 / 2048 : t == DType::F32 ? 1e-7 : 0;
    expect_close(vals(y), want, storage, 0, "forward");
    Tensor inplace = xt.clone(MemoryCategory::Other);
    squared_relu_forward(inplace, inplace);
    expect_close(vals(inplace), vals(y), 0, 0, "in place");
  }
  const Vec w = randn(500, rng);
  Tensor dx = empty(shape);
  squared_relu_backward(tensor(shape, w), tensor(shape, x), dx);
  expect_fd_gradient(
      "dx", x,
      [&](const Vec& v) {
        Tensor y = empty(shape);
        squared_relu_forward(tensor(shape, v), y);
        return vals(y);
      },
      w, vals(dx));
  Tensor d = tensor(shape, w);
  squared_relu_backward(d, tensor(shape, x), d);  // dx aliasing dy
  expect_close(vals(d), vals(dx), 0, 0, "aliased");
  for (DType t : {DType::F32, DType::BF16}) {
    Tensor nan = tensor({3}, {std::nan(""), -1.0, 2.0}, t), out = empty({3}, t);
    squared_relu_forward(nan, out);
    const Vec v = vals(out);
    EXPECT_TRUE(std::isnan(v[0])) << "a NaN stays NaN (PyTorch's relu)";
    EXPECT_EQ(v[1], 0.0);
    EXPECT_EQ(v[2], 4.0);
  }
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

// Without a bias (fc1's GEMM epilogue wrote pre = x W + b already): dx =
// dy * gelu'(y), dbias += its column sums — gelu_backward then bias_grad, bit
// for bit in fp64, fp32 and bf16 (the same rounding of the same compute-type
// value), and the same bits as a zero bias; dx may alias dy.
TEST(Gelu, BiasGeluBackwardWithoutABiasIsGeluBackwardThenBiasGrad) {
  std::mt19937 rng(29);
  const i64 rows = 37, cols = 24;  // 16-bit rows of 3 packs, fp32 rows of 6
  const Shape shape{rows, cols};
  const Vec y = randn(usize(rows * cols), rng, 2.0), w = randn(y.size(), rng), dbias0 = randn(usize(cols), rng);
  for (const DType t : {DType::F64, DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(t));
    const DType acc = t == DType::BF16 ? DType::F32 : t;
    Tensor d = tensor(shape, w, t), db = tensor({cols}, dbias0, acc);
    bias_gelu_backward(d, tensor(shape, y, t), Tensor(), d, db);
    Tensor du = tensor(shape, w, t), dbu = tensor({cols}, dbias0, acc);
    gelu_backward(du, tensor(shape, y, t), du);
    bias_grad(du, dbu);
    expect_close(vals(d), vals(du), 0, 0, "dx = gelu_backward");
    expect_close(vals(db), vals(dbu), 0, 0, "dbias = bias_grad of dx");
    Tensor dz = tensor(shape, w, t), dbz = tensor({cols}, dbias0, acc);
    bias_gelu_backward(dz, tensor(shape, y, t), tensor({cols}, Vec(usize(cols), 0.0), t), dz, dbz);
    expect_close(vals(d), vals(dz), 0, 0, "dx = with a zero bias");
    expect_close(vals(db), vals(dbz), 0, 0, "dbias = with a zero bias");
  }
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
  // column_sums, the same sums under their own name: a [60, 1] view sums 60
  // values into one (the training step's loss sum), in row order, in double.
  Tensor total = tensor({1}, {0.5});
  column_sums(tensor({60, 1}, w), total);
  double sum = 0;
  for (double v : w) sum += v;
  EXPECT_EQ(vals(total)[0], 0.5 + sum);
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

// =========================== 16-bit storage ===========================
// (kernel_test_util.h: inputs rounded to the dtype first, the fp64 reference on
// the same values, each output within one rounding or bit for bit.)

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
    Tensor csums = tensor({70}, dbias0, t), csums32 = tensor({70}, dbias0, DType::F32);
    column_sums(tensor(shape, b, t), csums);
    column_sums(tensor(shape, b, t), csums32);
    expect_same(vals(csums), vals(dbias), "column_sums == bias_grad");
    expect_same(vals(csums32), vals(dbias32), "column_sums == bias_grad into fp32");

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

}  // namespace
