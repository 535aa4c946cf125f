// What this process is doing, in a few words ("iteration 12: backward"), so
// that a hang report says more than "all_reduce #57 is stuck": the collective
// watchdog prints it. One label per process (the training loop is one thread),
// plus the current iteration number kept apart so the driver can set it once
// per step without formatting a string.
//
// Cheap enough to set several times per iteration: a short copy into a fixed
// buffer under an uncontended mutex, no allocation. Thread-safe; the watchdog
// reads it from its own thread while the main thread may be blocked anywhere.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace megazero {

// Labels longer than this are truncated (they are for humans, not parsing).
inline constexpr std::size_t kMaxActivityLength = 127;

void set_activity(std::string_view label);
// -1 clears it.
void set_activity_iteration(std::int64_t iteration);
// "iteration 12: backward", "backward", "iteration 12" or "no activity label set".
std::string describe_activity();

// Sets the label for a scope and restores the previous one on exit, so nested
// phases ("checkpoint save" inside "iteration 12") read right in reports.
class Activity {
 public:
  explicit Activity(std::string_view label);
  ~Activity();
  Activity(const Activity&) = delete;
  Activity& operator=(const Activity&) = delete;

 private:
  char previous_[kMaxActivityLength + 1];
  std::size_t previous_length_;
};

}  // namespace megazero
