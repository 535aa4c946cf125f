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

// Per-document masks (--reset-attention-mask): each row is the causal
// softmax of its own document's block alone, placed at the document's
// columns, exact zeros elsewhere; the backward likewise (exact zeros outside,
// whatever dprobs holds there); starts outside [0, i] are clamped.
TEST(CausalSoftmax, PerDocumentMasksAreEachDocumentsOwnSoftmax) {
  std::mt19937 rng(31);
  const i64 n = 8, heads = 3, samples = 2, mats = samples * heads;
  // Sample 0: documents [0, 3), [3, 8); sample 1: [0, 1), [1, 6), [6, 8).
  const std::vector<i64> doc_starts = {0, 0, 0, 3, 3, 3, 3, 3, 0, 1, 1, 1, 1, 1, 6, 6};
  const Tensor starts = ids_tensor(doc_starts);
  const Vec s = to_f32(randn(usize(mats * n * n), rng, 4.0));
  Vec dp = to_f32(randn(usize(mats * n * n), rng));
  for (DType t : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(t));
    Tensor p = empty({mats, n, n}, t);
    causal_softmax_forward(tensor({mats, n, n}, s, t), 0.3, p, starts);
    const Vec got = vals(p);
    for (i64 m = 0; m < mats; ++m)
      for (i64 i = 0; i < n; ++i) {
        const i64 lo = doc_starts[usize(m / heads * n + i)], len = i - lo + 1;
        // The document's block: rows lo..i, columns lo..i; this row its last.
        Vec block;
        for (i64 r = lo; r <= i; ++r)
          for (i64 c = lo; c <= i; ++c) block.push_back(s[usize((m * n + r) * n + c)]);
        const Vec alone = softmax_run({1, len, len}, block, 0.3, t);
        for (i64 j = 0; j < n; ++j) {
          const double v = got[usize((m * n + i) * n + j)];
          if (j < lo || j > i) {
            ASSERT_EQ(v, 0.0) << "matrix " << m << " row " << i << " col " << j;
          } else {
            ASSERT_EQ(v, alone[usize((len - 1) * len + (j - lo))]) << "matrix " << m << " row " << i << " col " << j;
          }
        }
      }
    // Backward: the document's own backward; masked entries exactly 0 even
    // where dprobs is NaN.
    Vec dp_nan = dp;
    for (i64 m = 0; m < mats; ++m)
      for (i64 i = 0; i < n; ++i)
        for (i64 j = 0; j < doc_starts[usize(m / heads * n + i)]; ++j)
          dp_nan[usize((m * n + i) * n + j)] = std::numeric_limits<double>::quiet_NaN();
    Tensor ds = empty({mats, n, n}, t), ds_plain = empty({mats, n, n}, t);
    causal_softmax_backward(tensor({mats, n, n}, dp_nan, t), p, 0.3, ds, starts);
    causal_softmax_backward(tensor({mats, n, n}, dp, t), p, 0.3, ds_plain);
    // Without the starts the masked probabilities are 0 too, so where dprobs
    // is finite the plain backward agrees (its dot adds only zeros more).
    expect_close(vals(ds), vals(ds_plain), 0, 0, "backward with masks vs the plain one on masked probabilities");
  }
  // A start past the row keeps its diagonal (probability 1); below 0, the whole row.
  const Tensor odd = ids_tensor({5, 5, -3, 0});
  Tensor p = empty({1, 4, 4}, DType::F64);
  causal_softmax_forward(tensor({1, 4, 4}, Vec(16, 0.0)), 1.0, p, odd);
  expect_close(vals(p), Vec{1, 0, 0, 0, 0, 1, 0, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3, 0, 0.25, 0.25, 0.25, 0.25}, 1e-16, 0,
               "clamped starts");
  expect_rejected(
      [&] {
        causal_softmax_forward(tensor({1, 3, 4}, Vec(12, 0.0)), 1.0, out(empty({1, 3, 4})), odd);
      },
      "need square scores");
  expect_rejected(
      [&] {
        causal_softmax_forward(tensor({3, 4, 4}, Vec(48, 0.0)), 1.0, out(empty({3, 4, 4})),
                               ids_tensor({0, 0, 0, 0, 0, 0, 0, 0}));
      },
      "B dividing the 3 matrices");
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
