// Counter-based random numbers (Philox-4x32-10, Salmon et al., SC 2011).
// A random value is a pure function of (seed, stream, global element index):
// no state to save, nothing that depends on how a tensor is split across
// ranks. Dropout masks and weight initialisation key on *global* coordinates,
// so any TP/DP layout draws the same value for the same element, and
// activation recompute reproduces a mask without saving RNG state.
#pragma once

#include <array>
#include <cstdint>

namespace megazero {

// Identifies one independent stream of random numbers.
struct RngKey {
  std::uint64_t seed = 0;       // --seed
  std::uint64_t iteration = 0;  // training iteration (dropout); 0 for init
  std::uint32_t layer = 0;      // layer number, or parameter id for init
  std::uint32_t site = 0;       // which use inside the layer (see RngSite)
};

// Distinct uses of randomness; part of the key so they never collide.
enum RngSite : std::uint32_t {
  kRngInit = 1,
  kRngEmbeddingDropout = 2,
  kRngAttentionDropout = 3,
  kRngAttentionOutputDropout = 4,
  kRngMlpOutputDropout = 5,
};

// One Philox-4x32-10 block: 4 random 32-bit words for a 128-bit counter.
std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> counter, std::array<std::uint32_t, 2> key);

// Uniform in [0, 1) (24 random bits) for element `index` of stream `key`.
float uniform_at(const RngKey& key, std::uint64_t index);

// The same values as uniform_at, for reads of nearby indices: each Philox
// block yields four consecutive values, so walking indices in order costs a
// quarter of the blocks (dropout's inner loop).
class UniformStream {
 public:
  explicit UniformStream(const RngKey& key);
  float at(std::uint64_t index) {
    const std::uint64_t block = index >> 2;
    if (block != block_) refill(block);
    return static_cast<float>(words_[index & 3u] >> 8) * 0x1p-24f;
  }
  // out[j] = at(first + j) for j < n (at most kFillMax), the Philox blocks
  // computed many at a time in vector registers (dropout's masks).
  static constexpr std::int64_t kFillMax = 4096;
  void fill(std::uint64_t first, std::int64_t n, float* out) const;

 private:
  void refill(std::uint64_t block);
  RngKey key_;
  std::uint64_t block_ = ~std::uint64_t{0};  // none yet: block numbers stop at 2^62 - 1
  std::array<std::uint32_t, 4> words_{};
};
// Standard normal for element `index` (Box-Muller on two uniforms), in double
// so fp64 reference runs see the same values rounded once.
double normal_at(const RngKey& key, std::uint64_t index);

// The same values as normal_at, for reads of nearby indices: indices 2b and
// 2b + 1 share Philox block b, so walking indices in order costs half the
// blocks (weight initialisation).
class NormalStream {
 public:
  explicit NormalStream(const RngKey& key);
  double at(std::uint64_t index) {
    const std::uint64_t block = index >> 1;
    if (block != block_) refill(block);
    return from_words(words_[2 * (index & 1u)], words_[2 * (index & 1u) + 1]);
  }
  // Box-Muller on two Philox words (normal_at's formula).
  static double from_words(std::uint32_t w1, std::uint32_t w2);

 private:
  void refill(std::uint64_t block);
  RngKey key_;
  std::uint64_t block_ = ~std::uint64_t{0};
  std::array<std::uint32_t, 4> words_{};
};

}  // namespace megazero
