// The CUDA device: cudaMalloc'd memory plus one compute stream on which every
// megazero kernel of this device runs (GEMM, conversions, copies). Keeping one
// in-order stream per device gives the same "each call sees the previous one's
// result" semantics as the CPU device without a device-wide synchronisation;
// the NCCL backend orders its own stream against this one with events.
//
// Copies to and from the host return only when the copy is complete, as on
// the CPU; copies within the device are queued on the compute stream like a
// kernel (later work and read-backs see them). Create one CudaDevice per
// process and GPU and share it: operands of one kernel must live on the same object.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "megazero/core/device.h"
#include "megazero/core/error.h"

namespace megazero {

namespace cuda {
// Throws InternalError naming the failed call, cudaGetErrorString and file:line.
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);
}  // namespace cuda

// Any CUDA runtime call whose failure is a megazero bug (or a dead GPU).
#define MZ_CUDA_CHECK(expr)                                                                                       \
  do {                                                                                                            \
    const cudaError_t mz_cuda_err_ = (expr);                                                                      \
    if (mz_cuda_err_ != cudaSuccess) ::megazero::cuda::throw_cuda_error(mz_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// Makes `index` the calling thread's current GPU for the guard's lifetime and
// restores the previous one afterwards. The current device is per thread, and
// communication or data-loader threads may call into a device, so every entry
// point that launches work sets it rather than trusting the caller.
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int index);
  ~CudaDeviceGuard();
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = -1;  // -1: nothing to restore
};

class CudaDevice final : public Device {
 public:
  // Creates the compute stream on GPU `index` (validated by make_cuda_device).
  explicit CudaDevice(int index);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  DeviceKind kind() const override { return DeviceKind::CUDA; }
  int index() const override { return index_; }
  // The stream this thread's kernels go to: the compute stream
  // (cudaStreamNonBlocking: never serialised with the legacy default stream
  // that third-party code may use), or the side stream while this thread runs
  // run_queued work.
  cudaStream_t stream() const { return t_side_of_ == this ? side_stream_ : stream_; }

