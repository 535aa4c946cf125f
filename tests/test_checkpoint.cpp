// Distributed checkpoints on real MPI ranks:
//  - resume is bit-exact: N steps, save, a fresh model loads and runs M more,
//    giving the same losses bit for bit as N + M uninterrupted, for every ZeRO
//    stage and for fp16 (loss-scaler state included);
//  - any layout loads any checkpoint: the optimizer state after a load at
//    (TP c, DP d, stage s') is bit-identical to the saved one at (TP a, DP b,
//    stage s), and training continues with the losses of the original layout;
//  - damaged checkpoints (truncated, flipped bits, no manifest) are reported by
//    name and the previous good one is used; keep-K pruning; a model that does
//    not match is refused naming the flags.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "megazero/checkpoint/checkpoint.h"
#include "megazero/comm/consensus.h"
#include "megazero/core/error.h"
#include "zero_harness.h"

using namespace megazero;
using namespace megazero::testing_util;
namespace fs = std::filesystem;
using checkpoint::Placement;

namespace {

MpiCommunicator& world() { return test_world(); }

std::string shared_temp_dir() { return testing_util::shared_temp_dir("mz-ckpt"); }

Placement place(ZeroRun& r) { return {&world(), r.tp->rank(), r.tp->size()}; }

checkpoint::TrainState state_of(ZeroRun& r, int iteration) {
  checkpoint::TrainState s;
  s.iteration = iteration;
  s.consumed_samples = iteration * r.spec.global_batch;
  s.seed = 77;
  s.loss_scaler = r.scaler->state();
  s.config = "test";
  return s;
}

ZeroRunSpec spec_of(int tp, int dp, int stage, DType dtype = DType::F32) {
  ZeroRunSpec s;
  s.tp = tp;
  s.dp = dp;
  s.stage = stage;
  s.dtype = dtype;
  s.steps = 5;
  return s;
}

void barrier() { world().barrier().wait(); }

}  // namespace

