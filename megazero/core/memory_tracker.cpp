#include "megazero/core/memory_tracker.h"

#include <algorithm>
#include <sstream>

#include "megazero/core/error.h"

namespace megazero {

std::string_view memory_category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::Parameters: return "parameters";
    case MemoryCategory::Gradients: return "gradients";
    case MemoryCategory::OptimizerStates: return "optimizer_states";
    case MemoryCategory::Activations: return "activations";
    case MemoryCategory::ActivationCheckpoints: return "activation_checkpoints";
    case MemoryCategory::CommBuffers: return "comm_buffers";
    case MemoryCategory::Workspace: return "workspace";
    case MemoryCategory::Other: return "other";
    case MemoryCategory::kCount: break;
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

void MemoryTracker::on_allocate(MemoryCategory c, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& k = s_.by_category[static_cast<std::size_t>(c)];
  const auto b = static_cast<std::int64_t>(bytes);
  k.live_bytes += b;
  k.peak_bytes = std::max(k.peak_bytes, k.live_bytes);
  ++k.allocations;
  ++k.live_allocations;
  s_.total_live_bytes += b;
  s_.total_peak_bytes = std::max(s_.total_peak_bytes, s_.total_live_bytes);
}

void MemoryTracker::on_free(MemoryCategory c, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
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
}

}  // namespace megazero
