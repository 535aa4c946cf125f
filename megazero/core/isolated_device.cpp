#include "megazero/core/isolated_device.h"

#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <shared_mutex>

#include "megazero/core/error.h"

namespace megazero {
namespace {

// Every live allocation of every isolated device: the address tensors carry
// (mapped PROT_NONE) -> its read-write twin. One registry for the process, so
// the fault handler can tell a touched device address from any other fault.
struct Region {
  char* alias;
  std::size_t bytes;   // as requested
  std::size_t mapped;  // rounded up to pages
};
std::shared_mutex g_mu;
std::map<const char*, Region>& regions() {
  static auto* m = new std::map<const char*, Region>;  // never destroyed: buffers may outlive static destructors
  return *m;
}

std::size_t page_size() {
  static const std::size_t p = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return p;
}

struct sigaction g_previous_segv {};

// Async-signal-safe output of a message and a number.
void say(const char* s) { (void)!::write(STDERR_FILENO, s, std::strlen(s)); }
void say_hex(const void* p) {
  char buf[2 + 16 + 1];
  auto v = reinterpret_cast<std::uintptr_t>(p);
  buf[0] = '0';
  buf[1] = 'x';
  for (int i = 0; i < 16; ++i) buf[2 + i] = "0123456789abcdef"[(v >> (60 - 4 * i)) & 0xf];
  buf[18] = '\0';
  say(buf);
}

// A fault on an isolated device's address is a megazero bug: say so with a
// stack, then let the fault take its course (the previous handler or death by
// SIGSEGV, so exit codes stay those of a crash).
void on_segv(int sig, siginfo_t* info, void* ctx) {
  const char* addr = static_cast<const char*>(info->si_addr);
  bool ours = false;
  const void* base = nullptr;
  if (g_mu.try_lock_shared()) {  // a thread holding it exclusively never touches device memory
    auto& m = regions();
    auto it = m.upper_bound(addr);
    if (it != m.begin()) {
      --it;
      ours = addr < it->first + it->second.mapped;
      base = it->first;
    }
    g_mu.unlock_shared();
  }
  if (ours) {
    say("megazero: internal error: host code touched cpu-isolated device memory at ");
    say_hex(addr);
    say(" (in the allocation at ");
    say_hex(base);
    say("). Host code may reach device memory only through the device's copies (Tensor::copy_from, "
        "Device::copy_to_host/copy_from_host), as on a GPU. Stack:\n");
    void* frames[64];
    const int n = ::backtrace(frames, 64);
    ::backtrace_symbols_fd(frames, n, STDERR_FILENO);
  }
  // Re-arm what was there before; returning re-executes the access.
  ::sigaction(SIGSEGV, &g_previous_segv, nullptr);
  if (!ours && g_previous_segv.sa_handler != SIG_DFL && g_previous_segv.sa_handler != SIG_IGN) {
    if (g_previous_segv.sa_flags & SA_SIGINFO)
      g_previous_segv.sa_sigaction(sig, info, ctx);
    else
      g_previous_segv.sa_handler(sig);
  }
}

void install_fault_report() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGSEGV, &sa, &g_previous_segv);
  });
}

// The region holding [p, p + bytes); InternalError if there is none.
const std::pair<const char* const, Region>& region_of(const void* p, std::size_t bytes, const char* op) {
  const auto* c = static_cast<const char*>(p);
  auto& m = regions();
  auto it = m.upper_bound(c);
  MZ_CHECK(it != m.begin(), op, ": ", p, " is not an address of the cpu-isolated device");
  --it;
  MZ_CHECK(c + bytes <= it->first + it->second.bytes || (bytes == 0 && c <= it->first + it->second.mapped), op, ": [",
           p, ", +", bytes, ") is outside the cpu-isolated allocation at ", static_cast<const void*>(it->first), " of ",
           it->second.bytes, " bytes");
  return *it;
}

