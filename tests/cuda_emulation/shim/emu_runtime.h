// A CPU stand-in for the CUDA runtime, enough to run megazero's kernels on
// the host: each block runs as blockDim.x emulated threads (blocks one after
// another), __syncthreads/__syncwarp are barrier waits, warp shuffles go
// through a per-warp exchange array, and shared memory is one buffer per block
// filled with NaN-like 0xff bytes, so unwritten padding shows.
//
// The emulated threads are fibers (Boost.Context) that one host thread runs in
// turn, each until its next barrier: a barrier costs a context switch per
// thread, not a futex wake-up per thread as with host threads (the emulated
// tests ran ~10x longer so), and the order is fixed, so a read of shared
// memory before the barrier that publishes it reads the 0xff filler every
// run. Built with -DEMU_OS_THREADS, each emulated thread is a host thread and
// the barriers std::barrier: the mode ThreadSanitizer checks for races.
// See tests/cuda_emulation/README.md for what this does and does not prove.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#ifndef EMU_OS_THREADS
#include <boost/context/fiber.hpp>
#include <boost/context/protected_fixedsize_stack.hpp>
#endif

#include <atomic>
#include <barrier>
#include <deque>
#include <semaphore>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>
#include <memory>
#define __device__
#define __global__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// Blocks run one after another, so a function-level static is exactly one
// copy per running block, shared by its threads: a __shared__ variable.
#define __shared__ static
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }

#ifdef EMU_OS_THREADS
using EmuBarrier = std::barrier<>;
#else
// A barrier of emulated threads (fibers of one host thread) numbered from
// `first`: the last to arrive runs `done` and opens it (a new generation);
// the others are resumed by the scheduler only once it has opened, and it
// tells the scheduler the lowest thread that may run again (emu_reopened).
// Back to the scheduler until `generation` differs from `seen`.
void emu_wait_while(const unsigned long& generation, unsigned long seen);
inline unsigned emu_reopened = ~0u;
class EmuBarrier {
 public:
  explicit EmuBarrier(unsigned count, unsigned first = 0, std::function<void()> done = {})
      : count_(count), first_(first), done_(std::move(done)) {}
  void arrive_and_wait() {
    const unsigned long generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      if (done_) done_();
      ++generation_;
      emu_reopened = std::min(emu_reopened, first_);
      return;
    }
    emu_wait_while(generation_, generation);
  }

 private:
  unsigned count_, first_, arrived_ = 0;
  unsigned long generation_ = 0;
  std::function<void()> done_;
};
#endif

