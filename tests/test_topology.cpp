// Topology is pure integer math, so these tests need no MPI calls: they build
// virtual worlds of any size, check every rank against the layout arithmetic
// (rank = dp_rank * t + tp_rank, node = rank / ranks_per_node), and check that
// every bad flag combination is refused with a message naming the flag.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstddef>
#include <ostream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "megazero/core/error.h"
#include "parallel_state/topology.h"
#include "parallel_state/topology_format.h"

namespace megazero::parallel_state {
namespace {

using ::testing::HasSubstr;
using Groups = std::vector<std::vector<int>>;

Topology make(int world, int t, int rpn, bool allow = false) { return Topology::create({world, t, rpn, allow}); }

// The message of the ConfigError that create() must throw.
std::string config_error(int world, int t, int rpn, bool allow = false) {
  try {
    (void)make(world, t, rpn, allow);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected ConfigError for world " << world << " t " << t << " rpn " << rpn << " allow " << allow;
  return {};
}

// The validity rule, written independently of topology.cpp.
bool expected_valid(int world, int t, int rpn, bool allow) {
  if (world < 1 || t < 1 || rpn < 1 || world % t != 0 || world % rpn != 0) return false;
  if (rpn % t == 0) return true;   // TP groups tile each node
  if (!allow) return false;        // some TP group leaves its node
  return t < rpn || t % rpn == 0;  // larger-than-node groups cover whole nodes
}

int distinct_nodes(const std::vector<int>& ranks, int rpn) {
  std::set<int> nodes;
  for (int r : ranks) nodes.insert(r / rpn);
  return static_cast<int>(nodes.size());
}

// Every invariant of a valid topology, checked against plain arithmetic. Uses
// ASSERT so the sweep stops at the first broken configuration.
void check_invariants(const Topology& topo, int world, int t, int rpn, bool allow) {
  SCOPED_TRACE(::testing::Message() << "world " << world << " t " << t << " rpn " << rpn << " allow " << allow);
  const int dp = world / t;
  ASSERT_EQ(topo.world_size(), world);
  ASSERT_EQ(topo.tensor_model_parallel_size(), t);
  ASSERT_EQ(topo.data_parallel_size(), dp);
  ASSERT_EQ(topo.ranks_per_node(), rpn);
  ASSERT_EQ(topo.num_nodes(), world / rpn);
  ASSERT_EQ(topo.allow_tp_across_nodes(), allow);
  ASSERT_EQ(topo.grid().size(), world);

  for (int r = 0; r < world; ++r) {
    const RankCoord c = topo.coord(r);
    ASSERT_EQ(c, (RankCoord{r, r / rpn, r % rpn, r % t, r / t})) << "rank " << r;
    ASSERT_EQ(topo.rank_of(c.tp_rank, c.dp_rank), r);
    ASSERT_EQ(topo.node_of(r), r / rpn);
    ASSERT_EQ(topo.tp_group_index(r), c.dp_rank);
    ASSERT_EQ(topo.dp_group_index(r), c.tp_rank);
  }

  // TP groups: dp groups of t contiguous ranks, group i = [i*t, i*t + t).
  const Groups tp = topo.tp_groups();
  ASSERT_EQ(static_cast<int>(tp.size()), dp);
  std::vector<int> tp_seen(static_cast<std::size_t>(world), 0);
  bool any_crosses = false;
  for (int i = 0; i < dp; ++i) {
    const auto& g = tp[static_cast<std::size_t>(i)];
    ASSERT_EQ(static_cast<int>(g.size()), t);
    for (int k = 0; k < t; ++k) ASSERT_EQ(g[static_cast<std::size_t>(k)], i * t + k);
    ASSERT_EQ(topo.tp_group(i), g);
    for (int r : g) {
      ++tp_seen[static_cast<std::size_t>(r)];
      ASSERT_EQ(topo.tp_group_index(r), i);
    }
    const bool crosses = (i * t) / rpn != (i * t + t - 1) / rpn;
    ASSERT_EQ(topo.tp_group_crosses_nodes(i), crosses) << "TP group " << i;
    ASSERT_EQ(topo.tp_group_num_nodes(i), distinct_nodes(g, rpn));
    any_crosses = any_crosses || crosses;
  }
  // A crossing TP group is only ever accepted with the flag, and always warned about.
  if (!allow) {
    ASSERT_FALSE(any_crosses);
  }
  ASSERT_EQ(topo.warnings().size(), any_crosses ? 1u : 0u);
  if (any_crosses) {
    ASSERT_THAT(topo.warnings()[0], HasSubstr("--allow-tp-across-nodes"));
  }

  // DP groups: t groups of dp ranks with stride t, group j = {j, j+t, ...}.
  const Groups dpg = topo.dp_groups();
  ASSERT_EQ(static_cast<int>(dpg.size()), t);
  std::vector<int> dp_seen(static_cast<std::size_t>(world), 0);
  for (int j = 0; j < t; ++j) {
    const auto& g = dpg[static_cast<std::size_t>(j)];
    ASSERT_EQ(static_cast<int>(g.size()), dp);
    for (int k = 0; k < dp; ++k) ASSERT_EQ(g[static_cast<std::size_t>(k)], j + k * t);
    ASSERT_EQ(topo.dp_group(j), g);
    for (int r : g) {
      ++dp_seen[static_cast<std::size_t>(r)];
      ASSERT_EQ(topo.dp_group_index(r), j);
    }
    const int nodes = distinct_nodes(g, rpn);
    ASSERT_EQ(topo.dp_group_num_nodes(j), nodes);
    // TP tiles nodes: the DP group visits every node, rpn/t ranks on each.
    if (rpn % t == 0) {
      ASSERT_EQ(nodes, topo.num_nodes());
    }
    // TP covers whole nodes: each DP member is on its own node.
    if (t % rpn == 0) {
      ASSERT_EQ(nodes, dp);
    }
  }
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(tp_seen[static_cast<std::size_t>(r)], 1) << "rank " << r << " TP membership";
    ASSERT_EQ(dp_seen[static_cast<std::size_t>(r)], 1) << "rank " << r << " DP membership";
  }
}

// ------------------------------------------------------ valid combinations --

struct Combo {
  int world, t, rpn;
  bool allow;
};

void PrintTo(const Combo& c, std::ostream* os) {
  *os << "world " << c.world << " t " << c.t << " rpn " << c.rpn << (c.allow ? " allow" : "");
}

class TopologyCombo : public ::testing::TestWithParam<Combo> {};

TEST_P(TopologyCombo, InvariantsHold) {
  const Combo c = GetParam();
  ASSERT_TRUE(expected_valid(c.world, c.t, c.rpn, c.allow));
  check_invariants(make(c.world, c.t, c.rpn, c.allow), c.world, c.t, c.rpn, c.allow);
}

INSTANTIATE_TEST_SUITE_P(Layouts, TopologyCombo,
                         ::testing::Values(Combo{400, 16, 16, false}, Combo{400, 4, 16, false},
                                           Combo{400, 1, 16, false}, Combo{400, 8, 16, false}, Combo{400, 2, 16, false},
                                           Combo{1, 1, 1, false}, Combo{8, 2, 4, false}, Combo{8, 8, 8, false},
                                           Combo{6, 3, 6, false}, Combo{6, 1, 6, false}, Combo{6, 6, 6, false},
                                           Combo{6, 1, 1, false}, Combo{16, 4, 8, false}, Combo{12, 2, 6, false},
                                           Combo{64, 8, 8, false}, Combo{1024, 8, 8, false}, Combo{2, 1, 2, false},
                                           Combo{16, 8, 4, true}, Combo{32, 32, 8, true}, Combo{12, 3, 4, true},
                                           Combo{800, 32, 16, true}),
                         [](const ::testing::TestParamInfo<Combo>& param_info) {
                           const Combo& c = param_info.param;
                           return "w" + std::to_string(c.world) + "_t" + std::to_string(c.t) + "_rpn" +
                                  std::to_string(c.rpn) + (c.allow ? "_allow" : "");
                         });

// ------------------------------------------------------ paper layouts -----

// 100B layout: world 400, TP 16 inside each 16-GPU node, DP 25 across nodes.
TEST(Topology, Paper100BLayout) {
  const Topology topo = make(400, 16, 16);
  EXPECT_EQ(topo.data_parallel_size(), 25);
  EXPECT_EQ(topo.num_nodes(), 25);
  EXPECT_TRUE(topo.warnings().empty());
  const Groups tp = topo.tp_groups();
  ASSERT_EQ(tp.size(), 25u);
  for (int i = 0; i < 25; ++i) {
    std::vector<int> expect(16);
    for (int k = 0; k < 16; ++k) expect[static_cast<std::size_t>(k)] = 16 * i + k;
    EXPECT_EQ(tp[static_cast<std::size_t>(i)], expect) << "TP group " << i;
    EXPECT_FALSE(topo.tp_group_crosses_nodes(i));
    for (int r : tp[static_cast<std::size_t>(i)]) EXPECT_EQ(topo.node_of(r), i);  // one node each
  }
  const Groups dp = topo.dp_groups();
  ASSERT_EQ(dp.size(), 16u);
  for (int j = 0; j < 16; ++j) {
    const auto& g = dp[static_cast<std::size_t>(j)];
    ASSERT_EQ(g.size(), 25u);
    std::vector<int> per_node(25, 0);
    for (int r : g) {
      ++per_node[static_cast<std::size_t>(topo.node_of(r))];
      EXPECT_EQ(topo.coord(r).local_rank, j);  // same GPU slot on every node
    }
    EXPECT_EQ(per_node, std::vector<int>(25, 1)) << "DP group " << j << " not one rank per node";
    EXPECT_EQ(topo.dp_group_num_nodes(j), 25);
  }
}

TEST(Topology, PaperTp4Layout) {
  const Topology topo = make(400, 4, 16);
  EXPECT_EQ(topo.tp_groups().size(), 100u);
  EXPECT_EQ(topo.dp_groups().size(), 4u);
  for (int j = 0; j < 4; ++j) {
    std::vector<int> per_node(25, 0);
    for (int r : topo.dp_group(j)) ++per_node[static_cast<std::size_t>(topo.node_of(r))];
    EXPECT_EQ(per_node, std::vector<int>(25, 4)) << "DP group " << j;
  }
}

TEST(Topology, PaperPureDataParallel) {
  const Topology topo = make(400, 1, 16);
  EXPECT_EQ(topo.data_parallel_size(), 400);
  EXPECT_EQ(topo.tp_groups().size(), 400u);
  ASSERT_EQ(topo.dp_groups().size(), 1u);
  std::vector<int> all(400);
  for (int r = 0; r < 400; ++r) all[static_cast<std::size_t>(r)] = r;
  EXPECT_EQ(topo.dp_group(0), all);
  EXPECT_EQ(topo.tp_group(7), std::vector<int>{7});
}

TEST(Topology, SmallWorldExplicitGroups) {
  const Topology topo = make(8, 2, 4);
  EXPECT_EQ(topo.tp_groups(), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(topo.dp_groups(), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(topo.coord(5), (RankCoord{5, 1, 1, 1, 2}));
  EXPECT_EQ(topo.rank_of(1, 2), 5);
  EXPECT_EQ(topo.dp_group_num_nodes(0), 2);

  const Topology single = make(1, 1, 1);
  EXPECT_EQ(single.tp_groups(), (Groups{{0}}));
  EXPECT_EQ(single.dp_groups(), (Groups{{0}}));
  EXPECT_EQ(single.coord(0), (RankCoord{0, 0, 0, 0, 0}));
}

// ------------------------------------------------------ allowed with warning

TEST(Topology, TpLargerThanNodeAllowedWithWarning) {
  const Topology topo = make(16, 8, 4, /*allow=*/true);
  ASSERT_EQ(topo.warnings().size(), 1u);
  EXPECT_THAT(topo.warnings()[0], HasSubstr("--allow-tp-across-nodes"));
  EXPECT_THAT(topo.warnings()[0], HasSubstr("spans 2 nodes"));
  EXPECT_THAT(topo.warnings()[0], HasSubstr("inter-node"));
  EXPECT_THAT(topo.warnings()[0], HasSubstr("--tensor-model-parallel-size that divides --ranks-per-node 4 (1, 2, 4)"));
  EXPECT_TRUE(topo.tp_group_crosses_nodes(0));
  EXPECT_EQ(topo.tp_group_num_nodes(1), 2);
  EXPECT_EQ(topo.dp_group_num_nodes(0), 2);
}

TEST(Topology, TpStraddlingNodesAllowedWithWarning) {
  // Groups {0,1,2} {3,4,5} {6,7,8} {9,10,11} on nodes of 4: the middle two straddle.
  const Topology topo = make(12, 3, 4, /*allow=*/true);
  ASSERT_EQ(topo.warnings().size(), 1u);
  EXPECT_THAT(topo.warnings()[0], HasSubstr("2 of 4 TP groups straddle"));
  EXPECT_THAT(topo.warnings()[0], HasSubstr("--ranks-per-node 4"));
  EXPECT_FALSE(topo.tp_group_crosses_nodes(0));
  EXPECT_TRUE(topo.tp_group_crosses_nodes(1));
  EXPECT_TRUE(topo.tp_group_crosses_nodes(2));
  EXPECT_FALSE(topo.tp_group_crosses_nodes(3));
}

TEST(Topology, NodeLocalTpHasNoWarningEvenWhenAllowed) {
  EXPECT_TRUE(make(16, 4, 8, /*allow=*/true).warnings().empty());
}

// ------------------------------------------------------ invalid options ----

TEST(TopologyErrors, NonPositiveWorldSize) {
  for (int world : {0, -1}) {
    const std::string msg = config_error(world, 1, 1);
    EXPECT_THAT(msg, HasSubstr("world size must be at least 1, got " + std::to_string(world)));
    EXPECT_THAT(msg, HasSubstr("mpiexec -n"));
    EXPECT_THAT(msg, HasSubstr("--world-size"));
  }
}

TEST(TopologyErrors, NonPositiveTensorParallelSize) {
  for (int t : {0, -2}) {
    const std::string msg = config_error(8, t, 8);
    EXPECT_THAT(msg, HasSubstr("--tensor-model-parallel-size must be at least 1, got " + std::to_string(t)));
    EXPECT_THAT(msg, HasSubstr("--tensor-model-parallel-size 1 to turn tensor parallelism off"));
  }
}

TEST(TopologyErrors, NonPositiveRanksPerNode) {
  for (int rpn : {0, -8}) {
    const std::string msg = config_error(8, 2, rpn);
    EXPECT_THAT(msg, HasSubstr("--ranks-per-node must be at least 1, got " + std::to_string(rpn)));
    EXPECT_THAT(msg, HasSubstr("--ranks-per-node 8"));  // the example fix
  }
}

TEST(TopologyErrors, TpDoesNotDivideWorld) {
  const std::string msg = config_error(6, 4, 6);
  EXPECT_THAT(msg, HasSubstr("--tensor-model-parallel-size 4 does not divide the world size 6"));
  EXPECT_THAT(msg, HasSubstr("valid choices for a world of 6: 1, 2, 3, 6"));
  EXPECT_THAT(msg, HasSubstr("multiple of 4"));
  // Larger than the world is the same mistake.
  EXPECT_THAT(config_error(4, 8, 4), HasSubstr("--tensor-model-parallel-size 8 does not divide the world size 4"));
}

TEST(TopologyErrors, RanksPerNodeDoesNotDivideWorld) {
  const std::string msg = config_error(6, 1, 4);
  EXPECT_THAT(msg, HasSubstr("--ranks-per-node 4 does not divide the world size 6"));
  EXPECT_THAT(msg, HasSubstr("same number of ranks"));
  EXPECT_THAT(msg, HasSubstr("valid choices for a world of 6: 1, 2, 3, 6"));
}

TEST(TopologyErrors, TpLargerThanNodeRefusedWithoutFlag) {
  const std::string msg = config_error(32, 16, 8);
  EXPECT_THAT(msg, HasSubstr("--tensor-model-parallel-size 16 is larger than --ranks-per-node 8"));
  EXPECT_THAT(msg, HasSubstr("valid choices with --ranks-per-node 8: 1, 2, 4, 8"));
  EXPECT_THAT(msg, HasSubstr("pass --allow-tp-across-nodes"));
}

TEST(TopologyErrors, TpAcrossNodesMustCoverWholeNodes) {
  // 12 divides 24 and 8 divides 24, but a 12-rank group covers 1.5 nodes.
  const std::string msg = config_error(24, 12, 8, /*allow=*/true);
  EXPECT_THAT(msg, HasSubstr("--tensor-model-parallel-size 12 with --allow-tp-across-nodes"));
  EXPECT_THAT(msg, HasSubstr("multiple of --ranks-per-node 8"));
  EXPECT_THAT(msg, HasSubstr("valid choices with --ranks-per-node 8: 1, 2, 4, 8"));
  EXPECT_THAT(msg, HasSubstr("across nodes: 24"));
}

TEST(TopologyErrors, TpStraddlingNodesRefusedWithoutFlag) {
  const std::string msg = config_error(12, 3, 4);
  EXPECT_THAT(msg, HasSubstr("--tensor-model-parallel-size 3 does not divide --ranks-per-node 4"));
  EXPECT_THAT(msg, HasSubstr("ranks 3-5 on nodes 0 and 1"));
  EXPECT_THAT(msg, HasSubstr("valid choices with --ranks-per-node 4: 1, 2, 4"));
  EXPECT_THAT(msg, HasSubstr("pass --allow-tp-across-nodes"));
}

TEST(TopologyErrors, BadRankOrGroupIndexIsInternalError) {
  const Topology topo = make(8, 2, 4);
  EXPECT_THROW((void)topo.coord(-1), InternalError);
  EXPECT_THROW((void)topo.coord(8), InternalError);
  EXPECT_THROW((void)topo.node_of(8), InternalError);
  EXPECT_THROW((void)topo.rank_of(2, 0), InternalError);
  EXPECT_THROW((void)topo.rank_of(0, 4), InternalError);
  EXPECT_THROW((void)topo.rank_of(-1, 0), InternalError);
  EXPECT_THROW((void)topo.tp_group(4), InternalError);
  EXPECT_THROW((void)topo.dp_group(2), InternalError);
  EXPECT_THROW((void)topo.tp_group_index(8), InternalError);
  EXPECT_THROW((void)topo.tp_group_crosses_nodes(-1), InternalError);
}

// ------------------------------------------------------ property sweep -----

// Every world 1..64, every ranks_per_node 1..world, every t 1..world+1, with and
// without the flag: create() succeeds exactly when the rule says so, and then
// every invariant holds; otherwise it throws ConfigError naming a flag.
TEST(TopologySweep, SucceedsExactlyWhenValid) {
  const auto start = std::chrono::steady_clock::now();
  int valid = 0, invalid = 0;
  for (int world = 1; world <= 64; ++world)
    for (int rpn = 1; rpn <= world; ++rpn)
      for (int t = 1; t <= world + 1; ++t)
        for (bool allow : {false, true}) {
          const bool expect = expected_valid(world, t, rpn, allow);
          try {
            const Topology topo = make(world, t, rpn, allow);
            ASSERT_TRUE(expect) << "accepted invalid world " << world << " t " << t << " rpn " << rpn << " allow "
                                << allow;
            check_invariants(topo, world, t, rpn, allow);
            if (HasFatalFailure()) return;
            ++valid;
          } catch (const ConfigError& e) {
            ASSERT_FALSE(expect) << "refused valid world " << world << " t " << t << " rpn " << rpn << " allow "
                                 << allow << ": " << e.what();
            const std::string msg = e.what();
            ASSERT_TRUE(msg.find("--tensor-model-parallel-size") != std::string::npos ||
                        msg.find("--ranks-per-node") != std::string::npos)
                << msg;
            ++invalid;
          }
        }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  RecordProperty("valid", valid);
  RecordProperty("invalid", invalid);
  EXPECT_GT(valid, 1000);
  EXPECT_GT(invalid, 1000);
  RecordProperty("seconds", std::to_string(secs));  // ~0.6 s in Release; not asserted (shared CI)
}

// ------------------------------------------------------ generic grid -------

// A pipeline axis is one more GridDim; groups along it come out right.
TEST(RankGrid, ThreeDimensionalWithPipelineAxis) {
  const RankGrid grid({{"tp", 2}, {"dp", 3}, {"pp", 2}});
  EXPECT_EQ(grid.size(), 12);
  EXPECT_EQ(grid.dim("pp"), 2);
  for (int r = 0; r < 12; ++r) {
    const std::vector<int> c = grid.coords(r);
    EXPECT_EQ(c, (std::vector<int>{r % 2, (r / 2) % 3, r / 6}));
    EXPECT_EQ(grid.rank_of(c), r);
    EXPECT_EQ(grid.group_index(r, 2), r % 6);  // pp group colour: (tp, dp) linearised
    EXPECT_EQ(grid.group_index(r, 1), (r % 2) + 2 * (r / 6));
  }
  EXPECT_EQ(grid.groups(0), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}}));
  EXPECT_EQ(grid.groups(1), (Groups{{0, 2, 4}, {1, 3, 5}, {6, 8, 10}, {7, 9, 11}}));
  EXPECT_EQ(grid.groups(2), (Groups{{0, 6}, {1, 7}, {2, 8}, {3, 9}, {4, 10}, {5, 11}}));
  for (int d = 0; d < 3; ++d)
    for (int r = 0; r < 12; ++r) {
      const auto g = grid.group(d, grid.group_index(r, d));
      EXPECT_NE(std::find(g.begin(), g.end(), r), g.end());
    }
}

TEST(RankGrid, RejectsBadDimensions) {
  EXPECT_THROW(RankGrid({}), InternalError);
  EXPECT_THROW(RankGrid({{"tp", 0}}), InternalError);
  EXPECT_THROW(RankGrid({{"tp", 2}, {"tp", 2}}), InternalError);
  const RankGrid grid({{"tp", 2}, {"dp", 2}});
  EXPECT_THROW((void)grid.dim("pp"), InternalError);
  EXPECT_THROW((void)grid.groups(2), InternalError);
  EXPECT_THROW((void)grid.rank_of({0}), InternalError);
}

TEST(Topology, Divisors) {
  EXPECT_EQ(divisors(1), std::vector<int>{1});
  EXPECT_EQ(divisors(6), (std::vector<int>{1, 2, 3, 6}));
  EXPECT_EQ(divisors(16), (std::vector<int>{1, 2, 4, 8, 16}));
  EXPECT_EQ(divisors(13), (std::vector<int>{1, 13}));
}

// ------------------------------------------------------ formatting ---------

// A strict little JSON syntax checker (RFC 8259 grammar, no semantics).
class JsonChecker {
 public:
  explicit JsonChecker(const std::string& s) : s_(s) {}
  bool valid() {
    ws();
    if (!value()) return false;
    ws();
    return i_ == s_.size();
  }

