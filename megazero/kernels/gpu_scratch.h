// The device scratch the CUDA kernels need beyond their operands (partial sums,
// the embedding backward's sort lists, flash attention's row dots, cuBLAS's
// workspace), sized on the host by code every build compiles. The kernel
// dispatch allocates it through the device (allocate_gpu_scratch), so the
// memory tracker counts it, --device-arena places it, and a meta device
// standing in for CUDA plans it to the byte on a machine without a GPU; the
// launchers carve it and never call an allocator (the issue's "no allocator
// calls in the step"). The launchers check they were given what these
// functions promise.
#pragma once

#include <cstddef>
#include <cstdint>

#include "megazero/core/dtype.h"
#include "megazero/core/tensor.h"

namespace megazero::kernels {

// What a launcher receives: a slice of device memory.
struct GpuScratch {
  void* data = nullptr;
  std::size_t bytes = 0;
};

namespace gpu_scratch {

using i64 = std::int64_t;

constexpr i64 kThreads = 256;            // threads per block of the column-sum kernels
constexpr i64 kTargetBlocks = 4 * 132;   // enough blocks to fill an H100 (132 SMs) four deep
constexpr i64 kNormBlocks = 264;         // blocks per range of the gradient-norm kernel
// cuBLAS's workspace, handed to it with cublasSetWorkspace (it would otherwise
// cudaMalloc its own): NVIDIA's recommended size for Hopper, ample for older GPUs.
constexpr std::size_t kCublasWorkspaceBytes = std::size_t{32} << 20;

// How a column sum over `rows` splits into chunks of rows: one block column
// per kThreads columns (or column packs), `used` chunks of `per_chunk` rows.
struct Chunks {
  i64 col_blocks = 0, per_chunk = 1, used = 1;
};
Chunks column_chunks(i64 rows, i64 cols);                  // one column per thread
Chunks packed_column_chunks(i64 rows, i64 cols, i64 vec);  // `vec` columns per thread (16-byte loads)
// The fused dropout backward and bias gradient: 4 columns per thread (one
// Philox block), any cols.
constexpr i64 kDropoutColumns = 4;
Chunks dropout_column_chunks(i64 rows, i64 cols);

// `sums` column sums over the same rows (1: a bias or dbeta; 2: LayerNorm's
// dgamma and dbeta), whichever path the launcher takes for `storage`: the
// packed path only with more than one chunk of rows, the plain one without
// scratch when a single chunk holds them all.
std::size_t column_sums_bytes(DType storage, i64 rows, i64 cols, int sums);
std::size_t dropout_bias_grad_bytes(i64 rows, i64 cols);
std::size_t sum_of_squares_bytes(i64 ranges);
std::size_t flash_backward_bytes(i64 bh, i64 seq);
// The four int lists of `tokens` (row keys and token indices, double-buffered)
// and a bound on CUB's radix-sort workspace; the offset of the lists.
std::size_t embedding_sort_bytes(i64 tokens);
std::size_t embedding_sort_lists_offset(i64 tokens);

}  // namespace gpu_scratch

// True on a CUDA device and on a meta device standing in for one.
bool runs_cuda_kernels(const Device& d);
// `bytes` of Workspace on like's device when it runs CUDA kernels (counted,
// planned, in the arena); an undefined tensor elsewhere (CPU kernels keep their
// scratch on the stack).
Tensor allocate_gpu_scratch(const Tensor& like, std::size_t bytes, const char* label);
inline GpuScratch scratch_of(const Tensor& t) {
  return t.defined() ? GpuScratch{t.data(), t.nbytes()} : GpuScratch{};
}

}  // namespace megazero::kernels
