#include "megazero/optim/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "megazero/core/error.h"

namespace megazero::optim {

double LrSchedule::at(std::int64_t it) const {
  if (warmup_iters > 0 && it < warmup_iters)
    return max_lr * static_cast<double>(it + 1) / static_cast<double>(warmup_iters);
  if (style == "constant") return max_lr;
  const double span = static_cast<double>(std::max<std::int64_t>(1, decay_iters - warmup_iters));
  const double t = std::min(1.0, static_cast<double>(it - warmup_iters) / span);
  const double coef = style == "linear" ? 1.0 - t : 0.5 * (1.0 + std::cos(std::numbers::pi * t));
  return min_lr + coef * (max_lr - min_lr);
}

void LrSchedule::validate() const {
  MZ_REQUIRE(std::isfinite(max_lr) && max_lr >= 0, "--lr must be a finite non-negative number, got ", max_lr);
  MZ_REQUIRE(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= max_lr, "--min-lr ", min_lr, " must be in [0, --lr ",
             max_lr, "]");
  MZ_REQUIRE(warmup_iters >= 0, "--lr-warmup-iters must be non-negative, got ", warmup_iters);
  MZ_REQUIRE(decay_iters >= 0, "--lr-decay-iters must be non-negative, got ", decay_iters);
  MZ_REQUIRE(style == "cosine" || style == "linear" || style == "constant", "--lr-decay-style '", style,
             "' is not one of cosine, linear, constant");
}

}  // namespace megazero::optim
