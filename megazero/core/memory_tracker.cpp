#include "megazero/core/memory_tracker.h"

#include <algorithm>
#include <sstream>

#include "megazero/core/error.h"

namespace megazero {

std::string_view memory_category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::Parameters:
      return "parameters";
    case MemoryCategory::Gradients:
      return "gradients";
    case MemoryCategory::OptimizerStates:
      return "optimizer_states";
    case MemoryCategory::Activations:
      return "activations";
    case MemoryCategory::ActivationCheckpoints:
      return "activation_checkpoints";
    case MemoryCategory::CommBuffers:
      return "comm_buffers";
    case MemoryCategory::Workspace:
      return "workspace";
    case MemoryCategory::Other:
      return "other";
    case MemoryCategory::kCount:
      break;
  }
  return "?";
}

std::string MemorySnapshot::to_string() const {
  std::ostringstream os;
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i) {
    const auto& c = by_category[i];
    if (c.allocations == 0) continue;
    os << memory_category_name(static_cast<MemoryCategory>(i)) << ": live " << c.live_bytes << " B, peak "
       << c.peak_bytes << " B\n";
  }
  os << "total: live " << total_live_bytes << " B, peak " << total_peak_bytes << " B\n";
  return os.str();
}

std::int64_t FirstFitHeap::allocate(std::int64_t bytes) {
  const std::int64_t b = rounded(bytes);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < b) continue;
    const std::int64_t at = it->first, rest = it->second - b;
    free_.erase(it);
    if (rest > 0) free_[at + b] = rest;
    return at;
  }
  // Nothing fits: grow the top (from a free block that ends at the top, if any).
  std::int64_t at = top_;
  if (!free_.empty()) {
    auto last = std::prev(free_.end());
    if (last->first + last->second == top_) {
      at = last->first;
      free_.erase(last);
    }
  }
  top_ = at + b;
  return at;
}

void FirstFitHeap::free(std::int64_t offset, std::int64_t bytes) {
  std::int64_t b = rounded(bytes), at = offset;
  auto next = free_.lower_bound(at);
  if (next != free_.end() && at + b == next->first) {  // merge with the block after
    b += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {  // merge with the block before
    auto prev = std::prev(next);
    if (prev->first + prev->second == at) {
      at = prev->first;
      b += prev->second;
      free_.erase(prev);
    }
  }
  if (at + b == top_)
    top_ = at;  // the top of the heap comes back
  else
    free_[at] = b;
}

std::uint64_t MemoryTracker::on_allocate(MemoryCategory c, std::size_t bytes, std::int64_t* heap_offset) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::uint64_t id = next_id_++;
  const std::int64_t at = heap_.allocate(static_cast<std::int64_t>(bytes));
  heap_offset_[id] = at;
  if (heap_offset) *heap_offset = at;
  s_.heap_span_bytes = heap_.span();
  s_.heap_peak_bytes = std::max(s_.heap_peak_bytes, s_.heap_span_bytes);
  auto& k = s_.by_category[static_cast<std::size_t>(c)];
  const auto b = static_cast<std::int64_t>(bytes);
  k.live_bytes += b;
  k.peak_bytes = std::max(k.peak_bytes, k.live_bytes);
  ++k.allocations;
  k.allocated_bytes += b;
  ++k.live_allocations;
  s_.total_live_bytes += b;
  s_.total_peak_bytes = std::max(s_.total_peak_bytes, s_.total_live_bytes);
  return id;
}

void MemoryTracker::on_free(MemoryCategory c, std::size_t bytes, std::uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto h = heap_offset_.find(id); h != heap_offset_.end()) {
    heap_.free(h->second, static_cast<std::int64_t>(bytes));
    heap_offset_.erase(h);
    s_.heap_span_bytes = heap_.span();
  }
  auto& k = s_.by_category[static_cast<std::size_t>(c)];
  const auto b = static_cast<std::int64_t>(bytes);
  MZ_CHECK(k.live_bytes >= b && k.live_allocations > 0, "freeing more ", memory_category_name(c),
           " bytes than are live");
  k.live_bytes -= b;
  --k.live_allocations;
  s_.total_live_bytes -= b;
}

std::int64_t MemoryTracker::live(MemoryCategory c) const {
  std::lock_guard<std::mutex> lock(mu_);
  return s_.by_category[static_cast<std::size_t>(c)].live_bytes;
}
std::int64_t MemoryTracker::peak(MemoryCategory c) const {
  std::lock_guard<std::mutex> lock(mu_);
  return s_.by_category[static_cast<std::size_t>(c)].peak_bytes;
}
std::int64_t MemoryTracker::total_live() const {
  std::lock_guard<std::mutex> lock(mu_);
  return s_.total_live_bytes;
}
std::int64_t MemoryTracker::total_peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return s_.total_peak_bytes;
}
MemorySnapshot MemoryTracker::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return s_;
}
void MemoryTracker::reset_peaks() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& k : s_.by_category) k.peak_bytes = k.live_bytes;
  s_.total_peak_bytes = s_.total_live_bytes;
  s_.heap_peak_bytes = s_.heap_span_bytes;
}

}  // namespace megazero
