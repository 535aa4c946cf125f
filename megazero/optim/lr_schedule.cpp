#include "megazero/optim/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "megazero/core/error.h"

namespace megazero::optim {

namespace {
// The schedule at (possibly fractional) iteration `it`.
double lr_at(const LrSchedule& s, double it) {
  const auto warmup = static_cast<double>(s.warmup_iters);
  if (s.warmup_iters > 0 && it < warmup)
    return s.init_lr + (s.max_lr - s.init_lr) * (s.warmup_style == "log" ? std::log(it + 2) / std::log(warmup + 1)
                                                                         : (it + 1) / warmup);  // init 0: exact
  if (s.style == "constant") return s.max_lr;
  if (s.style == "inverse-square-root")  // Megatron's: --min-lr once past --lr-decay-iters
    return it > static_cast<double>(s.decay_iters)
               ? s.min_lr
               : std::max(s.min_lr, s.max_lr * std::sqrt(std::max(warmup, 1.0)) / std::sqrt(std::max(it, 1.0)));
  double coef = 1.0;
  if (s.style == "WSD") {
    // Stable at --lr, then the anneal over the decay's last wsd_decay_iters.
    const double anneal = static_cast<double>(s.wsd_decay_iters);
    const double start = static_cast<double>(s.decay_iters) - anneal;
    if (it > start) {
      const double r = std::min(1.0, (it - start) / anneal);
      coef = s.wsd_style == "linear"       ? 1.0 - r
             : s.wsd_style == "cosine"     ? 0.5 * (1.0 + std::cos(std::numbers::pi * r))
             : s.wsd_style == "minus_sqrt" ? 1.0 - std::sqrt(r)
                                           : 2.0 * std::pow(0.5, r) - 1.0;  // exponential
    }
  } else {
    const double span = static_cast<double>(std::max<std::int64_t>(1, s.decay_iters - s.warmup_iters));
    const double t = std::min(1.0, (it - warmup) / span);
    coef = s.style == "linear" ? 1.0 - t : 0.5 * (1.0 + std::cos(std::numbers::pi * t));
  }
  return s.min_lr + coef * (s.max_lr - s.min_lr);
}
}  // namespace

double LrSchedule::at(std::int64_t it) const { return lr_at(*this, static_cast<double>(it)); }

double LrSchedule::at_samples(std::int64_t consumed, std::int64_t full_batch) const {
  // A whole number of full batches gives the integer iteration, bit for bit.
  if (consumed % full_batch == 0) return at(consumed / full_batch);
  return lr_at(*this, static_cast<double>(consumed) / static_cast<double>(full_batch));
}

double WeightDecaySchedule::at_samples(std::int64_t consumed, std::int64_t full_batch) const {
  const double steps = static_cast<double>(consumed), total = static_cast<double>(incr_iters * full_batch);
  if (style == "constant" || steps > total) return end;
  const double ratio = steps / total;
  const double coef = style == "linear" ? ratio : 0.5 * (std::cos(std::numbers::pi * (1 - ratio)) + 1.0);
  return start + coef * (end - start);
}

void WeightDecaySchedule::validate() const {
  MZ_REQUIRE(style == "constant" || style == "linear" || style == "cosine", "--weight-decay-incr-style '", style,
             "' is not one of constant, linear, cosine");
  MZ_REQUIRE(std::isfinite(start) && start >= 0 && std::isfinite(end) && end >= 0,
             "--start-weight-decay and --end-weight-decay must be finite non-negative numbers, got ", start, " and ",
             end);
  MZ_REQUIRE(style != "constant" || start == end,
             "--weight-decay-incr-style constant keeps one weight decay, but "
             "--start-weight-decay ",
             start, " and --end-weight-decay ", end, " differ: choose linear or cosine");
  MZ_REQUIRE(incr_iters >= 1, "--weight-decay-incr-iters must be positive (0 = --train-iters), got ", incr_iters);
}

void LrSchedule::validate() const {
  MZ_REQUIRE(std::isfinite(max_lr) && max_lr >= 0, "--lr must be a finite non-negative number, got ", max_lr);
  MZ_REQUIRE(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= max_lr, "--min-lr ", min_lr, " must be in [0, --lr ",
             max_lr, "]");
  MZ_REQUIRE(warmup_iters >= 0, "--lr-warmup-iters must be non-negative, got ", warmup_iters);
  MZ_REQUIRE(std::isfinite(init_lr) && init_lr >= 0 && init_lr <= max_lr, "--lr-warmup-init ", init_lr,
             " must be in [0, --lr ", max_lr, "]: the warmup rises from it to --lr");
  MZ_REQUIRE(decay_iters >= 0, "--lr-decay-iters must be non-negative, got ", decay_iters);
  MZ_REQUIRE(warmup_style == "linear" || warmup_style == "log", "--lr-warmup-style '", warmup_style,
             "' is not one of linear, log");
  MZ_REQUIRE(
      style == "cosine" || style == "linear" || style == "constant" || style == "inverse-square-root" || style == "WSD",
      "--lr-decay-style '", style, "' is not one of cosine, linear, constant, inverse-square-root, WSD");
  MZ_REQUIRE(wsd_style == "exponential" || wsd_style == "linear" || wsd_style == "cosine" || wsd_style == "minus_sqrt",
             "--lr-wsd-decay-style '", wsd_style, "' is not one of exponential, linear, cosine, minus_sqrt");
  MZ_REQUIRE(wsd_decay_iters >= 0, "--lr-wsd-decay-iters must be non-negative, got ", wsd_decay_iters);
  if (style != "WSD") return;
  MZ_REQUIRE(wsd_decay_iters > 0,
             "--lr-decay-style WSD anneals over the last --lr-wsd-decay-iters (or --lr-wsd-decay-samples) "
             "iterations before --lr-decay-iters; give a positive count");
  MZ_REQUIRE(wsd_decay_iters <= decay_iters - warmup_iters, "--lr-wsd-decay-iters ", wsd_decay_iters,
             " is longer than the decay after the warmup (--lr-decay-iters ", decay_iters, " - --lr-warmup-iters ",
             warmup_iters, "): the anneal would start inside the warmup; shorten it or lengthen --lr-decay-iters");
}

}  // namespace megazero::optim
