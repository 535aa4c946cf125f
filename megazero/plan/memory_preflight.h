// The memory pre-flight: before a run allocates anything on a device with a
// fixed capacity (a GPU), this rank's plan (memory_plan.h: the real model and
// engine on the meta device, exact to the byte against real runs) is compared
// with the device's free memory. A run that cannot fit is refused up front,
// with the planned and available bytes and the flags that would make it fit,
// instead of dying in an out-of-memory error minutes later.
#pragma once

#include <cstdint>
#include <string>

#include "megazero/plan/memory_plan.h"

namespace megazero::plan {

struct PreflightVerdict {
  std::int64_t needed = 0;     // the plan's step peak: live bytes, or the arena's first-fit peak with --device-arena
  std::int64_t available = 0;  // the device's free bytes
  bool fits = true;
  // When it does not fit: what would, each with its planned peak
  // ("--zero-stage 3 (5.1 GiB), --recompute-activations (6.0 GiB)"), or why nothing does.
  std::string advice;
};

// `plan` is this rank's plan of `args`; alternatives are planned only when it
// does not fit (each a whole plan: a second or so for a large model).
PreflightVerdict memory_preflight(const train::TrainArgs& args, int world_size, int rank, DeviceKind kernels,
                                  const RankMemoryPlan& plan, std::int64_t free_bytes);

// How many of a host's `local_ranks` ranks use the same GPU as the one at
// `local_index` when rank i takes GPU i mod `gpus` (the trainer's rule): each
// plans against its share of that GPU's free memory (ranks sharing a GPU are a
// test setup, but a pre-flight that let each of them count on all of it would
// pass runs that then run out of memory).
int ranks_sharing_gpu(int local_ranks, int local_index, int gpus);

// The error text for a verdict that does not fit (names the device and rank).
std::string preflight_error(const PreflightVerdict& v, const std::string& device_name, int rank,
                            std::int64_t total_bytes);

}  // namespace megazero::plan
