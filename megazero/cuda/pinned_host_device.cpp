#include "megazero/cuda/pinned_host_device.h"

#include <cuda_runtime_api.h>

#include "megazero/core/error.h"
#include "megazero/cuda/cuda_device.h"

namespace megazero::cuda {

PinnedHostDevice::PinnedHostDevice(int gpu) : gpu_(gpu) {}

PinnedHostDevice::~PinnedHostDevice() {
  release_arena();  // through this class's raw_free, while it still exists
  for (auto& [bytes, p] : cache_) (void)cudaFreeHost(p);
}

void* PinnedHostDevice::raw_allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(bytes);
    if (it != cache_.end()) {
      void* p = it->second;
      cache_.erase(it);
      return p;
    }
  }
  CudaDeviceGuard guard(gpu_);
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw ConfigError(out_of_memory_message(
        bytes, std::nullopt,
        detail::concat("cudaHostAlloc: ", cudaGetErrorString(err), " (page-locked memory; check ulimit -l)")));
  }
  return p;
}

void PinnedHostDevice::raw_free(void* p, std::size_t bytes) {
  if (p == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  cache_.emplace(bytes, p);
}

}  // namespace megazero::cuda
