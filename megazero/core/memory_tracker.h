// Live and peak bytes per memory category, per device. The ZeRO memory claims
// (Table 1 of the paper) are proven against these counters, so every byte that
// any megazero allocation asks for is counted here — exactly the requested
// size, not the allocator's rounded size — and released bytes are subtracted.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <string>
#include <string_view>

namespace megazero {

enum class MemoryCategory : std::uint8_t {
  Parameters,             // 16-bit (or fp32) model weights used by forward/backward
  Gradients,              // gradients of those weights (full or a ZeRO partition)
  OptimizerStates,        // fp32 master weights and Adam moments
  Activations,            // activations
  ActivationCheckpoints,  // layer inputs kept for recompute (whole, Pa slices, or in host memory with Pa+cpu)
  CommBuffers,            // fused communication buckets, gather buffers
  Workspace,              // scratch: GEMM workspace, temporary casts
  Other,
  kCount
};
inline constexpr std::size_t kNumMemoryCategories = static_cast<std::size_t>(MemoryCategory::kCount);

std::string_view memory_category_name(MemoryCategory c);

struct MemoryCounters {
  std::int64_t live_bytes = 0;
  std::int64_t peak_bytes = 0;
  std::int64_t allocations = 0;      // number of allocate() calls so far
  std::int64_t allocated_bytes = 0;  // sum of all allocate() sizes so far (traffic, not residency)
  std::int64_t live_allocations = 0;
};

struct MemorySnapshot {
  std::array<MemoryCounters, kNumMemoryCategories> by_category{};
  std::int64_t total_live_bytes = 0;
  std::int64_t total_peak_bytes = 0;  // peak of the sum, not the sum of peaks
  // A first-fit heap fed the same allocations and frees (each rounded up to
  // 512 bytes, as caching GPU allocators do): the address span it needs at
  // its peak. heap_peak_bytes - total_peak_bytes is the memory lost to
  // fragmentation by this allocation order (the paper's MD problem).
  std::int64_t heap_span_bytes = 0;
  std::int64_t heap_peak_bytes = 0;
  const MemoryCounters& operator[](MemoryCategory c) const { return by_category[static_cast<std::size_t>(c)]; }
  std::string to_string() const;  // one line per non-empty category
};

// First-fit allocation over an address range, free blocks coalesced; the top
// of the heap shrinks when its last block is freed.
class FirstFitHeap {
 public:
  static constexpr std::int64_t kRound = 512;
  // The span an allocation of `bytes` takes (at least one block of kRound).
  static std::int64_t rounded(std::int64_t bytes) {
    return (std::max<std::int64_t>(bytes, 1) + kRound - 1) / kRound * kRound;
  }
  std::int64_t allocate(std::int64_t bytes);  // returns the offset
  void free(std::int64_t offset, std::int64_t bytes);
  std::int64_t span() const { return top_; }

 private:
  std::map<std::int64_t, std::int64_t> free_;  // offset -> size, below top_
  std::int64_t top_ = 0;
};

// Thread-safe: communication worker threads allocate too.
class MemoryTracker {
 public:
  // Returns the allocation's id for on_free; *heap_offset (if given) gets its
  // offset in the first-fit heap model (a device arena places it there).
  std::uint64_t on_allocate(MemoryCategory c, std::size_t bytes, std::int64_t* heap_offset = nullptr);
  void on_free(MemoryCategory c, std::size_t bytes, std::uint64_t id = 0);

  std::int64_t live(MemoryCategory c) const;
  std::int64_t peak(MemoryCategory c) const;
  std::int64_t total_live() const;
  std::int64_t total_peak() const;
  MemorySnapshot snapshot() const;
  // Starts a new peak window: each peak becomes the current live value.
  void reset_peaks();

 private:
  mutable std::mutex mu_;
  MemorySnapshot s_;
  FirstFitHeap heap_;
  std::unordered_map<std::uint64_t, std::int64_t> heap_offset_;  // id -> offset
  std::uint64_t next_id_ = 1;
};

}  // namespace megazero
