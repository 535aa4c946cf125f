// megazero-topology: prints the rank -> node -> (tp_rank, dp_rank) map and the
// TP and DP groups, as a table or JSON.
//   Virtual world (no MPI job needed):
//     megazero-topology --world-size 400 --tensor-model-parallel-size 16 --ranks-per-node 16
//   Live job (hosts and node placement as MPI sees them):
//     mpiexec -n 8 megazero-topology --tensor-model-parallel-size 2
#include <boost/program_options.hpp>
#include <iostream>
#include <optional>

#include "megazero/core/limits.h"
#include "megazero/comm/consensus.h"
#include "megazero/runtime/cli.h"
#include "megazero/runtime/entry.h"
#include "parallel_state/process_groups.h"
#include "parallel_state/topology_format.h"

namespace po = boost::program_options;
using namespace megazero;
using namespace megazero::parallel_state;

namespace {

struct Args {
  int world_size = -1;  // -1: not given (the live job)
  ParallelOptions parallel;
  std::string format = "table";
  bool help = false;
};

po::options_description describe_options(Args& a) {
  po::options_description d("megazero-topology options");
  d.add_options()("help,h", po::bool_switch(&a.help), "print this help")(
      "world-size", po::value(&a.world_size),
      "plan a virtual world of this many ranks instead of reading the live MPI job")(
      "tensor-model-parallel-size", po::value(&a.parallel.tensor_model_parallel_size)->default_value(1),
      "ranks per tensor-parallel group (contiguous ranks, inside a node)")(
      "ranks-per-node", po::value(&a.parallel.ranks_per_node)->default_value(0),
      "ranks per node; 0 = detect from MPI (live job) — required with --world-size")(
      "allow-tp-across-nodes", po::bool_switch(&a.parallel.allow_tp_across_nodes),
      "accept TP groups that span nodes (slow: TP all-reduces every layer)")(
      "format", po::value(&a.format)->default_value("table"), "table or json");
  return d;
}

Args parse(int argc, char** argv) {
  Args a;
  auto desc = describe_options(a);
  parse_command_line(argc, argv, desc, "megazero-topology");
  if (a.help) {
    std::cout << desc << "\n";
    return a;
  }
  MZ_REQUIRE(a.format == "table" || a.format == "json", "--format: '", a.format, "' is not table or json");
  // The largest GPU clusters hold ~10^5 GPUs; a table of more than 2^20 ranks is a typo, not a plan.
  MZ_REQUIRE(a.world_size == -1 || (a.world_size > 0 && a.world_size <= limits::kMaxRanks),
             "--world-size must be a number of ranks from 1 to ", limits::kMaxRanks, ", got ", a.world_size);
  MZ_REQUIRE(a.world_size == -1 || a.parallel.ranks_per_node > 0,
             "--world-size needs --ranks-per-node (a virtual world has no MPI to detect nodes from)");
  return a;
}

int run(int argc, char** argv) {
  auto world = MpiCommunicator::world();
  // Parse on every rank; a bad flag fails everywhere alike.
  Args args = run_consistently(*world, [&] { return parse(argc, argv); });
  if (args.help) return 0;
  if (args.world_size > 0) {  // virtual: pure math, printed once
    TopologyOptions t{args.world_size, args.parallel.tensor_model_parallel_size, args.parallel.ranks_per_node,
                      args.parallel.allow_tp_across_nodes};
    Topology topo = run_consistently(*world, [&] {
                      std::optional<Topology> made;
                      made.emplace(Topology::create(t));
                      return made;
                    }).value();
    if (world->rank() == 0) std::cout << (args.format == "json" ? to_json(topo) : to_table(topo)) << std::flush;
    return 0;
  }
  auto groups = ProcessGroups::create(std::move(world), args.parallel);
  if (groups->world().rank() == 0) {
    if (args.format == "json") {
      std::cout << to_json(groups->topology()) << std::flush;
    } else {
      std::cout << groups->describe() << std::flush;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return run_main("megazero-topology", argc, argv, run); }
