// The product's trainer: what `pretrain_gpt` runs, as a library class, so a
// test can build, train, save and resume a run in-process.
//
//   Trainer t(args, MpiCommunicator::world());  // process groups, data, the printed configuration
//   if (args.dry_run) return 0;                  // (a real world's dry run stops here)
//   t.build();                                   // device (pre-flight, arena), collectives, model, ZeRO, resume
//   return t.train().exit_code;                  // the step loop, evaluations, saves, stop signals
//
// Set-up errors are ConfigErrors agreed by every rank (exit 2 alike); the loop
// stops on a stop signal (exit 5, after a save with --save), on
// --exit-interval / --exit-duration-in-mins (exit 0, after a save), or on a
// NaN loss (exit 2) unless --on-nan-loss skip. The virtual-world planner
// (--dry-run --world-size N) is plan/dry_run.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "megazero/comm/communicator.h"
#include "megazero/train/arguments.h"

namespace megazero::train {

struct TrainResult {
  int exit_code = 0;                         // 0, or kExitStoppedBySignal (5)
  std::int64_t start_iteration = 0;          // the checkpoint's iteration, or 0
  std::int64_t last_iteration = 0;           // the last completed iteration
  std::vector<double> losses;                // the mean loss of each iteration this run trained
  std::vector<double> learning_rates;        // ... its learning rate
  std::vector<double> weight_decays;         // ... its weight decay
  std::vector<std::int64_t> global_batches;  // ... and its global batch (--rampup-batch-size)
  std::int64_t consumed_samples = 0;         // the data position after the last iteration
  double validation_loss = 0;                // the final evaluation's (0 with --eval-iters 0)
  double test_loss = 0;                      // ... on the test split, where --split gives it documents (else 0)
};

// --use-checkpoint-args: rank 0 reads the configuration stored in the
// checkpoint --load (and --ckpt-step) names, and every rank gets it, for
// parse_train_args' checkpoint_config. An AgreedConfigError when there is none.
std::string checkpoint_args_config(const TrainArgs& args, Communicator& world);

class Trainer {
 public:
  // Process groups, data source, math threads; prints the resolved
  // configuration on rank 0. `process_start` is when the program started
  // (--exit-duration-in-mins counts from it).
  Trainer(TrainArgs args, std::unique_ptr<Communicator> world,
          std::chrono::steady_clock::time_point process_start = std::chrono::steady_clock::now());
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // The device (memory pre-flight, --device-arena), the collectives backend,
  // the model, the ZeRO engine and ZeRO-R store, and --load.
  void build();
  // Trains from the loaded iteration to --train-iters (or a stop).
  TrainResult train();
  // The validation loss at `iteration` (--eval-iters micro-batches per rank).
  double evaluate(std::int64_t iteration);
  // A checkpoint of the current state as iteration `iteration` into --save.
  void save(std::int64_t iteration);

  const TrainArgs& args() const;
  Communicator& world();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace megazero::train
