// AdamW and the learning-rate schedule against their textbook formulas,
// written out independently here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numbers>

#include "megazero/core/error.h"
#include "megazero/optim/adamw.h"
#include "megazero/optim/lr_schedule.h"

using namespace megazero;
using namespace megazero::optim;

TEST(AdamW, MatchesTheFormulaOverSeveralStepsWithAndWithoutDecay) {
  auto dev = make_device(DeviceKind::CPU);
  const std::vector<double> w0 = {0.5, -1.25, 2.0, 0.0};
  Tensor w = Tensor::empty(dev, {4}, DType::F32, MemoryCategory::OptimizerStates);
  Tensor m = Tensor::zeros(dev, {4}, DType::F32, MemoryCategory::OptimizerStates);
  Tensor v = Tensor::zeros(dev, {4}, DType::F32, MemoryCategory::OptimizerStates);
  Tensor g = Tensor::empty(dev, {4}, DType::BF16, MemoryCategory::Gradients);
  w.copy_from_doubles(w0);
  AdamConfig c;
  c.weight_decay = 0.1;
  const std::vector<DecaySegment> segs = {{0, 2, true}, {2, 4, false}};
  std::vector<double> rw = w0, rm(4, 0), rv(4, 0);
  const double lr = 0.01, scale = 0.5;
  for (int step = 1; step <= 4; ++step) {
    g.copy_from_doubles({0.25 * step, -0.5, 1.0 / step, 0.0});
    const auto grads = g.to_double_vector();  // as the optimizer sees them: rounded to bf16
    adamw_step(w, m, v, g, segs, c, lr, step, scale);
    for (int i = 0; i < 4; ++i) {
      const double gi = grads[static_cast<std::size_t>(i)] * scale;
      auto& mi = rm[static_cast<std::size_t>(i)];
      auto& vi = rv[static_cast<std::size_t>(i)];
      auto& wi = rw[static_cast<std::size_t>(i)];
      mi = c.beta1 * mi + (1 - c.beta1) * gi;
      vi = c.beta2 * vi + (1 - c.beta2) * gi * gi;
      const double mhat = mi / (1 - std::pow(c.beta1, step)), vhat = vi / (1 - std::pow(c.beta2, step));
      wi -= lr * (mhat / (std::sqrt(vhat) + c.eps) + (i < 2 ? c.weight_decay * wi : 0.0));
    }
    const auto got = w.to_double_vector();
    for (std::size_t i = 0; i < 4; ++i) EXPECT_NEAR(got[i], rw[i], 1e-6) << "step " << step << " element " << i;
  }
  EXPECT_EQ(w.to_double_vector()[3], 0.0) << "zero gradient, no decay: unchanged";
}

