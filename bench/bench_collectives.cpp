// Collective bandwidth vs message size over the MPI backend, nccl-tests style:
// algorithm bandwidth = bytes / time, bus bandwidth = algbw x 2(n-1)/n for
// all-reduce and x (n-1)/n for reduce-scatter / all-gather (bytes = the full
// buffer). Median of --iters timed runs after a warm-up. --distributed-backend
// shm times the shared-memory transport instead of MPI's messages; --device
// cuda times GPU tensors (ranks sharing a GPU: staged through host memory).
//   mpiexec -n 2 bench_collectives [--min-bytes 4096] [--max-bytes 67108864] [--iters 5] [--dtype fp32]
//                                  [--distributed-backend mpi|shm] [--device cpu|cuda]
#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>

#include "megazero/comm/mpi_communicator.h"
#include "megazero/core/error.h"
#include "megazero/runtime/cli.h"
#include "megazero/runtime/entry.h"

namespace po = boost::program_options;
using namespace megazero;

namespace {

int run(int argc, char** argv) {
  std::int64_t min_bytes = 4096, max_bytes = 64 << 20;
  int iters = 5;
  std::string dtype_s = "fp32", backend = "mpi", device_spec = "cpu";
  po::options_description d("bench_collectives");
  d.add_options()("min-bytes", po::value(&min_bytes), "smallest message")(
      "max-bytes", po::value(&max_bytes), "largest message")("iters", po::value(&iters), "timed runs per size")(
      "dtype", po::value(&dtype_s), "fp32, bf16 or fp16")("distributed-backend", po::value(&backend),
                                                          "mpi (messages) or shm (one shared-memory segment)")(
      "device", po::value(&device_spec), "where the tensors live: cpu, cpu-isolated or cuda");
  parse_command_line(argc, argv, d, "bench_collectives");
  const DType t = parse_dtype(dtype_s, "--dtype");
  MZ_REQUIRE(backend == "mpi" || backend == "shm", "--distributed-backend must be mpi or shm, got '", backend, "'");
  // shm: a communicator of the same ranks (made over a duplicate of the world) with the transport.
  auto world = MpiCommunicator::world();
  auto cpu = make_device(device_spec);
  if (backend == "shm") world = MpiCommunicator::with_shared_memory(*world, "world-shm", cpu);
  const int n = world->size();
  const double nd = n;
  if (world->rank() == 0)
    std::printf("# ranks %d, dtype %s, %s%s on %s, median of %d\n%-14s %12s %12s %12s %12s\n", n, dtype_s.c_str(),
                backend.c_str(), world->has_device_slots() ? " (device slots)" : "", cpu->name().c_str(), iters,
                "collective", "bytes", "time_us", "algbw_GB/s", "busbw_GB/s");
  for (std::int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    const std::int64_t count = bytes / static_cast<std::int64_t>(dtype_size(t)) / n * n;
    Tensor full = Tensor::zeros(cpu, {count}, t, MemoryCategory::CommBuffers);
    Tensor part = Tensor::zeros(cpu, {count / n}, t, MemoryCategory::CommBuffers);
    struct Op {
      const char* name;
      double bus_factor;
      std::function<void()> fn;
    } ops[] = {
        {"all_reduce", 2 * (nd - 1) / nd, [&] { world->all_reduce(full).wait(); }},
        {"reduce_scatter", (nd - 1) / nd, [&] { world->reduce_scatter(full, part).wait(); }},
        {"all_gather", (nd - 1) / nd, [&] { world->all_gather(part, full).wait(); }},
    };
    for (auto& op : ops) {
      op.fn();
      std::vector<double> times;
      for (int i = 0; i < iters; ++i) {
        world->barrier().wait();
        const auto t0 = std::chrono::steady_clock::now();
        op.fn();
        times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(times.begin(), times.end());
      const double s = times[times.size() / 2];
      const double algbw = static_cast<double>(full.nbytes()) / s / 1e9;
      if (world->rank() == 0)
        std::printf("%-14s %12lld %12.1f %12.3f %12.3f\n", op.name, static_cast<long long>(full.nbytes()), s * 1e6,
                    algbw, algbw * op.bus_factor);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return run_main("bench_collectives", argc, argv, run); }
