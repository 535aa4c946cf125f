// nvcuda::wmma on the CPU: a fragment is a whole 16x16 tile held by the
// warp (the hardware's per-lane layout is not modelled: the kernels never touch
// fragment elements). Loads and stores check what the hardware requires:
// 32-byte aligned pointers, leading dimensions that are multiples of 16 bytes,
// and accesses inside the block's shared memory. A load is a warp's
// collective read: each lane reads the tile when it arrives (the emulated
// threads run in turn, so other warps may have run in between), then every
// lane's copy must equal lane 0's, else some thread wrote the tile without a
// barrier between its write and this read (a race on the GPU), and the
// emulation stops naming it.
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
template <typename F>
void emu_same_as_lane0(const F& f, const char* what) {
  const unsigned w = threadIdx.x >> 5, l = threadIdx.x & 31;
  emu_blk->lane_data[w][l] = &f;
  __syncwarp();
  const F& lane0 = *static_cast<const F*>(emu_blk->lane_data[w][0]);
  if (std::memcmp(&f, &lane0, sizeof(F)) != 0) {
    int at = 0;
    while (std::memcmp(&f.v[at / 16][at % 16], &lane0.v[at / 16][at % 16], sizeof(float)) == 0) ++at;
    std::fprintf(stderr,
                 "WMMA %s load: lane %u of warp %u (block %u) read other values than lane 0 (element (%d, %d): %g, "
                 "lane 0 %g): the tile was written without a barrier (__syncthreads/__syncwarp) between the write "
                 "and this read\n",
                 what, l, w, blockIdx.x, at / 16, at % 16, f.v[at / 16][at % 16], lane0.v[at / 16][at % 16]);
    std::abort();
  }
  __syncwarp();
}
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
  emu_check_ptr(p, ldm, sizeof(T));
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < 16; ++k) f.v[i][k] = ld(p[i * ldm + k]);
  emu_same_as_lane0(f, "matrix_a");
}
template <typename T, typename L>
void load_matrix_sync(fragment<matrix_b, 16, 16, 16, T, L>& f, const T* p, unsigned ldm) {
  emu_check_ptr(p, ldm, sizeof(T));
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 16; ++n) f.v[k][n] = std::is_same_v<L, row_major> ? ld(p[k * ldm + n]) : ld(p[n * ldm + k]);
  emu_same_as_lane0(f, "matrix_b");
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm, layout_t l) {
  emu_check_ptr(p, ldm, 4);
  assert(l == mem_row_major);
  for (int i = 0; i < 16; ++i)
    for (int n = 0; n < 16; ++n) f.v[i][n] = p[i * ldm + n];
  emu_same_as_lane0(f, "accumulator");
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
