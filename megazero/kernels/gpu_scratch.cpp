// Sizes of the CUDA kernels' scratch (gpu_scratch.h). The chunking here is the
// chunking the launchers in megazero/cuda/layer_kernels.cu use: they call these
// functions, so the plan and the kernels cannot disagree.
#include "megazero/kernels/gpu_scratch.h"

#include <algorithm>

#include "megazero/core/device.h"
#include "megazero/core/error.h"

namespace megazero::kernels {
namespace gpu_scratch {
namespace {

i64 ceil_div(i64 a, i64 b) { return (a + b - 1) / b; }

// Each piece of a scratch starts on a 256-byte boundary (what cudaMalloc and
// CUB's temporaries give).
std::size_t aligned(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

// Rows split into chunks for `col_blocks` block columns: enough chunks to fill
// the GPU when there are few columns (a bias of 1536), each at least
// `min_rows` long to amortise its partial write, at most 65535 (grid.y).
Chunks split_rows(i64 rows, i64 col_blocks, i64 min_rows) {
  Chunks c;
  c.col_blocks = col_blocks;
  const i64 chunks = std::max<i64>(1, std::min<i64>({ceil_div(rows, min_rows), ceil_div(kTargetBlocks, col_blocks), 65535}));
  c.per_chunk = std::max<i64>(1, ceil_div(rows, chunks));
  c.used = rows == 0 ? 1 : ceil_div(rows, c.per_chunk);
  return c;
}

}  // namespace

Chunks column_chunks(i64 rows, i64 cols) {
  return split_rows(rows, ceil_div(std::max<i64>(cols, 1), kThreads), 32);
}

Chunks packed_column_chunks(i64 rows, i64 cols, i64 vec) {
  return split_rows(rows, ceil_div(std::max<i64>(cols / vec, 1), kThreads), 64);
}

Chunks dropout_column_chunks(i64 rows, i64 cols) {
  return split_rows(rows, ceil_div(ceil_div(std::max<i64>(cols, 1), kDropoutColumns), kThreads), 64);
}

std::size_t dropout_bias_grad_bytes(i64 rows, i64 cols) {
  if (cols <= 0) return 0;
  return static_cast<std::size_t>(dropout_column_chunks(rows, cols).used * cols) * sizeof(double);
}

std::size_t column_sums_bytes(DType storage, i64 rows, i64 cols, int sums) {
  if (cols <= 0) return 0;
  // The one-column-per-thread path runs the sums one after the other, each
  // reusing the scratch, and needs none when one chunk holds every row (it
  // then adds straight into the sum: a position-embedding gradient, a few
  // rows of seq x h columns); the packed path (16-byte loads, not fp64) keeps
  // all of them at once, and is taken only with more than one chunk.
  const i64 plain = column_chunks(rows, cols).used;
  std::size_t bytes = plain > 1 ? static_cast<std::size_t>(plain * cols) * sizeof(double) : 0;
  if (storage != DType::F64) {
    const i64 vec = static_cast<i64>(16 / dtype_size(storage));
    if (cols % vec == 0 && rows > 0) {
      const i64 packed = packed_column_chunks(rows, cols, vec).used;
      if (packed > 1) bytes = std::max(bytes, static_cast<std::size_t>(packed * cols * sums) * sizeof(double));
    }
  }
  return bytes;
}

std::size_t sum_of_squares_bytes(i64 ranges) {
  return static_cast<std::size_t>(ranges * kNormBlocks) * sizeof(double);
}

std::size_t flash_backward_bytes(i64 bh, i64 seq) { return static_cast<std::size_t>(bh * seq) * sizeof(float); }

std::size_t embedding_sort_lists_offset(i64 tokens) {
  // CUB's onesweep radix sort over 32-bit keys with caller-owned double
  // buffers needs per-pass histograms (at most 4 passes of 256 bins), one
  // look-back record of 256 counters per tile and a counter per pass, each
  // piece 256-byte aligned. Its tiles hold thousands of keys; the bound below
  // assumes 256 per tile and 8-byte counters, so it holds with a wide margin
  // (the launcher checks it against CUB's own query).
  const std::size_t bins = aligned(4 * 256 * 8);
  const std::size_t lookback = aligned(static_cast<std::size_t>(ceil_div(std::max<i64>(tokens, 1), 256)) * 256 * 8);
  const std::size_t counters = aligned(4 * 8);
  return aligned(bins + lookback + counters + 256);
}

std::size_t embedding_sort_bytes(i64 tokens) {
  return embedding_sort_lists_offset(tokens) + 4 * static_cast<std::size_t>(tokens) * sizeof(int);
}

}  // namespace gpu_scratch

bool runs_cuda_kernels(const Device& d) {
  if (d.kind() == DeviceKind::CUDA) return true;
  return d.kind() == DeviceKind::Meta && static_cast<const MetaDevice&>(d).kernels() == DeviceKind::CUDA;
}

Tensor allocate_gpu_scratch(const Tensor& like, std::size_t bytes, const char* label) {
  if (bytes == 0 || !runs_cuda_kernels(like.device())) return Tensor();
  return Tensor::empty(like.device_ptr(), {static_cast<std::int64_t>(bytes)}, DType::U8, MemoryCategory::Workspace,
                       label);
}

}  // namespace megazero::kernels
