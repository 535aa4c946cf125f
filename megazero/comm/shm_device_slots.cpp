// The shm transport's device slots (shm_collectives.h): set-up, and the
// reduction that runs on the device.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "megazero/comm/shm_collectives.h"
#include "megazero/core/error.h"

#ifdef MEGAZERO_WITH_CUDA
#include "megazero/cuda/cuda_device.h"
#include "megazero/cuda/slot_reduce.h"
#endif

namespace megazero {

#ifdef MEGAZERO_WITH_CUDA
static_assert(ShmCollectives::kMaxDeviceSlotRanks == cuda::kMaxSlotReduceSources,
              "a group's device slots are one reduction's sources");
#endif

void ShmCollectives::attach_device_slots(const ShmBootstrap& boot) {
  // Rank 0's setting, so the group's ranks agree.
  std::string use = "1";
  if (rank_ == 0) {
    const char* env = std::getenv(kDeviceSlotsEnv);
    if (env && *env) use = env;
    if (use != "0" && use != "1")
      use = detail::concat("!", kDeviceSlotsEnv, "='", use,
                           "' is neither 0 (device tensors through host memory) nor 1 (through device memory, the "
                           "default where the device can share it); unset it for the default");
  }
  use = boot.broadcast_from_0(use);
  if (use[0] == '!') throw ConfigError(use.substr(1));
  if (use == "0") return;
  if (size_ > kMaxDeviceSlotRanks) {
    if (rank_ == 0)
      std::fprintf(stderr,
                   "megazero: note: --distributed-backend shm: group '%s' has %d ranks, more than the %d whose "
                   "device slots one reduction reads; it moves device tensors through host memory\n",
                   group_.c_str(), size_, kMaxDeviceSlotRanks);
    return;
  }

  // Rank q's block holds its slot; rank 0's holds the result area after it.
  auto block_bytes = [&](int q) { return slot_bytes_ * (q == 0 ? 2 : 1); };
  std::string why;
  std::shared_ptr<Device::SharedMemory> mine;
  try {
    mine = device_->allocate_shared(block_bytes(rank_));
  } catch (const ConfigError& e) {
    why = e.what();
  }
  // A device that shares nothing (host memory: its tensors use the segment as
  // they are) says so alike on every rank, and quietly.
  const bool all_allocated = boot.all_ok(mine != nullptr);
  std::vector<std::shared_ptr<Device::SharedMemory>> peers(static_cast<std::size_t>(size_));
  std::vector<char*> at(static_cast<std::size_t>(size_) + 1, nullptr);
  if (all_allocated) {
    const std::vector<std::string> handles = boot.all_gather(mine->handle());
    try {
      for (int q = 0; q < size_; ++q) {
        const auto i = static_cast<std::size_t>(q);
        if (q != rank_) peers[i] = device_->open_shared(handles[i], block_bytes(q));
        at[i] = static_cast<char*>(q == rank_ ? mine->data() : peers[i]->data());
      }
    } catch (const ConfigError& e) {
      why = e.what();
    }
    // Once this returns every rank has opened every block (or given up).
    if (boot.all_ok(why.empty())) {
      mine->opened_by_all();
      at[static_cast<std::size_t>(size_)] = at[0] + slot_bytes_;
      device_block_ = std::move(mine);
      peer_blocks_ = std::move(peers);
      device_slot_ = std::move(at);
      return;
    }
  }
  if (!why.empty())
    std::fprintf(stderr,
                 "megazero: note: --distributed-backend shm: group '%s' moves %s tensors through host memory (rank "
                 "%d: %s)\n",
                 group_.c_str(), device_->name().c_str(), rank_, why.c_str());
}

void reduce_on_device(Device& d, const Device::Mark& issued, DType t, ReduceOp op, void* dst,
                      const std::vector<const void*>& srcs, std::size_t n, int ranks, int threads) {
  check_slot_reduction(t, op, srcs.size());
  if (n == 0) return;
#ifdef MEGAZERO_WITH_CUDA
  if (d.kind() == DeviceKind::CUDA) {
    const auto o = op == ReduceOp::Max   ? cuda::SlotReduce::Max
                   : op == ReduceOp::Avg ? cuda::SlotReduce::Avg
                                         : cuda::SlotReduce::Sum;
    as_cuda_device(d).run_after(issued, [&](cudaStream_t s) {
      cuda::reduce_slots(t, o, dst, srcs.data(), static_cast<int>(srcs.size()), static_cast<std::int64_t>(n), ranks, s);
    });
    return;
  }
#endif
  // A device whose kernels are the CPU's (the isolated device): the host
  // formula at its kernels' addresses, run now (its work runs as issued).
  (void)issued;
  MZ_CHECK(d.kind() == DeviceKind::CPU && !d.host_accessible(), "reduce_on_device on ", d.name());
  std::vector<const void*> at(srcs.size());
  for (std::size_t q = 0; q < srcs.size(); ++q) at[q] = d.compute_address(srcs[q]);
  reduce_host(t, op, d.compute_address(dst), at, n, ranks, threads);
}

}  // namespace megazero