 private:
  bool value() {
    if (i_ >= s_.size()) return false;
    const char c = s_[i_];
    if (c == '{') return object();
    if (c == '[') return array();
    if (c == '"') return string();
    if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) return number();
    for (const char* lit : {"true", "false", "null"})
      if (s_.compare(i_, std::char_traits<char>::length(lit), lit) == 0) {
        i_ += std::char_traits<char>::length(lit);
        return true;
      }
    return false;
  }
  bool object() {
    ++i_;
    ws();
    if (eat('}')) return true;
    do {
      ws();
      if (i_ >= s_.size() || s_[i_] != '"' || !string()) return false;
      ws();
      if (!eat(':')) return false;
      ws();
      if (!value()) return false;
      ws();
    } while (eat(','));
    return eat('}');
  }
  bool array() {
    ++i_;
    ws();
    if (eat(']')) return true;
    do {
      ws();
      if (!value()) return false;
      ws();
    } while (eat(','));
    return eat(']');
  }
  bool string() {
    ++i_;
    while (i_ < s_.size()) {
      const unsigned char c = static_cast<unsigned char>(s_[i_++]);
      if (c == '"') return true;
      if (c < 0x20) return false;
      if (c == '\\') {
        if (i_ >= s_.size()) return false;
        const char e = s_[i_++];
        if (e == 'u') {
          for (int k = 0; k < 4; ++k)
            if (i_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[i_++]))) return false;
        } else if (std::string("\"\\/bfnrt").find(e) == std::string::npos) {
          return false;
        }
      }
    }
    return false;
  }
  bool number() {
    const std::size_t start = i_;
    if (s_[i_] == '-') ++i_;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    return i_ > start + (s_[start] == '-' ? 1u : 0u);
  }
  bool eat(char c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  const std::string& s_;
  std::size_t i_ = 0;
};

