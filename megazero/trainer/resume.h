// --load: the checkpoint a run continues from (or, with --finetune, starts
// from), loaded into the ZeRO engine on any layout, and what that means for
// the run: its iteration and data position, Adam's step count and the loss
// scaler (restored, or started afresh with --no-load-optim), the learning-rate
// schedule reconciled with the checkpoint's (train/arguments.h). Megatron's
// --finetune, --no-load-optim, --ckpt-step, --exit-on-missing-checkpoint and
// --skip-train decide which. Errors are AgreedConfigErrors (every rank holds
// the same manifest); rank 0 (`root`) prints what was loaded.
#pragma once

#include <cstdint>
#include <string>

#include "megazero/checkpoint/checkpoint.h"
#include "megazero/optim/loss_scaler.h"
#include "megazero/train/arguments.h"
#include "megazero/train/train_step.h"
#include "megazero/zero/zero_engine.h"

namespace megazero::train {

struct ResumePoint {
  std::int64_t iteration = 0, consumed_samples = 0;  // where training goes on (0, 0: a fresh start)
};

// Collective over where.world. May change args' learning-rate and
// weight-decay schedule (--use-checkpoint-opt-param-scheduler), and sets
// opt's schedule and optimizer start iteration to match.
ResumePoint resume_from_checkpoint(TrainArgs& args, zero::ZeroEngine& engine, const checkpoint::Placement& where,
                                   optim::LossScaler& scaler, OptimizerSettings& opt, bool root);

// The checkpoint directory a load reads: --load, or its iter_N with --ckpt-step.
std::string load_path(const TrainArgs& args);

// "123.4 MiB/s": a checkpoint's read or write rate for the log.
std::string mib_per_s(double bytes, double seconds);

}  // namespace megazero::train
