// Live process groups over real MPI ranks: each TP/DP communicator holds
// exactly the ranks the topology says, in topology order; node detection on one
// machine finds every rank on it; bad layouts fail on every rank alike.
#include <gtest/gtest.h>

#include "megazero/comm/consensus.h"
#include "parallel_state/process_groups.h"

using namespace megazero;
using namespace megazero::parallel_state;

namespace {

std::int64_t sum_over(Communicator& c, std::int64_t v) {
  Tensor t = Tensor::empty(make_device(DeviceKind::CPU), {1}, DType::I64, MemoryCategory::CommBuffers);
  t.host_data<std::int64_t>()[0] = v;
  c.all_reduce(t).wait();
  return t.host_data<std::int64_t>()[0];
}

}  // namespace

TEST(ProcessGroups, EveryValidTpDegreeBuildsTheTopologysGroups) {
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  for (int tp = 1; tp <= world_size; ++tp) {
    if (world_size % tp) continue;
    SCOPED_TRACE(testing::Message() << "tp " << tp);
    ParallelOptions o;
    o.tensor_model_parallel_size = tp;
    o.ranks_per_node = tp;  // pretend each TP group is one node
    auto g = ProcessGroups::create(MpiCommunicator::world(), o);
    const int me = g->world().rank();
    EXPECT_EQ(g->tp_size(), tp);
    EXPECT_EQ(g->dp_size(), world_size / tp);
    EXPECT_EQ(g->coord(), g->topology().coord(me));
    EXPECT_EQ(g->tp().rank(), me % tp);
    EXPECT_EQ(g->dp().rank(), me / tp);
    // Sum of world ranks over my groups, against the topology's member lists.
    std::int64_t tp_expect = 0, dp_expect = 0;
    for (int r : g->topology().tp_group(g->topology().tp_group_index(me))) tp_expect += r;
    for (int r : g->topology().dp_group(g->topology().dp_group_index(me))) dp_expect += r;
    EXPECT_EQ(sum_over(g->tp(), me), tp_expect);
    EXPECT_EQ(sum_over(g->dp(), me), dp_expect);
    EXPECT_EQ(g->hosts().size(), static_cast<std::size_t>(world_size));
    EXPECT_NE(g->describe().find("tp_rank"), std::string::npos);
  }
}

TEST(ProcessGroups, DetectsOneNodeOnOneMachine) {
  auto g = ProcessGroups::create(MpiCommunicator::world(), ParallelOptions{});
  EXPECT_TRUE(g->ranks_per_node_detected());
  EXPECT_EQ(g->topology().ranks_per_node(), g->world().size());
  EXPECT_EQ(g->topology().num_nodes(), 1);
}

TEST(ProcessGroups, InvalidLayoutsFailOnEveryRankWithTheFlagNamed) {
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  struct Bad {
    int tp, rpn;
    const char* needle;
  };
  std::vector<Bad> cases = {{0, 1, "--tensor-model-parallel-size"}, {-2, 1, "--tensor-model-parallel-size"}};
  if (world_size > 1) cases.push_back({world_size + 1, world_size, "--tensor-model-parallel-size"});
  if (world_size % 2 == 0 && world_size >= 2) cases.push_back({world_size, world_size / 2, "--allow-tp-across-nodes"});
  if (world_size >= 2) cases.push_back({1, world_size + 1, "--ranks-per-node"});
  for (const auto& bad : cases) {
    ParallelOptions o;
    o.tensor_model_parallel_size = bad.tp;
    o.ranks_per_node = bad.rpn;
    try {
      ProcessGroups::create(MpiCommunicator::world(), o);
      ADD_FAILURE() << "tp " << bad.tp << " rpn " << bad.rpn << " accepted";
    } catch (const AgreedConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(bad.needle), std::string::npos) << e.what();
    }
  }
}

TEST(ProcessGroups, TpAcrossNodesIsAcceptedWhenAllowedWithAWarning) {
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (world_size < 2 || world_size % 2) GTEST_SKIP() << "needs an even world";
  ParallelOptions o;
  o.tensor_model_parallel_size = world_size;
  o.ranks_per_node = world_size / 2;
  o.allow_tp_across_nodes = true;
  auto g = ProcessGroups::create(MpiCommunicator::world(), o);
  EXPECT_EQ(g->topology().warnings().size(), 1u);
  EXPECT_EQ(sum_over(g->tp(), 1), world_size);
}
