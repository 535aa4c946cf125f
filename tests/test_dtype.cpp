// fp16 / bf16 conversions, exhaustively: every 16-bit pattern round-trips, every
// rounding midpoint goes to even, and random fp32 values agree with an
// independent nearest-value search (and with the CPU's F16C instruction where
// present). NaN payloads that live only in the dropped bits must stay NaN.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "megazero/core/dtype.h"
#include "megazero/core/error.h"

using namespace megazero;

namespace {

bool is_nan16_half(std::uint16_t b) { return (b & 0x7c00u) == 0x7c00u && (b & 0x3ffu) != 0; }
bool is_nan16_bf(std::uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0; }

// Exact value of a half pattern from its definition (independent of half_to_float).
double half_value(std::uint16_t b) {
  const int e = (b >> 10) & 0x1f, m = b & 0x3ff;
  const double s = (b & 0x8000) ? -1.0 : 1.0;
  if (e == 0) return s * std::ldexp(m, -24);
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : s * HUGE_VAL;
  return s * std::ldexp(1024 + m, e - 25);
}

// Nearest half by searching the table of all finite non-negative halves;
// ties to the even pattern; past 65520 (max + half an ulp) is infinity.
std::uint16_t reference_float_to_half(float x) {
  static const std::vector<double> table = [] {
    std::vector<double> t;
    for (std::uint32_t b = 0; b < 0x7c00u; ++b) t.push_back(half_value(static_cast<std::uint16_t>(b)));
    t.push_back(65536.0);  // where the next pattern (infinity) would sit were the exponent unbounded
    return t;
  }();
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 65520.0) return sign | 0x7c00u;
  auto it = std::lower_bound(table.begin(), table.end(), a);
  auto hi = static_cast<std::uint16_t>(it - table.begin());
  if (table[hi] == a || hi == 0) return sign | hi;
  const auto lo = static_cast<std::uint16_t>(hi - 1);
  const double dlo = a - table[lo], dhi = table[hi] - a;
  if (dlo < dhi) return sign | lo;
  if (dhi < dlo) return sign | hi;
  return sign | ((lo & 1u) ? hi : lo);
}

// Nearest bf16 by comparing distances in double (independent of the bit trick).
std::uint16_t reference_float_to_bf16(float x) {
  const std::uint32_t u = f32_bits(x);
  const auto lo = static_cast<std::uint16_t>(u >> 16);  // truncation toward zero
  const auto hi = static_cast<std::uint16_t>(lo + 1);   // next magnitude (may be inf)
  const double a = std::fabs(static_cast<double>(x));
  const double vlo = std::fabs(static_cast<double>(f32_from_bits(static_cast<std::uint32_t>(lo) << 16)));
  // Past the largest finite bf16 the next value would be 2^128 (IEEE overflow rule).
  const double vhi = (hi & 0x7fffu) == 0x7f80u
                         ? std::ldexp(1.0, 128)
                         : std::fabs(static_cast<double>(f32_from_bits(static_cast<std::uint32_t>(hi) << 16)));
  if (a == vlo) return lo;
  const double dlo = a - vlo, dhi = vhi - a;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1u) ? hi : lo;
}

__attribute__((target("f16c"))) std::uint16_t hardware_float_to_half(float x) {
  return static_cast<std::uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
}

std::vector<float> random_floats(std::size_t n) {
  std::mt19937 rng(1234);
  std::vector<float> v;
  v.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    float f = f32_from_bits(static_cast<std::uint32_t>(rng()));
    if (!std::isnan(f)) v.push_back(f);
  }
  // Concentrate on the ranges where 16-bit rounding matters.
  std::uniform_real_distribution<float> u(-70000.f, 70000.f), s(-1e-4f, 1e-4f);
  for (std::size_t i = 0; i < n / 2; ++i) v.push_back(u(rng));
  for (std::size_t i = 0; i < n / 2; ++i) v.push_back(s(rng));
  return v;
}

}  // namespace

