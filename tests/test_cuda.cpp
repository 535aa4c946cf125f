// CPU-vs-GPU agreement: every CUDA kernel against the CPU kernel (the
// reference the CPU suites already prove against finite differences), on
// fresh random inputs, in fp32 and bf16 (with fp32 gradient accumulators);
// then a whole GPT forward/backward and the optimizer step. The tolerances
// are what rounding allows: fp32 results differ by a few ulps (fused
// multiply-adds, another exp), 16-bit results by an occasional last-bit
// rounding; a wrong index or a missing term is off by O(1).
// Without a GPU every test is skipped (the build still compiles and links it).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

#include "layers/gpt_model.h"
#include "megazero/comm/shm_collectives.h"
#include "megazero/comm/virtual_communicator.h"
#include "megazero/cuda/cuda_device.h"
#include "megazero/cuda/optimizer.h"
#include "megazero/kernels/fused_attention.h"
#include "megazero/kernels/rope.h"
#include "megazero/kernels/gemm.h"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/layer_kernels.h"
#include "megazero/optim/adamw.h"
#include "test_device.h"

using namespace megazero;
namespace k = megazero::kernels;

namespace {

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU visible";
    if (!gpu_) gpu_ = make_device(DeviceKind::CUDA, 0);
    cpu = make_device(DeviceKind::CPU);
    gpu = gpu_;
  }
  static inline std::shared_ptr<Device> gpu_;
  std::shared_ptr<Device> cpu, gpu;
  std::mt19937_64 rng{std::random_device{}()};  // fresh inputs every run

  // The same values on both devices.
  struct Pair {
    Tensor c, g;
  };
  Pair random(const Shape& shape, DType dt, double lo = -2, double hi = 2) {
    Tensor c = Tensor::empty(cpu, shape, dt, MemoryCategory::Activations);
    std::uniform_real_distribution<double> u(lo, hi);
    std::vector<double> v(static_cast<std::size_t>(c.numel()));
    for (auto& x : v) x = u(rng);
    c.copy_from_doubles(v);
    Tensor g = Tensor::empty(gpu, shape, dt, MemoryCategory::Activations);
    g.copy_from(c);
    return {c, g};
  }
  Pair zeros(const Shape& shape, DType dt) {
    Tensor c = Tensor::zeros(cpu, shape, dt, MemoryCategory::Activations);
    Tensor g = Tensor::zeros(gpu, shape, dt, MemoryCategory::Activations);
    return {c, g};
  }
  // Poisoned (NaN) outputs: an element the kernel forgets shows up.
  Pair poisoned(const Shape& shape, DType dt) {
    Pair p = zeros(shape, dt);
    std::vector<double> nan(static_cast<std::size_t>(p.c.numel()), std::nan(""));
    p.c.copy_from_doubles(nan);
    p.g.copy_from_doubles(nan);
    return p;
  }
  Pair ids(std::int64_t n, std::int64_t lo, std::int64_t hi) {
    std::uniform_int_distribution<std::int64_t> u(lo, hi - 1);
    std::vector<std::int64_t> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = u(rng);
    return {test_support::int64_tensor(cpu, n, [&](std::int64_t i) { return v[static_cast<std::size_t>(i)]; }),
            test_support::int64_tensor(gpu, n, [&](std::int64_t i) { return v[static_cast<std::size_t>(i)]; })};
  }
};

// ||gpu - cpu|| / max(||cpu||, floor); NaN anywhere fails.
double rel_diff(const Tensor& g, const Tensor& c, double floor = 0.0) {
  const auto a = g.to_double_vector(), b = c.to_double_vector();
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  den = std::max(std::sqrt(den), floor);
  return den > 0 ? std::sqrt(num) / den : std::sqrt(num);
}

double norm(const Tensor& t) {
  double s = 0;
  for (double x : t.to_double_vector()) s += x * x;
  return std::sqrt(s);
}

double tol(DType dt) { return dt == DType::F32 ? 2e-6 : 8e-3; }
// Parameter-gradient accumulators: fp32 (the storage dtype for fp32, Megatron's fp32 main grads for 16-bit).
DType acc_of(DType) { return DType::F32; }

const DType kTypes[] = {DType::F32, DType::BF16, DType::F16};

}  // namespace

// 12288 (GPT-3's hidden) and 20480 cover the fast kernels' 8 packs a thread at
// 256 and 512 threads (the backward's, over a 512-thread block's registers,
// must give way to the general kernel there rather than fail to launch).
TEST_F(Cuda, LayerNormForwardAndBackward) {
  for (DType dt : kTypes)
    for (std::int64_t cols : {64, 1000, 4096, 12288, 20480}) {
      const std::int64_t rows = 37;
      auto x = random({rows, cols}, dt), gamma = random({cols}, dt, 0.5, 1.5), beta = random({cols}, dt);
      auto y = poisoned({rows, cols}, dt);
      auto mean = poisoned({rows}, k::row_stat_dtype(dt)), rstd = poisoned({rows}, k::row_stat_dtype(dt));
      k::layernorm_forward(x.c, gamma.c, beta.c, 1e-5, y.c, mean.c, rstd.c);
      k::layernorm_forward(x.g, gamma.g, beta.g, 1e-5, y.g, mean.g, rstd.g);
      // The GPU keeps fp32 statistics (the CPU double): a few fp32 ulps apart.
      const double ln_tol = dt == DType::F32 ? 1e-5 : tol(dt);
      EXPECT_LE(rel_diff(y.g, y.c), ln_tol) << dtype_name(dt) << " cols " << cols;
      EXPECT_LE(rel_diff(rstd.g, rstd.c), 1e-5);
      auto dy = random({rows, cols}, dt), dx = poisoned({rows, cols}, dt);
      auto dgamma = random({cols}, acc_of(dt)), dbeta = random({cols}, acc_of(dt));  // accumulated into
      k::layernorm_backward(dy.c, x.c, gamma.c, mean.c, rstd.c, dx.c, dgamma.c, dbeta.c);
      k::layernorm_backward(dy.g, x.g, gamma.g, mean.g, rstd.g, dx.g, dgamma.g, dbeta.g);
      EXPECT_LE(rel_diff(dx.g, dx.c), ln_tol) << dtype_name(dt);
      auto res = random({rows, cols}, dt), dx2 = poisoned({rows, cols}, dt);  // the residual-gradient form
      k::layernorm_backward(dy.c, x.c, gamma.c, mean.c, rstd.c, dx2.c, dgamma.c, dbeta.c, &res.c);
      k::layernorm_backward(dy.g, x.g, gamma.g, mean.g, rstd.g, dx2.g, dgamma.g, dbeta.g, &res.g);
      EXPECT_LE(rel_diff(dx2.g, dx2.c), ln_tol) << dtype_name(dt) << " with residual";
      EXPECT_LE(rel_diff(dgamma.g, dgamma.c), 1e-5) << dtype_name(dt);
      EXPECT_LE(rel_diff(dbeta.g, dbeta.c), 1e-6) << dtype_name(dt);
    }
}

// The one-pass backward at the benchmarks' widths over enough rows for many
// blocks and many rows a lane (GPT-2 medium: 4 lanes of 128 threads; the
// 100B layer: two packs a thread, 96 KB of shared memory a block), against the
// split path on the same GPU and against the CPU.
TEST_F(Cuda, LayerNormOnePassBackwardMatchesTheSplitOne) {
  for (const auto& [rows, cols] : std::vector<std::pair<std::int64_t, std::int64_t>>{{5000, 1024}, {2000, 8192}}) {
    const DType dt = DType::BF16;
    ASSERT_TRUE(k::gpu_scratch::layernorm_fused_plan(dt, rows, cols).fused());
    auto x = random({rows, cols}, dt), gamma = random({cols}, dt, 0.5, 1.5), beta = random({cols}, dt);
    auto y = zeros({rows, cols}, dt), mean = zeros({rows}, DType::F32), rstd = zeros({rows}, DType::F32);
    k::layernorm_forward(x.g, gamma.g, beta.g, 1e-5, y.g, mean.g, rstd.g);
    mean.c.copy_from(mean.g);  // the CPU takes the GPU's statistics: only the backward differs
    rstd.c.copy_from(rstd.g);
    auto dy = random({rows, cols}, dt), res = random({rows, cols}, dt);
    auto dgamma = random({cols}, DType::F32), dbeta = random({cols}, DType::F32);
    Tensor dg_split = dgamma.g.clone(MemoryCategory::Other), db_split = dbeta.g.clone(MemoryCategory::Other);
    auto dx = poisoned({rows, cols}, dt), dx_split = poisoned({rows, cols}, dt);
    k::layernorm_backward(dy.c, x.c, gamma.c, mean.c, rstd.c, dx.c, dgamma.c, dbeta.c, &res.c);
    k::layernorm_backward(dy.g, x.g, gamma.g, mean.g, rstd.g, dx.g, dgamma.g, dbeta.g, &res.g);
    k::layernorm_backward(dy.g, x.g, gamma.g, mean.g, rstd.g, dx_split.g, dg_split, db_split, &res.g,
                          k::LayerNormBackwardPasses::Split);
    EXPECT_LE(rel_diff(dx.g, dx.c), tol(dt)) << cols;
    EXPECT_LE(rel_diff(dx.g, dx_split.g), tol(dt)) << cols;
    EXPECT_LE(rel_diff(dgamma.g, dgamma.c), 1e-5) << cols;
    EXPECT_LE(rel_diff(dbeta.g, dbeta.c), 1e-6) << cols;
    EXPECT_LE(rel_diff(dgamma.g, dg_split), 1e-5) << cols;
    EXPECT_LE(rel_diff(dbeta.g, db_split), 1e-6) << cols;
    // Fixed order, no atomics: a second run gives the same bits.
    auto dx2 = poisoned({rows, cols}, dt);
    Tensor dg2 = dgamma.g.clone(MemoryCategory::Other), db2 = dbeta.g.clone(MemoryCategory::Other);
    Tensor dg1 = dgamma.g.clone(MemoryCategory::Other), db1 = dbeta.g.clone(MemoryCategory::Other);
    Tensor dg3 = dgamma.g.clone(MemoryCategory::Other), db3 = dbeta.g.clone(MemoryCategory::Other);
    k::layernorm_backward(dy.g, x.g, gamma.g, mean.g, rstd.g, dx2.g, dg1, db1, &res.g);
    k::layernorm_backward(dy.g, x.g, gamma.g, mean.g, rstd.g, dx2.g, dg2, db2, &res.g);
    EXPECT_EQ(dg1.to_double_vector(), dg2.to_double_vector());
    EXPECT_EQ(db1.to_double_vector(), db2.to_double_vector());
    EXPECT_EQ(dx2.g.to_double_vector(), dx.g.to_double_vector());
    // The prefetched alternative (bench_kernels): the same arithmetic, the same bits.
    auto dx3 = poisoned({rows, cols}, dt);
    k::layernorm_backward(dy.g, x.g, gamma.g, mean.g, rstd.g, dx3.g, dg3, db3, &res.g,
                          k::LayerNormBackwardPasses::OnePassPrefetched);
    EXPECT_EQ(dx3.g.to_double_vector(), dx.g.to_double_vector());
    EXPECT_EQ(dg3.to_double_vector(), dg2.to_double_vector());
    EXPECT_EQ(db3.to_double_vector(), db2.to_double_vector());
  }
}

