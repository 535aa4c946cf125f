// What MFU is measured against when --peak-tflops is not given. A GPU: the
// H100 SXM's dense 16-bit datasheet peak. The CPU: the best rate this rank's
// own math threads reach on a square GEMM of the run's dtype, measured at
// start-up, because CPUs differ too much for one constant (AVX-512 BF16
// doubles the 16-bit rate over fp32; the core count and clocks vary between
// the machines CI lands on), and a constant below the machine's real peak
// reports an MFU above 100%.
#pragma once

#include <string>

#include "megazero/core/dtype.h"

namespace megazero::train {

struct PeakFlops {
  double tflops = 0;   // per rank
  std::string source;  // for the log: where the number comes from
};

// The GPU's default (989 TFLOP/s).
PeakFlops gpu_default_peak();
// The best of `reps` timed size^3 GEMMs in `dtype` (after one warm-up) on a
// CPU device of its own (the run's memory counters see nothing), with the
// math threads as set now.
PeakFlops measure_cpu_peak(DType dtype, int size = 1024, int reps = 3);

}  // namespace megazero::train
