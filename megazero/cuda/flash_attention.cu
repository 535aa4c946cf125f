// Fused causal attention on tensor cores (flash_attention.h has the contract).
//
// Tiles: 64 query rows x 64 keys; a block is 4 warps, warp w owns rows
// [16w, 16w + 16) of every 64-row tile it computes, so softmax statistics and
// accumulators need no cross-warp exchange: the only block barriers are
// around the shared tiles that all warps read (K/V in forward and dq, Q/dO in
// dk/dv). Products use WMMA 16x16x16 fragments (bf16/fp16 in, fp32 out);
// scores go through shared memory as fp32, where each lane pair handles one
// row (forward, dq) or each lane two query columns (dk/dv) — the layouts that
// let a lane walk consecutive dropout indices, so one Philox block serves
// four elements as in the CPU kernel.
//
// Head sizes are padded to DP in {16, 32, 64, 128} with zeros in shared memory
// (zero columns add nothing to q.k and produce columns that are not stored).
// Row strides are padded by 16 bytes so that WMMA's row loads hit distinct
// shared-memory banks.
//
// Dropout: element (i, j) of matrix bh is kept when the Philox word of its
// global index (kernels::DropoutLayout) clears keep_threshold(p): the CPU's
// mask. Forward keeps exp(s - running max) unnormalised (scaled by 1/(1-p) when
// kept) and divides by the undropped sum at the end, which is
// dropout(softmax(s)) v.
#include "megazero/cuda/flash_attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>
#include <initializer_list>

#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/philox.cuh"

