// megazero-comm-check: the README's main job until training lands. Builds the
// 2D topology on the live MPI job, prints it, then runs every collective on the
// world, TP and DP communicators in fp32/bf16/fp16 — blocking and overlapped
// with GEMMs — checks every result against its closed form, and times a large
// all-reduce per group. Exits 1 if any check fails.
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>

#include "megazero/comm/consensus.h"
#include "megazero/kernels/gemm.h"
#include "megazero/runtime/cli.h"
#include "megazero/runtime/entry.h"
#include "parallel_state/process_groups.h"

namespace po = boost::program_options;
using namespace megazero;
using namespace megazero::parallel_state;
using MC = MemoryCategory;

namespace {

struct Args {
  ParallelOptions parallel;
  double size_mib = 16;
  bool help = false;
};

Args parse(int argc, char** argv) {
  Args a;
  po::options_description d("megazero-comm-check options");
  d.add_options()("help,h", po::bool_switch(&a.help), "print this help")(
      "tensor-model-parallel-size", po::value(&a.parallel.tensor_model_parallel_size)->default_value(2),
      "ranks per tensor-parallel group")("ranks-per-node", po::value(&a.parallel.ranks_per_node)->default_value(0),
                                         "ranks per node (0 = detect)")(
      "allow-tp-across-nodes", po::bool_switch(&a.parallel.allow_tp_across_nodes), "accept TP groups across nodes")(
      "size-mib", po::value(&a.size_mib)->default_value(16), "size of the timed all-reduce, MiB of fp32");
  parse_command_line(argc, argv, d, "megazero-comm-check");
  if (a.help) std::cout << d << "\n";
  MZ_REQUIRE(a.size_mib > 0 && a.size_mib <= 4096, "--size-mib must be in (0, 4096], got ", a.size_mib);
  return a;
}

// Exact in every dtype for groups of up to 64 ranks.
double value(int rank, std::int64_t i) { return static_cast<double>((rank % 8 + 1) * (i % 5) - 2) * 0.5; }

class Checker {
 public:
  explicit Checker(ProcessGroups& g) : g_(g), cpu_(make_device(DeviceKind::CPU)) {}

  void run_group(Communicator& c, const std::vector<int>& members) {
    for (DType t : {DType::F32, DType::BF16, DType::F16}) {
      const std::int64_t n = 1000 + 3;  // not divisible by any group size > 1 in practice
      // all_reduce sum / max
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
        Tensor x = filled(n, t);
        c.all_reduce(x, op).wait();
        expect(c, std::string("all_reduce(") + std::string(reduce_op_name(op)) + ") " + std::string(dtype_name(t)), x,
               [&](std::int64_t i) { return reduce(members, i, op); });
      }
      // reduce_scatter + all_gather with uneven counts: the ZeRO round trip.
      std::vector<std::int64_t> counts(static_cast<std::size_t>(c.size()));
      std::int64_t total = 0, offset = 0;
      for (int r = 0; r < c.size(); ++r) {
        counts[static_cast<std::size_t>(r)] = 7 + r;
        if (r < c.rank()) offset += 7 + r;
        total += 7 + r;
      }
      Tensor full = filled(total, t);
      Tensor part = full.narrow(0, offset, counts[static_cast<std::size_t>(c.rank())]);
      c.reduce_scatter(full, part, ReduceOp::Sum, counts).wait();
      c.all_gather(part, full, counts).wait();
      expect(c, "reduce_scatter+all_gather " + std::string(dtype_name(t)), full,
             [&](std::int64_t i) { return reduce(members, i, ReduceOp::Sum); });
      // broadcast from the last rank
      Tensor b = filled(n, t);
      c.broadcast(b, c.size() - 1).wait();
      expect(c, "broadcast " + std::string(dtype_name(t)), b, [&](std::int64_t i) { return value(members.back(), i); });
    }
    // Non-blocking all-reduce overlapped with GEMMs.
    Tensor x = filled(1 << 18, DType::F32);
    Work w = c.all_reduce(x, ReduceOp::Sum);
    Tensor a = Tensor::zeros(cpu_, {128, 128}, DType::F32, MC::Workspace);
    Tensor y = Tensor::empty(cpu_, {128, 128}, DType::F32, MC::Workspace);
    for (int i = 0; i < 8; ++i) gemm(a, false, a, true, y);
    w.wait();
    expect(c, "all_reduce overlapped with GEMM", x, [&](std::int64_t i) { return reduce(members, i, ReduceOp::Sum); });
  }

