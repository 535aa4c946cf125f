// The asynchronous global-to-shared copies of <cuda_pipeline_primitives.h>
// for the emulation, strict about waiting: a copy lands in shared memory
// only when a __pipeline_wait_prior(k) call retires its batch (every batch
// committed before the last k), as the hardware guarantees no earlier; a
// kernel that reads a slot before waiting sees what was there before (the
// emulated block's shared memory starts as 0xff bytes). Per emulated thread,
// as the hardware's copies are.
#pragma once

#include <cstddef>
#include <cstring>
#include <deque>
#include <vector>

#include "emu_runtime.h"

namespace emu_pipeline {
struct Copy {
  void* dst;
  const void* src;
  std::size_t bytes, zfill;
};
struct ThreadCopies {
  std::vector<Copy> pending;              // issued, not yet committed
  std::deque<std::vector<Copy>> batches;  // committed, not yet waited for
};
// Per emulated thread (by threadIdx.x: the fibers of emu_runtime.h share one
// host thread's thread_locals); allocated once, for a block's 1024 threads.
inline ThreadCopies& mine() {
  static std::vector<ThreadCopies> all(1024);
  return all[threadIdx.x];
}
// The block's end: copies never waited for land in no later block's memory.
inline void drop_all() {
  mine().pending.clear();
  mine().batches.clear();
}
}  // namespace emu_pipeline

inline void __pipeline_memcpy_async(void* dst_shared, const void* src_global, std::size_t size_and_align,
                                    std::size_t zfill = 0) {
  emu_block_exit = &emu_pipeline::drop_all;
  emu_pipeline::mine().pending.push_back({dst_shared, src_global, size_and_align, zfill});
}

inline void __pipeline_commit() {
  auto& me = emu_pipeline::mine();
  me.batches.push_back(std::move(me.pending));
  me.pending.clear();
}

inline void __pipeline_wait_prior(std::size_t prior) {
  auto& batches = emu_pipeline::mine().batches;
  while (batches.size() > prior) {
    for (const auto& c : batches.front()) {
      std::memcpy(c.dst, c.src, c.bytes - c.zfill);
      std::memset(static_cast<char*>(c.dst) + (c.bytes - c.zfill), 0, c.zfill);
    }
    batches.pop_front();
  }
}
