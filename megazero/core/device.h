// The device abstraction. Algorithms (TP layers, ZeRO, checkpoints) allocate and
// copy through this interface and never ask which device they run on; kernels
// dispatch on Device::kind(). Four implementations:
//   CpuDevice  — host memory, 64-byte aligned (AVX-512 loads, oneDNN).
//   CudaDevice — cudaMalloc'd memory (megazero/cuda/, built with MEGAZERO_CUDA).
//   IsolatedCpuDevice — the CPU kernels over memory host code cannot touch
//                (core/isolated_device.h): a GPU's address-space rules on a
//                machine without one, so CPU-only CI catches host/device mix-ups.
//   MetaDevice — counts bytes but stores nothing: the memory planner runs the
//                real model/ZeRO code on it, so the plan cannot drift from the run.
//
// Host code reads or writes a tensor's elements only where host_accessible()
// (Tensor::host_data checks it); everywhere else it goes through the copies
// below. Kernels reach their operands at compute_address(), which is the
// address itself on every device but the isolated one.
#pragma once

#include <atomic>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <string>

#include "megazero/core/dtype.h"
#include "megazero/core/kernel_trace.h"
#include "megazero/core/memory_tracker.h"

namespace megazero {

enum class DeviceKind { CPU, CUDA, Meta };
std::string_view device_kind_name(DeviceKind k);

class Device;

// A block of device memory owned by megazero, accounted under one category.
class Buffer {
 public:
  // heap_id: the memory tracker's id of this allocation (its first-fit heap model).
  // from_arena: placed in the device's arena (nothing to free but the heap slot).
  Buffer(std::shared_ptr<Device> device, void* data, std::size_t bytes, MemoryCategory category, std::string label,
         std::uint64_t heap_id = 0, bool from_arena = false);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }  // nullptr on the meta device
  std::size_t bytes() const { return bytes_; }
  MemoryCategory category() const { return category_; }
  const std::string& label() const { return label_; }
  Device& device() const { return *device_; }
  const std::shared_ptr<Device>& device_ptr() const { return device_; }

 private:
  std::shared_ptr<Device> device_;
  void* data_;
  std::size_t bytes_;
  MemoryCategory category_;
  std::string label_;
  std::uint64_t heap_id_;
  bool from_arena_;
};

class Device : public std::enable_shared_from_this<Device> {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  virtual int index() const { return 0; }
  virtual std::string name() const;
  // False on the meta device: tensors there have shapes but no storage.
  bool has_storage() const { return kind() != DeviceKind::Meta; }
  // True where host code may dereference the device's addresses (the CPU
  // device only): everything else is reached through the copies below.
  virtual bool host_accessible() const { return false; }
  // The address at which this device's own kernels reach `p`, an address of
  // its memory (the same on every device but the isolated one). Only kernel
  // code may call it: host code that dereferences the result defeats the
  // isolation that catches host/device mix-ups.
  virtual void* compute_address(const void* p) const { return const_cast<void*>(p); }

  // Free and total bytes of the device where it has a fixed capacity (a GPU;
  // the isolated device with an emulated capacity); nullopt on host memory.
  struct MemoryInfo {
    std::int64_t free = 0, total = 0;
  };
  virtual std::optional<MemoryInfo> memory_info() { return std::nullopt; }
  // Bytes megazero holds from the device's allocator now: live allocations
  // outside the arena plus the arena itself (what an out-of-memory message
  // reports; unlike the tracker's live bytes it never counts a request that failed).
  std::int64_t held_bytes() const { return held_bytes_.load(); }

  // Allocates `bytes` (may be 0) and counts them under `category`.
  std::shared_ptr<Buffer> allocate(std::size_t bytes, MemoryCategory category, std::string label = {});

  MemoryTracker& memory() { return memory_; }
  const MemoryTracker& memory() const { return memory_; }

  // The paper's MD for all of the device's memory (--device-arena): reserves
  // `bytes` as one block, before the first allocation. From then on every
  // allocation is placed at the offset the memory tracker's first-fit model
  // gives it — the model the planner runs, so a plan's step_heap_peak is the
  // arena a run needs, to the byte — and no allocation reaches malloc or
  // cudaMalloc. One that does not fit is allocated as usual and counted as a miss.
  void reserve_arena(std::size_t bytes);
  struct ArenaStats {
    std::int64_t capacity = 0;  // bytes reserved (0: no arena)
    std::int64_t served = 0;    // allocations placed in the arena
    std::int64_t misses = 0;    // allocations that did not fit and went to the allocator
  };
  ArenaStats arena_stats() const;
  // Allocations that reached the allocator (malloc / cudaMallocAsync), the arena's own included.
  std::int64_t raw_allocations() const { return raw_allocations_.load(); }

