#include "megazero/zero/flat_layout.h"

#include "megazero/core/error.h"

namespace megazero::zero {

FlatLayout::FlatLayout(const std::vector<std::int64_t>& numels, const std::vector<int>& groups, int dp_size)
    : dp_(dp_size) {
  MZ_CHECK(dp_size > 0, "FlatLayout: dp size ", dp_size);
  MZ_CHECK(numels.size() == groups.size(), "FlatLayout: ", numels.size(), " sizes for ", groups.size(), " groups");
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < numels.size(); ++i) {
    MZ_CHECK(numels[i] >= 0, "FlatLayout: negative parameter size");
    const int g = groups[i];
    MZ_CHECK(g >= 0 && (i == 0 || g >= groups[i - 1]), "FlatLayout: groups must be non-decreasing");
    params_.push_back({offset, offset + numels[i]});
    while (static_cast<int>(groups_.size()) <= g) groups_.push_back({offset, offset});
    groups_[static_cast<std::size_t>(g)].end = offset + numels[i];
    offset += numels[i];
  }
  unpadded_ = offset;
  const std::int64_t unit = kAlignment * dp_;
  padded_ = (offset + unit - 1) / unit * unit;
  if (padded_ == 0) padded_ = unit;
}

Range FlatLayout::partition(int d) const {
  MZ_CHECK(d >= 0 && d < dp_, "FlatLayout: dp rank ", d, " of ", dp_);
  return {d * partition_size(), (d + 1) * partition_size()};
}

std::vector<std::int64_t> FlatLayout::split_counts(const Range& r) const {
  std::vector<std::int64_t> counts(static_cast<std::size_t>(dp_));
  for (int d = 0; d < dp_; ++d) counts[static_cast<std::size_t>(d)] = r.intersect(partition(d)).size();
  return counts;
}

std::vector<Range> FlatLayout::buckets(std::int64_t bucket_size) const {
  MZ_CHECK(bucket_size > 0, "FlatLayout: bucket size ", bucket_size);
  std::vector<Range> out;
  for (std::int64_t b = 0; b < padded_; b += bucket_size) out.push_back({b, std::min(padded_, b + bucket_size)});
  return out;
}

}  // namespace megazero::zero
