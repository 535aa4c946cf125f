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

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "megazero/core/dtype.h"
#include "megazero/core/error.h"
#include "megazero/core/tensor.h"

namespace megazero::kernels {

// What a launcher receives: a slice of device memory.
struct GpuScratch {
  void* data = nullptr;
  std::size_t bytes = 0;
};

namespace gpu_scratch {

using i64 = std::int64_t;

// MEGAZERO_COLUMN_FINISH: who adds the CUDA column sums' chunk partials. Unset
// or "folded": the partial kernel's last block of each block column
// (megazero/cuda/column_tiles.cuh); "kernel": a launch of its own after the
// partials (the same bits: the benchmarks' A/B). Read once and kept, since
// the launchers ask at every column sum (~120 a GPT-2 medium step).
namespace detail {
inline std::atomic<int>& column_finish_setting() {  // -1: not read yet
  static std::atomic<int> setting{-1};
  return setting;
}
}  // namespace detail

// Reads the variable now and keeps what it says: a ConfigError naming it for
// a value it does not know. The trainer calls it at start-up on every device,
// so a misspelt value is refused there, not ignored.
inline bool read_column_finish_setting() {
  const char* v = std::getenv("MEGAZERO_COLUMN_FINISH");
  bool folded = true;
  if (v != nullptr && *v != '\0' && std::strcmp(v, "folded") != 0) {
    MZ_REQUIRE(std::strcmp(v, "kernel") == 0, "MEGAZERO_COLUMN_FINISH must be 'folded' (the default: the last ",
               "block of each column finishes the column sums) or 'kernel' (a finishing launch after the partials), ",
               "got '", v, "'");
    folded = false;
  }
  detail::column_finish_setting().store(folded ? 1 : 0);
  return folded;
}

// The kept setting (read at the first call if nothing read it before).
inline bool column_finish_folded() {
  const int s = detail::column_finish_setting().load(std::memory_order_relaxed);
  return s < 0 ? read_column_finish_setting() : s == 1;
}

// Overrides it: the tests and benchmarks that run both ways in one process.
inline void set_column_finish_folded(bool folded) { detail::column_finish_setting().store(folded ? 1 : 0); }

constexpr i64 kThreads = 256;  // threads per block of the column-sum kernels
// The tiled column sums (megazero/cuda/column_tiles.cuh): a block is a tile of
// kTileGroups adjacent column groups (a pack, or four columns for dropout) by
// kThreads / kTileGroups row lanes; each warp reads 32 consecutive groups of
// one row, and the lanes' sums are added in lane order inside the block.
constexpr i64 kTileGroups = 32;
constexpr i64 kRowLanes = kThreads / kTileGroups;
constexpr i64 kTargetBlocks = 4 * 132;  // enough blocks to fill an H100 (132 SMs) four deep
constexpr i64 kNormBlocks = 4 * 132;    // blocks per launch of the gradient-norm kernel (4 an SM)
// Segments (after merging adjacent ones) per launch of the multi-segment
// optimizer kernels (megazero/cuda/optimizer_kernels.cuh): their table travels
// by value in the kernel's parameters, whose space is 4 KB on every toolkit
// (32 KB only from CUDA 12.1 with a matching driver); 240 entries of 16 bytes
// plus the decay bits and the other arguments fit in 4 KB. A GPT-2 355M
// partition has at most 194 after merging, so its step is one launch.
constexpr i64 kSegmentTableCapacity = 240;
// cuBLAS's workspace, handed to it with cublasSetWorkspace (it would otherwise
// cudaMalloc its own): NVIDIA's recommended size for Hopper, ample for older GPUs.
constexpr std::size_t kCublasWorkspaceBytes = std::size_t{32} << 20;

// How a column sum over `rows` splits into chunks of rows: one block column
// per kThreads columns (the one-column-a-thread kernels) or per kTileGroups
// column groups (the tiled ones), `used` chunks of `per_chunk` rows.
struct Chunks {
  i64 col_blocks = 0, per_chunk = 1, used = 1;
};
// The fused dropout backward and bias gradient: 4 columns per column group
// (one Philox block), any cols. Its kernel holds 80 registers a thread, so 3
// blocks of kThreads fit an SM (its __launch_bounds__ asks for that many).
constexpr i64 kDropoutColumns = 4;
constexpr i64 kDropoutBlocksPerSm = 3;

// The sizes are pure integer math, defined here so megazero/cuda uses them
// without a link dependency on the kernels library.
namespace detail {

inline i64 ceil_div(i64 a, i64 b) { return (a + b - 1) / b; }

// Each piece of a scratch starts on a 256-byte boundary (what cudaMalloc and
// CUB's temporaries give).
inline std::size_t aligned(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

// Rows split into chunks for `col_blocks` block columns: enough chunks to fill
// the GPU when there are few columns (a bias of 1536), at most `max_chunks`
// (by default kTargetBlocks' worth of blocks, rounded up), each at least
// `min_rows` long to amortise its partial write, at most 65535 (grid.y).
inline Chunks split_rows(i64 rows, i64 col_blocks, i64 min_rows, i64 max_chunks = 0) {
  Chunks c;
  c.col_blocks = col_blocks;
  if (max_chunks <= 0) max_chunks = ceil_div(kTargetBlocks, col_blocks);
  const i64 chunks = std::max<i64>(1, std::min<i64>({ceil_div(rows, min_rows), max_chunks, 65535}));
  c.per_chunk = std::max<i64>(1, ceil_div(rows, chunks));
  c.used = rows == 0 ? 1 : ceil_div(rows, c.per_chunk);
  return c;
}

}  // namespace detail

inline Chunks column_chunks(i64 rows, i64 cols) {
  return detail::split_rows(rows, detail::ceil_div(std::max<i64>(cols, 1), kThreads), 32);
}

// The tiled kernels over `groups` column groups: one block column per
// kTileGroups groups, chunks of at least 64 rows (8 per lane).
inline Chunks tiled_column_chunks(i64 rows, i64 groups) {
  return detail::split_rows(rows, detail::ceil_div(std::max<i64>(groups, 1), kTileGroups), 64);
}

inline Chunks packed_column_chunks(i64 rows, i64 cols, i64 vec) { return tiled_column_chunks(rows, cols / vec); }

// The dropout backward's chunks fill one wave of kDropoutBlocksPerSm blocks on
// each of 132 SMs, not kTargetBlocks (four an SM): with three resident, 528
// blocks ran as a full wave and a third of one (the 355M's [8192, 1024]: 8 x
// 66 blocks; the 100B layer's [32768, 8192]: 64 x 9), the second at a block an
// SM. Rounded down, so the blocks never spill into a second wave while the
// columns alone fit in one.
inline Chunks dropout_column_chunks(i64 rows, i64 cols) {
  const i64 col_blocks = detail::ceil_div(detail::ceil_div(std::max<i64>(cols, 1), kDropoutColumns), kTileGroups);
  return detail::split_rows(rows, col_blocks, 64, std::max<i64>(1, kDropoutBlocksPerSm * 132 / col_blocks));
}

inline std::size_t dropout_bias_grad_bytes(i64 rows, i64 cols) {
  if (cols <= 0) return 0;
  return static_cast<std::size_t>(dropout_column_chunks(rows, cols).used * cols) * sizeof(double);
}

// `sums` column sums over the same rows (1: a bias or dbeta; 2: LayerNorm's
// dgamma and dbeta), whichever path the launcher takes for `storage`: the
// packed path only with more than one chunk of rows, the plain one without
// scratch when a single chunk holds them all.
inline std::size_t column_sums_bytes(DType storage, i64 rows, i64 cols, int sums) {
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

// LayerNorm's one-pass backward (megazero/cuda/layernorm_kernels.cuh): a
// thread holds `packs_per_thread` 16-byte packs of a row (1 or 2: at two, 64
// registers a thread and 96 KB of shared memory a 512-thread block, 64 KB for
// the columns' fp32 dgamma/dbeta sums and 32 KB for gamma's and the residual
// gradient's packs, so two blocks still fit an SM at 8192 16-bit columns; at
// one, 88 KB with dy, x and the residual gradient double-buffered);
// `lanes` rows run at once in a
// block of lanes * threads_per_row <= 512 threads (several only with one pack
// a thread), each lane over rows_per_lane rows: at least 8, so a block's
// partial row (cols doubles a sum) costs at most 1/8 of the rows it read, and
// enough blocks to fill an H100 two deep. packs_per_thread == 0: not fused
// (fp64, rows not whole packs, over 1024 packs); the launcher also needs
// 16-byte aligned operands and then takes the split path.
constexpr i64 kLayerNormFusedMaxThreads = 512;
constexpr i64 kLayerNormFusedTargetBlocks = 2 * 132;
constexpr i64 kLayerNormMinRowsPerLane = 8;
struct LayerNormFusedPlan {
  int packs_per_thread = 0;
  i64 threads_per_row = 0, lanes = 0, rows_per_lane = 0, blocks = 0;
  bool fused() const { return packs_per_thread > 0; }
  // dgamma's partials, then dbeta's (then a dropout's bias gradient's, for
  // sums = 3): a row of cols doubles a block each.
  std::size_t partial_bytes(i64 cols, int sums = 2) const {
    return fused() ? static_cast<std::size_t>(sums * blocks * cols) * sizeof(double) : 0;
  }
};
inline LayerNormFusedPlan layernorm_fused_plan(DType storage, i64 rows, i64 cols) {
  LayerNormFusedPlan p;
  if (storage == DType::F64 || rows <= 0 || cols <= 0) return p;
  const i64 vec = static_cast<i64>(16 / dtype_size(storage));
  if (cols % vec != 0) return p;
  const i64 packs = cols / vec, most = kLayerNormFusedMaxThreads;
  const int per = packs <= most ? 1 : packs <= 2 * most ? 2 : 0;
  if (per == 0) return p;
  p.packs_per_thread = per;
  p.threads_per_row = detail::ceil_div(detail::ceil_div(packs, per), 32) * 32;
  p.lanes = per == 1 ? std::max<i64>(1, most / p.threads_per_row) : 1;
  p.rows_per_lane = std::max(kLayerNormMinRowsPerLane, detail::ceil_div(rows, p.lanes * kLayerNormFusedTargetBlocks));
  p.blocks = detail::ceil_div(rows, p.lanes * p.rows_per_lane);
  return p;
}

// layernorm_backward's scratch: the fused pass's partials, or the split
// path's column sums when the operands' alignment sends it there.
inline std::size_t layernorm_backward_bytes(DType storage, i64 rows, i64 cols) {
  return std::max(column_sums_bytes(storage, rows, cols, 2),
                  layernorm_fused_plan(storage, rows, cols).partial_bytes(cols));
}

// layernorm_backward_dropout's scratch, whichever way the launcher goes: the
// one-pass kernel's partials with the bias gradient's as a third sum (one
// pack a thread), the bias's column sums after the kernel (two), or
// layernorm_backward's and then dropout_backward_bias_grad's (not fused),
// each reusing it one after the other on the stream.
inline std::size_t layernorm_dropout_backward_bytes(DType storage, i64 rows, i64 cols) {
  return std::max({layernorm_backward_bytes(storage, rows, cols), dropout_bias_grad_bytes(rows, cols),
                   column_sums_bytes(storage, rows, cols, 1),
                   layernorm_fused_plan(storage, rows, cols).partial_bytes(cols, 3)});
}

// Launches of a multi-segment optimizer kernel over `segments` ranges: a
// bound (the launcher merges adjacent ranges and drops empty ones first).
inline i64 segment_table_chunks(i64 segments) {
  return detail::ceil_div(std::max<i64>(segments, 0), kSegmentTableCapacity);
}

// kNormBlocks partial sums per launch of the gradient-norm kernel.
inline std::size_t sum_of_squares_bytes(i64 ranges) {
  return static_cast<std::size_t>(segment_table_chunks(ranges) * kNormBlocks) * sizeof(double);
}

inline std::size_t flash_backward_bytes(i64 bh, i64 seq) { return static_cast<std::size_t>(bh * seq) * sizeof(float); }

// cuDNN's fused attention (megazero/cuda/cudnn_sdpa.cpp), pieces in this
// order, each 256-byte aligned: the dropout seed and offset (two int64), with
// per-document masks their 16-bit bias [samples, 1, seq, seq], then for the
// backward the fp32 row sums [bh, seq] and (not deterministic) the fp32
// dQ accumulator [bh, seq, hd] — graph tensors we own — then cuDNN's own
// workspace, budgeted here so the planner and the arena count it: 32 MiB, plus
// for the deterministic backward its 16-bit dP [bh, seq, seq] (sequence
// rounded up to 64). The plan is chosen among the engine configurations whose
// workspace fits the budget.
constexpr std::size_t kCudnnEngineSlackBytes = std::size_t{32} << 20;
struct CudnnSdpaScratch {
  std::size_t rng = 256, bias = 0, row_sum = 0, dq_accum = 0, engine = 0;
  std::size_t bias_offset() const { return rng; }
  std::size_t row_sum_offset() const { return rng + bias; }
  std::size_t dq_accum_offset() const { return rng + bias + row_sum; }
  std::size_t engine_offset() const { return rng + bias + row_sum + dq_accum; }
  std::size_t total() const { return engine_offset() + engine; }
};
// bias_samples: the samples of a per-document mask bias, 0 for none.
inline CudnnSdpaScratch cudnn_sdpa_scratch(bool backward, bool deterministic, i64 bh, i64 seq, i64 head_dim,
                                           i64 bias_samples = 0) {
  CudnnSdpaScratch s;
  const auto bytes = [](i64 n, std::size_t each) { return detail::aligned(static_cast<std::size_t>(n) * each); };
  if (bias_samples > 0) s.bias = bytes(bias_samples * seq * seq, 2);
  if (backward) {
    s.row_sum = bytes(bh * seq, sizeof(float));
    if (!deterministic) s.dq_accum = bytes(bh * seq * head_dim, sizeof(float));
  }
  const i64 seq64 = detail::ceil_div(seq, 64) * 64;
  s.engine = kCudnnEngineSlackBytes + (backward && deterministic ? bytes(bh * seq64 * seq64, 2) : 0);
  return s;
}

// The four int lists of `tokens` (row keys and token indices, double-buffered)
// and a bound on CUB's radix-sort workspace; the offset of the lists.
inline std::size_t embedding_sort_lists_offset(i64 tokens) {
  // CUB's onesweep radix sort over 32-bit keys with caller-owned double
  // buffers needs per-pass histograms (at most 4 passes of 256 bins), one
  // look-back record of 256 counters per tile and a counter per pass, each
  // piece 256-byte aligned. Its tiles hold thousands of keys; the bound below
  // assumes 256 per tile and 8-byte counters, so it holds with a wide margin
  // (the launcher checks it against CUB's own query).
  const std::size_t bins = detail::aligned(4 * 256 * 8);
  const std::size_t lookback =
      detail::aligned(static_cast<std::size_t>(detail::ceil_div(std::max<i64>(tokens, 1), 256)) * 256 * 8);
  const std::size_t counters = detail::aligned(4 * 8);
  return detail::aligned(bins + lookback + counters + 256);
}

inline std::size_t embedding_sort_bytes(i64 tokens) {
  return embedding_sort_lists_offset(tokens) + 4 * static_cast<std::size_t>(tokens) * sizeof(int);
}

}  // namespace gpu_scratch

// True on a CUDA device and on a meta device standing in for one.
bool runs_cuda_kernels(const Device& d);
// `bytes` of Workspace on like's device when it runs CUDA kernels (counted,
// planned, in the arena); an undefined tensor elsewhere (CPU kernels keep their
// scratch on the stack).
Tensor allocate_gpu_scratch(const Tensor& like, std::size_t bytes, const char* label);
inline GpuScratch scratch_of(const Tensor& t) { return t.defined() ? GpuScratch{t.data(), t.nbytes()} : GpuScratch{}; }

}  // namespace megazero::kernels
