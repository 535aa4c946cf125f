#include "parallel_state/process_groups.h"

#include <cstring>
#include <optional>
#include <sstream>

#include "megazero/comm/consensus.h"
#include "megazero/core/error.h"
#include "parallel_state/topology_format.h"

namespace megazero::parallel_state {
namespace {

std::shared_ptr<Device> host() { return make_device(DeviceKind::CPU); }

std::int64_t all_reduce_max(Communicator& c, std::int64_t v) {
  Tensor t = Tensor::empty(host(), {1}, DType::I64, MemoryCategory::CommBuffers);
  t.host_data<std::int64_t>()[0] = v;
  c.all_reduce(t, ReduceOp::Max).wait();
  return t.host_data<std::int64_t>()[0];
}

}  // namespace

int detect_ranks_per_node(MpiCommunicator& world) {
  auto local = world.split_node_local("node-local");
  const int local_size = local->size();
  const int local_rank = local->rank();
  // Rank of the node's first process, via the node-local communicator.
  Tensor first = Tensor::empty(host(), {1}, DType::I64, MemoryCategory::CommBuffers);
  first.host_data<std::int64_t>()[0] = world.rank();
  local->broadcast(first, 0).wait();
  const auto node_first = first.host_data<std::int64_t>()[0];
  local.reset();

  const std::int64_t max_size = all_reduce_max(world, local_size);
  const std::int64_t min_size = -all_reduce_max(world, -local_size);
  std::string error;
  if (max_size != min_size) {
    error = detail::concat("nodes run different numbers of ranks (between ", min_size, " and ", max_size,
                           "); launch the same number of tasks on every node (Slurm: --ntasks-per-node), or "
                           "pass --ranks-per-node to override the detection");
  } else if (node_first != world.rank() - local_rank || world.rank() % local_size != local_rank) {
    error = detail::concat("rank ", world.rank(), " on host ", MpiCommunicator::host_name(),
                           " is not in a contiguous block of ranks per node (its node's first rank is ", node_first,
                           "); launch with block placement (srun --distribution=block, mpiexec's default), or pass "
                           "--ranks-per-node to override the detection");
  }
  agree_on_error(world, error);
  return local_size;
}

std::vector<std::string> gather_host_names(Communicator& world) {
  constexpr std::int64_t kLen = 64;
  std::string me = MpiCommunicator::host_name().substr(0, kLen - 1);
  Tensor mine = Tensor::zeros(host(), {kLen}, DType::U8, MemoryCategory::CommBuffers);
  std::memcpy(mine.host_bytes(), me.data(), me.size());
  Tensor all = Tensor::empty(host(), {kLen * world.size()}, DType::U8, MemoryCategory::CommBuffers);
  world.all_gather(mine, all).wait();
  std::vector<std::string> out;
  for (int r = 0; r < world.size(); ++r) out.emplace_back(static_cast<const char*>(all.host_bytes()) + r * kLen);
  return out;
}

std::unique_ptr<ProcessGroups> ProcessGroups::create(std::unique_ptr<Communicator> world,
                                                     const ParallelOptions& options) {
  MZ_CHECK(world, "ProcessGroups::create without a world communicator");
  int ranks_per_node = options.ranks_per_node;
  const bool detect = ranks_per_node == 0;
  if (detect) {
    auto* mpi_world = dynamic_cast<MpiCommunicator*>(world.get());
    MZ_CHECK(mpi_world, "node detection needs an MPI world communicator");
    ranks_per_node = detect_ranks_per_node(*mpi_world);
  }
  // Same inputs on every rank, so every rank throws alike; agree anyway in case
  // options were parsed differently (e.g. per-rank environment).
  Topology topo = run_consistently(*world, [&] {
                    TopologyOptions t;
                    t.world_size = world->size();
                    t.tensor_model_parallel_size = options.tensor_model_parallel_size;
                    t.ranks_per_node = ranks_per_node;
                    t.allow_tp_across_nodes = options.allow_tp_across_nodes;
                    std::optional<Topology> made;
                    made.emplace(Topology::create(t));
                    return made;
                  }).value();
  return std::unique_ptr<ProcessGroups>(new ProcessGroups(std::move(world), std::move(topo), detect));
}

ProcessGroups::ProcessGroups(std::unique_ptr<Communicator> world, Topology topology, bool detected)
    : world_(std::move(world)), topology_(std::move(topology)), detected_(detected) {
  const int me = world_->rank();
  coord_ = topology_.coord(me);
  // Split keys keep the group's ranks in topology order, so a communicator's
  // rank equals the rank's coordinate along that dimension.
  tp_ = world_->split(topology_.tp_group_index(me), coord_.tp_rank, "tp" + std::to_string(coord_.dp_rank));
  dp_ = world_->split(topology_.dp_group_index(me), coord_.dp_rank, "dp" + std::to_string(coord_.tp_rank));
  MZ_CHECK(tp_->rank() == coord_.tp_rank && tp_->size() == tp_size(), "TP communicator disagrees with topology");
  MZ_CHECK(dp_->rank() == coord_.dp_rank && dp_->size() == dp_size(), "DP communicator disagrees with topology");
  hosts_ = gather_host_names(*world_);
}

ProcessGroups::~ProcessGroups() {
  // Sub-communicators before the world they were split from.
  dp_.reset();
  tp_.reset();
}

std::string ProcessGroups::describe() const {
  return std::string(detected_ ? "ranks per node detected from MPI\n" : "ranks per node from --ranks-per-node\n") +
         "collectives: world " + std::string(world_->backend()) + ", tp " + std::string(tp_->backend()) + ", dp " +
         std::string(dp_->backend()) + "\n" + to_table(topology_, hosts_);
}

void ProcessGroups::use_device_groups(const GroupFactory& make) {
  // TP first, then DP, on every rank: each group's creation is collective over its members only.
  auto tp = make(*tp_, tp_->name());
  auto dp = make(*dp_, dp_->name());
  MZ_CHECK(tp->rank() == coord_.tp_rank && tp->size() == tp_size(), "device TP communicator disagrees with topology");
  MZ_CHECK(dp->rank() == coord_.dp_rank && dp->size() == dp_size(), "device DP communicator disagrees with topology");
  bootstrap_tp_ = std::move(tp_);
  bootstrap_dp_ = std::move(dp_);
  tp_ = std::move(tp);
  dp_ = std::move(dp);
}

}  // namespace megazero::parallel_state