  double time_all_reduce(Communicator& c, double mib) {
    const auto n = static_cast<std::int64_t>(mib * 1024 * 1024 / 4);
    Tensor x = Tensor::zeros(cpu_, {n}, DType::F32, MC::CommBuffers);
    c.all_reduce(x).wait();  // warm-up
    const auto t0 = std::chrono::steady_clock::now();
    c.all_reduce(x).wait();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // nccl-tests convention: bus bandwidth = bytes / time * 2(n-1)/n.
    return c.size() > 1 ? static_cast<double>(x.nbytes()) / s * 2.0 * (c.size() - 1) / c.size() / 1e9 : 0.0;
  }

  int passed = 0, failed = 0;

 private:
  // Every rank contributes value(world rank, i), whatever the group.
  Tensor filled(std::int64_t n, DType t) {
    std::vector<double> v(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = value(g_.world().rank(), i);
    Tensor out = Tensor::empty(cpu_, {n}, t, MC::CommBuffers);
    out.copy_from_doubles(v);
    return out;
  }
  static double reduce(const std::vector<int>& members, std::int64_t i, ReduceOp op) {
    double acc = op == ReduceOp::Max ? -1e300 : 0.0;
    for (int r : members) acc = op == ReduceOp::Max ? std::max(acc, value(r, i)) : acc + value(r, i);
    return acc;
  }
  template <typename F>
  void expect(Communicator& c, const std::string& what, const Tensor& got, F want) {
    const auto v = got.to_double_vector();
    std::int64_t bad = -1;
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(v.size()) && bad < 0; ++i)
      if (v[static_cast<std::size_t>(i)] != want(i)) bad = i;
    if (bad < 0) {
      ++passed;
    } else {
      ++failed;
      std::fprintf(stderr, "rank %d: FAILED %s on %s: element %lld is %g, expected %g\n", g_.world().rank(),
                   what.c_str(), c.name().c_str(), static_cast<long long>(bad), v[static_cast<std::size_t>(bad)],
                   want(bad));
    }
  }
  ProcessGroups& g_;
  std::shared_ptr<Device> cpu_;
};

int run(int argc, char** argv) {
  auto world = MpiCommunicator::world();
  Args args = run_consistently(*world, [&] { return parse(argc, argv); });
  if (args.help) return 0;
  auto g = ProcessGroups::create(std::move(world), args.parallel);
  const bool root = g->world().rank() == 0;
  if (root) std::cout << g->describe() << std::flush;
  const auto& topo = g->topology();
  Checker check(*g);
  std::vector<int> everyone(static_cast<std::size_t>(topo.world_size()));
  for (int r = 0; r < topo.world_size(); ++r) everyone[static_cast<std::size_t>(r)] = r;
  check.run_group(g->world(), everyone);
  check.run_group(g->tp(), topo.tp_group(topo.tp_group_index(g->world().rank())));
  check.run_group(g->dp(), topo.dp_group(topo.dp_group_index(g->world().rank())));
  const double bw_world = check.time_all_reduce(g->world(), args.size_mib);
  const double bw_tp = check.time_all_reduce(g->tp(), args.size_mib);
  const double bw_dp = check.time_all_reduce(g->dp(), args.size_mib);

  // Totals over ranks.
  auto cpu = make_device(DeviceKind::CPU);
  Tensor totals = Tensor::empty(cpu, {2}, DType::I64, MC::CommBuffers);
  totals.host_data<std::int64_t>()[0] = check.passed;
  totals.host_data<std::int64_t>()[1] = check.failed;
  g->world().all_reduce(totals).wait();
  const auto passed = totals.host_data<std::int64_t>()[0], failed = totals.host_data<std::int64_t>()[1];
  if (root) {
    std::printf("all_reduce of %.0f MiB fp32, bus bandwidth: world %.2f GB/s, tp %.2f GB/s, dp %.2f GB/s\n",
                args.size_mib, bw_world, bw_tp, bw_dp);
    std::printf("collectives issued on rank 0: world %llu, tp %llu, dp %llu\n",
                static_cast<unsigned long long>(g->world().collectives_issued()),
                static_cast<unsigned long long>(g->tp().collectives_issued()),
                static_cast<unsigned long long>(g->dp().collectives_issued()));
    std::printf("comm-check: %lld checks passed, %lld failed (over %d ranks)\n", static_cast<long long>(passed),
                static_cast<long long>(failed), g->world().size());
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) { return run_main("megazero-comm-check", argc, argv, run); }
