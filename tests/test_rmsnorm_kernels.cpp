// The RMSNorm kernels (megazero/kernels/rmsnorm.h) on the test device
// (tests/test_device.h: the CPU here, CUDA on a GPU machine), against a naive
// reference written here in double: the forward in fp64 to 1e-12, fp32 within
// one fp32 rounding of the reference on the same inputs, bf16/fp16 within one
// 16-bit rounding with fp32 rstd; the backward against central finite
// differences in fp64 of L = sum(w * y), dgamma accumulated (+=) into the
// storage dtype or fp32, the fused residual gradient (add_to_dx); the aliasing
// the contract allows; the same bits for any thread count; the CUDA scratch
// planned on a meta device; and bad operands refused with a message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "megazero/core/tensor.h"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/layer_kernels.h"
#include "megazero/kernels/rmsnorm.h"

using namespace megazero;
using namespace megazero::kernels;
using namespace kernel_test;

namespace {

// This file's tensors live on the test device.
using on_test_device::empty, on_test_device::tensor, on_test_device::zeros;

// ------------------------------------------------------------ reference

struct Forward {
  Vec y, rstd;
};

// rstd = 1 / sqrt(mean(x^2) + eps), y = x * rstd * gamma, in double.
Forward rmsnorm_ref(const Vec& x, const Vec& gamma, i64 rows, i64 cols, double eps) {
  Forward o{Vec(x.size()), Vec(usize(rows))};
  for (i64 r = 0; r < rows; ++r) {
    double ms = 0;
    for (i64 c = 0; c < cols; ++c) ms += std::pow(x[usize(r * cols + c)], 2);
    const double rstd = 1.0 / std::sqrt(ms / static_cast<double>(cols) + eps);
    for (i64 c = 0; c < cols; ++c) o.y[usize(r * cols + c)] = x[usize(r * cols + c)] * rstd * gamma[usize(c)];
    o.rstd[usize(r)] = rstd;
  }
  return o;
}

struct Backward {
  Vec dx, dgamma;
};

// The contract's formulas from the given rstd, in double:
// dx = rstd (g - x rstd^2 mean(g x)) + add, g = gamma dy; dgamma0 + sum_r dy x rstd.
Backward rmsnorm_backward_ref(const Vec& dy, const Vec& x, const Vec& gamma, const Vec& rstd, const Vec& dgamma0,
                              const Vec* add, i64 rows, i64 cols) {
  Backward o{Vec(x.size()), dgamma0};
  for (i64 r = 0; r < rows; ++r) {
    const double rs = rstd[usize(r)];
    double mgx = 0;
    for (i64 c = 0; c < cols; ++c) {
      const std::size_t k = usize(r * cols + c);
      mgx += dy[k] * gamma[usize(c)] * x[k] / static_cast<double>(cols);
      o.dgamma[usize(c)] += dy[k] * x[k] * rs;
    }
    for (i64 c = 0; c < cols; ++c) {
      const std::size_t k = usize(r * cols + c);
      o.dx[k] = rs * (dy[k] * gamma[usize(c)] - x[k] * rs * rs * mgx) + (add ? (*add)[k] : 0.0);
    }
  }
  return o;
}

struct Case {
  Shape shape;
  Vec x, gamma;
  double eps = 1e-5;
  i64 cols() const { return shape.back(); }
  i64 rows() const { return shape_numel(shape) / cols(); }
};

// Odd rows scaled by `odd_scale`: rstd spans orders of magnitude.
Case make_case(const Shape& shape, unsigned seed, double odd_scale) {
  std::mt19937 rng(seed);
  Case c{shape, {}, {}};
  c.x = randn(usize(shape_numel(shape)), rng);
  for (std::size_t i = 0; i < c.x.size(); ++i)
    if ((static_cast<i64>(i) / c.cols()) % 2) c.x[i] *= odd_scale;
  c.gamma = randn(usize(c.cols()), rng);
  return c;
}

// The case's values as dtype t holds them.
Case rounded_case(Case c, DType t) {
  c.x = rounded(c.x, t);
  c.gamma = rounded(c.gamma, t);
  return c;
}

Forward run_forward(const Case& c, DType t) {
  Tensor y = empty(c.shape, t), rstd = empty({c.rows()}, row_stat_dtype(t));
  rmsnorm_forward(tensor(c.shape, c.x, t), tensor({c.cols()}, c.gamma, t), c.eps, y, rstd);
  return {vals(y), vals(rstd)};
}

// ------------------------------------------------------------ forward

TEST(RmsNorm, Fp64ForwardMatchesTheReference) {
  const auto c = make_case({3, 4, 37}, 1, 1000.0);
  const auto want = rmsnorm_ref(c.x, c.gamma, c.rows(), c.cols(), c.eps);
  const auto got = run_forward(c, DType::F64);
  expect_close(got.y, want.y, 1e-12, 1e-12, "y");
  expect_close(got.rstd, want.rstd, 1e-12, 0, "rstd");
}

// fp32, bf16, fp16: the reference on the values the tensors hold, y rounded
// once (the math in double), rstd an fp32 rounding; bit for bit the fp64
// kernel's result on the same values, rounded once.
TEST(RmsNorm, ForwardRoundsOnceInEveryStorageDtype) {
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(t));
    const auto c = rounded_case(make_case({3, 5, 40}, 2, 30.0), t);
    const auto want = rmsnorm_ref(c.x, c.gamma, c.rows(), c.cols(), c.eps);
    const auto got = run_forward(c, t);
    expect_one_rounding(got.y, want.y, t, "y");
    expect_close(got.rstd, want.rstd, 1.01 * 0x1p-24, 0, "rstd (fp32)");
    const auto f64 = run_forward(c, DType::F64);
    expect_same(got.y, round_once(f64.y, t), "y == the fp64 kernel's y rounded once");
    expect_same(got.rstd, round_once(f64.rstd, DType::F32), "rstd == the fp64 kernel's rstd in fp32");
  }
}

