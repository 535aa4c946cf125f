// The CUDA rotary position embedding (contract: megazero/kernels/rope.h, which
// validates the arguments and calls this with raw device pointers; kernels:
// rope_kernels.cuh). cos and sin are taken in double per (position, pair) and
// rounded to the compute type, the products are rounded separately (no fused
// multiply-add), so results are the CPU kernel's up to the last bit of the
// device's double cos/sin/pow.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "megazero/core/dtype.h"

namespace megazero::cuda {

using i64 = std::int64_t;

// in, out: [n, seq, d] contiguous, d even; out may alias in. backward: the
// rotation by -theta (rope_backward), else by theta (rope_forward).
// Row s of each of the n blocks is position first + s, or with `positions`
// (int64 [samples * seq] on the device; n = samples x heads) positions[b * seq
// + s] for the blocks of sample b; each position times position_scale.
// interleaved: pairs (2i, 2i + 1) instead of (i, i + d/2). llama3_factor:
// Llama 3's rope scaling of the frequencies (kernels/rope_frequencies.h), 0 off.
void rope(DType t, const void* in, double base, void* out, i64 n, i64 seq, i64 d, bool backward, cudaStream_t s,
          i64 first = 0, const std::int64_t* positions = nullptr, i64 samples = 1, double position_scale = 1.0,
          bool interleaved = false, double llama3_factor = 0);

}  // namespace megazero::cuda
