#include "megazero/cuda/cuda_device.h"

#include "megazero/cuda/launch_common.h"

#include "megazero/cuda/kernel_trace.h"
#include "megazero/cuda/pinned_host_device.h"
#include "megazero/cuda/strided_copy.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include <cstdio>
#include <iomanip>
#include <sstream>

namespace megazero {

namespace cuda {
void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  throw InternalError(detail::concat(file, ":", line, ": CUDA error ", cudaGetErrorName(err), " (",
                                     cudaGetErrorString(err), ") from ", expr));
}
}  // namespace cuda

namespace {
std::string mib(std::size_t bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << static_cast<double>(bytes) / (1024.0 * 1024.0) << " MiB";
  return os.str();
}
}  // namespace

// ---------------------------------------------------------------- guard
CudaDeviceGuard::CudaDeviceGuard(int index) {
  int current = -1;
  MZ_CUDA_CHECK(cudaGetDevice(&current));
  if (current != index) {
    MZ_CUDA_CHECK(cudaSetDevice(index));
    previous_ = current;
  }
}

CudaDeviceGuard::~CudaDeviceGuard() {
  // A destructor must not throw; a failure here would have shown up in the
  // guarded calls already.
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

// ---------------------------------------------------------------- device
CudaDevice::CudaDevice(int index) : index_(index) {
  CudaDeviceGuard guard(index_);
  MZ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  MZ_CUDA_CHECK(cudaStreamCreateWithFlags(&offload_stream_, cudaStreamNonBlocking));
  MZ_CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking));
  // The device's memory pool keeps what it once reserved (no release
  // threshold): after the first step every allocation is served from memory
  // the pool already holds, with no driver call and no device synchronisation.
  cudaMemPool_t pool = nullptr;
  MZ_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index_));
  std::uint64_t keep = UINT64_MAX;
  MZ_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
}

CudaDevice::~CudaDevice() {
  (void)cudaStreamSynchronize(side_stream_);  // its work uses memory the arena may hold
  (void)cudaStreamDestroy(side_stream_);
  release_arena();  // stream-ordered, after everything queued
  // Errors are ignored: at process exit the runtime may already be unloading
  // (cudaErrorCudartUnloading), and a destructor has nobody to report to.
  (void)cudaStreamSynchronize(stream_);
  (void)cudaStreamDestroy(stream_);  // needs no current device: the stream knows its own
  for (auto& [thread, copy_stream] : copy_streams_) {
    (void)cudaStreamSynchronize(copy_stream);
    (void)cudaStreamDestroy(copy_stream);
  }
  (void)cudaStreamSynchronize(offload_stream_);
  (void)cudaStreamDestroy(offload_stream_);
}

void* CudaDevice::raw_allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  // (Device::allocate refuses allocations inside run_queued work before this.)
  CudaDeviceGuard guard(index_);
  void* p = nullptr;
  // Stream-ordered: usable by everything queued on the compute stream after
  // this call (other streams first wait for the compute stream).
  const cudaError_t err = cudaMallocAsync(&p, bytes, stream_);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: clear it so later launch checks do not report it again
    // What the pool keeps reserved is megazero's too (freed tensors it holds for reuse).
    cudaMemPool_t pool = nullptr;
    std::uint64_t reserved = 0;
    std::string extra;
    if (cudaDeviceGetDefaultMemPool(&pool, index_) == cudaSuccess &&
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved) == cudaSuccess)
      extra = "; the stream-ordered pool reserves " + mib(static_cast<std::size_t>(reserved)) +
              " (live tensors and freed ones kept for reuse); the CUDA context, cuBLAS and NCCL hold the rest";
    (void)cudaGetLastError();
    throw ConfigError(out_of_memory_message(bytes, memory_info(), extra));
  }
  MZ_CUDA_CHECK(err);
  return p;
}

void CudaDevice::raw_free(void* p, std::size_t) {
  if (!p) return;
  // Stream-ordered on the compute stream: the memory is reused only by work
  // queued after every kernel already queued there, so freeing a tensor a
  // queued kernel still reads is safe. Collectives on other streams hold
  // their buffers until they finished (NcclCommunicator). Called from
  // Buffer's destructor, so it must not throw: report and go on. The stream
  // names the device, so no current-device guard is needed.
  const cudaError_t err = cudaFreeAsync(p, stream_);
  if (err != cudaSuccess && err != cudaErrorCudartUnloading)
    std::fprintf(stderr, "megazero: cudaFree on %s failed: %s\n", name().c_str(), cudaGetErrorString(err));
}

