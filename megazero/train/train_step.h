// One training iteration: the micro-batches of this DP rank through forward
// and backward (gradient accumulation), then the ZeRO optimizer step.
//
// Every micro-batch's loss is the mean over its tokens (with --eod-mask-loss,
// over the tokens it keeps: a weighted mean); the iteration's loss
// is the mean over the global batch, so each backward is scaled by
// 1 / (micro-batches x DP size) and the DP reductions sum. With fp16 the loss
// is also multiplied by the loss scale, which the optimizer divides out.
#pragma once

#include <functional>
#include <vector>

#include "layers/gpt_model.h"
#include "megazero/optim/loss_scaler.h"
#include "megazero/optim/lr_schedule.h"
#include "megazero/zero/zero_engine.h"

namespace megazero::train {

struct MicroBatch {
  Tensor ids, targets;    // int64 [B*S]
  Tensor loss_weights;    // --eod-mask-loss: [B*S] (train/loss_mask.h), else undefined
  layers::StepInfo step;  // iteration, global sample offset, B, S
};

struct StepResult {
  double loss = 0;  // mean over the global batch (all DP ranks)
  double lr = 0;
  double weight_decay = 0;  // the step's (it can follow a schedule)
  double loss_scale = 1;
  zero::StepStats stats;
  // Seconds of this rank's step by phase; exposed_comm is the DP communication
  // the rank waited for (inside backward and optimizer).
  double forward_s = 0, backward_s = 0, optimizer_s = 0, exposed_comm_s = 0;
  // Times the host waited for the device's queue to drain from the first
  // forward to the loss's read-back (Device::host_waits): on a GPU each is a
  // gap in which no kernel is queued. 0 on host memory.
  std::int64_t host_waits = 0;
  // Host seconds to issue every micro-batch's forward and backward (the
  // host's clock; on a GPU the kernels run behind it). Near the device's
  // forward + backward time, the GPU waited for launches (CUDA graphs would
  // help); well below it, the launch cost is hidden.
  double host_issue_s = 0;
};

struct OptimizerSettings {
  optim::AdamConfig adam;
  optim::LrSchedule lr;
  double clip_grad = 1.0;  // --clip-grad; 0 = off
  // The iteration Adam's moments started from (0, or the checkpoint's with
  // --no-load-optim): the bias correction counts steps from it.
  std::int64_t optimizer_start_iteration = 0;
  // When set, the learning rate of an iteration (the trainer's with a
  // batch-size ramp-up, which follows the samples consumed); else lr.at.
  std::function<double(std::int64_t iteration)> lr_at = {};
  // When set, the weight decay of an iteration (Megatron's
  // --weight-decay-incr-style linear/cosine); else adam.weight_decay.
  std::function<double(std::int64_t iteration)> weight_decay_at = {};
};

// while_optimizer_runs, when given, is called once the optimizer step is
// issued and before the step's one read-back of the loss waits for it: on a
// GPU the host's work in it (the trainer makes the next iteration's batch
// there) overlaps the device's AdamW instead of leaving the device idle
// between steps. It runs on every rank at the same point of the step, so it
// may hold collectives.
StepResult train_step(layers::GPTModel& model, zero::ZeroEngine& engine, Communicator& dp,
                      const std::vector<MicroBatch>& micro_batches, const OptimizerSettings& opt,
                      optim::LossScaler& scaler, std::int64_t iteration,
                      const std::function<void()>& while_optimizer_runs = {});

}  // namespace megazero::train