  // Byte copies. `*_host` variants move data between this device and host memory.
  virtual void copy_to_host(void* host_dst, const void* src, std::size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* host_src, std::size_t bytes) = 0;
  virtual void copy_within(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void fill_zero(void* dst, std::size_t bytes) = 0;
  // A strided copy with a dtype conversion between two views of this device's
  // memory (Tensor::copy_from within one device): `shape`, strides in elements.
  // 16-bit results are rounded once, to nearest even.
  virtual void copy_strided(void* dst, DType dst_dtype, const std::int64_t* dst_strides, const void* src,
                            DType src_dtype, const std::int64_t* src_strides, const std::int64_t* shape, int dims);
  // Waits for all work queued on the device (no-op on CPU).
  virtual void synchronize() {}
  // How many times host code has waited for this device's queue to drain: a
  // copy_to_host / copy_from_host (blocking: on a GPU each waits for every
  // kernel queued before it) or a synchronize(). The *_after copies do not
  // count (they wait for a mark, on a side stream). Counted by devices that
  // queue work (CUDA) and by the isolated device, which emulates one, so a
  // CPU-only test sees the waits a GPU step would make; 0 on host memory.
  std::int64_t host_waits() const { return host_waits_.load(); }

  // Timing the device's own work. A mark is a point in the device's queue of
  // work: a CUDA event on the compute stream, or the host's clock on devices
  // that run work as it is issued (CPU, isolated, meta). The seconds between
  // two marks are the device's time from reaching one to reaching the other,
  // so on a GPU a phase's time is its kernels' (plus any gap the device waited
  // for the host), not the host's time to launch them. Reading waits until
  // `to` is reached: read after the step's synchronisation to wait for nothing.
  class Mark {
   public:
    virtual ~Mark() = default;
  };
  virtual std::shared_ptr<Mark> mark();
  virtual double seconds_between(const Mark& from, const Mark& to);

  // The device's kernel trace (core/kernel_trace.h; pretrain_gpt --profile):
  // each kernel, copy and fill the device runs from start to stop, with the
  // device's own timestamps. Both wait for the work queued before them, so
  // the window holds what was queued in between. One trace at a time in a
  // process. Only the CUDA device has one (CUPTI's activity records); the
  // others throw ConfigError.
  virtual bool has_kernel_trace() const { return false; }
  virtual void start_kernel_trace();
  virtual KernelTrace stop_kernel_trace();

  // Host copies ordered after `after`, a mark taken when the data's producer
  // was queued, instead of after everything queued since: a communication
  // thread staging a collective's buffers through the host (MPI with device
  // tensors) then does not wait for compute launched after the collective was
  // issued, so a prefetched gather overlaps it. Synchronous for the calling
  // thread; the caller guarantees nothing queued after `after` touches the
  // bytes until it returns (a collective's buffers until its wait). On a GPU:
  // a side stream waiting on the mark's event. Host devices: plain copies.
  virtual void copy_to_host_after(const Mark& after, void* host_dst, const void* src, std::size_t bytes);
  virtual void copy_from_host_after(const Mark& after, void* dst, const void* host_src, std::size_t bytes);

  // Transfers queued behind the device's work (Pa+cpu's checkpoint offload):
  // the copy runs once everything issued so far has run, on a side stream,
  // and the host goes on at once. The handle orders what must follow:
  // queue_after(t) makes device work issued later wait for it (a GPU-side
  // wait: the host does not block), wait(t) blocks the host until it is done
  // (before host memory it reads or writes is freed or read; a host wait,
  // counted, when the copy has not ended yet). Until then the
  // caller keeps both sides' memory alive and untouched. Host memory from
  // host_device() is page-locked on a GPU, which an asynchronous copy needs.
  // Host devices copy at once; the isolated device defers each copy to the
  // first queue_after/wait, so a missing one shows as stale data.
  class Transfer {
   public:
    virtual ~Transfer() = default;
  };
  virtual std::shared_ptr<Transfer> copy_to_host_queued(void* host_dst, const void* src, std::size_t bytes);
  virtual std::shared_ptr<Transfer> copy_from_host_queued(void* dst, const void* host_src, std::size_t bytes);
  virtual void queue_after(const Transfer& t);
  virtual void wait(const Transfer& t);
  // Device work beside the compute stream (the optimizer's update of one
  // parameter group while the next forward computes another): `work` launches
  // kernels through kernels:: entry points, which run after everything issued
  // so far, off the compute stream; the handle orders what must follow, as a
  // queued transfer's does (queue_after before device work that reads or
  // writes the same memory, wait before the host does). `work` only launches:
  // no allocation (the allocator orders frees on the compute stream) and no
  // host copy. Host devices run it at once; the isolated device defers it to
  // the first queue_after/wait on its handle, so a missing one shows as stale
  // data in CI; on a GPU it runs on a side stream, with each grid-stride
  // kernel cut into short blocks so the compute stream's kernels are not held
  // back by long ones.
  virtual std::shared_ptr<Transfer> run_queued(const std::function<void()>& work);
  // A host device for memory this device exchanges with the host (its own
  // counters): page-locked, with freed blocks kept for reuse, on a GPU; plain
  // host memory elsewhere.
  virtual std::shared_ptr<Device> host_device();

  // Host memory to stage this device's data through (a checkpoint's shards):
  // page-locked on a GPU, so copies into it are DMA transfers. Not device
  // memory: neither the tracker nor the arena sees it.
  virtual std::shared_ptr<void> allocate_host_staging(std::size_t bytes);
  // Host memory allocated elsewhere (a shared-memory segment the shm
  // collectives copy through) made page-locked for this device's copies until
  // the handle is dropped: registered with the driver on a GPU, so copies to
  // and from it are DMA transfers. nullptr where nothing needs doing (host
  // devices) or the registration failed (then copies still work, slower).
  virtual std::shared_ptr<void> pin_host_memory(void* p, std::size_t bytes);

  // A device-to-device copy ordered after `after` as the *_after host copies
  // are (a communication thread's copy does not wait for compute queued since
  // the mark); synchronous for the calling thread. Both addresses may be
  // another process's memory mapped with open_shared.
  virtual void copy_within_after(const Mark& after, void* dst, const void* src, std::size_t bytes);

  // Device memory other processes of this machine map too: the shm
  // transport's device slots (comm/shm_collectives.h), through which ranks
  // that share a GPU exchange tensors at the device's own speed instead of
  // through host memory. A CUDA IPC allocation on a GPU (plain cudaMalloc:
  // the stream-ordered pool's memory cannot be exported); on the isolated
  // device a shared-memory object mapped as its own allocations are, so the
  // transport's device path runs, isolation and all, on a machine without a
  // GPU. Outside the memory tracker and the arena, as NCCL's buffers are.
  class SharedMemory {
   public:
    virtual ~SharedMemory() = default;
    void* data() const { return data_; }  // this process's (device) address of it
    std::size_t bytes() const { return bytes_; }
    // What open_shared takes in another process (empty for an opened block).
    const std::string& handle() const { return handle_; }
    // Called on the allocating process once every peer has opened the block:
    // the isolated device removes the name it was published under, so a job
    // that dies leaves nothing behind.
    virtual void opened_by_all() {}

   protected:
    void* data_ = nullptr;
    std::size_t bytes_ = 0;
    std::string handle_;
  };
  // nullptr where the device has nothing to share this way (host memory, whose
  // tensors the shm segment holds directly; the meta device).
  virtual std::shared_ptr<SharedMemory> allocate_shared(std::size_t bytes);
  // Maps another process's allocate_shared block of `bytes` bytes into this
  // one; ConfigError saying why when it cannot (another GPU without peer
  // access, a handle of another kind of device).
  virtual std::shared_ptr<SharedMemory> open_shared(const std::string& handle, std::size_t bytes);

 protected:
  friend class Buffer;
  void count_host_wait() { host_waits_.fetch_add(1, std::memory_order_relaxed); }
  // Calls a run_queued `work` with its contract enforced: an allocation on
  // this device (and, where a device checks running_queued_work(), a host
  // copy) inside it throws InternalError, on every device, so the CPU tests
  // catch what would race on a GPU.
  void run_as_queued(const std::function<void()>& work);
  bool running_queued_work() const;
  virtual void* raw_allocate(std::size_t bytes) = 0;
  virtual void raw_free(void* p, std::size_t bytes) = 0;
  // Frees the arena: every concrete device's destructor calls it (raw_free is
  // gone by the time ~Device runs). Buffers keep their device alive, so none is left.
  void release_arena();
  // The out-of-memory message every device gives (a ConfigError's text): what
  // was asked, what is free, what megazero holds, and the flags that help.
  std::string out_of_memory_message(std::size_t requested, std::optional<MemoryInfo> info,
                                    const std::string& extra = {}) const;

 private:
  MemoryTracker memory_;
  char* arena_ = nullptr;
  std::int64_t arena_capacity_ = 0;
  std::atomic<std::int64_t> arena_served_{0}, arena_misses_{0}, raw_allocations_{0}, held_bytes_{0};
  std::atomic<std::int64_t> host_waits_{0};
};

// Host memory. Not final: a GPU's page-locked host memory is a CpuDevice with
// another allocator (megazero/cuda/pinned_host_device.h).
class CpuDevice : public Device {
 public:
  static constexpr std::size_t kAlignment = 64;
  CpuDevice();
  ~CpuDevice() override { release_arena(); }
  DeviceKind kind() const override { return DeviceKind::CPU; }
  bool host_accessible() const override { return true; }
  // The host's available and total memory (/proc/meminfo's MemAvailable and
  // MemTotal), shared by every process on the host.
  std::optional<MemoryInfo> memory_info() override;
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override;
  void copy_from_host(void* dst, const void* src, std::size_t bytes) override;
  void copy_within(void* dst, const void* src, std::size_t bytes) override;
  void fill_zero(void* dst, std::size_t bytes) override;