void CudaDevice::copy_sync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return;
  MZ_CHECK(!running_queued_work(), "a host copy on ", name(), " inside run_queued work (the host would wait)");
  CudaDeviceGuard guard(index_);
  // On the compute stream, so the copy sees every kernel queued before it.
  MZ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream_));
  MZ_CUDA_CHECK(cudaStreamSynchronize(stream_));
  count_host_wait();
}

// Device to device: queued on the compute stream like a kernel; the host does not wait.
void CudaDevice::copy_on_stream(void* dst, const void* src, std::size_t bytes) {
  CudaDeviceGuard guard(index_);
  MZ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

void CudaDevice::copy_to_host(void* host_dst, const void* src, std::size_t bytes) {
  copy_sync(host_dst, src, bytes, cudaMemcpyDeviceToHost);
}

void CudaDevice::copy_from_host(void* dst, const void* host_src, std::size_t bytes) {
  copy_sync(dst, host_src, bytes, cudaMemcpyHostToDevice);
}

void CudaDevice::copy_within(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0 || dst == src) return;
  const auto* d = static_cast<const char*>(dst);
  const auto* s = static_cast<const char*>(src);
  if (d < s + bytes && s < d + bytes) {
    // cudaMemcpy is undefined for overlapping ranges, while the CPU device
    // gives memmove semantics: go through a (counted) temporary, whose
    // stream-ordered free (cudaFreeAsync) follows the second copy.
    auto tmp = allocate(bytes, MemoryCategory::Workspace, "copy_within overlap");
    copy_on_stream(tmp->data(), src, bytes);
    copy_on_stream(dst, tmp->data(), bytes);
    return;
  }
  copy_on_stream(dst, src, bytes);
}

void CudaDevice::fill_zero(void* dst, std::size_t bytes) {
  if (bytes == 0) return;
  CudaDeviceGuard guard(index_);
  MZ_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
}

void CudaDevice::copy_strided(void* dst, DType dst_dtype, const std::int64_t* dst_strides, const void* src,
                              DType src_dtype, const std::int64_t* src_strides, const std::int64_t* shape, int dims) {
  CudaDeviceGuard guard(index_);
  cuda::strided_copy(src, src_dtype, src_strides, dst, dst_dtype, dst_strides, shape, dims, stream_);
}

std::optional<Device::MemoryInfo> CudaDevice::memory_info() {
  CudaDeviceGuard guard(index_);
  std::size_t free_bytes = 0, total_bytes = 0;
  MZ_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return MemoryInfo{static_cast<std::int64_t>(free_bytes), static_cast<std::int64_t>(total_bytes)};
}

std::shared_ptr<void> CudaDevice::allocate_host_staging(std::size_t bytes) {
  CudaDeviceGuard guard(index_);
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, std::max<std::size_t>(bytes, 1), cudaHostAllocDefault);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw ConfigError(detail::concat("cannot allocate ", mib(bytes), " of page-locked host memory for ", name(), ": ",
                                     cudaGetErrorString(err), " (check the memlock limit, ulimit -l)"));
  }
  return std::shared_ptr<void>(p, [](void* q) { (void)cudaFreeHost(q); });
}

std::shared_ptr<void> CudaDevice::pin_host_memory(void* p, std::size_t bytes) {
  if (!p || bytes == 0) return nullptr;
  CudaDeviceGuard guard(index_);
  const cudaError_t err = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    std::fprintf(stderr,
                 "megazero: note: could not page-lock %s of shared host memory for %s (%s); its copies go through "
                 "the driver's staging, slower\n",
                 mib(bytes).c_str(), name().c_str(), cudaGetErrorString(err));
    return nullptr;
  }
  return std::shared_ptr<void>(p, [](void* q) { (void)cudaHostUnregister(q); });
}