// The attention output dropout's backward in LayerNorm's backward pass
// (kernels::layernorm_backward_dropout): dx the one-pass kernel's bits, the
// dropout's gradient the separate dropout backward's bits (same mask), the
// bias gradient its sums in another order. Shapes: one pack a thread, two
// (the default prefetches every row and sums the bias in the kernel either
// way; bf16 and fp32), a width the one-pass kernel does not take and mixed
// accumulator dtypes (both: the two calls). Then the one pass without the
// prefetch (bench_kernels' alternative): the same bits but the bias's, which
// it sums after the kernel with two packs a thread.
TEST_F(Cuda, LayerNormBackwardWithTheDropoutBackwardInOnePass) {
  struct Case {
    std::int64_t rows, cols;
    DType dt, bias_acc;
  };
  for (const Case& c : std::vector<Case>{{5000, 1024, DType::BF16, DType::F32},
                                         {2000, 8192, DType::BF16, DType::F32},
                                         {777, 1024, DType::F32, DType::F32},
                                         {1000, 4096, DType::F32, DType::F32},
                                         {300, 1002, DType::BF16, DType::F32},
                                         {600, 1024, DType::BF16, DType::BF16}}) {
    SCOPED_TRACE(std::to_string(c.rows) + " x " + std::to_string(c.cols) + " " + std::string(dtype_name(c.dt)));
    const DType dt = c.dt;
    const std::int64_t rows = c.rows, cols = c.cols;
    auto x = random({rows, cols}, dt), gamma = random({cols}, dt, 0.5, 1.5), beta = random({cols}, dt);
    auto y = zeros({rows, cols}, dt), mean = zeros({rows}, DType::F32), rstd = zeros({rows}, DType::F32);
    k::layernorm_forward(x.g, gamma.g, beta.g, 1e-5, y.g, mean.g, rstd.g);
    auto dy = random({rows, cols}, dt), res = random({rows, cols}, dt);
    auto dgamma = random({cols}, DType::F32), dbeta = random({cols}, DType::F32), dbias = random({cols}, c.bias_acc);
    Tensor dg2 = dgamma.g.clone(MemoryCategory::Other), db2 = dbeta.g.clone(MemoryCategory::Other),
           dbias2 = dbias.g.clone(MemoryCategory::Other);
    Tensor dg4 = dgamma.g.clone(MemoryCategory::Other), db4 = dbeta.g.clone(MemoryCategory::Other),
           dbias4 = dbias.g.clone(MemoryCategory::Other);
    const k::DropoutLayout layout{rows, 1, 1, cols, 4 * rows + 3, 1, 2};  // global rows 2 (4 rows + 3) + 1 + 2 r
    const RngKey key{7, 1234, 5, kRngAttentionOutputDropout};
    auto dx = poisoned({rows, cols}, dt), dd = poisoned({rows, cols}, dt);
    k::layernorm_backward_dropout(dy.g, x.g, gamma.g, mean.g, rstd.g, dx.g, dgamma.g, dbeta.g, &res.g,
                                  k::DropoutBackwardOf{0.1, key, layout, &dd.g, &dbias.g});
    // The two calls on the GPU.
    auto dx2 = poisoned({rows, cols}, dt), dd2 = poisoned({rows, cols}, dt);
    k::layernorm_backward(dy.g, x.g, gamma.g, mean.g, rstd.g, dx2.g, dg2, db2, &res.g);
    k::dropout_backward_bias_grad(dx2.g, 0.1, key, layout, dd2.g, dbias2);
    EXPECT_EQ(dx.g.to_double_vector(), dx2.g.to_double_vector());
    EXPECT_EQ(dd.g.to_double_vector(), dd2.g.to_double_vector());
    EXPECT_EQ(dgamma.g.to_double_vector(), dg2.to_double_vector());
    EXPECT_EQ(dbeta.g.to_double_vector(), db2.to_double_vector());
    EXPECT_LE(rel_diff(dbias.g, dbias2), c.bias_acc == DType::F32 ? 1e-6 : 8e-3);
    // And the CPU's dropout of the GPU's dx: the same mask and rounding.
    dx.c.copy_from(dx.g);
    k::dropout_backward_bias_grad(dx.c, 0.1, key, layout, dd.c, dbias.c);
    EXPECT_EQ(dd.g.to_double_vector(), dd.c.to_double_vector());
    EXPECT_LE(rel_diff(dbias.g, dbias.c), c.bias_acc == DType::F32 ? 1e-6 : 8e-3);
    // Without a bias: the dropout's gradient alone.
    auto dd3 = poisoned({rows, cols}, dt);
    k::layernorm_backward_dropout(dy.g, x.g, gamma.g, mean.g, rstd.g, dx2.g, dg2, db2, &res.g,
                                  k::DropoutBackwardOf{0.1, key, layout, &dd3.g, nullptr});
    EXPECT_EQ(dd3.g.to_double_vector(), dd.g.to_double_vector());
    // The one pass without every row prefetched (the default, Auto, is
    // OnePassPrefetched), from the same accumulators' start.
    auto dx4 = poisoned({rows, cols}, dt), dd4 = poisoned({rows, cols}, dt);
    k::layernorm_backward_dropout(dy.g, x.g, gamma.g, mean.g, rstd.g, dx4.g, dg4, db4, &res.g,
                                  k::DropoutBackwardOf{0.1, key, layout, &dd4.g, &dbias4},
                                  k::LayerNormBackwardPasses::OnePass);
    EXPECT_EQ(dx4.g.to_double_vector(), dx.g.to_double_vector());
    EXPECT_EQ(dd4.g.to_double_vector(), dd.g.to_double_vector());
    EXPECT_EQ(dg4.to_double_vector(), dgamma.g.to_double_vector());
    EXPECT_EQ(db4.to_double_vector(), dbeta.g.to_double_vector());
    EXPECT_LE(rel_diff(dbias4, dbias.g), c.bias_acc == DType::F32 ? 1e-6 : 8e-3);
  }
}

// The attention output's bias-dropout-add in LN2's forward pass
// (kernels::bias_dropout_add_layernorm): the sum, the output and the
// statistics the two calls' bits, in place over y as the layer runs it and
// apart; a width the fast forward does not take (the two calls).
TEST_F(Cuda, BiasDropoutAddInTheLayerNormForwardPass) {
  struct Case {
    std::int64_t rows, cols;
    DType dt;
    bool in_place;
  };
  for (const Case& c : std::vector<Case>{{5000, 1024, DType::BF16, true},
                                         {300, 8192, DType::BF16, false},
                                         {777, 1024, DType::F32, true},
                                         {300, 1002, DType::BF16, true}}) {
    SCOPED_TRACE(std::to_string(c.rows) + " x " + std::to_string(c.cols) + " " + std::string(dtype_name(c.dt)));
    const DType dt = c.dt;
    const std::int64_t rows = c.rows, cols = c.cols;
    auto y = random({rows, cols}, dt), res = random({rows, cols}, dt), bias = random({cols}, dt);
    auto gamma = random({cols}, dt, 0.5, 1.5), beta = random({cols}, dt);
    const k::DropoutLayout layout{rows, 1, 1, cols, 2 * rows + 1, 0, 1};
    const RngKey key{11, 99, 4, kRngAttentionOutputDropout};
    // The two calls.
    auto sum2 = poisoned({rows, cols}, dt), out2 = poisoned({rows, cols}, dt);
    auto mean2 = poisoned({rows}, DType::F32), rstd2 = poisoned({rows}, DType::F32);
    k::bias_dropout_add(y.g, bias.g, res.g, 0.1, key, layout, sum2.g);
    k::layernorm_forward(sum2.g, gamma.g, beta.g, 1e-5, out2.g, mean2.g, rstd2.g);
    // One pass.
    Tensor yg = y.g.clone(MemoryCategory::Other);
    auto apart = poisoned({rows, cols}, dt);
    Tensor sum = c.in_place ? yg : apart.g;
    auto out = poisoned({rows, cols}, dt), mean = poisoned({rows}, DType::F32), rstd = poisoned({rows}, DType::F32);
    k::bias_dropout_add_layernorm(yg, k::BiasDropoutAddOf{&bias.g, &res.g, 0.1, key, layout, &sum}, gamma.g, beta.g,
                                  1e-5, out.g, mean.g, rstd.g);
    EXPECT_EQ(sum.to_double_vector(), sum2.g.to_double_vector());
    EXPECT_EQ(out.g.to_double_vector(), out2.g.to_double_vector());
    EXPECT_EQ(mean.g.to_double_vector(), mean2.g.to_double_vector());
    EXPECT_EQ(rstd.g.to_double_vector(), rstd2.g.to_double_vector());
    // And the CPU's sum: the same mask and rounding.
    k::bias_dropout_add(y.c, bias.c, res.c, 0.1, key, layout, sum2.c);
    EXPECT_EQ(sum.to_double_vector(), sum2.c.to_double_vector());
  }
}