namespace megazero::cuda {
using namespace detail_k;

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kRows = 64;  // query rows of a block's tile, and keys per streamed tile
constexpr int kWarps = 4;  // 16 rows each
constexpr int kBlockThreads = kWarps * 32;
constexpr int kLdS = kRows + 4;  // fp32 [64 x 64] tiles
constexpr int kLdP = kRows + 8;  // 16-bit [64 x 64] tiles
constexpr float kLog2e = 1.4426950408889634f;

template <int DP>
struct Head {
  static constexpr int kLdH = DP + 8;  // 16-bit [64 x DP] tiles
  static constexpr int kLdO = DP + 4;  // fp32 [64 x DP] tiles
  static constexpr int kFrags = DP / 16;
};

using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
template <typename S>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, S, wmma::row_major>;
template <typename S>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, S, wmma::row_major>;
template <typename S>
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, S, wmma::col_major>;  // B = X^T of a row-major X

constexpr std::size_t align128(std::size_t n) { return (n + 127) / 128 * 128; }
template <typename S, int DP>
constexpr std::size_t head_tile() {
  return align128(sizeof(S) * kRows * Head<DP>::kLdH);
}
constexpr std::size_t score_tile() { return align128(sizeof(float) * kRows * kLdS); }
template <typename S>
constexpr std::size_t prob_tile() {
  return align128(sizeof(S) * kRows * kLdP);
}

// Shared-memory carving, the same on host (sizes) and device (pointers).
template <typename S, int DP>
struct ForwardSmem {
  static constexpr std::size_t q = 0, k = q + head_tile<S, DP>(), v = k + head_tile<S, DP>(),
                               s = v + head_tile<S, DP>(), p = s + score_tile(), o = p + prob_tile<S>(),
                               bytes = o + align128(sizeof(float) * kRows * Head<DP>::kLdO);
};
// dk/dv per key tile; the fp32 staging of the results reuses st+dpt.
template <typename S, int DP>
struct KeySmem {
  static constexpr std::size_t k = 0, v = k + head_tile<S, DP>(), q = v + head_tile<S, DP>(),
                               dout = q + head_tile<S, DP>(), st = dout + head_tile<S, DP>(), dpt = st + score_tile(),
                               pt = dpt + score_tile(), dst = pt + prob_tile<S>(), lse = dst + prob_tile<S>(),
                               dot = lse + align128(sizeof(float) * kRows),
                               bytes = dot + align128(sizeof(float) * kRows);
  static_assert(sizeof(float) * kRows * Head<DP>::kLdO <= 2 * score_tile(), "staging fits in st + dpt");
};
// dq per query tile; the fp32 staging reuses s+dp.
template <typename S, int DP>
struct QuerySmem {
  static constexpr std::size_t q = 0, dout = q + head_tile<S, DP>(), k = dout + head_tile<S, DP>(),
                               v = k + head_tile<S, DP>(), s = v + head_tile<S, DP>(), dp = s + score_tile(),
                               ds = dp + score_tile(), bytes = ds + prob_tile<S>();
  static_assert(sizeof(float) * kRows * Head<DP>::kLdO <= 2 * score_tile(), "staging fits in s + dp");
};

template <typename T>
__device__ __forceinline__ T* at(unsigned char* smem, std::size_t offset) {
  return reinterpret_cast<T*>(smem + offset);
}

// dst[r][c] = src[(row0 + r) * d + c] for row0 + r < s_len and c < d, else 0;
// 16-byte moves (d % 8 == 0, so a chunk is either inside a row or past its end).
template <typename S, int DP>
__device__ __forceinline__ void load_tile(S* dst, const S* src, int row0, int s_len, int d) {
  constexpr int kChunks = DP / 8;
  for (int idx = threadIdx.x; idx < kRows * kChunks; idx += kBlockThreads) {
    const int r = idx / kChunks, c = (idx % kChunks) * 8, row = row0 + r;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (row < s_len && c < d) val = *reinterpret_cast<const uint4*>(src + static_cast<i64>(row) * d + c);
    *reinterpret_cast<uint4*>(dst + r * Head<DP>::kLdH + c) = val;
  }
}

// out[16 x 16 fragment n] of rows [16 w, 16 w + 16) = a-rows x b, accumulated
// over `steps` k-steps of 16: A row-major at a (ld la), B at b (ld lb), with B
// either row-major (b + kk*16*lb) or the transpose of a row-major tile
// (b + kk*16, col-major).
template <typename S, bool kBTransposed>
__device__ __forceinline__ void mma_steps(FragAcc& acc, const S* a, int la, const S* b, int lb, int steps) {
  for (int kk = 0; kk < steps; ++kk) {
    FragA<S> fa;
    wmma::load_matrix_sync(fa, a + kk * 16, la);
    if constexpr (kBTransposed) {
      FragBt<S> fb;
      wmma::load_matrix_sync(fb, b + kk * 16, lb);
      wmma::mma_sync(acc, fa, fb, acc);
    } else {
      FragB<S> fb;
      wmma::load_matrix_sync(fb, b + kk * 16 * lb, lb);
      wmma::mma_sync(acc, fa, fb, acc);
    }
  }
}

// This warp's 16 rows of A (row-major [64 x DP], ld kLdH) times the 64 rows of
// X^T (X row-major [64 x DP]) -> fp32 [16 x 64] at out (ld kLdS).
template <typename S, int DP>
__device__ __forceinline__ void rows_times_transpose(const S* a_rows, const S* x, float* out) {
  constexpr int ld = Head<DP>::kLdH;
#pragma unroll
  for (int n = 0; n < kRows / 16; ++n) {
    FragAcc acc;
    wmma::fill_fragment(acc, 0.f);
    mma_steps<S, true>(acc, a_rows, ld, x + n * 16 * ld, ld, Head<DP>::kFrags);
    wmma::store_matrix_sync(out + n * 16, acc, kLdS, wmma::mem_row_major);
  }
}

// Writes a warp's 16 x DP fp32 rows (staged at stage, ld kLdO) to rows
// [row0, row0 + 16) of a [s_len x d] matrix, times `mul`; rows past s_len and
// columns past d are padding. Each lane pair writes one row.
template <typename S, int DP>
__device__ __forceinline__ void store_rows(const float* stage, S* dst, int row0, int s_len, int d, float mul) {
  const int lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1, row = row0 + r;
  if (row >= s_len) return;
  const float* src = stage + r * Head<DP>::kLdO;
  S* out = dst + static_cast<i64>(row) * d;
  for (int c = half * (DP / 2); c < (half + 1) * (DP / 2) && c < d; ++c) out[c] = st<S>(src[c] * mul);
}

__device__ __forceinline__ std::uint64_t matrix_base(const kernels::DropoutLayout& l, i64 bh, i64 s_len) {
  const i64 global = (l.sample_offset + bh / l.groups) * l.global_groups + l.group_offset + bh % l.groups;
  return static_cast<std::uint64_t>(global) * static_cast<std::uint64_t>(s_len * s_len);
}

// The dropout decision for increasing indices: one Philox block per four.
struct KeepMask {
  PhiloxKey key;
  std::uint32_t threshold;
  bool on;
  std::uint64_t block = ~std::uint64_t{0};
  uint4 words{};
  __device__ __forceinline__ bool keep(std::uint64_t idx) {
    if (!on) return true;
    if ((idx >> 2) != block) {
      block = idx >> 2;
      words = philox(block, key);
    }
    return kept(word(words, static_cast<unsigned>(idx & 3u)), threshold);
  }
};

struct Dropout {
  PhiloxKey key;
  std::uint32_t threshold;
  bool on;
  float keep_scale;
  kernels::DropoutLayout layout;
};

// Documents packed into samples (--reset-attention-mask): row qi of matrix bh
// keeps the keys from its document's start on. A sample's starts never
// decrease (documents follow each other), so a tile's first row has the
// smallest: the key tiles before it are skipped whole. No starts: key 0.
struct Documents {
  const std::int64_t* starts = nullptr;  // [samples * s_len]
  int heads = 1;                         // matrices of a sample
  // The first key of row qi (0 past the sequence), clamped to [0, qi] as the CPU's.
  __device__ __forceinline__ int first(i64 bh, int s_len, int qi) const {
    if (!starts || qi >= s_len) return 0;
    const i64 st = starts[bh / heads * s_len + qi];
    return st < 0 ? 0 : st > qi ? qi : static_cast<int>(st);
  }
};

// ------------------------------------------------------------------ forward

template <typename S, int DP>
__global__ void __launch_bounds__(kBlockThreads)
    flash_forward_kernel(const S* __restrict__ q, const S* __restrict__ k, const S* __restrict__ v, S* __restrict__ out,
                         float* __restrict__ lse, int s_len, int d, int kv_group, float scale_log2, Dropout drop,
                         Documents docs) {
  using H = Head<DP>;
  using M = ForwardSmem<S, DP>;
  extern __shared__ __align__(128) unsigned char smem[];
  S* sq = at<S>(smem, M::q);
  S* sk = at<S>(smem, M::k);
  S* sv = at<S>(smem, M::v);
  float* ss = at<float>(smem, M::s);
  S* sp = at<S>(smem, M::p);
  float* so = at<float>(smem, M::o);

  const i64 bh = blockIdx.x;
  const int tiles = static_cast<int>(gridDim.y), qt = tiles - 1 - static_cast<int>(blockIdx.y);  // longest first
  const int q0 = qt * kRows, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const i64 head = bh * s_len * d;
  const i64 kv_head = bh / kv_group * s_len * d;  // grouped-query attention: the group's k/v head
  load_tile<S, DP>(sq, q + head, q0, s_len, d);
  for (int i = threadIdx.x; i < kRows * H::kLdO; i += kBlockThreads) so[i] = 0.f;

  // Lane pair (r, half): row r of the tile, keys [32 half, 32 half + 32) of each key tile.
  const int r = warp * 16 + (lane >> 1), half = lane & 1, qi = q0 + r;
  const std::uint64_t row_index = matrix_base(drop.layout, bh, s_len) + static_cast<std::uint64_t>(qi) * s_len;
  float m = -INFINITY, sum = 0.f;  // running max (log2 units) and sum of exp2(x - m)
  const int lo = docs.first(bh, s_len, qi);
  for (int kt = docs.first(bh, s_len, q0) / kRows; kt <= qt; ++kt) {
    const int k0 = kt * kRows;
    __syncthreads();  // every warp is done with the previous K/V tile
    load_tile<S, DP>(sk, k + kv_head, k0, s_len, d);
    load_tile<S, DP>(sv, v + kv_head, k0, s_len, d);
    __syncthreads();
    rows_times_transpose<S, DP>(sq + warp * 16 * H::kLdH, sk, ss + warp * 16 * kLdS);
    __syncwarp();

    float x[32];
    float mx = -INFINITY;
    const float* srow = ss + r * kLdS + half * 32;
    const int j0 = k0 + half * 32;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      x[c] = (j0 + c >= lo && j0 + c <= qi && qi < s_len) ? srow[c] * scale_log2 : -INFINITY;
      mx = fmaxf(mx, x[c]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m, mx);
    const float alpha = m_new == -INFINITY ? 1.f : exp2f(m - m_new);
    KeepMask mask{drop.key, drop.threshold, drop.on};
    S* prow = sp + r * kLdP + half * 32;
    float part = 0.f;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const float e = x[c] == -INFINITY ? 0.f : exp2f(x[c] - m_new);
      part += e;
      const bool keep = e == 0.f || mask.keep(row_index + static_cast<std::uint64_t>(j0 + c));
      prow[c] = st<S>(keep ? e * drop.keep_scale : 0.f);
    }
    part += __shfl_xor_sync(0xffffffffu, part, 1);
    sum = sum * alpha + part;
    m = m_new;
    float* orow = so + r * H::kLdO + half * (DP / 2);
#pragma unroll
    for (int c = 0; c < DP / 2; ++c) orow[c] *= alpha;
    __syncwarp();

#pragma unroll
    for (int n = 0; n < H::kFrags; ++n) {  // O rows += P rows x V
      FragAcc acc;
      float* o_frag = so + warp * 16 * H::kLdO + n * 16;
      wmma::load_matrix_sync(acc, o_frag, H::kLdO, wmma::mem_row_major);
      mma_steps<S, false>(acc, sp + warp * 16 * kLdP, kLdP, sv + n * 16, H::kLdH, kRows / 16);
      wmma::store_matrix_sync(o_frag, acc, H::kLdO, wmma::mem_row_major);
    }
    __syncwarp();
  }
  if (qi < s_len) {
    const float inv = 1.f / sum;
    const float* orow = so + r * H::kLdO;
    S* dst = out + head + static_cast<i64>(qi) * d;
    for (int c = half * (DP / 2); c < (half + 1) * (DP / 2) && c < d; ++c) dst[c] = st<S>(orow[c] * inv);
    if (half == 0) lse[bh * s_len + qi] = (m + log2f(sum)) / kLog2e;
  }
}

