// The host side of the CUDA runtime for the emulation: enough of
// cuda_runtime_api.h for megazero's launchers (megazero/cuda/*.cu, rewritten
// by rewrite_launches.py) to run on the CPU unchanged, with the GPU's rules
// enforced where a launcher can break them:
// - a launch is checked as the driver checks it before any block runs: at
//   most 1024 threads a block (one dimension: the emulated kernels are 1-D),
//   grid.y and grid.z at most 65535, grid.x at least 1; dynamic shared memory
//   over 48 KB only after cudaFuncSetAttribute(MaxDynamicSharedMemorySize)
//   allowed that much (our launchers set it right before each such launch, so
//   the emulation asks for it since the previous launch), and never over the
//   device's opt-in maximum (227 KB on an H100/H200). A refused launch runs
//   nothing and leaves its error for cudaGetLastError, as on a GPU;
// - device memory (emu::DeviceBuffer) is mapped PROT_NONE except while a
//   kernel or a cudaMemcpy runs, so host code that dereferences a device
//   pointer — a launcher reading a device scalar, say — dies with SIGSEGV
//   here as it would fault (or read garbage) on a GPU;
// - every device buffer ends just before kEmuGuardBytes that are never
//   readable (as each block's shared memory does, emu_runtime.h), so an
//   operand or scratch sized too small faults; emu::report_faults() names the
//   fence an access hit;
// - the device reports `emu::device().sms` SMs (settable: tests use a few, so
//   the grid-stride loops of resident grids take many turns);
// - each launch that runs is counted, and logged on request (host.log).
// Streams are synchronous: a launch returns when its blocks have run.
#pragma once

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <map>
#include <vector>