TEST_F(Cuda, ElementwiseKernels) {
  for (DType dt : kTypes) {
    const Shape sh{53, 300};
    auto x = random(sh, dt), dy = random(sh, dt), y = poisoned(sh, dt), dx = poisoned(sh, dt);
    k::gelu_forward(x.c, y.c);
    k::gelu_forward(x.g, y.g);
    EXPECT_LE(rel_diff(y.g, y.c), tol(dt)) << "gelu " << dtype_name(dt);
    k::gelu_backward(dy.c, x.c, dx.c);
    k::gelu_backward(dy.g, x.g, dx.g);
    EXPECT_LE(rel_diff(dx.g, dx.c), tol(dt)) << "gelu backward " << dtype_name(dt);
    auto sq = poisoned(sh, dt), dsq = poisoned(sh, dt);  // --squared-relu: the CPU's bits
    k::squared_relu_forward(x.c, sq.c);
    k::squared_relu_forward(x.g, sq.g);
    EXPECT_EQ(sq.g.to_double_vector(), sq.c.to_double_vector()) << "squared_relu " << dtype_name(dt);
    k::squared_relu_backward(dy.c, x.c, dsq.c);
    k::squared_relu_backward(dy.g, x.g, dsq.g);
    EXPECT_EQ(dsq.g.to_double_vector(), dsq.c.to_double_vector()) << "squared_relu backward " << dtype_name(dt);
    auto bias = random({300}, dt);
    k::add_bias(y.c, bias.c);
    k::add_bias(y.g, bias.g);
    EXPECT_LE(rel_diff(y.g, y.c), tol(dt)) << "add_bias";
    auto db = random({300}, acc_of(dt));
    k::bias_grad(dy.c, db.c);
    k::bias_grad(dy.g, db.g);
    EXPECT_LE(rel_diff(db.g, db.c), 1e-6) << "bias_grad";
    // The bias-GeLU fusion: forward, and backward's dx (aliasing dy) with the
    // bias gradient summed in the same pass.
    k::bias_gelu_forward(x.c, bias.c, y.c);
    k::bias_gelu_forward(x.g, bias.g, y.g);
    EXPECT_LE(rel_diff(y.g, y.c), tol(dt)) << "bias_gelu_forward " << dtype_name(dt);
    auto dyf = random(x.c.shape(), dt), dbf = random({300}, acc_of(dt));
    k::bias_gelu_backward(dyf.c, x.c, bias.c, dyf.c, dbf.c);
    k::bias_gelu_backward(dyf.g, x.g, bias.g, dyf.g, dbf.g);
    EXPECT_LE(rel_diff(dyf.g, dyf.c), tol(dt)) << "bias_gelu_backward dx " << dtype_name(dt);
    EXPECT_LE(rel_diff(dbf.g, dbf.c), 2 * tol(dt)) << "bias_gelu_backward dbias " << dtype_name(dt);
    // Without a bias (x holds it, as fc1's forward epilogue leaves pre): the null-bias kernel path.
    auto dyn = random(x.c.shape(), dt), dbn = random({300}, acc_of(dt));
    k::bias_gelu_backward(dyn.c, x.c, Tensor(), dyn.c, dbn.c);
    k::bias_gelu_backward(dyn.g, x.g, Tensor(), dyn.g, dbn.g);
    EXPECT_LE(rel_diff(dyn.g, dyn.c), tol(dt)) << "bias_gelu_backward without a bias, dx " << dtype_name(dt);
    EXPECT_LE(rel_diff(dbn.g, dbn.c), 2 * tol(dt)) << "bias_gelu_backward without a bias, dbias " << dtype_name(dt);
    k::add(x.c, dy.c, y.c);
    k::add(x.g, dy.g, y.g);
    EXPECT_LE(rel_diff(y.g, y.c), tol(dt)) << "add";
    k::axpy(-0.37, x.c, y.c);
    k::axpy(-0.37, x.g, y.g);
    EXPECT_LE(rel_diff(y.g, y.c), tol(dt)) << "axpy";
    k::scale(y.c, 1.7);
    k::scale(y.g, 1.7);
    EXPECT_LE(rel_diff(y.g, y.c), tol(dt)) << "scale";
  }
}

TEST_F(Cuda, CausalSoftmaxInPlaceAndBackward) {
  for (DType dt : kTypes)
    for (std::int64_t n : {7, 128, 1024}) {
      auto s = random({3, n, n}, dt, -6, 6);
      k::causal_softmax_forward(s.c, 0.125, s.c);  // in place, as attention does
      k::causal_softmax_forward(s.g, 0.125, s.g);
      EXPECT_LE(rel_diff(s.g, s.c), tol(dt)) << dtype_name(dt) << " n " << n;
      auto dp = random({3, n, n}, dt);
      k::causal_softmax_backward(dp.c, s.c, 0.125, dp.c);
      k::causal_softmax_backward(dp.g, s.g, 0.125, dp.g);
      EXPECT_LE(rel_diff(dp.g, dp.c), tol(dt) * 4) << dtype_name(dt) << " n " << n;
      // A key/value cache's step: the last few queries over all n keys (the warp and the block kernels).
      for (std::int64_t sq : {std::int64_t{1}, std::int64_t{5}}) {
        auto last = random({3, sq, n}, dt, -6, 6);
        k::causal_softmax_forward(last.c, 0.125, last.c);
        k::causal_softmax_forward(last.g, 0.125, last.g);
        EXPECT_LE(rel_diff(last.g, last.c), tol(dt)) << dtype_name(dt) << " sq " << sq << " n " << n;
      }
    }
}

// Documents packed into samples (--reset-attention-mask, --reset-position-ids):
// the softmax within each document (warp and block kernels) and RoPE at
// per-token positions give the CPU's results.
TEST_F(Cuda, PerDocumentSoftmaxAndPositions) {
  const std::int64_t samples = 2, heads = 3;
  for (std::int64_t n : {7, 128, 1030}) {
    Tensor starts_c = Tensor::empty(cpu, {samples * n}, DType::I64, MemoryCategory::Activations);
    Tensor pos_c = Tensor::empty(cpu, {samples * n}, DType::I64, MemoryCategory::Activations);
    for (std::int64_t b = 0; b < samples; ++b)
      for (std::int64_t i = 0, start = 0; i < n; ++i) {
        if (i > 0 && (i * 7 + b) % 5 == 0) start = i;  // a document starts at row i
        starts_c.host_data<std::int64_t>()[b * n + i] = start;
        pos_c.host_data<std::int64_t>()[b * n + i] = i - start;
      }
    Tensor starts_g = Tensor::empty(gpu, {samples * n}, DType::I64, MemoryCategory::Activations);
    Tensor pos_g = Tensor::empty(gpu, {samples * n}, DType::I64, MemoryCategory::Activations);
    starts_g.copy_from(starts_c);
    pos_g.copy_from(pos_c);
    for (DType dt : kTypes) {
      auto s = random({samples * heads, n, n}, dt, -6, 6);
      k::causal_softmax_forward(s.c, 0.125, s.c, starts_c);
      k::causal_softmax_forward(s.g, 0.125, s.g, starts_g);
      EXPECT_LE(rel_diff(s.g, s.c), tol(dt)) << dtype_name(dt) << " n " << n;
      auto dp = random({samples * heads, n, n}, dt);
      k::causal_softmax_backward(dp.c, s.c, 0.125, dp.c, starts_c);
      k::causal_softmax_backward(dp.g, s.g, 0.125, dp.g, starts_g);
      EXPECT_LE(rel_diff(dp.g, dp.c), tol(dt) * 4) << dtype_name(dt) << " n " << n;
      auto x = random({samples * heads, n, 64}, dt);
      k::rope_forward(x.c, 10000.0, x.c, 0, pos_c);
      k::rope_forward(x.g, 10000.0, x.g, 0, pos_g);
      EXPECT_LE(rel_diff(x.g, x.c), tol(dt)) << "rope " << dtype_name(dt) << " n " << n;
      k::rope_backward(x.c, 10000.0, x.c, 0, pos_c);
      k::rope_backward(x.g, 10000.0, x.g, 0, pos_g);
      EXPECT_LE(rel_diff(x.g, x.c), tol(dt)) << "rope backward " << dtype_name(dt) << " n " << n;
    }
  }
}

// RoPE from a first position (a key/value cache's new tokens): the CPU's rows.
TEST_F(Cuda, RopeFromAFirstPosition) {
  for (DType dt : kTypes) {
    auto x = random({4, 3, 64}, dt);
    k::rope_forward(x.c, 10000.0, x.c, 1021);
    k::rope_forward(x.g, 10000.0, x.g, 1021);
    EXPECT_LE(rel_diff(x.g, x.c), tol(dt)) << dtype_name(dt);
    // --rotary-interleaved's pairs (2i, 2i + 1), forward and backward.
    k::rope_forward(x.c, 10000.0, x.c, 7, Tensor(), 1.0, true);
    k::rope_forward(x.g, 10000.0, x.g, 7, Tensor(), 1.0, true);
    EXPECT_LE(rel_diff(x.g, x.c), tol(dt)) << "interleaved " << dtype_name(dt);
    k::rope_backward(x.c, 10000.0, x.c, 7, Tensor(), 1.0, true);
    k::rope_backward(x.g, 10000.0, x.g, 7, Tensor(), 1.0, true);
    EXPECT_LE(rel_diff(x.g, x.c), tol(dt)) << "interleaved backward " << dtype_name(dt);
    // --use-rope-scaling (Llama 3's frequencies, rope_frequencies.h's one formula on the device), at
    // positions where the bands' angles differ.
    k::rope_forward(x.c, 500000.0, x.c, 3000, Tensor(), 1.0, false, 32.0);
    k::rope_forward(x.g, 500000.0, x.g, 3000, Tensor(), 1.0, false, 32.0);
    EXPECT_LE(rel_diff(x.g, x.c), tol(dt)) << "Llama 3 scaling " << dtype_name(dt);
    k::rope_backward(x.c, 500000.0, x.c, 3000, Tensor(), 1.0, false, 32.0);
    k::rope_backward(x.g, 500000.0, x.g, 3000, Tensor(), 1.0, false, 32.0);
    EXPECT_LE(rel_diff(x.g, x.c), tol(dt)) << "Llama 3 scaling backward " << dtype_name(dt);
  }
}

