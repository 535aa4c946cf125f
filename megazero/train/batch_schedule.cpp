#include "megazero/train/batch_schedule.h"

#include <cstdio>

#include "megazero/core/error.h"

namespace megazero::train {

std::int64_t BatchSchedule::batch_at(std::int64_t consumed) const {
  if (!ramps() || consumed > ramp_samples) return global;
  const std::int64_t increments = (global - start) / increment;
  // consumed <= ramp_samples, so the step is at most `increments` (the product
  // needs 128 bits for ramps of billions of samples).
  __extension__ using Wide = __int128;
  const auto step = static_cast<std::int64_t>(static_cast<Wide>(consumed) * increments / ramp_samples);
  return start + step * increment;
}

std::int64_t BatchSchedule::consumed_after(std::int64_t iterations) const {
  std::int64_t consumed = 0, it = 0;
  for (; it < iterations && consumed <= ramp_samples && ramps(); ++it) consumed += batch_at(consumed);
  return consumed + (iterations - it) * global;
}

std::int64_t BatchSchedule::iterations_for(std::int64_t train_samples) const {
  std::int64_t iterations = 0, consumed = 0;
  if (ramps())
    for (; consumed <= ramp_samples && consumed <= train_samples; ++iterations) consumed += batch_at(consumed);
  // Megatron's floor division: a total inside the ramp's last batch counts one fewer.
  const std::int64_t rest = train_samples - consumed;
  return iterations + (rest >= 0 ? rest / global : -((-rest + global - 1) / global));
}

BatchSchedule BatchSchedule::parse(const std::vector<std::string>& rampup, std::int64_t global) {
  BatchSchedule b;
  b.global = global;
  if (rampup.empty()) return b;
  MZ_REQUIRE(rampup.size() == 3,
             "--rampup-batch-size takes three whole numbers (Megatron's START INCREMENT SAMPLES, e.g. 16 16 5859375), "
             "got ",
             rampup.size());
  std::int64_t v[3];
  for (int i = 0; i < 3; ++i) {
    std::size_t used = 0;
    try {
      v[i] = std::stoll(rampup[static_cast<std::size_t>(i)], &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MZ_REQUIRE(used == rampup[static_cast<std::size_t>(i)].size() && used > 0 && v[i] > 0,
               "--rampup-batch-size takes three positive whole numbers (START INCREMENT SAMPLES), got '",
               rampup[static_cast<std::size_t>(i)], "'");
  }
  b.start = v[0];
  b.increment = v[1];
  b.ramp_samples = v[2];
  MZ_REQUIRE(b.start < global, "--rampup-batch-size starts at ", b.start, " samples, not below --global-batch-size ",
             global, ": there is nothing to ramp; lower the start or drop the flag");
  MZ_REQUIRE((global - b.start) % b.increment == 0, "--rampup-batch-size: --global-batch-size ", global,
             " minus the start ", b.start, " is not a multiple of the increment ", b.increment,
             "; the ramp must reach the global batch in whole increments");
  return b;
}

void BatchSchedule::check_layout(std::int64_t micro_batch, std::int64_t dp) const {
  if (!ramps()) return;
  const std::int64_t unit = micro_batch * dp;
  // The ramp's batches are start + k x increment: all multiples of the unit
  // exactly when the start and the increment are.
  MZ_REQUIRE(start % unit == 0 && increment % unit == 0, "--rampup-batch-size ", start, " ", increment, " ",
             ramp_samples, ": every batch of the ramp must be a multiple of --micro-batch-size ", micro_batch,
             " x data-parallel size ", dp, " = ", unit, "; choose a start and an increment that are");
}

std::string BatchSchedule::describe() const {
  if (!ramps()) return "constant " + std::to_string(global);
  const std::int64_t increments = (global - start) / increment;
  char s[200];
  std::snprintf(s, sizeof s, "%lld -> %lld in steps of %lld, one every %.1f samples (%lld samples)",
                static_cast<long long>(start), static_cast<long long>(global), static_cast<long long>(increment),
                static_cast<double>(ramp_samples) / static_cast<double>(increments),
                static_cast<long long>(ramp_samples));
  return s;
}

}  // namespace megazero::train
