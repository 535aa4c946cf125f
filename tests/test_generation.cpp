// Text generation (tools/text_generation.h): the sampling distribution against
// hand-computed ones (temperature, top-k with ties, top-p's nucleus, greedy),
// the sampler's draws against that distribution (frequencies, support,
// seeds), and generation from a trained checkpoint: greedy picks the argmax of
// the full logits of each prefix, stops on its stop token, refuses prompts
// past the positions, and runs the same on the isolated device. The
// independent check (a numpy GPT-2 over the Hugging Face export agreeing with
// each greedy token) is tests/cli/hf_export_e2e.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "megazero/checkpoint/checkpoint.h"
#include "megazero/core/error.h"
#include "tools/checkpoint_model.h"
#include "tools/hf_gpt2.h"
#include "tools/text_generation.h"
#include "zero_harness.h"

using namespace megazero;
using namespace megazero::generation;
using namespace megazero::testing_util;
namespace fs = std::filesystem;
using I = std::int64_t;

namespace {

MpiCommunicator& world() { return test_world(); }

// softmax(logits / t) in double.
std::vector<double> softmax(const std::vector<float>& logits, double t = 1.0) {
  std::vector<double> p;
  double mx = -1e300, sum = 0;
  for (float l : logits) mx = std::max(mx, l / t);
  for (float l : logits) p.push_back(std::exp(l / t - mx)), sum += p.back();
  for (double& x : p) x /= sum;
  return p;
}

void expect_probs(const std::vector<double>& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << what << " token " << i;
}

SamplingOptions opts(double t, I k, double p, std::uint64_t seed = 1) {
  SamplingOptions o;
  o.temperature = t, o.top_k = k, o.top_p = p, o.seed = seed;
  return o;
}

// The harness's tiny GPT trained one step on the world's ranks (`spec`'s
// layout), saved at dir/ckpt.
void save_trained(const std::string& dir, const ZeroRunSpec& spec) {
  ZeroRun run(world(), spec);
  run.train(0, 1);
  checkpoint::TrainState s;
  s.iteration = 1;
  s.seed = 5;
  s.config = hf::resolved_config(run.model->config(), 5);
  checkpoint::save_checkpoint(dir + "/ckpt", s, *run.engine, {&world(), 0, 1});
}

// A checkpoint of the harness's tiny GPT trained one step (TP 1, stage 0).
// llama: rotary positions, RMSNorm, SwiGLU, 8 heads in 4 query groups, an untied output layer.
struct Checkpoint {
  std::string dir;
  explicit Checkpoint(bool llama = false) {
    char tmpl[] = "/tmp/mz-generate-XXXXXX";
    dir = ::mkdtemp(tmpl);
    ZeroRunSpec spec;
    spec.steps = 1;
    spec.llama = llama;
    save_trained(dir, spec);
  }
  ~Checkpoint() { fs::remove_all(dir); }
};

}  // namespace

const std::vector<float> kLogits = {2.0f, 1.0f, 0.5f, 0.5f, -1.0f, 0.25f};

TEST(Sampling, TemperatureTopKAndTopPShapeTheDistribution) {
  const auto p = softmax(kLogits);
  expect_probs(sampling_distribution(kLogits, opts(1, 0, 1)), p, "plain softmax");
  expect_probs(sampling_distribution(kLogits, opts(0.5, 0, 1)), softmax(kLogits, 0.5), "temperature 0.5");
  // top-k 2: tokens 0 and 1, renormalised.
  expect_probs(sampling_distribution(kLogits, opts(1, 2, 1)), {p[0] / (p[0] + p[1]), p[1] / (p[0] + p[1]), 0, 0, 0, 0},
               "top-k 2");
  // top-k 3 with tokens 2 and 3 tied at the third value: the lower id is kept.
  const double s3 = p[0] + p[1] + p[2];
  expect_probs(sampling_distribution(kLogits, opts(1, 3, 1)), {p[0] / s3, p[1] / s3, p[2] / s3, 0, 0, 0},
               "top-k 3 (a tie)");
  // top-p: the most likely tokens until their mass reaches p (the crossing one kept).
  ASSERT_LT(p[0], 0.6);
  ASSERT_GE(p[0] + p[1], 0.6);
  const double s2 = p[0] + p[1];
  expect_probs(sampling_distribution(kLogits, opts(1, 0, 0.6)), {p[0] / s2, p[1] / s2, 0, 0, 0, 0}, "top-p 0.6");
  expect_probs(sampling_distribution(kLogits, opts(1, 0, p[0])), {1, 0, 0, 0, 0, 0}, "top-p at the first mass");
  // top-k, then top-p within the k kept: token 0 alone passes 0.5 of the two's mass.
  ASSERT_GT(p[0] / s2, 0.5);
  expect_probs(sampling_distribution(kLogits, opts(1, 2, 0.5)), {1, 0, 0, 0, 0, 0}, "top-k 2 then top-p 0.5");
  SamplingOptions g;
  g.greedy = true;
  expect_probs(sampling_distribution({0.5f, 3.0f, 3.0f, 1.0f}, g), {0, 1, 0, 0}, "greedy: the lowest id of equals");
}

