#include "parallel_state/topology.h"

#include <algorithm>
#include <sstream>
#include <utility>

#include "megazero/core/error.h"

namespace megazero::parallel_state {

// ---------------------------------------------------------------- RankGrid --

RankGrid::RankGrid(std::vector<GridDim> dims) : dims_(std::move(dims)) {
  MZ_CHECK(!dims_.empty(), "a rank grid needs at least one dimension");
  strides_.reserve(dims_.size());
  for (std::size_t i = 0; i < dims_.size(); ++i) {
    MZ_CHECK(dims_[i].size >= 1, "grid dimension '", dims_[i].name, "' has size ", dims_[i].size);
    for (std::size_t j = 0; j < i; ++j)
      MZ_CHECK(dims_[j].name != dims_[i].name, "duplicate grid dimension '", dims_[i].name, "'");
    strides_.push_back(size_);
    size_ *= dims_[i].size;
  }
}

std::size_t RankGrid::idx(int dim) const {
  MZ_CHECK(dim >= 0 && static_cast<std::size_t>(dim) < dims_.size(), "grid dimension ", dim, " out of range [0, ",
           dims_.size(), ")");
  return static_cast<std::size_t>(dim);
}

int RankGrid::dim(std::string_view name) const {
  for (std::size_t i = 0; i < dims_.size(); ++i)
    if (dims_[i].name == name) return static_cast<int>(i);
  MZ_CHECK(false, "no grid dimension named '", name, "'");
  return -1;
}

std::vector<int> RankGrid::coords(int rank) const {
  MZ_CHECK(rank >= 0 && rank < size_, "rank ", rank, " out of range [0, ", size_, ")");
  std::vector<int> c(dims_.size());
  for (std::size_t i = 0; i < dims_.size(); ++i) c[i] = (rank / strides_[i]) % dims_[i].size;
  return c;
}

int RankGrid::rank_of(const std::vector<int>& coords) const {
  MZ_CHECK(coords.size() == dims_.size(), "got ", coords.size(), " coordinates for a ", dims_.size(), "-D grid");
  int rank = 0;
  for (std::size_t i = 0; i < dims_.size(); ++i) {
    MZ_CHECK(coords[i] >= 0 && coords[i] < dims_[i].size, dims_[i].name, " coordinate ", coords[i],
             " out of range [0, ", dims_[i].size, ")");
    rank += coords[i] * strides_[i];
  }
  return rank;
}

int RankGrid::group_index(int rank, int dim) const {
  const std::size_t d = idx(dim);
  const std::vector<int> c = coords(rank);
  // Linearise the other coordinates, fastest first, skipping `dim`.
  int index = 0, stride = 1;
  for (std::size_t i = 0; i < dims_.size(); ++i) {
    if (i == d) continue;
    index += c[i] * stride;
    stride *= dims_[i].size;
  }
  return index;
}

std::vector<int> RankGrid::group(int dim, int index) const {
  const std::size_t d = idx(dim);
  MZ_CHECK(index >= 0 && index < num_groups(dim), dims_[d].name, " group index ", index, " out of range [0, ",
           num_groups(dim), ")");
  // Undo group_index: recover the other coordinates, then walk along `dim`.
  std::vector<int> c(dims_.size(), 0);
  int rest = index;
  for (std::size_t i = 0; i < dims_.size(); ++i) {
    if (i == d) continue;
    c[i] = rest % dims_[i].size;
    rest /= dims_[i].size;
  }
  const int base = rank_of(c);
  std::vector<int> members(static_cast<std::size_t>(dims_[d].size));
  for (std::size_t k = 0; k < members.size(); ++k) members[k] = base + static_cast<int>(k) * strides_[d];
  return members;
}

std::vector<std::vector<int>> RankGrid::groups(int dim) const {
  std::vector<std::vector<int>> out;
  out.reserve(static_cast<std::size_t>(num_groups(dim)));
  for (int g = 0; g < num_groups(dim); ++g) out.push_back(group(dim, g));
  return out;
}

// ---------------------------------------------------------------- helpers --

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

namespace {

std::string join(const std::vector<int>& v) {
  std::ostringstream os;
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  return os.str();
}

// TP sizes that keep every TP group inside one node: divisors of the node size
// (which divides the world, so they divide the world too).
std::string node_local_choices(int ranks_per_node) {
  return "valid choices with --ranks-per-node " + std::to_string(ranks_per_node) + ": " +
         join(divisors(ranks_per_node));
}

// Rule for a TP group that does not fit a node: with --allow-tp-across-nodes a
// group larger than a node must cover whole nodes.
std::vector<int> cross_node_choices(int world, int ranks_per_node) {
  std::vector<int> out;
  for (int t : divisors(world))
    if (t > ranks_per_node && t % ranks_per_node == 0) out.push_back(t);
  return out;
}

}  // namespace

// ---------------------------------------------------------------- Topology --

Topology::Topology(RankGrid grid, int ranks_per_node, bool allow_tp_across_nodes, std::vector<std::string> warnings)
    : grid_(std::move(grid)),
      ranks_per_node_(ranks_per_node),
      allow_tp_across_nodes_(allow_tp_across_nodes),
      warnings_(std::move(warnings)) {}

Topology Topology::create(const TopologyOptions& o) {
  const int world = o.world_size, t = o.tensor_model_parallel_size, rpn = o.ranks_per_node;
  MZ_REQUIRE(world >= 1, "world size must be at least 1, got ", world,
             ": it is the number of MPI ranks (mpiexec -n N, or Slurm --ntasks), or "
             "--world-size N for a virtual world; launch with at least one rank");
  MZ_REQUIRE(t >= 1, "--tensor-model-parallel-size must be at least 1, got ", t,
             "; use --tensor-model-parallel-size 1 to turn tensor parallelism off");
  MZ_REQUIRE(rpn >= 1, "--ranks-per-node must be at least 1, got ", rpn,
             "; set it to the number of ranks (usually GPUs) started on each node, e.g. "
             "--ranks-per-node 8");
  const std::string world_choices =
      "valid choices for a world of " + std::to_string(world) + ": " + join(divisors(world));
  MZ_REQUIRE(world % t == 0, "--tensor-model-parallel-size ", t, " does not divide the world size ", world,
             " (world = TP x DP, so DP = world / TP must be a whole number); ", world_choices,
             "; or run a world size that is a multiple of ", t, " (mpiexec -n / --world-size)");
  MZ_REQUIRE(world % rpn == 0, "--ranks-per-node ", rpn, " does not divide the world size ", world,
             ": every node must run the same number of ranks; ", world_choices,
             "; or run a world size that is a multiple of ", rpn, " (mpiexec -n / --world-size)");

  std::vector<std::string> warnings;
  if (t > rpn) {
    MZ_REQUIRE(o.allow_tp_across_nodes, "--tensor-model-parallel-size ", t, " is larger than --ranks-per-node ", rpn,
               ", so each TP group would span several nodes and run its every-layer all-reduces "
               "over the inter-node network; use a TP size that fits in a node (",
               node_local_choices(rpn), "), or pass --allow-tp-across-nodes to accept the cost");
    const std::vector<int> ok = cross_node_choices(world, rpn);
    MZ_REQUIRE(t % rpn == 0, "--tensor-model-parallel-size ", t,
               " with --allow-tp-across-nodes must be a multiple of --ranks-per-node ", rpn,
               " so that each TP group covers whole nodes; ", node_local_choices(rpn),
               ok.empty() ? std::string() : "; across nodes: " + join(ok));
    std::ostringstream w;
    w << "--allow-tp-across-nodes: each TP group of " << t << " ranks spans " << t / rpn << " nodes (--ranks-per-node "
      << rpn
      << "), so the tensor-parallel all-reduces of every layer (forward and backward) cross "
         "the inter-node network, typically several times slower than links inside a node; "
         "for speed use a --tensor-model-parallel-size that divides --ranks-per-node "
      << rpn << " (" << join(divisors(rpn)) << ")";
    warnings.push_back(w.str());
  } else if (rpn % t != 0) {
    // The first straddling group starts at the last multiple of t below a node
    // boundary; naming it makes the problem concrete.
    const int first = (rpn / t) * t;
    MZ_REQUIRE(o.allow_tp_across_nodes, "--tensor-model-parallel-size ", t, " does not divide --ranks-per-node ", rpn,
               ", so some TP groups would straddle two nodes (e.g. ranks ", first, "-", first + t - 1,
               " on nodes 0 and 1) and run their every-layer all-reduces over the ",
               "inter-node network; use a TP size that divides the node (", node_local_choices(rpn),
               "), or pass --allow-tp-across-nodes to accept the cost");
    int crossing = 0;  // groups [i*t, i*t + t) whose first and last rank differ in node
    for (int i = 0; i < world / t; ++i) crossing += (i * t) / rpn != (i * t + t - 1) / rpn;
    std::ostringstream w;
    w << "--allow-tp-across-nodes: --tensor-model-parallel-size " << t << " does not divide --ranks-per-node " << rpn
      << ", so " << crossing << " of " << world / t
      << " TP groups straddle two nodes; their every-layer all-reduces cross the inter-node "
         "network and the whole step waits for them; for speed use a "
         "--tensor-model-parallel-size that divides --ranks-per-node "
      << rpn << " (" << join(divisors(rpn)) << ")";
    warnings.push_back(w.str());
  }

  return Topology(RankGrid({{"tp", t}, {"dp", world / t}}), rpn, o.allow_tp_across_nodes, std::move(warnings));
}

RankCoord Topology::coord(int rank) const {
  const std::vector<int> c = grid_.coords(rank);  // range-checks the rank
  return RankCoord{rank, rank / ranks_per_node_, rank % ranks_per_node_, c[static_cast<std::size_t>(kTpDim)],
                   c[static_cast<std::size_t>(kDpDim)]};
}

int Topology::rank_of(int tp_rank, int dp_rank) const {
  std::vector<int> c(grid_.dims().size(), 0);
  c[static_cast<std::size_t>(kTpDim)] = tp_rank;
  c[static_cast<std::size_t>(kDpDim)] = dp_rank;
  return grid_.rank_of(c);
}

int Topology::node_of(int rank) const {
  MZ_CHECK(rank >= 0 && rank < world_size(), "rank ", rank, " out of range [0, ", world_size(), ")");
  return rank / ranks_per_node_;
}

int Topology::num_nodes_spanned(const std::vector<int>& ranks) const {
  std::vector<int> nodes;
  nodes.reserve(ranks.size());
  for (int r : ranks) nodes.push_back(node_of(r));
  std::sort(nodes.begin(), nodes.end());
  return static_cast<int>(std::unique(nodes.begin(), nodes.end()) - nodes.begin());
}

}  // namespace megazero::parallel_state
