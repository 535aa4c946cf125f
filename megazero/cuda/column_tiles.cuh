// Column sums over rows as tiles, the pieces every fused "write dx and sum a
// bias/gamma gradient" kernel shares (dropout_kernels.cuh, gelu_bias_kernels.cuh,
// column_sums.cuh, rmsnorm_kernels.cuh). Kernels only, plain enough for the CPU
// emulation in tests/cuda_emulation to run them as they are.
//
// Why tiles: a bias of 1024 columns is only 128 packs of 16 bytes, so "one
// thread a pack over a chunk of rows" leaves most of a 256-thread block idle
// and the GPU with a few warps per SM (the 2026-11-24 H100 profile: 0.4-0.7
// TB/s for these passes). A block here is kTileGroups column groups (a warp
// reads 32 consecutive groups of one row) by kRowLanes row lanes (lane l takes
// rows r0 + l, r0 + l + lanes, ...); the lanes' sums meet in shared memory and
// are added in lane order. Fixed order everywhere, no atomic additions: a
// run repeats bit for bit.
//
// The finish adds a column's chunk partials the same way: lane l sums chunks
// l, l + lanes, ... in order, then the lanes in lane order, in double, and
// rounds once into the accumulator (the single-thread-per-column finish read
// 128 partials serially on 4 SMs: ~19 us a call).
#pragma once

#include <cstdint>

#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/packs.cuh"
#include "megazero/kernels/gpu_scratch.h"