TEST_F(Cuda, DropoutMaskIsTheCpuMaskBitForBit) {
  // 9 x 11 odd: Philox blocks straddle rows (element by element). 512 x 512:
  // the packed kernel, ~4 packs a thread of its one wave, so each thread
  // walks the layout (rows, groups, samples) over several.
  const k::DropoutLayout layouts[] = {{3, 2, 9, 11, 5, 1, 4}, {4, 4, 512, 512, 3, 2, 8}};
  for (DType dt : kTypes)
    for (const k::DropoutLayout& l : layouts) {
      auto x = random({l.samples * l.groups * l.matrix_rows * l.matrix_cols}, dt, 0.5,
                      1.5);  // never 0: a 0 output means dropped
      auto y = poisoned(x.c.shape(), dt);
      const RngKey key{1234, 77, 3, kRngAttentionDropout};
      k::dropout_forward(x.c, 0.3, key, l, y.c);
      k::dropout_forward(x.g, 0.3, key, l, y.g);
      const auto a = y.g.to_double_vector(), b = y.c.to_double_vector();
      int dropped = 0;
      for (std::size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(a[i] == 0, b[i] == 0) << "mask differs at " << i;
        dropped += b[i] == 0;
      }
      EXPECT_GT(dropped, 0);
      EXPECT_LE(rel_diff(y.g, y.c), tol(dt));
    }
}

TEST_F(Cuda, BiasDropoutAddMatchesCpu) {
  // The second layout has ~4x as many packs as the packed kernel's one wave
  // of threads, so each thread walks the layout and the bias over several.
  for (DType dt : kTypes)
    for (const k::DropoutLayout& l :
         {k::DropoutLayout{3, 1, 17, 96, 2, 0, 1}, k::DropoutLayout{8, 1, 512, 1024, 3, 0, 1}}) {
      const std::int64_t rows = l.samples * l.matrix_rows, cols = l.matrix_cols;
      auto y = random({rows, cols}, dt), bias = random({cols}, dt), res = random({rows, cols}, dt);
      const RngKey key{5, 6, 7, kRngAttentionOutputDropout};
      k::bias_dropout_add(y.c, bias.c, res.c, 0.2, key, l, y.c);  // in place, as the layer does
      k::bias_dropout_add(y.g, bias.g, res.g, 0.2, key, l, y.g);
      EXPECT_LE(rel_diff(y.g, y.c), tol(dt)) << dtype_name(dt);
    }
}

// Documents packed into samples (--reset-attention-mask): the flash kernels'
// per-document masks (key tiles skipped before a query tile's first start,
// boundaries at and inside tiles, grouped k/v heads) against the CPU's fused
// attention with the same starts.
TEST_F(Cuda, FusedAttentionWithDocumentsMatchesTheCpu) {
  const std::int64_t samples = 2, heads = 4, group = 2, s = 200, d = 64, bh = samples * heads;
  Tensor starts_c = Tensor::empty(cpu, {samples * s}, DType::I64, MemoryCategory::Activations);
  for (std::int64_t b = 0; b < samples; ++b)
    for (std::int64_t i = 0, start = 0; i < s; ++i) {
      if (b == 0 ? (i == 64 || i == 65 || i == 130) : (i == 10 || i == 100 || i == 140)) start = i;
      starts_c.host_data<std::int64_t>()[b * s + i] = start;
    }
  Tensor starts_g = Tensor::empty(gpu, {samples * s}, DType::I64, MemoryCategory::Activations);
  starts_g.copy_from(starts_c);
  for (DType dt : {DType::BF16, DType::F16})
    for (double p : {0.0, 0.2}) {
      const Shape shape{bh, s, d}, kv_shape{bh / group, s, d};
      k::DropoutLayout l;
      l.samples = samples, l.groups = heads, l.matrix_rows = l.matrix_cols = s, l.sample_offset = 1, l.group_offset = 0,
      l.global_groups = heads;
      const RngKey key{3, 4, 1, kRngAttentionDropout};
      const double scale = 1.0 / std::sqrt(static_cast<double>(d));
      auto q = random(shape, dt), kk = random(kv_shape, dt), v = random(kv_shape, dt), dout = random(shape, dt);
      auto f32 = [&](const Tensor& t) { return t.to(DType::F32, MemoryCategory::Activations); };
      const Tensor qc = f32(q.c), kc = f32(kk.c), vc = f32(v.c), doc = f32(dout.c);
      Tensor out_c = Tensor::empty(cpu, shape, DType::F32, MemoryCategory::Activations);
      Tensor lse_c = Tensor::empty(cpu, {bh, s}, DType::F32, MemoryCategory::Activations);
      auto out = poisoned(shape, dt);
      auto lse = poisoned({bh, s}, DType::F32);
      k::fused_attention_forward(qc, kc, vc, scale, p, key, l, out_c, lse_c, starts_c);
      k::fused_attention_forward(q.g, kk.g, v.g, scale, p, key, l, out.g, lse.g, starts_g);
      const std::string what = std::string(dtype_name(dt)) + " p " + std::to_string(p);
      const double t = dt == DType::BF16 ? 2e-2 : 4e-3;
      EXPECT_LE(rel_diff(out.g, out_c), t) << "out " << what;
      EXPECT_LE(rel_diff(lse.g, lse_c), 1e-4) << "lse " << what;
      Tensor dq_c = Tensor::empty(cpu, shape, DType::F32, MemoryCategory::Activations);
      Tensor dk_c = Tensor::empty(cpu, shape, DType::F32, MemoryCategory::Activations);
      Tensor dv_c = Tensor::empty(cpu, shape, DType::F32, MemoryCategory::Activations);
      auto dq = poisoned(shape, dt), dk = poisoned(shape, dt), dv = poisoned(shape, dt);
      k::fused_attention_backward(qc, kc, vc, out_c, doc, lse_c, scale, p, key, l, dq_c, dk_c, dv_c, starts_c);
      k::fused_attention_backward(q.g, kk.g, v.g, out.g, dout.g, lse.g, scale, p, key, l, dq.g, dk.g, dv.g, starts_g);
      EXPECT_LE(rel_diff(dq.g, dq_c), 2 * t) << "dq " << what;
      EXPECT_LE(rel_diff(dk.g, dk_c), 2 * t) << "dk " << what;
      EXPECT_LE(rel_diff(dv.g, dv_c), 2 * t) << "dv " << what;
    }
}

TEST_F(Cuda, FusedAttentionMatchesTheCpu) {
  // The GPU's bf16/fp16 flash kernels against the CPU's fused attention in
  // fp32 on the same (16-bit representable) inputs: ragged tiles (s = 100,
  // 200), padded head sizes (40 -> 64), one element (s = 1), with and without
  // dropout (a wrong mask is off by O(1), far outside the tolerance).
  struct Case {
    std::int64_t samples, heads, s, d;
  };
  for (DType dt : {DType::BF16, DType::F16})
    for (const Case& c : {Case{1, 1, 1, 64}, Case{2, 2, 100, 64}, Case{1, 3, 200, 128}, Case{2, 1, 130, 40}})
      for (double p : {0.0, 0.2}) {
        const std::int64_t bh = c.samples * c.heads;
        const Shape shape{bh, c.s, c.d};
        k::DropoutLayout l;
        l.samples = c.samples, l.groups = c.heads, l.matrix_rows = l.matrix_cols = c.s, l.sample_offset = 3,
        l.group_offset = 1, l.global_groups = c.heads + 2;
        const RngKey key{11, 5, 2, kRngAttentionDropout};
        const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
        auto q = random(shape, dt), kk = random(shape, dt), v = random(shape, dt), dout = random(shape, dt);
        auto f32 = [&](const Tensor& t) { return t.to(DType::F32, MemoryCategory::Activations); };
        const Tensor qc = f32(q.c), kc = f32(kk.c), vc = f32(v.c), doc = f32(dout.c);
        Tensor out_c = Tensor::empty(cpu, shape, DType::F32, MemoryCategory::Activations);
        Tensor lse_c = Tensor::empty(cpu, {bh, c.s}, DType::F32, MemoryCategory::Activations);
        auto out = poisoned(shape, dt);
        auto lse = poisoned({bh, c.s}, DType::F32);
        k::fused_attention_forward(qc, kc, vc, scale, p, key, l, out_c, lse_c);
        k::fused_attention_forward(q.g, kk.g, v.g, scale, p, key, l, out.g, lse.g);
        const std::string what = std::string(dtype_name(dt)) + " s " + std::to_string(c.s) + " d " +
                                 std::to_string(c.d) + " p " + std::to_string(p);
        const double t = dt == DType::BF16 ? 2e-2 : 4e-3;
        EXPECT_LE(rel_diff(out.g, out_c), t) << "out " << what;
        EXPECT_LE(rel_diff(lse.g, lse_c), 1e-4) << "lse " << what;  // wrong units would be off by ~40%
        Tensor dq_c = Tensor::empty(cpu, shape, DType::F32, MemoryCategory::Activations);
        Tensor dk_c = Tensor::empty(cpu, shape, DType::F32, MemoryCategory::Activations);
        Tensor dv_c = Tensor::empty(cpu, shape, DType::F32, MemoryCategory::Activations);
        auto dq = poisoned(shape, dt), dk = poisoned(shape, dt), dv = poisoned(shape, dt);
        // Both backwards from the GPU's forward results (the CPU's in fp32), so
        // only the backward kernels differ.
        auto host32 = [&](const Tensor& x) {
          Tensor h = Tensor::empty(cpu, x.shape(), DType::F32, MemoryCategory::Activations);
          h.copy_from(x);
          return h;
        };
        k::fused_attention_backward(qc, kc, vc, host32(out.g), doc, host32(lse.g), scale, p, key, l, dq_c, dk_c, dv_c);
        k::fused_attention_backward(q.g, kk.g, v.g, out.g, dout.g, lse.g, scale, p, key, l, dq.g, dk.g, dv.g);
        // With one key the softmax has no gradient: dq and dk are 0 but for
        // rounding, so they are measured against dv's size there.
        const double floor = c.s == 1 ? norm(dv_c) : 0.0;
        EXPECT_LE(rel_diff(dq.g, dq_c, floor), 2 * t) << "dq " << what;
        EXPECT_LE(rel_diff(dk.g, dk_c, floor), 2 * t) << "dk " << what;
        EXPECT_LE(rel_diff(dv.g, dv_c), 2 * t) << "dv " << what;
        // Bit-for-bit repeatable: no atomics.
        auto dq2 = poisoned(shape, dt), dk2 = poisoned(shape, dt), dv2 = poisoned(shape, dt);
        k::fused_attention_backward(q.g, kk.g, v.g, out.g, dout.g, lse.g, scale, p, key, l, dq2.g, dk2.g, dv2.g);
        EXPECT_EQ(rel_diff(dq2.g, dq.g), 0.0) << what;
        EXPECT_EQ(rel_diff(dk2.g, dk.g), 0.0) << what;
        EXPECT_EQ(rel_diff(dv2.g, dv.g), 0.0) << what;
      }
}