TEST(Half, EveryPatternDecodesToItsDefinedValueAndRoundTrips) {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const float f = half_to_float(Half{h});
    if (is_nan16_half(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << b;
      const std::uint16_t back = float_to_half(f).bits;
      ASSERT_TRUE(is_nan16_half(back)) << std::hex << b;
      ASSERT_EQ(back & 0x8000u, h & 0x8000u);
      ASSERT_EQ(back, h | 0x200u) << "NaN keeps its payload and becomes quiet";
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), half_value(h)) << std::hex << b;
    ASSERT_EQ(float_to_half(f).bits, h) << std::hex << b;
  }
}

TEST(BFloat16, EveryPatternRoundTrips) {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const float f = bf16_to_float(BFloat16{h});
    ASSERT_EQ(f32_bits(f), b << 16);
    const std::uint16_t back = float_to_bf16(f).bits;
    if (is_nan16_bf(h)) {
      ASSERT_EQ(back, h | 0x40u) << "NaN keeps its payload and becomes quiet";
    } else {
      ASSERT_EQ(back, h) << std::hex << b;
    }
  }
}

TEST(Half, EveryMidpointRoundsToEvenAndNeighboursToNearest) {
  // The midpoint between consecutive halves has 12 significant bits, so it is
  // exact in fp32; one fp32 ulp either side must round to the nearer half.
  for (std::uint32_t b = 0; b < 0x7bffu; ++b) {
    for (const double sign : {1.0, -1.0}) {
      const double lo = half_value(static_cast<std::uint16_t>(b)), hi = half_value(static_cast<std::uint16_t>(b + 1));
      const float mid = static_cast<float>(sign * (lo + hi) / 2);
      ASSERT_EQ(static_cast<double>(mid), sign * (lo + hi) / 2);
      const std::uint16_t s = sign < 0 ? 0x8000 : 0;
      const auto even = static_cast<std::uint16_t>((b & 1u) ? b + 1 : b);
      ASSERT_EQ(float_to_half(mid).bits, s | even) << std::hex << b;
      const float below = std::nextafter(mid, 0.0f), above = std::nextafter(mid, sign < 0 ? -1e30f : 1e30f);
      ASSERT_EQ(float_to_half(below).bits, s | b) << std::hex << b;
      ASSERT_EQ(float_to_half(above).bits, s | (b + 1)) << std::hex << b;
    }
  }
}

TEST(BFloat16, EveryMidpointRoundsToEven) {
  for (std::uint32_t b = 0; b < 0x7f7fu; ++b) {
    const std::uint32_t mid_bits = (b << 16) | 0x8000u;  // exactly halfway to b + 1
    const auto even = static_cast<std::uint16_t>((b & 1u) ? b + 1 : b);
    ASSERT_EQ(float_to_bf16(f32_from_bits(mid_bits)).bits, even) << std::hex << b;
    ASSERT_EQ(float_to_bf16(f32_from_bits(mid_bits - 1)).bits, b);
    ASSERT_EQ(float_to_bf16(f32_from_bits(mid_bits + 1)).bits, b + 1);
  }
}

TEST(Half, OverflowUnderflowInfinityAndZero) {
  EXPECT_EQ(float_to_half(65504.f).bits, 0x7bffu);
  EXPECT_EQ(float_to_half(65519.996f).bits, 0x7bffu);
  EXPECT_EQ(float_to_half(65520.f).bits, 0x7c00u);  // tie with odd max rounds up to inf
  EXPECT_EQ(float_to_half(-1e10f).bits, 0xfc00u);
  EXPECT_EQ(float_to_half(HUGE_VALF).bits, 0x7c00u);
  EXPECT_EQ(float_to_half(-HUGE_VALF).bits, 0xfc00u);
  EXPECT_EQ(float_to_half(0.0f).bits, 0x0000u);
  EXPECT_EQ(float_to_half(-0.0f).bits, 0x8000u);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)).bits, 0x0000u);  // half the smallest subnormal: tie to even 0
  EXPECT_EQ(float_to_half(std::nextafter(std::ldexp(1.0f, -25), 1.f)).bits, 0x0001u);
  EXPECT_EQ(float_to_half(std::ldexp(3.0f, -25)).bits, 0x0002u);  // 1.5 ulp: tie to even 2
  EXPECT_EQ(float_to_half(1e-30f).bits, 0x0000u);
}

