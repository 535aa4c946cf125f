// What the CUDA launcher headers of megazero/cuda (layernorm.h, gelu_bias.h,
// softmax.h, dropout.h, embedding.h, cross_entropy.h, optimizer.h,
// strided_copy.h) share. The launchers are the CUDA implementations of the
// kernels of megazero/kernels, whose headers have the contracts (shapes,
// aliasing, dtypes, accumulate vs overwrite): the public functions there
// validate their arguments and call these with raw device pointers;
// everything is queued on stream `s` without blocking the host. Kernels that
// need scratch beyond their operands take it as `ws`, sized by
// megazero/kernels/gpu_scratch.h and allocated by the caller through the
// device; none allocates.
//
// Numerics follow the CPU kernels: 16-bit values are loaded exactly into fp32,
// statistics and sums are taken in double, and each result is rounded once.
// Reductions use a fixed order (no atomics), so a run repeats bit for bit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "megazero/core/dtype.h"
#include "megazero/kernels/gpu_scratch.h"

namespace megazero::cuda {

using i64 = std::int64_t;

}  // namespace megazero::cuda