// The dropout backward with the bias gradient in one pass (a row of the layout
// shorter than a row of the tensor, so threads' columns cross layout rows).
TEST_F(Cuda, DropoutBackwardWithBiasGradientMatchesCpu) {
  // Whole groups of four (the aligned kernel: four-column accesses, the layout
  // walked) and rows of 35 (element by element).
  const std::pair<k::DropoutLayout, std::int64_t> cases[] = {
      {{4, 1, 64, 96, 0, 0, 1}, 96}, {{8, 2, 1, 48, 1, 3, 9}, 96}, {{3, 1, 20, 7, 2, 0, 1}, 35}};
  for (DType dt : kTypes)
    for (const auto& [l, cols] : cases) {
      const std::int64_t rows = l.samples * l.groups * l.matrix_rows * l.matrix_cols / cols;
      const RngKey key{5, 9, 1, 2};
      for (double p : {0.0, 0.1}) {
        auto dy = random({rows, cols}, dt), dx = poisoned({rows, cols}, dt), db = random({cols}, acc_of(dt));
        k::dropout_backward_bias_grad(dy.c, p, key, l, dx.c, db.c);
        k::dropout_backward_bias_grad(dy.g, p, key, l, dx.g, db.g);
        EXPECT_EQ(rel_diff(dx.g, dx.c), 0.0) << dtype_name(dt) << " p " << p << ": the CPU's mask and rounding";
        EXPECT_LE(rel_diff(db.g, db.c), 1e-6) << dtype_name(dt) << " p " << p;
      }
    }
}

// The column sums' finish folded into the partial kernel (the default: the
// last block of each block column to arrive adds the chunks, after a device-
// wide fence and a ticket) against MEGAZERO_COLUMN_FINISH=kernel (a finishing
// launch): the same bits, at the GPT-2 medium step's shapes (tens of chunks
// finishing concurrently on every SM), each call eight times back to back
// (the tickets, left at 0, serve the next launch) so that a missing fence or
// a ticket left armed shows as other bits.
TEST_F(Cuda, ColumnSumsFinishedInTheKernelAreTheFinishKernelsBits) {
  const DType dt = DType::BF16;
  const std::int64_t rows = 8192;
  const k::DropoutLayout l{8, 1, 1024, 1024, 0, 0, 1};
  // Each launcher's folded path: the bias sums (QKV's 3072 columns), the
  // bias-GeLU backward (fc1's 4096), the dropout backward (1024), the split
  // LayerNorm backward (dgamma and dbeta folded together).
  const auto inputs = rng();
  auto calls = [&](bool folded) {
    k::gpu_scratch::set_column_finish_folded(folded);
    rng.seed(inputs);  // the same inputs for both modes
    auto dqkv = random({rows, 3072}, dt), dfc1 = random({rows, 4096}, dt), pre = random({rows, 4096}, dt);
    auto bfc1 = random({4096}, dt), dproj = random({rows, 1024}, dt);
    auto x = random({rows, 1024}, dt), gamma = random({1024}, dt, 0.5, 1.5), beta = random({1024}, dt);
    auto db_qkv = random({3072}, DType::F32), db_fc1 = random({4096}, DType::F32), db_proj = random({1024}, DType::F32);
    auto dgamma = random({1024}, DType::F32), dbeta = random({1024}, DType::F32);
    auto y = zeros({rows, 1024}, dt), mean = zeros({rows}, DType::F32), rstd = zeros({rows}, DType::F32);
    k::layernorm_forward(x.g, gamma.g, beta.g, 1e-5, y.g, mean.g, rstd.g);
    auto dfc1_out = zeros({rows, 4096}, dt), dproj_out = zeros({rows, 1024}, dt), dx = zeros({rows, 1024}, dt);
    for (int i = 0; i < 8; ++i) {
      k::bias_grad(dqkv.g, db_qkv.g);
      k::bias_gelu_backward(dfc1.g, pre.g, bfc1.g, dfc1_out.g, db_fc1.g);
      k::dropout_backward_bias_grad(dproj.g, 0.1, RngKey{3, 1, 2, 0}, l, dproj_out.g, db_proj.g);
      k::layernorm_backward(dproj.g, x.g, gamma.g, mean.g, rstd.g, dx.g, dgamma.g, dbeta.g, nullptr,
                            k::LayerNormBackwardPasses::Split);
    }
    k::gpu_scratch::set_column_finish_folded(true);
    return std::vector<std::vector<double>>{db_qkv.g.to_double_vector(),   db_fc1.g.to_double_vector(),
                                            db_proj.g.to_double_vector(),  dgamma.g.to_double_vector(),
                                            dbeta.g.to_double_vector(),    dfc1_out.g.to_double_vector(),
                                            dproj_out.g.to_double_vector()};
  };
  const auto folded = calls(true), apart = calls(false);
  const char* names[] = {"QKV bias", "fc1 bias (bias-GeLU)", "proj bias (dropout)", "dgamma",
                         "dbeta",    "bias-GeLU dx",         "dropout dx"};
  for (std::size_t i = 0; i < folded.size(); ++i) EXPECT_EQ(folded[i], apart[i]) << names[i];
}

TEST_F(Cuda, EmbeddingsAndPositions) {
  for (DType dt : kTypes) {
    const std::int64_t V = 50, H = 70, N = 400, start = 20, S = 8;
    auto table = random({V, H}, dt);
    auto tok = ids(N, 0, 100);  // ids outside [20, 70) belong to other ranks
    auto out = poisoned({N, H}, dt);
    k::embedding_forward(tok.c, table.c, start, out.c);
    k::embedding_forward(tok.g, table.g, start, out.g);
    EXPECT_EQ(rel_diff(out.g, out.c), 0.0);  // a copy
    auto dout = random({N, H}, dt), dtab = random({V, H}, acc_of(dt));
    k::embedding_backward(tok.c, dout.c, start, dtab.c);
    k::embedding_backward(tok.g, dout.g, start, dtab.g);
    EXPECT_EQ(rel_diff(dtab.g, dtab.c), 0.0) << "same order of fp32 sums";
    auto pos = random({16, H}, dt);
    k::add_position_embedding(out.c, pos.c, S);
    k::add_position_embedding(out.g, pos.g, S);
    EXPECT_LE(rel_diff(out.g, out.c), tol(dt));
    auto dpos = random({16, H}, acc_of(dt));
    k::position_embedding_backward(dout.c, S, dpos.c);
    k::position_embedding_backward(dout.g, S, dpos.g);
    EXPECT_LE(rel_diff(dpos.g, dpos.c), 1e-6);
  }
}

// CUB's radix sort works in the scratch gpu_scratch.h plans for it (the
// launcher throws if CUB asks for more), from one token to a million.
TEST_F(Cuda, EmbeddingBackwardSortFitsItsPlannedScratch) {
  for (const std::int64_t n :
       {std::int64_t{1}, std::int64_t{255}, std::int64_t{4097}, std::int64_t{1} << 16, std::int64_t{1} << 20}) {
    const std::int64_t V = 50257, H = 8;
    auto tok = ids(n, 0, V);
    auto dout = random({n, H}, DType::F32), dtab = zeros({V, H}, DType::F32);
    k::embedding_backward(tok.c, dout.c, 0, dtab.c);
    EXPECT_NO_THROW(k::embedding_backward(tok.g, dout.g, 0, dtab.g)) << n << " tokens";
    EXPECT_EQ(rel_diff(dtab.g, dtab.c), 0.0) << n << " tokens";
  }
}

