// nvcuda::wmma on the CPU: a fragment is a whole 16x16 tile held by the
// warp (the hardware's per-lane layout is not modelled: the kernels never touch
// fragment elements). Loads and stores check what the hardware requires:
// 32-byte aligned pointers, leading dimensions that are multiples of 16 bytes,
// and accesses inside the block's shared memory.
#pragma once
#include "emu_runtime.h"
namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <typename Use, int M, int N, int K, typename T, typename L = void>
struct fragment {
  float v[16][16];
};
inline void emu_check_ptr(const void* p, unsigned ldm, std::size_t esize) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (a % 32 != 0) {
    std::fprintf(stderr, "WMMA pointer not 32-byte aligned: smem offset %ld\n", (long)(a - (uintptr_t)emu_smem_base));
    std::abort();
  }
  if ((ldm * esize) % 16 != 0) {
    std::fprintf(stderr, "WMMA ldm %u not multiple of 16 bytes\n", ldm);
    std::abort();
  }
  const auto base = (uintptr_t)emu_smem_base;
  if (a < base || a + (15 * ldm + 16) * esize > base + emu_smem_bytes) {
    std::fprintf(stderr, "WMMA access outside smem\n");
    std::abort();
  }
}
template <typename T, typename L>
void load_matrix_sync(fragment<matrix_a, 16, 16, 16, T, L>& f, const T* p, unsigned ldm) {
  static_assert(std::is_same_v<L, row_major>);
  __syncwarp();
  emu_check_ptr(p, ldm, sizeof(T));
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < 16; ++k) f.v[i][k] = ld(p[i * ldm + k]);
  __syncwarp();
}
template <typename T, typename L>
void load_matrix_sync(fragment<matrix_b, 16, 16, 16, T, L>& f, const T* p, unsigned ldm) {
  __syncwarp();
  emu_check_ptr(p, ldm, sizeof(T));
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 16; ++n) f.v[k][n] = std::is_same_v<L, row_major> ? ld(p[k * ldm + n]) : ld(p[n * ldm + k]);
  __syncwarp();
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm, layout_t l) {
  __syncwarp();
  emu_check_ptr(p, ldm, 4);
  assert(l == mem_row_major);
  for (int i = 0; i < 16; ++i)
    for (int n = 0; n < 16; ++n) f.v[i][n] = p[i * ldm + n];
  __syncwarp();
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm, layout_t l) {
  __syncwarp();
  emu_check_ptr(p, ldm, 4);
  assert(l == mem_row_major);
  if ((threadIdx.x & 31) == 0)
    for (int i = 0; i < 16; ++i)
      for (int n = 0; n < 16; ++n) p[i * ldm + n] = f.v[i][n];
  __syncwarp();
}
inline void fill_fragment(fragment<accumulator, 16, 16, 16, float>& f, float x) {
  for (auto& r : f.v)
    for (auto& e : r) e = x;
}
template <typename T, typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
  __syncwarp();
  fragment<accumulator, 16, 16, 16, float> r;
  for (int i = 0; i < 16; ++i)
    for (int n = 0; n < 16; ++n) {
      float s = c.v[i][n];
      for (int k = 0; k < 16; ++k) s += a.v[i][k] * b.v[k][n];
      r.v[i][n] = s;
    }
  d = r;
  __syncwarp();
}
}  // namespace nvcuda::wmma