void CudaDevice::synchronize() {
  CudaDeviceGuard guard(index_);
  count_host_wait();
  MZ_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

namespace {
struct EventMark final : Device::Mark {
  cudaEvent_t event = nullptr;
  int device = 0;
  ~EventMark() override {
    if (event) (void)cudaEventDestroy(event);  // no throw: the runtime may be unloading
  }
};
}  // namespace

std::shared_ptr<Device::Mark> CudaDevice::mark() {
  CudaDeviceGuard guard(index_);
  auto m = std::make_shared<EventMark>();
  m->device = index_;
  MZ_CUDA_CHECK(cudaEventCreate(&m->event));  // timing enabled (no cudaEventDisableTiming)
  MZ_CUDA_CHECK(cudaEventRecord(m->event, stream_));
  return m;
}

double CudaDevice::seconds_between(const Mark& from, const Mark& to) {
  const auto* a = dynamic_cast<const EventMark*>(&from);
  const auto* b = dynamic_cast<const EventMark*>(&to);
  MZ_CHECK(a && b && a->device == index_ && b->device == index_, "seconds_between on ", name(),
           ": marks of another device");
  CudaDeviceGuard guard(index_);
  MZ_CUDA_CHECK(cudaEventSynchronize(b->event));
  float ms = 0;
  MZ_CUDA_CHECK(cudaEventElapsedTime(&ms, a->event, b->event));
  return static_cast<double>(ms) * 1e-3;
}

void CudaDevice::copy_after(const Mark& after, void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return;
  run_after(after,
            [&](cudaStream_t copy_stream) { MZ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, copy_stream)); });
}

void CudaDevice::run_after(const Mark& after, const std::function<void(cudaStream_t)>& launch) {
  const auto* m = dynamic_cast<const EventMark*>(&after);
  MZ_CHECK(m && m->device == index_, "work after a mark on ", name(), ": a mark of another device");
  CudaDeviceGuard guard(index_);
  // The copy stream waits for the point the mark recorded on the compute
  // stream (every write to, and every earlier use of, these device bytes),
  // not for what the compute stream was given since.
  const cudaStream_t copy_stream = thread_copy_stream();
  MZ_CUDA_CHECK(cudaStreamWaitEvent(copy_stream, m->event, 0));
  launch(copy_stream);
  cudaEvent_t done = nullptr;
  MZ_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  const cudaError_t recorded = cudaEventRecord(done, copy_stream);
  const cudaError_t waited = recorded == cudaSuccess ? cudaEventSynchronize(done) : recorded;
  (void)cudaEventDestroy(done);
  MZ_CUDA_CHECK(waited);
}

void CudaDevice::copy_within_after(const Mark& after, void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0 || dst == src) return;
  copy_after(after, dst, src, bytes, cudaMemcpyDeviceToDevice);
}

namespace {
constexpr const char* kIpcPrefix = "cuda-ipc:";

// An exported cudaMalloc block, or a peer's block opened here.
class CudaIpcMemory final : public Device::SharedMemory {
 public:
  CudaIpcMemory(int device, void* p, std::size_t bytes, std::string handle, bool owned)
      : device_(device), owned_(owned) {
    data_ = p;
    bytes_ = bytes;
    handle_ = std::move(handle);
  }
  ~CudaIpcMemory() override {
    // No throw, no report: at exit the runtime may be unloading.
    int current = -1;
    (void)cudaGetDevice(&current);
    (void)cudaSetDevice(device_);
    (void)(owned_ ? cudaFree(data_) : cudaIpcCloseMemHandle(data_));
    if (current >= 0) (void)cudaSetDevice(current);
  }

 private:
  int device_;
  bool owned_;
};
}  // namespace

std::shared_ptr<Device::SharedMemory> CudaDevice::allocate_shared(std::size_t bytes) {
  CudaDeviceGuard guard(index_);
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, std::max<std::size_t>(bytes, 1));
  cudaIpcMemHandle_t h{};
  if (err == cudaSuccess) err = cudaIpcGetMemHandle(&h, p);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    if (p) (void)cudaFree(p);
    throw ConfigError(detail::concat("cannot allocate ", mib(bytes), " of shared (CUDA IPC) memory on ", name(), ": ",
                                     cudaGetErrorString(err)));
  }
  std::string handle = kIpcPrefix;
  static const char* hex = "0123456789abcdef";
  for (unsigned char c : std::string_view(h.reserved, sizeof(h.reserved))) {
    handle += hex[c >> 4];
    handle += hex[c & 15];
  }
  return std::make_shared<CudaIpcMemory>(index_, p, bytes, std::move(handle), true);
}

