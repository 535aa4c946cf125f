// AdamW and the learning-rate schedule against their textbook formulas,
// written out independently here.
#include <gtest/gtest.h>

#include <cmath>
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