// A TP slice with padding (375 packs a row: at most one a thread of the
// kernels' 512), then GPT-2's whole vocabulary (~12 packs a thread: the
// forward's running max rises and its sum is rescaled within a thread).
TEST_F(Cuda, VocabParallelCrossEntropyPieces) {
  struct Slice {
    std::int64_t N, Vl, valid, start;
  };
  for (const Slice& sl : {Slice{33, 3000, 2900, 6000}, Slice{16, 50304, 50257, 0}})
    for (DType dt : kTypes) {
      const std::int64_t N = sl.N, Vl = sl.Vl, valid = sl.valid, start = sl.start;
      auto logits = random({N, Vl}, dt, -8, 8);
      auto tgt = ids(N, start > 0 ? 5000 : 0, start > 0 ? 10000 : valid);  // a TP slice: some held elsewhere
      const DType st = k::row_stat_dtype(dt);
      auto mx = poisoned({N}, st), se = poisoned({N}, st), tl = poisoned({N}, st);
      k::cross_entropy_forward(logits.c, tgt.c, start, valid, mx.c, se.c, tl.c);  // reads the logits only
      k::cross_entropy_forward(logits.g, tgt.g, start, valid, mx.g, se.g, tl.g);
      EXPECT_EQ(rel_diff(mx.g, mx.c), 0.0);
      EXPECT_EQ(rel_diff(tl.g, tl.c), 0.0);
      EXPECT_LE(rel_diff(se.g, se.c), 1e-6);
      EXPECT_EQ(rel_diff(logits.g, logits.c), 0.0) << "the forward leaves the logits as they were";
      // As if another rank held a larger max: the rescale, then the loss.
      auto gmax = random({N}, st, 8, 9);
      k::rescale_sum_exp(mx.c, gmax.c, se.c);
      k::rescale_sum_exp(mx.g, gmax.g, se.g);
      EXPECT_LE(rel_diff(se.g, se.c), 1e-6);
      auto loss = poisoned({N}, st);
      k::cross_entropy_loss(gmax.c, se.c, tl.c, loss.c);
      k::cross_entropy_loss(gmax.g, se.g, tl.g, loss.g);
      EXPECT_LE(rel_diff(loss.g, loss.c), 1e-6);
      k::cross_entropy_backward(logits.c, gmax.c, se.c, tgt.c, start, valid, 0.5, logits.c);  // in place
      k::cross_entropy_backward(logits.g, gmax.g, se.g, tgt.g, start, valid, 0.5, logits.g);
      EXPECT_LE(rel_diff(logits.g, logits.c), tol(dt));
    }
}

// One TP rank: the forward and backward in one pass (the row kept in shared
// memory) give the two kernels' bits on the GPU and the CPU's within the
// backward's rounding. A 25216-column 16-bit row (50.4 KB) fuses on an
// H100/H200, its fp32 row (101 KB, not four times in an SM) takes the two
// kernels, as GPT-2's whole vocabulary does in every type.
TEST_F(Cuda, CrossEntropyForwardBackwardInOnePass) {
  const std::int64_t N = 64;
  for (const auto& [V, valid] : {std::pair<std::int64_t, std::int64_t>{25216, 25150}, {50304, 50257}})
    for (DType dt : kTypes) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << ", " << V << " columns");
      auto logits = random({N, V}, dt, -8, 8);
      auto tgt = ids(N, 0, valid);
      const DType st = k::row_stat_dtype(dt);
      auto mx = poisoned({N}, st), se = poisoned({N}, st), tl = poisoned({N}, st);
      Tensor two = logits.g.clone(MemoryCategory::Activations);
      k::cross_entropy_forward(two, tgt.g, 0, valid, mx.g, se.g, tl.g);
      k::cross_entropy_backward(two, mx.g, se.g, tgt.g, 0, valid, 0.25, two);
      auto fmx = poisoned({N}, st), fse = poisoned({N}, st), ftl = poisoned({N}, st);
      Tensor one = logits.g.clone(MemoryCategory::Activations);
      const bool fused = k::cross_entropy_forward_backward(one, tgt.g, valid, 0.25, fmx.g, fse.g, ftl.g, one);
      EXPECT_EQ(fused, V == 25216 && dtype_size(dt) == 2);
      EXPECT_EQ(rel_diff(fmx.g, mx.g), 0.0);
      EXPECT_EQ(rel_diff(fse.g, se.g), 0.0);
      EXPECT_EQ(rel_diff(ftl.g, tl.g), 0.0);
      EXPECT_EQ(rel_diff(one, two), 0.0);
      k::cross_entropy_forward_backward(logits.c, tgt.c, valid, 0.25, mx.c, se.c, tl.c, logits.c);
      EXPECT_LE(rel_diff(one, logits.c), tol(dt));
      // --eod-mask-loss's row weights (0 on every third row): the fused pass
      // weighs as the two kernels, and the CPU's within the rounding.
      auto w = random({N}, st, 0.5, 2);
      std::vector<double> wv = w.c.to_double_vector();
      for (std::size_t i = 0; i < wv.size(); i += 3) wv[i] = 0;
      w.c.copy_from_doubles(wv);
      w.g.copy_from(w.c);
      Tensor wtwo = logits.g.clone(MemoryCategory::Activations), wone = logits.g.clone(MemoryCategory::Activations);
      k::cross_entropy_forward(wtwo, tgt.g, 0, valid, mx.g, se.g, tl.g);
      k::cross_entropy_backward(wtwo, mx.g, se.g, tgt.g, 0, valid, 0.25, wtwo, &w.g);
      k::cross_entropy_forward_backward(wone, tgt.g, valid, 0.25, fmx.g, fse.g, ftl.g, wone, &w.g);
      EXPECT_EQ(rel_diff(wone, wtwo), 0.0) << "row weights";
      Tensor wcpu = Tensor::empty(cpu, {N, V}, dt, MemoryCategory::Activations);
      wcpu.copy_from(logits.g);
      k::cross_entropy_forward_backward(wcpu, tgt.c, valid, 0.25, mx.c, se.c, tl.c, wcpu, &w.c);
      EXPECT_LE(rel_diff(wone, wcpu), tol(dt)) << "row weights";
      auto wloss = poisoned({N}, st), closs = poisoned({N}, st);
      k::cross_entropy_loss(fmx.g, fse.g, ftl.g, wloss.g, &w.g);
      k::cross_entropy_loss(mx.c, se.c, tl.c, closs.c, &w.c);
      EXPECT_LE(rel_diff(wloss.g, closs.c), 1e-6) << "weighted losses";
    }
}

TEST_F(Cuda, StridedCopiesWithCasts) {
  auto src = random({4, 6, 3, 5}, DType::F32);
  for (DType to : {DType::F32, DType::BF16, DType::F16}) {
    Tensor c = Tensor::empty(cpu, {4, 3, 6, 5}, to, MemoryCategory::Activations);
    Tensor g = Tensor::empty(gpu, {4, 3, 6, 5}, to, MemoryCategory::Activations);
    c.copy_from(src.c.transpose(1, 2));
    g.copy_from(src.g.transpose(1, 2));
    EXPECT_EQ(rel_diff(g, c), 0.0) << dtype_name(to);
  }
}

// Device marks time the GPU's work, not the host's launching: ten
// device-to-device copies of 1 GiB (20 GiB read and written) are queued in
// microseconds but no GPU moves them faster than 10 TB/s, so the marks around
// them must be at least 2 ms apart; and reading the span waits for them.
TEST_F(Cuda, MarksTimeTheDevicesWorkNotTheLaunch) {
  const std::size_t bytes = std::size_t{1} << 30;
  auto a = gpu->allocate(bytes, MemoryCategory::Workspace, "mark-a");
  auto b = gpu->allocate(bytes, MemoryCategory::Workspace, "mark-b");
  gpu->synchronize();
  const auto host0 = std::chrono::steady_clock::now();
  const auto m0 = gpu->mark();
  for (int i = 0; i < 10; ++i) gpu->copy_within(b->data(), a->data(), bytes);
  const auto m1 = gpu->mark();
  const double host_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - host0).count();
  const double device_s = gpu->seconds_between(*m0, *m1);
  EXPECT_GE(device_s, 2.0 * 10 * static_cast<double>(bytes) / 10e12) << "host launch time " << host_s << " s";
  EXPECT_LT(device_s, 10.0);
  EXPECT_GE(gpu->seconds_between(*m0, *m0), 0.0);
  EXPECT_THROW(gpu->seconds_between(*m0, *cpu->mark()), InternalError);
}

// The kernel trace of pretrain_gpt --profile (CUPTI): 8 GEMMs and a copy
// queued inside the window are recorded with the device's timestamps, inside
// the window, the GEMMs under one name 8 times; the busy share is positive and
// at most the window; a second trace cannot start while one runs.
TEST_F(Cuda, KernelTraceRecordsTheQueuedKernels) {
  ASSERT_TRUE(gpu->has_kernel_trace());
  Tensor a = Tensor::zeros(gpu, {2048, 2048}, DType::BF16, MemoryCategory::Workspace);
  Tensor c = Tensor::empty(gpu, {2048, 2048}, DType::BF16, MemoryCategory::Workspace);
  gemm(a, false, a, false, c);  // cuBLAS's first call (its set-up) outside the window
  gpu->start_kernel_trace();
  EXPECT_THROW(gpu->start_kernel_trace(), ConfigError);
  for (int i = 0; i < 8; ++i) gemm(a, false, a, false, c);
  c.copy_from(a);
  const KernelTrace t = gpu->stop_kernel_trace();
  EXPECT_GT(t.window_end_ns, t.window_start_ns);
  EXPECT_EQ(t.dropped, 0u);
  const KernelTraceSummary s = summarize(t);
  EXPECT_GE(s.kernels, 8);
  EXPECT_GT(s.busy_ns, 0u);
  EXPECT_LE(s.busy_ns, s.window_ns);
  ASSERT_FALSE(s.rows.empty());
  EXPECT_EQ(s.rows[0].calls % 8, 0) << s.rows[0].name;  // the GEMMs: the longest rows
  for (const TraceRecord& r : t.records) {
    EXPECT_GE(r.start_ns, t.window_start_ns) << r.name;
    EXPECT_LE(r.end_ns, t.window_end_ns) << r.name;
    EXPECT_FALSE(r.name.empty());
  }
  std::printf("%s", format_summary(s, "test_cuda", 5).c_str());
  // Another trace after this one.
  gpu->start_kernel_trace();
  EXPECT_EQ(summarize(gpu->stop_kernel_trace()).kernels, 0);
}

