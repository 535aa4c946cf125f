// Philox-4x32-10 against the Random123 known-answer vectors, the documented
// (key, index) -> (counter, key, lane) mapping, the statistics of uniform and
// normal draws, independence of streams and determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <set>
#include <vector>

#include "megazero/core/error.h"
#include "megazero/kernels/rng.h"

using namespace megazero;

namespace {

using Words = std::array<std::uint32_t, 4>;

// Random123 kat_vectors, "philox4x32 10".
TEST(Philox, KnownAnswerVectors) {
  EXPECT_EQ(philox4x32({0, 0, 0, 0}, {0, 0}), (Words{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
            (Words{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
            (Words{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

// The mapping documented in rng.cpp, recomputed here so a change to it fails.
Words expected_block(const RngKey& k, std::uint64_t block) {
  const auto lo = [](std::uint64_t v) { return static_cast<std::uint32_t>(v); };
  const std::uint32_t iter = lo(k.iteration) ^ (lo(k.iteration >> 32) * 0x85EBCA6Bu);
  return philox4x32({lo(block), lo(block >> 32), k.layer, iter},
                    {lo(k.seed), lo(k.seed >> 32) ^ (k.site * 0x9E3779B9u)});
}

TEST(Rng, UniformFollowsTheDocumentedMapping) {
  const RngKey k{0x0123456789abcdefull, 0xfedcba9876543210ull, 7, kRngAttentionDropout};
  for (std::uint64_t i : {0ull, 1ull, 2ull, 3ull, 4ull, 1000003ull, (1ull << 40) + 5, ~0ull}) {
    const Words w = expected_block(k, i >> 2);
    EXPECT_EQ(uniform_at(k, i), static_cast<float>(w[i & 3] >> 8) * 0x1p-24f) << "index " << i;
  }
}

TEST(Rng, NormalFollowsTheDocumentedMapping) {
  const RngKey k{42, 3, 11, kRngInit};
  for (std::uint64_t i : {0ull, 1ull, 2ull, 3ull, 999ull, (1ull << 35) + 1}) {
    const Words w = expected_block(k, i >> 1);
    const std::size_t lane = 2 * (i & 1);
    const double u1 = (w[lane] + 1.0) * 0x1p-32, u2 = (w[lane + 1] + 1.0) * 0x1p-32;
    EXPECT_EQ(normal_at(k, i), std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2)) << i;
  }
}

// NormalStream (initialisation's walk) gives normal_at's values in any order.
TEST(Rng, NormalStreamGivesNormalAtsValues) {
  const RngKey k{42, 0, 0xabcdef01u, kRngInit};
  NormalStream s(k);
  for (std::uint64_t i = 0; i < 5000; ++i) ASSERT_EQ(s.at(i), normal_at(k, i)) << i;
  for (std::uint64_t i = 5000; i-- > 0;) ASSERT_EQ(s.at(i), normal_at(k, i)) << i;
  for (std::uint64_t i : {7ull, 3ull, (1ull << 40) + 1, (1ull << 40), 2ull, 3ull})
    ASSERT_EQ(s.at(i), normal_at(k, i)) << i;
}

// UniformStream::fill (the dropout kernels' vectorised Philox) gives at()'s
// values for any start and length, block-aligned or not.
TEST(Rng, UniformFillGivesAtsValues) {
  const RngKey k{0x0123456789abcdefull, 77, 5, kRngAttentionDropout};
  UniformStream s(k);
  std::vector<float> out(UniformStream::kFillMax);
  for (std::uint64_t first : {0ull, 1ull, 2ull, 3ull, 4ull, 4097ull, (1ull << 33) - 3, (1ull << 40) + 2})
    for (std::int64_t n : {std::int64_t{1}, std::int64_t{3}, std::int64_t{5}, std::int64_t{1000},
                           UniformStream::kFillMax - 1, UniformStream::kFillMax}) {
      s.fill(first, n, out.data());
      for (std::int64_t j = 0; j < n; ++j)
        ASSERT_EQ(out[static_cast<std::size_t>(j)], uniform_at(k, first + static_cast<std::uint64_t>(j)))
            << "first " << first << ", n " << n << ", j " << j;
    }
  EXPECT_THROW(s.fill(0, UniformStream::kFillMax + 1, out.data()), InternalError);
}

TEST(Rng, UniformMomentsAndChiSquare) {
  const RngKey k{1234, 0, 3, kRngEmbeddingDropout};
  constexpr int kN = 1000000, kBins = 64;
  std::vector<int> bins(kBins, 0);
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < kN; ++i) {
    const float u = uniform_at(k, static_cast<std::uint64_t>(i));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    sum_sq += static_cast<double>(u) * u;
    ++bins[static_cast<std::size_t>(u * kBins)];
  }
  const double mean = sum / kN, var = sum_sq / kN - mean * mean;
  // Standard errors: 0.29/sqrt(N) = 3e-4 for the mean, ~1e-4 for the variance.
  EXPECT_NEAR(mean, 0.5, 2e-3);
  EXPECT_NEAR(var, 1.0 / 12.0, 1e-3);
  double chi2 = 0;
  const double expect = static_cast<double>(kN) / kBins;
  for (int b : bins) chi2 += (b - expect) * (b - expect) / expect;
  // 63 degrees of freedom: mean 63, sd 11.2; 130 is ~6 sd out.
  EXPECT_LT(chi2, 130.0) << "chi-square over " << kBins << " bins";
}

TEST(Rng, NormalMomentsAndTails) {
  const RngKey k{99, 0, 0, kRngInit};
  constexpr int kN = 400000;
  double sum = 0, sum_sq = 0, sum_4 = 0;
  int beyond_2sd = 0;
  for (int i = 0; i < kN; ++i) {
    const double z = normal_at(k, static_cast<std::uint64_t>(i));
    ASSERT_TRUE(std::isfinite(z));
    sum += z;
    sum_sq += z * z;
    sum_4 += z * z * z * z;
    beyond_2sd += std::fabs(z) > 2.0;
  }
  const double mean = sum / kN, var = sum_sq / kN - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.01);            // se 1.6e-3
  EXPECT_NEAR(std::sqrt(var), 1.0, 0.01);  // se 1.1e-3
  EXPECT_NEAR(sum_4 / kN, 3.0, 0.1);       // kurtosis of a normal; se ~0.016
  EXPECT_NEAR(static_cast<double>(beyond_2sd) / kN, 0.0455, 0.003);
}

// Fraction of equal draws between two streams over the same indices.
double fraction_equal(const RngKey& a, const RngKey& b) {
  constexpr int kN = 4096;
  int same = 0;
  for (int i = 0; i < kN; ++i)
    same += uniform_at(a, static_cast<std::uint64_t>(i)) == uniform_at(b, static_cast<std::uint64_t>(i));
  return static_cast<double>(same) / kN;
}

TEST(Rng, DistinctKeysGiveDistinctStreams) {
  const RngKey base{5, 10, 2, kRngAttentionDropout};
  const auto changed = [&](auto change) {
    RngKey k = base;
    change(k);
    return k;
  };
  const std::vector<RngKey> others = {
      changed([](RngKey& k) { k.seed = 6; }),
      changed([](RngKey& k) { k.seed |= 1ull << 32; }),  // only the high seed word differs
      changed([](RngKey& k) { k.iteration = 11; }),
      changed([](RngKey& k) { k.iteration |= 1ull << 32; }),
      changed([](RngKey& k) { k.layer = 3; }),
      changed([](RngKey& k) { k.site = kRngMlpOutputDropout; }),
  };
  for (const auto& o : others) EXPECT_LT(fraction_equal(base, o), 0.01);
  // Correlation between two streams is ~0 (se 1/sqrt(N) ~ 0.005 at N = 40000).
  for (const auto& o : others) {
    double sxy = 0;
    constexpr int kN = 40000;
    for (int i = 0; i < kN; ++i)
      sxy += (uniform_at(base, static_cast<std::uint64_t>(i)) - 0.5) *
             (uniform_at(o, static_cast<std::uint64_t>(i)) - 0.5);
    EXPECT_NEAR(sxy / kN * 12.0, 0.0, 0.03);
  }
}

TEST(Rng, NeighbouringIndicesAreNotRepeated) {
  const RngKey k{1, 0, 0, kRngInit};
  std::set<float> seen;
  for (std::uint64_t i = 0; i < 4096; ++i) seen.insert(uniform_at(k, i));
  EXPECT_GT(seen.size(), 4000u);  // 24-bit values: a few birthday collisions at most
}

TEST(Rng, SameInputsGiveSameValues) {
  const RngKey a{77, 12345, 9, kRngAttentionOutputDropout};
  const RngKey b = a;
  for (std::uint64_t i = 0; i < 1000; i += 7) {
    EXPECT_EQ(uniform_at(a, i), uniform_at(b, i));
    EXPECT_EQ(normal_at(a, i), normal_at(b, i));
  }
  EXPECT_EQ(philox4x32({1, 2, 3, 4}, {5, 6}), philox4x32({1, 2, 3, 4}, {5, 6}));
}

}  // namespace
