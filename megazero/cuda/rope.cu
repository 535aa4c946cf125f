// Launcher of the CUDA rotary position embedding (rope_cuda.h; kernel:
// rope_kernels.cuh). Blocks span positions (x) and chunks of the n blocks
// (y): enough of them to fill the GPU, each taking its position's cos/sin once
// per chunk.
#include <cuda_runtime.h>

#include <algorithm>

#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/rope_cuda.h"
#include "megazero/cuda/rope_kernels.cuh"

namespace megazero::cuda {
using namespace detail_k;

void rope(DType t, const void* in, double base, void* out, i64 n, i64 seq, i64 d, bool backward, cudaStream_t s,
          i64 first, const std::int64_t* positions, i64 samples, double position_scale, bool interleaved,
          double llama3_factor) {
  if (n == 0 || seq == 0 || d == 0) return;
  if (!positions) samples = 1;  // one position per row: every block shares it
  const auto ceil_div = [](i64 a, i64 b) { return (a + b - 1) / b; };
  const i64 heads = n / samples;
  const i64 gx = std::min<i64>(seq, i64{1} << 20);
  // Chunks of each sample's heads: enough blocks for the GPU, and few enough
  // rows per block that the kernel's work index (rows x kRopeTile) fits 31 bits.
  constexpr i64 kMaxPerBlock = (i64{1} << 31) / kRopeTile - 1;
  i64 gy = std::clamp<i64>(ceil_div(kernels::gpu_scratch::kTargetBlocks, gx * samples), 1, heads);
  gy = std::min<i64>(std::max(gy, ceil_div(heads, kMaxPerBlock)), 65535 / samples);
  const i64 per_block = ceil_div(heads, std::max<i64>(gy, 1));
  const i64 chunks = ceil_div(heads, per_block);
  if (per_block > kMaxPerBlock || samples * chunks > 65535)
    throw InternalError(::megazero::detail::concat("rope: ", n, " blocks of ", seq, " x ", d, " are too many"));
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(samples * chunks));
  const unsigned threads = d / 2 * per_block >= 256 ? 256 : 128;
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    const S* ip = static_cast<const S*>(in);
    S* op = static_cast<S*>(out);
    if (backward)
      rope_kernel<S, true><<<grid, threads, 0, s>>>(ip, base, op, heads, seq, d, per_block, first, positions, chunks,
                                                    position_scale, interleaved, llama3_factor);
    else
      rope_kernel<S, false><<<grid, threads, 0, s>>>(ip, base, op, heads, seq, d, per_block, first, positions, chunks,
                                                     position_scale, interleaved, llama3_factor);
  });
  check_launch(backward ? "rope_backward" : "rope_forward");
}

}  // namespace megazero::cuda
