// The live process groups of one rank: world, tensor-parallel and data-parallel
// communicators built from the pure Topology (topology.h). No global state: the
// training loop owns one ProcessGroups and passes references down.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "megazero/comm/mpi_communicator.h"
#include "parallel_state/topology.h"

namespace megazero::parallel_state {

struct ParallelOptions {
  int tensor_model_parallel_size = 1;  // --tensor-model-parallel-size
  int ranks_per_node = 0;              // --ranks-per-node; 0 = detect from MPI (shared-memory split)
  bool allow_tp_across_nodes = false;  // --allow-tp-across-nodes
};

class ProcessGroups {
 public:
  // Collective over `world`. Bad options or an inconsistent launch raise the
  // same ConfigError on every rank (no rank is left waiting).
  static std::unique_ptr<ProcessGroups> create(std::unique_ptr<Communicator> world, const ParallelOptions& options);
  ~ProcessGroups();

  const Topology& topology() const { return topology_; }
  const RankCoord& coord() const { return coord_; }  // this rank
  Communicator& world() { return *world_; }
  Communicator& tp() { return *tp_; }
  Communicator& dp() { return *dp_; }
  int tp_rank() const { return coord_.tp_rank; }
  int tp_size() const { return topology_.tensor_model_parallel_size(); }
  int dp_rank() const { return coord_.dp_rank; }
  int dp_size() const { return topology_.data_parallel_size(); }
  bool ranks_per_node_detected() const { return detected_; }
  // Host name of every rank, gathered at creation.
  const std::vector<std::string>& hosts() const { return hosts_; }

  // rank -> host -> node -> (tp_rank, dp_rank) table with the groups.
  std::string describe() const;

  // Moves the TP and DP groups onto a device backend (NCCL): make(bootstrap,
  // name) builds each new communicator over the current one, which stays
  // alive as its bootstrap. The world stays on MPI (host-side agreement,
  // consensus on errors). Collective over the world; every rank calls it.
  using GroupFactory = std::function<std::unique_ptr<Communicator>(Communicator& bootstrap, const std::string& name)>;
  void use_device_groups(const GroupFactory& make);

 private:
  ProcessGroups(std::unique_ptr<Communicator> world, Topology topology, bool detected);

  std::unique_ptr<Communicator> world_;
  Topology topology_;
  RankCoord coord_;
  bool detected_;
  std::unique_ptr<Communicator> tp_, dp_;
  std::unique_ptr<Communicator> bootstrap_tp_, bootstrap_dp_;  // after use_device_groups
  std::vector<std::string> hosts_;
};

// Ranks per node as MPI sees it (ranks sharing memory with this one), checked
// to be the same on every node and laid out in contiguous rank blocks, which is
// what the topology assumes. Collective over `world`; ConfigError otherwise.
int detect_ranks_per_node(MpiCommunicator& world);

// Every rank's host name (collective).
std::vector<std::string> gather_host_names(Communicator& world);

}  // namespace megazero::parallel_state
