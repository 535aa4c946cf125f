// What a forward pass needs to know about where it is in training: the keys of
// its dropout masks. Masks depend on the *global* sample index, so the same
// sample gets the same mask whatever the DP size or micro-batch split.
#pragma once

#include <cstdint>

namespace megazero::layers {

struct StepInfo {
  std::uint64_t seed = 1234;    // --seed
  std::uint64_t iteration = 0;  // training iteration
  std::int64_t sample_offset =
      0;  // global index (within the iteration's global batch) of this micro-batch's first sample
  std::int64_t micro_batch = 1;  // samples in this micro-batch (B)
  std::int64_t seq = 1;          // sequence length (S)
  bool training = true;          // false: evaluation (no dropout, nothing kept for a backward)
};

}  // namespace megazero::layers