// What the MPI backend stages device tensors with: copies ordered after a
// mark (taken when a collective is issued) see everything queued before it
// and do not wait for what was queued after: here ~2 TFLOP of GEMMs on the
// compute stream (over a millisecond on any GPU) while 4 KB cross to the host
// and back on the copy stream.
TEST_F(Cuda, CopiesAfterAMarkDoNotWaitForLaterCompute) {
  auto small = random({1024}, DType::F32);
  const auto issued = gpu->mark();
  Tensor a = Tensor::zeros(gpu, {4096, 4096}, DType::BF16, MemoryCategory::Workspace);
  Tensor c = Tensor::empty(gpu, {4096, 4096}, DType::BF16, MemoryCategory::Workspace);
  const auto later = gpu->mark();
  for (int i = 0; i < 16; ++i) gemm(a, false, a, false, c);
  const auto host0 = std::chrono::steady_clock::now();
  std::vector<float> staged(1024);
  gpu->copy_to_host_after(*issued, staged.data(), small.g.data(), small.g.nbytes());
  for (auto& x : staged) x = 2 * x;
  gpu->copy_from_host_after(*issued, small.g.data(), staged.data(), small.g.nbytes());
  const double copies_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - host0).count();
  const auto done = gpu->mark();
  const double gemms_s = gpu->seconds_between(*later, *done);
  EXPECT_LT(copies_s, gemms_s) << "the staged copies waited for the GEMMs queued after the mark";
  const auto want = small.c.to_double_vector(), got = small.g.to_double_vector();
  for (std::size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], 2 * want[i]) << i;
  EXPECT_THROW(gpu->copy_to_host_after(*cpu->mark(), staged.data(), small.g.data(), 4), InternalError);
}

// run_queued (ZeRO stage 0's --overlap-optimizer): AdamW queued beside the
// compute gives the CPU's bits once ordered; its kernels go to the side
// stream (the compute stream's GEMMs queued after it do not wait for it, and
// it does not wait for them); allocating inside the work is refused.
TEST_F(Cuda, QueuedWorkRunsBesideTheComputeStream) {
  const std::int64_t n = (1 << 20) + 5;
  auto w = random({n}, DType::F32), m = random({n}, DType::F32, 0, 1), v = random({n}, DType::F32, 0, 1);
  auto g = random({n}, DType::BF16);
  auto p = poisoned({n}, DType::BF16);
  const std::vector<kernels::AdamSegment> segs{{0, n / 2, true}, {n / 2, n, false}};
  optim::AdamConfig adam;
  adam.weight_decay = 0.1;
  optim::adamw_step(w.c, m.c, v.c, g.c, segs, adam, 1e-3, 3, 0.5, p.c);
  Tensor a = Tensor::zeros(gpu, {4096, 4096}, DType::BF16, MemoryCategory::Workspace);
  Tensor c = Tensor::empty(gpu, {4096, 4096}, DType::BF16, MemoryCategory::Workspace);
  cudaStream_t inside = nullptr;
  auto& dev = as_cuda_device(*gpu);
  auto update = gpu->run_queued([&] {
    inside = dev.stream();
    optim::adamw_step(w.g, m.g, v.g, g.g, segs, adam, 1e-3, 3, 0.5, p.g);
  });
  EXPECT_NE(inside, dev.stream()) << "the work's kernels went to the compute stream";
  const auto before = gpu->mark();
  for (int i = 0; i < 8; ++i) gemm(a, false, a, false, c);
  const auto after = gpu->mark();
  gpu->queue_after(*update);
  for (const auto* t : {&w, &m, &v, &p}) {
    const auto want = t->c.to_double_vector(), got = t->g.to_double_vector();
    for (std::size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << i;
  }
  EXPECT_GT(gpu->seconds_between(*before, *after), 0.0);
  EXPECT_THROW(gpu->wait(*gpu->run_queued([&] { Tensor::empty(gpu, {4}, DType::F32, MemoryCategory::Workspace); })),
               InternalError);
}

// The shm transport's device slots (comm/shm_collectives.h), the parts one
// process can check: the slot reduction on the GPU gives reduce_host's bits
// (every source rounded in, a source written over, an offset that is not a
// whole 16-byte pack), a copy after a mark moves device bytes, an IPC block
// has a handle and a handle of nothing is refused. (Opening a block needs a
// second process: shm_backend_e2e.sh on cuda, 4 ranks sharing the GPU.)
TEST_F(Cuda, SlotReductionGivesTheHostsBitsAndSharedBlocksExport) {
  const std::int64_t n = (1 << 16) + 3;
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max})
      for (std::int64_t offset : {0, 1}) {
        SCOPED_TRACE(testing::Message() << dtype_name(dt) << " " << reduce_op_name(op) << " offset " << offset);
        std::vector<Pair> src;
        for (int q = 0; q < 3; ++q) src.push_back(random({n}, dt, -1000, 1000));
        const std::size_t es = dtype_size(dt), len = static_cast<std::size_t>(n - offset);
        std::vector<const void*> on_host, on_gpu;
        for (auto& p : src) {
          on_host.push_back(static_cast<const char*>(p.c.data()) + offset * es);
          on_gpu.push_back(static_cast<const char*>(p.g.data()) + offset * es);
        }
        auto out = poisoned({n}, dt);
        reduce_host(dt, op, static_cast<char*>(out.c.data()) + offset * es, on_host, len, 3);
        reduce_on_device(*gpu, *gpu->mark(), dt, op, static_cast<char*>(out.g.data()) + offset * es, on_gpu, len, 3, 1);
        std::vector<unsigned char> want(out.c.nbytes()), got(out.g.nbytes());
        std::memcpy(want.data(), out.c.data(), want.size());
        gpu->copy_to_host(got.data(), out.g.data(), got.size());
        EXPECT_TRUE(want == got) << "the GPU's slot reduction differs from reduce_host";
        // Written over its second source.
        reduce_on_device(*gpu, *gpu->mark(), dt, op, const_cast<void*>(on_gpu[1]), on_gpu, len, 3, 1);
        std::memcpy(want.data() + 0, src[1].c.data(), offset * es);
        gpu->copy_to_host(got.data(), src[1].g.data(), got.size());
        EXPECT_TRUE(want == got) << "written over a source";
      }
  auto a = random({4096}, DType::F32);
  auto b = zeros({4096}, DType::F32);
  gpu->copy_within_after(*gpu->mark(), b.g.data(), a.g.data(), a.g.nbytes());
  EXPECT_EQ(b.g.to_double_vector(), a.c.to_double_vector());
  auto block = gpu->allocate_shared(1 << 20);
  ASSERT_TRUE(block);
  EXPECT_EQ(block->handle().rfind("cuda-ipc:", 0), 0u) << block->handle();
  EXPECT_THROW(gpu->open_shared("cuda-ipc:00", 1 << 20), ConfigError);
  EXPECT_THROW(gpu->open_shared("/megazero-isolated-1-0", 1 << 20), ConfigError);
}

// Host waits as the step reports them (Device::host_waits): blocking copies
// to and from the host and synchronize() count; device-to-device copies
// (copy_within, strided copies) are queued and do not; nor do the copies after a mark.
TEST_F(Cuda, CountsHostWaitsAndQueuesDeviceCopies) {
  auto a = random({1 << 20}, DType::F32);
  Tensor b = Tensor::empty(gpu, a.g.shape(), DType::F32, MemoryCategory::Workspace);
  const std::int64_t w0 = gpu->host_waits();
  for (int i = 0; i < 4; ++i) gpu->copy_within(b.data(), a.g.data(), a.g.nbytes());
  b.copy_from(a.g);
  std::vector<float> staged(16);
  gpu->copy_to_host_after(*gpu->mark(), staged.data(), a.g.data(), 64);
  EXPECT_EQ(gpu->host_waits(), w0);
  const auto got = b.to_double_vector(), want = a.c.to_double_vector();
  EXPECT_EQ(got, want) << "the queued copies ran before the read-back";
  EXPECT_EQ(gpu->host_waits(), w0 + 1);
  gpu->synchronize();
  EXPECT_EQ(gpu->host_waits(), w0 + 2);
}

// Queued transfers (Pa+cpu's offload): a copy to page-locked host memory is
// ordered after the compute queued before it and does not hold the host up;
// a copy back, with queue_after, is seen by the work queued after it. The
// page-locked host device reuses freed blocks (no cudaHostAlloc per step).
TEST_F(Cuda, QueuedTransfersFollowTheComputeWithoutHoldingTheHost) {
  auto pinned = gpu->host_device();
  EXPECT_EQ(pinned, gpu->host_device()) << "one per GPU";
  Tensor a = Tensor::zeros(gpu, {4096, 4096}, DType::BF16, MemoryCategory::Workspace);
  Tensor c = Tensor::empty(gpu, {4096, 4096}, DType::BF16, MemoryCategory::Workspace);
  auto src = random({1 << 20}, DType::F32);
  Tensor out = Tensor::empty(gpu, src.g.shape(), DType::F32, MemoryCategory::Workspace);
  Tensor host_copy = Tensor::empty(pinned, src.g.shape(), DType::F32, MemoryCategory::Workspace);
  const std::int64_t w0 = gpu->host_waits();
  const auto begin = gpu->mark();
  for (int i = 0; i < 16; ++i) gemm(a, false, a, false, c);  // ~2 TFLOP queued
  out.copy_from(src.g);                                      // queued after them
  const auto host0 = std::chrono::steady_clock::now();
  auto down = gpu->copy_to_host_queued(host_copy.data(), out.data(), out.nbytes());
  const double issue_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - host0).count();
  gpu->wait(*down);
  const double gemms_s = gpu->seconds_between(*begin, *gpu->mark());
  EXPECT_LT(issue_s, gemms_s) << "queuing the copy waited for the GEMMs";
  EXPECT_EQ(host_copy.to_double_vector(), src.c.to_double_vector()) << "the copy saw the work queued before it";
  Tensor again = Tensor::zeros(gpu, src.g.shape(), DType::F32, MemoryCategory::Workspace);
  auto up = gpu->copy_from_host_queued(again.data(), host_copy.data(), again.nbytes());
  gpu->queue_after(*up);
  Tensor twice = Tensor::empty(gpu, src.g.shape(), DType::F32, MemoryCategory::Workspace);
  twice.copy_from(again);  // queued after the wait: sees the copied bytes
  EXPECT_EQ(twice.to_double_vector(), src.c.to_double_vector());
  // The host's wait for the copy (behind 2 TFLOP of GEMMs: not ended when
  // asked, so counted) and the read-back; queuing and queue_after are none.
  EXPECT_EQ(gpu->host_waits(), w0 + 2) << "the wait for the copy and the read-back only";
  const void* block = host_copy.data();
  host_copy = Tensor();
  Tensor reused = Tensor::empty(pinned, src.g.shape(), DType::F32, MemoryCategory::Workspace);
  EXPECT_EQ(reused.data(), block) << "the freed page-locked block is reused, not allocated again";
}

