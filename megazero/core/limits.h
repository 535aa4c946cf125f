// Upper bounds on what a run may ask for, far above any job run (the largest
// GPU clusters hold ~10^5 GPUs; training runs take ~10^6 iterations): a typo's
// extra digits are refused where they are read — flags, the topology tool,
// checkpoint manifests — with the same numbers everywhere.
#pragma once

#include <cstdint>

namespace megazero::limits {

inline constexpr int kMaxRanks = 1 << 20;                          // --world-size, a manifest's TP and DP
inline constexpr std::int64_t kMaxIterations = 1'000'000'000'000;  // --train-iters, a manifest's iteration
inline constexpr std::int64_t kMaxBatch = std::int64_t{1} << 40;   // samples per (micro-)batch

}  // namespace megazero::limits
