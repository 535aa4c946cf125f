// The ticket counters of the folded column finishes (column_tiles.cuh's
// ColumnFold): per GPU and stream, one unsigned per block column, all 0
// between kernels (the block that takes a column's last ticket sets it back),
// allocated and zeroed on the stream at the stream's first folded sum and
// kept for the process (16 KB each; like the cuDNN handles, never freed: at
// exit the runtime may be gone first). Per stream because two kernels on
// different streams may run at once; one after the other on a stream, each
// finds them 0.
//
// MEGAZERO_COLUMN_FINISH=kernel turns the fold off (the finish as its own
// launch after the partials, the same bits): the A/B of the benchmarks
// (kernels::gpu_scratch::column_finish_folded keeps what it says).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "megazero/core/error.h"
#include "megazero/kernels/gpu_scratch.h"

namespace megazero::cuda::detail_k {

// Block columns a folded sum may have: a bias of 4096 x 8 = 32768 16-bit
// columns (packed), 16384 for dropout's groups of four; wider sums finish
// in their own launch.
constexpr std::int64_t kColumnTicketCapacity = 4096;

// Tickets for a kernel of `col_blocks` block columns on stream s, or null
// (too many block columns, or the fold turned off): then the launcher
// finishes the sums itself.
inline unsigned* column_tickets(cudaStream_t s, std::int64_t col_blocks) {
  if (col_blocks > kColumnTicketCapacity || !kernels::gpu_scratch::column_finish_folded()) return nullptr;
  static std::mutex mutex;
  static auto* tickets = new std::map<std::pair<int, cudaStream_t>, unsigned*>();
  int device = 0;
  MZ_CHECK(cudaGetDevice(&device) == cudaSuccess, "cudaGetDevice failed");
  std::lock_guard<std::mutex> lock(mutex);
  unsigned*& t = (*tickets)[{device, s}];
  if (t == nullptr) {
    void* p = nullptr;
    const std::size_t bytes = static_cast<std::size_t>(kColumnTicketCapacity) * sizeof(unsigned);
    MZ_CHECK(cudaMalloc(&p, bytes) == cudaSuccess, "cudaMalloc of the column sums' ", bytes, "-byte tickets failed");
    MZ_CHECK(cudaMemsetAsync(p, 0, bytes, s) == cudaSuccess, "zeroing the column sums' tickets failed");
    t = static_cast<unsigned*>(p);
  }
  return t;
}

}  // namespace megazero::cuda::detail_k