// ------------------------------------------------------------------ backward

// dot[row] = sum_c dout[row, c] * out[row, c]: one warp per row, fixed order.
template <typename S>
__global__ void row_dot_kernel(const S* __restrict__ out, const S* __restrict__ dout, float* __restrict__ dot, i64 rows,
                               int d) {
  const i64 warps = static_cast<i64>(gridDim.x) * (blockDim.x >> 5);
  for (i64 row = static_cast<i64>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); row < rows; row += warps) {
    float acc = 0.f;
    for (int c = threadIdx.x & 31; c < d; c += 32) acc += ld(out[row * d + c]) * ld(dout[row * d + c]);
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) dot[row] = acc;
  }
}

// dk and dv of one 64-key tile: the query tiles at or after it stream through.
// Warp w computes S^T and dP^T for its 16 keys against the 64 queries, then
// dv += P_dropped^T dout and dk += dS^T q on its own rows (register
// accumulators). scale is folded into dS.
template <typename S, int DP>
__global__ void __launch_bounds__(kBlockThreads)
    flash_backward_dkdv_kernel(const S* __restrict__ q, const S* __restrict__ k, const S* __restrict__ v,
                               const S* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ dot,
                               S* __restrict__ dk, S* __restrict__ dv, int s_len, int d, int kv_group, float scale,
                               float scale_log2, Dropout drop, Documents docs) {
  using H = Head<DP>;
  using M = KeySmem<S, DP>;
  extern __shared__ __align__(128) unsigned char smem[];
  S* sk = at<S>(smem, M::k);
  S* sv = at<S>(smem, M::v);
  S* sq = at<S>(smem, M::q);
  S* sdo = at<S>(smem, M::dout);
  float* sst = at<float>(smem, M::st);
  float* sdpt = at<float>(smem, M::dpt);
  S* spt = at<S>(smem, M::pt);
  S* sdst = at<S>(smem, M::dst);
  float* slse = at<float>(smem, M::lse);
  float* sdot = at<float>(smem, M::dot);

  const i64 bh = blockIdx.x;
  const int tiles = static_cast<int>(gridDim.y), kt = static_cast<int>(blockIdx.y);  // key tile 0 is the longest
  const int k0 = kt * kRows, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const i64 head = bh * s_len * d;
  const i64 kv_head = bh / kv_group * s_len * d;  // grouped-query attention: the group's k/v head
  const std::uint64_t base = matrix_base(drop.layout, bh, s_len);
  load_tile<S, DP>(sk, k + kv_head, k0, s_len, d);
  load_tile<S, DP>(sv, v + kv_head, k0, s_len, d);
  FragAcc dk_acc[H::kFrags], dv_acc[H::kFrags];
#pragma unroll
  for (int n = 0; n < H::kFrags; ++n) {
    wmma::fill_fragment(dk_acc[n], 0.f);
    wmma::fill_fragment(dv_acc[n], 0.f);
  }
  for (int qt = kt; qt < tiles; ++qt) {
    const int q0 = qt * kRows;
    // This and every later query tile start their documents after these keys
    // (the same answer in every thread: the block leaves the loop together).
    if (docs.starts && docs.first(bh, s_len, q0) >= k0 + kRows) break;
    __syncthreads();  // every warp is done with the previous Q/dO tile
    load_tile<S, DP>(sq, q + head, q0, s_len, d);
    load_tile<S, DP>(sdo, dout + head, q0, s_len, d);
    for (int i = threadIdx.x; i < kRows; i += kBlockThreads) {
      const bool in = q0 + i < s_len;
      slse[i] = in ? lse[bh * s_len + q0 + i] * kLog2e : 0.f;
      sdot[i] = in ? dot[bh * s_len + q0 + i] : 0.f;
    }
    __syncthreads();
    rows_times_transpose<S, DP>(sk + warp * 16 * H::kLdH, sq, sst + warp * 16 * kLdS);    // S^T
    rows_times_transpose<S, DP>(sv + warp * 16 * H::kLdH, sdo, sdpt + warp * 16 * kLdS);  // dP^T (before dropout')
    __syncwarp();
    // Lane: query columns 2 lane and 2 lane + 1, the warp's 16 keys in order
    // (consecutive dropout indices).
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
      const int c = 2 * lane + cc, qq = q0 + c, lo = docs.first(bh, s_len, qq);
      const float l2 = slse[c], dd = sdot[c];
      const std::uint64_t row_index = base + static_cast<std::uint64_t>(qq) * s_len;
      KeepMask mask{drop.key, drop.threshold, drop.on};
#pragma unroll 4
      for (int rr = 0; rr < 16; ++rr) {
        const int row = warp * 16 + rr, kj = k0 + row;
        float pd = 0.f, ds = 0.f;
        if (qq < s_len && kj <= qq && kj >= lo) {
          const float p = exp2f(sst[row * kLdS + c] * scale_log2 - l2);
          const bool keep = mask.keep(row_index + static_cast<std::uint64_t>(kj));
          pd = keep ? p * drop.keep_scale : 0.f;
          const float g = keep ? sdpt[row * kLdS + c] * drop.keep_scale : 0.f;
          ds = p * (g - dd) * scale;
        }
        spt[row * kLdP + c] = st<S>(pd);
        sdst[row * kLdP + c] = st<S>(ds);
      }
    }
    __syncwarp();
#pragma unroll
    for (int n = 0; n < H::kFrags; ++n) {
      mma_steps<S, false>(dv_acc[n], spt + warp * 16 * kLdP, kLdP, sdo + n * 16, H::kLdH, kRows / 16);
      mma_steps<S, false>(dk_acc[n], sdst + warp * 16 * kLdP, kLdP, sq + n * 16, H::kLdH, kRows / 16);
    }
  }
  __syncthreads();  // the staging area overlaps every warp's st/dpt rows
  float* stage = sst + warp * 16 * H::kLdO;
  const int row0 = k0 + warp * 16;
