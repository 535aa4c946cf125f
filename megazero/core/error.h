// Errors a user can act on. Every error names what was wrong (a flag, a file, a
// size) and what to do about it, so that the message alone is enough to fix the
// run. ConfigError is for bad input (exit code 2); InternalError for broken
// invariants inside megazero (a bug: exit code 3). Exit code 4 is the
// collective watchdog's (megazero/comm/fault_tolerance.h).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace megazero {

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class InternalError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Exit codes shared by every executable so scripts and Slurm can tell them apart.
inline constexpr int kExitConfigError = 2;
inline constexpr int kExitInternalError = 3;
// The collective watchdog ended the job: a collective did not complete within
// --collective-timeout seconds (a peer died, hung, or issued something else).
// Worth a retry from the last checkpoint, unlike 2 and 3.
inline constexpr int kExitCollectiveTimeout = 4;
// SIGTERM or SIGUSR1 (Slurm's warning before the time limit) arrived: the job
// saved a checkpoint (with --save) at the next step boundary and stopped
// cleanly. Resubmitting the same command resumes it (launch/slurm requeues).
inline constexpr int kExitStoppedBySignal = 5;

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace megazero

// MZ_REQUIRE: validation of user input; the message must say how to fix it.
#define MZ_REQUIRE(cond, ...)                                                            \
  do {                                                                                   \
    if (!(cond)) throw ::megazero::ConfigError(::megazero::detail::concat(__VA_ARGS__)); \
  } while (0)

// MZ_CHECK: internal invariant; failing it is a megazero bug.
#define MZ_CHECK(cond, ...)                                                                    \
  do {                                                                                         \
    if (!(cond))                                                                               \
      throw ::megazero::InternalError(::megazero::detail::concat(                              \
          __FILE__, ":", __LINE__, ": check failed: " #cond ": " __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