TEST(RmsNorm, ForwardMayWriteOverItsInput) {
  for (DType t : kAllDtypes) {
    SCOPED_TRACE(dtype_name(t));
    const auto c = make_case({6, 130}, 3, 4.0);
    const auto want = run_forward(c, t);
    Tensor x = tensor(c.shape, c.x, t), rstd = empty({c.rows()}, row_stat_dtype(t));
    rmsnorm_forward(x, tensor({c.cols()}, c.gamma, t), c.eps, x, rstd);
    expect_same(vals(x), want.y, "y aliasing x");
    expect_same(vals(rstd), want.rstd, "rstd with y aliasing x");
  }
}

TEST(RmsNorm, EpsilonKeepsAZeroRowFinite) {
  Case c = make_case({3, 8}, 4, 1.0);
  std::fill(c.x.begin() + 8, c.x.begin() + 16, 0.0);  // row 1: all zeros
  for (DType t : kAllDtypes) {
    const auto got = run_forward(c, t);
    EXPECT_NEAR(got.rstd[1], 1.0 / std::sqrt(c.eps), 1e-7 / std::sqrt(c.eps)) << dtype_name(t);
    for (i64 k = 8; k < 16; ++k) EXPECT_EQ(got.y[usize(k)], 0.0) << dtype_name(t);
  }
}

// ------------------------------------------------------------ backward