#pragma unroll
  for (int n = 0; n < H::kFrags; ++n) wmma::store_matrix_sync(stage + n * 16, dv_acc[n], H::kLdO, wmma::mem_row_major);
  __syncwarp();
  store_rows<S, DP>(stage, dv + head, row0, s_len, d, 1.f);
  __syncwarp();
#pragma unroll
  for (int n = 0; n < H::kFrags; ++n) wmma::store_matrix_sync(stage + n * 16, dk_acc[n], H::kLdO, wmma::mem_row_major);
  __syncwarp();
  store_rows<S, DP>(stage, dk + head, row0, s_len, d, 1.f);
}

// dq of one 64-query tile: the key tiles up to it stream through; each warp
// recomputes S and dP for its 16 rows and accumulates dq += dS k.
template <typename S, int DP>
__global__ void __launch_bounds__(kBlockThreads)
    flash_backward_dq_kernel(const S* __restrict__ q, const S* __restrict__ k, const S* __restrict__ v,
                             const S* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ dot,
                             S* __restrict__ dq, int s_len, int d, int kv_group, float scale, float scale_log2,
                             Dropout drop, Documents docs) {
  using H = Head<DP>;
  using M = QuerySmem<S, DP>;
  extern __shared__ __align__(128) unsigned char smem[];
  S* sq = at<S>(smem, M::q);
  S* sdo = at<S>(smem, M::dout);
  S* sk = at<S>(smem, M::k);
  S* sv = at<S>(smem, M::v);
  float* ss = at<float>(smem, M::s);
  float* sdp = at<float>(smem, M::dp);
  S* sds = at<S>(smem, M::ds);

  const i64 bh = blockIdx.x;
  const int tiles = static_cast<int>(gridDim.y), qt = tiles - 1 - static_cast<int>(blockIdx.y);
  const int q0 = qt * kRows, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const i64 head = bh * s_len * d;
  const i64 kv_head = bh / kv_group * s_len * d;  // grouped-query attention: the group's k/v head
  load_tile<S, DP>(sq, q + head, q0, s_len, d);
  load_tile<S, DP>(sdo, dout + head, q0, s_len, d);
  const int r = warp * 16 + (lane >> 1), half = lane & 1, qi = q0 + r;
  const bool row_in = qi < s_len;
  const float l2 = row_in ? lse[bh * s_len + qi] * kLog2e : 0.f, dd = row_in ? dot[bh * s_len + qi] : 0.f;
  const std::uint64_t row_index = matrix_base(drop.layout, bh, s_len) + static_cast<std::uint64_t>(qi) * s_len;
  FragAcc dq_acc[H::kFrags];
#pragma unroll
  for (int n = 0; n < H::kFrags; ++n) wmma::fill_fragment(dq_acc[n], 0.f);
  const int lo = docs.first(bh, s_len, qi);
  for (int kt = docs.first(bh, s_len, q0) / kRows; kt <= qt; ++kt) {
    const int k0 = kt * kRows;
    __syncthreads();
    load_tile<S, DP>(sk, k + kv_head, k0, s_len, d);
    load_tile<S, DP>(sv, v + kv_head, k0, s_len, d);
    __syncthreads();
    rows_times_transpose<S, DP>(sq + warp * 16 * H::kLdH, sk, ss + warp * 16 * kLdS);    // S
    rows_times_transpose<S, DP>(sdo + warp * 16 * H::kLdH, sv, sdp + warp * 16 * kLdS);  // dP (before dropout')
    __syncwarp();
    KeepMask mask{drop.key, drop.threshold, drop.on};
    const int j0 = k0 + half * 32;
#pragma unroll 8
    for (int c = 0; c < 32; ++c) {
      const int j = j0 + c, e = r * kLdS + half * 32 + c;
      float ds = 0.f;
      if (row_in && j <= qi && j >= lo) {
        const float p = exp2f(ss[e] * scale_log2 - l2);
        const bool keep = mask.keep(row_index + static_cast<std::uint64_t>(j));
        const float g = keep ? sdp[e] * drop.keep_scale : 0.f;
        ds = p * (g - dd) * scale;
      }
      sds[r * kLdP + half * 32 + c] = st<S>(ds);
    }
    __syncwarp();
#pragma unroll
    for (int n = 0; n < H::kFrags; ++n)
      mma_steps<S, false>(dq_acc[n], sds + warp * 16 * kLdP, kLdP, sk + n * 16, H::kLdH, kRows / 16);
  }
  __syncthreads();  // the staging area overlaps every warp's s/dp rows
  float* stage = ss + warp * 16 * H::kLdO;
#pragma unroll
  for (int n = 0; n < H::kFrags; ++n) wmma::store_matrix_sync(stage + n * 16, dq_acc[n], H::kLdO, wmma::mem_row_major);
  __syncwarp();
  store_rows<S, DP>(stage, dq + head, q0 + warp * 16, s_len, d, 1.f);
}