TEST(Sampling, DrawsFollowTheDistributionAndTheSeed) {
  for (const auto& o : {opts(1, 0, 1, 3), opts(0.7, 4, 1, 4), opts(1.3, 0, 0.8, 5)}) {
    const auto want = sampling_distribution(kLogits, o);
    TokenSampler sampler(o);
    std::vector<double> count(kLogits.size(), 0.0);
    const int n = 200000;
    for (int i = 0; i < n; ++i) ++count[static_cast<std::size_t>(sampler.next(kLogits))];
    for (std::size_t t = 0; t < count.size(); ++t) {
      if (want[t] == 0) {
        EXPECT_EQ(count[t], 0) << "token " << t << " is outside the kept tokens";
      }
      // Five binomial standard deviations.
      EXPECT_NEAR(count[t] / n, want[t], 5 * std::sqrt(want[t] * (1 - want[t]) / n) + 1e-12) << "token " << t;
    }
  }
  auto draws = [](std::uint64_t seed) {
    TokenSampler s(opts(1, 0, 1, seed));
    std::vector<I> v;
    for (int i = 0; i < 64; ++i) v.push_back(s.next(kLogits));
    return v;
  };
  EXPECT_EQ(draws(9), draws(9));
  EXPECT_NE(draws(9), draws(10));
  SamplingOptions g;
  g.greedy = true;
  EXPECT_EQ(TokenSampler(g).next(kLogits), 0);
  EXPECT_EQ(TokenSampler(opts(1, 1, 1)).next(kLogits), 0) << "top-k 1 is greedy";
}

TEST(Sampling, OptionsOutsideTheirRangesAreRefused) {
  EXPECT_THROW(validate(opts(0, 0, 1)), ConfigError);
  EXPECT_THROW(validate(opts(-1, 0, 1)), ConfigError);
  EXPECT_THROW(validate(opts(1, -1, 1)), ConfigError);
  EXPECT_THROW(validate(opts(1, 0, 0)), ConfigError);
  EXPECT_THROW(validate(opts(1, 0, 1.5)), ConfigError);
  SamplingOptions g = opts(1, 5, 1);
  g.greedy = true;
  EXPECT_THROW(validate(g), ConfigError) << "--greedy with --top-k";
  EXPECT_NO_THROW(validate(opts(0.8, 40, 0.95)));
}

