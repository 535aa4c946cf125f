// Learning-rate schedule as Megatron defines it: linear warmup from 0 (or --lr-warmup-init) to
// --lr over --lr-warmup-iters, then decay to --min-lr over the remaining
// iterations (--lr-decay-iters, default --train-iters): cosine, linear,
// constant, inverse-square-root (--lr times sqrt(warmup / iteration), floored
// at --min-lr), or WSD (warmup-stable-decay: --lr until the last
// --lr-wsd-decay-iters before --lr-decay-iters, then an anneal to --min-lr
// shaped by --lr-wsd-decay-style). Past --lr-decay-iters every decaying style
// holds --min-lr.
#pragma once

#include <cstdint>
#include <string>

namespace megazero::optim {

struct LrSchedule {
  double max_lr = 1e-4;
  double min_lr = 0.0;
  double init_lr = 0.0;  // --lr-warmup-init (Megatron's): where the linear warmup starts
  // --lr-warmup-style: linear (Megatron's), or log (DeepSpeed's WarmupLR
  // default: the rise's share after iteration i is log(i + 2) / log(warmup + 1),
  // a step ahead as the linear one is).
  std::string warmup_style = "linear";
  std::int64_t warmup_iters = 0;
  std::int64_t decay_iters = 1;  // iteration at which min_lr is reached
  std::string style = "cosine";  // cosine | linear | constant | inverse-square-root | WSD
  // WSD's anneal: its length in iterations (it ends at decay_iters) and its
  // shape, Megatron's four: exponential (2 * 0.5^r - 1), linear, cosine and
  // minus_sqrt (1 - sqrt(r)), r the share of the anneal done.
  std::int64_t wsd_decay_iters = 0;
  std::string wsd_style = "exponential";

  // Learning rate for 0-based iteration `it`.
  double at(std::int64_t it) const;
  // Learning rate after `consumed` samples of a run whose full batch is
  // `full_batch`: the schedule read at iteration consumed / full_batch, a
  // fraction while the batch ramps up (Megatron counts its schedule in samples,
  // warmup and decay iterations times the global batch). For a constant batch,
  // at(consumed / full_batch) exactly.
  double at_samples(std::int64_t consumed, std::int64_t full_batch) const;
  // Throws ConfigError naming the flag for bad values.
  void validate() const;
};

// Megatron's weight-decay schedule: from --start-weight-decay to
// --end-weight-decay over the first --weight-decay-incr-iters iterations
// (default --train-iters), constant, linear or cosine, then the end value;
// read in samples like the learning rate (a batch-size ramp-up moves it less
// per iteration).
struct WeightDecaySchedule {
  double start = 0.01, end = 0.01;
  std::string style = "constant";  // constant | linear | cosine
  std::int64_t incr_iters = 1;

  double at_samples(std::int64_t consumed, std::int64_t full_batch) const;
  void validate() const;
};

}  // namespace megazero::optim
