#include "megazero/optim/loss_scaler.h"

#include <algorithm>

namespace megazero::optim {

LossScaler::LossScaler(const LossScalerConfig& cfg)
    : cfg_(cfg),
      scale_(cfg.constant_scale > 0 ? cfg.constant_scale
             : cfg.dynamic          ? cfg.initial_scale
                                    : 1.0),
      hysteresis_left_(cfg.hysteresis) {}

void LossScaler::update(bool overflow) {
  if (!cfg_.dynamic) {
    if (overflow) ++skipped_;
    return;
  }
  if (overflow) {
    ++skipped_;
    good_steps_ = 0;
    // Megatron's hysteresis: back off only once the budget of tolerated
    // overflows is used up (the step is skipped either way).
    if (--hysteresis_left_ <= 0) scale_ = std::max(cfg_.min_scale, scale_ / 2);
    return;
  }
  if (++good_steps_ % cfg_.window == 0) {
    scale_ *= 2;
    hysteresis_left_ = cfg_.hysteresis;
  }
}

}  // namespace megazero::optim
