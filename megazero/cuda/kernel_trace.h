// The CUDA device's kernel trace (Device::start_kernel_trace): CUPTI's
// activity records of every kernel, memcpy and memset the process runs on its
// GPUs from trace_start to trace_stop, at the GPU's own clocks and with the
// work queued as in training (no replay, no serialisation). Process-wide, one
// trace at a time: a second trace_start before trace_stop throws.
#pragma once

#include "megazero/core/kernel_trace.h"

namespace megazero::cuda {

void trace_start();
// Flushes CUPTI's buffers first: call after the device's queue has drained.
KernelTrace trace_stop();

}  // namespace megazero::cuda
