#include "megazero/data/blend.h"

#include <cmath>

#include "megazero/core/error.h"

namespace megazero::data {

BlendSchedule::BlendSchedule(std::vector<double> w, std::int64_t block, const std::string& flag) {
  MZ_REQUIRE(!w.empty(), flag, ": no datasets");
  MZ_REQUIRE(block >= static_cast<std::int64_t>(w.size()), flag, ": more datasets than the blend block holds");
  double total = 0;
  for (double x : w) {
    MZ_REQUIRE(std::isfinite(x) && x > 0, flag, ": dataset weights must be positive numbers, got ", x);
    total += x;
  }
  for (double& x : w) x /= total;
  per_block_.assign(w.size(), 0);
  slot_dataset_.resize(static_cast<std::size_t>(block));
  slot_rank_.resize(static_cast<std::size_t>(block));
  for (std::int64_t s = 0; s < block; ++s) {
    // Megatron's greedy rule: the dataset with the largest deficit w_d (s+1) - taken_d.
    std::size_t best = 0;
    double best_deficit = -1e300;
    for (std::size_t d = 0; d < w.size(); ++d) {
      const double deficit = w[d] * static_cast<double>(s + 1) - static_cast<double>(per_block_[d]);
      if (deficit > best_deficit) {
        best = d;
        best_deficit = deficit;
      }
    }
    slot_dataset_[static_cast<std::size_t>(s)] = static_cast<int>(best);
    slot_rank_[static_cast<std::size_t>(s)] = per_block_[best]++;
  }
  for (std::size_t d = 0; d < w.size(); ++d)
    MZ_REQUIRE(per_block_[d] > 0, flag, ": dataset ", d + 1, "'s weight ", w[d],
               " is too small to be sampled (below 1/", block, " of the blend)");
}

BlendSchedule::Pick BlendSchedule::pick(std::int64_t i) const {
  const std::int64_t block = block_size(), b = i / block, s = i % block;
  const int d = slot_dataset_[static_cast<std::size_t>(s)];
  return {d, b * per_block_[static_cast<std::size_t>(d)] + slot_rank_[static_cast<std::size_t>(s)]};
}

void parse_blend(const std::vector<std::string>& tokens, std::vector<double>& weights,
                 std::vector<std::string>& prefixes, const std::string& flag) {
  weights.clear();
  prefixes.clear();
  if (tokens.size() == 1) {
    weights.push_back(1.0);
    prefixes.push_back(tokens[0]);
    return;
  }
  MZ_REQUIRE(!tokens.empty() && tokens.size() % 2 == 0, flag,
             " takes one dataset prefix, or weight-prefix pairs (e.g. 0.3 wiki 0.7 books); got ", tokens.size(),
             " values");
  for (std::size_t i = 0; i < tokens.size(); i += 2) {
    std::size_t used = 0;
    double w = 0;
    try {
      w = std::stod(tokens[i], &used);
    } catch (...) {
      used = 0;
    }
    MZ_REQUIRE(used == tokens[i].size() && !tokens[i].empty(), flag, ": '", tokens[i],
               "' should be the weight of dataset '", tokens[i + 1], "' (weight-prefix pairs: 0.3 wiki 0.7 books)");
    weights.push_back(w);
    prefixes.push_back(tokens[i + 1]);
  }
}

}  // namespace megazero::data