TEST(Generation, GreedyTakesTheArgmaxOfEachPrefixAndStops) {
  if (world().size() != 1) GTEST_SKIP() << "one rank";
  Checkpoint ck;
  hf::CheckpointModel model(ck.dir + "/ckpt", world());
  const auto& c = model.config();
  const std::vector<I> prompt = {3, 17, 5, 42};
  GenerateOptions o;
  o.sampling.greedy = true;
  o.max_new_tokens = 6;
  std::vector<I> streamed;
  const Generated g = generate(model, prompt, o, [&](I t) { streamed.push_back(t); });
  ASSERT_EQ(g.tokens.size(), 6u);
  EXPECT_FALSE(g.stopped);
  EXPECT_EQ(streamed, g.tokens);
  std::vector<I> seq = prompt;
  for (I t : g.tokens) {
    // The full logits of the prefix (every row; not the last-row path generation reads).
    const auto all = hf::checkpoint_logits(ck.dir + "/ckpt", seq, world());
    ASSERT_EQ(static_cast<I>(all.size()), static_cast<I>(seq.size()) * c.vocab_size);
    const auto last = all.begin() + static_cast<std::ptrdiff_t>((seq.size() - 1) * c.vocab_size);
    EXPECT_EQ(std::max_element(last, all.end()) - last, t) << "after " << seq.size() << " tokens";
    seq.push_back(t);
  }
  // Stopping on the third token drawn keeps it and ends there.
  o.stop_token = g.tokens[2];
  const Generated s = generate(model, prompt, o);
  const auto first = std::find(g.tokens.begin(), g.tokens.end(), g.tokens[2]) - g.tokens.begin();
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.tokens, std::vector<I>(g.tokens.begin(), g.tokens.begin() + first + 1));
  // Sampling: the same seed, the same tokens.
  GenerateOptions r;
  r.sampling = opts(0.9, 20, 0.95, 11);
  r.max_new_tokens = 8;
  EXPECT_EQ(generate(model, prompt, r).tokens, generate(model, prompt, r).tokens);
  // Past the positions, or outside the vocabulary: named.
  o.max_new_tokens = c.max_position_embeddings;
  try {
    generate(model, prompt, o);
    ADD_FAILURE() << "a generation past the positions ran";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("use --max-new-tokens " + std::to_string(c.max_position_embeddings - 4)),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(model.logits({0, c.vocab_size}), ConfigError);
  EXPECT_THROW(generate(model, {}, r), ConfigError);
}

// The isolated device (host code cannot touch its memory): the same tokens
// and, running the CPU's kernels, the same logits bit for bit.
TEST(Generation, TheIsolatedDeviceGeneratesAsTheCpu) {
  if (world().size() != 1) GTEST_SKIP() << "one rank";
  Checkpoint ck;
  hf::CheckpointModel cpu(ck.dir + "/ckpt", world()), iso(ck.dir + "/ckpt", world(), 0, "cpu-isolated");
  const std::vector<I> prompt = {1, 2, 3};
  EXPECT_EQ(cpu.logits(prompt), iso.logits(prompt));
  EXPECT_EQ(cpu.logits(prompt, true), iso.logits(prompt, true));
  GenerateOptions o;
  o.sampling = opts(1, 0, 0.9, 3);
  o.max_new_tokens = 5;
  EXPECT_EQ(generate(cpu, prompt, o).tokens, generate(iso, prompt, o).tokens);
}

// The key/value cache (layers/kv_cache.h): the prompt run once, then one token
// (or a few) at a time, gives the logits of the whole sequence's last row, to
// fp32 rounding (the GEMMs have other shapes), for the learned positions and
// for rotary ones with grouped-query attention; greedy generation draws the
// same tokens with and without it; the isolated device caches as the CPU, bit
// for bit; a cache too small is refused.
TEST(Generation, TheKeyValueCacheGivesTheWholeSequencesLogits) {
  if (world().size() != 1) GTEST_SKIP() << "one rank";
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "rope, RMSNorm, SwiGLU, GQA" : "learned positions, LayerNorm, GeLU");
    Checkpoint ck(llama);
    hf::CheckpointModel model(ck.dir + "/ckpt", world()), iso(ck.dir + "/ckpt", world(), 0, "cpu-isolated");
    std::vector<I> seq = {3, 17, 5, 42, 9};
    model.start_cache(16);
    iso.start_cache(16);
    auto expect_whole = [&](const std::vector<float>& cached, const char* what) {
      const auto whole = model.logits(seq, /*last_only=*/true);
      ASSERT_EQ(cached.size(), whole.size());
      double largest = 0, diff = 0;
      for (std::size_t i = 0; i < whole.size(); ++i) {
        largest = std::max(largest, std::fabs(static_cast<double>(whole[i])));
        diff = std::max(diff, std::fabs(static_cast<double>(cached[i]) - whole[i]));
      }
      EXPECT_LE(diff, 1e-5 * largest) << what << " after " << seq.size() << " tokens";
    };
    const auto first = model.extend(seq);
    EXPECT_EQ(iso.extend(seq), first) << "the isolated device's cache";
    expect_whole(first, "the prompt");
    for (const std::vector<I>& more : std::vector<std::vector<I>>{{7}, {11}, {2, 30, 8}, {1}}) {
      seq.insert(seq.end(), more.begin(), more.end());
      const auto got = model.extend(more);
      EXPECT_EQ(iso.extend(more), got);
      expect_whole(got, more.size() == 1 ? "one token" : "three tokens at once");
    }
    EXPECT_THROW(model.extend({1, 2, 3, 4, 5, 6}), ConfigError) << "11 of 16 positions held: 6 more do not fit";
    EXPECT_THROW(model.start_cache(model.config().max_position_embeddings + 1), ConfigError);
    GenerateOptions o;
    o.sampling.greedy = true;
    o.max_new_tokens = 8;
    const auto cached = generate(model, {3, 17, 5}, o).tokens;
    o.kv_cache = false;
    EXPECT_EQ(generate(model, {3, 17, 5}, o).tokens, cached);
  }
}

