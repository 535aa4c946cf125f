// Finite-difference gradient checking for the explicit backward passes.
// The caller runs forward + backward once (analytic gradients), then this
// perturbs sampled elements of each target tensor by +-h and compares the
// central difference of the scalar loss with the analytic gradient.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "megazero/core/tensor.h"

namespace megazero::testing_util {

struct GradTarget {
  std::string name;
  Tensor value;  // perturbed in place (host-visible CPU tensor)
  Tensor grad;   // analytic gradient, same shape
};

// Central differences at `samples` random elements per target (all elements
// when the tensor is smaller). |fd - analytic| <= atol + noise + rtol * max(|fd|, |analytic|),
// where noise = 64 eps |L| / h bounds the rounding error of the difference
// quotient itself (so tiny gradients of a large loss are judged fairly).
inline void expect_gradients_match_fd(const std::function<double()>& loss, const std::vector<GradTarget>& targets,
                                      int samples = 6, double h = 1e-5, double rtol = 1e-6, double atol = 1e-9) {
  std::mt19937 rng(7);
  const double noise = 64 * 2.220446049250313e-16 * std::fabs(loss()) / h;
  for (const auto& t : targets) {
    ASSERT_TRUE(t.value.defined() && t.grad.defined()) << t.name;
    ASSERT_EQ(t.value.shape(), t.grad.shape()) << t.name;
    const std::int64_t n = t.value.numel();
    if (n == 0) continue;
    const auto analytic = t.grad.to_double_vector();
    std::vector<std::int64_t> idx;
    if (n <= samples) {
      for (std::int64_t i = 0; i < n; ++i) idx.push_back(i);
    } else {
      std::uniform_int_distribution<std::int64_t> pick(0, n - 1);
      for (int k = 0; k < samples; ++k) idx.push_back(pick(rng));
    }
    Tensor flat = t.value.flatten();
    for (std::int64_t i : idx) {
      Tensor e = flat.narrow(0, i, 1);
      const double x0 = e.to_double_vector()[0];
      e.copy_from_doubles({x0 + h});
      const double lp = loss();
      e.copy_from_doubles({x0 - h});
      const double lm = loss();
      e.copy_from_doubles({x0});
      const double fd = (lp - lm) / (2 * h);
      const double an = analytic[static_cast<std::size_t>(i)];
      EXPECT_NEAR(an, fd, atol + noise + rtol * std::max(std::fabs(fd), std::fabs(an)))
          << t.name << " element " << i << " (of " << n << ")";
    }
  }
}

// A fixed random tensor (the weights of the linear functional sum(w * out)).
inline Tensor random_like(const Tensor& like, unsigned seed, double scale = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> d(0, scale);
  std::vector<double> v(static_cast<std::size_t>(like.numel()));
  for (auto& x : v) x = d(rng);
  Tensor out = Tensor::empty(like.device_ptr(), like.shape(), like.dtype(), MemoryCategory::Other);
  out.copy_from_doubles(v);
  return out;
}

inline double dot(const Tensor& a, const Tensor& b) {
  const auto x = a.to_double_vector(), y = b.to_double_vector();
  double s = 0;
  for (std::size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
  return s;
}

}  // namespace megazero::testing_util