#include "emu_runtime.h"

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
};
using cudaError = cudaError_t;
struct CUstream_st;
using cudaStream_t = CUstream_st*;
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDeviceAttr {
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

namespace emu {

struct DeviceModel {
  int sms = 132;
  int smem_optin = 232448;  // 227 KB: an H100's and an H200's opt-in maximum
  int blocks_per_sm = 4;    // what cudaOccupancyMaxActiveBlocksPerMultiprocessor answers
};
inline DeviceModel& device() {
  static DeviceModel d;
  return d;
}

struct LaunchConfig;
// Per host thread, as the runtime's error state is.
struct HostState {
  cudaError_t last_error = cudaSuccess;
  std::size_t smem_allowed = 48 << 10;  // since the previous launch
  long launches = 0, refused = 0;
  std::vector<LaunchConfig>* log = nullptr;  // if set, each launch that runs is appended (its grid, block, smem)
};
inline thread_local HostState host;

inline void refuse(cudaError_t e, const char* why) {
  std::fprintf(stderr, "emulated launch refused: %s\n", why);
  host.last_error = e;
  ++host.refused;
}

// ------------------------------------------------------------ device memory
class DeviceMemory {
 public:
  static DeviceMemory& get() {
    static DeviceMemory m;
    return m;
  }
  // `bytes` ending `align`-rounded just before kEmuGuardBytes that are never
  // opened, so a kernel writing or reading past the end faults (an
  // electric fence): scratch the launchers carve too small shows.
  void* allocate(std::size_t bytes, std::size_t align) {
    const std::size_t page = page_size(), len = round_up(bytes ? bytes : 1, page);
    auto* base =
        static_cast<unsigned char*>(mmap(nullptr, len + kEmuGuardBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (base == MAP_FAILED) std::abort();
    void* p = base + len - round_up(bytes, align);
    regions_[p] = {base, len};
    if (open_ > 0) mprotect(base, len, PROT_READ | PROT_WRITE);
    return p;
  }
  void release(void* p) {
    auto it = regions_.find(p);
    if (it == regions_.end()) std::abort();
    munmap(it->second.base, it->second.len + kEmuGuardBytes);
    regions_.erase(it);
  }
  // Device memory reachable from the host for the scope's lifetime (a kernel
  // or a copy running); nested scopes share the opening.
  class Open {
   public:
    Open() {
      if (get().open_++ == 0) get().protect(PROT_READ | PROT_WRITE);
    }
    ~Open() {
      if (--get().open_ == 0) get().protect(PROT_NONE);
    }
    Open(const Open&) = delete;
    Open& operator=(const Open&) = delete;
  };

 private:
  struct Region {
    unsigned char* base;
    std::size_t len;  // without the guard page
  };
  static std::size_t page_size() { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }
  static std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }
  void protect(int prot) {
    for (const auto& [p, r] : regions_)
      if (mprotect(r.base, r.len, prot) != 0) std::abort();
  }
  std::map<void*, Region> regions_;
  int open_ = 0;

 public:
  // What a faulting address is, for the fault report: 1 device memory the
  // host touched outside a kernel or copy, 2 a device buffer's guard page.
  int classify(const void* a) const {
    const auto* p = static_cast<const unsigned char*>(a);
    for (const auto& [q, r] : regions_) {
      if (p >= r.base && p < r.base + r.len) return 1;
      if (p >= r.base + r.len && p < r.base + r.len + kEmuGuardBytes) return 2;
    }
    return 0;
  }
};

// On SIGSEGV, says which of the emulation's fences the access hit (to
// stderr), then dies of the signal as before. Not async-signal-clean (it
// walks the allocation map), which a process about to die can afford.
inline void report_faults() {
  struct sigaction sa {};
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
  sa.sa_sigaction = [](int, siginfo_t* info, void*) {
    const unsigned char* a = static_cast<const unsigned char*>(info->si_addr);
    const int kind = DeviceMemory::get().classify(a);
    const char* why =
        kind == 1   ? "emulated GPU: host code touched device memory outside a kernel or a copy\n"
        : kind == 2 ? "emulated GPU: an access past the end of a device buffer (an operand or scratch too small)\n"
        : emu_smem_guard && a >= emu_smem_guard && a < emu_smem_guard + kEmuGuardBytes
            ? "emulated GPU: a kernel used more dynamic shared memory than its launch asked for\n"
            : "emulated GPU: SIGSEGV outside the emulation's fences\n";
    if (write(2, why, std::strlen(why)) < 0) return;
  };
  sigaction(SIGSEGV, &sa, nullptr);
}

// A device array of T, filled from and read back to host vectors.
template <typename T>
class DeviceBuffer {
 public:
  // `align`: the start's alignment (cudaMalloc gives 256 bytes); the end is
  // then at most align - 1 bytes before the guard page.
  explicit DeviceBuffer(std::size_t n, std::size_t align = 256)
      : n_(n), p_(static_cast<T*>(DeviceMemory::get().allocate(n * sizeof(T), align))) {}
  explicit DeviceBuffer(const std::vector<T>& v) : DeviceBuffer(v.size()) { upload(v); }
  ~DeviceBuffer() { DeviceMemory::get().release(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return p_; }
  std::size_t size() const { return n_; }
  void upload(const std::vector<T>& v) {
    DeviceMemory::Open open;
    std::memcpy(p_, v.data(), std::min(v.size(), n_) * sizeof(T));
  }
  // Every byte set to `byte` (0xff: NaN in every float type), so a read of
  // an element no kernel wrote shows.
  void fill_bytes(unsigned char byte) {
    DeviceMemory::Open open;
    std::memset(p_, byte, n_ * sizeof(T));
  }
  std::vector<T> download() const {
    DeviceMemory::Open open;
    return std::vector<T>(p_, p_ + n_);
  }

 private:
  std::size_t n_;
  T* p_;
};

// ------------------------------------------------------------ launches
struct LaunchConfig {
  dim3 grid, block;
  std::size_t smem;
  cudaStream_t stream;
  LaunchConfig(dim3 g, dim3 b, std::size_t shared = 0, cudaStream_t s = nullptr)
      : grid(g), block(b), smem(shared), stream(s) {}
};

template <typename F>
void launch(const LaunchConfig& c, F&& kernel) {
  const std::size_t allowed = host.smem_allowed;
  host.smem_allowed = 48 << 10;
  if (c.block.x == 0 || c.block.x > 1024 || c.block.y != 1 || c.block.z != 1)
    return refuse(cudaErrorInvalidConfiguration, "block dimensions (1 to 1024 threads, one dimension)");
  if (c.grid.x == 0 || c.grid.x > 0x7fffffffu || c.grid.y == 0 || c.grid.y > 65535 || c.grid.z != 1)
    return refuse(cudaErrorInvalidConfiguration, "grid dimensions (x 1 to 2^31-1, y 1 to 65535, z 1)");
  if (c.smem > static_cast<std::size_t>(device().smem_optin))
    return refuse(cudaErrorInvalidValue, "dynamic shared memory over the device's opt-in maximum");
  if (c.smem > allowed)
    return refuse(cudaErrorInvalidValue,
                  "dynamic shared memory over 48 KB without cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  ++host.launches;
  if (host.log) host.log->push_back(c);
  DeviceMemory::Open open;
  emu_launch(c.grid, c.block.x, c.smem, kernel);
}

}  // namespace emu

// ------------------------------------------------------------ the runtime API
inline cudaError_t cudaGetLastError() {
  const cudaError_t e = emu::host.last_error;
  emu::host.last_error = cudaSuccess;
  return e;
}
inline const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
  }
  return "cudaErrorUnknown";
}
inline const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : e == cudaErrorInvalidValue ? "invalid argument" : "invalid configuration";
}
template <typename Kernel>
cudaError_t cudaFuncSetAttribute(Kernel*, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > emu::device().smem_optin)
    return cudaErrorInvalidValue;
  emu::host.smem_allowed = static_cast<std::size_t>(value);
  return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return cudaErrorInvalidValue;
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = emu::device().sms;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = emu::device().smem_optin;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = 48 << 10;
      return cudaSuccess;
  }
  return cudaErrorInvalidValue;
}
template <typename Kernel>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, Kernel*, int threads, std::size_t) {
  if (threads <= 0 || threads > 1024) return cudaErrorInvalidValue;
  *blocks = std::max(1, std::min(emu::device().blocks_per_sm, 2048 / threads));
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind, cudaStream_t) {
  emu::DeviceMemory::Open open;
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* dst, int value, std::size_t bytes, cudaStream_t) {
  emu::DeviceMemory::Open open;
  std::memset(dst, value, bytes);
  return cudaSuccess;
}
// Fenced device memory that stays for the process (the column sums' tickets).
inline cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  *p = emu::DeviceMemory::get().allocate(bytes, 256);
  return cudaSuccess;
}
