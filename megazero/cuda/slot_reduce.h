// The shm transport's reduction of device slots (comm/shm_collectives.h; its
// kernel and formula: slot_reduce_kernels.cuh), for ranks that share a GPU.
#pragma once

#include "megazero/cuda/launchers.h"

namespace megazero::cuda {

enum class SlotReduce { Sum, Avg, Max };
// At most this many sources (a group's ranks).
constexpr int kMaxSlotReduceSources = 32;

// dst[i] = srcs[0][i] (op) ... srcs[nsrc - 1][i] for i < n, in that order,
// accumulated in fp32 (fp64, int64) and rounded once; Avg divides the rounded
// sum by `ranks`. Every dtype; Avg of floating types only, uint8 by Max only
// (the caller's checks, as reduce_host's). Pointers may be another process's
// memory (CUDA IPC); dst may be a source. Queued on `s`.
void reduce_slots(DType t, SlotReduce op, void* dst, const void* const* srcs, int nsrc, i64 n, int ranks,
                  cudaStream_t s);

}  // namespace megazero::cuda