bool is_json(const std::string& s) { return JsonChecker(s).valid(); }

TEST(TopologyFormat, JsonCheckerSelfTest) {
  EXPECT_TRUE(is_json(R"({"a": [1, -2, {"b": "x\"y\u00e9"}], "c": true, "d": null})"));
  EXPECT_FALSE(is_json(R"({"a": [1, 2})"));
  EXPECT_FALSE(is_json(R"({"a": 1,})"));
  EXPECT_FALSE(is_json("[\"a\nb\"]"));  // raw newline in a string
  EXPECT_FALSE(is_json(R"(["\q"])"));
}

TEST(TopologyFormat, JsonSmallWorld) {
  const std::string json = to_json(make(8, 2, 4));
  ASSERT_TRUE(is_json(json)) << json;
  for (const char* want : {"\"world_size\": 8,", "\"tensor_model_parallel_size\": 2,", "\"data_parallel_size\": 4,",
                           "\"ranks_per_node\": 4,", "\"num_nodes\": 2,", "\"warnings\": [],",
                           R"("grid": [{"name": "tp", "size": 2}, {"name": "dp", "size": 4}])",
                           R"({"rank": 5, "node": 1, "local_rank": 1, "tp_rank": 1, "dp_rank": 2})",
                           "\"tp_groups\": [\n    [0, 1],\n    [2, 3],\n    [4, 5],\n    [6, 7]\n  ]",
                           "\"dp_groups\": [\n    [0, 2, 4, 6],\n    [1, 3, 5, 7]\n  ]"})
    EXPECT_THAT(json, HasSubstr(want));
}

