// The causal softmax (megazero/kernels/softmax.h) against the reference in
// kernel_test_util.h: exact zeros above the diagonal, huge scores that stay
// finite, the backward against central finite differences in fp64 (and exactly
// 0 above the diagonal whatever dprobs holds there); then bf16 and fp16
// storage (HalfStorage): one rounding of the fp64 reference.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "megazero/kernels/softmax.h"

using namespace megazero;
using namespace megazero::kernels;
using namespace kernel_test;

namespace {

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

// With fewer queries than keys (a key/value cache's step: the queries are the
// last sq of the sk positions), each row is the square softmax's row of the
// same position, bit for bit, in every storage type.
TEST(CausalSoftmax, FewerQueriesThanKeysAreTheLastRowsOfTheSquareOne) {
  std::mt19937 rng(12);
  const i64 n = 9, mats = 4;
  const Vec square = to_f32(randn(usize(mats * n * n), rng, 4.0));
  for (DType t : {DType::F64, DType::F32, DType::BF16, DType::F16})
    for (const i64 sq : {i64{1}, i64{3}, n}) {
      SCOPED_TRACE(testing::Message() << dtype_name(t) << " sq " << sq);
      const Vec full = softmax_run({mats, n, n}, square, 0.4, t);
      Vec last, want;
      for (i64 m = 0; m < mats; ++m)
        for (i64 r = n - sq; r < n; ++r)
          for (i64 j = 0; j < n; ++j) {
            last.push_back(square[usize((m * n + r) * n + j)]);
            want.push_back(full[usize((m * n + r) * n + j)]);
          }
      EXPECT_EQ(softmax_run({mats, sq, n}, last, 0.4, t), want);
    }
  expect_rejected(
      [&] {
        Tensor more = tensor({1, 3, 2}, Vec(6, 0.0));
        causal_softmax_forward(more, 1.0, more);
      },
      "sq <= sk");
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

// =========================== 16-bit storage ===========================
// (kernel_test_util.h: inputs rounded to the dtype first, the fp64 reference on
// the same values, each output within one rounding or bit for bit.)

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

}  // namespace
