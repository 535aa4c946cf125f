// The isolated CPU device (--device cpu-isolated): a GPU's address-space rules
// with the CPU kernels, so a machine without a GPU catches the bugs only a GPU
// used to show — host code reading or writing device memory (a checkpoint
// writer hashing GPU tensors through host pointers crashed the first GPU save).
//
// Every allocation is one shared-memory object mapped twice: the address a
// tensor carries is mapped PROT_NONE, so host code that dereferences it faults
// at once; a second, read-write mapping is where this device's kernels work
// (Device::compute_address) and what its copies to and from host memory use.
// Host code must therefore do what it must do on a GPU: copy through the
// device (Tensor::copy_from, Device::copy_to_host / copy_from_host). A fault
// on such an address prints what was touched and a stack before the process
// dies with SIGSEGV; Tensor::host_data refuses these tensors with an
// InternalError before that.
//
// MEGAZERO_ISOLATED_DEVICE_MIB=N gives the device a capacity of N MiB, as a
// GPU has one: allocations beyond it fail with the GPU's out-of-memory error
// and memory_info() reports free and total bytes (the memory pre-flight and
// the out-of-memory message are tested on it).
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include "megazero/core/device.h"

namespace megazero {

class IsolatedCpuDevice final : public Device {
 public:
  // capacity_bytes 0: no limit (memory_info() is then nullopt, as on the host).
  explicit IsolatedCpuDevice(std::int64_t capacity_bytes = 0);
  ~IsolatedCpuDevice() override;
  DeviceKind kind() const override { return DeviceKind::CPU; }  // its kernels are the CPU's
  std::string name() const override { return "cpu-isolated"; }
  bool host_accessible() const override { return false; }
  void* compute_address(const void* p) const override;
  std::optional<MemoryInfo> memory_info() override;

  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override;
  void copy_from_host(void* dst, const void* host_src, std::size_t bytes) override;
  void copy_to_host_after(const Mark& after, void* host_dst, const void* src, std::size_t bytes) override;
  void copy_from_host_after(const Mark& after, void* dst, const void* host_src, std::size_t bytes) override;
  void synchronize() override;
  // Deferred until the first queue_after/wait on the handle (a GPU's copy
  // runs some time after it is queued): a forgotten one leaves the
  // destination stale, and a source freed before it fails the copy.
  std::shared_ptr<Transfer> copy_to_host_queued(void* host_dst, const void* src, std::size_t bytes) override;
  std::shared_ptr<Transfer> copy_from_host_queued(void* dst, const void* host_src, std::size_t bytes) override;
  void queue_after(const Transfer& t) override;
  void wait(const Transfer& t) override;
  // Deferred likewise: the work runs at the first queue_after/wait on the handle.
  std::shared_ptr<Transfer> run_queued(const std::function<void()>& work) override;
  void copy_within(void* dst, const void* src, std::size_t bytes) override;
  void copy_within_after(const Mark& after, void* dst, const void* src, std::size_t bytes) override;
  void fill_zero(void* dst, std::size_t bytes) override;
  // A named POSIX shared-memory object mapped twice as every allocation here
  // is (PROT_NONE where host code would touch it, a read-write twin for the
  // kernels); the handle is its name, which opened_by_all() removes. A
  // peer's block is registered as this device's memory: copies and kernels
  // reach it, host code faults on it, as with CUDA IPC memory on a GPU.
  std::shared_ptr<SharedMemory> allocate_shared(std::size_t bytes) override;
  std::shared_ptr<SharedMemory> open_shared(const std::string& handle, std::size_t bytes) override;

 protected:
  void* raw_allocate(std::size_t bytes) override;
  void raw_free(void* p, std::size_t bytes) override;

 private:
  void unmap(void* p);

  std::int64_t capacity_;
  // Freed mappings kept for reuse by size, as a GPU's caching pool keeps
  // freed blocks (a fresh mapping per activation doubled a step's time); still
  // PROT_NONE at the device address, so a host touch of freed memory faults too.
  std::mutex cache_mu_;
  std::multimap<std::size_t, void*> cache_;  // mapped bytes -> device address
  std::size_t cached_bytes_ = 0;
};

// A new isolated device; its capacity from $MEGAZERO_ISOLATED_DEVICE_MIB (none if unset).
std::shared_ptr<Device> make_isolated_cpu_device();

}  // namespace megazero