TEST_F(Cuda, FlatCastsRoundAsTheHostDoes) {
  // Master weights into 16-bit parameters (and back): the flat cast kernel
  // gives the host's megazero::convert bit for bit, fp64 sources included.
  for (DType from : {DType::F32, DType::F64, DType::BF16})
    for (DType to : {DType::F32, DType::BF16, DType::F16}) {
      auto src = random({1000, 37}, from, -300, 300);
      Tensor c = Tensor::empty(cpu, src.c.shape(), to, MemoryCategory::Activations);
      Tensor g = Tensor::empty(gpu, src.c.shape(), to, MemoryCategory::Activations);
      c.copy_from(src.c);
      g.copy_from(src.g);
      EXPECT_EQ(rel_diff(g, c), 0.0) << dtype_name(from) << " -> " << dtype_name(to);
    }
}

TEST_F(Cuda, GemmAgreesWithCpu) {
  for (DType dt : kTypes) {
    auto a = random({3, 70, 130}, dt), b = random({130, 90}, dt);
    auto c = random({3, 70, 90}, DType::F32);
    gemm(a.c, false, b.c, false, c.c, 1.0f, 0.5f);
    gemm(a.g, false, b.g, false, c.g, 1.0f, 0.5f);
    EXPECT_LE(rel_diff(c.g, c.c), dt == DType::F32 ? 1e-5 : 1e-5) << dtype_name(dt);  // 16-bit inputs are exact in fp32
    auto bt = random({90, 130}, dt);
    auto c2 = random({3, 70, 90}, dt);
    gemm(a.c, false, bt.c, true, c2.c);
    gemm(a.g, false, bt.g, true, c2.g);
    EXPECT_LE(rel_diff(c2.g, c2.c), tol(dt)) << dtype_name(dt);
  }
}

// --gemm-autotune: a problem's first call times cuBLASLt's candidates (into a
// scratch D) before it computes, so an accumulating GEMM (beta 1, as the
// weight gradients are) adds its product once, and a plain one overwrites; the
// cached choice then serves the next call. Every dtype, both transposes.
TEST_F(Cuda, GemmAutotuneComputesEachCallOnce) {
  set_gemm_autotune(true);
  for (DType dt : kTypes)
    for (bool tb : {false, true}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << (tb ? " B^T" : " B"));
      auto a = random({1024, 768}, dt, -1, 1);
      auto b = tb ? random({512, 768}, dt, -1, 1) : random({768, 512}, dt, -1, 1);
      auto acc = random({1024, 512}, dt), out = random({1024, 512}, dt);
      for (int call = 0; call < 2; ++call) {  // the first timed, the second from the cache
        gemm(a.c, false, b.c, tb, acc.c, 1.0f, 1.0f);
        gemm(a.g, false, b.g, tb, acc.g, 1.0f, 1.0f);
        EXPECT_LE(rel_diff(acc.g, acc.c), tol(dt)) << "call " << call << ": accumulated once";
        gemm(a.c, false, b.c, tb, out.c, 0.5f, 0.0f);
        gemm(a.g, false, b.g, tb, out.g, 0.5f, 0.0f);
        EXPECT_LE(rel_diff(out.g, out.c), tol(dt)) << "call " << call;
      }
    }
  set_gemm_autotune(false);
  const std::string report = gemm_autotune_report(true);
  EXPECT_NE(report.find("problems timed"), std::string::npos)
      << "cuBLASLt offered one algorithm for every problem, so nothing was timed: " << report;
  std::printf("%s\n", report.c_str());
}

TEST_F(Cuda, AdamWAndGradNorm) {
  for (DType gt : kTypes) {
    const std::int64_t n = 100003;
    auto w = random({n}, DType::F32), m = random({n}, DType::F32, -0.1, 0.1), v = random({n}, DType::F32, 0, 0.01);
    auto g = random({n}, gt);
    const std::vector<optim::DecaySegment> segs{{0, 40000, true}, {40000, 40001, false}, {40001, n, true}};
    optim::AdamConfig cfg;
    cfg.weight_decay = 0.1;
    optim::adamw_step(w.c, m.c, v.c, g.c, segs, cfg, 3e-4, 5, 0.5);
    optim::adamw_step(w.g, m.g, v.g, g.g, segs, cfg, 3e-4, 5, 0.5);
    // The same fp32 formula on both (kernels/adamw_formula.h: every operation
    // rounded on its own, the GPU's through _rn intrinsics nvcc cannot fuse):
    // the same bits.
    EXPECT_EQ(rel_diff(w.g, w.c), 0.0) << dtype_name(gt);
    EXPECT_EQ(rel_diff(m.g, m.c), 0.0);
    EXPECT_EQ(rel_diff(v.g, v.c), 0.0);
    const auto gv = g.c.to_double_vector();
    double ref = 0;
    for (std::int64_t i = 10; i < 50000; ++i) ref += gv[static_cast<std::size_t>(i)] * gv[static_cast<std::size_t>(i)];
    for (std::int64_t i = 60000; i < n; ++i) ref += gv[static_cast<std::size_t>(i)] * gv[static_cast<std::size_t>(i)];
    // Through the kernels:: entry the optimizer uses; its result stays on the device.
    Tensor sum = Tensor::empty(gpu, {1}, DType::F64, MemoryCategory::Workspace);
    k::sum_of_squares(g.g, {{10, 50000}, {60000, n}}, sum);
    EXPECT_NEAR(sum.to_double_vector()[0], ref, 1e-12 * ref);
  }
}

// A whole GPT (dropout on, tied embeddings, vocab padding) on the GPU against
// the CPU: loss, and every parameter's gradient.
TEST_F(Cuda, GptForwardBackwardMatchesCpu) {
  struct Variant {
    DType dt;
    const char* attention;
    // --gemm-epilogues on the GPU side (cuBLASLt); the CPU side runs the plain passes
    layers::GemmEpilogues epilogues = layers::GemmEpilogues::None;
  };
  using E = layers::GemmEpilogues;
  for (const Variant& var :
       {Variant{DType::F32, "unfused"}, Variant{DType::BF16, "unfused"}, Variant{DType::BF16, "fused"},
        Variant{DType::F32, "unfused", E::Forward}, Variant{DType::F32, "unfused", E::All},
        Variant{DType::BF16, "fused", E::Forward}, Variant{DType::BF16, "fused", E::All}})
    for (bool recompute : {false, true}) {
      const DType dt = var.dt;
      layers::GPTConfig cfg;
      cfg.attention_backend = var.attention;
      cfg.num_layers = 2;
      cfg.hidden_size = 64;
      cfg.num_attention_heads = 4;
      cfg.vocab_size = 211;
      cfg.max_position_embeddings = 64;
      cfg.seq_length = 32;
      cfg.make_vocab_size_divisible_by = 8;
      cfg.recompute_activations = recompute;
      VirtualCommunicator tp(0, 1, "tp");
      struct Side {
        layers::ParameterSet params;
        std::unique_ptr<layers::GPTModel> model;
        double loss = 0;
      } side[2];
      const std::shared_ptr<Device> devs[2] = {cpu, gpu};
      layers::StepInfo step;
      step.micro_batch = 3;
      step.seq = 32;
      step.iteration = 4;
      const std::int64_t n = step.micro_batch * step.seq;
      for (int d = 0; d < 2; ++d) {
        layers::TpContext ctx{&tp, devs[d], dt};
        cfg.gemm_epilogues = d == 1 ? var.epilogues : E::None;
        side[d].model = std::make_unique<layers::GPTModel>(cfg, ctx, side[d].params);
        side[d].params.allocate(devs[d], dt);
        side[d].params.initialize(99);
        Tensor in = test_support::int64_tensor(devs[d], n, [](std::int64_t i) { return (i * 37 + 5) % 211; });
        Tensor tg = test_support::int64_tensor(devs[d], n, [](std::int64_t i) { return (i * 91 + 3) % 211; });
        side[d].loss = side[d].model->forward(in, tg, step);
        side[d].params.zero_grad();
        side[d].model->backward(1.0);
      }
      // cuBLASLt's GeLU epilogue may use the approximate tanh (~2^-11 relative): fp32 with
      // epilogues is held to 1e-3 / 2e-3 (a wiring error is order 1).
      const double t = dt == DType::F32 ? (var.epilogues != E::None ? 1e-3 : 1e-5) : 3e-2;
      const double grad_tol = dt == DType::F32 ? (var.epilogues != E::None ? 2e-3 : 1e-4) : 6e-2;
      EXPECT_NEAR(side[1].loss, side[0].loss, t * side[0].loss) << dtype_name(dt);
      for (auto* p : side[0].params.all()) {
        const auto& q = side[1].params.get(p->name);
        EXPECT_EQ(rel_diff(q.value, p->value), 0.0) << p->name << ": initialisation";
        EXPECT_LE(rel_diff(q.grad, p->grad), grad_tol)
            << p->name << " gradient, " << dtype_name(dt) << (recompute ? " recompute" : "") << " attention "
            << var.attention << ", GEMM epilogues on the GPU: " << layers::gemm_epilogues_name(var.epilogues);
      }
    }
}
