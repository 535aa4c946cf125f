// Dynamic loss scaling for fp16 (Micikevicius et al.). The loss is multiplied
// by `scale` before backward; if any gradient on any rank overflows, every rank
// skips the step and the scale backs off; after `window` good steps it grows.
// Defaults as Megatron/DeepSpeed: window 1000, hysteresis 2, min scale 1;
// initial scale 2^32 (Megatron; DeepSpeed uses 2^16). A constant scale
// (Megatron's --loss-scale, fp16 or bf16) never changes; an overflowing step
// is still skipped and counted.
#pragma once

#include <cstdint>

namespace megazero::optim {

struct LossScalerConfig {
  bool dynamic = false;                 // on for fp16 without a constant scale
  double constant_scale = 0;            // --loss-scale (Megatron's): a fixed scale; 0 = none
  double initial_scale = 4294967296.0;  // --initial-loss-scale
  std::int64_t window = 1000;           // --loss-scale-window
  int hysteresis = 2;                   // --hysteresis: overflows tolerated before backing off
  double min_scale = 1.0;               // --min-loss-scale
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerConfig& cfg);
  double scale() const { return scale_; }
  // Call once per step with the agreed overflow flag.
  void update(bool overflow);
  std::int64_t skipped_steps() const { return skipped_; }

  // Everything that evolves, for checkpoints (resume must be bit-exact).
  struct State {
    bool dynamic = false;
    double scale = 1;
    std::int64_t good_steps = 0, skipped = 0;
    int hysteresis_left = 0;
  };
  State state() const { return {cfg_.dynamic, scale_, good_steps_, skipped_, hysteresis_left_}; }
  // The scale continues only from a dynamic (fp16) run into a dynamic run; a
  // bf16/fp32 checkpoint loaded with --fp16 starts from --initial-loss-scale.
  void restore(const State& s) {
    skipped_ = s.skipped;
    if (!cfg_.dynamic || !s.dynamic) return;
    scale_ = s.scale;
    good_steps_ = s.good_steps;
    hysteresis_left_ = s.hysteresis_left;
  }

 private:
  LossScalerConfig cfg_;
  double scale_;
  std::int64_t good_steps_ = 0, skipped_ = 0;
  int hysteresis_left_;
};

}  // namespace megazero::optim