// ------------------------------------------------------------------ launch

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw InternalError(::megazero::detail::concat("fused attention: ", what, ": ", cudaGetErrorString(err)));
}

// Opts the kernel into `bytes` of dynamic shared memory. GPUs with less per
// block than a head size of 128 needs (99 KB on sm_86/sm_89: A10, L4, L40,
// RTX 30/40) get a message naming the way out instead of a launch failure.
template <typename Kernel>
void allow_smem(Kernel kernel, std::size_t bytes, i64 d) {
  int device = 0, optin = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
        "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  MZ_REQUIRE(bytes <= static_cast<std::size_t>(optin), "the fused attention kernel for head size ", d, " needs ",
             bytes / 1024, " KiB of shared memory per block; this GPU offers ", optin / 1024,
             " KiB: use --attention-backend unfused (or a smaller head size)");
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
        "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
}

Dropout make_dropout(double p, const RngKey& key, const kernels::DropoutLayout& layout) {
  return {philox_key(key), keep_threshold(p), p > 0, static_cast<float>(p > 0 ? 1.0 / (1.0 - p) : 1.0), layout};
}

// Calls fn(S{}, std::integral_constant<int, DP>{}) for the dtype and the
// smallest padded head size that holds d.
template <typename Fn>
void with_types(DType t, i64 d, Fn&& fn) {
  auto by_dp = [&](auto tag) {
    using S = decltype(tag);
    if (d <= 16)
      fn(S{}, std::integral_constant<int, 16>{});
    else if (d <= 32)
      fn(S{}, std::integral_constant<int, 32>{});
    else if (d <= 64)
      fn(S{}, std::integral_constant<int, 64>{});
    else
      fn(S{}, std::integral_constant<int, 128>{});
  };
  if (t == DType::BF16)
    by_dp(__nv_bfloat16{});
  else if (t == DType::F16)
    by_dp(__half{});
  else
    throw InternalError(::megazero::detail::concat("fused attention: no CUDA kernel for ", dtype_name(t)));
}

