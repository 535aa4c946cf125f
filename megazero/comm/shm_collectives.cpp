#include "megazero/comm/shm_collectives.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <omp.h>

#include "megazero/core/error.h"

namespace megazero {
namespace {

constexpr std::size_t kMinSlotBytes = 4096;
constexpr std::size_t kSectionAlign = 64;  // a reduce-scatter section: whole cache lines, any dtype

std::size_t section_bytes(std::size_t slot, int ranks) {
  return slot / static_cast<std::size_t>(ranks) / kSectionAlign * kSectionAlign;
}

std::string mib(std::size_t bytes) { return detail::concat(bytes >> 20, " MiB"); }

// The slot size rank 0 chose, or why there is none ("!reason").
std::string choose_slot_bytes(int ranks, const std::string& group) {
  const std::size_t areas = static_cast<std::size_t>(ranks) + 1;
  const std::size_t least = std::max(kMinSlotBytes, kSectionAlign * static_cast<std::size_t>(ranks));
  std::size_t slot = ShmCollectives::kDefaultSlotBytes;
  const char* env = std::getenv(ShmCollectives::kSlotBytesEnv);
  const bool asked = env && *env;
  if (asked) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(env, &end, 10);
    if (errno || *end || v < least || v % kSectionAlign != 0 || env[0] == '-')
      return detail::concat("!", ShmCollectives::kSlotBytesEnv, "='", env, "' is not a byte count of at least ", least,
                            " that is a multiple of ", kSectionAlign, "; unset it for the default (",
                            mib(ShmCollectives::kDefaultSlotBytes), ")");
    slot = static_cast<std::size_t>(v);
  }
  struct statvfs fs {};
  if (statvfs("/dev/shm", &fs) == 0) {
    const std::size_t avail = static_cast<std::size_t>(fs.f_bavail) * fs.f_frsize;
    // Leave half of /dev/shm to the other groups and the rest of the machine.
    if (!asked && areas * slot > avail / 2) slot = avail / 2 / areas / 4096 * 4096;
    if (slot < least || areas * slot > avail)
      return detail::concat("!--distributed-backend shm: group '", group, "' needs ", areas, " areas of at least ",
                            asked ? slot : least, " bytes in /dev/shm, which has ", mib(avail),
                            " free; free /dev/shm (or give the container more: docker --shm-size), set ",
                            ShmCollectives::kSlotBytesEnv, " lower, or use --distributed-backend mpi");
  }
  return std::to_string(slot);
}

// ---------------------------------------------------------------- reductions
// The accumulator: fp32 for fp32 and the 16-bit types, fp64 for fp64, int64 for integers.
template <typename T>
using Acc = std::conditional_t<std::is_integral_v<T>, std::int64_t,
                               std::conditional_t<std::is_same_v<T, double>, double, float>>;

template <typename T>
auto wide(T v) {
  if constexpr (std::is_integral_v<T>)
    return static_cast<std::int64_t>(v);
  else
    return widen(v);
}
template <typename T, typename A>
T narrow_to(A v) {
  if constexpr (std::is_same_v<T, BFloat16>)
    return float_to_bf16(v);
  else if constexpr (std::is_same_v<T, Half>)
    return float_to_half(v);
  else
    return static_cast<T>(v);
}

// One block of at most kBlock elements: an L1-resident accumulator and loops
// that vectorise, cloned per ISA (picked at load time; only adds, divisions
// and conversions, so every clone gives the same bits).
constexpr std::size_t kBlock = 1024;

template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default"))) void reduce_block(ReduceOp op, T* dst,
                                                                               const T* const* srcs, std::size_t nsrc,
                                                                               std::size_t len, int ranks) {
  using A = Acc<T>;
  A acc[kBlock];
  for (std::size_t i = 0; i < len; ++i) acc[i] = static_cast<A>(wide(srcs[0][i]));
  for (std::size_t q = 1; q < nsrc; ++q) {
    const T* s = srcs[q];
    if (op == ReduceOp::Max) {
      for (std::size_t i = 0; i < len; ++i) {
        const A v = static_cast<A>(wide(s[i]));
        acc[i] = (v != v || v > acc[i]) ? v : acc[i];  // NaN-propagating, as the MPI and NCCL paths
      }
    } else {
      for (std::size_t i = 0; i < len; ++i) acc[i] += static_cast<A>(wide(s[i]));
    }
  }
  if (op == ReduceOp::Avg) {
    if constexpr (std::is_same_v<T, double>) {
      for (std::size_t i = 0; i < len; ++i) dst[i] = acc[i] / ranks;
    } else if constexpr (std::is_floating_point_v<A>) {
      const float by = static_cast<float>(ranks);
      for (std::size_t i = 0; i < len; ++i) {
        const float rounded = static_cast<float>(wide(narrow_to<T>(acc[i])));
        dst[i] = narrow_to<T>(rounded / by);
      }
    }
  } else {
    for (std::size_t i = 0; i < len; ++i) dst[i] = narrow_to<T>(acc[i]);
  }
}