// Long partitions take the vectorised, multi-threaded update: it must be the
// scalar formula's bits for any thread count (no element depends on another),
// including across segment boundaries that cut vectors and thread chunks.
TEST(AdamW, LongPartitionsAreTheScalarUpdateBitForBitOnAnyThreadCount) {
  auto dev = make_device(DeviceKind::CPU);
  const std::int64_t n = 300007;
  const std::vector<DecaySegment> segs = {{0, 3, true}, {3, 150001, false}, {150001, 299990, true}, {299990, n, false}};
  AdamConfig c;
  c.weight_decay = 0.05;
  const double lr = 3e-3, scale = 0.25;
  for (DType gt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(gt));
    std::vector<double> w0(static_cast<std::size_t>(n)), g0(w0.size());
    for (std::size_t i = 0; i < w0.size(); ++i) {
      w0[i] = std::sin(0.37 * static_cast<double>(i));
      g0[i] = std::cos(0.11 * static_cast<double>(i)) * (i % 5 == 0 ? 0.0 : 1.0);
    }
    std::vector<std::vector<float>> results;
    struct RestoreThreads {
      int before = cpu_math_threads();
      ~RestoreThreads() { set_cpu_math_threads(before); }
    } restore;
    for (int threads : {1, 4}) {
      set_cpu_math_threads(threads);
      Tensor w = Tensor::empty(dev, {n}, DType::F32, MemoryCategory::OptimizerStates);
      Tensor m = Tensor::zeros(dev, {n}, DType::F32, MemoryCategory::OptimizerStates);
      Tensor v = Tensor::zeros(dev, {n}, DType::F32, MemoryCategory::OptimizerStates);
      Tensor g = Tensor::empty(dev, {n}, gt, MemoryCategory::Gradients);
      w.copy_from_doubles(w0);
      g.copy_from_doubles(g0);
      for (int step = 1; step <= 2; ++step) adamw_step(w, m, v, g, segs, c, lr, step, scale);
      std::vector<float> all(w.host_data<float>(), w.host_data<float>() + n);
      all.insert(all.end(), m.host_data<float>(), m.host_data<float>() + n);
      all.insert(all.end(), v.host_data<float>(), v.host_data<float>() + n);
      results.push_back(std::move(all));
      if (threads == 1) {
        // The scalar update, in the kernel's order of operations.
        const auto grads = g.to_double_vector();
        std::vector<float> rw(w0.begin(), w0.end()), rm(w0.size(), 0.f), rv(w0.size(), 0.f);
        for (int step = 1; step <= 2; ++step) {
          const double bc1 = 1 - std::pow(c.beta1, step), bc2 = 1 - std::pow(c.beta2, step);
          for (const auto& sg : segs)
            for (std::int64_t i = sg.begin; i < sg.end; ++i) {
              const auto k = static_cast<std::size_t>(i);
              const double gi = grads[k] * scale, wd = sg.decay ? c.weight_decay : 0.0;
              const double mi = c.beta1 * rm[k] + (1 - c.beta1) * gi;
              const double vi = c.beta2 * rv[k] + (1 - c.beta2) * gi * gi;
              rm[k] = static_cast<float>(mi);
              rv[k] = static_cast<float>(vi);
              const double u = (mi / bc1) / (std::sqrt(vi / bc2) + c.eps);
              rw[k] = static_cast<float>(rw[k] - lr * (u + wd * rw[k]));
            }
        }
        const auto bits = [](float f) {
          std::uint32_t u;
          std::memcpy(&u, &f, 4);
          return u;
        };
        for (std::size_t k = 0; k < w0.size(); ++k) {
          ASSERT_EQ(bits(results[0][k]), bits(rw[k])) << "w[" << k << "]";
          ASSERT_EQ(bits(results[0][w0.size() + k]), bits(rm[k])) << "m[" << k << "]";
          ASSERT_EQ(bits(results[0][2 * w0.size() + k]), bits(rv[k])) << "v[" << k << "]";
        }
      }
    }
    EXPECT_EQ(std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)), 0)
        << "1 and 4 threads differ";
  }
}

TEST(LrSchedule, WarmupThenCosineLinearConstant) {
  LrSchedule s;
  s.max_lr = 1.0;
  s.min_lr = 0.1;
  s.warmup_iters = 4;
  s.decay_iters = 14;
  EXPECT_DOUBLE_EQ(s.at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.at(4), 1.0);  // decay starts at 0
  EXPECT_NEAR(s.at(9), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 0.5)), 1e-12);
  EXPECT_DOUBLE_EQ(s.at(14), 0.1);
  EXPECT_DOUBLE_EQ(s.at(100), 0.1);  // stays at the minimum
  s.style = "linear";
  EXPECT_NEAR(s.at(9), 0.1 + 0.9 * 0.5, 1e-12);
  s.style = "constant";
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  s.style = "exponential";
  EXPECT_THROW(s.validate(), ConfigError);
  s.style = "cosine";
  s.min_lr = 2.0;
  try {
    s.validate();
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--min-lr"), std::string::npos);
  }
}