TEST(RmsNorm, Fp64BackwardMatchesFiniteDifferencesAndAccumulates) {
  const auto c = make_case({2, 3, 9}, 5, 3.0);
  std::mt19937 rng(50);
  const Vec w = randn(c.x.size(), rng), dgamma0 = randn(usize(c.cols()), rng), res = randn(c.x.size(), rng);
  Tensor x = tensor(c.shape, c.x), gamma = tensor({c.cols()}, c.gamma);
  Tensor y = empty(c.shape), rstd = empty({c.rows()});
  rmsnorm_forward(x, gamma, c.eps, y, rstd);
  Tensor dx = tensor(c.shape, Vec(c.x.size(), 1e30));  // overwritten, whatever it held
  Tensor dgamma = tensor({c.cols()}, dgamma0);
  rmsnorm_backward(tensor(c.shape, w), x, gamma, rstd, dx, dgamma);
  Vec grad_gamma = vals(dgamma);
  for (std::size_t k = 0; k < grad_gamma.size(); ++k) grad_gamma[k] -= dgamma0[k];

  const auto with_x = [&](const Vec& v) {
    Case d = c;
    d.x = v;
    return run_forward(d, DType::F64).y;
  };
  const auto with_gamma = [&](const Vec& v) {
    Case d = c;
    d.gamma = v;
    return run_forward(d, DType::F64).y;
  };
  expect_fd_gradient("dx", c.x, with_x, w, vals(dx));
  expect_fd_gradient("dgamma", c.gamma, with_gamma, w, grad_gamma);
  const auto ref = rmsnorm_backward_ref(w, c.x, c.gamma, vals(rstd), dgamma0, nullptr, c.rows(), c.cols());
  expect_close(vals(dx), ref.dx, 1e-12, 1e-12, "dx against the formula");
  expect_close(vals(dgamma), ref.dgamma, 1e-12, 1e-12, "dgamma against the formula");

  // A second micro-batch adds to dgamma; dx is overwritten again.
  rmsnorm_backward(tensor(c.shape, w), x, gamma, rstd, dx, dgamma);
  Vec twice = dgamma0;
  for (std::size_t k = 0; k < twice.size(); ++k) twice[k] += 2 * grad_gamma[k];
  expect_close(vals(dgamma), twice, 1e-12, 1e-12, "dgamma accumulated over two calls");

  // The residual gradient joins dx in the same pass: in fp64, the same sum up to
  // a rounding (nvcc contracts the last product and the addition into one FMA,
  // which rounds once where the CPU rounds twice: 1 ulp on an H200).
  Tensor dx_add = empty(c.shape), dg = tensor({c.cols()}, Vec(usize(c.cols()), 0.0));
  const Tensor r = tensor(c.shape, res);
  rmsnorm_backward(tensor(c.shape, w), x, gamma, rstd, dx_add, dg, &r);
  Vec sum = vals(dx);
  for (std::size_t k = 0; k < sum.size(); ++k) sum[k] += res[k];
  expect_close(vals(dx_add), sum, 1e-15, 1e-15, "dx + add_to_dx");
  expect_close(vals(dg), grad_gamma, 1e-12, 1e-12, "dgamma with add_to_dx");
}