std::shared_ptr<Device::SharedMemory> CudaDevice::open_shared(const std::string& handle, std::size_t bytes) {
  cudaIpcMemHandle_t h{};
  const std::size_t prefix = std::string_view(kIpcPrefix).size();
  if (handle.rfind(kIpcPrefix, 0) != 0 || handle.size() != prefix + 2 * sizeof(h.reserved))
    throw ConfigError(detail::concat(name(), ": '", handle.substr(0, 40), "' is not a CUDA IPC handle"));
  auto nibble = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (std::size_t i = 0; i < sizeof(h.reserved); ++i)
    h.reserved[i] = static_cast<char>(nibble(handle[prefix + 2 * i]) << 4 | nibble(handle[prefix + 2 * i + 1]));
  CudaDeviceGuard guard(index_);
  void* p = nullptr;
  const cudaError_t err = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw ConfigError(
        detail::concat(name(), " cannot open another process's device memory (CUDA IPC): ", cudaGetErrorString(err)));
  }
  return std::make_shared<CudaIpcMemory>(index_, p, bytes, std::string(), false);
}

// Called with this device current (copy_after's guard).
cudaStream_t CudaDevice::thread_copy_stream() {
  std::lock_guard<std::mutex> lock(copy_streams_mu_);
  cudaStream_t& s = copy_streams_[std::this_thread::get_id()];
  if (!s) MZ_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

// Every stream of the GPU drained (the side streams' copies and NCCL's too),
// so the window holds exactly the work queued between the two calls.
void CudaDevice::start_kernel_trace() {
  CudaDeviceGuard guard(index_);
  count_host_wait();
  MZ_CUDA_CHECK(cudaDeviceSynchronize());
  cuda::trace_start();
}

KernelTrace CudaDevice::stop_kernel_trace() {
  CudaDeviceGuard guard(index_);
  count_host_wait();
  MZ_CUDA_CHECK(cudaDeviceSynchronize());
  return cuda::trace_stop();
}

void CudaDevice::copy_to_host_after(const Mark& after, void* host_dst, const void* src, std::size_t bytes) {
  copy_after(after, host_dst, src, bytes, cudaMemcpyDeviceToHost);
}

void CudaDevice::copy_from_host_after(const Mark& after, void* dst, const void* host_src, std::size_t bytes) {
  copy_after(after, dst, host_src, bytes, cudaMemcpyHostToDevice);
}

namespace {
struct EventTransfer final : Device::Transfer {
  cudaEvent_t done = nullptr;
  int device = 0;
  ~EventTransfer() override {
    if (done) (void)cudaEventDestroy(done);  // safe before completion: destroyed once reached
  }
};
const EventTransfer& event_transfer(const Device::Transfer& t, int device, const std::string& name) {
  const auto* e = dynamic_cast<const EventTransfer*>(&t);
  MZ_CHECK(e && e->device == device, "a transfer of another device on ", name);
  return *e;
}
}  // namespace

// `s` waits for everything queued on the compute stream so far (an event
// recorded now), and nothing later.
void CudaDevice::after_compute(cudaStream_t s) {
  cudaEvent_t issued = nullptr;
  MZ_CUDA_CHECK(cudaEventCreateWithFlags(&issued, cudaEventDisableTiming));
  const cudaError_t recorded = cudaEventRecord(issued, stream_);
  const cudaError_t waited = recorded == cudaSuccess ? cudaStreamWaitEvent(s, issued, 0) : recorded;
  (void)cudaEventDestroy(issued);  // released once reached
  MZ_CUDA_CHECK(waited);
}

std::shared_ptr<Device::Transfer> CudaDevice::queue_copy(void* dst, const void* src, std::size_t bytes,
                                                         cudaMemcpyKind kind) {
  CudaDeviceGuard guard(index_);
  auto t = std::make_shared<EventTransfer>();
  t->device = index_;
  MZ_CUDA_CHECK(cudaEventCreateWithFlags(&t->done, cudaEventDisableTiming));
  if (bytes > 0) {
    after_compute(offload_stream_);
    MZ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, offload_stream_));
  }
  MZ_CUDA_CHECK(cudaEventRecord(t->done, offload_stream_));
  return t;
}

