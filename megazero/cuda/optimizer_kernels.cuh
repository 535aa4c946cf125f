// The optimizer's device kernels over many segments of ZeRO's flat buffers at
// once (contracts: megazero/kernels/optimizer_kernels.h; launchers:
// optimizer.cu), and the host code that builds their segment tables. Kept
// apart, kernels and tables only, so that tests/cuda_emulation runs them on
// the CPU as they are.
//
// One launch covers a table of up to kSegmentTableCapacity segments, passed by
// value in the kernel's parameters (as PyTorch's and Apex's multi_tensor_apply
// pass theirs): the table reaches the GPU with the launch itself, so there is
// no upload to order, no host staging buffer whose lifetime must outlast an
// asynchronous copy, and no device scratch for it. Parameter space is 4 KB
// on every toolkit (the 32 KB of CUDA 12.1 needs a 12.1 driver too, which a
// binary built with 12.1 cannot count on), so a table holds 240 segments and
// longer lists take one launch per 240. Adjacent segments of the same kind are
// merged first: ZeRO's parameters lie without gaps, so a GPT-2 355M partition
// (292 parameters) needs one table.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/packs.cuh"
#include "megazero/kernels/adamw_formula.h"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/optimizer_kernels.h"

namespace megazero::cuda::detail_k {

constexpr int kTableCapacity = static_cast<int>(kernels::gpu_scratch::kSegmentTableCapacity);

// Segments concatenated into one flat index space: segment k holds flat
// indices [end[k-1], end[k]) (end[-1] = 0), flat index j is buffer element
// j + offset[k]. No entry is empty.
struct SegmentTable {
  i64 count = 0;
  i64 end[kTableCapacity];
  i64 offset[kTableCapacity];
  std::uint32_t decay[(kTableCapacity + 31) / 32];  // bit k: weight decay on segment k (AdamW)
};
// Kernel parameters: the table, five pointers (AdamW's w, m, v, g and the
// params output) and AdamW's scalars within 4 KB: 3880 + 40 + 36 = 3956 bytes.
static_assert(sizeof(SegmentTable) + 5 * sizeof(void*) + sizeof(kernels::AdamCoefficients) <= 4096,
              "the segment table must fit the 4 KB of kernel parameters");

// The tables of a segment list: empty segments dropped, a segment that starts
// where the previous one ends (with the same decay) merged into it, then cut
// into tables of kTableCapacity. The flat order is the list's, so the result
// depends on the list only (not on where the buffers sit).
inline std::vector<SegmentTable> segment_tables(const std::vector<kernels::AdamSegment>& segments) {
  std::vector<kernels::AdamSegment> merged;
  for (const auto& s : segments) {
    if (s.begin >= s.end) continue;
    if (!merged.empty() && merged.back().end == s.begin && merged.back().decay == s.decay)
      merged.back().end = s.end;
    else
      merged.push_back(s);
  }
  std::vector<SegmentTable> tables;
  for (std::size_t first = 0; first < merged.size(); first += kTableCapacity) {
    SegmentTable& t = tables.emplace_back();
    std::fill(std::begin(t.decay), std::end(t.decay), 0u);
    i64 flat = 0;
    for (std::size_t k = first; k < std::min(merged.size(), first + kTableCapacity); ++k) {
      const auto e = static_cast<int>(t.count++);
      t.offset[e] = merged[k].begin - flat;
      flat += merged[k].end - merged[k].begin;
      t.end[e] = flat;
      if (merged[k].decay) t.decay[e >> 5] |= 1u << (e & 31);
    }
  }
  return tables;
}

inline std::vector<SegmentTable> range_tables(const std::vector<std::pair<i64, i64>>& ranges) {
  std::vector<kernels::AdamSegment> segments;
  segments.reserve(ranges.size());
  for (const auto& [b, e] : ranges) segments.push_back({b, e, false});
  return segment_tables(segments);
}

// Every flat index of the table is one thread's element of a grid-stride
// loop (a warp's lanes take adjacent indices, so loads stay coalesced inside a
// segment). A thread's indices only grow, so its segment cursor only moves
// forward: at most count steps per thread in all, each a uniform read of the
// parameter bank for most warps.

// adamw_segments_kernel<G, NoParams>: AdamW without the params output.
struct NoParams {};

// A thread of adamw_segments_kernel updates kAdamUnroll runs of kAdamRun
// adjacent elements per step, loading all their w, m, v and g before it
// computes any: 8 x 14 bytes in flight a thread for bf16 gradients. A run that
// lies in one segment with every operand 16-byte aligned (w, m, v: one fp32
// pack each) is loaded and stored whole; the 2026-11-26 H200 profile had the
// element-by-element kernel (4-byte loads, 4 elements a thread) at 3.1 TB/s,
// below what a packed stream reaches there (~3.3 TB/s for the cross-entropy's
// backward). Any other run (a segment's edge, an offset that is not a multiple
// of 4) goes element by element, so every list is served. Run u of a step lies
// blockDim x kAdamRun elements after run u - 1: each load of a warp is one
// coalesced 512-byte run of fp32 values.
constexpr int kAdamRun = 4;
constexpr int kAdamUnroll = 2;
constexpr int kAdamPerThread = kAdamRun * kAdamUnroll;  // elements a thread takes per step

// Whether V values of S starting at p can be one access: Vec<S, V>'s alignment.
template <typename S, int V>
__device__ __forceinline__ bool vec_aligned(const S* p) {
  return (reinterpret_cast<std::uintptr_t>(p) % alignof(Vec<S, V>)) == 0;
}

// AdamW, element by element, the CPU kernel's formula (kernels/adamw_formula.h,
// fp32, each operation rounded on its own: the same bits as the CPU, packed
// or not). P (float, __nv_bfloat16, __half or double) also stores the new
// weight into p[i], rounded from its fp32 value by st<P>(float)
// (__float2bfloat16_rn / __float2half_rn), the conversion of the cast kernel
// behind Tensor::copy_from (cuda_kernels.cu). Block b's step s covers the
// flat indices [(s x gridDim + b) x tile, + tile), tile = blockDim x
// kAdamPerThread.
// ptxas (sm_90) gives it 80 registers, three blocks of kThreads an SM: ~86 KB
// in flight an SM for bf16 gradients. Bounded to four blocks it spills.
template <typename G, typename P>
__global__ void adamw_segments_kernel(float* w, float* m, float* v, const G* g, P* p, const SegmentTable t,
                                      const kernels::AdamCoefficients c) {
  constexpr int R = kAdamRun;
  constexpr bool kParams = !std::is_same_v<P, NoParams>;
  const i64 total = t.end[t.count - 1];
  const i64 tile = static_cast<i64>(blockDim.x) * kAdamPerThread;
  const i64 stride = static_cast<i64>(gridDim.x) * tile;
  int k = 0;
  for (i64 base = static_cast<i64>(blockIdx.x) * tile; base < total; base += stride) {
    i64 idx[kAdamUnroll][R];  // buffer index of each element, -1 past the end
    bool packed[kAdamUnroll];
    float wi[kAdamUnroll][R], mi[kAdamUnroll][R], vi[kAdamUnroll][R], gi[kAdamUnroll][R], df[kAdamUnroll][R];
#pragma unroll
    for (int u = 0; u < kAdamUnroll; ++u) {
      const i64 j0 = base + (static_cast<i64>(u) * blockDim.x + threadIdx.x) * R;
      packed[u] = false;
#pragma unroll
      for (int r = 0; r < R; ++r) idx[u][r] = -1;
      if (j0 >= total) continue;
      while (j0 >= t.end[k]) ++k;
      const i64 i0 = j0 + t.offset[k];
      if constexpr (kParams)
        packed[u] = j0 + R <= t.end[k] && vec_aligned<float, R>(w + i0) && vec_aligned<float, R>(m + i0) &&
                    vec_aligned<float, R>(v + i0) && vec_aligned<G, R>(g + i0) && vec_aligned<P, R>(p + i0);
      else
        packed[u] = j0 + R <= t.end[k] && vec_aligned<float, R>(w + i0) && vec_aligned<float, R>(m + i0) &&
                    vec_aligned<float, R>(v + i0) && vec_aligned<G, R>(g + i0);
      if (packed[u]) {
        const float d = (t.decay[k >> 5] >> (k & 31)) & 1u ? c.decay_factor : 1.0f;
        const Vec<float, R> wp = *reinterpret_cast<const Vec<float, R>*>(w + i0);
        const Vec<float, R> mp = *reinterpret_cast<const Vec<float, R>*>(m + i0);
        const Vec<float, R> vp = *reinterpret_cast<const Vec<float, R>*>(v + i0);
        const Vec<G, R> gp = *reinterpret_cast<const Vec<G, R>*>(g + i0);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          idx[u][r] = i0 + r;
          df[u][r] = d;
          wi[u][r] = wp.v[r];
          mi[u][r] = mp.v[r];
          vi[u][r] = vp.v[r];
          gi[u][r] = static_cast<float>(ld(gp.v[r]));
        }
        continue;
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const i64 j = j0 + r;
        if (j >= total) break;
        while (j >= t.end[k]) ++k;
        const i64 i = j + t.offset[k];
        idx[u][r] = i;
        df[u][r] = (t.decay[k >> 5] >> (k & 31)) & 1u ? c.decay_factor : 1.0f;
        wi[u][r] = w[i];
        mi[u][r] = m[i];
        vi[u][r] = v[i];
        gi[u][r] = static_cast<float>(ld(g[i]));
      }
    }
#pragma unroll
    for (int u = 0; u < kAdamUnroll; ++u) {
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (idx[u][r] >= 0) kernels::adamw_element(wi[u][r], mi[u][r], vi[u][r], gi[u][r], df[u][r], c);
      if (packed[u]) {
        const i64 i0 = idx[u][0];
        Vec<float, R> wp, mp, vp;
        [[maybe_unused]] Vec<P, R> pp;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          wp.v[r] = wi[u][r];
          mp.v[r] = mi[u][r];
          vp.v[r] = vi[u][r];
          if constexpr (kParams) pp.v[r] = st<P>(wi[u][r]);
        }
        *reinterpret_cast<Vec<float, R>*>(m + i0) = mp;
        *reinterpret_cast<Vec<float, R>*>(v + i0) = vp;
        *reinterpret_cast<Vec<float, R>*>(w + i0) = wp;
        if constexpr (kParams) *reinterpret_cast<Vec<P, R>*>(p + i0) = pp;
        continue;
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const i64 i = idx[u][r];
        if (i < 0) continue;
        m[i] = mi[u][r];
        v[i] = vi[u][r];
        w[i] = wi[u][r];
        if constexpr (kParams) p[i] = st<P>(wi[u][r]);
      }
    }
  }
}

