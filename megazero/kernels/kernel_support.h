// Internal to the kernel sources: what the CPU kernels of the layer kernel
// families (layernorm.cpp, gelu_bias.cpp, softmax.cpp, dropout.cpp,
// embedding.cpp, cross_entropy.cpp) and fused_attention.cpp share: element
// types and their load/store rounding rules, argument validation with messages
// naming the operand, and the device dispatch (MZ_ON_CUDA, on_host). Their
// loop shapes are cpu_loops.h. Not part of the public kernel API.
#pragma once

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "megazero/kernels/cpu_threads.h"
#include "megazero/core/error.h"
#include "megazero/kernels/conventions.h"
#include "megazero/kernels/dropout.h"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/vector_math.h"
#ifdef MEGAZERO_WITH_CUDA
#include "megazero/cuda/cuda_device.h"
#endif

namespace megazero::kernels::detail {

using i64 = std::int64_t;

// Below this many elements a parallel region costs more than it saves.
constexpr i64 kParallelMin = i64{1} << 15;

inline int threads() { return cpu_math_threads(); }

// ---- element types ----

template <typename S>
constexpr bool is_16bit_v = std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>;

inline bool is_16bit(DType t) { return t == DType::BF16 || t == DType::F16; }

// The type a storage type is computed in.
template <typename S>
struct ComputeOf {
  using type = S;
};
template <>
struct ComputeOf<Half> {
  using type = float;
};
template <>
struct ComputeOf<BFloat16> {
  using type = float;
};
template <typename S>
using compute_t = typename ComputeOf<S>::type;

// Load: storage -> compute type (exact).
template <typename S>
compute_t<S> ld(S v) {
  return widen(v);
}

// double -> float rounded to odd: truncate, then set the last bit if inexact.
// Rounding that to bf16/fp16 (>= 2 bits fewer) to nearest even gives exactly
// the nearest-even rounding of the double: one rounding, not two.
// Branch-free (selects, not jumps), so loops of 16-bit stores vectorise.
inline float to_float_round_odd(double d) {
  const float f = static_cast<float>(d);
  const double back = f;
  const std::uint32_t u = f32_bits(f);
  // Inexact with an even last bit: take the odd neighbour on d's side.
  const bool to_odd = back != d && !std::isnan(d) && (u & 1u) == 0;
  const std::uint32_t toward_d = std::isgreater(std::fabs(back), std::fabs(d)) ? 0xffffffffu : 1u;  // quiet on NaN
  return f32_from_bits(u + (to_odd ? toward_d : 0u));
}

// Store: a float or double result -> storage type S, rounded once to nearest even.
template <typename S, typename V>
S st(V v) {
  static_assert(std::is_same_v<V, float> || std::is_same_v<V, double>);
  if constexpr (is_16bit_v<S>) {
    float f;
    if constexpr (std::is_same_v<V, double>)
      f = to_float_round_odd(v);
    else
      f = v;
    if constexpr (std::is_same_v<S, Half>)
      return float_to_half(f);
    else
      return float_to_bf16(f);
  } else {
    return static_cast<S>(v);
  }
}

template <typename S>
S zero() {
  return st<S>(compute_t<S>{0});
}

// ---- validation ----

inline constexpr const char* kStorageDtypes = "fp32, fp64, bf16 or fp16";

inline void check_float(const char* op, const char* name, const Tensor& t) {
  MZ_CHECK(t.defined(), op, ": ", name, " is undefined");
  MZ_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::F64 || is_16bit(t.dtype()), op, ": ", name, " must be ",
           kStorageDtypes, ", got ", t.to_string());
}

// `t` is a contiguous tensor of `dtype` on the same device as `ref`.
inline void check_operand(const char* op, const char* name, const Tensor& t, const Tensor& ref, DType dtype) {
  MZ_CHECK(t.defined(), op, ": ", name, " is undefined");
  MZ_CHECK(t.dtype() == dtype, op, ": ", name, " must be ", dtype_name(dtype), ", got ", t.to_string());
  MZ_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous, got ", t.to_string(), " with strides ",
           shape_str(t.strides()));
  MZ_CHECK(t.device().kind() == ref.device().kind() && t.device().index() == ref.device().index() &&
               t.device().host_accessible() == ref.device().host_accessible(),
           op, ": ", name, " is on ", t.device().name(), " but the other operands are on ", ref.device().name());
}

