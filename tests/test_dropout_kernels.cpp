// Dropout and bias-dropout-add (megazero/kernels/dropout.h): the mask is
// uniform_at of the element's global index, drops a fraction p, does not
// depend on how a tensor is split over TP/DP ranks (the offsets of
// DropoutLayout), is reused by the backward; the fused bias-dropout-add and
// the backward with the bias gradient are the unfused sequences bit for bit;
// then bf16 and fp16 storage (HalfStorage): the fp32 mask.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "megazero/kernels/dropout.h"
#include "megazero/kernels/gelu_bias.h"
#include "megazero/kernels/rng.h"

using namespace megazero;
using namespace megazero::kernels;
using namespace kernel_test;

namespace {

std::uint64_t global_index(const DropoutLayout& l, i64 a, i64 b, i64 c, i64 d) {
  return static_cast<std::uint64_t>(((l.sample_offset + a) * l.global_groups + (l.group_offset + b)) * l.matrix_rows *
                                        l.matrix_cols +
                                    c * l.matrix_cols + d);
}

Vec dropout_run(const Vec& x, double p, const RngKey& key, const DropoutLayout& l, DType t = DType::F64) {
  const Shape shape{l.samples, l.groups, l.matrix_rows, l.matrix_cols};
  Tensor y = empty(shape, t);
  dropout_forward(tensor(shape, x, t), p, key, l, y);
  return vals(y);
}

// DropoutLayouts below are written {samples, groups, matrix_rows, matrix_cols,
// sample_offset, group_offset, global_groups}.
TEST(Dropout, MaskIsUniformAtOfTheGlobalIndex) {
  std::mt19937 rng(11);
  const DropoutLayout l{3, 2, 5, 7, 2, 1, 4};  // odd sizes: blocks of 4 straddle rows
  // Every key word non-trivial, high halves included: the kernel's block-wise
  // generator must map keys exactly as uniform_at does.
  const RngKey key{(3ull << 40) | 2024, (5ull << 32) | 17, 3, kRngAttentionDropout};
  const double p = 0.3;
  const Vec x = to_f32(randn(210, rng));
  for (DType t : {DType::F64, DType::F32}) {
    const Vec y = dropout_run(x, p, key, l, t);
    std::size_t i = 0;
    for (i64 a = 0; a < l.samples; ++a)
      for (i64 b = 0; b < l.groups; ++b)
        for (i64 c = 0; c < l.matrix_rows; ++c)
          for (i64 d = 0; d < l.matrix_cols; ++d, ++i) {
            const bool keep = uniform_at(key, global_index(l, a, b, c, d)) >= p;
            const double want = t == DType::F64 ? x[i] * (1.0 / (1.0 - p))
                                                : static_cast<float>(x[i]) * static_cast<float>(1.0 / (1.0 - p));
            ASSERT_EQ(y[i], keep ? want : 0.0) << dtype_name(t) << " element " << i;
          }
  }
}

TEST(Dropout, DropsAFractionPAndBackwardReusesTheMask) {
  std::mt19937 rng(12);
  const DropoutLayout l{2, 1, 1000, 500, 0, 0, 1};  // hidden states: groups = 1
  const RngKey key{7, 3, 1, kRngMlpOutputDropout};
  for (double p : {0.1, 0.5}) {
    const Vec x(usize(l.samples * l.matrix_rows * l.matrix_cols), 1.0);
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
// offsets: TP ranks (split along heads: groups, group_offset) and DP ranks
// (split along samples: samples, sample_offset) draw exactly the values a
// single rank would.
TEST(Dropout, MaskDoesNotDependOnTheSplitAcrossRanks) {
  const RngKey key{99, 5, 2, kRngAttentionDropout};
  const double p = 0.5;
  const DropoutLayout whole{4, 8, 5, 7, 0, 0, 8};  // 5 x 7 = 35: pieces start inside a 4-value Philox block
  const Shape shape{4, 8, 5, 7};
  const Vec ones(usize(numel(shape)), 1.0);
  const Tensor y = tensor(shape, dropout_run(ones, p, key, whole));
  for (int dim : {0, 1}) {
    for (i64 half = 0; half < 2; ++half) {
      DropoutLayout part = whole;
      if (dim == 0) {
        part.samples = 2;
        part.sample_offset = 2 * half;
      } else {
        part.groups = 4;
        part.group_offset = 4 * half;
      }
      const Vec piece(usize(part.samples * part.groups * part.matrix_rows * part.matrix_cols), 1.0);
      const Vec got = dropout_run(piece, p, key, part);
      const i64 len = dim == 0 ? part.samples : part.groups;
      const Vec want = vals(y.narrow(dim, half * len, len).clone(MC::Other));
      EXPECT_EQ(got, want) << "split along " << (dim == 0 ? "samples (DP)" : "groups (TP)") << ", half " << half;
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
  bad.matrix_cols = 4;  // does not cover the tensor
  expect_rejected([&] { dropout_forward(t, 0.1, RngKey{}, bad, y); }, "does not cover");
  bad = l, bad.group_offset = 1;  // group_offset + groups > global_groups
  expect_rejected([&] { dropout_forward(t, 0.1, RngKey{}, bad, y); }, "group_offset + groups <= global_groups");
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

// =========================== 16-bit storage ===========================
// (kernel_test_util.h: inputs rounded to the dtype first, the fp64 reference on
// the same values, each output within one rounding or bit for bit.)

TEST(HalfStorage, DropoutMaskEqualsTheFp32Mask) {
  const DropoutLayout l{3, 2, 5, 7, 2, 1, 4};
  const RngKey key{(3ull << 40) | 2024, (5ull << 32) | 17, 3, kRngAttentionDropout};
  const double p = 0.3;
  const Shape shape{l.samples, l.groups, l.matrix_rows, l.matrix_cols};
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
  // The parallel path (hidden states, groups = 1), a million elements.
  const DropoutLayout big{2, 1, 1000, 500, 0, 0, 1};
  const RngKey k2{7, 3, 1, kRngMlpOutputDropout};
  const Vec ones(usize(big.samples * big.matrix_rows * big.matrix_cols), 1.0);
  const Vec y32 = dropout_run(ones, 0.1, k2, big, DType::F32);
  for (DType t : kHalfDtypes) {
    const Vec y = dropout_run(ones, 0.1, k2, big, t);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < y.size(); ++i) differ += (y[i] == 0) != (y32[i] == 0);
    EXPECT_EQ(differ, 0u) << dtype_name(t);
  }
}

}  // namespace
