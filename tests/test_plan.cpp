// The memory planner (megazero/plan/memory_plan.h):
//  - the paper's formulas reproduce Table 1 as printed (docs/paper/zero_table1_memory.csv:
//    rounded for 7.5B, truncated for 128B and 1T);
//  - the real engine, built for ranks of the paper's 400-GPU 100B layout on the meta
//    device, holds exactly the model-state bytes the formulas give, for every stage
//    (within the DP padding: < 0.01%), and its optimizer states per rank fall as 1/Nd.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "megazero/plan/memory_plan.h"

using namespace megazero;

namespace {

train::TrainArgs paper_100b(int stage, const std::vector<std::string>& extra = {}) {
  const std::string cfg = std::string(MEGAZERO_SOURCE_DIR) + "/configs/paper/fig2_100B_zero_zero-100b_400gpus_mp16.cfg";
  std::vector<std::string> words = {"pretrain_gpt", "--config", cfg, "--mock-data"};
  if (stage >= 0) words.insert(words.end(), {"--zero-stage", std::to_string(stage)});
  words.insert(words.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  auto a = train::parse_train_args(static_cast<int>(argv.size()), argv.data(), nullptr);
  a.validate();
  a.validate_layout(400);
  return a;
}

}  // namespace

TEST(Plan, FormulasReproduceTable1AsPrinted) {
  std::ifstream in(std::string(MEGAZERO_SOURCE_DIR) + "/docs/paper/zero_table1_memory.csv");
  ASSERT_TRUE(in.good());
  int rows = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#' || line.rfind("dp,", 0) == 0) continue;
    std::stringstream ss(line);
    std::string f[6];
    for (auto& x : f) std::getline(ss, x, ',');
    const double nd = std::stod(f[0]), psi = std::stod(f[2]) * 1e9;
    for (int stage = 1; stage <= 3; ++stage) {
      const double gb = plan::paper_model_state_bytes(stage, psi, nd, 2) / 1e9;
      const std::string& printed_text = f[2 + stage];
      const double printed = std::stod(printed_text);
      SCOPED_TRACE(line + " stage " + std::to_string(stage) + ": formula " + std::to_string(gb));
      if (f[1] == "7.5B")  // rounded to the printed digits
        EXPECT_NEAR(gb, printed, printed_text.find('.') == std::string::npos ? 0.5 : 0.051);
      else if (printed_text.find('.') == std::string::npos)  // truncated to an integer
        EXPECT_EQ(std::floor(gb), printed);
      else
        EXPECT_NEAR(gb, printed, 0.051);
    }
    ++rows;
  }
  EXPECT_EQ(rows, 18);
}

