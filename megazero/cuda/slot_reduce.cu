// Launcher of the shm transport's slot reductions (slot_reduce.h).
#include "megazero/cuda/slot_reduce.h"

#include <cstdint>

#include "megazero/cuda/slot_reduce_kernels.cuh"

namespace megazero::cuda {
using namespace detail_k;
static_assert(kMaxSlotReduceSources == kMaxSlotSources, "the kernel's parameter block holds every source");

namespace {

template <typename S>
void launch(SlotReduce op, void* dst, const void* const* srcs, int nsrc, i64 n, int ranks, cudaStream_t s) {
  SlotSources in{};
  bool packed = aligned16(dst) && n % kVec<S> == 0;
  for (int q = 0; q < nsrc; ++q) {
    in.p[q] = srcs[q];
    packed = packed && aligned16(srcs[q]);
  }
  const SlotOp o = op == SlotReduce::Sum ? SlotOp::Sum : op == SlotReduce::Avg ? SlotOp::Avg : SlotOp::Max;
  if (packed) {
    const i64 units = n / kVec<S>;
    slot_reduce_kernel<S, kVec<S>>
        <<<blocks_for(units), kThreads, 0, s>>>(static_cast<S*>(dst), in, nsrc, units, o, ranks);
  } else {
    slot_reduce_kernel<S, 1><<<blocks_for(n), kThreads, 0, s>>>(static_cast<S*>(dst), in, nsrc, n, o, ranks);
  }
  check_launch("reduce_slots");
}

}  // namespace

void reduce_slots(DType t, SlotReduce op, void* dst, const void* const* srcs, int nsrc, i64 n, int ranks,
                  cudaStream_t s) {
  MZ_CHECK(nsrc >= 1 && nsrc <= kMaxSlotSources, "reduce_slots: ", nsrc, " sources (1 to ", kMaxSlotSources, ")");
  if (n <= 0) return;
  switch (t) {
    case DType::F32:
      return launch<float>(op, dst, srcs, nsrc, n, ranks, s);
    case DType::F64:
      return launch<double>(op, dst, srcs, nsrc, n, ranks, s);
    case DType::BF16:
      return launch<__nv_bfloat16>(op, dst, srcs, nsrc, n, ranks, s);
    case DType::F16:
      return launch<__half>(op, dst, srcs, nsrc, n, ranks, s);
    case DType::I32:
      return launch<std::int32_t>(op, dst, srcs, nsrc, n, ranks, s);
    case DType::I64:
      return launch<std::int64_t>(op, dst, srcs, nsrc, n, ranks, s);
    case DType::U8:
      return launch<std::uint8_t>(op, dst, srcs, nsrc, n, ranks, s);
  }
}

}  // namespace megazero::cuda
