// What every tensor-parallel layer needs: its TP communicator, where to
// allocate activations, and the working dtype. Layers know nothing of ZeRO.
#pragma once

#include <memory>

#include "megazero/comm/communicator.h"

namespace megazero::layers {

struct TpContext {
  Communicator* tp = nullptr;
  std::shared_ptr<Device> device;
  DType dtype = DType::F32;  // parameters and activations (fp32, or fp64 for reference runs)

  int rank() const { return tp->rank(); }
  int size() const { return tp->size(); }
  Tensor activation(const Shape& shape) const {
    return Tensor::empty(device, shape, dtype, MemoryCategory::Activations);
  }
};

}  // namespace megazero::layers
