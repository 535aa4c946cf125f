#include "megazero/train/stop_signals.h"

#include <unistd.h>

#include <csignal>

#include "megazero/comm/consensus.h"
#include "megazero/core/error.h"

namespace megazero::train {

namespace {
volatile std::sig_atomic_t g_signal = 0;
volatile std::sig_atomic_t g_immediate = 0;
extern "C" void on_stop_signal(int sig) {
  g_signal = sig;
  if (g_immediate) {  // nothing to save yet: stop now (async-signal-safe calls only)
    static const char msg[] =
        "megazero: stop signal during start-up (no training state to save yet): exiting now, exit code 5\n";
    [[maybe_unused]] const auto n = ::write(2, msg, sizeof msg - 1);
    ::_exit(kExitStoppedBySignal);
  }
}
}  // namespace

void set_stop_is_immediate(bool immediate) { g_immediate = immediate ? 1 : 0; }

void install_stop_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a signal must not fail a read or an MPI call with EINTR
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

void clear_stop_signal() { g_signal = 0; }

int stop_signal_received() { return static_cast<int>(g_signal); }

bool stop_requested_anywhere(Communicator& world) {
  return all_reduce_value(world, stop_signal_received(), ReduceOp::Max) != 0;
}

}  // namespace megazero::train