 protected:
  void* raw_allocate(std::size_t bytes) override;
  void raw_free(void* p, std::size_t bytes) override;
};

// What the kernels would have computed on the meta device: the time model of
// the planner (megazero/plan/time_model.h) prices each GEMM by its shape.
struct GemmShape {
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  DType dtype = DType::F32;
  auto operator<=>(const GemmShape&) const = default;
  double flops() const {
    return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) * static_cast<double>(batch);
  }
};
class ComputeLog {
 public:
  void add_gemm(const GemmShape& g);
  const std::map<GemmShape, std::int64_t>& gemms() const { return gemms_; }  // shape -> calls
  void clear() { gemms_.clear(); }

 private:
  mutable std::mutex mu_;
  std::map<GemmShape, std::int64_t> gemms_;
};

class MetaDevice final : public Device {
 public:
  // `kernels`: whose kernels the dry run stands in for, as far as their own
  // allocations go. CUDA (the default): cuBLAS keeps its workspace outside the
  // device's counters, so a GEMM allocates nothing. CPU: a GEMM allocates,
  // through the same code, what the CPU backend allocates through the device
  // (oneDNN's scratchpad; fp32 copies of 16-bit operands where this CPU has no
  // 16-bit matmul), so a plan of a run on this machine's CPU counts it too.
  explicit MetaDevice(DeviceKind kernels = DeviceKind::CUDA);
  DeviceKind kind() const override { return DeviceKind::Meta; }
  DeviceKind kernels() const { return kernels_; }
  ComputeLog& compute_log() { return log_; }
  // A dry run's host memory (ZeRO-Offload's state, Pa+cpu's checkpoints): a
  // meta device too, standing in for the CPU's kernels; one per device, so its
  // counters add up.
  std::shared_ptr<Device> host_device() override;
  void copy_to_host(void*, const void*, std::size_t) override;
  void copy_from_host(void*, const void*, std::size_t) override;
  void copy_within(void*, const void*, std::size_t) override {}
  void fill_zero(void*, std::size_t) override {}