// Every storage dtype, dgamma into the storage dtype and into fp32: the
// formulas in double from the values the tensors hold and the rstd the forward
// saved, each result rounded once; bit for bit the fp64 kernel on the same
// values. 100 rows x 70 columns: two column blocks on the CPU, several row
// chunks (partial sums and a finish pass) on a GPU.
TEST(RmsNorm, BackwardRoundsOnceIntoStorageOrFp32Accumulators) {
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(t));
    const auto c = rounded_case(make_case({4, 25, 70}, 6, 3.0), t);
    std::mt19937 rng(60);
    const Vec w = rounded(randn(c.x.size(), rng), t), dgamma0 = rounded(randn(usize(c.cols()), rng), t);
    const Vec res = rounded(randn(c.x.size(), rng), t);
    Tensor x = tensor(c.shape, c.x, t), gamma = tensor({c.cols()}, c.gamma, t), y = empty(c.shape, t);
    Tensor rstd = empty({c.rows()}, row_stat_dtype(t));
    rmsnorm_forward(x, gamma, c.eps, y, rstd);
    const Vec rs = vals(rstd);

    Tensor dx = tensor(c.shape, Vec(c.x.size(), 1e4), t), dgamma = tensor({c.cols()}, dgamma0, t);
    rmsnorm_backward(tensor(c.shape, w, t), x, gamma, rstd, dx, dgamma);
    const auto want = rmsnorm_backward_ref(w, c.x, c.gamma, rs, dgamma0, nullptr, c.rows(), c.cols());
    expect_one_rounding(vals(dx), want.dx, t, "dx");
    expect_one_rounding(vals(dgamma), want.dgamma, t, "dgamma (storage dtype)");

    // The fp64 kernel on the same values and rstd, rounded once.
    Tensor dx64 = empty(c.shape), dg64 = tensor({c.cols()}, dgamma0);
    rmsnorm_backward(tensor(c.shape, w), tensor(c.shape, c.x), tensor({c.cols()}, c.gamma), tensor({c.rows()}, rs),
                     dx64, dg64);
    expect_same(vals(dx), round_once(vals(dx64), t), "dx == the fp64 kernel's dx rounded once");
    expect_same(vals(dgamma), round_once(vals(dg64), t), "dgamma == the fp64 kernel's dgamma rounded once");

    if (t != DType::F32) {  // fp32 main grads for 16-bit activations
      Tensor dx2 = empty(c.shape, t), dg32 = tensor({c.cols()}, dgamma0, DType::F32);
      rmsnorm_backward(tensor(c.shape, w, t), x, gamma, rstd, dx2, dg32);
      expect_one_rounding(vals(dg32), want.dgamma, DType::F32, "dgamma (fp32 accumulator)");
      expect_same(vals(dg32), round_once(vals(dg64), DType::F32), "fp32 dgamma == the fp64 kernel's in fp32");
      expect_same(vals(dx2), vals(dx), "dx does not depend on the accumulator dtype");
    }

    // With the residual gradient: one rounding of the sum.
    Tensor dx_add = empty(c.shape, t), dg_add = tensor({c.cols()}, dgamma0, t);
    const Tensor r = tensor(c.shape, res, t);
    rmsnorm_backward(tensor(c.shape, w, t), x, gamma, rstd, dx_add, dg_add, &r);
    const auto want_add = rmsnorm_backward_ref(w, c.x, c.gamma, rs, dgamma0, &res, c.rows(), c.cols());
    expect_one_rounding(vals(dx_add), want_add.dx, t, "dx + add_to_dx");
    expect_same(vals(dg_add), vals(dgamma), "dgamma with add_to_dx");

    // dx may alias dy.
    Tensor d = tensor(c.shape, w, t), dg = tensor({c.cols()}, dgamma0, t);
    rmsnorm_backward(d, x, gamma, rstd, d, dg);
    expect_same(vals(d), vals(dx), "dx aliasing dy");
    expect_same(vals(dg), vals(dgamma), "dgamma with dx aliasing dy");
  }
}

TEST(RmsNorm, Fp64BackwardMayWriteOverDy) {
  const auto c = make_case({5, 33}, 7, 2.0);
  std::mt19937 rng(70);
  const Vec w = randn(c.x.size(), rng), res = randn(c.x.size(), rng);
  Tensor x = tensor(c.shape, c.x), gamma = tensor({c.cols()}, c.gamma), y = empty(c.shape), rstd = empty({c.rows()});
  rmsnorm_forward(x, gamma, c.eps, y, rstd);
  const Tensor r = tensor(c.shape, res);
  Tensor dx = empty(c.shape), dg = tensor({c.cols()}, Vec(usize(c.cols()), 0.0));
  rmsnorm_backward(tensor(c.shape, w), x, gamma, rstd, dx, dg, &r);
  Tensor d = tensor(c.shape, w), dg2 = tensor({c.cols()}, Vec(usize(c.cols()), 0.0));
  rmsnorm_backward(d, x, gamma, rstd, d, dg2, &r);
  expect_same(vals(d), vals(dx), "dx aliasing dy, with add_to_dx");
  expect_same(vals(dg2), vals(dg), "dgamma");
}

// The CPU kernels split rows over threads and sum dgamma's columns in row
// order: the same bits for 1 and 4 threads.
TEST(RmsNorm, SameBitsForAnyThreadCount) {
  if (test_dev()->kind() != DeviceKind::CPU) GTEST_SKIP() << "CPU threads only";
  std::mt19937 rng(80);
  const i64 rows = 600, cols = 130;
  const Vec xv = randn(usize(rows * cols), rng), wv = randn(usize(rows * cols), rng), gv = randn(usize(cols), rng);
  const auto run_all = [&](DType t) {
    Tensor x = tensor({rows, cols}, xv, t), w = tensor({rows, cols}, wv, t), gamma = tensor({cols}, gv, t);
    Tensor y = empty({rows, cols}, t), rstd = empty({rows}, row_stat_dtype(t)), dx = empty({rows, cols}, t);
    Tensor dg = tensor({cols}, Vec(usize(cols), 0.5), t), dg32 = tensor({cols}, Vec(usize(cols), 0.5), DType::F32);
    rmsnorm_forward(x, gamma, 1e-6, y, rstd);
    rmsnorm_backward(w, x, gamma, rstd, dx, dg);
    std::vector<Vec> out{vals(y), vals(rstd), vals(dx), vals(dg)};
    if (t == DType::BF16) {
      rmsnorm_backward(w, x, gamma, rstd, dx, dg32, &y);
      out.push_back(vals(dx)), out.push_back(vals(dg32));
    }
    return out;
  };
  expect_same_bits_with_1_and_4_threads(kAllDtypes, run_all);
}

