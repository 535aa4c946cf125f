#include "megazero/trainer/peak_flops.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "megazero/core/tensor.h"
#include "megazero/kernels/cpu_threads.h"
#include "megazero/kernels/gemm.h"

namespace megazero::train {

PeakFlops gpu_default_peak() { return {989.0, "an H100 SXM's dense bf16 peak; set --peak-tflops for another GPU"}; }

PeakFlops measure_cpu_peak(DType dtype, int size, int reps) {
  auto cpu = make_device(DeviceKind::CPU);
  const std::int64_t n = size;
  Tensor a = Tensor::zeros(cpu, {n, n}, dtype, MemoryCategory::Workspace, "peak probe a");
  Tensor b = Tensor::zeros(cpu, {n, n}, dtype, MemoryCategory::Workspace, "peak probe b");
  Tensor c = Tensor::zeros(cpu, {n, n}, dtype, MemoryCategory::Workspace, "peak probe c");
  a.copy_from_doubles(std::vector<double>(static_cast<std::size_t>(n * n), 0.5));
  b.copy_from_doubles(std::vector<double>(static_cast<std::size_t>(n * n), 0.25));
  gemm(a, false, b, false, c);  // warm-up: oneDNN builds its primitive, pages are touched
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    gemm(a, false, b, false, c);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * static_cast<double>(n * n * n) / std::max(s, 1e-9));
  }
  char source[160];
  std::snprintf(source, sizeof source, "measured: the best of %d %d^3 %s GEMMs on a rank's %d math thread%s", reps,
                size, std::string(dtype_name(dtype)).c_str(), cpu_math_threads(), cpu_math_threads() == 1 ? "" : "s");
  return {best / 1e12, source};
}

}  // namespace megazero::train
