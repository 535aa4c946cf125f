// vector_math: the libmvec exponentials of the CPU softmaxes against the
// scalar double std::exp, on every loop shape (vector body, remainder,
// empty), in place, and at the edges (underflow, -inf, NaN, exp(0) = 1).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "megazero/kernels/vector_math.h"

using megazero::kernels::exp_scaled_shifted;
using megazero::kernels::scaled_max;
using megazero::kernels::tanh_f32;

namespace {

// Distance in units in the last place between two finite positive floats.
std::int64_t ulps(float a, float b) {
  std::int32_t ia = 0, ib = 0;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::abs(static_cast<std::int64_t>(ia) - ib);
}

const std::int64_t kLengths[] = {0, 1, 3, 15, 16, 17, 31, 33, 1000, 25216};

}  // namespace

TEST(VectorMath, ExpIsWithinFourUlpOfTheTrueValueAndSumsInDouble) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> logit(-40.f, 12.f);
  std::int64_t worst = 0;
  for (std::int64_t n : kLengths)
    for (float scale : {1.0f, 0.125f, -0.5f}) {
      std::vector<float> x(static_cast<std::size_t>(n)), y(x.size(), -1.f);
      for (auto& v : x) v = logit(gen);
      const float mx = scaled_max(x.data(), scale, n);
      const double sum = exp_scaled_shifted(x.data(), scale, mx, y.data(), n);
      double want_sum = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const auto k = static_cast<std::size_t>(i);
        const float arg = scale * x[k] - mx;  // the float argument the kernel exponentiates
        const float want = static_cast<float>(std::exp(static_cast<double>(arg)));
        ASSERT_LE(arg, 0.f) << "scaled_max is below element " << i;
        if (want >= std::numeric_limits<float>::min()) {
          worst = std::max(worst, ulps(y[k], want));
        } else {
          ASSERT_LE(std::abs(y[k] - want), std::numeric_limits<float>::min()) << "subnormal at " << i;
        }
        want_sum += y[k];
      }
      EXPECT_NEAR(sum, want_sum, 1e-12 * std::max(1.0, want_sum)) << "n " << n;
      if (n == 0) {
        EXPECT_EQ(sum, 0.0);
      }
    }
  EXPECT_LE(worst, 4) << "libmvec's documented bound is 4 ulp";
  std::printf("worst expf error: %lld ulp\n", static_cast<long long>(worst));
}

TEST(VectorMath, MaxMatchesTheScalarMax) {
  std::mt19937 gen(11);
  std::normal_distribution<float> d(0.f, 30.f);
  for (std::int64_t n : kLengths) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (auto& v : x) v = d(gen);
    for (float scale : {1.0f, 0.3f, -2.0f}) {
      float want = -std::numeric_limits<float>::infinity();
      for (float v : x) want = std::max(want, scale * v);
      EXPECT_EQ(scaled_max(x.data(), scale, n), want) << "n " << n << " scale " << scale;
    }
  }
  EXPECT_EQ(scaled_max(static_cast<const float*>(nullptr), 1.f, 0), -std::numeric_limits<float>::infinity());
  // A NaN is passed over, as std::max(max, NaN) does in the scalar loop.
  std::vector<float> with_nan(37, -1.f);
  with_nan[3] = std::nanf("");
  with_nan[20] = 2.5f;
  with_nan[36] = std::nanf("");
  EXPECT_EQ(scaled_max(with_nan.data(), 2.f, 37), 5.f);
}

TEST(VectorMath, InPlaceAndEdgeValues) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {
      0.f, -inf, -200.f, -87.f, -1e-8f, 3.f,    std::nanf(""), 0.f, -0.5f,
      2.f, 1.f,  -3.f,   -inf,  0.f,    -104.f, -1.f,          0.f};  // 17: a vector body and a remainder
  std::vector<float> orig = x;
  exp_scaled_shifted(x.data(), 1.f, 0.f, x.data(), static_cast<std::int64_t>(x.size()));
  EXPECT_EQ(x[0], 1.f);
  EXPECT_EQ(x[1], 0.f);
  EXPECT_EQ(x[2], 0.f);
  EXPECT_GT(x[3], 0.f);
  EXPECT_TRUE(std::isnan(x[6]));
  EXPECT_EQ(x[12], 0.f);
  EXPECT_EQ(x[14], 0.f) << "exp(-104) is below the smallest subnormal";
  EXPECT_EQ(x[16], 1.f) << "the remainder element";
  for (std::size_t i : {4u, 5u, 8u, 9u, 10u, 11u, 15u})
    EXPECT_LE(ulps(x[i], static_cast<float>(std::exp(static_cast<double>(orig[i])))), 4) << "element " << i;
}

TEST(VectorMath, DoubleIsTheScalarExpBitForBit) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<double> d(-50.0, 5.0);
  std::vector<double> x(1031), y(x.size());
  for (auto& v : x) v = d(gen);
  const double mx = scaled_max(x.data(), 0.7, static_cast<std::int64_t>(x.size()));
  const double sum = exp_scaled_shifted(x.data(), 0.7, mx, y.data(), static_cast<std::int64_t>(x.size()));
  double want_sum = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(0.7 * x[i] - mx);
    ASSERT_EQ(y[i], want) << i;
    want_sum += want;
  }
  EXPECT_EQ(sum, want_sum);
}

// tanh_f32: within 4 ulp of tanh in double (the GeLU's argument range and
// beyond), and every element's result independent of its position: the same
// values at any offset, in any length of run (vector body or padded tail),
// give the same bits. That is what keeps the fused and unfused GeLU paths
// bit-identical in fp32.
TEST(VectorMath, TanhIsAccurateAndTheSameBitsAtAnyPosition) {
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> d(-9.f, 9.f);
  std::vector<float> u(1000);
  for (auto& v : u) v = d(gen);
  u[0] = 0.f, u[1] = -0.f, u[2] = 1e-30f, u[3] = 40.f, u[4] = -40.f;
  std::vector<float> t(u.size());
  tanh_f32(u.data(), t.data(), static_cast<std::int64_t>(u.size()));
  std::int64_t worst = 0;
  for (std::size_t i = 0; i < u.size(); ++i) {
    const float want = static_cast<float>(std::tanh(static_cast<double>(u[i])));
    if (std::fabs(want) >= std::numeric_limits<float>::min())
      worst = std::max(worst, ulps(std::fabs(t[i]), std::fabs(want)));
    ASSERT_EQ(std::signbit(t[i]), std::signbit(want)) << i;
  }
  EXPECT_LE(worst, 4);
  std::printf("worst tanhf error: %lld ulp\n", static_cast<long long>(worst));
  EXPECT_EQ(t[3], 1.f);
  EXPECT_EQ(t[4], -1.f);
  for (std::int64_t off : {1, 3, 15, 16, 17})
    for (std::int64_t len : {1, 5, 16, 33, 400}) {
      std::vector<float> part(static_cast<std::size_t>(len));
      tanh_f32(u.data() + off, part.data(), len);
      for (std::int64_t i = 0; i < len; ++i)
        ASSERT_EQ(ulps(part[static_cast<std::size_t>(i)], t[static_cast<std::size_t>(off + i)]), 0)
            << "offset " << off << " length " << len << " element " << i;
    }
  std::vector<float> inplace(u.begin(), u.begin() + 37);
  tanh_f32(inplace.data(), inplace.data(), 37);
  for (std::size_t i = 0; i < 37; ++i) ASSERT_EQ(ulps(inplace[i], t[i]), 0) << "in place " << i;
  tanh_f32(nullptr, nullptr, 0);
}
