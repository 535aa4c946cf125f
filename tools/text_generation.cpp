#include "tools/text_generation.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "megazero/core/error.h"

namespace megazero::generation {

using I = std::int64_t;

void validate(const SamplingOptions& o) {
  MZ_REQUIRE(std::isfinite(o.temperature) && o.temperature > 0, "--temperature must be a positive number, got ",
             o.temperature, " (--greedy takes the most likely token)");
  MZ_REQUIRE(o.top_k >= 0, "--top-k must be 0 (off) or a positive count, got ", o.top_k);
  MZ_REQUIRE(std::isfinite(o.top_p) && o.top_p > 0 && o.top_p <= 1, "--top-p must be in (0, 1] (1 = off), got ",
             o.top_p);
  MZ_REQUIRE(!o.greedy || (o.top_k == 0 && o.top_p == 1 && o.temperature == 1),
             "--greedy takes the most likely token: --temperature, --top-k and --top-p shape sampling and have no "
             "effect with it; drop them or --greedy");
}

std::vector<double> sampling_distribution(const std::vector<float>& logits, const SamplingOptions& o) {
  const std::size_t v = logits.size();
  MZ_CHECK(v > 0, "sampling from an empty row of logits");
  std::vector<double> p(v, 0.0);
  if (o.greedy) {
    p[static_cast<std::size_t>(std::max_element(logits.begin(), logits.end()) - logits.begin())] = 1.0;
    return p;
  }
  // Most likely first; among equal logits, the lower id first.
  std::vector<std::size_t> order(v);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return logits[a] > logits[b]; });
  const std::size_t k = o.top_k > 0 ? std::min(v, static_cast<std::size_t>(o.top_k)) : v;
  const double top = static_cast<double>(logits[order[0]]) / o.temperature;
  double sum = 0;
  for (std::size_t r = 0; r < k; ++r) {
    const std::size_t t = order[r];
    p[t] = std::exp(static_cast<double>(logits[t]) / o.temperature - top);
    sum += p[t];
  }
  // The nucleus: the most likely tokens until their mass reaches top_p.
  double mass = 0;
  std::size_t kept = 0;
  while (kept < k) {
    mass += p[order[kept++]] / sum;
    if (mass >= o.top_p) break;
  }
  double kept_sum = 0;
  for (std::size_t r = 0; r < kept; ++r) kept_sum += p[order[r]];
  for (std::size_t r = 0; r < v; ++r) p[order[r]] = r < kept ? p[order[r]] / kept_sum : 0.0;
  return p;
}

TokenSampler::TokenSampler(const SamplingOptions& o) : o_(o), rng_(o.seed) { validate(o); }

I TokenSampler::next(const std::vector<float>& logits) {
  const std::vector<double> p = sampling_distribution(logits, o_);
  if (o_.greedy) return static_cast<I>(std::max_element(p.begin(), p.end()) - p.begin());
  // One uniform draw in [0, 1) against the cumulative mass (the last token
  // with mass takes any rounding left at the top).
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  double acc = 0;
  I last = 0;
  for (std::size_t t = 0; t < p.size(); ++t) {
    if (p[t] == 0) continue;
    last = static_cast<I>(t);
    acc += p[t];
    if (u < acc) return last;
  }
  return last;
}

Generated generate(hf::CheckpointModel& model, const std::vector<I>& prompt, const GenerateOptions& o,
                   const std::function<void(I)>& on_token) {
  const I positions = model.config().max_position_embeddings;
  const I n = static_cast<I>(prompt.size());
  MZ_REQUIRE(n > 0, "the prompt is empty: give --prompt TEXT or --prompt-tokens IDS");
  MZ_REQUIRE(o.max_new_tokens > 0, "--max-new-tokens must be positive, got ", o.max_new_tokens);
  MZ_REQUIRE(n + o.max_new_tokens <= positions, "a prompt of ", n, " tokens and --max-new-tokens ", o.max_new_tokens,
             " exceed the model's ", positions, " positions (max-position-embeddings)",
             n < positions ? detail::concat("; use --max-new-tokens ", positions - n, " or less")
                           : std::string("; shorten the prompt"));
  TokenSampler sampler(o.sampling);
  const auto t0 = std::chrono::steady_clock::now();
  Generated g;
  std::vector<I> seq = prompt;
  // With the key/value cache the prompt runs once and every step runs its
  // one new token; without it, every step runs the whole sequence.
  if (o.kv_cache) model.start_cache(n + o.max_new_tokens);
  std::vector<I> fresh = prompt;  // the tokens the cache has not seen
  while (static_cast<I>(g.tokens.size()) < o.max_new_tokens) {
    const I t =
        model.rank0_token(sampler.next(o.kv_cache ? model.extend(fresh) : model.logits(seq, /*last_only=*/true)));
    g.tokens.push_back(t);
    seq.push_back(t);
    fresh.assign(1, t);
    if (on_token) on_token(t);
    if (o.stop_token && t == *o.stop_token) {
      g.stopped = true;
      break;
    }
  }
  g.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return g;
}

}  // namespace megazero::generation