TEST(TopologyFormat, JsonWithWarningsAndLargeWorld) {
  const std::string warned = to_json(make(16, 8, 4, /*allow=*/true));
  ASSERT_TRUE(is_json(warned)) << warned;
  EXPECT_THAT(warned, HasSubstr("\"warnings\": [\"--allow-tp-across-nodes: each TP group"));
  const std::string big = to_json(make(400, 16, 16));
  EXPECT_TRUE(is_json(big));
  EXPECT_THAT(big, HasSubstr(R"({"rank": 399, "node": 24, "local_rank": 15, "tp_rank": 15, "dp_rank": 24})"));
}

TEST(TopologyFormat, JsonQuoteEscapes) {
  EXPECT_EQ(json_quote("plain"), "\"plain\"");
  EXPECT_EQ(json_quote("a\"b\\c"), R"("a\"b\\c")");
  EXPECT_EQ(json_quote("l1\nl2\t\r\b\f"), R"("l1\nl2\t\r\b\f")");
  EXPECT_EQ(json_quote(std::string("\x01\x1f", 2)), R"("\u0001\u001f")");
  EXPECT_EQ(json_quote("\xc3\xa9"), "\"\xc3\xa9\"");  // UTF-8 passes through
  EXPECT_TRUE(is_json("[" + json_quote(std::string("\0x\"\\\n", 5)) + "]"));
}

