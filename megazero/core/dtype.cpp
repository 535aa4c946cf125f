#include "megazero/core/dtype.h"

#include "megazero/core/error.h"

namespace megazero {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::F16:
      return 2;
    case DType::BF16:
      return 2;
    case DType::F64:
      return 8;
    case DType::I32:
      return 4;
    case DType::I64:
      return 8;
    case DType::U8:
      return 1;
  }
  MZ_CHECK(false, "unknown dtype");
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "fp32";
    case DType::F16:
      return "fp16";
    case DType::BF16:
      return "bf16";
    case DType::F64:
      return "fp64";
    case DType::I32:
      return "int32";
    case DType::I64:
      return "int64";
    case DType::U8:
      return "uint8";
  }
  return "?";
}

DType parse_dtype(std::string_view s, std::string_view what) {
  if (s == "fp32" || s == "float32" || s == "f32" || s == "float") return DType::F32;
  if (s == "fp16" || s == "float16" || s == "f16" || s == "half") return DType::F16;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "fp64" || s == "float64" || s == "f64" || s == "double") return DType::F64;
  if (s == "int32" || s == "i32") return DType::I32;
  if (s == "int64" || s == "i64") return DType::I64;
  if (s == "uint8" || s == "u8") return DType::U8;
  throw ConfigError(
      detail::concat(what, ": unknown dtype '", s, "'; use one of fp32, fp16, bf16, fp64, int32, int64, uint8"));
}

bool is_floating(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F64; }

namespace {

// Each conversion goes through fp32 (or fp64 when either side is fp64), so a
// 16-bit result is rounded exactly once.
template <typename Load, typename Store>
void convert_loop(std::size_t n, Load load, Store store) {
  for (std::size_t i = 0; i < n; ++i) store(i, load(i));
}

}  // namespace

void convert(const void* src, DType st, void* dst, DType dt, std::size_t n) {
  MZ_CHECK(is_floating(st) && is_floating(dt), "convert() handles floating dtypes only, got ", dtype_name(st), " -> ",
           dtype_name(dt));
  if (st == dt) {
    if (src != dst) std::memcpy(dst, src, n * dtype_size(st));
    return;
  }
  if (st == DType::F64 || dt == DType::F64) {
    // fp64 -> fp16 goes through fp32: double rounding is impossible to avoid
    // cheaply and is never used on a hot path (reference computations only).
    for (std::size_t i = 0; i < n; ++i) store_from_double(dst, dt, i, load_as_double(src, st, i));
    return;
  }
  auto* f_src = static_cast<const float*>(src);
  auto* h_src = static_cast<const Half*>(src);
  auto* b_src = static_cast<const BFloat16*>(src);
  auto* f_dst = static_cast<float*>(dst);
  auto* h_dst = static_cast<Half*>(dst);
  auto* b_dst = static_cast<BFloat16*>(dst);
  if (st == DType::F32 && dt == DType::F16) {
    convert_loop(
        n, [&](std::size_t i) { return f_src[i]; }, [&](std::size_t i, float v) { h_dst[i] = float_to_half(v); });
  } else if (st == DType::F32 && dt == DType::BF16) {
    convert_loop(
        n, [&](std::size_t i) { return f_src[i]; }, [&](std::size_t i, float v) { b_dst[i] = float_to_bf16(v); });
  } else if (st == DType::F16 && dt == DType::F32) {
    convert_loop(
        n, [&](std::size_t i) { return half_to_float(h_src[i]); }, [&](std::size_t i, float v) { f_dst[i] = v; });
  } else if (st == DType::BF16 && dt == DType::F32) {
    convert_loop(
        n, [&](std::size_t i) { return bf16_to_float(b_src[i]); }, [&](std::size_t i, float v) { f_dst[i] = v; });
  } else if (st == DType::F16 && dt == DType::BF16) {
    convert_loop(
        n, [&](std::size_t i) { return half_to_float(h_src[i]); },
        [&](std::size_t i, float v) { b_dst[i] = float_to_bf16(v); });
  } else {  // BF16 -> F16
    convert_loop(
        n, [&](std::size_t i) { return bf16_to_float(b_src[i]); },
        [&](std::size_t i, float v) { h_dst[i] = float_to_half(v); });
  }
}

double load_as_double(const void* base, DType t, std::size_t i) {
  switch (t) {
    case DType::F32:
      return static_cast<const float*>(base)[i];
    case DType::F16:
      return half_to_float(static_cast<const Half*>(base)[i]);
    case DType::BF16:
      return bf16_to_float(static_cast<const BFloat16*>(base)[i]);
    case DType::F64:
      return static_cast<const double*>(base)[i];
    case DType::I32:
      return static_cast<const std::int32_t*>(base)[i];
    case DType::I64:
      return static_cast<double>(static_cast<const std::int64_t*>(base)[i]);
    case DType::U8:
      return static_cast<const std::uint8_t*>(base)[i];
  }
  return 0;
}

void store_from_double(void* base, DType t, std::size_t i, double v) {
  switch (t) {
    case DType::F32:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      break;
    case DType::F16:
      static_cast<Half*>(base)[i] = float_to_half(static_cast<float>(v));
      break;
    case DType::BF16:
      static_cast<BFloat16*>(base)[i] = float_to_bf16(static_cast<float>(v));
      break;
    case DType::F64:
      static_cast<double*>(base)[i] = v;
      break;
    case DType::I32:
      static_cast<std::int32_t*>(base)[i] = static_cast<std::int32_t>(v);
      break;
    case DType::I64:
      static_cast<std::int64_t*>(base)[i] = static_cast<std::int64_t>(v);
      break;
    case DType::U8:
      static_cast<std::uint8_t*>(base)[i] = static_cast<std::uint8_t>(v);
      break;
  }
}

}  // namespace megazero
