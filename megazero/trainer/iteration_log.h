// What a run reports every --log-interval iterations about the iterations
// since its last report (the window): Megatron's iteration line, the timers
// line (min/max over ranks), one --metrics-file record and the TensorBoard
// scalars (Megatron's tags where it has them). report() is collective: every
// rank calls it at the same iterations (spreads and peaks are reduced over
// the world); rank 0 writes.
#pragma once

#include <cstdint>
#include <ostream>

#include "megazero/comm/communicator.h"
#include "megazero/train/arguments.h"
#include "megazero/train/tensorboard_writer.h"
#include "megazero/train/train_step.h"

namespace megazero::train {

class IterationLog {
 public:
  struct Setup {
    Communicator* world = nullptr;
    Device* device = nullptr;  // the model's (memory peaks, arena misses, host waits)
    Device* host = nullptr;    // Pa+cpu's host memory
    const TrainArgs* args = nullptr;
    bool root = false;
    // FLOPs a token with the recompute (TFLOP/s) and without (MFU); the peak TFLOP/s a rank.
    double flops_per_token = 0, model_flops_per_token = 0, peak_tflops = 0;
    std::ostream* metrics = nullptr;           // --metrics-file, or none
    TensorBoardWriter* tensorboard = nullptr;  // --tensorboard-dir, or none
  };
  explicit IterationLog(const Setup& s) : s_(s) {}

  // One trained iteration: its wall time, the host's data time, the step's
  // time and the tokens it trained.
  void add(const StepResult& r, double iteration_s, double data_s, double step_s, double tokens);

  // The report after iteration `iteration` (1-based), `last` its step.
  struct Report {
    std::int64_t iteration = 0, consumed_samples = 0, global_batch = 0;
    std::int64_t skipped = 0, nan_iterations = 0;
    double params_norm = 0;  // --log-params-norm
    std::int64_t zeros = 0;  // --log-num-zeros-in-grad
  };
  // Collective. Writes the window's lines and starts a new window.
  void report(const Report& at, const StepResult& last);

 private:
  Setup s_;
  std::int64_t iters_ = 0;
  double time_ = 0, data_ = 0, step_ = 0, fwd_ = 0, bwd_ = 0, opt_ = 0, comm_ = 0, waits_ = 0, issue_ = 0;
  double tokens_ = 0;  // the batch can ramp up: tokens/s and FLOPs count what the window trained
  bool epilogues_reported_ = false, autotune_reported_ = false;
};

}  // namespace megazero::train
