// The host half of kernel_common.cuh: launch sizing, launch and call checks,
// the dtype dispatch and the caller's scratch. Kept apart from the device
// helpers because the CPU emulation (tests/cuda_emulation) compiles the
// launchers against this very header, with its own stand-ins for the device
// half, so the sizes and checks it runs are the GPU build's.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "megazero/core/dtype.h"
#include "megazero/core/error.h"
#include "megazero/kernels/gpu_scratch.h"

namespace megazero::cuda::detail_k {

using i64 = std::int64_t;

constexpr unsigned kThreads = 256;
static_assert(kThreads == kernels::gpu_scratch::kThreads, "the scratch sizing assumes this block size");
// Enough blocks to fill an H100 (132 SMs) many times over; grid-stride loops
// cover the rest, so no grid dimension ever overflows.
constexpr i64 kMaxBlocks = 132 * 32;

inline unsigned blocks_for(i64 n, unsigned threads = kThreads) {
  return static_cast<unsigned>(std::max<i64>(1, std::min<i64>((n + threads - 1) / threads, kMaxBlocks)));
}

inline void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw InternalError(::megazero::detail::concat("CUDA kernel launch failed in ", what, ": ", cudaGetErrorName(err),
                                                   " (", cudaGetErrorString(err), ")"));
}

// A library call on the stream (CUB, cuBLAS's runtime helpers) that returns a cudaError_t.
inline void check_call(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw InternalError(::megazero::detail::concat("CUDA call failed in ", what, ": ", cudaGetErrorName(err), " (",
                                                   cudaGetErrorString(err), ")"));
}

// Set on a thread while a CudaDevice issues run_queued work beside its
// compute stream (the optimizer's update of a group while the next forward
// computes). resident_grid then sizes grids to one block per `threads` items,
// each block short, instead of one resident wave whose blocks live for the
// whole pass: a compute-stream kernel that starts meanwhile waits for at most
// one short block an SM.
inline thread_local bool t_beside_compute = false;

// The grid of a grid-stride kernel that streams memory: as many blocks as
// the current device holds at once (the SMs times the blocks of `threads`
// the kernel's registers let one SM keep resident), fewer when n elements
// need fewer. One resident wave, so no block waits for a later one and no
// wave runs part-empty at the end (kMaxBlocks over 5 resident blocks an SM
// would leave the last of 6.4 waves 40% full).
template <typename Kernel>
unsigned resident_grid(Kernel kernel, i64 n, unsigned threads, const char* what) {
  if (t_beside_compute) return static_cast<unsigned>(std::clamp<i64>((n + threads - 1) / threads, 1, i64{1} << 30));
  int device = 0, sms = 0, per_sm = 0;
  check_call(cudaGetDevice(&device), what);
  check_call(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), what);
  check_call(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, static_cast<int>(threads), 0), what);
  const i64 resident = std::max<i64>(1, static_cast<i64>(sms) * per_sm);
  return static_cast<unsigned>(std::max<i64>(1, std::min<i64>((n + threads - 1) / threads, resident)));
}

// Calls fn(S{}) with the device storage type of a float dtype.
template <typename Fn>
void with_storage(DType t, Fn&& fn) {
  switch (t) {
    case DType::F64:
      fn(double{});
      break;
    case DType::BF16:
      fn(__nv_bfloat16{});
      break;
    case DType::F16:
      fn(__half{});
      break;
    case DType::F32:
      fn(float{});
      break;
    default:
      throw InternalError(::megazero::detail::concat("CUDA kernel: unsupported dtype ", dtype_name(t)));
  }
}

// The caller's scratch (megazero/kernels/gpu_scratch.h: allocated through the
// device, so counted and planned) as T*, after checking it holds `need` bytes.
template <typename T>
T* scratch_as(kernels::GpuScratch ws, std::size_t need, const char* what) {
  if (need == 0) return static_cast<T*>(ws.data);
  if (ws.data == nullptr || ws.bytes < need)
    throw InternalError(::megazero::detail::concat(what, ": given ", ws.bytes, " bytes of scratch, needs ", need,
                                                   " (megazero/kernels/gpu_scratch.h sizes it)"));
  return static_cast<T*>(ws.data);
}

}  // namespace megazero::cuda::detail_k