TEST(TopologyFormat, TablePaperLayout) {
  const std::string table = to_table(make(400, 16, 16));
  EXPECT_EQ(summary_line(make(400, 16, 16)), "world 400 = TP 16 x DP 25 on 25 nodes of 16 ranks");
  EXPECT_EQ(table.rfind("world 400 = TP 16 x DP 25 on 25 nodes of 16 ranks\n", 0), 0u);
  EXPECT_THAT(table, HasSubstr("rank  node  local_rank  tp_rank  dp_rank\n"));
  EXPECT_THAT(table, HasSubstr(" 399    24          15       15       24\n"));
  EXPECT_THAT(table, HasSubstr("TP groups: 25 groups of 16 ranks (group index = dp_rank)\n"));
  EXPECT_THAT(table, HasSubstr("  TP  0: ranks 0-15  (node 0)\n"));
  EXPECT_THAT(table, HasSubstr("  TP 24: ranks 384-399  (node 24)\n"));
  EXPECT_THAT(table, HasSubstr("DP groups: 16 groups of 25 ranks (group index = tp_rank)\n"));
  EXPECT_THAT(table, HasSubstr("  DP  1: ranks 1 17 33 49 "));
  EXPECT_THAT(table, HasSubstr(" 369 385  (nodes 0-24, 25 nodes)\n"));
  // summary + header + 400 ranks + 2 group headers + 25 + 16 groups.
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 1 + 1 + 400 + 2 + 25 + 16);
}

TEST(TopologyFormat, TableSmallAndWarned) {
  EXPECT_EQ(summary_line(make(1, 1, 1)), "world 1 = TP 1 x DP 1 on 1 node of 1 rank");
  const std::string table = to_table(make(16, 8, 4, /*allow=*/true));
  EXPECT_THAT(table, HasSubstr("world 16 = TP 8 x DP 2 on 4 nodes of 4 ranks\nwarning: "));
  EXPECT_THAT(table, HasSubstr("TP 0: ranks 0-7  (nodes 0-1, 2 nodes)\n"));
  EXPECT_THAT(table, HasSubstr("DP 3: ranks 3 11  (nodes 0 2, 2 nodes)\n"));
}

}  // namespace
}  // namespace megazero::parallel_state