struct EmuBlock {
  EmuBarrier* block_bar;
  EmuBarrier* warp_bar[32];
  float xch[32][32];
  double xchd[32][32];
  bool warp_op_in_flight[32];
  const void* lane_data[32][32];  // per warp and lane: what a lane published for a warp-wide check
};
inline thread_local uint3 threadIdx, blockIdx;
inline thread_local dim3 gridDim, blockDim;
inline thread_local unsigned char* emu_smem;
inline thread_local EmuBlock* emu_blk;
inline void __syncthreads() { emu_blk->block_bar->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu_blk->warp_bar[threadIdx.x >> 5]->arrive_and_wait(); }
// Device-wide ordering and the ticket counters' increments (column_tiles.cuh):
// atomic for the host threads of -DEMU_OS_THREADS; the blocks run one after
// another, so the block that takes a column's last ticket is the last block.
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
template <typename T>
inline T __ldcg(const T* p) {
  return *p;
}
inline float __shfl_xor_sync(unsigned, float v, int m) {
  const unsigned w = threadIdx.x >> 5, l = threadIdx.x & 31;
  emu_blk->xch[w][l] = v;
  __syncwarp();
  float r = emu_blk->xch[w][l ^ m];
  __syncwarp();
  return r;
}
inline float __shfl_down_sync(unsigned, float v, int m) {
  const unsigned w = threadIdx.x >> 5, l = threadIdx.x & 31;
  emu_blk->xch[w][l] = v;
  __syncwarp();
  float r = l + m < 32 ? emu_blk->xch[w][l + m] : v;
  __syncwarp();
  return r;
}
inline double __shfl_down_sync(unsigned, double v, int m) {
  const unsigned w = threadIdx.x >> 5, l = threadIdx.x & 31;
  emu_blk->xchd[w][l] = v;
  __syncwarp();
  double r = l + m < 32 ? emu_blk->xchd[w][l + m] : v;
  __syncwarp();
  return r;
}
// CUDA's device max() overloads.
inline float max(float a, float b) { return std::fmax(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
inline std::int64_t min(std::int64_t a, std::int64_t b) { return a < b ? a : b; }
// 16-bit types
struct __nv_bfloat16 {
  uint16_t x = 0;
};
struct __half {
  _Float16 h = 0;
};
inline float ld(float v) { return v; }
inline double ld(double v) { return v; }
inline float ld(__nv_bfloat16 v) {
  uint32_t u = (uint32_t)v.x << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// fp16 -> fp32 from a table of every half's value (the same conversion, once
// per bit pattern): without F16C code generation each conversion is a call
// into libgcc, and it was a third of the emulated attention's time.
inline float ld(__half v) {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (std::uint32_t bits = 0; bits < 65536; ++bits) {
      const auto b = static_cast<std::uint16_t>(bits);
      _Float16 h;
      std::memcpy(&h, &b, 2);
      t[bits] = static_cast<float>(h);
    }
    return t;
  }();
  std::uint16_t bits;
  std::memcpy(&bits, &v.h, 2);
  return table[bits];
}
inline __nv_bfloat16 to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return {0x7fc0};
  u += 0x7fff + ((u >> 16) & 1);
  return {(uint16_t)(u >> 16)};
}
// The conversion intrinsics of cuda_fp16.h/cuda_bf16.h the launcher files
// use (megazero/cuda/cuda_kernels.cu): each rounds once, to nearest even.
inline float __half2float(__half v) { return ld(v); }
inline float __bfloat162float(__nv_bfloat16 v) { return ld(v); }
inline float __double2float_rn(double v) { return static_cast<float>(v); }
inline __half __float2half_rn(float v) { return __half{static_cast<_Float16>(v)}; }
inline __nv_bfloat16 __float2bfloat16_rn(float v) { return to_bf16(v); }
// Per-thread state a block leaves behind (the asynchronous copies of
// cuda_pipeline_primitives.h) is dropped when an emulated thread moves on to
// its next block, as a fresh hardware thread starts with none.
inline thread_local void (*emu_block_exit)() = nullptr;
inline thread_local std::size_t emu_smem_bytes = 0;
inline thread_local unsigned char* emu_smem_base;
// Unreadable bytes after an emulated block's shared memory and after each
// emulated device buffer (emu_host.h): more than a block's largest shared
// memory (227 KB), so an access far past the end still lands in them.
inline constexpr std::size_t kEmuGuardBytes = std::size_t{256} << 10;
// The guard just past the running launch's shared memory (emu_host.h's fault
// report names it).
inline unsigned char* emu_smem_guard = nullptr;
#ifdef EMU_OS_THREADS
// The host threads that play a block's threads, kept between launches:
// creating blockDim.x threads per launch was most of the launcher tests' time
// (tens of thousands of launches). Worker i runs the launch's body(i) when its
// semaphore is released; the last to finish releases the launcher. Launches
// come from one host thread at a time. A forked child (a test checking that
// something faults) has none of its parent's workers, so it starts its own.
class EmuThreadPool {
 public:
  static EmuThreadPool& get() {
    static EmuThreadPool* pool = nullptr;
    if (!pool || pool->pid_ != getpid()) pool = new EmuThreadPool;  // a fork's parent's pool is left alone
    return *pool;
  }
  void run(unsigned n, const std::function<void(unsigned)>& body) {
    while (workers_.size() < n) {
      workers_.emplace_back(new std::binary_semaphore(0));
      const auto i = static_cast<unsigned>(workers_.size() - 1);
      std::thread([this, i, go = workers_.back().get()] { serve(i, *go); }).detach();
    }
    job_ = &body;
    remaining_.store(n);
    for (unsigned i = 0; i < n; ++i) workers_[i]->release();
    done_.acquire();
  }

 private:
  void serve(unsigned i, std::binary_semaphore& go) {
    for (;;) {
      go.acquire();
      (*job_)(i);
      if (remaining_.fetch_sub(1) == 1) done_.release();
    }
  }
  pid_t pid_ = getpid();
  std::deque<std::unique_ptr<std::binary_semaphore>> workers_;  // a deque: growing moves no semaphore
  const std::function<void(unsigned)>* job_ = nullptr;
  std::atomic<unsigned> remaining_{0};
  std::binary_semaphore done_{0};
};
#else
// The fibers that play a block's threads, kept between launches (with their
// stacks: tens of thousands of launches). run() resumes them on the calling
// thread, setting threadIdx for each (the emulated threads share the host
// thread's thread_locals); a fiber runs until it waits at a closed barrier
// or finishes body(i). The next to run is always the lowest-numbered thread
// that can: warp 0 runs as far as it can before warp 1 starts, and so on. So
// a warp that reads shared memory another warp has yet to write (a barrier
// missing before the read) reads the 0xff filler, and one that overwrites
// what a later warp has yet to read (a barrier missing after the read) gives
// that warp the new values: both show every run, in the results. With busy
// threads but none able to run, the block has deadlocked (a GPU would hang):
// the emulation stops saying so. A forked child (a test checking that
// something faults) starts a pool of its own.
class EmuFiberPool {
 public:
  static EmuFiberPool& get() {
    static EmuFiberPool* pool = nullptr;
    if (!pool || pool->pid_ != getpid()) pool = new EmuFiberPool;  // a fork's parent's pool is left alone
    return *pool;
  }
  // The pool whose run() is on the stack (emu_wait_while's, without get()'s getpid).
  static inline EmuFiberPool* running = nullptr;
  void run(unsigned n, const std::function<void(unsigned)>& body) {
    while (workers_.size() < n) add_worker(static_cast<unsigned>(workers_.size()));
    running = this;
    job_ = &body;
    for (unsigned i = 0; i < n; ++i) workers_[i]->busy = true;
    unsigned busy = n;
    // Every thread below `from` is waiting at a closed barrier or finished.
    for (unsigned from = 0;;) {
      unsigned i = from;
      while (i < n && !can_run(*workers_[i])) ++i;
      if (i == n) {
        if (busy == 0) break;
        std::fprintf(stderr,
                     "emulated block deadlocked: its threads wait at different barriers "
                     "(a __syncthreads or __syncwarp not reached by every thread it counts)\n");
        std::abort();
      }
      Worker& w = *workers_[i];
      w.waiting = nullptr;
      current_ = &w;
      threadIdx = {i, 0, 0};
      emu_reopened = ~0u;
      w.fiber = std::move(w.fiber).resume();
      if (!w.busy) --busy;
      from = std::min(i + 1, emu_reopened);
    }
    current_ = nullptr;
    running = nullptr;
  }
  // From an emulated thread: back to the scheduler until it resumes this one
  // (at once, or once `*waiting` differs from `seen`).
  void yield(const unsigned long* waiting = nullptr, unsigned long seen = 0) {
    Worker& w = *current_;
    w.waiting = waiting;
    w.seen = seen;
    w.sink = std::move(w.sink).resume();
  }

 private:
  // Kernels keep their register arrays on the stack (a WMMA fragment is 1 KiB
  // here); a guard page below each stack turns an overflow into a fault.
  static constexpr std::size_t kStackBytes = std::size_t{512} << 10;
  struct Worker {
    boost::context::fiber fiber;  // the emulated thread, as the scheduler resumes it
    boost::context::fiber sink;   // the scheduler, as the emulated thread returns to it
    bool busy = false;
    const unsigned long* waiting = nullptr;  // a closed barrier's generation
    unsigned long seen = 0;
  };
  static bool can_run(const Worker& w) { return w.busy && !(w.waiting && *w.waiting == w.seen); }
  void add_worker(unsigned i) {
    workers_.push_back(std::make_unique<Worker>());
    Worker* self = workers_.back().get();
    self->fiber = boost::context::fiber(std::allocator_arg, boost::context::protected_fixedsize_stack(kStackBytes),
                                        [this, self, i](boost::context::fiber&& sink) {
                                          self->sink = std::move(sink);
                                          for (;;) {
                                            (*job_)(i);
                                            self->busy = false;
                                            yield();
                                          }
                                          return std::move(self->sink);
                                        });
  }
  pid_t pid_ = getpid();
  std::vector<std::unique_ptr<Worker>> workers_;
  const std::function<void(unsigned)>* job_ = nullptr;
  Worker* current_ = nullptr;
};
inline void emu_wait_while(const unsigned long& generation, unsigned long seen) {
  EmuFiberPool::running->yield(&generation, seen);
}
#endif

// Launch: blocks sequentially, threads concurrent. blockDim.x pooled
// emulated threads run every block in turn (block y-major, x-minor), meeting
// at a barrier between blocks, where the shared memory is filled with 0xff
// again, as a fresh block's would be.
template <typename F>
void emu_launch(dim3 grid, unsigned threads, std::size_t smem_bytes, F&& kernel) {
  const unsigned blocks = grid.x * grid.y;
  if (blocks == 0) return;
  // The block's shared memory ends (128-byte rounded) at kEmuGuardBytes
  // that are never readable: a kernel reading or writing past the launch's
  // dynamic size (a launcher asking for too little) faults.
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t rounded = (smem_bytes + 127) / 128 * 128, len = (rounded + page - 1) / page * page;
  void* raw = mmap(nullptr, len + kEmuGuardBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED || mprotect(static_cast<unsigned char*>(raw) + len, kEmuGuardBytes, PROT_NONE) != 0)
    std::abort();
  const auto unmap = [len](unsigned char* p) { munmap(p, len + kEmuGuardBytes); };
  std::unique_ptr<unsigned char, decltype(unmap)> sm(static_cast<unsigned char*>(raw), unmap);
  unsigned char* base = sm.get() + len - rounded;
  emu_smem_guard = sm.get() + len;
  std::memset(base, 0xff, smem_bytes);
  EmuBlock blk;
  EmuBarrier bb(threads);
  std::vector<std::unique_ptr<EmuBarrier>> wb;
  for (unsigned w = 0; w < threads / 32; ++w) {
#ifdef EMU_OS_THREADS
    wb.emplace_back(new EmuBarrier(32));
#else
    wb.emplace_back(new EmuBarrier(32, 32 * w));
#endif
    blk.warp_bar[w] = wb.back().get();
  }
  blk.block_bar = &bb;
  const auto refill = [base, smem_bytes]() noexcept { std::memset(base, 0xff, smem_bytes); };
#ifdef EMU_OS_THREADS
  std::barrier<decltype(refill)> between(threads, refill);
#else
  EmuBarrier between(threads, 0, refill);
#endif
  const std::function<void(unsigned)> body = [&](unsigned t) {
    threadIdx = {t, 0, 0};
    gridDim = grid;
    blockDim = {threads, 1, 1};
    emu_smem = base;
    emu_smem_base = base;
    emu_smem_bytes = smem_bytes;
    emu_blk = &blk;
    for (unsigned k = 0; k < blocks; ++k) {
      blockIdx = {k % grid.x, k / grid.x, 0};
      kernel();
      if (emu_block_exit) emu_block_exit();
      between.arrive_and_wait();
    }
    emu_blk = nullptr;
  };
#ifdef EMU_OS_THREADS
  EmuThreadPool::get().run(threads, body);
#else
  EmuFiberPool::get().run(threads, body);
#endif
}