// The model split over the world's ranks (TP = ranks, tools/generate_text
// under mpiexec): a checkpoint saved at DP = ranks, ZeRO stage 3, resharded
// to TP shards on load, computes each rank's one-rank model's logits (every
// row, and the key/value cache's) to fp32 rounding (TP sums the same terms in
// another order); greedy generation draws on every rank the same tokens, each
// the one-rank model's most likely next token up to that rounding; a seed
// draws the same tokens again.
TEST(Generation, TensorParallelRanksComputeTheOneRankModel) {
  if (world().size() == 1) GTEST_SKIP() << "several ranks";
  auto self = world().split(world().rank(), 0, "generation-self");
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "rope, RMSNorm, SwiGLU, GQA" : "learned positions, LayerNorm, GeLU");
    const std::string dir = shared_temp_dir("mz-generate-tp");
    ZeroRunSpec spec;
    spec.steps = 1;
    spec.llama = llama;
    spec.dp = world().size();
    spec.stage = 3;
    save_trained(dir, spec);
    hf::CheckpointModel one(dir + "/ckpt", *self), split(dir + "/ckpt", world());
    EXPECT_EQ(split.tensor_parallel_size(), world().size());
    EXPECT_EQ(one.tensor_parallel_size(), 1);
    auto expect_close = [](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
      ASSERT_EQ(got.size(), want.size()) << what;
      double largest = 0, diff = 0;
      for (std::size_t i = 0; i < want.size(); ++i) {
        largest = std::max(largest, std::fabs(static_cast<double>(want[i])));
        diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - want[i]));
      }
      EXPECT_GT(largest, 0) << what;
      EXPECT_LE(diff, 1e-5 * largest) << what;
    };
    const std::vector<I> seq = {3, 17, 5, 42, 9, 1, 30};
    expect_close(split.logits(seq), one.logits(seq), "every row");
    split.start_cache(16);
    one.start_cache(16);
    expect_close(split.extend(seq), one.extend(seq), "the cached prompt");
    expect_close(split.extend({7}), one.extend({7}), "a cached token");
    // Greedy: the same tokens on every rank, each the one-rank model's argmax up to rounding.
    GenerateOptions o;
    o.sampling.greedy = true;
    o.max_new_tokens = 6;
    const std::vector<I> prompt = {3, 17, 5};
    const auto g = generate(split, prompt, o).tokens;
    ASSERT_EQ(g.size(), 6u);
    Tensor mine = Tensor::empty(make_device(DeviceKind::CPU), {6}, DType::I64, MemoryCategory::Workspace);
    Tensor all =
        Tensor::empty(make_device(DeviceKind::CPU), {6 * world().size()}, DType::I64, MemoryCategory::Workspace);
    std::copy(g.begin(), g.end(), mine.host_data<I>());
    world().all_gather(mine, all).wait();
    for (int r = 0; r < world().size(); ++r)
      EXPECT_EQ(std::vector<I>(all.host_data<I>() + 6 * r, all.host_data<I>() + 6 * (r + 1)), g) << "rank " << r;
    std::vector<I> prefix = prompt;
    for (I t : g) {
      const auto row = one.logits(prefix, /*last_only=*/true);
      const float best = *std::max_element(row.begin(), row.end());
      float largest = 0;
      for (float v : row) largest = std::max(largest, std::fabs(v));
      EXPECT_GE(row[static_cast<std::size_t>(t)], best - 2e-5f * largest) << "after " << prefix.size();
      prefix.push_back(t);
    }
    GenerateOptions r;
    r.sampling = opts(0.9, 20, 0.95, 11);
    r.max_new_tokens = 8;
    EXPECT_EQ(generate(split, prompt, r).tokens, generate(split, prompt, r).tokens);
    world().barrier().wait();
    if (world().rank() == 0) fs::remove_all(dir);
  }
}