TEST(Plan, TheEngineHoldsWhatTheFormulasSayAtPaperScale) {
  for (int stage = 0; stage <= 3; ++stage)
    for (int rank : {0, 15, 200, 399}) {
      SCOPED_TRACE(testing::Message() << "stage " << stage << " rank " << rank);
      const auto p = plan::plan_rank_memory(paper_100b(stage), 400, rank);
      EXPECT_EQ(p.tp, 16);
      EXPECT_EQ(p.dp, 25);
      EXPECT_GT(p.psi, 6'000'000'000);  // 100B over TP 16
      EXPECT_NEAR(static_cast<double>(p.model_states), static_cast<double>(p.paper_model_states),
                  1e-4 * static_cast<double>(p.paper_model_states));
      const auto opt = p.bytes[static_cast<std::size_t>(MemoryCategory::OptimizerStates)];
      EXPECT_EQ(opt, 12 * (stage == 0 ? p.psi_padded : p.psi_padded / 25));
    }
  // The paper's point: Pos+g fits the 100B model's states in a 32 GB V100; plain DP does not.
  EXPECT_LT(plan::plan_rank_memory(paper_100b(2), 400, 0).model_states, 32LL << 30);
  EXPECT_GT(plan::plan_rank_memory(paper_100b(0), 400, 0).model_states, 32LL << 30);
}

// The paper's 100B run needs ZeRO-R: with plain activation checkpointing the
// 125 layer inputs of a 32 x 1024 x 8192 micro-batch (fp16) alone are 62.5 GiB
// per GPU; Pa keeps 1/16 of them (C4), Pa+cpu none on the device (C5). Measured by
// running the real forward and backward for rank 0 on the meta device.
TEST(Plan, The100BModelFitsIn32GBOnlyWithZeroR) {
  const std::int64_t layer_input = 32LL * 1024 * 8192 * 2;  // bytes, fp16
  const auto plain = plan::plan_rank_memory(paper_100b(2), 400, 0);
  const auto c4 = plan::plan_rank_memory(paper_100b(-1, {"--zero-config", "C4"}), 400, 0);
  const auto c5 = plan::plan_rank_memory(paper_100b(-1, {"--zero-config", "C5"}), 400, 0);
  const auto ckpt = static_cast<std::size_t>(MemoryCategory::ActivationCheckpoints);
  const auto act = static_cast<std::size_t>(MemoryCategory::Activations);
  EXPECT_GE(plain.step_peak[act], 125 * layer_input);  // the whole checkpoints, kept as activations
  EXPECT_EQ(c4.step_peak[ckpt], 125 * (layer_input / 16));
  EXPECT_EQ(c5.step_peak[ckpt], 0);
  EXPECT_GT(plain.step_total_peak, 32LL << 30);
  EXPECT_LT(c4.step_total_peak, 32LL << 30);
  EXPECT_LT(c5.step_total_peak, c4.step_total_peak);
}

// Communication of one micro-batch and the step, counted by the (virtual)
// communicators while the real code runs for rank 0 of the 100B layout:
//  - TP (Megatron with activation checkpointing): 6 all-reduces of
//    batch x seq x hidden per layer (2 forward, 2 recompute, 2 backward), plus
//    the embedding's and the tied logits' (2 more) and the loss's 3 scalars per token;
//  - Pa adds exactly one all-gather of batch x seq x hidden per layer;
//  - DP: 2 Psi for stages 0-2 (all-reduce, or reduce-scatter + all-gather), 3 Psi for stage 3;
//  - the optimizer step adds the gradient norm's one scalar on TP and DP, the
//    logged loss one more scalar on DP.
TEST(Plan, CommunicationVolumesMatchThePapersAnalysis) {
  const std::int64_t bsh = 32LL * 1024 * 8192, tokens = 32LL * 1024;
  const auto AR = CollectiveType::AllReduce, RS = CollectiveType::ReduceScatter, AG = CollectiveType::AllGather;
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE(testing::Message() << "stage " << stage);
    const auto p = plan::plan_rank_memory(paper_100b(stage), 400, 0);
    EXPECT_EQ(p.tp_comm[AR].elements, 125 * 6 * bsh + 2 * bsh + 3 * tokens + 1);
    EXPECT_EQ(p.tp_comm[AG].elements, 0);
    const std::int64_t psi = p.psi_padded;
    if (stage == 0) {
      EXPECT_EQ(p.dp_comm[AR].elements, psi + 2);  // an all-reduce moves 2 Psi
    } else {
      EXPECT_EQ(p.dp_comm[AR].elements, 2);
      EXPECT_EQ(p.dp_comm[RS].elements, psi);
      // Stage 3 gathers each group's parameters (not the DP padding) before forward and backward.
      EXPECT_EQ(p.dp_comm[AG].elements, stage == 3 ? 2 * p.psi : psi);
    }
  }
  const auto c4 = plan::plan_rank_memory(paper_100b(-1, {"--zero-config", "C4"}), 400, 0);
  EXPECT_EQ(c4.tp_comm[AG].elements, 125 * bsh);
}

// Figure 6's ordering: at 400 GPUs, MP 16, batch 16 per replica and 32 GiB per
// GPU, the largest model grows C1 < C3 < C4 < C5 (Pa matters more than Pos+g),
// and the search's answer is exact: one more layer does not fit.
TEST(Plan, LargestModelPerConfigurationFollowsFigure6) {
  const std::int64_t budget = 32LL << 30;
  std::vector<std::int64_t> layers;
  for (const char* c : {"C1", "C3", "C4", "C5"}) {
    auto args = paper_100b(-1, {"--zero-config", c, "--micro-batch-size", "16", "--global-batch-size", "400"});
    plan::RankMemoryPlan best;
    const auto n = plan::largest_layers_that_fit(args, 400, 0, budget, &best);
    EXPECT_LE(best.step_total_peak, budget) << c;
    args.model.num_layers = n + 1;
    EXPECT_GT(plan::plan_rank_memory(args, 400, 0).step_total_peak, budget) << c;
    layers.push_back(n);
  }
  EXPECT_LT(layers[0], layers[1]);
  EXPECT_LT(layers[1], layers[2]);
  EXPECT_LT(layers[2], layers[3]);
}
