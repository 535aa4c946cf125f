// The 2D process topology (tensor parallel x data parallel) as pure integer
// math: no MPI, no communicators. Everything that later builds communicators
// (the group colours for a split) comes from here, so it can be tested for any
// virtual world size, including the 400-rank layouts of the paper, on a laptop.
//
// Layout: rank = dp_rank * tp + tp_rank. TP ranks are contiguous so that a TP
// group, which all-reduces in every layer, sits inside one node; DP groups take
// one rank per TP position and so cross nodes, where their traffic (gradient
// reduce-scatter / parameter all-gather, once per step) can afford it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace megazero::parallel_state {

// One named axis of a RankGrid.
struct GridDim {
  std::string name;
  int size = 1;
};

// An ordered N-D grid of ranks, dimensions listed fastest-varying first: the
// coordinate along dims[0] changes between neighbouring ranks. Topology uses
// {tp, dp}; a pipeline axis later is one more entry ({"pp", p}) and every group
// function below works unchanged for it.
class RankGrid {
 public:
  explicit RankGrid(std::vector<GridDim> dims);

  int size() const { return size_; }  // product of the dimension sizes
  const std::vector<GridDim>& dims() const { return dims_; }
  int dim(std::string_view name) const;  // index of a dimension by name

  std::vector<int> coords(int rank) const;
  int rank_of(const std::vector<int>& coords) const;

  // The ranks that differ from each other only in coordinate `dim` form one
  // group. Its index is the rank's other coordinates linearised in grid order
  // (so it is the same for every member): the colour of a communicator split.
  int num_groups(int dim) const { return size_ / dims_[idx(dim)].size; }
  int group_index(int rank, int dim) const;
  std::vector<int> group(int dim, int index) const;     // members, ascending
  std::vector<std::vector<int>> groups(int dim) const;  // ordered by index

 private:
  std::size_t idx(int dim) const;
  std::vector<GridDim> dims_;
  std::vector<int> strides_;
  int size_ = 1;
};

// What the user asked for. The flags named in comments are the ones error
// messages point at.
struct TopologyOptions {
  int world_size = 0;                  // MPI job size (mpiexec -n / Slurm tasks) or --world-size
  int tensor_model_parallel_size = 1;  // --tensor-model-parallel-size
  int ranks_per_node = 0;              // --ranks-per-node
  bool allow_tp_across_nodes = false;  // --allow-tp-across-nodes
};

// Where one rank sits: on the machine (node, local_rank) and in the grid.
struct RankCoord {
  int rank = 0;
  int node = 0;
  int local_rank = 0;
  int tp_rank = 0;
  int dp_rank = 0;
  friend bool operator==(const RankCoord&, const RankCoord&) = default;
};

class Topology {
 public:
  // Validates the options and throws megazero::ConfigError naming the flag and
  // the fix. A TP group spanning nodes is refused unless allow_tp_across_nodes,
  // and then accepted with a warning (see warnings()).
  static Topology create(const TopologyOptions& options);

  int world_size() const { return grid_.size(); }
  int tensor_model_parallel_size() const { return grid_.dims()[kTpDim].size; }
  int data_parallel_size() const { return grid_.dims()[kDpDim].size; }
  int ranks_per_node() const { return ranks_per_node_; }
  int num_nodes() const { return world_size() / ranks_per_node_; }
  bool allow_tp_across_nodes() const { return allow_tp_across_nodes_; }
  // Accepted-but-costly choices, for the launcher to print on rank 0.
  const std::vector<std::string>& warnings() const { return warnings_; }
  const RankGrid& grid() const { return grid_; }

  // Out-of-range ranks or group indices are caller bugs (ranks come from MPI
  // and are checked against the world size at start-up): InternalError.
  RankCoord coord(int rank) const;
  int rank_of(int tp_rank, int dp_rank) const;
  int node_of(int rank) const;

  // world/t groups of t contiguous ranks; group i = ranks [i*t, (i+1)*t).
  std::vector<std::vector<int>> tp_groups() const { return grid_.groups(kTpDim); }
  // t groups of world/t ranks with stride t; group j = {j, j+t, j+2t, ...}.
  std::vector<std::vector<int>> dp_groups() const { return grid_.groups(kDpDim); }
  std::vector<int> tp_group(int index) const { return grid_.group(kTpDim, index); }
  std::vector<int> dp_group(int index) const { return grid_.group(kDpDim, index); }
  // Split colours: a rank's TP group index is its dp_rank, its DP group index
  // its tp_rank.
  int tp_group_index(int rank) const { return grid_.group_index(rank, kTpDim); }
  int dp_group_index(int rank) const { return grid_.group_index(rank, kDpDim); }

  bool tp_group_crosses_nodes(int index) const { return tp_group_num_nodes(index) > 1; }
  int tp_group_num_nodes(int index) const { return num_nodes_spanned(tp_group(index)); }
  int dp_group_num_nodes(int index) const { return num_nodes_spanned(dp_group(index)); }
  // Number of distinct nodes that the given ranks live on.
  int num_nodes_spanned(const std::vector<int>& ranks) const;

  // Index of each dimension in grid(); a pp axis would be appended as 2.
  static constexpr int kTpDim = 0;
  static constexpr int kDpDim = 1;

 private:
  Topology(RankGrid grid, int ranks_per_node, bool allow_tp_across_nodes, std::vector<std::string> warnings);

  RankGrid grid_;
  int ranks_per_node_;
  bool allow_tp_across_nodes_;
  std::vector<std::string> warnings_;
};

// The TP sizes a world of `world_size` ranks accepts before node checks: its
// divisors, ascending. Used in error messages and by tools.
std::vector<int> divisors(int n);

}  // namespace megazero::parallel_state
