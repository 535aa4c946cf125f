// The global batch of each iteration: constant, or Megatron's batch-size
// ramp-up (--rampup-batch-size START INCREMENT SAMPLES, as its GPT-3 scripts
// pass): START samples at first, INCREMENT more each time another
// SAMPLES / ((GLOBAL - START) / INCREMENT) samples have been consumed, and the
// full --global-batch-size once more than SAMPLES have. The batch depends only
// on the samples consumed before the iteration, so a resumed run (which
// restores them) continues the ramp exactly.
//
// Megatron divides SAMPLES by the number of increments in floating point; the
// step here is exact integer arithmetic (floor(consumed x increments /
// SAMPLES)), which agrees except where consumed lands exactly on a step's
// boundary and the float quotient rounds below it (there the ramp steps one
// iteration earlier here).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megazero::train {

struct BatchSchedule {
  std::int64_t global = 0;                                  // --global-batch-size: the batch after the ramp
  std::int64_t start = 0, increment = 0, ramp_samples = 0;  // --rampup-batch-size; start 0 = no ramp

  bool ramps() const { return start > 0; }
  // The global batch of the iteration that begins after `consumed` samples.
  std::int64_t batch_at(std::int64_t consumed) const;
  // Samples consumed by the first `iterations` iterations from the start.
  std::int64_t consumed_after(std::int64_t iterations) const;
  // Megatron's --train-samples in iterations: the ramp's iterations while the
  // samples consumed are within the ramp and the total, then whole full
  // batches of what remains (its update_train_iters).
  std::int64_t iterations_for(std::int64_t train_samples) const;
  // Megatron's three values, checked against `global` (ConfigErrors name the
  // flag and the fix). Empty: no ramp.
  static BatchSchedule parse(const std::vector<std::string>& rampup, std::int64_t global);
  // Every batch of the ramp must split into micro-batches on every DP rank.
  void check_layout(std::int64_t micro_batch, std::int64_t dp) const;
  // "16 -> 1536 in steps of 16, one every 61677.6 samples (5859375 samples)"
  std::string describe() const;
};

}  // namespace megazero::train
