// Philox-4x32-10 on the device, bit-identical to megazero/kernels/rng.cpp, so
// a GPU dropout mask is the CPU's: uniform(key, i) = (word (i & 3) of block
// i >> 2) >> 8, times 2^-24. Included only by .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "megazero/kernels/rng.h"

namespace megazero::cuda::detail_k {

struct PhiloxKey {
  unsigned k0, k1;       // key words
  unsigned layer, iter;  // counter words 2 and 3
};

inline PhiloxKey philox_key(const RngKey& key) {
  const auto lo = [](std::uint64_t v) { return static_cast<unsigned>(v); };
  const auto hi = [](std::uint64_t v) { return static_cast<unsigned>(v >> 32); };
  return {lo(key.seed), hi(key.seed) ^ (key.site * 0x9E3779B9u), key.layer,
          lo(key.iteration) ^ (hi(key.iteration) * 0x85EBCA6Bu)};
}

__device__ __forceinline__ uint4 philox(std::uint64_t block, const PhiloxKey& k) {
  unsigned c0 = static_cast<unsigned>(block), c1 = static_cast<unsigned>(block >> 32), c2 = k.layer, c3 = k.iter;
  unsigned k0 = k.k0, k1 = k.k1;
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const unsigned hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const unsigned hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const unsigned n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  return make_uint4(c0, c1, c2, c3);
}

__device__ __forceinline__ unsigned word(const uint4& w, unsigned i) {
  return i == 0 ? w.x : i == 1 ? w.y : i == 2 ? w.z : w.w;
}

// keep = uniform >= p, decided on the 24-bit integer: uniform = w * 2^-24
// exactly, so uniform >= p  <=>  w >= ceil(p * 2^24) (p * 2^24 is exact in
// double). The same decision as the CPU's float-against-double compare, with
// no conversion per element (an int-to-float, a float-to-double and a double
// compare, on conversion units a quarter as wide as the integer ones).
__host__ __device__ inline std::uint32_t keep_threshold(double p) {
  return p <= 0 ? 0u : static_cast<std::uint32_t>(ceil(p * 16777216.0));
}
// The keep decision for 32-bit Philox word w (its top 24 bits are the uniform).
__host__ __device__ __forceinline__ bool kept(unsigned w, std::uint32_t threshold) { return (w >> 8) >= threshold; }

}  // namespace megazero::cuda::detail_k