char* alias_of(const void* p, std::size_t bytes, const char* op) {
  if (p == nullptr) {
    MZ_CHECK(bytes == 0, op, ": a null cpu-isolated address for ", bytes, " bytes");
    return nullptr;
  }
  std::shared_lock lock(g_mu);
  const auto& [base, r] = region_of(p, bytes, op);
  return r.alias + (static_cast<const char*>(p) - base);
}

}  // namespace

IsolatedCpuDevice::IsolatedCpuDevice(std::int64_t capacity_bytes) : capacity_(capacity_bytes) {
  MZ_CHECK(capacity_bytes >= 0, "negative capacity");
  install_fault_report();
}

void* IsolatedCpuDevice::compute_address(const void* p) const { return alias_of(p, 0, "compute_address"); }

std::optional<Device::MemoryInfo> IsolatedCpuDevice::memory_info() {
  if (capacity_ == 0) return std::nullopt;
  return MemoryInfo{std::max<std::int64_t>(0, capacity_ - held_bytes()), capacity_};
}

namespace {
constexpr std::size_t kMaxCachedBytes = std::size_t{1} << 30;
}  // namespace

IsolatedCpuDevice::~IsolatedCpuDevice() {
  release_arena();
  for (const auto& [mapped, p] : cache_) unmap(p);
}

void* IsolatedCpuDevice::raw_allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  if (capacity_ > 0 && held_bytes() + static_cast<std::int64_t>(bytes) > capacity_)
    throw ConfigError(
        out_of_memory_message(bytes, memory_info(), " (the capacity MEGAZERO_ISOLATED_DEVICE_MIB gives it)"));
  const std::size_t mapped = (bytes + page_size() - 1) / page_size() * page_size();
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (auto it = cache_.find(mapped); it != cache_.end()) {
      void* dev = it->second;
      cache_.erase(it);
      cached_bytes_ -= mapped;
      std::unique_lock registry(g_mu);
      regions().at(static_cast<const char*>(dev)).bytes = bytes;
      return dev;
    }
  }
  const int fd = ::memfd_create("megazero-cpu-isolated", MFD_CLOEXEC);
  MZ_REQUIRE(fd >= 0, "cpu-isolated: memfd_create failed: ", std::strerror(errno));
  void* dev = MAP_FAILED;
  void* alias = MAP_FAILED;
  if (::ftruncate(fd, static_cast<off_t>(mapped)) == 0) {
    dev = ::mmap(nullptr, mapped, PROT_NONE, MAP_SHARED, fd, 0);
    alias = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  const int err = errno;
  ::close(fd);  // the mappings keep the memory
  if (dev == MAP_FAILED || alias == MAP_FAILED) {
    if (dev != MAP_FAILED) ::munmap(dev, mapped);
    if (alias != MAP_FAILED) ::munmap(alias, mapped);
    throw ConfigError(out_of_memory_message(bytes, memory_info(), detail::concat(" (mmap: ", std::strerror(err), ")")));
  }
  std::unique_lock lock(g_mu);
  regions()[static_cast<const char*>(dev)] = Region{static_cast<char*>(alias), bytes, mapped};
  return dev;
}

void IsolatedCpuDevice::raw_free(void* p, std::size_t bytes) {
  if (!p) return;
  const std::size_t mapped = (bytes + page_size() - 1) / page_size() * page_size();
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cached_bytes_ + mapped <= kMaxCachedBytes) {
      cache_.emplace(mapped, p);
      cached_bytes_ += mapped;
      return;
    }
  }
  unmap(p);
}

void IsolatedCpuDevice::unmap(void* p) {
  Region r{};
  {
    std::unique_lock lock(g_mu);
    auto it = regions().find(static_cast<const char*>(p));
    if (it == regions().end()) {
      std::fprintf(stderr, "megazero: cpu-isolated: free of an unknown address %p\n", p);
      return;
    }
    r = it->second;
    regions().erase(it);
  }
  ::munmap(p, r.mapped);
  ::munmap(r.alias, r.mapped);
}