// ------------------------------------------------------------ meta device, scratch, refusals

TEST(RmsNorm, MetaDeviceChecksShapesAndPlansTheCudaScratch) {
  const i64 rows = 96, cols = 40;
  for (DeviceKind kernels_of : {DeviceKind::CPU, DeviceKind::CUDA}) {
    const auto meta = make_meta_device(kernels_of);
    const auto t = [&](const Shape& s, DType dt) { return Tensor::empty(meta, s, dt, MC::Other); };
    Tensor x = t({rows, cols}, DType::BF16), g = t({cols}, DType::BF16), rstd = t({rows}, DType::F32);
    Tensor dg = t({cols}, DType::F32);
    rmsnorm_forward(x, g, 1e-5, x, rstd);
    const auto before = meta->memory().snapshot()[MC::Workspace];
    rmsnorm_backward(x, x, g, rstd, x, dg, &x);
    const auto after = meta->memory().snapshot()[MC::Workspace];
    // Standing in for CUDA: dgamma's partial sums, 8 bytes a column for each
    // chunk of rows (96 rows: 3 chunks of 32); the CPU kernels take none.
    const auto chunks = gpu_scratch::column_chunks(rows, cols);
    ASSERT_EQ(chunks.used, 3);
    const i64 want = kernels_of == DeviceKind::CUDA ? chunks.used * cols * 8 : 0;
    EXPECT_EQ(after.allocated_bytes - before.allocated_bytes, want);
    EXPECT_EQ(after.live_bytes, before.live_bytes) << "scratch outlives the call";
    Tensor bad = t({cols + 1}, DType::BF16);
    expect_rejected([&] { rmsnorm_forward(x, bad, 1e-5, x, rstd); }, "rmsnorm_forward: gamma has shape");
    expect_rejected([&] { rmsnorm_backward(x, x, g, t({rows}, DType::BF16), x, dg); },
                    "rmsnorm_backward: rstd must be fp32");
  }
}