// Elements a thread of sum_sq_segments_kernel reads per step: a run of
// kNormRun adjacent ones, loaded (in their own precision: 16 registers for
// 16-bit or fp32 gradients) before any is added, so each thread has that many
// loads in flight, and a warp reads 32 runs side by side. With the launcher's
// kNormBlocks (4 blocks of 256 threads per SM of an H100/H200) that is 32 KB
// in flight per SM for bf16 gradients, what the SM needs to stream at HBM
// speed; one element at a time, 264 x 256 threads kept ~1 KB in flight per
// SM: ~0.2 TB/s on an H100.
constexpr int kNormRun = 16;
static_assert(kNormRun % 8 == 0, "a run is whole 16-byte packs of 16-bit, fp32 or fp64 values");

// What sum_sq_segments_kernel adds up per element: its square (the gradient
// norm), or 1 for a zero (+0 or -0: Megatron's number of zeros in the grad).
enum class RangeSum { Squares, Zeros };

// partial[blockIdx.x] = the block's sum of squares (or count of zeros) over
// the table, in double.
// Thread t of block b takes the runs starting at (b * blockDim + t) * kNormRun,
// then every gridDim * blockDim * kNormRun further, adding a run's squares in
// order (each element widened to double, then squared); then block_sum: a
// fixed order for a given table and grid (the launcher always runs
// kNormBlocks x kThreads).
template <typename G, RangeSum kSum = RangeSum::Squares>
__global__ void sum_sq_segments_kernel(const G* g, const SegmentTable t, double* partial) {
  using L = decltype(ld(g[0]));  // float, or double for fp64 gradients
  const i64 total = t.end[t.count - 1];
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x * kNormRun;
  double acc = 0;
  int k = 0;
  for (i64 j0 = (static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x) * kNormRun; j0 < total; j0 += stride) {
    L x[kNormRun];
    while (j0 >= t.end[k]) ++k;
    const G* run = g + j0 + t.offset[k];
    if (j0 + kNormRun <= t.end[k] && (reinterpret_cast<std::uintptr_t>(run) & 15u) == 0) {
      // The run lies in one segment and starts on a 16-byte boundary (nearly
      // all do where the parameters' sizes are multiples of 8, as GPT's are:
      // the flat buffer packs them end to end): whole packs. Element by
      // element, a warp's 16 loads each touched 32 sectors 32 bytes apart
      // (the 2026-11-26 H200 bench: 0.50 ms, 1435 GB/s, for 355M bf16 values).
      constexpr int V = kVec<G>;
#pragma unroll
      for (int q = 0; q < kNormRun / V; ++q) {
        const Pack<G> pk = reinterpret_cast<const Pack<G>*>(run)[q];
#pragma unroll
        for (int v = 0; v < V; ++v) x[q * V + v] = ld(pk.v[v]);
      }
    } else {
#pragma unroll
      for (int u = 0; u < kNormRun; ++u) {
        const i64 j = j0 + u;
        x[u] = kSum == RangeSum::Zeros ? 1 : 0;  // past the end: adds nothing either way
        if (j < total) {
          while (j >= t.end[k]) ++k;
          x[u] = ld(g[j + t.offset[k]]);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kNormRun; ++u) {
      const double d = x[u];
      acc += kSum == RangeSum::Zeros ? (d == 0 ? 1.0 : 0.0) : d * d;
    }
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// Zeroes every element of the table's segments (kernels::zero_ranges: the
// gradients zero_grad clears) as a W-byte unsigned word (the zero word is 0.0
// in every float dtype of that width), a grid-stride loop over the flat
// indices. Overlapping ranges write the same zero twice: harmless.
template <typename W>
__global__ void zero_segments_kernel(W* x, const SegmentTable t) {
  const i64 total = t.end[t.count - 1];
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  int k = 0;
  for (i64 j = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; j < total; j += stride) {
    while (j >= t.end[k]) ++k;
    x[j + t.offset[k]] = W{0};
  }
}

// *out = the sum of the n partials (one block; a thread's strided sum, then
// block_sum): the launches' block sums added in a fixed order. n = 0: *out = 0.
template <typename T>
__global__ void sum_partials_kernel(const T* partial, i64 n, T* out) {
  T acc = 0;
  for (i64 i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out = acc;
}

}  // namespace megazero::cuda::detail_k
