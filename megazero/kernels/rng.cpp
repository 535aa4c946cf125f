// Philox-4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy
// as 1, 2, 3", SC 2011), bit-identical to Random123's philox4x32_R(10, ...), and
// the fixed mapping from (RngKey, element index) to its counter and key.
//
// The mapping (a contract: checkpoints, the CUDA kernels and the tests depend on it):
//   key     = { uint32(seed), uint32(seed >> 32) ^ (site * 0x9E3779B9) }
//   counter = { uint32(block), uint32(block >> 32), layer, iter_word }
//     iter_word = uint32(iteration) ^ uint32(iteration >> 32) * 0x85EBCA6B
//   uniform_at(key, i): block = i >> 2, word = lane i & 3,
//                       u = (word >> 8) * 2^-24, in [0, 1), exact in fp32.
//   normal_at(key, i):  block = i >> 1, words 2*(i&1) and 2*(i&1)+1 give
//                       u1, u2 = (word + 1) * 2^-32, in (0, 1] so log(u1) is finite;
//                       z = sqrt(-2 ln u1) * cos(2 pi u2), in double.
// The site is mixed into the key (an odd multiplier keeps distinct sites
// distinct), the layer and iteration into the counter, so every (seed, site,
// layer, iteration) is its own stream of 2^66 values (2^65 normals). Uniforms and
// normals of the same key share counters, which is harmless because a site
// draws only one kind.
#include "megazero/kernels/rng.h"

#include <cmath>
#include <numbers>

#include "megazero/core/error.h"

namespace megazero {
namespace {

constexpr std::uint32_t kMul0 = 0xD2511F53u;
constexpr std::uint32_t kMul1 = 0xCD9E8D57u;
constexpr std::uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
constexpr std::uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1
constexpr int kRounds = 10;

using Block = std::array<std::uint32_t, 4>;
using Key = std::array<std::uint32_t, 2>;

inline void mul_hi_lo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi, std::uint32_t& lo) {
  const std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(p >> 32);
  lo = static_cast<std::uint32_t>(p);
}

// One Philox S-box round, Random123's _philox4x32round.
inline Block round(const Block& c, const Key& k) {
  std::uint32_t hi0, lo0, hi1, lo1;
  mul_hi_lo(kMul0, c[0], hi0, lo0);
  mul_hi_lo(kMul1, c[2], hi1, lo1);
  return {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
}

inline std::uint32_t lo32(std::uint64_t v) { return static_cast<std::uint32_t>(v); }
inline std::uint32_t hi32(std::uint64_t v) { return static_cast<std::uint32_t>(v >> 32); }

Key key_words(const RngKey& key) { return {lo32(key.seed), hi32(key.seed) ^ (key.site * kWeyl0)}; }

Block counter_words(const RngKey& key, std::uint64_t block) {
  const std::uint32_t iter_word = lo32(key.iteration) ^ (hi32(key.iteration) * 0x85EBCA6Bu);
  return {lo32(block), hi32(block), key.layer, iter_word};
}

}  // namespace

std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> counter, std::array<std::uint32_t, 2> key) {
  counter = round(counter, key);
  for (int r = 1; r < kRounds; ++r) {  // the key is bumped between rounds, not before the first
    key[0] += kWeyl0;
    key[1] += kWeyl1;
    counter = round(counter, key);
  }
  return counter;
}

UniformStream::UniformStream(const RngKey& key) : key_(key) {}

void UniformStream::refill(std::uint64_t block) {
  words_ = philox4x32(counter_words(key_, block), key_words(key_));
  block_ = block;
}

namespace {
// Philox blocks first .. first + n - 1 of one key, one lane per block so the
// compiler keeps many in vector registers (the 32 x 32 -> 64-bit products
// as vpmuludq); the same words as philox4x32, written word-major: w[j][i].
__attribute__((target_clones("avx512f", "avx2", "default"))) void philox_blocks(
    std::uint64_t first, std::int64_t n, Block counter_hi, Key key, std::uint32_t* __restrict w0,
    std::uint32_t* __restrict w1, std::uint32_t* __restrict w2, std::uint32_t* __restrict w3) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint64_t b = first + static_cast<std::uint64_t>(i);
    std::uint32_t c0 = lo32(b), c1 = hi32(b), c2 = counter_hi[2], c3 = counter_hi[3];
    std::uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < kRounds; ++r) {
      if (r > 0) k0 += kWeyl0, k1 += kWeyl1;
      const std::uint64_t p0 = static_cast<std::uint64_t>(kMul0) * c0, p1 = static_cast<std::uint64_t>(kMul1) * c2;
      const std::uint32_t n0 = hi32(p1) ^ c1 ^ k0, n2 = hi32(p0) ^ c3 ^ k1;
      c0 = n0, c1 = static_cast<std::uint32_t>(p1), c2 = n2, c3 = static_cast<std::uint32_t>(p0);
    }
    w0[i] = c0, w1[i] = c1, w2[i] = c2, w3[i] = c3;
  }
}
}  // namespace

void UniformStream::fill(std::uint64_t first, std::int64_t n, float* out) const {
  MZ_CHECK(n >= 0 && n <= kFillMax, "UniformStream::fill: ", n, " values (at most ", kFillMax, ")");
  if (n == 0) return;
  const std::uint64_t b0 = first >> 2, b1 = (first + static_cast<std::uint64_t>(n) - 1) >> 2;
  const auto blocks = static_cast<std::int64_t>(b1 - b0 + 1);
  alignas(64) std::uint32_t w[4][kFillMax / 4 + 2];
  philox_blocks(b0, blocks, counter_words(key_, b0), key_words(key_), w[0], w[1], w[2], w[3]);
  for (std::int64_t j = 0; j < n; ++j) {
    const std::uint64_t i = first + static_cast<std::uint64_t>(j);
    out[j] = static_cast<float>(w[i & 3u][(i >> 2) - b0] >> 8) * 0x1p-24f;
  }
}

// The top 24 bits fill an fp32 mantissa exactly, so the value is the same in
// fp32 and fp64 and never rounds up to 1 (see UniformStream::at).
float uniform_at(const RngKey& key, std::uint64_t index) { return UniformStream(key).at(index); }

double NormalStream::from_words(std::uint32_t w1, std::uint32_t w2) {
  const double u1 = (static_cast<double>(w1) + 1.0) * 0x1p-32;  // (0, 1]: log(u1) is finite
  const double u2 = (static_cast<double>(w2) + 1.0) * 0x1p-32;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

NormalStream::NormalStream(const RngKey& key) : key_(key) {}

void NormalStream::refill(std::uint64_t block) {
  words_ = philox4x32(counter_words(key_, block), key_words(key_));
  block_ = block;
}

double normal_at(const RngKey& key, std::uint64_t index) {
  const Block w = philox4x32(counter_words(key, index >> 1), key_words(key));
  const std::size_t lane = 2 * static_cast<std::size_t>(index & 1u);
  return NormalStream::from_words(w[lane], w[lane + 1]);
}

}  // namespace megazero