TEST(RmsNorm, RefusesBadOperands) {
  for (DType t : kAllDtypes) {
    SCOPED_TRACE(dtype_name(t));
    const DType st = row_stat_dtype(t);
    const DType other = t == DType::F32 ? DType::F64 : DType::F32;
    const std::string name(dtype_name(t));
    Tensor x = zeros({4, 8}, t), y = zeros({4, 8}, t), g = zeros({8}, t), rstd = zeros({4}, st), dg = zeros({8}, t);
    rmsnorm_forward(x, g, 1e-5, y, rstd);  // accepted
    rmsnorm_backward(x, x, g, rstd, y, dg, &x);
    expect_rejected([&] { rmsnorm_forward(x, zeros({7}, t), 1e-5, y, rstd); }, "rmsnorm_forward: gamma has shape (7)");
    expect_rejected([&] { rmsnorm_forward(x, zeros({8}, other), 1e-5, y, rstd); },
                    "rmsnorm_forward: gamma must be " + name);
    expect_rejected([&] { rmsnorm_forward(x, g, 1e-5, out(zeros({4, 9}, t)), rstd); }, "rmsnorm_forward: y has shape");
    expect_rejected(
        [&] {
          rmsnorm_forward(x, g, 1e-5, out(zeros({4, 8}, other)), rstd);
        },
        "rmsnorm_forward: y must be " + name);
    expect_rejected([&] { rmsnorm_forward(x, g, 1e-5, y, out(zeros({5}, st))); },
                    "rmsnorm_forward: rstd must have shape (4)");
    expect_rejected([&] { rmsnorm_forward(x, g, -1.0, y, rstd); }, "eps must be finite and non-negative");
    expect_rejected(
        [&] {
          rmsnorm_forward(zeros({4, 0}, t), zeros({0}, t), 1e-5, out(zeros({4, 0}, t)), rstd);
        },
        "x has no columns");
    expect_rejected(
        [&] {
          rmsnorm_forward(zeros({8, 4}, t).transpose(0, 1), g, 1e-5, y, rstd);
        },
        "rmsnorm_forward: x must be contiguous");
    expect_rejected(
        [&] {
          rmsnorm_backward(x, x, g, rstd, out(zeros({4, 7}, t)), dg);
        },
        "rmsnorm_backward: dx has shape");
    expect_rejected(
        [&] {
          rmsnorm_backward(zeros({4, 8}, other), x, g, rstd, y, dg);
        },
        "rmsnorm_backward: dy must be " + name);
    expect_rejected([&] { rmsnorm_backward(x, x, g, rstd, y, out(zeros({9}, dg.dtype()))); },
                    "rmsnorm_backward: dgamma has shape");
    const Tensor add_bad = zeros({4, 7}, t), add_other = zeros({4, 8}, other);
    expect_rejected([&] { rmsnorm_backward(x, x, g, rstd, y, dg, &add_bad); }, "rmsnorm_backward: add_to_dx has shape");
    expect_rejected([&] { rmsnorm_backward(x, x, g, rstd, y, dg, &add_other); },
                    "rmsnorm_backward: add_to_dx must be " + name);
    expect_rejected([&] { rmsnorm_backward(x, x, g, zeros({3}, st), y, dg); },
                    "rmsnorm_backward: rstd must have shape (4)");
  }
  // Statistics: fp32 for 16-bit activations, else the storage dtype.
  for (DType t : {DType::BF16, DType::F16}) {
    Tensor x = zeros({4, 8}, t), g = zeros({8}, t), r32 = zeros({4}, DType::F32);
    expect_rejected([&] { rmsnorm_forward(x, g, 1e-5, x, out(zeros({4}, t))); },
                    "rmsnorm_forward: rstd must be fp32 (per-row statistics of 16-bit activations are kept in fp32)");
    // dgamma: the storage dtype or fp32, never fp64 or the other 16-bit dtype.
    const DType other16 = t == DType::BF16 ? DType::F16 : DType::BF16;
    rmsnorm_backward(x, x, g, r32, x, out(zeros({8}, DType::F32)));
    expect_rejected([&] { rmsnorm_backward(x, x, g, r32, x, out(zeros({8}, DType::F64))); },
                    "rmsnorm_backward: dgamma must be " + std::string(dtype_name(t)) + " or fp32");
    expect_rejected([&] { rmsnorm_backward(x, x, g, r32, x, out(zeros({8}, other16))); },
                    "rmsnorm_backward: dgamma must be");
  }
  Tensor x32 = zeros({4, 8}, DType::F32), g32 = zeros({8}, DType::F32);
  expect_rejected([&] { rmsnorm_forward(x32, g32, 1e-5, x32, out(zeros({4}, DType::F64))); },
                  "rmsnorm_forward: rstd must be fp32");
  expect_rejected([&] { rmsnorm_backward(x32, x32, g32, zeros({4}, DType::F32), x32, out(zeros({8}, DType::BF16))); },
                  "rmsnorm_backward: dgamma must be fp32 (a gradient accumulator for fp32 activations)");
  Tensor x64 = zeros({4, 8}, DType::F64);
  expect_rejected([&] { rmsnorm_forward(x64, zeros({8}, DType::F64), 1e-5, x64, out(zeros({4}, DType::F32))); },
                  "rmsnorm_forward: rstd must be fp64");
  Tensor xi = zeros({4, 8}, DType::I32);
  expect_rejected([&] { rmsnorm_forward(xi, g32, 1e-5, x32, out(zeros({4}, DType::F32))); },
                  "rmsnorm_forward: x must be fp32, fp64, bf16 or fp16");
}

}  // namespace
