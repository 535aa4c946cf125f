// Scratch allocation for the CUDA kernels (gpu_scratch.h; the sizes are inline there).
#include "megazero/kernels/gpu_scratch.h"

#include <algorithm>

#include "megazero/core/device.h"
#include "megazero/core/error.h"

namespace megazero::kernels {

bool runs_cuda_kernels(const Device& d) {
  if (d.kind() == DeviceKind::CUDA) return true;
  return d.kind() == DeviceKind::Meta && static_cast<const MetaDevice&>(d).kernels() == DeviceKind::CUDA;
}

Tensor allocate_gpu_scratch(const Tensor& like, std::size_t bytes, const char* label) {
  if (bytes == 0 || !runs_cuda_kernels(like.device())) return Tensor();
  return Tensor::empty(like.device_ptr(), {static_cast<std::int64_t>(bytes)}, DType::U8, MemoryCategory::Workspace,
                       label);
}

}  // namespace megazero::kernels