 protected:
  void* raw_allocate(std::size_t) override { return nullptr; }
  void raw_free(void*, std::size_t) override {}

 private:
  DeviceKind kernels_;
  ComputeLog log_;
  std::mutex host_mu_;
  std::shared_ptr<Device> host_;
};

// Creates a device of the given kind. CUDA in a build without MEGAZERO_CUDA, or
// on a machine without a GPU, is a ConfigError that says so.
std::shared_ptr<Device> make_device(DeviceKind kind, int index = 0);
// A meta device standing in for the kernels of `kernels` (CPU or CUDA; see MetaDevice).
std::shared_ptr<Device> make_meta_device(DeviceKind kernels);
// Parses "cpu", "cpu-isolated", "cuda", "cuda:1", "meta" (for --device); ConfigError otherwise.
std::shared_ptr<Device> make_device(const std::string& spec);

// GPUs this process can use: 0 in a build without the CUDA backend or when
// the driver reports none.
int cuda_visible_devices();

// The CUDA backend (megazero/cuda, a library above this one) registers how to
// make its devices when it is linked in; core never names it. Without one,
// make_device(CUDA) says the build has no CUDA backend.
struct GpuBackend {
  std::shared_ptr<Device> (*make)(int index) = nullptr;
  int (*count)() = nullptr;
};
void register_gpu_backend(const GpuBackend& backend);

}  // namespace megazero
