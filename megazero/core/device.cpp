#include "megazero/core/device.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <limits>
#include <mutex>
#include <cstring>
#include <fstream>
#include <new>

#include "megazero/core/error.h"
#include "megazero/core/isolated_device.h"

namespace megazero {

std::string_view device_kind_name(DeviceKind k) {
  switch (k) {
    case DeviceKind::CPU:
      return "cpu";
    case DeviceKind::CUDA:
      return "cuda";
    case DeviceKind::Meta:
      return "meta";
  }
  return "?";
}

Buffer::Buffer(std::shared_ptr<Device> device, void* data, std::size_t bytes, MemoryCategory category,
               std::string label, std::uint64_t heap_id, bool from_arena)
    : device_(std::move(device)),
      data_(data),
      bytes_(bytes),
      category_(category),
      label_(std::move(label)),
      heap_id_(heap_id),
      from_arena_(from_arena) {}

Buffer::~Buffer() {
  if (!from_arena_) {
    device_->raw_free(data_, bytes_);
    device_->held_bytes_ -= static_cast<std::int64_t>(bytes_);
  }
  device_->memory().on_free(category_, bytes_, heap_id_);  // an arena slot is free once the model's is
}

std::string Device::name() const {
  std::string n(device_kind_name(kind()));
  if (kind() == DeviceKind::CUDA) n.append(":").append(std::to_string(index()));
  return n;
}

namespace {
thread_local const Device* t_queued_work_of = nullptr;  // the device whose run_queued work this thread runs
}  // namespace

void Device::run_as_queued(const std::function<void()>& work) {
  struct Scope {  // restored on return and on a throw
    const Device* outer;
    explicit Scope(const Device* d) : outer(t_queued_work_of) { t_queued_work_of = d; }
    ~Scope() { t_queued_work_of = outer; }
  } scope(this);
  work();
}

bool Device::running_queued_work() const { return t_queued_work_of == this; }

std::shared_ptr<Buffer> Device::allocate(std::size_t bytes, MemoryCategory category, std::string label) {
  MZ_CHECK(!running_queued_work(), "allocation of '", label, "' (", bytes, " bytes) on ", name(),
           " inside run_queued work: allocate before queuing it (a GPU orders frees on the compute stream)");
  std::int64_t at = 0;
  const std::uint64_t id = memory_.on_allocate(category, bytes, &at);
  if (arena_ && bytes > 0) {
    if (at + FirstFitHeap::rounded(static_cast<std::int64_t>(bytes)) <= arena_capacity_) {
      ++arena_served_;
      return std::make_shared<Buffer>(shared_from_this(), arena_ + at, bytes, category, std::move(label), id, true);
    }
    ++arena_misses_;
  }
  void* p = nullptr;
  try {
    if (bytes > 0) ++raw_allocations_;
    p = raw_allocate(bytes);
  } catch (...) {
    memory_.on_free(category, bytes, id);
    throw;
  }
  held_bytes_ += static_cast<std::int64_t>(bytes);
  return std::make_shared<Buffer>(shared_from_this(), p, bytes, category, std::move(label), id);
}

void Device::reserve_arena(std::size_t bytes) {
  MZ_CHECK(arena_ == nullptr && arena_capacity_ == 0, "the device arena of ", name(), " is already reserved");
  MZ_CHECK(memory_.snapshot().heap_span_bytes == 0, "reserve the device arena of ", name(),
           " before its first allocation (offsets follow the memory tracker's heap model from its start)");
  if (!has_storage() || bytes == 0) return;
  ++raw_allocations_;
  arena_ = static_cast<char*>(raw_allocate(bytes));
  arena_capacity_ = static_cast<std::int64_t>(bytes);
  held_bytes_ += arena_capacity_;
}

Device::ArenaStats Device::arena_stats() const { return {arena_capacity_, arena_served_.load(), arena_misses_.load()}; }

void Device::release_arena() {
  if (arena_) {
    raw_free(arena_, static_cast<std::size_t>(arena_capacity_));
    held_bytes_ -= arena_capacity_;
  }
  arena_ = nullptr;
}

namespace {
std::string mib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f MiB", bytes / 1048576.0);
  return b;
}

// Calls fn(dst_offset, src_offset, n) for each innermost run of elements, with
// offsets in elements; runs are contiguous in both when both last strides are 1.
template <typename Fn>
void for_each_row(const std::int64_t* shape, int dims, const std::int64_t* dst_strides, const std::int64_t* src_strides,
                  Fn fn) {
  if (dims == 0) {
    fn(0, 0, 1);
    return;
  }
  const auto nd = static_cast<std::size_t>(dims);
  const std::int64_t inner = shape[nd - 1];
  std::int64_t rows = 1;
  for (std::size_t i = 0; i + 1 < nd; ++i) rows *= shape[i];
  std::vector<std::int64_t> idx(nd, 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t d = 0, s = 0;
    for (std::size_t i = 0; i + 1 < nd; ++i) {
      d += idx[i] * dst_strides[i];
      s += idx[i] * src_strides[i];
    }
    fn(d, s, inner);
    for (std::size_t i = nd - 1; i-- > 0;) {
      if (++idx[i] < shape[i]) break;
      idx[i] = 0;
    }
  }
}
}  // namespace