// The blocks are shared among `threads` OpenMP threads from 2^18 elements.
// Each element's sum is the same whatever the thread count.
template <typename T>
void reduce_typed(ReduceOp op, void* dst_v, const std::vector<const void*>& srcs, std::size_t n, int ranks,
                  int threads) {
  auto* dst = static_cast<T*>(dst_v);
  const auto blocks = static_cast<std::int64_t>((n + kBlock - 1) / kBlock);
#pragma omp parallel num_threads(threads) if (threads > 1 && n >= (std::size_t{1} << 18))
  {
    std::vector<const T*> at(srcs.size());
#pragma omp for schedule(static)
    for (std::int64_t blk = 0; blk < blocks; ++blk) {
      const std::size_t b = static_cast<std::size_t>(blk) * kBlock;
      for (std::size_t q = 0; q < srcs.size(); ++q) at[q] = static_cast<const T*>(srcs[q]) + b;
      reduce_block<T>(op, dst + b, at.data(), at.size(), std::min(kBlock, n - b), ranks);
    }
  }
}

}  // namespace

void check_slot_reduction(DType t, ReduceOp op, std::size_t sources) {
  MZ_CHECK(sources > 0, "a slot reduction without sources");
  MZ_CHECK(op != ReduceOp::Avg || is_floating(t), "avg of a ", dtype_name(t), " tensor; use sum");
  MZ_CHECK(t != DType::U8 || op == ReduceOp::Max, "uint8 tensors reduce with max only");
}

void reduce_host(DType t, ReduceOp op, void* dst, const std::vector<const void*>& srcs, std::size_t n, int ranks,
                 int threads) {
  check_slot_reduction(t, op, srcs.size());
  switch (t) {
    case DType::F32:
      return reduce_typed<float>(op, dst, srcs, n, ranks, threads);
    case DType::F64:
      return reduce_typed<double>(op, dst, srcs, n, ranks, threads);
    case DType::BF16:
      return reduce_typed<BFloat16>(op, dst, srcs, n, ranks, threads);
    case DType::F16:
      return reduce_typed<Half>(op, dst, srcs, n, ranks, threads);
    case DType::I32:
      return reduce_typed<std::int32_t>(op, dst, srcs, n, ranks, threads);
    case DType::I64:
      return reduce_typed<std::int64_t>(op, dst, srcs, n, ranks, threads);
    case DType::U8:
      return reduce_typed<std::uint8_t>(op, dst, srcs, n, ranks, threads);
  }
}