// A per-row statistic of activations of dtype `storage`: row_stat_dtype(storage).
inline void check_stat(const char* op, const char* name, const Tensor& t, const Tensor& ref, DType storage) {
  MZ_CHECK(t.defined(), op, ": ", name, " is undefined");
  const DType want = row_stat_dtype(storage);
  MZ_CHECK(t.dtype() == want, op, ": ", name, " must be ", dtype_name(want),
           is_16bit(storage) ? " (per-row statistics of 16-bit activations are kept in fp32)" : "", ", got ",
           t.to_string(), " for ", dtype_name(storage), " activations");
  check_operand(op, name, t, ref, want);
}

// A parameter-gradient accumulator for activations of dtype `storage`: the
// storage dtype, or fp32 for 16-bit storage.
inline void check_accumulator(const char* op, const char* name, const Tensor& t, const Tensor& ref, DType storage) {
  MZ_CHECK(t.defined(), op, ": ", name, " is undefined");
  MZ_CHECK(is_grad_accumulator_dtype(storage, t.dtype()), op, ": ", name, " must be ", dtype_name(storage),
           is_16bit(storage) ? " or fp32" : "", " (a gradient accumulator for ", dtype_name(storage),
           " activations), got ", t.to_string());
  check_operand(op, name, t, ref, t.dtype());
}

inline void check_shape(const char* op, const char* name, const Tensor& t, const Shape& expected) {
  MZ_CHECK(t.shape() == expected, op, ": ", name, " has shape ", shape_str(t.shape()), ", expected ",
           shape_str(expected));
}

using Named = std::pair<const char*, const Tensor*>;

inline void check_operands(const char* op, const Tensor& ref, DType dtype, std::initializer_list<Named> operands) {
  for (const auto& [name, t] : operands) check_operand(op, name, *t, ref, dtype);
}

inline void check_shapes(const char* op, const Shape& shape, std::initializer_list<Named> operands) {
  for (const auto& [name, t] : operands) check_shape(op, name, *t, shape);
}

// A per-row vector (mean, rstd, row_max, ids, ...): one element per row.
inline void check_rows(const char* op, const char* name, const Tensor& t, i64 rows) {
  MZ_CHECK(t.dim() == 1 && t.size(0) == rows, op, ": ", name, " must have shape (", rows, "), got ",
           shape_str(t.shape()));
}

// Per-document masks (softmax.h, fused_attention.h, cudnn_attention.h):
// key_starts is int64 [samples * s], contiguous, on ref's device, and the
// samples divide the `mats` attention matrices (a sample's heads). Returns
// the samples; 0 when key_starts is undefined (no masks) or there is no work.
inline i64 key_start_samples(const char* op, const Tensor& ref, const Tensor& key_starts, i64 s, i64 mats) {
  if (!key_starts.defined() || mats == 0 || s == 0) return 0;
  check_operand(op, "key_starts", key_starts, ref, DType::I64);
  const i64 samples = key_starts.numel() / s;
  MZ_CHECK(key_starts.is_contiguous() && samples > 0 && key_starts.numel() == samples * s && mats % samples == 0, op,
           ": key_starts must be [B*S] with S = ", s, " and B dividing the ", mats, " matrices, got ",
           key_starts.to_string());
  return samples;
}

struct Rows {
  i64 rows, cols;
};

// "rows" = all leading dimensions flattened, "cols" = the last dimension.
inline Rows rows_of(const char* op, const char* name, const Tensor& t) {
  MZ_CHECK(t.dim() >= 1, op, ": ", name, " needs at least one dimension, got ", t.to_string());
  i64 rows = 1;
  for (int d = 0; d + 1 < t.dim(); ++d) rows *= t.size(d);
  return {rows, t.size(-1)};
}

// ---- dispatch ----

// On a CUDA tensor, runs `call` (a megazero::cuda kernel launcher on the
// tensor's device stream) and returns from the entry point.
#ifdef MEGAZERO_WITH_CUDA
inline cudaStream_t stream_of(const Tensor& t) { return as_cuda_device(t.device()).stream(); }
#define MZ_ON_CUDA(t, call)                      \
  if ((t).device().kind() == DeviceKind::CUDA) { \
    call;                                        \
    return;                                      \
  }
