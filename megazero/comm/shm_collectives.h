// Collectives through one host's shared memory (--distributed-backend shm): the
// transport of MpiCommunicator for groups whose ranks share a machine, and the
// one that moves GPU tensors between ranks that share a GPU (NCCL refuses two
// ranks on one GPU) without MPI in the data path.
//
// Each group maps one POSIX shared-memory segment: a slot per rank and a result
// area, all `slot_bytes` long. A collective runs in rounds of at most a slot
// per rank; each round has two phases and the same two barriers:
//   A  each rank copies its part of the round into its own slot;
//   -- barrier --
//   B  each rank reads the slots it needs: a gather copies peers' slots to its
//      output, a reduction sums the column it owns over every slot in rank order
//      and writes it to its own part of the result area (or its output);
//   -- barrier --
//   C  each rank copies the result area to its tensor (all-reduce only).
// So a slot is written only in phase A, after every reader of the last round
// passed the second barrier, and the result area is written only in phase B,
// after every reader of it passed the first barrier: rounds and collectives
// follow one another with no further handshake.
//
// Devices: the tensors' bytes reach the slots through the device's copies (on a
// GPU: DMA to and from page-locked memory, the segment being registered with
// the driver on first use), ordered after `issued`, the mark the caller's thread
// took when it issued the collective, so a communication thread does not wait
// for compute queued after the collective (a stage-3 prefetch overlaps the
// layer it runs beside). Reductions run on the host, in rank order, in fp32 (fp64
// for fp64, integers exactly) and round once: every rank gets the same bits, on
// any device. Avg divides the rounded sum once, as the MPI path does. Host
// tensors reduce on the communication thread alone (the rank's compute threads
// run beside it); device tensors with the host's cores shared by the group's
// ranks, at most OMP_NUM_THREADS.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "megazero/comm/communicator.h"
#include "megazero/core/device.h"

namespace megazero {

// How the group's ranks agree during set-up: a string from rank 0 to all, and
// an all-ranks AND of a flag (both collective over the group).
struct ShmBootstrap {
  std::function<std::string(const std::string&)> broadcast_from_0;
  std::function<bool(bool)> all_ok;
  std::function<void()> barrier;
};

class ShmCollectives {
 public:
  // Collective over the group. rank 0 sizes the slots (MEGAZERO_SHM_SLOT_BYTES,
  // else 32 MiB, less when /dev/shm has less room), creates the segment and
  // removes its name once every rank mapped it, so nothing outlives the job.
  // Every rank throws ConfigError alike when the segment cannot be made.
  ShmCollectives(int rank, int size, const std::string& group, const ShmBootstrap& boot);
  ~ShmCollectives();
  ShmCollectives(const ShmCollectives&) = delete;
  ShmCollectives& operator=(const ShmCollectives&) = delete;

  std::size_t slot_bytes() const { return slot_bytes_; }

  // The collectives, on the communication thread; `issued` may be null (host tensors).
  void all_reduce(const Tensor& t, ReduceOp op, const Device::Mark* issued);
  void reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op, const std::vector<std::int64_t>& counts,
                      const Device::Mark* issued);
  void all_gather(const Tensor& input, const Tensor& output, const std::vector<std::int64_t>& counts,
                  const Device::Mark* issued);
  void broadcast(const Tensor& t, int root, const Device::Mark* issued);
  void reduce(const Tensor& t, int root, ReduceOp op, const Device::Mark* issued);

  // The default slot size, and the environment variable that overrides it.
  static constexpr std::size_t kDefaultSlotBytes = std::size_t{32} << 20;
  static constexpr const char* kSlotBytesEnv = "MEGAZERO_SHM_SLOT_BYTES";

 private:
  char* slot(int r) const { return base_ + static_cast<std::size_t>(r) * slot_bytes_; }
  char* result_area() const { return slot(size_); }
  // Tensor bytes [offset, offset + bytes) to host memory and back, through the device.
  void to_host(const Tensor& t, std::size_t offset, void* dst, std::size_t bytes, const Device::Mark* issued);
  void from_host(const Tensor& t, std::size_t offset, const void* src, std::size_t bytes, const Device::Mark* issued);
  // Registers the segment with the tensor's device once (page-locked on a GPU).
  void pin_for(const Tensor& t);
  // Threads for a reduction into t: one for host tensors (the rank's own
  // compute threads are busy beside it), the host's idle cores for a device's.
  int threads_for(const Tensor& t) const { return t.device().host_accessible() ? 1 : device_reduce_threads_; }

  int rank_, size_;
  std::string group_;
  std::function<void()> barrier_;
  std::size_t slot_bytes_ = 0, mapped_bytes_ = 0;
  char* base_ = nullptr;
  int device_reduce_threads_ = 1;
  bool pin_tried_ = false;
  std::shared_ptr<void> pinned_;  // released before the segment is unmapped
};

// dst[i] = src[0][i] (op) src[1][i] ... in the order given, in fp32 (fp64 for
// fp64, exact integers), rounded once to t; Avg then divides by `ranks` as
// the MPI backend does (the rounded sum, one fp32 division, rounded once).
// dst may be one of the sources. `threads` OpenMP threads share it from 2^18
// elements, with the same bits. Exposed for tests.
void reduce_host(DType t, ReduceOp op, void* dst, const std::vector<const void*>& srcs, std::size_t n, int ranks,
                 int threads = 1);

}  // namespace megazero