TEST(SixteenBit, NanWhosePayloadIsOnlyInDroppedBitsStaysNan) {
  for (std::uint32_t payload : {1u, 0x1fffu, 0x400000u, 0x3fffffu}) {
    for (std::uint32_t sign : {0u, 0x80000000u}) {
      const float nan = f32_from_bits(sign | 0x7f800000u | payload);
      ASSERT_TRUE(std::isnan(nan));
      EXPECT_TRUE(is_nan16_half(float_to_half(nan).bits)) << std::hex << payload;
      EXPECT_TRUE(is_nan16_bf(float_to_bf16(nan).bits)) << std::hex << payload;
      EXPECT_EQ(float_to_half(nan).bits & 0x8000u, sign >> 16);
      EXPECT_EQ(float_to_bf16(nan).bits & 0x8000u, sign >> 16);
    }
  }
  EXPECT_EQ(float_to_bf16(HUGE_VALF).bits, 0x7f80u);
  EXPECT_EQ(float_to_bf16(3.4e38f).bits, 0x7f80u);  // rounds past the largest bf16
}

TEST(Half, RandomFloatsMatchNearestValueSearchAndHardware) {
  const bool has_f16c = __builtin_cpu_supports("f16c");
  for (float x : random_floats(400000)) {
    const std::uint16_t ours = float_to_half(x).bits;
    ASSERT_EQ(ours, reference_float_to_half(x)) << x;
    if (has_f16c) {
      ASSERT_EQ(ours, hardware_float_to_half(x)) << x;
    }
  }
  if (!has_f16c) GTEST_SKIP() << "CPU has no F16C: compared with the reference search only";
}

TEST(BFloat16, RandomFloatsMatchNearestValueSearch) {
  for (float x : random_floats(400000)) ASSERT_EQ(float_to_bf16(x).bits, reference_float_to_bf16(x)) << x;
}

TEST(Convert, BulkMatchesScalarForEveryPair) {
  std::vector<float> src = random_floats(5000);
  const std::size_t n = src.size();
  std::vector<Half> h(n);
  std::vector<BFloat16> b(n);
  convert(src.data(), DType::F32, h.data(), DType::F16, n);
  convert(src.data(), DType::F32, b.data(), DType::BF16, n);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(h[i].bits, float_to_half(src[i]).bits);
    ASSERT_EQ(b[i].bits, float_to_bf16(src[i]).bits);
  }
  std::vector<BFloat16> hb(n);
  std::vector<double> d(n);
  convert(h.data(), DType::F16, hb.data(), DType::BF16, n);
  convert(b.data(), DType::BF16, d.data(), DType::F64, n);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(hb[i].bits, float_to_bf16(half_to_float(h[i])).bits);
    ASSERT_EQ(d[i], static_cast<double>(bf16_to_float(b[i])));
  }
}

TEST(DType, SizesNamesAndParsing) {
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::F64), 8u);
  EXPECT_EQ(parse_dtype("bf16"), DType::BF16);
  EXPECT_EQ(parse_dtype("float16"), DType::F16);
  EXPECT_EQ(dtype_name(parse_dtype(dtype_name(DType::F32))), "fp32");
  try {
    parse_dtype("fp8", "--params-dtype");
    FAIL() << "fp8 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--params-dtype"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos);
  }
}