std::string Device::out_of_memory_message(std::size_t requested, std::optional<MemoryInfo> info,
                                          const std::string& extra) const {
  // "host memory" for the CPU device, "device memory" otherwise: the sweep
  // report and users grep for these words.
  std::string s = detail::concat("out of ", host_accessible() ? "host" : "device", " memory on ", name(),
                                 ": requested ", requested, " bytes (", mib(static_cast<double>(requested)), ")");
  if (info)
    s += detail::concat(" with ", mib(static_cast<double>(info->free)), " free of ",
                        mib(static_cast<double>(info->total)));
  s += detail::concat("; megazero holds ", mib(static_cast<double>(held_bytes())));
  if (arena_capacity_ > 0)
    s += detail::concat(" (", mib(static_cast<double>(arena_capacity_)), " of them the device arena)");
  s += extra;
  return s +
         "; lower --micro-batch-size, raise --zero-stage, or enable --recompute-activations "
         "(pretrain_gpt --dry-run --world-size N plans the memory of any layout)";
}

// The CPU's strided copy, at the device's compute addresses: the CPU device's
// own, or the isolated device's kernel view of its memory.
void Device::copy_strided(void* dst, DType dst_dtype, const std::int64_t* dst_strides, const void* src, DType src_dtype,
                          const std::int64_t* src_strides, const std::int64_t* shape, int dims) {
  if (!has_storage()) return;
  std::int64_t n = 1;
  for (int i = 0; i < dims; ++i) n *= shape[i];
  if (n == 0) return;
  auto* dst_base = static_cast<char*>(compute_address(dst));
  const auto* src_base = static_cast<const char*>(compute_address(src));
  const auto de = static_cast<std::int64_t>(dtype_size(dst_dtype));
  const auto se = static_cast<std::int64_t>(dtype_size(src_dtype));
  auto contiguous = [&](const std::int64_t* strides) {
    std::int64_t expected = 1;
    for (int i = dims; i-- > 0;) {
      if (shape[i] != 1 && strides[i] != expected) return false;
      expected *= shape[i];
    }
    return true;
  };
  if (contiguous(dst_strides) && contiguous(src_strides)) {
    if (dst_dtype == src_dtype)
      std::memmove(dst_base, src_base, static_cast<std::size_t>(n * de));
    else
      convert(src_base, src_dtype, dst_base, dst_dtype, static_cast<std::size_t>(n));
    return;
  }
  const std::int64_t dst_inner = dims == 0 ? 1 : dst_strides[dims - 1];
  const std::int64_t src_inner = dims == 0 ? 1 : src_strides[dims - 1];
  for_each_row(shape, dims, dst_strides, src_strides, [&](std::int64_t d, std::int64_t s, std::int64_t len) {
    if (dst_inner == 1 && src_inner == 1) {
      convert(src_base + s * se, src_dtype, dst_base + d * de, dst_dtype, static_cast<std::size_t>(len));
    } else {
      for (std::int64_t i = 0; i < len; ++i)
        convert(src_base + (s + i * src_inner) * se, src_dtype, dst_base + (d + i * dst_inner) * de, dst_dtype, 1);
    }
  });
}

