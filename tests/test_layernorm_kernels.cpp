// LayerNorm (megazero/kernels/layernorm.h) against an independent reference
// written here with plain loops in double: the forward against it (fp64
// tightly, fp32 within fp32 rounding of the same inputs, rows far from 0 that
// a one-pass variance would cancel), the backward against central finite
// differences in fp64 of a random linear functional L = sum(w * y), the
// residual gradient added in the same pass; then bf16 and fp16 storage
// (HalfStorage): one rounding, fp32 statistics, fp32 or 16-bit accumulators.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernel_test_util.h"
#include "megazero/kernels/layernorm.h"
#include "megazero/kernels/dropout.h"
#include "megazero/kernels/gelu_bias.h"

using namespace megazero;
using namespace megazero::kernels;
using namespace kernel_test;

namespace {

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

// layernorm_backward_dropout is layernorm_backward, then the dropout backward
// of its dx (what the CPU runs, and what the GPU's one pass must equal:
// test_cuda); its output may not share dx's or dy's storage.
TEST(LayerNorm, BackwardDropoutIsTheBackwardThenTheDropoutBackward) {
  auto c = layernorm_case({6, 16}, 5, 1.0);
  std::mt19937 rng(41);
  const Vec w = randn(c.x.size(), rng), r = randn(c.x.size(), rng), b0 = randn(usize(c.cols()), rng);
  for (const DType t : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(t));
    Tensor x = tensor(c.shape, c.x, t), gamma = tensor({c.cols()}, c.gamma, t), beta = tensor({c.cols()}, c.beta, t);
    Tensor y = empty(c.shape, t), mean = empty({c.rows()}, DType::F32), rstd = empty({c.rows()}, DType::F32);
    layernorm_forward(x, gamma, beta, c.eps, y, mean, rstd);
    const Tensor dy = tensor(c.shape, w, t), res = tensor(c.shape, r, t);
    const DropoutLayout layout{c.rows(), 1, 1, c.cols(), 12, 0, 1};
    const RngKey key{3, 9, 2, kRngAttentionOutputDropout};
    Tensor dg = tensor({c.cols()}, b0, DType::F32), db = dg.clone(MC::Other), dbias = dg.clone(MC::Other);
    Tensor dg2 = dg.clone(MC::Other), db2 = dg.clone(MC::Other), dbias2 = dg.clone(MC::Other);
    Tensor dx = empty(c.shape, t), dd = empty(c.shape, t), dx2 = empty(c.shape, t), dd2 = empty(c.shape, t);
    layernorm_backward_dropout(dy, x, gamma, mean, rstd, dx, dg, db, &res, {0.25, key, layout, &dd, &dbias});
    layernorm_backward(dy, x, gamma, mean, rstd, dx2, dg2, db2, &res);
    dropout_backward_bias_grad(dx2, 0.25, key, layout, dd2, dbias2);
    EXPECT_EQ(vals(dx), vals(dx2));
    EXPECT_EQ(vals(dd), vals(dd2));
    EXPECT_EQ(vals(dg), vals(dg2));
    EXPECT_EQ(vals(db), vals(db2));
    EXPECT_EQ(vals(dbias), vals(dbias2));
    std::size_t dropped = 0;
    for (const double v : vals(dd)) dropped += v == 0.0;
    EXPECT_GT(dropped, 0u);  // p = 0.25 over 96 values: the mask did drop
    // No bias: the dropout alone, the same values.
    Tensor dd3 = empty(c.shape, t);
    layernorm_backward_dropout(dy, x, gamma, mean, rstd, dx2, dg2, db2, &res, {0.25, key, layout, &dd3, nullptr});
    EXPECT_EQ(vals(dd3), vals(dd));
    // The output over dx or dy, a wrong bias, a layout of other rows: refused.
    expect_rejected(
        [&] {
          layernorm_backward_dropout(dy, x, gamma, mean, rstd, dx, dg, db, &res, {0.25, key, layout, &dx, nullptr});
        },
        "must not share dx's or dy's storage");
    Tensor dy_copy = dy.clone(MC::Other);
    expect_rejected(
        [&] {
          layernorm_backward_dropout(dy_copy, x, gamma, mean, rstd, dx, dg, db, &res,
                                     {0.25, key, layout, &dy_copy, nullptr});
        },
        "must not share dx's or dy's storage");
    Tensor short_bias = empty({c.cols() - 1}, DType::F32);
    expect_rejected(
        [&] {
          layernorm_backward_dropout(dy, x, gamma, mean, rstd, dx, dg, db, &res, {0.25, key, layout, &dd, &short_bias});
        },
        "dbias");
    const DropoutLayout fewer{c.rows() - 1, 1, 1, c.cols(), 0, 0, 1};
    expect_rejected(
        [&] {
          layernorm_backward_dropout(dy, x, gamma, mean, rstd, dx, dg, db, &res, {0.25, key, fewer, &dd, nullptr});
        },
        "does not cover");
  }
}