  void copy_to_host(void* host_dst, const void* src, std::size_t bytes) override;
  void copy_from_host(void* dst, const void* host_src, std::size_t bytes) override;
  void copy_within(void* dst, const void* src, std::size_t bytes) override;
  // Queued on the stream; later work on the stream (and host copies) see it.
  void fill_zero(void* dst, std::size_t bytes) override;
  // Queued on the compute stream (megazero/cuda strided_copy).
  void copy_strided(void* dst, DType dst_dtype, const std::int64_t* dst_strides, const void* src, DType src_dtype,
                    const std::int64_t* src_strides, const std::int64_t* shape, int dims) override;
  // Waits for the compute stream (not for communicators' streams: wait on
  // their Work for those).
  void synchronize() override;
  // A CUDA event recorded on the compute stream; seconds_between waits for
  // `to` (cudaEventSynchronize) and reads cudaEventElapsedTime.
  std::shared_ptr<Mark> mark() override;
  double seconds_between(const Mark& from, const Mark& to) override;
  // CUPTI's activity records (cuda/kernel_trace.h), the queue drained first.
  bool has_kernel_trace() const override { return true; }
  void start_kernel_trace() override;
  KernelTrace stop_kernel_trace() override;
  // On the copy stream, after the mark's event; waits for the copy alone.
  void copy_to_host_after(const Mark& after, void* host_dst, const void* src, std::size_t bytes) override;
  void copy_from_host_after(const Mark& after, void* dst, const void* host_src, std::size_t bytes) override;
  // Device to device on the calling thread's copy stream, after the mark's
  // event; waits for the copy alone.
  void copy_within_after(const Mark& after, void* dst, const void* src, std::size_t bytes) override;
  // Runs `launch` (kernels queued on the stream it is given) on the calling
  // thread's copy stream after the mark's event and waits for what it queued
  // alone: a communication thread's device work (the shm transport's slot
  // reductions) ordered as its copies are, off the compute stream.
  void run_after(const Mark& after, const std::function<void(cudaStream_t)>& launch);
  // CUDA IPC: cudaMalloc'd memory and its cudaIpcGetMemHandle, opened by
  // another process with cudaIpcOpenMemHandle (peer access enabled when its
  // GPU is another one; refused, with the driver's reason, without it).
  std::shared_ptr<SharedMemory> allocate_shared(std::size_t bytes) override;
  std::shared_ptr<SharedMemory> open_shared(const std::string& handle, std::size_t bytes) override;
  // cudaMemGetInfo: free bytes as the driver sees them (the memory pool's
  // reserve counts as used).
  std::optional<MemoryInfo> memory_info() override;
  // Page-locked (cudaHostAlloc), so device-to-host copies into it are DMA.
  std::shared_ptr<void> allocate_host_staging(std::size_t bytes) override;
  // cudaHostRegister (portable: every context of the process); a failure is
  // noted on stderr and the copies go on through the driver's staging.
  std::shared_ptr<void> pin_host_memory(void* p, std::size_t bytes) override;
  // On the offload stream, after an event recorded now on the compute stream;
  // the handle is an event recorded after the copy. queue_after: the compute
  // stream waits for it (cudaStreamWaitEvent); wait: cudaEventSynchronize unless
  // cudaEventQuery says it ended (counted as a host wait when it blocks).
  std::shared_ptr<Transfer> copy_to_host_queued(void* host_dst, const void* src, std::size_t bytes) override;
  std::shared_ptr<Transfer> copy_from_host_queued(void* dst, const void* host_src, std::size_t bytes) override;
  void queue_after(const Transfer& t) override;
  void wait(const Transfer& t) override;
  // On the side stream, after an event recorded now on the compute stream;
  // stream() answers the side stream meanwhile, and grid-stride kernels take
  // one short block per kThreads items (launch_common.h's t_beside_compute).
  // The handle is an event recorded after the work, as a queued copy's.
  std::shared_ptr<Transfer> run_queued(const std::function<void()>& work) override;
  // Page-locked host memory (PinnedHostDevice), one per CudaDevice: Pa+cpu's
  // checkpoints and the MPI backend's staging of device tensors.
  std::shared_ptr<Device> host_device() override;

 protected:
  void* raw_allocate(std::size_t bytes) override;
  void raw_free(void* p, std::size_t bytes) override;

 private:
  void copy_sync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind);  // the host waits (counted)
  void copy_on_stream(void* dst, const void* src, std::size_t bytes);                  // device to device, no wait
  void copy_after(const Mark& after, void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind);
  std::shared_ptr<Transfer> queue_copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind);
  void after_compute(cudaStream_t s);  // s waits for what the compute stream holds now

  int index_;
  cudaStream_t stream_ = nullptr;
  // Host copies ordered by an event rather than by the compute stream
  // (copy_*_after): one stream per calling thread (each communicator's
  // worker), so one thread's copy never waits for the later mark another
  // thread's copy waits for on a shared in-order stream.
  cudaStream_t thread_copy_stream();
  std::mutex copy_streams_mu_;
  std::map<std::thread::id, cudaStream_t> copy_streams_;
  // The queued transfers' own stream, so a communication thread's staged copy
  // never waits behind an offload that waits for compute.
  cudaStream_t offload_stream_ = nullptr;
  // run_queued's stream, and the device whose run_queued work this thread is issuing.
  cudaStream_t side_stream_ = nullptr;
  static inline thread_local const CudaDevice* t_side_of_ = nullptr;
  std::mutex host_mu_;
  std::shared_ptr<Device> host_;  // made on first use
};

// The CudaDevice behind `d`; InternalError if `d` is another kind of device.
CudaDevice& as_cuda_device(Device& d);

// Number of visible GPUs; 0 when the driver or runtime reports an error.
int cuda_device_count();

// A new CudaDevice for GPU `index`, made the calling thread's current device.
// ConfigError (naming the visible count and the way out) when no GPU is
// visible or `index` is out of range. Also declared in core/device.cpp.
std::shared_ptr<Device> make_cuda_device(int index);
// Tells core's make_device how to make CUDA devices (core never names this
// library); the entry points call it through register_device_backends().
void register_cuda_backend();

}  // namespace megazero
