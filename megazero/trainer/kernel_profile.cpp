#include "megazero/trainer/kernel_profile.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "megazero/core/error.h"

namespace megazero::train {

IterationProfile::IterationProfile(const TrainArgs& args, int world_rank, int world_size,
                                   std::shared_ptr<Device> device, std::int64_t first_done)
    : start_(args.profile_step_start),
      end_(args.profile_step_end),
      rank_(world_rank),
      file_(args.profile_file),
      device_(std::move(device)) {
  if (!args.profile) return;
  MZ_REQUIRE(first_done <= start_, "--profile-step-start ", start_, " is before this run's first iteration ",
             first_done + 1, " (resumed from a checkpoint at iteration ", first_done,
             "): nothing would be recorded; pass --profile-step-start ", first_done,
             " or later (and --profile-step-end after it)");
  auto ranks = args.profiled_ranks();
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  recording_ranks_ = static_cast<int>(std::count_if(ranks.begin(), ranks.end(), [&](int r) { return r < world_size; }));
  on_ = std::find(ranks.begin(), ranks.end(), world_rank) != ranks.end();
}

IterationProfile::~IterationProfile() {
  if (!tracing_) return;
  try {
    (void)device_->stop_kernel_trace();
  } catch (...) {  // a destructor reports nothing: the loop's own error is on its way
  }
}

std::string IterationProfile::csv_path() const {
  return recording_ranks_ > 1 ? file_ + ".rank" + std::to_string(rank_) : file_;
}

void IterationProfile::check_ready() {
  if (!on_) return;
  device_->start_kernel_trace();
  (void)device_->stop_kernel_trace();
  if (file_.empty()) return;
  const std::string tmp = csv_path() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "name\n";
    MZ_REQUIRE(out.good(), "--profile-file: cannot write ", tmp, " (does its directory exist, and is it writable?)");
  }
  std::filesystem::remove(tmp);
}

void IterationProfile::give_up(const std::exception& e) {
  std::printf("WARNING: rank %d: --profile stopped, training goes on without it: %s\n", rank_, e.what());
  std::fflush(stdout);
  on_ = tracing_ = false;
}

void IterationProfile::before(std::int64_t iteration) {
  if (!on_ || tracing_ || iteration != start_ + 1) return;
  try {
    device_->start_kernel_trace();
    tracing_ = true;
  } catch (const std::exception& e) {
    give_up(e);
  }
}

void IterationProfile::after(std::int64_t iteration) {
  if (tracing_ && iteration == end_) report(iteration);
}

void IterationProfile::finish(std::int64_t last) {
  if (tracing_) report(last);
}

void IterationProfile::report(std::int64_t last) {
  tracing_ = false;
  KernelTrace trace;
  try {
    trace = device_->stop_kernel_trace();
  } catch (const std::exception& e) {
    give_up(e);
    return;
  }
  const KernelTraceSummary s = summarize(trace);
  const std::int64_t first = start_ + 1, n = last - start_;
  const std::string what = detail::concat("rank ", rank_, ", iterations ", first, "-", last, " (", n,
                                          last < end_ ? ", stopped early" : "", "), ", device_->name());
  std::string text = format_summary(s, what);
  if (n > 0) {
    char per[96];
    std::snprintf(per, sizeof per, "  per iteration: %.3f ms, the device busy %.3f ms of it\n",
                  static_cast<double>(s.window_ns) * 1e-6 / static_cast<double>(n),
                  static_cast<double>(s.busy_ns) * 1e-6 / static_cast<double>(n));
    text.insert(text.find('\n') + 1, per);
  }
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
  if (file_.empty()) return;
  // Written beside, then renamed: a reader never sees half a file.
  const std::string path = csv_path(), tmp = path + ".tmp";
  bool ok = false;
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << summary_csv(s);
    ok = out.good();
  }
  std::error_code ec;
  if (ok) std::filesystem::rename(tmp, path, ec);
  if (ok && !ec)
    std::printf("  kernel trace rows written to %s\n", path.c_str());
  else
    std::printf("WARNING: rank %d: --profile-file: could not write %s%s%s\n", rank_, path.c_str(), ec ? ": " : "",
                ec ? ec.message().c_str() : "");
  std::fflush(stdout);
}

}  // namespace megazero::train
