// One source of truth for ZeRO sizes: how one TP rank's parameters lie in a
// flat buffer and how that buffer is partitioned over the data-parallel group.
// Pure integer math — the runtime allocates from it and the memory planner
// reports from it, so the plan cannot drift from the run.
//
// Parameters are packed in declaration (forward) order without gaps; the total
// is padded to a multiple of dp_size x kAlignment so every DP rank owns an
// equal, aligned partition: rank d owns [d P, (d+1) P).
#pragma once

#include <cstdint>
#include <vector>

namespace megazero::zero {

struct Range {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end > begin ? end - begin : 0; }
  bool empty() const { return size() == 0; }
  Range intersect(const Range& o) const {
    return {std::max(begin, o.begin), std::max(std::max(begin, o.begin), std::min(end, o.end))};
  }
  bool operator==(const Range&) const = default;
};

class FlatLayout {
 public:
  static constexpr std::int64_t kAlignment = 64;  // elements: partitions start on cache lines

  // param_numels[i], param_groups[i]: size and group of parameter i, in order
  // (groups non-decreasing).
  FlatLayout(const std::vector<std::int64_t>& param_numels, const std::vector<int>& param_groups, int dp_size);

  std::int64_t numel() const { return padded_; }  // Psi (padded), per TP rank
  std::int64_t unpadded_numel() const { return unpadded_; }
  int dp_size() const { return dp_; }
  std::int64_t partition_size() const { return padded_ / dp_; }
  Range partition(int dp_rank) const;
  Range param(std::size_t i) const { return params_[i]; }
  std::size_t num_params() const { return params_.size(); }
  int num_groups() const { return static_cast<int>(groups_.size()); }
  Range group(int g) const { return groups_[static_cast<std::size_t>(g)]; }
  // Elements of `r` that fall in each rank's partition, in rank order: the
  // counts of a reduce-scatter / all-gather over `r`.
  std::vector<std::int64_t> split_counts(const Range& r) const;
  // Constant-size buckets tiling [0, numel()) (the last may be shorter).
  std::vector<Range> buckets(std::int64_t bucket_size) const;

 private:
  std::vector<Range> params_, groups_;
  std::int64_t unpadded_ = 0, padded_ = 0;
  int dp_;
};

}  // namespace megazero::zero