// ---------------------------------------------------------------- the segment
ShmCollectives::ShmCollectives(int rank, int size, const std::string& group, const ShmBootstrap& boot,
                               std::shared_ptr<Device> device)
    : rank_(rank), size_(size), group_(group), barrier_(boot.barrier), device_(std::move(device)) {
  // The host's cores shared by the group's ranks (all on this machine), at
  // most OMP_NUM_THREADS: the reductions of device tensors, while the GPU
  // computes and the host's cores have nothing else to do.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  device_reduce_threads_ = std::max(1, std::min(omp_get_max_threads(), cores / size));
  static std::atomic<int> segments{0};
  std::string shared;  // "<slot bytes> <name>" from rank 0, or "!<why not>"
  std::string name, why;
  if (rank == 0) {
    shared = choose_slot_bytes(size, group);
    if (shared[0] != '!') {
      slot_bytes_ = std::stoull(shared);
      name = detail::concat("/megazero-", getpid(), "-", segments.fetch_add(1));
      mapped_bytes_ = static_cast<std::size_t>(size + 1) * slot_bytes_;
      const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
      // posix_fallocate, not ftruncate: a /dev/shm too small fails here, with
      // ENOSPC, rather than as SIGBUS at the first touch of a missing page.
      const int rc = fd < 0 ? errno : posix_fallocate(fd, 0, static_cast<off_t>(mapped_bytes_));
      if (fd >= 0) close(fd);
      if (rc != 0) {
        if (fd >= 0) shm_unlink(name.c_str());
        shared = detail::concat("!--distributed-backend shm: could not create ", mib(mapped_bytes_), " (", size + 1,
                                " x ", slot_bytes_, " bytes) of shared memory for group '", group,
                                "' in /dev/shm: ", std::strerror(rc), "; set ", kSlotBytesEnv,
                                " lower or use --distributed-backend mpi");
      } else {
        shared += " " + name;
      }
    }
  }
  shared = boot.broadcast_from_0(shared);
  if (shared[0] == '!') throw ConfigError(shared.substr(1));
  if (rank != 0) {
    const auto space = shared.find(' ');
    slot_bytes_ = std::stoull(shared.substr(0, space));
    name = shared.substr(space + 1);
    mapped_bytes_ = static_cast<std::size_t>(size + 1) * slot_bytes_;
  }
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  void* p = fd < 0 ? MAP_FAILED : mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) why = std::strerror(errno);
  if (fd >= 0) close(fd);
  base_ = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
  const bool everyone = boot.all_ok(base_ != nullptr);
  // Every rank has mapped it (or given up): the name can go, the memory stays
  // until the last rank unmaps it, so a crash leaves nothing in /dev/shm.
  if (rank == 0) shm_unlink(name.c_str());
  if (!everyone) {
    if (base_) munmap(base_, mapped_bytes_);
    base_ = nullptr;
    throw ConfigError(
        detail::concat("--distributed-backend shm: ", why.empty() ? "another rank" : "rank " + std::to_string(rank),
                       " of group '", group, "' could not map its shared memory (", mapped_bytes_, " bytes)",
                       why.empty() ? "" : ": " + why, "; use --distributed-backend mpi"));
  }
  if (device_) attach_device_slots(boot);
}

ShmCollectives::~ShmCollectives() {
  device_slot_.clear();
  peer_blocks_.clear();  // the peers' blocks closed before this rank's own is freed
  device_block_.reset();
  pinned_.reset();  // the device lets go of the pages before they are unmapped
  if (base_) munmap(base_, mapped_bytes_);
}

void ShmCollectives::pin_for(const Tensor& t) {
  if (pin_tried_) return;
  pin_tried_ = true;
  pinned_ = t.device().pin_host_memory(base_, mapped_bytes_);
}

void ShmCollectives::put(const Tensor& t, std::size_t offset, char* slot_at, std::size_t bytes,
                         const Device::Mark* issued, bool dev) {
  if (bytes == 0) return;
  const char* src = static_cast<const char*>(t.data()) + offset;
  Device& d = t.device();
  if (dev) {
    MZ_CHECK(issued, "shm transport: a device tensor's collective without its issue mark");
    d.copy_within_after(*issued, slot_at, src, bytes);
  } else if (d.host_accessible()) {
    std::memcpy(slot_at, src, bytes);
  } else {
    pin_for(t);
    if (issued)
      d.copy_to_host_after(*issued, slot_at, src, bytes);
    else
      d.copy_to_host(slot_at, src, bytes);
  }
}

