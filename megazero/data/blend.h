// Blending several datasets with weights (Megatron's `--data-path 0.3 A 0.7 B`)
// as a pure function of the sample index, so every rank, layout and resumed
// run agrees without a precomputed index of the whole run.
//
// A block of `block_size` consecutive samples is assigned greedily: each slot
// goes to the dataset furthest behind its share (Megatron's rule), which
// gives every dataset round(weight x block) slots, spread evenly. Blocks
// repeat, so blended sample i is sample (i / block) * count[d] + rank-in-block
// of dataset d: each dataset is read in order 0, 1, 2, ... with no gap or
// repeat, and the mix is exact to 1 / block_size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megazero::data {

class BlendSchedule {
 public:
  static constexpr std::int64_t kDefaultBlock = 4096;
  // Weights > 0 (normalised here). ConfigError naming `flag` otherwise.
  BlendSchedule(std::vector<double> weights, std::int64_t block_size = kDefaultBlock,
                const std::string& flag = "--data-path");

  struct Pick {
    int dataset;
    std::int64_t index;  // sample index within that dataset
  };
  Pick pick(std::int64_t i) const;
  std::size_t num_datasets() const { return per_block_.size(); }
  // Slots per block of each dataset (its realised share x block size).
  std::int64_t slots_per_block(std::size_t d) const { return per_block_[d]; }
  std::int64_t block_size() const { return static_cast<std::int64_t>(slot_dataset_.size()); }

 private:
  std::vector<int> slot_dataset_;
  std::vector<std::int64_t> slot_rank_;  // rank of the slot among its dataset's slots in the block
  std::vector<std::int64_t> per_block_;
};

// "0.3 A 0.7 B" (tokens) or "A" (one dataset, weight 1) -> weights and prefixes.
// ConfigError naming `flag` for odd token counts or bad weights.
void parse_blend(const std::vector<std::string>& tokens, std::vector<double>& weights,
                 std::vector<std::string>& prefixes, const std::string& flag = "--data-path");

}  // namespace megazero::data