std::shared_ptr<Device::Transfer> CudaDevice::copy_to_host_queued(void* host_dst, const void* src, std::size_t bytes) {
  return queue_copy(host_dst, src, bytes, cudaMemcpyDeviceToHost);
}

std::shared_ptr<Device::Transfer> CudaDevice::copy_from_host_queued(void* dst, const void* host_src,
                                                                    std::size_t bytes) {
  return queue_copy(dst, host_src, bytes, cudaMemcpyHostToDevice);
}

void CudaDevice::queue_after(const Transfer& t) {
  const EventTransfer& e = event_transfer(t, index_, name());
  CudaDeviceGuard guard(index_);
  MZ_CUDA_CHECK(cudaStreamWaitEvent(stream_, e.done, 0));
}

std::shared_ptr<Device::Transfer> CudaDevice::run_queued(const std::function<void()>& work) {
  CudaDeviceGuard guard(index_);
  auto t = std::make_shared<EventTransfer>();
  t->device = index_;
  MZ_CUDA_CHECK(cudaEventCreateWithFlags(&t->done, cudaEventDisableTiming));
  after_compute(side_stream_);
  // This thread's launches go to the side stream, in short blocks, until the work returns (or throws).
  struct Beside {
    const CudaDevice* outer_device;
    bool outer_short;
    explicit Beside(const CudaDevice* d) : outer_device(t_side_of_), outer_short(cuda::detail_k::t_beside_compute) {
      t_side_of_ = d;
      cuda::detail_k::t_beside_compute = true;
    }
    ~Beside() {
      t_side_of_ = outer_device;
      cuda::detail_k::t_beside_compute = outer_short;
    }
  } beside(this);
  run_as_queued(work);
  MZ_CUDA_CHECK(cudaEventRecord(t->done, side_stream_));
  return t;
}

// A host wait (counted) only when the copy has not ended yet: the host blocks then.
void CudaDevice::wait(const Transfer& t) {
  const EventTransfer& e = event_transfer(t, index_, name());
  CudaDeviceGuard guard(index_);
  const cudaError_t state = cudaEventQuery(e.done);
  if (state == cudaSuccess) return;
  if (state != cudaErrorNotReady) MZ_CUDA_CHECK(state);
  // "Not ready" is no error: keep it from later launch checks, clearing only it
  // (an earlier launch's error stays for its check).
  if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
  count_host_wait();
  MZ_CUDA_CHECK(cudaEventSynchronize(e.done));
}

std::shared_ptr<Device> CudaDevice::host_device() {
  std::lock_guard<std::mutex> lock(host_mu_);  // communication threads stage through it too
  if (!host_) host_ = std::make_shared<cuda::PinnedHostDevice>(index_);
  return host_;
}

// ---------------------------------------------------------------- factory
CudaDevice& as_cuda_device(Device& d) {
  auto* cuda = dynamic_cast<CudaDevice*>(&d);
  MZ_CHECK(cuda != nullptr, "expected a CUDA device, got ", d.name());
  return *cuda;
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // "no driver" / "no device" must not poison later checks
    return 0;
  }
  return n;
}

std::shared_ptr<Device> make_cuda_device(int index) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw ConfigError(
        detail::concat("--device cuda:", index, ": no CUDA GPU is visible (0 devices; the CUDA runtime says: ",
                       cudaGetErrorString(err), "); check the driver and CUDA_VISIBLE_DEVICES, or use --device cpu"));
  }
  if (count == 0)
    throw ConfigError(detail::concat("--device cuda:", index,
                                     ": no CUDA GPU is visible (0 devices); check the driver and "
                                     "CUDA_VISIBLE_DEVICES, or use --device cpu"));
  if (index < 0 || index >= count)
    throw ConfigError(detail::concat("--device cuda:", index, ": no such GPU, ", count, " visible (indices 0..",
                                     count - 1, "); pick an index below ", count,
                                     ", check CUDA_VISIBLE_DEVICES, or use --device cpu"));
  auto device = std::make_shared<CudaDevice>(index);
  // The rank's GPU becomes current, so libraries that use the current device
  // (cuDNN handles, NCCL init) land on it without further ado.
  MZ_CUDA_CHECK(cudaSetDevice(index));
  return device;
}

void register_cuda_backend() { register_gpu_backend(GpuBackend{&make_cuda_device, &cuda_device_count}); }

}  // namespace megazero
