#include "megazero/train/stop_signals.h"

#include <csignal>

namespace megazero::train {

namespace {
volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_stop_signal(int sig) { g_signal = sig; }
}  // namespace

void install_stop_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a signal must not fail a read or an MPI call with EINTR
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

int stop_signal_received() { return static_cast<int>(g_signal); }

bool stop_requested_anywhere(Communicator& world) {
  Tensor flag = Tensor::empty(make_device(DeviceKind::CPU), {1}, DType::I32, MemoryCategory::Workspace);
  flag.data_as<std::int32_t>()[0] = stop_signal_received();
  world.all_reduce(flag, ReduceOp::Max).wait();
  return flag.data_as<std::int32_t>()[0] != 0;
}

}  // namespace megazero::train
