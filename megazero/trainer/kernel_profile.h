// pretrain_gpt --profile: the device's kernel trace (Device::start_kernel_trace)
// over the iterations after --profile-step-start up to --profile-step-end, on
// the --profile-ranks, then its summary (core/kernel_trace.h) printed by each
// recording rank and, with --profile-file, every row as CSV. What Megatron's
// --profile hands to Nsight Systems, in the run's own log: the GPU's busy
// share of the window, the idle gaps between its kernels (launch overheads,
// host waits), and each kernel's time at real clocks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "megazero/core/device.h"
#include "megazero/train/arguments.h"

namespace megazero::train {

class IterationProfile {
 public:
  // first_done: the iterations done before this run (a resumed run's
  // checkpoint); a window that starts before it is refused.
  IterationProfile(const TrainArgs& args, int world_rank, int world_size, std::shared_ptr<Device> device,
                   std::int64_t first_done = 0);
  // Stops a trace the loop left running (an early exit) without a report.
  ~IterationProfile();
  IterationProfile(const IterationProfile&) = delete;
  IterationProfile& operator=(const IterationProfile&) = delete;

  // At set-up, inside run_consistently (so every rank stops alike): a trial
  // trace on each recording rank (CUPTI loads and records) and a trial write
  // of --profile-file. Later failures only warn: one rank throwing mid-run
  // would leave the others waiting in their next collective.
  void check_ready();
  // `iteration` counts from 1, as the log does: before it runs / after it ran.
  void before(std::int64_t iteration);
  void after(std::int64_t iteration);
  // The loop ended after `last` (an exit or stop before --profile-step-end):
  // stop and report what was recorded.
  void finish(std::int64_t last);

 private:
  void report(std::int64_t last);
  void give_up(const std::exception& e);
  std::string csv_path() const;

  bool on_ = false, tracing_ = false;
  std::int64_t start_ = 0, end_ = 0;
  int rank_ = 0, recording_ranks_ = 1;
  std::string file_;
  std::shared_ptr<Device> device_;
};

}  // namespace megazero::train