void ShmCollectives::get(const Tensor& t, std::size_t offset, const char* slot_at, std::size_t bytes,
                         const Device::Mark* issued, bool dev) {
  if (bytes == 0) return;
  char* dst = static_cast<char*>(t.data()) + offset;
  Device& d = t.device();
  if (dev) {
    MZ_CHECK(issued, "shm transport: a device tensor's collective without its issue mark");
    d.copy_within_after(*issued, dst, slot_at, bytes);
  } else if (d.host_accessible()) {
    std::memcpy(dst, slot_at, bytes);
  } else {
    pin_for(t);
    if (issued)
      d.copy_from_host_after(*issued, dst, slot_at, bytes);
    else
      d.copy_from_host(dst, slot_at, bytes);
  }
}

void ShmCollectives::reduce(const Tensor& t, ReduceOp op, char* dst, const std::vector<const void*>& srcs,
                            std::size_t n, const Device::Mark* issued, bool dev) {
  if (dev)
    reduce_on_device(t.device(), *issued, t.dtype(), op, dst, srcs, n, size_, device_reduce_threads_);
  else
    reduce_host(t.dtype(), op, dst, srcs, n, size_, threads_for(t));
}

// ---------------------------------------------------------------- collectives
void ShmCollectives::all_reduce(const Tensor& t, ReduceOp op, const Device::Mark* issued) {
  const bool dev = on_device(t);
  const std::size_t es = dtype_size(t.dtype()), n = static_cast<std::size_t>(t.numel());
  const std::size_t per_round = slot_bytes_ / es;
  for (std::size_t s = 0; s < n; s += per_round) {
    const std::size_t len = std::min(per_round, n - s);
    put(t, s * es, slot(rank_, dev), len * es, issued, dev);
    barrier_();
    // This rank's column of the round: an even share, the first len % size one longer.
    const std::size_t share = len / static_cast<std::size_t>(size_), extra = len % static_cast<std::size_t>(size_);
    const std::size_t me = static_cast<std::size_t>(rank_);
    const std::size_t first = me * share + std::min(me, extra), count = share + (me < extra ? 1 : 0);
    if (count > 0) {
      std::vector<const void*> srcs(static_cast<std::size_t>(size_));
      for (int q = 0; q < size_; ++q) srcs[static_cast<std::size_t>(q)] = slot(q, dev) + first * es;
      reduce(t, op, result_area(dev) + first * es, srcs, count, issued, dev);
    }
    barrier_();
    get(t, s * es, result_area(dev), len * es, issued, dev);
  }
}

void ShmCollectives::reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op,
                                    const std::vector<std::int64_t>& counts, const Device::Mark* issued) {
  const bool dev = on_device(input) && on_device(output);
  const std::size_t es = dtype_size(input.dtype());
  const std::size_t section = section_bytes(slot_bytes_, size_), per_round = section / es;
  std::vector<std::size_t> displ(counts.size(), 0);
  for (std::size_t i = 1; i < counts.size(); ++i) displ[i] = displ[i - 1] + static_cast<std::size_t>(counts[i - 1]);
  const auto most = static_cast<std::size_t>(*std::max_element(counts.begin(), counts.end()));
  const auto me = static_cast<std::size_t>(rank_);
  auto part = [&](std::size_t i, std::size_t s) {
    return std::min(per_round, static_cast<std::size_t>(counts[i]) - std::min<std::size_t>(counts[i], s));
  };
  for (std::size_t s = 0; s < most; s += per_round) {
    for (std::size_t i = 0; i < counts.size(); ++i)
      put(input, (displ[i] + s) * es, slot(rank_, dev) + i * section, part(i, s) * es, issued, dev);
    barrier_();
    if (const std::size_t len = part(me, s); len > 0) {
      std::vector<const void*> srcs(static_cast<std::size_t>(size_));
      for (int q = 0; q < size_; ++q) srcs[static_cast<std::size_t>(q)] = slot(q, dev) + me * section;
      // Outputs the reduction reaches (host tensors; device tensors over the
      // device's slots) take the sum directly: the output may be a part of the
      // input, whose bytes of this round are in the slot already.
      if (dev || output.device().host_accessible()) {
        reduce(output, op, static_cast<char*>(output.data()) + s * es, srcs, len, issued, dev);
      } else {
        char* mine = result_area(false) + me * section;
        reduce(output, op, mine, srcs, len, issued, false);
        get(output, s * es, mine, len * es, issued, false);
      }
    }
    barrier_();
  }
}