void check_sizes(i64 bh, i64 s, i64 d) {
  if (d % 8 != 0 || d > 128 || (s + kRows - 1) / kRows > 65535 || bh > 0x7fffffff)  // grid.y holds the tiles
    throw InternalError(::megazero::detail::concat("fused attention: unsupported sizes bh ", bh, ", s ", s, ", d ", d));
}

Documents documents(const std::int64_t* key_starts, i64 bh, i64 heads_per_sample) {
  if (!key_starts) return {};
  MZ_CHECK(heads_per_sample >= 1 && bh % heads_per_sample == 0 && heads_per_sample <= 0x7fffffff,
           "flash attention: ", bh, " matrices in samples of ", heads_per_sample);
  return {key_starts, static_cast<int>(heads_per_sample)};
}

// The tile loads move 16 bytes at a time from each matrix's rows.
void check_aligned(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0)
      throw InternalError(::megazero::detail::concat("fused attention: tensor data at ", p,
                                                     " is not 16-byte aligned (a view at an odd offset?)"));
}

}  // namespace

void flash_attention_forward(DType t, const void* q, const void* k, const void* v, i64 bh, i64 s, i64 d, i64 kv_group,
                             double scale, double p, const RngKey& key, const kernels::DropoutLayout& layout, void* out,
                             float* lse, cudaStream_t st, const std::int64_t* key_starts, i64 heads_per_sample) {
  if (bh == 0 || s == 0) return;
  check_sizes(bh, s, d);
  MZ_CHECK(kv_group >= 1 && bh % kv_group == 0, "flash attention: ", bh, " query heads in groups of ", kv_group);
  check_aligned({q, k, v, out});
  const Dropout drop = make_dropout(p, key, layout);
  const Documents docs = documents(key_starts, bh, heads_per_sample);
  const dim3 grid(static_cast<unsigned>(bh), static_cast<unsigned>((s + kRows - 1) / kRows));
  with_types(t, d, [&](auto tag, auto dp) {
    using S = decltype(tag);
    constexpr int DP = decltype(dp)::value;
    constexpr std::size_t bytes = ForwardSmem<S, DP>::bytes;
    allow_smem(flash_forward_kernel<S, DP>, bytes, d);
    flash_forward_kernel<S, DP><<<grid, kBlockThreads, bytes, st>>>(
        static_cast<const S*>(q), static_cast<const S*>(k), static_cast<const S*>(v), static_cast<S*>(out), lse,
        static_cast<int>(s), static_cast<int>(d), static_cast<int>(kv_group), static_cast<float>(scale) * kLog2e, drop,
        docs);
  });
  check_launch("flash_attention_forward");
}

