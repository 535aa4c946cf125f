#include "megazero/cuda/kernel_trace.h"

#include <cupti.h>
#include <cxxabi.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "megazero/core/error.h"

namespace megazero::cuda {
namespace {

// What CUPTI's callbacks hand over (they run on CUPTI's thread, or on ours
// inside a flush: never call CUPTI while holding the lock).
std::mutex g_mu;
std::vector<TraceRecord> g_records;
std::uint64_t g_dropped = 0;
bool g_tracing = false, g_registered = false;
std::uint64_t g_window_start = 0;

// 8 MB a buffer holds ~60k kernel records: two GPT-2 medium iterations are
// ~1900 kernels, so one buffer a window, and more are asked for as needed.
constexpr std::size_t kBufferBytes = std::size_t{8} << 20;

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* s = nullptr;
  cuptiGetResultString(r, &s);
  throw ConfigError(detail::concat("CUPTI's ", what, " failed: ", s ? s : "unknown error",
                                   " (--profile records the GPU's kernels through the CUDA toolkit's libcupti, "
                                   "which must match the driver; leave --profile out to train without it)"));
}

std::string demangled(const char* mangled) {
  if (!mangled) return "(unnamed kernel)";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : mangled;
  std::free(d);
  return s;
}

// "void megazero::cuda::(anonymous namespace)::k<float, 2>(float const*, long)"
// -> "k<float, 2>": the names a reader knows from the source.
std::string kernel_name(std::string s) {
  if (!s.empty() && s.back() == ')') {  // the parameter list, brackets balanced from the end
    int depth = 0;
    for (std::size_t i = s.size(); i-- > 0;) {
      depth += s[i] == ')' ? 1 : s[i] == '(' ? -1 : 0;
      if (depth == 0) {
        s.erase(i);
        break;
      }
    }
  }
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  for (const std::string drop : {"(anonymous namespace)::", "megazero::cuda::", "megazero::"}) {
    for (std::size_t at; (at = s.find(drop)) != std::string::npos;) s.erase(at, drop.size());
  }
  return s;
}

const char* copy_name(std::uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
      return "memcpy HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return "memcpy PtoP";
    default:
      return "memcpy";
  }
}

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, kBufferBytes));  // CUPTI wants 8-byte alignment
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext context, std::uint32_t stream, std::uint8_t* buffer, std::size_t,
                               std::size_t valid) {
  std::vector<TraceRecord> got;
  CUpti_Activity* rec = nullptr;
  while (valid > 0 && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
        const std::string full = demangled(k->name);
        got.push_back({kernel_name(full), TraceKind::Kernel, k->start, k->end, kernel_library(full)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
        got.push_back({copy_name(m->copyKind), TraceKind::Copy, m->start, m->end, ""});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
        got.push_back({"memset", TraceKind::Fill, m->start, m->end, ""});
        break;
      }
      default:
        break;
    }
  }
  std::size_t lost = 0;
  if (context) (void)cuptiActivityGetNumDroppedRecords(context, stream, &lost);
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_tracing) return;  // a late buffer of a trace already stopped
  for (auto& r : got) g_records.push_back(std::move(r));
  g_dropped += lost;
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};

}  // namespace

void trace_start() {
  bool register_now = false;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    MZ_REQUIRE(!g_tracing, "a kernel trace is already running in this process (one at a time)");
    g_tracing = true;
    g_records.clear();
    g_dropped = 0;
    register_now = !g_registered;
  }
  try {
    if (register_now) {
      check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register callbacks");
      std::lock_guard<std::mutex> lock(g_mu);
      g_registered = true;
    }
    for (CUpti_ActivityKind k : kKinds) check(cuptiActivityEnable(k), "enable activity records");
    std::uint64_t now = 0;
    check(cuptiGetTimestamp(&now), "timestamp");
    std::lock_guard<std::mutex> lock(g_mu);
    g_window_start = now;
  } catch (...) {
    std::lock_guard<std::mutex> lock(g_mu);
    g_tracing = false;
    throw;
  }
}

KernelTrace trace_stop() {
  std::uint64_t now = 0;
  const CUptiResult ts = cuptiGetTimestamp(&now);
  for (CUpti_ActivityKind k : kKinds) (void)cuptiActivityDisable(k);
  const CUptiResult flushed = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  KernelTrace t;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    MZ_REQUIRE(g_tracing, "trace_stop without a kernel trace running");
    g_tracing = false;
    t.window_start_ns = g_window_start;
    t.window_end_ns = now;
    t.records = std::move(g_records);
    g_records.clear();
    t.dropped = g_dropped;
  }
  check(ts, "timestamp");
  check(flushed, "flush");
  return t;
}

}  // namespace megazero::cuda
