// Element types and the 16-bit float conversions every other module relies on.
// Conversions round to nearest, ties to even (as hardware does); NaN stays NaN
// (quietened, sign kept), infinities and signed zeros are preserved, and values
// beyond the 16-bit range become infinity (fp16) exactly as IEEE 754 specifies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace megazero {

enum class DType : std::uint8_t { F32, F16, BF16, F64, I32, I64, U8 };

std::size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
// Parses "fp32"/"float32"/"f32", "fp16"/"float16"/"half", "bf16"/"bfloat16", ...;
// throws ConfigError naming `what` (e.g. the flag) on anything else.
DType parse_dtype(std::string_view s, std::string_view what = "dtype");
bool is_floating(DType t);

// 16-bit storage types. They are plain bit containers: arithmetic is done in fp32.
struct Half {
  std::uint16_t bits;
};
struct BFloat16 {
  std::uint16_t bits;
};

inline std::uint32_t f32_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float f32_from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// ---- bfloat16: the top 16 bits of an fp32 ----
// Branch-free (a select, not a jump), so loops of conversions vectorise.
inline BFloat16 float_to_bf16(float f) {
  const std::uint32_t u = f32_bits(f);
  // NaN: keep sign and payload top bits, force quiet.
  const std::uint32_t quiet_nan = (u >> 16) | 0x0040u;
  // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate.
  // Overflow carries into the exponent and correctly produces infinity.
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return BFloat16{static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded)};
}
inline float bf16_to_float(BFloat16 h) { return f32_from_bits(static_cast<std::uint32_t>(h.bits) << 16); }

// ---- IEEE binary16 ----
inline Half float_to_half(float f) {
  const std::uint32_t u = f32_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN
    if (abs == 0x7f800000u) return Half{static_cast<std::uint16_t>(sign | 0x7c00u)};
    return Half{static_cast<std::uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu))};
  }
  // 65520 = largest finite half (65504) + half an ulp: from there up, RNE gives Inf.
  if (abs >= 0x477ff000u) return Half{static_cast<std::uint16_t>(sign | 0x7c00u)};
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero) in half: value = m * 2^-24 with m in [0, 1024).
    // Adding 0.5f aligns the fp32 mantissa so that the FPU's own RNE does the
    // rounding at the 2^-24 position; the low bits are the half mantissa.
    const float shifted = f32_from_bits(abs) + 0.5f;
    return Half{static_cast<std::uint16_t>(sign | (f32_bits(shifted) - 0x3f000000u))};
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped bits to even.
  std::uint32_t r = abs - ((127u - 15u) << 23);
  r += 0xfffu + ((r >> 13) & 1u);
  return Half{static_cast<std::uint16_t>(sign | (r >> 13))};
}

inline float half_to_float(Half h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  const std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  const std::uint32_t man = h.bits & 0x3ffu;
  if (exp == 0x1fu) return f32_from_bits(sign | 0x7f800000u | (man << 13));  // Inf/NaN
  if (exp != 0) return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
  // Zero or subnormal: m * 2^-24 is exact in fp32.
  const float mag = static_cast<float>(man) * f32_from_bits(0x33800000u);  // 2^-24
  return f32_from_bits(sign | f32_bits(mag));
}

// An element of a floating storage type, widened exactly: 16-bit -> float.
inline float widen(float v) { return v; }
inline double widen(double v) { return v; }
inline float widen(Half v) { return half_to_float(v); }
inline float widen(BFloat16 v) { return bf16_to_float(v); }

// Calls fn(T{}) with the C++ storage type T of a floating dtype; false (fn not
// called) for the integer dtypes.
template <typename Fn>
bool with_float_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::F32:
      fn(float{});
      return true;
    case DType::F64:
      fn(double{});
      return true;
    case DType::BF16:
      fn(BFloat16{});
      return true;
    case DType::F16:
      fn(Half{});
      return true;
    default:
      return false;
  }
}

// Bulk conversion between any two floating dtypes (F32/F16/BF16/F64), n elements.
// src and dst may not overlap unless they are the same pointer with equal dtypes.
void convert(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n);

// Scalar read/write of element i of a buffer of type t, through double.
double load_as_double(const void* base, DType t, std::size_t i);
void store_from_double(void* base, DType t, std::size_t i, double v);

}  // namespace megazero
