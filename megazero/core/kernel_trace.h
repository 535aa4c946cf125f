// What a device ran, kernel by kernel, with its own timestamps: the records of
// a device's kernel trace (Device::start_kernel_trace / stop_kernel_trace;
// the CUDA device records through CUPTI's activity API, at the GPU's real
// clocks and with kernels queued as in training, unlike a replaying profiler),
// and the summary pretrain_gpt --profile prints: the share of the window the
// device was busy, the idle gaps between its work (what launch overheads cost,
// hence what CUDA graphs could still win), and the time of each kernel name.
// Plain C++: the summary is tested on the CPU with made-up records.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace megazero {

enum class TraceKind : std::uint8_t { Kernel, Copy, Fill };

struct TraceRecord {
  std::string name;  // a kernel's demangled name without its parameters; "memcpy HtoD" etc.
  TraceKind kind = TraceKind::Kernel;
  std::uint64_t start_ns = 0, end_ns = 0;  // the device's clock
  // Whose kernel: "megazero", "cuBLAS", "cuDNN", "NCCL", "CUB" or "other"
  // (kernel_library); copies and fills need none.
  std::string library;
};

// Whose kernel a full demangled name is, by its namespace or prefix: ours
// live in namespace megazero, cuBLAS's are nvjet/cutlass/gemm kernels,
// cuDNN's carry "cudnn", NCCL's "nccl", CUB's namespace cub.
std::string kernel_library(const std::string& demangled);

struct KernelTrace {
  std::uint64_t window_start_ns = 0, window_end_ns = 0;  // same clock as the records
  std::vector<TraceRecord> records;
  std::uint64_t dropped = 0;  // records the tracer lost (its buffers ran full)
};

struct KernelTraceRow {
  std::string name, library;
  TraceKind kind = TraceKind::Kernel;
  std::int64_t calls = 0;
  std::uint64_t total_ns = 0;
};

// One idle stretch and where it fell: `at_ns` from the window's start, the
// record whose end began it and the one whose start ended it ("(window
// start)" / "(window end)" at the edges).
struct TraceGap {
  std::uint64_t ns = 0, at_ns = 0;
  std::string after, before;
};

// Idle stretches are counted in three bins by length: under 2 us (what a
// dependent launch costs when the host is ahead), 2-10 us, and longer (the
// device waited for the host: a synchronisation, a slow launch sequence).
struct KernelTraceSummary {
  std::uint64_t window_ns = 0;
  std::uint64_t busy_ns = 0;    // the union of the records' intervals inside the window
  std::uint64_t kernel_ns = 0;  // kernels' durations summed (over busy_ns if they overlapped)
  std::int64_t kernels = 0, copies = 0, fills = 0;
  std::int64_t gaps[3] = {0, 0, 0};
  std::uint64_t gap_ns[3] = {0, 0, 0};
  std::uint64_t dropped = 0;
  // The kLongestGaps longest idle stretches, longest first (ties: earlier
  // first): which kernels a long wait sits between says what the device
  // waited for (a host read-back, a stream's event, the trace's own edges).
  static constexpr std::size_t kLongestGaps = 10;
  std::vector<TraceGap> longest_gaps;
  std::vector<KernelTraceRow> rows;  // by total time, longest first; ties by name
  // Kernels' time by library, then "copies" and "fills": longest first.
  std::vector<std::pair<std::string, std::uint64_t>> by_library;
};

// Records are clipped to the window; records wholly outside it are left out.
KernelTraceSummary summarize(const KernelTrace& trace);

// The printed report: one line of totals (busy share, idle gaps), the
// longest gaps over 10 us with their neighbours, then the `top` longest rows
// with their share of the window. `what` names the window
// (e.g. "rank 0, iterations 11-12").
std::string format_summary(const KernelTraceSummary& s, const std::string& what, std::size_t top = 30);

// Every row as CSV: name,library,kind,calls,total_ms,ms_per_call,share_of_window.
std::string summary_csv(const KernelTraceSummary& s);

}  // namespace megazero