// bias_dropout_add_layernorm is bias_dropout_add, then layernorm_forward of
// the sum (what the CPU runs; the GPU's one pass must equal it: test_cuda);
// the LayerNorm's output may not share the sum's storage.
TEST(LayerNorm, BiasDropoutAddLayerNormIsTheTwoCalls) {
  auto c = layernorm_case({6, 16}, 7, 1.0);
  std::mt19937 rng(43);
  const Vec yv = randn(c.x.size(), rng), bv = randn(usize(c.cols()), rng);
  for (const DType t : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor y = tensor(c.shape, yv, t), res = tensor(c.shape, c.x, t), bias = tensor({c.cols()}, bv, t);
    const Tensor gamma = tensor({c.cols()}, c.gamma, t), beta = tensor({c.cols()}, c.beta, t);
    const DropoutLayout layout{c.rows(), 1, 1, c.cols(), 3, 0, 1};
    const RngKey key{5, 8, 1, kRngAttentionOutputDropout};
    Tensor sum = y.clone(MC::Other), out = empty(c.shape, t), mean = empty({c.rows()}, DType::F32),
           rstd = empty({c.rows()}, DType::F32);
    bias_dropout_add_layernorm(sum, {&bias, &res, 0.25, key, layout, &sum}, gamma, beta, c.eps, out, mean, rstd);
    Tensor sum2 = empty(c.shape, t), out2 = empty(c.shape, t), mean2 = empty({c.rows()}, DType::F32),
           rstd2 = empty({c.rows()}, DType::F32);
    bias_dropout_add(y, bias, res, 0.25, key, layout, sum2);
    layernorm_forward(sum2, gamma, beta, c.eps, out2, mean2, rstd2);
    EXPECT_EQ(vals(sum), vals(sum2));
    EXPECT_EQ(vals(out), vals(out2));
    EXPECT_EQ(vals(mean), vals(mean2));
    EXPECT_EQ(vals(rstd), vals(rstd2));
    std::size_t dropped = 0;
    const Vec s = vals(sum2), r = vals(res);
    for (std::size_t i = 0; i < s.size(); ++i) dropped += s[i] == r[i];
    EXPECT_GT(dropped, 0u);  // p = 0.25: the mask did drop (the sum is the residual there)
    Tensor y2 = y.clone(MC::Other);
    expect_rejected(
        [&] {
          bias_dropout_add_layernorm(y, {&bias, &res, 0.25, key, layout, &y2}, gamma, beta, c.eps, y2, mean, rstd);
        },
        "must not share the sum's storage");
    const Tensor short_bias = empty({c.cols() - 1}, t);
    expect_rejected(
        [&] {
          bias_dropout_add_layernorm(y, {&short_bias, &res, 0.25, key, layout, &y2}, gamma, beta, c.eps, out, mean,
                                     rstd);
        },
        "bias");
  }
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

// =========================== 16-bit storage ===========================
// (kernel_test_util.h: inputs rounded to the dtype first, the fp64 reference on
// the same values, each output within one rounding or bit for bit.)

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

}  // namespace