// The blocking copies and synchronize() count as host waits, as a GPU's do
// (Device::host_waits); the *_after copies, a GPU's side-stream copies, do not.
void IsolatedCpuDevice::copy_to_host(void* host_dst, const void* src, std::size_t bytes) {
  if (!bytes) return;
  MZ_CHECK(!running_queued_work(), "copy_to_host on ", name(), " inside run_queued work (the host would wait)");
  count_host_wait();
  std::memcpy(host_dst, alias_of(src, bytes, "copy_to_host"), bytes);
}
void IsolatedCpuDevice::copy_from_host(void* dst, const void* host_src, std::size_t bytes) {
  if (!bytes) return;
  MZ_CHECK(!running_queued_work(), "copy_from_host on ", name(), " inside run_queued work (the host would wait)");
  count_host_wait();
  std::memcpy(alias_of(dst, bytes, "copy_from_host"), host_src, bytes);
}
void IsolatedCpuDevice::copy_to_host_after(const Mark&, void* host_dst, const void* src, std::size_t bytes) {
  if (bytes) std::memcpy(host_dst, alias_of(src, bytes, "copy_to_host_after"), bytes);
}
void IsolatedCpuDevice::copy_from_host_after(const Mark&, void* dst, const void* host_src, std::size_t bytes) {
  if (bytes) std::memcpy(alias_of(dst, bytes, "copy_from_host_after"), host_src, bytes);
}
void IsolatedCpuDevice::synchronize() { count_host_wait(); }

namespace {
struct DeferredTransfer final : Device::Transfer {
  std::function<void()> copy;  // emptied once run
  void run() {
    if (!copy) return;
    auto c = std::move(copy);
    copy = nullptr;
    c();
  }
};
}  // namespace

std::shared_ptr<Device::Transfer> IsolatedCpuDevice::copy_to_host_queued(void* host_dst, const void* src,
                                                                         std::size_t bytes) {
  auto t = std::make_shared<DeferredTransfer>();
  if (bytes)
    t->copy = [host_dst, src, bytes] { std::memcpy(host_dst, alias_of(src, bytes, "copy_to_host_queued"), bytes); };
  return t;
}

std::shared_ptr<Device::Transfer> IsolatedCpuDevice::copy_from_host_queued(void* dst, const void* host_src,
                                                                           std::size_t bytes) {
  auto t = std::make_shared<DeferredTransfer>();
  if (bytes)
    t->copy = [dst, host_src, bytes] { std::memcpy(alias_of(dst, bytes, "copy_from_host_queued"), host_src, bytes); };
  return t;
}

std::shared_ptr<Device::Transfer> IsolatedCpuDevice::run_queued(const std::function<void()>& work) {
  auto t = std::make_shared<DeferredTransfer>();
  t->copy = [this, work] { run_as_queued(work); };
  return t;
}

void IsolatedCpuDevice::queue_after(const Transfer& t) {
  auto* d = dynamic_cast<const DeferredTransfer*>(&t);
  MZ_CHECK(d != nullptr, "queue_after on ", name(), ": a transfer of another device");
  const_cast<DeferredTransfer*>(d)->run();
}

// The host blocks (a counted wait, as on a GPU) for a copy nothing has ordered
// yet; one that device work was already ordered after counts as ended.
void IsolatedCpuDevice::wait(const Transfer& t) {
  auto* d = dynamic_cast<const DeferredTransfer*>(&t);
  MZ_CHECK(d != nullptr, "wait on ", name(), ": a transfer of another device");
  if (d->copy) count_host_wait();
  const_cast<DeferredTransfer*>(d)->run();
}
void IsolatedCpuDevice::copy_within(void* dst, const void* src, std::size_t bytes) {
  if (bytes && dst != src)
    std::memmove(alias_of(dst, bytes, "copy_within"), alias_of(src, bytes, "copy_within"), bytes);
}
void IsolatedCpuDevice::copy_within_after(const Mark&, void* dst, const void* src, std::size_t bytes) {
  copy_within(dst, src, bytes);  // work here runs as it is issued: nothing is queued after the mark
}

