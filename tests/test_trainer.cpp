// The product's trainer in-process (megazero/trainer/trainer.h), 2 ranks: the
// same flags pretrain_gpt takes build, train, save and resume a run without a
// new process, and a resumed Trainer continues with the losses of the
// uninterrupted one, bit for bit; a stop signal mid-run saves and reports 5.
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <string>
#include <vector>

#include "megazero/comm/consensus.h"
#include "megazero/comm/mpi_communicator.h"
#include "megazero/core/error.h"
#include "megazero/kernels/cudnn_attention.h"
#include "megazero/train/arguments.h"
#include "megazero/train/stop_signals.h"
#include "megazero/trainer/trainer.h"
#include "zero_harness.h"

namespace fs = std::filesystem;
using namespace megazero;
using namespace megazero::train;

namespace {

MpiCommunicator& world() { return testing_util::test_world(); }

std::string shared_temp_dir() { return testing_util::shared_temp_dir("mz-trainer"); }

// pretrain_gpt's parsing and validation of these flags (a tiny GPT, mock data, TP 2 or DP 2).
TrainArgs args_of(std::vector<std::string> flags) {
  const std::vector<std::pair<std::string, std::string>> base = {{"--num-layers", "2"},
                                                                 {"--hidden-size", "64"},
                                                                 {"--num-attention-heads", "4"},
                                                                 {"--seq-length", "16"},
                                                                 {"--max-position-embeddings", "16"},
                                                                 {"--vocab-size", "128"},
                                                                 {"--micro-batch-size", "2"},
                                                                 {"--global-batch-size", "8"},
                                                                 {"--log-interval", "1"},
                                                                 {"--eval-iters", "1"},
                                                                 {"--zero-stage", "2"},
                                                                 {"--train-iters", "6"}};
  std::vector<std::string> all = {"pretrain_gpt", "--mock-data"};
  for (const auto& [flag, value] : base)  // a flag given by the test replaces the base one
    if (std::find(flags.begin(), flags.end(), flag) == flags.end()) all.insert(all.end(), {flag, value});
  all.insert(all.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (auto& s : all) argv.push_back(s.data());
  TrainArgs a = parse_train_args(static_cast<int>(argv.size()), argv.data(), nullptr);
  a.validate();
  a.validate_layout(world().size());
  return a;
}

TrainResult run(const std::vector<std::string>& flags) {
  Trainer t(args_of(flags), MpiCommunicator::world());
  t.build();
  return t.train();
}

}  // namespace

// Megatron's --use-flash-attn asks for a fast fused attention: our flash
// kernel on the CPU, cuDNN's on --device cuda where it can run (parsing needs
// no GPU); an explicit fused backend is kept, an explicit unfused refused.
TEST(Trainer, UseFlashAttnPicksCudnnOnCudaWhereItCanRun) {
  EXPECT_EQ(args_of({"--use-flash-attn"}).model.attention_backend, "fused");
  EXPECT_THROW(args_of({"--use-flash-attn", "--attention-backend", "unfused"}), ConfigError);
  if (!kernels::cudnn_attention_unsupported(DeviceKind::CUDA, DType::BF16, 16).empty())
    GTEST_SKIP() << "a build without CUDA: --device cuda is refused before any attention choice";
  EXPECT_EQ(args_of({"--use-flash-attn", "--device", "cuda", "--bf16"}).model.attention_backend, "cudnn");
  EXPECT_EQ(args_of({"--use-flash-attn", "--device", "cuda", "--bf16", "--attention-backend", "fused"})
                .model.attention_backend,
            "fused");
  // A head size cuDNN cannot take (here 160): our fused kernel cannot either, so the
  // choice is fused and validation names the way out.
  EXPECT_THROW(args_of({"--use-flash-attn", "--device", "cuda", "--bf16", "--hidden-size", "640"}), ConfigError);
}

TEST(Trainer, ResumedTrainerContinuesBitForBit) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = shared_temp_dir();
  const TrainResult straight = run({"--save", dir, "--save-interval", "3"});
  ASSERT_EQ(straight.exit_code, 0);
  ASSERT_EQ(straight.losses.size(), 6u);
  EXPECT_EQ(straight.last_iteration, 6);
  EXPECT_GT(straight.validation_loss, 0);
  EXPECT_TRUE(fs::exists(fs::path(dir) / "iter_0000003" / "manifest.json"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "iter_0000006" / "manifest.json"));
  // Resume from iteration 3, at TP 2 instead of DP 2 (a layout change through the trainer).
  const TrainResult resumed = run({"--load", dir + "/iter_0000003", "--tensor-model-parallel-size", "2"});
  ASSERT_EQ(resumed.exit_code, 0);
  EXPECT_EQ(resumed.start_iteration, 3);
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(resumed.losses[i], straight.losses[3 + i], 1e-5 * straight.losses[3 + i]) << "iteration " << 4 + i;
  // The same layout: bit for bit.
  const TrainResult same = run({"--load", dir + "/iter_0000003"});
  ASSERT_EQ(same.losses.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(same.losses[i], straight.losses[3 + i]) << "iteration " << 4 + i;
  EXPECT_EQ(same.validation_loss, straight.validation_loss);
  world().barrier().wait();
  if (world().rank() == 0) fs::remove_all(dir);
}

TEST(Trainer, StopSignalSavesAndReportsExitFive) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = shared_temp_dir();
  install_stop_signal_handlers();
  set_stop_is_immediate(false);
  Trainer t(args_of({"--save", dir}), MpiCommunicator::world());
  t.build();
  if (world().rank() == 1) std::raise(SIGUSR1);  // one rank only: the ranks agree at the step boundary
  const TrainResult r = t.train();
  EXPECT_EQ(r.exit_code, kExitStoppedBySignal);
  EXPECT_EQ(r.last_iteration, 1) << "the stop is taken after the first step";
  EXPECT_TRUE(fs::exists(fs::path(dir) / "iter_0000001" / "manifest.json"));
  clear_stop_signal();
  world().barrier().wait();
  if (world().rank() == 0) fs::remove_all(dir);
}

TEST(Trainer, BadFlagsAreConfigErrorsOnEveryRank) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  EXPECT_THROW(args_of({"--zero-stage", "5"}), ConfigError);
  EXPECT_THROW(args_of({"--tensor-model-parallel-size", "3"}), ConfigError);
  // A model the host cannot hold: the trainer's memory pre-flight refuses it on every rank alike.
  Trainer t(args_of({"--num-layers", "64", "--hidden-size", "16384", "--num-attention-heads", "128"}),
            MpiCommunicator::world());
  EXPECT_THROW(t.build(), AgreedConfigError);
}