void flash_attention_backward(DType t, const void* q, const void* k, const void* v, const void* out, const void* dout,
                              const float* lse, i64 bh, i64 s, i64 d, i64 kv_group, double scale, double p,
                              const RngKey& key, const kernels::DropoutLayout& layout, void* dq, void* dk, void* dv,
                              kernels::GpuScratch ws, cudaStream_t st, const std::int64_t* key_starts,
                              i64 heads_per_sample) {
  if (bh == 0 || s == 0) return;
  check_sizes(bh, s, d);
  MZ_CHECK(kv_group >= 1 && bh % kv_group == 0, "flash attention: ", bh, " query heads in groups of ", kv_group);
  check_aligned({q, k, v, out, dout, dq, dk, dv});
  const Dropout drop = make_dropout(p, key, layout);
  const Documents docs = documents(key_starts, bh, heads_per_sample);
  const dim3 grid(static_cast<unsigned>(bh), static_cast<unsigned>((s + kRows - 1) / kRows));
  float* dot = scratch_as<float>(ws, kernels::gpu_scratch::flash_backward_bytes(bh, s), "flash_attention_backward");
  const float fscale = static_cast<float>(scale), scale_log2 = fscale * kLog2e;
  with_types(t, d, [&](auto tag, auto dp) {
    using S = decltype(tag);
    constexpr int DP = decltype(dp)::value;
    const auto* qs = static_cast<const S*>(q);
    const auto* ks = static_cast<const S*>(k);
    const auto* vs = static_cast<const S*>(v);
    const auto* dos = static_cast<const S*>(dout);
    row_dot_kernel<S><<<blocks_for(bh * s * 32), kThreads, 0, st>>>(static_cast<const S*>(out), dos, dot, bh * s,
                                                                    static_cast<int>(d));
    constexpr std::size_t key_bytes = KeySmem<S, DP>::bytes, query_bytes = QuerySmem<S, DP>::bytes;
    allow_smem(flash_backward_dkdv_kernel<S, DP>, key_bytes, d);
    flash_backward_dkdv_kernel<S, DP><<<grid, kBlockThreads, key_bytes, st>>>(
        qs, ks, vs, dos, lse, dot, static_cast<S*>(dk), static_cast<S*>(dv), static_cast<int>(s), static_cast<int>(d),
        static_cast<int>(kv_group), fscale, scale_log2, drop, docs);
    allow_smem(flash_backward_dq_kernel<S, DP>, query_bytes, d);
    flash_backward_dq_kernel<S, DP><<<grid, kBlockThreads, query_bytes, st>>>(
        qs, ks, vs, dos, lse, dot, static_cast<S*>(dq), static_cast<int>(s), static_cast<int>(d),
        static_cast<int>(kv_group), fscale, scale_log2, drop, docs);
  });
  check_launch("flash_attention_backward");
}

}  // namespace megazero::cuda