class ResumeIsExact : public testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(ResumeIsExact, SameLossesBitForBit) {
  if (world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const auto [stage, dtype] = GetParam();
  const ZeroRunSpec spec = spec_of(2, 2, stage, dtype);
  const std::string dir = shared_temp_dir();
  std::vector<double> straight;
  double final_scale = 0;
  {
    ZeroRun run(world(), spec);
    straight = run.train(0, 5);
    final_scale = run.scaler->scale();
  }
  {
    ZeroRun first(world(), spec);
    first.train(0, 2);
    checkpoint::save_checkpoint(dir, state_of(first, 2), *first.engine, place(first));
  }
  ZeroRun resumed(world(), spec);
  const auto loaded = checkpoint::load_checkpoint(dir, *resumed.engine, place(resumed));
  ASSERT_TRUE(loaded.loaded);
  EXPECT_EQ(loaded.state.iteration, 2);
  EXPECT_EQ(loaded.state.consumed_samples, 2 * spec.global_batch);
  EXPECT_TRUE(loaded.rejected.empty());
  resumed.scaler->restore(loaded.state.loss_scaler);
  const auto rest = resumed.train(2, 3);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(rest[static_cast<std::size_t>(i)], straight[static_cast<std::size_t>(2 + i)]) << "step " << 2 + i;
  EXPECT_EQ(resumed.scaler->scale(), final_scale);
  barrier();
  if (world().rank() == 0) fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Stages, ResumeIsExact,
                         testing::Values(std::tuple{0, DType::F32}, std::tuple{1, DType::F32},
                                         std::tuple{2, DType::F32}, std::tuple{3, DType::F32},
                                         std::tuple{2, DType::F16}, std::tuple{3, DType::BF16}));

TEST(ResumeIsExact, Fp16ScalerStateAfterOverflowsContinues) {
  // An initial scale far too large overflows and backs off during the first
  // steps; the resumed run must continue from the backed-off scale.
  if (world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  ZeroRunSpec spec = spec_of(2, 2, 2, DType::F16);
  auto make = [&] {
    auto r = std::make_unique<ZeroRun>(world(), spec);
    optim::LossScalerConfig c;
    c.dynamic = true;
    c.initial_scale = 1e30;  // overflows fp16 at once
    c.hysteresis = 1;
    r->scaler = std::make_unique<optim::LossScaler>(c);
    return r;
  };
  std::vector<double> straight;
  optim::LossScaler::State end;
  {
    auto run = make();
    straight = run->train(0, 5);
    end = run->scaler->state();
  }
  ASSERT_GT(end.skipped, 0) << "the test needs overflows";
  const std::string dir = shared_temp_dir();
  {
    auto first = make();
    first->train(0, 3);
    checkpoint::save_checkpoint(dir, state_of(*first, 3), *first->engine, place(*first));
  }
  auto resumed = make();
  const auto loaded = checkpoint::load_checkpoint(dir, *resumed->engine, place(*resumed));
  resumed->scaler->restore(loaded.state.loss_scaler);
  const auto rest = resumed->train(3, 2);
  EXPECT_EQ(rest[0], straight[3]);
  EXPECT_EQ(rest[1], straight[4]);
  EXPECT_EQ(resumed->scaler->state().scale, end.scale);
  EXPECT_EQ(resumed->scaler->state().skipped, end.skipped);
  barrier();
  if (world().rank() == 0) fs::remove_all(dir);
}

// ------------------------------------------------------------ any layout
struct LayoutCase {
  int tp_a, dp_a, stage_a, tp_b, dp_b, stage_b;
};

void PrintTo(const LayoutCase& c, std::ostream* os) {
  *os << "TP" << c.tp_a << "xDP" << c.dp_a << " stage " << c.stage_a << " -> TP" << c.tp_b << "xDP" << c.dp_b
      << " stage " << c.stage_b;
}

class AnyLayout : public testing::TestWithParam<LayoutCase> {};

TEST_P(AnyLayout, LoadsBitIdenticalStateAndTrainsOn) {
  if (world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const auto c = GetParam();
  const std::string dir = shared_temp_dir(), again = dir + "/again";
  std::vector<double> original_next;
  {
    ZeroRun a(world(), spec_of(c.tp_a, c.dp_a, c.stage_a));
    a.train(0, 2);
    checkpoint::save_checkpoint(dir, state_of(a, 2), *a.engine, place(a));
    original_next = a.train(2, 2);
  }
  ZeroRun b(world(), spec_of(c.tp_b, c.dp_b, c.stage_b));
  const auto loaded = checkpoint::load_checkpoint(dir, *b.engine, place(b));
  ASSERT_TRUE(loaded.loaded);
  EXPECT_EQ(loaded.saved_tp, c.tp_a);
  EXPECT_EQ(loaded.saved_dp, c.dp_a);
  // Saved again from the new layout, the global state is the same bits.
  checkpoint::save_checkpoint(again, loaded.state, *b.engine, place(b));
  if (world().rank() == 0) {
    checkpoint::CheckpointReader ra(dir + "/" + checkpoint::iteration_dir_name(2));
    checkpoint::CheckpointReader rb(again + "/" + checkpoint::iteration_dir_name(2));
    EXPECT_EQ(rb.manifest().tp, c.tp_b);
    for (const auto& p : ra.manifest().parameters)
      for (const char* s : {"master", "exp_avg", "exp_avg_sq"}) {
        const auto va = ra.global_tensor(p.name, s), vb = rb.global_tensor(p.name, s);
        // The padded vocabulary differs with TP: compare the rows both have.
        const std::size_t n = std::min(va.size(), vb.size());
        std::size_t diff = 0;
        for (std::size_t i = 0; i < n; ++i) diff += va[i] != vb[i];
        EXPECT_EQ(diff, 0u) << p.name << " " << s;
        for (std::size_t i = n; i < std::max(va.size(), vb.size()); ++i)
          EXPECT_EQ(va.size() > vb.size() ? va[i] : vb[i], 0.0f) << "padding row of " << p.name;
      }
  }
  // Training continues as on the original layout (fp32: reduction order only).
  const auto next = b.train(2, 2);
  for (std::size_t i = 0; i < next.size(); ++i)
    EXPECT_NEAR(next[i], original_next[i], 1e-5 * std::abs(original_next[i])) << "step " << 2 + i;
  barrier();
  if (world().rank() == 0) fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Matrix, AnyLayout,
                         testing::Values(LayoutCase{2, 2, 2, 1, 4, 3}, LayoutCase{1, 4, 1, 4, 1, 0},
                                         LayoutCase{4, 1, 3, 2, 2, 1}, LayoutCase{2, 2, 0, 2, 2, 3},
                                         LayoutCase{1, 4, 3, 2, 2, 2}, LayoutCase{4, 1, 0, 1, 4, 2}));

// ------------------------------------------------------------ damage and housekeeping
namespace {

// Saves iterations 1..n (one step each) at TP 2 x DP 2 stage 2.
void save_series(const std::string& dir, int n, int keep) {
  ZeroRun r(world(), spec_of(2, 2, 2));
  checkpoint::SaveOptions o;
  o.keep = keep;
  for (int it = 1; it <= n; ++it) {
    r.train(it - 1, 1);
    checkpoint::save_checkpoint(dir, state_of(r, it), *r.engine, place(r), o);
  }
}

std::string load_expecting_fallback(const std::string& dir, int expect_iteration, const std::string& why) {
  ZeroRun r(world(), spec_of(2, 2, 2));
  const auto res = checkpoint::load_checkpoint(dir, *r.engine, place(r));
  EXPECT_TRUE(res.loaded);
  EXPECT_EQ(res.state.iteration, expect_iteration);
  EXPECT_EQ(res.rejected.size(), 1u);
  const std::string msg = res.rejected.empty() ? "" : res.rejected[0];
  EXPECT_NE(msg.find(why), std::string::npos) << msg;
  return msg;
}

void on_rank0(const std::function<void()>& fn) {
  if (world().rank() == 0) fn();
  barrier();
}

}  // namespace

TEST(Damage, BrokenNewestFallsBackToThePreviousOne) {
  if (world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const std::string dir = shared_temp_dir();
  save_series(dir, 2, 0);
  const fs::path newest = fs::path(dir) / "iter_0000002";
  const fs::path shard = newest / "shard_tp001_dp00001.safetensors";
  const std::string good = [&] {
    std::ifstream in(shard, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  // A flipped bit in the data.
  on_rank0([&] {
    std::string s = good;
    s[s.size() - 3] = static_cast<char>(s[s.size() - 3] ^ 1);
    std::ofstream(shard, std::ios::binary | std::ios::trunc) << s;
  });
  std::string msg = load_expecting_fallback(dir, 1, "fails its checksum");
  EXPECT_NE(msg.find("shard_tp001_dp00001.safetensors"), std::string::npos) << msg;
  // Truncated.
  on_rank0([&] { std::ofstream(shard, std::ios::binary | std::ios::trunc) << good.substr(0, good.size() / 2); });
  load_expecting_fallback(dir, 1, "truncated");
  // Missing manifest (a save that died before finishing).
  on_rank0([&] {
    std::ofstream(shard, std::ios::binary | std::ios::trunc) << good;
    fs::remove(newest / "manifest.json");
  });
  load_expecting_fallback(dir, 1, "no manifest");
  // Every checkpoint broken: an error naming each, on every rank, not a fresh start.
  on_rank0([&] { fs::remove(fs::path(dir) / "iter_0000001" / "shard_tp000_dp00000.safetensors"); });
  {
    ZeroRun r(world(), spec_of(2, 2, 2));
    try {
      checkpoint::load_checkpoint(dir, *r.engine, place(r));
      ADD_FAILURE() << "loaded from a directory of broken checkpoints";
    } catch (const AgreedConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("no usable checkpoint"), std::string::npos) << what;
      EXPECT_NE(what.find("iter_0000001"), std::string::npos) << what;
      EXPECT_NE(what.find("iter_0000002"), std::string::npos) << what;
    }
  }
  on_rank0([&] { fs::remove_all(dir); });
}

// Damage the checksums cannot see: the manifest re-sealed (its own XXH3
// recomputed by Manifest::to_json) after two shards were swapped, so every
// file matches its recorded checksum but holds another rank's pieces; and a
// manifest edited by hand. Each is rejected by name and the previous one used.
TEST(Damage, ConsistentChecksumsButWrongContentsFallBack) {
  if (world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const std::string dir = shared_temp_dir();
  save_series(dir, 2, 0);
  const fs::path newest = fs::path(dir) / "iter_0000002";
  const fs::path mpath = newest / "manifest.json";
  auto read = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string original = read(mpath);
  on_rank0([&] {
    const fs::path a = newest / "shard_tp000_dp00000.safetensors", b = newest / "shard_tp000_dp00001.safetensors";
    fs::rename(a, newest / "swap");
    fs::rename(b, a);
    fs::rename(newest / "swap", b);
    auto m = checkpoint::Manifest::parse(original, mpath.string());
    checkpoint::ShardFileInfo* fa = nullptr;
    checkpoint::ShardFileInfo* fb = nullptr;
    for (auto& f : m.files) {
      if (f.tp_rank == 0 && f.dp_rank == 0) fa = &f;
      if (f.tp_rank == 0 && f.dp_rank == 1) fb = &f;
    }
    ASSERT_TRUE(fa && fb);
    std::swap(fa->bytes, fb->bytes);
    std::swap(fa->xxh3, fb->xxh3);
    std::ofstream(mpath, std::ios::binary | std::ios::trunc) << m.to_json();
  });
  load_expecting_fallback(dir, 1, "is not the shard of TP rank 0, DP rank");
  // Put the shards back, then edit the manifest by hand (a seed) without re-sealing it.
  on_rank0([&] {
    const fs::path a = newest / "shard_tp000_dp00000.safetensors", b = newest / "shard_tp000_dp00001.safetensors";
    fs::rename(a, newest / "swap");
    fs::rename(b, a);
    fs::rename(newest / "swap", b);
    std::string edited = original;
    const auto at = edited.find("\"seed\": ");
    ASSERT_NE(at, std::string::npos);
    edited.insert(at + 8, "9");
    std::ofstream(mpath, std::ios::binary | std::ios::trunc) << edited;
  });
  load_expecting_fallback(dir, 1, "fails its own checksum");
  // A re-sealed manifest claiming an iteration its directory is not named for.
  on_rank0([&] {
    auto m = checkpoint::Manifest::parse(original, mpath.string());
    m.state.iteration = 7;
    std::ofstream(mpath, std::ios::binary | std::ios::trunc) << m.to_json();
  });
  load_expecting_fallback(dir, 1, "says iteration 7 but its directory is named for iteration 2");
  // Restored: the newest loads again (the checks reject only what is wrong).
  on_rank0([&] { std::ofstream(mpath, std::ios::binary | std::ios::trunc) << original; });
  {
    ZeroRun r(world(), spec_of(2, 2, 2));
    const auto res = checkpoint::load_checkpoint(dir, *r.engine, place(r));
    EXPECT_EQ(res.state.iteration, 2);
    EXPECT_TRUE(res.rejected.empty());
  }
  on_rank0([&] { fs::remove_all(dir); });
}

TEST(Damage, EmptyDirectoryIsAFreshStart) {
  if (world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const std::string dir = shared_temp_dir();
  ZeroRun r(world(), spec_of(2, 2, 1));
  const auto res = checkpoint::load_checkpoint(dir + "/not-yet", *r.engine, place(r));
  EXPECT_FALSE(res.loaded);
  on_rank0([&] { fs::remove_all(dir); });
}

TEST(Housekeeping, KeepsTheNewestKAndLatestNamesTheNewest) {
  if (world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const std::string dir = shared_temp_dir();
  // Debris of a save that crashed must not survive the next save.
  on_rank0([&] { fs::create_directories(fs::path(dir) / ".iter_0000009.tmp"); });
  save_series(dir, 4, 2);
  on_rank0([&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"iter_0000003", "iter_0000004", "latest"}));
    std::ifstream in(fs::path(dir) / "latest");
    std::string latest;
    in >> latest;
    EXPECT_EQ(latest, "iter_0000004");
    EXPECT_EQ(checkpoint::find_latest(dir), (fs::path(dir) / "iter_0000004").string());
    fs::remove_all(dir);
  });
}

TEST(Compatibility, ADifferentModelIsRefusedNamingTheFlags) {
  if (world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const std::string dir = shared_temp_dir();
  {
    ZeroRun a(world(), spec_of(2, 2, 2));
    checkpoint::save_checkpoint(dir, state_of(a, 0), *a.engine, place(a));
  }
  ZeroRunSpec wider = spec_of(2, 2, 2);
  wider.hidden = 48;
  ZeroRun b(world(), wider);
  try {
    checkpoint::load_checkpoint(dir, *b.engine, place(b));
    ADD_FAILURE() << "loaded a checkpoint of another model";
  } catch (const AgreedConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--hidden-size"), std::string::npos) << e.what();
  }
  on_rank0([&] { fs::remove_all(dir); });
}
