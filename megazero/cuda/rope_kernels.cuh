// The device kernel of the rotary position embedding (contract:
// megazero/kernels/rope.h; launcher: rope.cu). Kept apart, kernel only, so
// that tests/cuda_emulation runs it on the CPU as it is.
#pragma once

#include <cstdint>
#include <type_traits>

#include "megazero/cuda/kernel_common.cuh"
#include "megazero/kernels/rope_frequencies.h"

namespace megazero::cuda::detail_k {

// Angles a block tabulates at a time (in shared memory, cos and sin).
constexpr int kRopeTile = 256;

// a * b rounded on its own: nvcc would otherwise fuse x0 * cos - x1 * sin into
// a multiply-add, where the CPU kernel rounds both products.
template <typename T>
__device__ __forceinline__ T rope_mul(T a, T b) {
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same_v<T, double>)
    return __dmul_rn(a, b);
  else
    return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// in, out: [n, seq, d] with n = samples x heads, row pos at position first +
// pos, or positions[sample * seq + pos] when given. blockIdx.y is (sample,
// chunk of that sample's heads): block (blockIdx.x, blockIdx.y) handles rows
// blockIdx.x + k * gridDim.x and blocks [chunk * per_block, ...) of the
// sample's heads: for each tile of pairs it takes cos/sin of theta = position
// * rope_inv_freq(base, i, d, llama3_factor) (kernels/rope_frequencies.h) once
// (double, rounded to the compute type), then rotates those pairs of its rows
// (BACKWARD: by -theta). per_block * kRopeTile < 2^31 (the launcher sees to
// it), so the work index divides in 32 bits. Each pair is read before either
// half is written, so out may alias in. interleaved: pair k is (2k, 2k + 1),
// not (k, k + d/2).
template <typename S, bool BACKWARD>
__global__ void rope_kernel(const S* in, double base, S* out, i64 heads, i64 seq, i64 d, i64 per_block, i64 first,
                            const std::int64_t* positions, i64 chunks, double position_scale, bool interleaved,
                            double llama3_factor) {
  using C = compute_t<S>;
  __shared__ C cs[kRopeTile];
  __shared__ C sn[kRopeTile];
  const i64 half = d / 2;
  const i64 first_of = interleaved ? 2 : 1, partner = interleaved ? 1 : half;
  const i64 sample = static_cast<i64>(blockIdx.y) / chunks, chunk = static_cast<i64>(blockIdx.y) % chunks;
  const i64 b0 = sample * heads + chunk * per_block, b1 = min((sample + 1) * heads, b0 + per_block);
  if (b0 >= b1) return;  // the whole block: no barrier is skipped by part of it
  for (i64 pos = blockIdx.x; pos < seq; pos += gridDim.x) {
    const i64 p = positions ? positions[sample * seq + pos] : first + pos;
    for (i64 i0 = 0; i0 < half; i0 += kRopeTile) {
      const i64 len = min(static_cast<i64>(kRopeTile), half - i0);
      __syncthreads();  // the previous tile's readers are done
      for (i64 k = threadIdx.x; k < len; k += blockDim.x) {
        const double theta = static_cast<double>(p) * position_scale *
                             ::megazero::kernels::rope_inv_freq(base, i0 + k, d, llama3_factor);
        cs[k] = static_cast<C>(cos(theta));
        sn[k] = static_cast<C>(sin(theta));
      }
      __syncthreads();
      const unsigned ulen = static_cast<unsigned>(len);
      const unsigned work = static_cast<unsigned>((b1 - b0) * len);
      for (unsigned w = threadIdx.x; w < work; w += blockDim.x) {
        const unsigned q = w / ulen, k = w - q * ulen;
        const i64 base_idx = ((b0 + q) * seq + pos) * d + (i0 + k) * first_of;
        const C x0 = ld(in[base_idx]), x1 = ld(in[base_idx + partner]);
        const C x0c = rope_mul(x0, cs[k]), x1s = rope_mul(x1, sn[k]);
        const C x1c = rope_mul(x1, cs[k]), x0s = rope_mul(x0, sn[k]);
        if constexpr (BACKWARD) {
          out[base_idx] = st<S>(x0c + x1s);
          out[base_idx + partner] = st<S>(x1c - x0s);
        } else {
          out[base_idx] = st<S>(x0c - x1s);
          out[base_idx + partner] = st<S>(x1c + x0s);
        }
      }
    }
  }
}

}  // namespace megazero::cuda::detail_k
