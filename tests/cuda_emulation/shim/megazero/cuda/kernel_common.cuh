// Stand-in for megazero/cuda/kernel_common.cuh in the CPU emulation: the
// pieces the flash attention kernels use (element load/store with the real
// rounding of bf16/fp16, the index type).
#pragma once
#include <type_traits>

#include "emu_runtime.h"
#include "megazero/kernels/layer_kernels.h"

namespace megazero::cuda::detail_k {
using i64 = std::int64_t;
using ::ld;
template <typename S>
S st(float v) {
  if constexpr (std::is_same_v<S, __half>)
    return __half{static_cast<_Float16>(v)};
  else if constexpr (std::is_same_v<S, __nv_bfloat16>)
    return to_bf16(v);
  else
    return static_cast<S>(v);
}
}  // namespace megazero::cuda::detail_k