void ShmCollectives::all_gather(const Tensor& input, const Tensor& output, const std::vector<std::int64_t>& counts,
                                const Device::Mark* issued) {
  const bool dev = on_device(input) && on_device(output);
  const std::size_t es = dtype_size(output.dtype()), per_round = slot_bytes_ / es;
  std::vector<std::size_t> displ(counts.size(), 0);
  for (std::size_t i = 1; i < counts.size(); ++i) displ[i] = displ[i - 1] + static_cast<std::size_t>(counts[i - 1]);
  const auto most = static_cast<std::size_t>(*std::max_element(counts.begin(), counts.end()));
  const auto me = static_cast<std::size_t>(rank_);
  // ZeRO gathers partitions that already sit at their place in the full buffer:
  // this rank's part then needs no copy back.
  const bool in_place =
      input.buffer() == output.buffer() && input.data() == static_cast<const char*>(output.data()) + displ[me] * es;
  auto part = [&](std::size_t i, std::size_t s) {
    return std::min(per_round, static_cast<std::size_t>(counts[i]) - std::min<std::size_t>(counts[i], s));
  };
  for (std::size_t s = 0; s < most; s += per_round) {
    put(input, s * es, slot(rank_, dev), part(me, s) * es, issued, dev);
    barrier_();
    for (std::size_t q = 0; q < counts.size(); ++q)
      if (q != me || !in_place)
        get(output, (displ[q] + s) * es, slot(static_cast<int>(q), dev), part(q, s) * es, issued, dev);
    barrier_();
  }
}

void ShmCollectives::broadcast(const Tensor& t, int root, const Device::Mark* issued) {
  const bool dev = on_device(t);
  const std::size_t es = dtype_size(t.dtype()), n = static_cast<std::size_t>(t.numel());
  const std::size_t per_round = slot_bytes_ / es;
  for (std::size_t s = 0; s < n; s += per_round) {
    const std::size_t len = std::min(per_round, n - s);
    if (rank_ == root) put(t, s * es, slot(root, dev), len * es, issued, dev);
    barrier_();
    if (rank_ != root) get(t, s * es, slot(root, dev), len * es, issued, dev);
    barrier_();
  }
}

void ShmCollectives::reduce(const Tensor& t, int root, ReduceOp op, const Device::Mark* issued) {
  const bool dev = on_device(t);
  const std::size_t es = dtype_size(t.dtype()), n = static_cast<std::size_t>(t.numel());
  const std::size_t per_round = slot_bytes_ / es;
  for (std::size_t s = 0; s < n; s += per_round) {
    const std::size_t len = std::min(per_round, n - s);
    put(t, s * es, slot(rank_, dev), len * es, issued, dev);
    barrier_();
    if (rank_ == root) {
      std::vector<const void*> srcs(static_cast<std::size_t>(size_));
      for (int q = 0; q < size_; ++q) srcs[static_cast<std::size_t>(q)] = slot(q, dev);
      reduce(t, op, result_area(dev), srcs, len, issued, dev);
      get(t, s * es, result_area(dev), len * es, issued, dev);
    }
    barrier_();
  }
}

}  // namespace megazero