namespace {
struct HostClockMark final : Device::Mark {
  std::chrono::steady_clock::time_point at = std::chrono::steady_clock::now();
};
}  // namespace

std::shared_ptr<Device::Mark> Device::mark() { return std::make_shared<HostClockMark>(); }

double Device::seconds_between(const Mark& from, const Mark& to) {
  const auto* a = dynamic_cast<const HostClockMark*>(&from);
  const auto* b = dynamic_cast<const HostClockMark*>(&to);
  MZ_CHECK(a && b, "seconds_between on ", name(), ": marks of another device");
  return std::chrono::duration<double>(b->at - a->at).count();
}

void Device::start_kernel_trace() {
  throw ConfigError(detail::concat("a kernel trace needs a CUDA device (CUPTI records the GPU's kernels); ", name(),
                                   " has none: run with --device cuda, or leave --profile out"));
}

KernelTrace Device::stop_kernel_trace() {
  throw ConfigError(detail::concat("stop_kernel_trace on ", name(), ", which has no kernel trace"));
}

void Device::copy_to_host_after(const Mark&, void* host_dst, const void* src, std::size_t bytes) {
  copy_to_host(host_dst, src, bytes);  // work here runs as it is issued: nothing is queued after the mark
}

void Device::copy_from_host_after(const Mark&, void* dst, const void* host_src, std::size_t bytes) {
  copy_from_host(dst, host_src, bytes);
}

namespace {
struct DoneTransfer final : Device::Transfer {};
}  // namespace

std::shared_ptr<Device::Transfer> Device::copy_to_host_queued(void* host_dst, const void* src, std::size_t bytes) {
  copy_to_host(host_dst, src, bytes);  // work here has run by the time it is issued
  return std::make_shared<DoneTransfer>();
}

std::shared_ptr<Device::Transfer> Device::copy_from_host_queued(void* dst, const void* host_src, std::size_t bytes) {
  copy_from_host(dst, host_src, bytes);
  return std::make_shared<DoneTransfer>();
}

void Device::queue_after(const Transfer&) {}
void Device::wait(const Transfer&) {}
std::shared_ptr<Device::Transfer> Device::run_queued(const std::function<void()>& work) {
  run_as_queued(work);  // devices that run work as it is issued: done already
  return std::make_shared<DoneTransfer>();
}
std::shared_ptr<Device> Device::host_device() { return make_device(DeviceKind::CPU); }

std::shared_ptr<void> Device::allocate_host_staging(std::size_t bytes) {
  const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + 4095) / 4096 * 4096;
  void* p = std::aligned_alloc(4096, rounded);
  if (!p)
    throw ConfigError(detail::concat("out of host memory allocating a ", mib(static_cast<double>(bytes)),
                                     " staging buffer for ", name()));
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

std::shared_ptr<void> Device::pin_host_memory(void*, std::size_t) { return nullptr; }

void Device::copy_within_after(const Mark&, void* dst, const void* src, std::size_t bytes) {
  copy_within(dst, src, bytes);  // work here runs as it is issued
}

std::shared_ptr<Device::SharedMemory> Device::allocate_shared(std::size_t) { return nullptr; }

std::shared_ptr<Device::SharedMemory> Device::open_shared(const std::string&, std::size_t) {
  throw ConfigError(detail::concat(name(), " cannot map another process's device memory"));
}

// ---- CPU ----
namespace {
// Activations of the same sizes are allocated and freed every step. glibc
// returns large blocks to the OS on free (mmap/munmap), so each step would
// fault in fresh zeroed pages (measured: 10% of a GPT step). Keep them in the
// heap instead; the memory tracker still counts only live bytes.
void keep_freed_memory_in_heap() {
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);  // the largest value glibc accepts
    mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  });
}
}  // namespace

CpuDevice::CpuDevice() { keep_freed_memory_in_heap(); }

