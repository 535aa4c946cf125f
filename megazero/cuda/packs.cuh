// 16-byte packs, the unit every memory-bound kernel loads and stores: 8
// bf16/fp16, 4 fp32 or 2 fp64 values. Plain C++ (no CUDA intrinsics), so the
// kernels of megazero/cuda/*_kernels.cuh that use it also run in the CPU
// emulation of tests/cuda_emulation.
#pragma once

#include <cstdint>

namespace megazero::cuda::detail_k {

template <typename S>
constexpr int kVec = static_cast<int>(16 / sizeof(S));
template <typename S>
struct alignas(16) Pack {
  S v[kVec<S>];
};

// V values of S loaded and stored as one access: a kernel written over Vec<S,
// V> runs packed (V = kVec<S>) where rows are whole aligned packs and element
// by element (V = 1) elsewhere, from one body.
template <typename S, int V>
struct alignas(sizeof(S) * V) Vec {
  S v[V];
};

inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

}  // namespace megazero::cuda::detail_k
