// megazero-fault-inject: a loop of all-reduces on the world communicator in
// which one rank misbehaves on purpose at one iteration, so the CLI tests can
// prove how the job ends (tests/CMakeLists.txt, docs/COLLECTIVES.md):
//   hang      the rank sleeps forever (peers block in the next all-reduce)
//   skip      the rank skips one all-reduce (it then finishes one early)
//   kill      the rank sends itself SIGKILL (a crash the process cannot report)
//   mismatch  the rank issues an all-gather where the others all-reduce
//   throw     the rank throws an InternalError (the entry point's abort path)
// With --fault none it is also the check-mode cost benchmark: it prints the
// time per all-reduce and how many fingerprints were exchanged.
#include <boost/program_options.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <thread>

#include "megazero/comm/fault_tolerance.h"
#include "megazero/comm/mpi_communicator.h"
#include "megazero/runtime/cli.h"
#include "megazero/runtime/entry.h"

namespace po = boost::program_options;
using namespace megazero;

namespace {

struct Args {
  std::string fault = "none";
  int fault_rank = 1;
  int fault_at = 5;
  int iters = 20;
  std::int64_t elements = 1024;
  double timeout = 0;
  bool check = false;
  bool help = false;
};

Args parse(int argc, char** argv) {
  Args a;
  po::options_description d("megazero-fault-inject options");
  d.add_options()("help,h", po::bool_switch(&a.help), "print this help")(
      "fault", po::value(&a.fault)->default_value(a.fault), "none, hang, skip, kill, mismatch or throw")(
      "fault-rank", po::value(&a.fault_rank)->default_value(a.fault_rank), "the rank that misbehaves")(
      "fault-at", po::value(&a.fault_at)->default_value(a.fault_at), "the iteration at which it does")(
      "iters", po::value(&a.iters)->default_value(a.iters), "all-reduces to run")(
      "elements", po::value(&a.elements)->default_value(a.elements), "fp32 elements per all-reduce")(
      "collective-timeout", po::value(&a.timeout)->default_value(a.timeout), "watchdog timeout, seconds (0 = off)")(
      "check-collectives", po::bool_switch(&a.check), "cross-check every collective's fingerprint");
  parse_command_line(argc, argv, d, "megazero-fault-inject");
  if (a.help) std::cout << d << "\n";
  MZ_REQUIRE(a.fault == "none" || a.fault == "hang" || a.fault == "skip" || a.fault == "kill" ||
                 a.fault == "mismatch" || a.fault == "throw",
             "--fault must be none, hang, skip, kill, mismatch or throw, got '", a.fault, "'");
  MZ_REQUIRE(a.iters >= 0 && a.elements >= 1, "--iters must be >= 0 and --elements >= 1");
  return a;
}

int body(int argc, char** argv) {
  const Args a = parse(argc, argv);
  if (a.help) return 0;
  // As a driver would: before any communicator exists.
  set_collective_timeout(a.timeout);
  set_check_collectives_default(a.check);
  auto world = MpiCommunicator::world();
  const int me = world->rank();
  auto cpu = make_device(DeviceKind::CPU);
  Tensor x = Tensor::zeros(cpu, {a.elements}, DType::F32, MemoryCategory::CommBuffers);
  Tensor gathered = Tensor::zeros(cpu, {a.elements * world->size()}, DType::F32, MemoryCategory::CommBuffers);
  Activity activity("all-reduce loop");
  const bool faulty = me == a.fault_rank;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < a.iters; ++i) {
    set_activity_iteration(i);
    if (faulty && i == a.fault_at && a.fault != "none") {
      // Wall-clock time, so a test can measure how long the job takes to end.
      const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      std::fprintf(stderr, "fault-inject: rank %d: injecting '%s' at iteration %d (time %.3f)\n", me, a.fault.c_str(),
                   i, now);
      std::fflush(stderr);
      if (a.fault == "hang")
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
      if (a.fault == "kill") std::raise(SIGKILL);
      if (a.fault == "throw") throw InternalError("fault-inject: injected internal error");
      if (a.fault == "skip") continue;
      if (a.fault == "mismatch") {
        world->all_gather(x, gathered).wait();
        continue;
      }
    }
    world->all_reduce(x).wait();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (me == 0)
    std::printf(
        "fault-inject: %d all_reduce of %lld f32 on %d ranks in %.3f s (%.1f us each), %llu fingerprints checked\n",
        a.iters, static_cast<long long>(a.elements), world->size(), s, a.iters ? 1e6 * s / a.iters : 0.0,
        static_cast<unsigned long long>(world->fingerprints_checked()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return run_main("megazero-fault-inject", argc, argv, body); }