void* CpuDevice::raw_allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (!p) throw ConfigError(out_of_memory_message(bytes, std::nullopt, ""));
  return p;
}
void CpuDevice::raw_free(void* p, std::size_t) { std::free(p); }

std::optional<Device::MemoryInfo> CpuDevice::memory_info() {
  std::ifstream in("/proc/meminfo");
  MemoryInfo info;
  bool have_free = false, have_total = false;
  for (std::string key; in >> key;) {
    std::int64_t kib = 0;
    in >> kib;
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
    if (key == "MemAvailable:") info.free = kib * 1024, have_free = true;
    if (key == "MemTotal:") info.total = kib * 1024, have_total = true;
  }
  if (!have_free || !have_total) return std::nullopt;  // not Linux: no pre-flight
  return info;
}
void CpuDevice::copy_to_host(void* dst, const void* src, std::size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void CpuDevice::copy_from_host(void* dst, const void* src, std::size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void CpuDevice::copy_within(void* dst, const void* src, std::size_t bytes) {
  if (bytes && dst != src) std::memmove(dst, src, bytes);
}
void CpuDevice::fill_zero(void* dst, std::size_t bytes) {
  if (bytes) std::memset(dst, 0, bytes);
}

// ---- Meta ----
void ComputeLog::add_gemm(const GemmShape& g) {
  std::lock_guard<std::mutex> lock(mu_);
  ++gemms_[g];
}
MetaDevice::MetaDevice(DeviceKind kernels) : kernels_(kernels) {
  MZ_CHECK(kernels == DeviceKind::CPU || kernels == DeviceKind::CUDA,
           "a meta device stands in for CPU or CUDA kernels, not ", device_kind_name(kernels));
}
void MetaDevice::copy_to_host(void*, const void*, std::size_t) {
  throw InternalError("the meta device holds no data: a dry run tried to read a tensor's values");
}
void MetaDevice::copy_from_host(void*, const void*, std::size_t) {}
std::shared_ptr<Device> MetaDevice::host_device() {
  std::lock_guard<std::mutex> lock(host_mu_);
  if (!host_) host_ = make_meta_device(DeviceKind::CPU);
  return host_;
}

namespace {
GpuBackend& gpu_backend() {
  static GpuBackend backend;
  return backend;
}
std::shared_ptr<Device> make_cuda_device(int index) {
  MZ_REQUIRE(gpu_backend().make,
             "--device cuda: this megazero was built without the CUDA backend; rebuild with "
             "-DMEGAZERO_CUDA=ON on a machine with the CUDA toolkit, cuDNN and NCCL, or use --device cpu");
  return gpu_backend().make(index);
}
}  // namespace

void register_gpu_backend(const GpuBackend& backend) { gpu_backend() = backend; }
int cuda_visible_devices() { return gpu_backend().count ? gpu_backend().count() : 0; }

std::shared_ptr<Device> make_device(DeviceKind kind, int index) {
  switch (kind) {
    case DeviceKind::CPU:
      return std::make_shared<CpuDevice>();
    case DeviceKind::Meta:
      return std::make_shared<MetaDevice>();
    case DeviceKind::CUDA:
      return make_cuda_device(index);
  }
  return nullptr;
}

std::shared_ptr<Device> make_meta_device(DeviceKind kernels) { return std::make_shared<MetaDevice>(kernels); }

std::shared_ptr<Device> make_device(const std::string& spec) {
  if (spec == "cpu") return make_device(DeviceKind::CPU);
  if (spec == "cpu-isolated") return make_isolated_cpu_device();
  if (spec == "meta") return make_device(DeviceKind::Meta);
  if (spec == "cuda") return make_device(DeviceKind::CUDA, 0);
  if (spec.rfind("cuda:", 0) == 0) {
    char* end = nullptr;
    const long idx = std::strtol(spec.c_str() + 5, &end, 10);
    if (end && *end == '\0' && idx >= 0 && spec.size() > 5) return make_device(DeviceKind::CUDA, static_cast<int>(idx));
  }
  throw ConfigError("--device: unknown device '" + spec + "'; use cpu, cpu-isolated, cuda, cuda:N or meta");
}

}  // namespace megazero
