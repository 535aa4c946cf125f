// Failing consistently: a rank that finds bad input must not exit while the
// others wait in a collective (the classic hang). Every rank calls
// agree_on_error at the same point; if any rank failed, every rank throws a
// AgreedConfigError carrying the lowest failing rank's message, so all exit alike.
#pragma once

#include <string>

#include "megazero/comm/communicator.h"
#include "megazero/core/error.h"

namespace megazero {

// A ConfigError that every rank of the communicator raised together, so each
// may exit cleanly (the entry point prints it once, on rank 0).
class AgreedConfigError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

// `local_error` empty means this rank is fine. Collective over `comm`.
void agree_on_error(Communicator& comm, const std::string& local_error);

// One value reduced over `comm` (a loss, a time, a byte count, a flag).
double all_reduce_value(Communicator& comm, double v, ReduceOp op);

// The min and max over `comm` of a per-rank value and the rank holding the
// max (the lowest such rank: the slowest one, for a time). Collective.
struct RankSpread {
  double min = 0, max = 0;
  int slowest = 0;
};
RankSpread rank_spread(Communicator& comm, double v);

// Root's string on every rank. Collective over `comm`.
std::string broadcast_string(Communicator& comm, const std::string& s, int root = 0);

// Runs fn; a ConfigError thrown on any rank is rethrown on all ranks.
template <typename Fn>
auto run_consistently(Communicator& comm, Fn&& fn) {
  std::string error;
  if constexpr (std::is_void_v<decltype(fn())>) {
    try {
      fn();
    } catch (const ConfigError& e) {
      error = e.what();
    }
    agree_on_error(comm, error);
  } else {
    decltype(fn()) result{};
    try {
      result = fn();
    } catch (const ConfigError& e) {
      error = e.what();
    }
    agree_on_error(comm, error);
    return result;
  }
}

}  // namespace megazero
