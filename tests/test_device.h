// The device the device-generic suites (TP equivalence, ZeRO) run on:
// $MEGAZERO_TEST_DEVICE ("cpu" by default; "cuda" on a GPU machine, where
// several ranks share one GPU over the MPI backend). The same tests then prove
// the same properties of the CUDA kernels.
#pragma once

#include <cstdlib>
#include <string>

#include "megazero/core/tensor.h"

namespace megazero::test_support {

inline std::shared_ptr<Device> test_device() {
  const char* spec = std::getenv("MEGAZERO_TEST_DEVICE");
  return make_device(std::string(spec && *spec ? spec : "cpu"));
}

// An int64 tensor on `device` holding values[i] = fn(i) for i < n.
template <typename Fn>
Tensor int64_tensor(const std::shared_ptr<Device>& device, std::int64_t n, Fn fn) {
  Tensor host = Tensor::empty(make_device(DeviceKind::CPU), {n}, DType::I64, MemoryCategory::Activations);
  for (std::int64_t i = 0; i < n; ++i) host.host_data<std::int64_t>()[i] = fn(i);
  if (device->host_accessible()) return host;
  Tensor t = Tensor::empty(device, {n}, DType::I64, MemoryCategory::Activations);
  t.copy_from(host);
  return t;
}

}  // namespace megazero::test_support