#else
#define MZ_ON_CUDA(t, call)
#endif

// True when the kernel runs on the host; false on the meta device (a dry run:
// shapes are checked, nothing is stored). CUDA tensors never get here
// (MZ_ON_CUDA dispatched them), except in a build without the CUDA backend.
inline bool on_host(const char* op, const Tensor& t) {
  switch (t.device().kind()) {
    case DeviceKind::Meta:
      return false;
    case DeviceKind::CPU:
      return true;
    case DeviceKind::CUDA:
      break;
  }
  throw InternalError(::megazero::detail::concat(op, " has no CUDA kernel yet (device ", t.device().name(), ")"));
}

// Whether two tensors' bytes overlap (never on the meta device: no storage).
inline bool storage_overlaps(const Tensor& a, const Tensor& b) {
  if (!a.device().has_storage() || a.nbytes() == 0 || b.nbytes() == 0) return false;
  const auto* a0 = static_cast<const unsigned char*>(a.data());
  const auto* b0 = static_cast<const unsigned char*>(b.data());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// ---- dropout layouts (dropout.h: DropoutLayout) ----

inline void check_layout(const char* op, const DropoutLayout& l, i64 numel) {
  MZ_CHECK(l.samples >= 0 && l.groups >= 0 && l.matrix_rows >= 0 && l.matrix_cols >= 0, op,
           ": negative dropout layout size");
  MZ_CHECK(l.samples * l.groups * l.matrix_rows * l.matrix_cols == numel, op,
           ": layout [samples, groups, matrix_rows, matrix_cols] = [", l.samples, ", ", l.groups, ", ", l.matrix_rows,
           ", ", l.matrix_cols, "] does not cover the tensor's ", numel, " elements");
  MZ_CHECK(l.sample_offset >= 0 && l.group_offset >= 0 && l.group_offset + l.groups <= l.global_groups, op,
           ": sample_offset ", l.sample_offset, " and group_offset ", l.group_offset, " with groups ", l.groups,
           " must satisfy sample_offset >= 0, 0 <= group_offset, group_offset + groups <= global_groups = ",
           l.global_groups);
}

// Global index of element (row, 0, 0) of a layout, row in [0, samples * groups):
// the first of its matrix_rows * matrix_cols elements.
inline std::uint64_t dropout_row_base(const DropoutLayout& l, i64 row) {
  const i64 global_row = (l.sample_offset + row / l.groups) * l.global_groups + l.group_offset + row % l.groups;
  return static_cast<std::uint64_t>(global_row) * static_cast<std::uint64_t>(l.matrix_rows * l.matrix_cols);
}

// ---- vocabulary slices (embedding.h, cross_entropy.h) ----

// Local column of a global target, or -1 when another rank holds it.
inline i64 local_column(std::int64_t target, i64 vocab_start, i64 valid) {
  const i64 c = target - vocab_start;
  return c >= 0 && c < valid ? c : -1;
}

// Calls fn(S{}) with the storage type S of the dtype (already validated).
template <typename Fn>
void with_storage_type(DType t, Fn&& fn) {
  switch (t) {
    case DType::F64:
      fn(double{});
      break;
    case DType::BF16:
      fn(BFloat16{});
      break;
    case DType::F16:
      fn(Half{});
      break;
    default:
      fn(float{});
      break;
  }
}

// Calls fn(G{}) with the type G of a parameter-gradient accumulator for storage
// type S (already validated): S itself, or float for 16-bit S.
template <typename S, typename Fn>
void with_accumulator_type(const Tensor& acc, Fn&& fn) {
  if constexpr (is_16bit_v<S>) {
    if (acc.dtype() == DType::F32) {
      fn(float{});
      return;
    }
  }
  fn(S{});
}

// Typed pointer to a CPU kernel's operand, at the address the kernel works on
// (the device's compute address: the isolated device's read-write view of its
// memory); ptr<const T> for inputs. The one way the CPU kernels reach memory.
template <typename T>
T* ptr(const Tensor& t) {
  MZ_CHECK(t.dtype() == DTypeOf<std::remove_const_t<T>>::value, "kernel operand ", t.to_string(), " accessed as ",
           dtype_name(DTypeOf<std::remove_const_t<T>>::value));
  return static_cast<T*>(t.device().compute_address(t.data()));
}

}  // namespace megazero::kernels::detail
