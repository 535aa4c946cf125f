// Vocabulary-parallel and position embeddings on the GPU: the launchers of
// megazero/cuda/embedding.h (contracts: megazero/kernels/embedding.h). The
// embedding gradient sorts (row, token) pairs with CUB's radix sort
// (vocab_kernels.cuh has its kernels): the CPU's summation order without a
// host round trip; the position gradient is a column sum (column_sums.cuh).
#include <cuda_runtime.h>
#include <cub/device/device_radix_sort.cuh>

#include "megazero/cuda/column_sums.cuh"
#include "megazero/cuda/embedding.h"
#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/layer_helpers.cuh"
#include "megazero/cuda/vocab_kernels.cuh"

namespace megazero::cuda {
using namespace detail_k;

namespace {

template <typename S>
void embedding_forward_t(const std::int64_t* ids, const void* table, i64 vocab_start, i64 v, i64 h, void* out, i64 n,
                         cudaStream_t s) {
  const S* tab = static_cast<const S*>(table);
  elementwise(
      static_cast<S*>(out), n * h,
      [=] __device__(i64 i) {
        const i64 row = local_column(ids[i / h], vocab_start, v);
        return row >= 0 ? tab[row * h + i % h] : st<S>(compute_t<S>(0));
      },
      s, "embedding_forward");
}

}  // namespace

void embedding_forward(DType t, const std::int64_t* ids, const void* table, i64 vocab_start, i64 v, i64 h, void* out,
                       i64 n, cudaStream_t s) {
  MZ_BY_STORAGE(t, embedding_forward_t, ids, table, vocab_start, v, h, out, n, s);
}

void embedding_backward(DType t, const std::int64_t* ids, const void* dout, i64 vocab_start, i64 n, i64 v, i64 h,
                        void* dtable, DType dtable_type, kernels::GpuScratch ws, cudaStream_t s) {
  if (n == 0 || h == 0) return;
  MZ_CHECK(n < (i64{1} << 31) && v < (i64{1} << 31) - 1, "embedding_backward: ", n, " tokens or ", v,
           " rows exceed the 32-bit sort keys");
  int end_bit = 1;  // keys are in [0, v]
  while (end_bit < 31 && (i64{1} << end_bit) <= v) ++end_bit;
  const int items = static_cast<int>(n);
  // The sort's workspace first (256-byte aligned), then the four lists: the
  // keys and token indices, each double-buffered (the sort may leave its
  // result in either buffer).
  char* base = scratch_as<char>(ws, kernels::gpu_scratch::embedding_sort_bytes(n), "embedding_backward");
  const std::size_t lists_at = kernels::gpu_scratch::embedding_sort_lists_offset(n);
  int* lists = reinterpret_cast<int*>(base + lists_at);
  cub::DoubleBuffer<int> keys(lists, lists + n), tokens(lists + 2 * n, lists + 3 * n);
  std::size_t sort_bytes = 0;
  check_call(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, tokens, items, 0, end_bit, s),
             "embedding_backward: sort size");
  MZ_CHECK(sort_bytes <= lists_at, "embedding_backward: CUB's radix sort wants ", sort_bytes,
           " bytes of workspace for ", n, " tokens, more than the ", lists_at,
           " of megazero/kernels/gpu_scratch.cpp's bound (embedding_sort_lists_offset): raise the bound");
  embedding_keys_kernel<<<blocks_for(n), kThreads, 0, s>>>(ids, vocab_start, v, n, keys.Current(), tokens.Current());
  check_launch("embedding_backward keys");
  check_call(cub::DeviceRadixSort::SortPairs(base, sort_bytes, keys, tokens, items, 0, end_bit, s),
             "embedding_backward: sort");
  const unsigned threads = h > 512 ? 256 : 128;
  const i64 tiles = (h + i64{threads} * kEmbeddingColumnsPerThread - 1) / (i64{threads} * kEmbeddingColumnsPerThread);
  MZ_CHECK(tiles <= 65535, "embedding_backward: hidden size ", h, " needs ", tiles, " column tiles (at most 65535)");
  with_storage(t, [&](auto tag) {
    using S = decltype(tag);
    with_accumulator<S>(dtable_type, [&](auto acc) {
      using G = decltype(acc);
      embedding_backward_runs_kernel<S, G>
          <<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(tiles)), threads, 0, s>>>(
              static_cast<const S*>(dout), keys.Current(), tokens.Current(), n, v, h, static_cast<G*>(dtable));
    });
  });
  check_launch("embedding_backward");
}

void add_position_embedding(DType t, void* out, const void* pos, i64 numel, i64 per_sample, cudaStream_t s) {
  MZ_BY_STORAGE(t, add_periodic_t, out, pos, numel, per_sample, s, "add_position_embedding");
}

void position_embedding_backward(DType t, const void* dout, i64 batch, i64 per_sample, void* dpos, DType dpos_type,
                                 kernels::GpuScratch ws, cudaStream_t s) {
  MZ_BY_STORAGE_AND_ACC(t, dpos_type, sum_rows_t, dout, dpos, batch, per_sample, ws, s, "position_embedding_backward");
}

}  // namespace megazero::cuda
