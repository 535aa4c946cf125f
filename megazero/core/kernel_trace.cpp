#include "megazero/core/kernel_trace.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <utility>

namespace megazero {
namespace {

const char* kind_name(TraceKind k) {
  switch (k) {
    case TraceKind::Kernel:
      return "kernel";
    case TraceKind::Copy:
      return "copy";
    case TraceKind::Fill:
      return "fill";
  }
  return "?";
}

double ms(std::uint64_t ns) { return static_cast<double>(ns) * 1e-6; }

// CSV: a name with a comma or a quote is quoted, quotes doubled.
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

bool contains_nocase(const std::string& s, const char* what) {
  const std::string w(what);
  return std::search(s.begin(), s.end(), w.begin(), w.end(),
                     [](char a, char b) { return std::tolower(static_cast<unsigned char>(a)) == b; }) != s.end();
}

}  // namespace

std::string kernel_library(const std::string& n) {
  if (n.find("megazero::") != std::string::npos) return "megazero";
  if (contains_nocase(n, "cudnn")) return "cuDNN";
  if (contains_nocase(n, "nccl")) return "NCCL";
  for (const char* p : {"nvjet", "cutlass", "cublas", "gemm", "xmma"})
    if (contains_nocase(n, p)) return "cuBLAS";
  if (n.find("cub::") != std::string::npos) return "CUB";
  return "other";
}

KernelTraceSummary summarize(const KernelTrace& trace) {
  KernelTraceSummary s;
  const std::uint64_t lo = trace.window_start_ns, hi = std::max(trace.window_end_ns, trace.window_start_ns);
  s.window_ns = hi - lo;
  s.dropped = trace.dropped;
  struct Span {
    std::uint64_t a, b;
    const TraceRecord* r;
  };
  std::vector<Span> spans;
  std::map<std::pair<std::string, TraceKind>, KernelTraceRow> by_name;
  for (const TraceRecord& r : trace.records) {
    const std::uint64_t a = std::max(r.start_ns, lo), b = std::min(std::max(r.end_ns, r.start_ns), hi);
    if (r.end_ns <= lo || r.start_ns >= hi || b <= a) continue;
    spans.push_back({a, b, &r});
    KernelTraceRow& row = by_name[{r.name, r.kind}];
    row.name = r.name;
    row.kind = r.kind;
    row.library = r.kind == TraceKind::Kernel ? (r.library.empty() ? "other" : r.library)
                  : r.kind == TraceKind::Copy ? "copies"
                                              : "fills";
    ++row.calls;
    row.total_ns += b - a;
    if (r.kind == TraceKind::Kernel) {
      ++s.kernels;
      s.kernel_ns += b - a;
    } else if (r.kind == TraceKind::Copy) {
      ++s.copies;
    } else {
      ++s.fills;
    }
  }
  // The union of the intervals, and the idle stretches between them (the
  // window's own edges before the first and after the last count too: the
  // device waited there as much as anywhere).
  std::stable_sort(spans.begin(), spans.end(),
                   [](const Span& x, const Span& y) { return x.a != y.a ? x.a < y.a : x.b < y.b; });
  std::uint64_t cursor = lo;
  const TraceRecord* last = nullptr;  // the record whose end is the cursor
  const auto name_of = [](const TraceRecord* r, const char* edge) {
    if (!r) return std::string(edge);
    return r->kind == TraceKind::Kernel ? r->name : r->name + " (" + kind_name(r->kind) + ")";
  };
  const auto idle = [&](std::uint64_t from, std::uint64_t to, const TraceRecord* next) {
    if (to <= from) return;
    const std::uint64_t d = to - from;
    const int bin = d < 2000 ? 0 : d < 10000 ? 1 : 2;
    ++s.gaps[bin];
    s.gap_ns[bin] += d;
    // Keep the longest few: a bounded insertion (ties keep the earlier).
    auto& g = s.longest_gaps;
    if (g.size() == KernelTraceSummary::kLongestGaps && d <= g.back().ns) return;
    const auto at = std::find_if(g.begin(), g.end(), [&](const TraceGap& x) { return x.ns < d; });
    g.insert(at, TraceGap{d, from - lo, name_of(last, "(window start)"), name_of(next, "(window end)")});
    if (g.size() > KernelTraceSummary::kLongestGaps) g.pop_back();
  };
  for (const Span& sp : spans) {
    if (sp.a > cursor) idle(cursor, sp.a, sp.r);
    if (sp.b > cursor) {
      s.busy_ns += sp.b - std::max(sp.a, cursor);
      cursor = sp.b;
      last = sp.r;
    }
  }
  idle(cursor, hi, nullptr);
  std::map<std::string, std::uint64_t> libraries;
  for (auto& [key, row] : by_name) {
    libraries[row.library] += row.total_ns;
    s.rows.push_back(std::move(row));
  }
  s.by_library.assign(libraries.begin(), libraries.end());
  std::sort(s.by_library.begin(), s.by_library.end(), [](const auto& x, const auto& y) {
    return x.second != y.second ? x.second > y.second : x.first < y.first;
  });
  std::sort(s.rows.begin(), s.rows.end(), [](const KernelTraceRow& x, const KernelTraceRow& y) {
    return x.total_ns != y.total_ns ? x.total_ns > y.total_ns : x.name < y.name;
  });
  return s;
}

std::string format_summary(const KernelTraceSummary& s, const std::string& what, std::size_t top) {
  const double window = ms(s.window_ns);
  const auto share = [&](std::uint64_t ns) {
    return s.window_ns ? 100.0 * static_cast<double>(ns) / static_cast<double>(s.window_ns) : 0.0;
  };
  char line[512];
  std::string out;
  std::snprintf(line, sizeof line,
                "kernel trace, %s: the device busy %.1f%% of %.3f ms (%lld kernels, %.3f ms of them; %lld copies, "
                "%lld fills)\n",
                what.c_str(), share(s.busy_ns), window, static_cast<long long>(s.kernels), ms(s.kernel_ns),
                static_cast<long long>(s.copies), static_cast<long long>(s.fills));
  out += line;
  std::snprintf(line, sizeof line,
                "  idle %.3f ms: %lld gaps under 2 us (%.3f ms), %lld of 2-10 us (%.3f ms), %lld over 10 us "
                "(%.3f ms)\n",
                ms(s.gap_ns[0] + s.gap_ns[1] + s.gap_ns[2]), static_cast<long long>(s.gaps[0]), ms(s.gap_ns[0]),
                static_cast<long long>(s.gaps[1]), ms(s.gap_ns[1]), static_cast<long long>(s.gaps[2]), ms(s.gap_ns[2]));
  out += line;
  if (!s.by_library.empty()) {
    out += "  by library:";
    for (std::size_t i = 0; i < s.by_library.size(); ++i) {
      std::snprintf(line, sizeof line, "%s %s %.3f ms (%.1f%%)", i ? "," : "", s.by_library[i].first.c_str(),
                    ms(s.by_library[i].second), share(s.by_library[i].second));
      out += line;
    }
    out += "\n";
  }
  // Where the long waits fell (over 10 us: the third bin).
  const auto shortened = [](std::string n) { return n.size() > 60 ? n.substr(0, 57) + "..." : n; };
  bool titled = false;
  for (const TraceGap& g : s.longest_gaps) {
    if (g.ns < 10000) break;
    if (!titled) out += "  longest gaps (ms, at ms into the window: after -> before):\n";
    titled = true;
    std::snprintf(line, sizeof line, "    %7.3f at %8.3f: %s -> %s\n", ms(g.ns), ms(g.at_ns),
                  shortened(g.after).c_str(), shortened(g.before).c_str());
    out += line;
  }
  if (s.dropped)
    out += "  WARNING: " + std::to_string(s.dropped) +
           " records were lost (the tracer's buffers ran full): the totals above are short\n";
  out += "        ms   calls  share  us/call  name\n";
  for (std::size_t i = 0; i < s.rows.size() && i < top; ++i) {
    const KernelTraceRow& r = s.rows[i];
    std::string name = r.kind == TraceKind::Kernel ? r.name : r.name + " (" + kind_name(r.kind) + ")";
    if (name.size() > 110) name = name.substr(0, 107) + "...";
    std::snprintf(line, sizeof line, "  %8.3f  %6lld  %4.1f%%  %7.1f  %s\n", ms(r.total_ns),
                  static_cast<long long>(r.calls), share(r.total_ns),
                  static_cast<double>(r.total_ns) * 1e-3 / static_cast<double>(r.calls), name.c_str());
    out += line;
  }
  if (s.rows.size() > top) {
    std::uint64_t rest = 0;
    std::int64_t calls = 0;
    for (std::size_t i = top; i < s.rows.size(); ++i) {
      rest += s.rows[i].total_ns;
      calls += s.rows[i].calls;
    }
    std::snprintf(line, sizeof line, "  %8.3f  %6lld  %4.1f%%           (%zu more names)\n", ms(rest),
                  static_cast<long long>(calls), share(rest), s.rows.size() - top);
    out += line;
  }
  return out;
}

std::string summary_csv(const KernelTraceSummary& s) {
  std::string out = "name,library,kind,calls,total_ms,ms_per_call,share_of_window\n";
  char line[128];
  for (const KernelTraceRow& r : s.rows) {
    std::snprintf(line, sizeof line, ",%s,%s,%lld,%.6f,%.6f,%.6f\n", r.library.c_str(), kind_name(r.kind),
                  static_cast<long long>(r.calls), ms(r.total_ns), ms(r.total_ns) / static_cast<double>(r.calls),
                  s.window_ns ? static_cast<double>(r.total_ns) / static_cast<double>(s.window_ns) : 0.0);
    out += csv_field(r.name) + line;
  }
  return out;
}

}  // namespace megazero