namespace {
// A shared block: the object's two mappings, registered as a region while it lives.
class IsolatedSharedMemory final : public Device::SharedMemory {
 public:
  IsolatedSharedMemory(const std::string& name, std::size_t bytes, bool create) {
    const std::size_t mapped = (std::max<std::size_t>(bytes, 1) + page_size() - 1) / page_size() * page_size();
    const int fd = ::shm_open(name.c_str(), create ? (O_CREAT | O_EXCL | O_RDWR) : O_RDWR, 0600);
    if (fd < 0)
      throw ConfigError(detail::concat("cpu-isolated: cannot ", create ? "create" : "open", " shared device memory ",
                                       name, ": ", std::strerror(errno)));
    struct stat st {};
    int rc = create ? posix_fallocate(fd, 0, static_cast<off_t>(mapped)) : (::fstat(fd, &st) == 0 ? 0 : errno);
    if (rc == 0 && !create && static_cast<std::size_t>(st.st_size) < mapped) rc = EINVAL;
    void* dev = MAP_FAILED;
    void* alias = MAP_FAILED;
    if (rc == 0) {
      dev = ::mmap(nullptr, mapped, PROT_NONE, MAP_SHARED, fd, 0);
      alias = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (dev == MAP_FAILED || alias == MAP_FAILED) rc = errno;
    }
    ::close(fd);  // the mappings keep the memory
    if (rc != 0) {
      if (dev != MAP_FAILED) ::munmap(dev, mapped);
      if (alias != MAP_FAILED) ::munmap(alias, mapped);
      if (create) ::shm_unlink(name.c_str());
      throw ConfigError(detail::concat("cpu-isolated: cannot map ", bytes, " bytes of shared device memory ", name,
                                       ": ", std::strerror(rc)));
    }
    data_ = dev;
    bytes_ = bytes;
    mapped_ = mapped;
    alias_ = static_cast<char*>(alias);
    if (create) {
      handle_ = name;
      name_ = name;
    }
    std::unique_lock lock(g_mu);
    regions()[static_cast<const char*>(dev)] = Region{alias_, bytes, mapped};
  }
  ~IsolatedSharedMemory() override {
    {
      std::unique_lock lock(g_mu);
      regions().erase(static_cast<const char*>(data_));
    }
    ::munmap(data_, mapped_);
    ::munmap(alias_, mapped_);
    opened_by_all();
  }
  void opened_by_all() override {
    if (!name_.empty()) ::shm_unlink(name_.c_str());
    name_.clear();
  }

 private:
  std::size_t mapped_ = 0;
  char* alias_ = nullptr;
  std::string name_;  // still published under it (the allocating process only)
};
}  // namespace

std::shared_ptr<Device::SharedMemory> IsolatedCpuDevice::allocate_shared(std::size_t bytes) {
  static std::atomic<int> blocks{0};
  return std::make_shared<IsolatedSharedMemory>(
      detail::concat("/megazero-isolated-", ::getpid(), "-", blocks.fetch_add(1)), bytes, true);
}

std::shared_ptr<Device::SharedMemory> IsolatedCpuDevice::open_shared(const std::string& handle, std::size_t bytes) {
  if (handle.rfind("/megazero-isolated-", 0) != 0)
    throw ConfigError(detail::concat("cpu-isolated: '", handle, "' is not a cpu-isolated device's shared block"));
  return std::make_shared<IsolatedSharedMemory>(handle, bytes, false);
}

void IsolatedCpuDevice::fill_zero(void* dst, std::size_t bytes) {
  if (bytes) std::memset(alias_of(dst, bytes, "fill_zero"), 0, bytes);
}

std::shared_ptr<Device> make_isolated_cpu_device() {
  std::int64_t capacity = 0;
  if (const char* v = std::getenv("MEGAZERO_ISOLATED_DEVICE_MIB"); v && *v) {
    char* end = nullptr;
    const double mib = std::strtod(v, &end);
    MZ_REQUIRE(end && *end == '\0' && mib > 0 && mib < 1e9, "MEGAZERO_ISOLATED_DEVICE_MIB='", v,
               "' is not a positive number of MiB; unset it for a device without a capacity");
    capacity = static_cast<std::int64_t>(mib * 1048576.0);
  }
  return std::make_shared<IsolatedCpuDevice>(capacity);
}

}  // namespace megazero
