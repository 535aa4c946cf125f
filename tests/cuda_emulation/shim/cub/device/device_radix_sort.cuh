// A CPU stand-in for CUB's DeviceRadixSort::SortPairs over caller-owned
// double buffers (the one form megazero/cuda/embedding.cu uses), with CUB's
// contract enforced where a launcher can break it:
// - the first call, with no temporary storage, only reports how much the sort
//   needs: emu::cub_sort_temp_bytes(n), a model of the onesweep sort's
//   histograms and look-back records (settable, so a test can ask for more
//   than a launcher's bound and see it refused);
// - the second sorts on the device: the temporary storage is overwritten
//   with 0xff bytes over the whole size reported, before and after the
//   result is written (a key or token list laid over it is garbage), the keys are compared on bits
//   [begin_bit, end_bit) only (a key with a bit above end_bit sorts as if it
//   had none: a launcher choosing end_bit too small shows), stably; the result
//   lands in the alternate buffers and the selectors flip (as CUB's odd pass
//   counts leave it: a launcher reading Current() before the sort, or not
//   reading it after, shows).
// Streams are synchronous here, as in emu_host.h.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "emu_host.h"

namespace emu {

// Passes of 8 bits, 256 bins of 4-byte counters each, a look-back record of
// 256 counters per tile of 3840 keys per pass, 256-byte aligned pieces.
inline std::size_t cub_sort_temp_bytes_model(int items, int begin_bit, int end_bit) {
  const auto aligned = [](std::size_t b) { return (b + 255) / 256 * 256; };
  const std::size_t passes = static_cast<std::size_t>((end_bit - begin_bit + 7) / 8);
  const std::size_t tiles = (static_cast<std::size_t>(std::max(items, 1)) + 3839) / 3840;
  return aligned(passes * 256 * 4) + aligned(passes * tiles * 256 * 4) + aligned(passes * 4);
}
// Overrides the model where set (a test's "CUB wants more").
inline std::size_t cub_sort_temp_bytes_override = 0;
inline std::size_t cub_sort_temp_bytes(int items, int begin_bit, int end_bit) {
  return cub_sort_temp_bytes_override ? cub_sort_temp_bytes_override
                                      : cub_sort_temp_bytes_model(items, begin_bit, end_bit);
}
inline long cub_sorts = 0;  // sorts run (not size queries)

}  // namespace emu

namespace cub {

template <typename T>
struct DoubleBuffer {
  T* d_buffers[2];
  int selector = 0;
  DoubleBuffer(T* current, T* alternate) : d_buffers{current, alternate} {}
  T* Current() { return d_buffers[selector]; }
  T* Alternate() { return d_buffers[selector ^ 1]; }
};

struct DeviceRadixSort {
  template <typename K, typename V>
  static cudaError_t SortPairs(void* d_temp_storage, std::size_t& temp_storage_bytes, DoubleBuffer<K>& keys,
                               DoubleBuffer<V>& values, int num_items, int begin_bit = 0,
                               int end_bit = static_cast<int>(sizeof(K) * 8), cudaStream_t = nullptr) {
    if (num_items < 0 || begin_bit < 0 || end_bit > static_cast<int>(sizeof(K) * 8) || begin_bit >= end_bit)
      return cudaErrorInvalidValue;
    const std::size_t need = emu::cub_sort_temp_bytes(num_items, begin_bit, end_bit);
    if (d_temp_storage == nullptr) {
      temp_storage_bytes = need;
      return cudaSuccess;
    }
    if (temp_storage_bytes < need) return cudaErrorInvalidValue;
    emu::DeviceMemory::Open open;
    const std::size_t n = static_cast<std::size_t>(num_items);
    std::vector<K> k(keys.Current(), keys.Current() + n);
    std::vector<V> v(values.Current(), values.Current() + n);
    std::memset(d_temp_storage, 0xff, need);  // the sort's own use of it
    const auto digits = [&](K key) {
      using U = std::make_unsigned_t<K>;
      const int width = end_bit - begin_bit;
      const U mask = width >= static_cast<int>(sizeof(U) * 8) ? ~U{0} : static_cast<U>((U{1} << width) - 1);
      return static_cast<U>(static_cast<U>(key) >> begin_bit) & mask;
    };
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return digits(k[a]) < digits(k[b]); });
    K* ko = keys.Alternate();
    V* vo = values.Alternate();
    for (std::size_t i = 0; i < n; ++i) ko[i] = k[order[i]], vo[i] = v[order[i]];
    // The last pass writes its look-back records while it writes the result:
    // a list laid over the storage is garbage either way.
    std::memset(d_temp_storage, 0xff, need);
    keys.selector ^= 1;
    values.selector ^= 1;
    ++emu::cub_sorts;
    return cudaSuccess;
  }
};

}  // namespace cub
