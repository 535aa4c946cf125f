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
// Devices: the tensors' bytes reach the slots through the device's copies,
// ordered after `issued`, the mark the caller's thread took when it issued the
// collective, so a communication thread does not wait for compute queued after
// the collective (a stage-3 prefetch overlaps the layer it runs beside).
// Given the group's device, and where it can share memory with the other
// processes (Device::allocate_shared: CUDA IPC on a GPU; the isolated device
// emulates it), the group also keeps a second set of slots and result area in
// that device's memory — rank q's slot in rank q's block, the result area in
// rank 0's — and runs collectives of that device's tensors there, by the same
// rounds: device-to-device copies and a reduction kernel, on the
// communication thread's side stream, so ranks that share a GPU exchange at
// the GPU's memory speed. Elsewhere (host slots): on a GPU, DMA to and from
// the segment, registered with the driver on first use, and reductions on the
// host. MEGAZERO_SHM_DEVICE_SLOTS=0 keeps device tensors in host slots (rank
// 0's setting counts); a device that cannot share is noted and does the same.
// Reductions run in rank order, in fp32 (fp64 for fp64, integers exactly) and
// round once, with one formula on both paths: every rank gets the same bits,
// on any device. Avg divides the rounded sum once, as the MPI path does. Host
// tensors reduce on the communication thread alone (the rank's compute threads
// run beside it); device tensors in host slots with the host's cores shared by
// the group's ranks, at most OMP_NUM_THREADS.
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
  // Every rank's string, in rank order, on every rank.
  std::function<std::vector<std::string>(const std::string&)> all_gather;
};

class ShmCollectives {
 public:
  // Collective over the group. rank 0 sizes the slots (MEGAZERO_SHM_SLOT_BYTES,
  // else 32 MiB, less when /dev/shm has less room), creates the segment and
  // removes its name once every rank mapped it, so nothing outlives the job.
  // Every rank throws ConfigError alike when the segment cannot be made.
  // `device`: the device whose tensors may use device slots (null: none).
  ShmCollectives(int rank, int size, const std::string& group, const ShmBootstrap& boot,
                 std::shared_ptr<Device> device = nullptr);
  ~ShmCollectives();
  ShmCollectives(const ShmCollectives&) = delete;
  ShmCollectives& operator=(const ShmCollectives&) = delete;

  std::size_t slot_bytes() const { return slot_bytes_; }
  // Whether collectives of the group's device's tensors go through device slots.
  bool has_device_slots() const { return !device_slot_.empty(); }

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
  static constexpr const char* kDeviceSlotsEnv = "MEGAZERO_SHM_DEVICE_SLOTS";
  // Groups larger than this move device tensors through host slots.
  static constexpr int kMaxDeviceSlotRanks = 32;

 private:
  // Rank r's slot and the result area, in host memory or in device memory.
  char* slot(int r, bool dev) const {
    return dev ? device_slot_[static_cast<std::size_t>(r)] : base_ + static_cast<std::size_t>(r) * slot_bytes_;
  }
  char* result_area(bool dev) const { return slot(size_, dev); }
  // Whether t's collectives use the device slots.
  bool on_device(const Tensor& t) const { return has_device_slots() && &t.device() == device_.get(); }
  // Tensor bytes [offset, offset + bytes) to a slot and back, through the device.
  void put(const Tensor& t, std::size_t offset, char* slot_at, std::size_t bytes, const Device::Mark* issued, bool dev);
  void get(const Tensor& t, std::size_t offset, const char* slot_at, std::size_t bytes, const Device::Mark* issued,
           bool dev);
  // dst = srcs reduced (reduce_host's formula) by the host or, over device slots, by t's device.
  void reduce(const Tensor& t, ReduceOp op, char* dst, const std::vector<const void*>& srcs, std::size_t n,
              const Device::Mark* issued, bool dev);
  // Registers the segment with the tensor's device once (page-locked on a GPU).
  void pin_for(const Tensor& t);
  // Allocates this rank's device block and maps the peers' (collective; shm_device_slots.cpp).
  void attach_device_slots(const ShmBootstrap& boot);
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
  // Device slots: this rank's block, the peers' blocks mapped here, and every
  // rank's slot then the result area at this process's addresses.
  std::shared_ptr<Device> device_;
  std::shared_ptr<Device::SharedMemory> device_block_;
  std::vector<std::shared_ptr<Device::SharedMemory>> peer_blocks_;
  std::vector<char*> device_slot_;
};

// dst[i] = src[0][i] (op) src[1][i] ... in the order given, in fp32 (fp64 for
// fp64, exact integers), rounded once to t; Avg then divides by `ranks` as
// the MPI backend does (the rounded sum, one fp32 division, rounded once).
// dst may be one of the sources. `threads` OpenMP threads share it from 2^18
// elements, with the same bits. Exposed for tests.
void reduce_host(DType t, ReduceOp op, void* dst, const std::vector<const void*>& srcs, std::size_t n, int ranks,
                 int threads = 1);

// InternalError unless the reductions below can run: sources, Avg of a
// floating type, uint8 by Max only.
void check_slot_reduction(DType t, ReduceOp op, std::size_t sources);

// reduce_host's formula by `d`'s own kernels on device addresses, after
// `issued` and off its compute stream (a GPU: the slot reduction kernel on the
// calling thread's side stream; the isolated device: reduce_host at its
// kernels' addresses, `threads` threads); returns when done.
void reduce_on_device(Device& d, const Device::Mark& issued, DType t, ReduceOp op, void* dst,
                      const std::vector<const void*>& srcs, std::size_t n, int ranks, int threads);

}  // namespace megazero