namespace megazero::cuda::detail_k {

constexpr int kTileGroups = static_cast<int>(kernels::gpu_scratch::kTileGroups);
constexpr int kRowLanes = static_cast<int>(kernels::gpu_scratch::kRowLanes);

// Where this thread sits in its tile. blockDim.x is a multiple of kTileGroups,
// at most kTileGroups * kRowLanes (the launchers use kThreads).
struct TileSeat {
  i64 group;  // the column group this thread sums
  int lane;   // its row lane
  int lanes;  // row lanes in the block
};

__device__ __forceinline__ TileSeat tile_seat() {
  return {static_cast<i64>(blockIdx.x) * kTileGroups + static_cast<i64>(threadIdx.x % kTileGroups),
          static_cast<int>(threadIdx.x / kTileGroups), static_cast<int>(blockDim.x / kTileGroups)};
}

// The rows of this block's chunk (blockIdx.y) that lane `lane` owns start at
// first_row(...) and step by `lanes`, up to chunk_end(...).
__device__ __forceinline__ i64 chunk_begin(i64 rows_per_chunk) { return static_cast<i64>(blockIdx.y) * rows_per_chunk; }
__device__ __forceinline__ i64 chunk_end(i64 rows, i64 rows_per_chunk) {
  return min(rows, chunk_begin(rows_per_chunk) + rows_per_chunk);
}

// Every thread of the block calls this with its N columns' sums (group g holds
// columns g*N .. g*N+N-1; zeros for a group past the end): partial[c] = the
// lanes' sums of column c added in lane order, for the tile's columns below
// cols. partial points at this chunk's row of partials. Ends with a barrier,
// so a second call (LayerNorm's dgamma after dbeta) may reuse the buffer.
// A thread's N sums sit at t * (N + 1) in its lane's row: the odd stride puts
// the threads of a half-warp (one 64-bit shared-memory access) on distinct
// banks for each j (a stride of 8 doubles, 16-bit packs, made the writes
// 8-way bank conflicts), and the reads below, column by column, stay
// consecutive within a group.
template <int N>
__device__ void store_tile_sums(const double (&acc)[N], i64 cols, double* partial) {
  constexpr int kStride = N + 1;
  __shared__ double lane_sums[kRowLanes][kTileGroups * kStride];
  const TileSeat me = tile_seat();
  const int t = static_cast<int>(threadIdx.x % kTileGroups);
#pragma unroll
  for (int j = 0; j < N; ++j) lane_sums[me.lane][t * kStride + j] = acc[j];
  __syncthreads();
  const i64 first = static_cast<i64>(blockIdx.x) * kTileGroups * N;
  for (int i = static_cast<int>(threadIdx.x); i < kTileGroups * N && first + i < cols;
       i += static_cast<int>(blockDim.x)) {
    const int at = (i / N) * kStride + i % N;
    double s = lane_sums[0][at];
    for (int l = 1; l < me.lanes; ++l) s += lane_sums[l][at];
    partial[first + i] = s;
  }
  __syncthreads();
}

// dst[c] = round(dst[c] + the `chunks` partials of column c): lane l sums
// chunks l, l + lanes, ... in order, the lanes are added in lane order. Grid:
// ceil(cols / kTileGroups) blocks.
// The loads go kFinishBatch at a time, all issued before the first add: the
// loop as "load, add, next" kept one load in flight per thread, so a lane's
// 16-32 chunks were as many L2 round trips in a row (the 2026-11-26 H200
// profile: ~11.6 us a call, 127 GB/s, 194 calls a GPT-2 medium step). The
// additions keep their order, so the sums are the same bits.
constexpr int kFinishBatch = 8;
template <typename G>
__device__ void finish_column_sums(i64 cols, i64 chunks, const double* partial, G* dst) {
  __shared__ double lane_sums[kRowLanes][kTileGroups];
  const TileSeat me = tile_seat();
  const int t = static_cast<int>(threadIdx.x % kTileGroups);
  const i64 c = me.group;
  double acc = 0;
  if (c < cols) {
    const i64 step = static_cast<i64>(me.lanes) * cols;
    i64 left = me.lane < chunks ? (chunks - me.lane + me.lanes - 1) / me.lanes : 0;  // this lane's chunks
    const double* p = partial + (left > 0 ? me.lane * cols + c : 0);
    for (; left >= kFinishBatch; left -= kFinishBatch, p += kFinishBatch * step) {
      double v[kFinishBatch];
#pragma unroll
      for (int u = 0; u < kFinishBatch; ++u) v[u] = p[u * step];
#pragma unroll
      for (int u = 0; u < kFinishBatch; ++u) acc += v[u];
    }
    for (; left > 0; --left, p += step) acc += *p;
  }
  lane_sums[me.lane][t] = acc;
  __syncthreads();
  if (me.lane == 0 && c < cols) {
    double s = lane_sums[0][t];
    for (int l = 1; l < me.lanes; ++l) s += lane_sums[l][t];
    dst[c] = st<G>(static_cast<double>(ld(dst[c])) + s);
  }
}

template <typename G>
__global__ void column_finish_kernel(i64 cols, i64 chunks, const double* partial, G* dst) {
  finish_column_sums(cols, chunks, partial, dst);
}

// Up to three sums over the same chunks in one launch, sum y by blockIdx.y:
// partials [y][chunks][cols] (back to back, as the LayerNorm backward and
// the packed column sums write them) into dst[y]; each one as
// column_finish_kernel adds it. One launch and 2-3x the blocks: a finish
// of 1024 columns is 32 blocks, far from filling a GPU, and LayerNorm's
// backward made two or three of them a call (the H200 profile: 194
// finishes a GPT-2 medium step).
constexpr int kMaxFinishSums = 3;
template <typename G>
struct FinishTargets {
  G* dst[kMaxFinishSums] = {};
};
template <typename G>
__global__ void column_finish_many_kernel(i64 cols, i64 chunks, const double* partial, FinishTargets<G> targets) {
  finish_column_sums(cols, chunks, partial + static_cast<i64>(blockIdx.y) * chunks * cols, targets.dst[blockIdx.y]);
}

// ---- the finish folded into the partial kernel ----
// A partial kernel handed tickets (the tiled ones here and in dropout_kernels.cuh
// and gelu_bias_kernels.cuh, the one-column-a-thread ones of column_sums.cuh and
// rmsnorm_kernels.cuh) finishes its own sums: the block that stores the last of
// its block column's gridDim.y chunk rows adds them, as
// column_finish_kernel would (the same additions in the same order: the same
// bits), and the launch after it is not needed. One launch where there were
// two: the 2026-11-28 H200 profile of a GPT-2 medium step had 72 finish
// launches (~4.8 us of kernel each, besides its launch gap) behind the bias
// gradients. The ticket is CUDA's threadFenceReduction pattern: each thread
// fences its partial stores device-wide, then one thread of the block counts
// the block in with an atomic increment; the block that counts the last one
// reads the others' partials from L2 and sets the ticket back to 0, so the
// tickets are all 0 again for the next kernel on the stream. The values are
// never added atomically: the sums keep their order.
template <typename G>
struct ColumnFold {
  unsigned* tickets = nullptr;  // one per block column (blockIdx.x), 0 at launch; null: not folded
  FinishTargets<G> targets;     // sum y's accumulator; its partials follow sum y-1's: [y][gridDim.y][cols]
};

// Column c's `chunks` partials (partial[k * cols + c]) added into dst[c] as
// finish_column_sums adds them in a block of kThreads (kRowLanes lanes: lane
// l's chunks l, l + kRowLanes, ... in order, then the lanes in lane order),
// by one thread: the same additions, a lane at a time, so that the kernel it
// is folded into keeps its register count (the lanes' sums held at once took
// the packed bias sums from 40 registers to 80).
template <typename G>
__device__ void finish_column_alone(i64 cols, i64 chunks, const double* partial, i64 c, G* dst) {
  const i64 step = static_cast<i64>(kRowLanes) * cols;
  double s = 0;
  for (int l = 0; l < kRowLanes; ++l) {
    double acc = 0;
    i64 left = l < chunks ? (chunks - l + kRowLanes - 1) / kRowLanes : 0;  // lane l's chunks
    const double* p = partial + (left > 0 ? l * cols + c : 0);
    for (; left >= kFinishBatch; left -= kFinishBatch, p += kFinishBatch * step) {
      double v[kFinishBatch];
#pragma unroll
      for (int u = 0; u < kFinishBatch; ++u) v[u] = __ldcg(p + u * step);
#pragma unroll
      for (int u = 0; u < kFinishBatch; ++u) acc += v[u];
    }
    for (; left > 0; --left, p += step) acc += __ldcg(p);
    s = l == 0 ? acc : s + acc;
  }
  dst[c] = st<G>(static_cast<double>(ld(dst[c])) + s);
}

// Every thread of the block calls this once its partials of columns [first,
// first + count) are stored: with tickets, the last block of the block column
// to arrive finishes those columns of each of the `sums` sums.
template <typename G>
__device__ void finish_if_last(const ColumnFold<G>& fold, int sums, i64 cols, i64 first, i64 count,
                               const double* partial) {
  if (!fold.tickets) return;
  __shared__ bool last;
  __threadfence();  // this thread's partial stores, seen device-wide before the ticket is taken
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned before = atomicAdd(fold.tickets + blockIdx.x, 1u);
    last = before + 1 == gridDim.y;
    if (last) fold.tickets[blockIdx.x] = 0;  // ready for the next launch on this stream
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const i64 chunks = gridDim.y, n = min(count, cols - first);
  for (int y = 0; y < sums; ++y)
    for (i64 i = threadIdx.x; i < n; i += blockDim.x)
      finish_column_alone(cols, chunks, partial + y * chunks * cols, first + i, fold.targets.dst[y]);
}

// finish_if_last for a tile after its store_tile_sums (N columns a group).
template <typename G>
__device__ void finish_tile_if_last(const ColumnFold<G>& fold, int sums, i64 cols, int group_columns,
                                    const double* partial) {
  const i64 n = static_cast<i64>(kTileGroups) * group_columns;
  finish_if_last(fold, sums, cols, static_cast<i64>(blockIdx.x) * n, n, partial);
}

inline unsigned finish_blocks(i64 cols) { return static_cast<unsigned>((cols + kTileGroups - 1) / kTileGroups); }

// dbeta-style sums (+= sum_r dy) and, with LN, LayerNorm's dgamma (+= sum_r dy
// * xhat, xhat = (x - mean) * rstd in double) over 16-byte packs: a thread's
// group is one pack; partial_b/partial_g hold one row of partials per chunk
// (gpu_scratch::packed_column_chunks). With tickets in `fold` (targets: dbeta,
// then dgamma, whose partials must follow dbeta's) the last block of a block
// column to arrive finishes its columns.
template <typename S, bool LN, typename G = float>
__global__ void column_partial_packed_kernel(const S* dy, const S* x, const float* mean, const float* rstd, i64 rows,
                                             i64 cols, i64 rows_per_chunk, double* partial_b, double* partial_g,
                                             ColumnFold<G> fold = {}) {
  constexpr int V = kVec<S>;
  const TileSeat me = tile_seat();
  const i64 q = me.group;
  double ab[V] = {}, ag[V] = {};
  if (q * V < cols) {
    const i64 end = chunk_end(rows, rows_per_chunk), lanes = me.lanes;
    i64 r = chunk_begin(rows_per_chunk) + me.lane;
    if constexpr (!LN) {
      // The bias sums load U rows' packs before adding any:
      // with one 16-byte load in flight a thread the SMs held too few bytes
      // in flight for the memory's latency. Same order of sums. (Not LN's
      // loop: batched it needs 72 registers, one block an SM fewer.)
      constexpr int U = 4;
      for (; r + (U - 1) * lanes < end; r += U * lanes) {
        Pack<S> d[U];
#pragma unroll
        for (int u = 0; u < U; ++u) d[u] = reinterpret_cast<const Pack<S>*>(dy + (r + u * lanes) * cols)[q];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int j = 0; j < V; ++j) ab[j] += ld(d[u].v[j]);
      }
    }
    for (; r < end; r += lanes) {
      const Pack<S> d = reinterpret_cast<const Pack<S>*>(dy + r * cols)[q];
      if constexpr (LN) {
        const Pack<S> xv = reinterpret_cast<const Pack<S>*>(x + r * cols)[q];
        const double m = mean[r], rs = rstd[r];
#pragma unroll
        for (int j = 0; j < V; ++j) {
          ab[j] += ld(d.v[j]);
          ag[j] += static_cast<double>(ld(d.v[j])) * ((ld(xv.v[j]) - m) * rs);
        }
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) ab[j] += ld(d.v[j]);
      }
    }
  }
  const i64 row = static_cast<i64>(blockIdx.y) * cols;
  store_tile_sums<V>(ab, cols, partial_b + row);
  if constexpr (LN) store_tile_sums<V>(ag, cols, partial_g + row);
  finish_tile_if_last(fold, LN ? 2 : 1, cols, V, partial_b);
}

}  // namespace megazero::cuda::detail_k
