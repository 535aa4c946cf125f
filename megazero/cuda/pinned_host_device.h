// Page-locked host memory as a device (CudaDevice::host_device): what Pa+cpu
// keeps its activation checkpoints in, so their copies to and from the GPU
// are DMA transfers queued on a stream (Device::copy_*_queued) rather than
// copies the host must wait for. cudaHostAlloc and cudaFreeHost are slow
// (page-locking; the free may synchronise the device), and the same sizes
// recur every step, so freed blocks are kept by size and reused; the memory
// tracker still counts only live bytes.
#pragma once

#include <map>
#include <mutex>

#include "megazero/core/device.h"

namespace megazero::cuda {

class PinnedHostDevice final : public CpuDevice {
 public:
  explicit PinnedHostDevice(int gpu);  // page-locked for (and mapped into) GPU `gpu`'s context
  ~PinnedHostDevice() override;
  std::string name() const override { return "cpu (page-locked for cuda:" + std::to_string(gpu_) + ")"; }

 protected:
  void* raw_allocate(std::size_t bytes) override;
  void raw_free(void* p, std::size_t bytes) override;

 private:
  int gpu_;
  std::mutex mu_;
  std::multimap<std::size_t, void*> cache_;  // freed blocks by size
};

}  // namespace megazero::cuda
