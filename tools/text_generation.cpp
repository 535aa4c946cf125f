#include "tools/text_generation.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "megazero/core/error.h"

namespace megazero::generation {

using I = std::int64_t;

void validate(const SamplingOptions& o, const OptionNames& n) {
  MZ_REQUIRE(std::isfinite(o.temperature) && o.temperature > 0, n.temperature, " must be a positive number, got ",
             o.temperature, " (", n.greedy, " takes the most likely token)");
  MZ_REQUIRE(o.top_k >= 0, n.top_k, " must be 0 (off) or a positive count, got ", o.top_k);
  MZ_REQUIRE(std::isfinite(o.top_p) && o.top_p > 0 && o.top_p <= 1, n.top_p, " must be in (0, 1] (1 = off), got ",
             o.top_p);
  MZ_REQUIRE(!o.greedy || (o.top_k == 0 && o.top_p == 1 && o.temperature == 1), n.greedy,
             " takes the most likely token: ", n.temperature, ", ", n.top_k, " and ", n.top_p,
             " shape sampling and have no effect with it; drop them or ", n.greedy);
  MZ_REQUIRE(std::isfinite(o.top_p_decay) && o.top_p_decay >= 0 && o.top_p_decay <= 1, n.top_p_decay,
             " must be in [0, 1] (0 = off), got ", o.top_p_decay);
  MZ_REQUIRE(o.top_p_decay == 0 || o.top_p < 1, n.top_p_decay, " decays ", n.top_p, " after each token: give ", n.top_p,
             " below 1 too");
  MZ_REQUIRE(std::isfinite(o.top_p_bound) && o.top_p_bound >= 0 && o.top_p_bound <= o.top_p, n.top_p_bound,
             " must be in [0, ", n.top_p, " = ", o.top_p, "] (0 = none), got ", o.top_p_bound);
  MZ_REQUIRE(o.top_p_bound == 0 || o.top_p_decay > 0, n.top_p_bound, " bounds ", n.top_p_decay,
             "'s decay and does nothing without it: give ", n.top_p_decay, " too, or drop ", n.top_p_bound);
}

bool line_stops(LineStop stop, const LineTokens& l, I previous, I token) {
  const bool newline = l.newline >= 0 && token == l.newline;
  const bool double_newline = l.double_newline >= 0 && token == l.double_newline;
  switch (stop) {
    case LineStop::None:
      return false;
    case LineStop::Line:
      return newline || double_newline;
    case LineStop::DoubleLine:
      return double_newline || (newline && previous == l.newline);
  }
  return false;
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
  // Megatron's decay: the next token's nucleus is narrower (not below the bound).
  if (o_.top_p_decay > 0) o_.top_p = std::max(o_.top_p * o_.top_p_decay, o_.top_p_bound);
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

namespace {
// A row's log softmax in double is row[t] - top - log_sum.
struct LogNormalizer {
  double top, log_sum;
};
LogNormalizer log_normalizer(const float* row, I vocab) {
  const double top = *std::max_element(row, row + vocab);
  double sum = 0;
  for (I t = 0; t < vocab; ++t) sum += std::exp(static_cast<double>(row[t]) - top);
  return {top, std::log(sum)};
}
// log softmax(row)[token], in double.
double log_probability(const float* row, I vocab, I token) {
  const LogNormalizer n = log_normalizer(row, vocab);
  return static_cast<double>(row[token]) - n.top - n.log_sum;
}
}  // namespace

Generated generate(hf::CheckpointModel& model, const std::vector<I>& prompt, const GenerateOptions& o,
                   const std::function<void(I)>& on_token) {
  const I positions = model.config().max_position_embeddings;
  const I n = static_cast<I>(prompt.size());
  MZ_REQUIRE(n > 0, "the prompt is empty: give --prompt TEXT or --prompt-tokens IDS");
  MZ_REQUIRE(o.max_new_tokens > 0 || (o.max_new_tokens == 0 && o.logprobs), "--max-new-tokens must be positive",
             o.max_new_tokens == 0 ? " (0 scores the prompt alone: add --logprobs)" : "", ", got ", o.max_new_tokens);
  MZ_REQUIRE(n + o.max_new_tokens <= positions, "a prompt of ", n, " tokens and --max-new-tokens ", o.max_new_tokens,
             " exceed the model's ", positions, " positions (max-position-embeddings)",
             n < positions ? detail::concat("; use --max-new-tokens ", positions - n, " or less")
                           : std::string("; shorten the prompt"));
  TokenSampler sampler(o.sampling);
  const auto t0 = std::chrono::steady_clock::now();
  const I vocab = model.config().vocab_size;
  Generated g;
  std::vector<I> seq = prompt;
  // With the key/value cache the prompt runs once and every step runs its
  // one new token; without it, every step runs the whole sequence.
  const bool cache = o.kv_cache && o.max_new_tokens > 0;
  if (cache) model.start_cache(n + o.max_new_tokens);
  std::vector<I> fresh = prompt;  // the tokens the cache has not seen
  std::vector<float> row;         // the logits the next token is drawn from
  if (o.logprobs) {
    // Every row of the prompt: each scores the prompt's next token, the last one draws.
    const std::vector<float> rows = cache ? model.extend(fresh, /*all_rows=*/true) : model.logits(seq);
    for (I i = 0; i + 1 < n; ++i) g.logprobs.push_back(log_probability(rows.data() + i * vocab, vocab, prompt[i + 1]));
    row.assign(rows.end() - vocab, rows.end());
  }
  while (static_cast<I>(g.tokens.size()) < o.max_new_tokens) {
    if (!o.logprobs || !g.tokens.empty()) row = cache ? model.extend(fresh) : model.logits(seq, /*last_only=*/true);
    const I previous = seq.back();
    if (o.no_newline_after_colon && o.lines.colon >= 0 && o.lines.newline >= 0 && previous == o.lines.colon)
      row[static_cast<std::size_t>(o.lines.newline)] = -1e10f;
    const I t = model.rank0_token(sampler.next(row));
    if (o.logprobs) g.logprobs.push_back(log_probability(row.data(), vocab, t));
    g.tokens.push_back(t);
    seq.push_back(t);
    fresh.assign(1, t);
    if (on_token) on_token(t);
    if ((o.stop_token && t == *o.stop_token) || line_stops(o.line_stop, o.lines, previous, t)) {
      g.stopped = true;
      break;
    }
  }
  g.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return g;
}

// Each sequence holds two key/value caches (its own and the reorder's copy).
constexpr I kMaxBeamWidth = 256;

void validate(const BeamOptions& o, const char* width_name, const char* penalty_name) {
  MZ_REQUIRE(o.width >= 1 && o.width <= kMaxBeamWidth, width_name, " must be 1 to ", kMaxBeamWidth, ", got ", o.width,
             " (each sequence holds a key/value cache)");
  MZ_REQUIRE(std::isfinite(o.length_penalty), penalty_name, " must be a finite number, got ", o.length_penalty);
  MZ_REQUIRE(o.max_new_tokens > 0, "beam search draws new tokens: the count must be positive, got ", o.max_new_tokens);
}

namespace beam {

void Finished::add(std::vector<I> tokens, double sum, bool stopped) {
  const double score = sum / std::pow(static_cast<double>(tokens.size()), length_penalty);
  if (static_cast<I>(kept.size()) >= width && score <= worst) return;
  kept.push_back({std::move(tokens), score, sum, stopped});
  const auto by_score = [](const Hypothesis& a, const Hypothesis& b) { return a.score < b.score; };
  if (static_cast<I>(kept.size()) > width) {
    // Drop the worst (the earliest added among equals); the next worst bounds.
    kept.erase(std::min_element(kept.begin(), kept.end(), by_score));
    worst = std::min_element(kept.begin(), kept.end(), by_score)->score;
  } else {
    worst = std::min(worst, score);
  }
}

bool Finished::done(double best_live_sum, I length) const {
  if (static_cast<I>(kept.size()) < width) return false;
  return worst >= best_live_sum / std::pow(static_cast<double>(length), length_penalty);
}

Choice choose(const std::vector<double>& sums, I vocab, I width, std::optional<I> stop) {
  std::vector<I> order(sums.size());
  std::iota(order.begin(), order.end(), I{0});
  // Enough candidates for `width` that are not the stop token (more are
  // sorted only where the stop token took many of these; a vocabulary
  // smaller than `width` leaves fewer sequences live).
  const std::size_t k = std::min(order.size(), static_cast<std::size_t>(2 * width + 1));
  auto better = [&](I a, I b) {
    const double x = sums[static_cast<std::size_t>(a)], y = sums[static_cast<std::size_t>(b)];
    return x > y || (x == y && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(), better);
  Choice c;
  c.best_sum = order.empty() ? 0 : sums[static_cast<std::size_t>(order.front())];
  for (std::size_t r = 0; r < order.size() && static_cast<I>(c.next.size()) < width; ++r) {
    if (r == k) std::sort(order.begin() + static_cast<std::ptrdiff_t>(k), order.end(), better);  // rarely
    const I parent = order[r] / vocab, token = order[r] % vocab;
    if (stop && token == *stop) {
      if (static_cast<I>(r) < width) c.stopped.push_back(parent);  // below: dropped
      continue;
    }
    c.next.push_back({parent, token});
  }
  return c;
}

}  // namespace beam

namespace {
// log softmax of a row, in double.
std::vector<double> log_softmax(const std::vector<float>& row) {
  const LogNormalizer n = log_normalizer(row.data(), static_cast<I>(row.size()));
  std::vector<double> out(row.size());
  for (std::size_t t = 0; t < row.size(); ++t) out[t] = static_cast<double>(row[t]) - n.top - n.log_sum;
  return out;
}
}  // namespace

std::vector<Hypothesis> beam_search(hf::CheckpointModel& model, const std::vector<I>& prompt, const BeamOptions& o) {
  const I positions = model.config().max_position_embeddings, vocab = model.config().vocab_size;
  const I n = static_cast<I>(prompt.size());
  validate(o);
  MZ_REQUIRE(n > 0, "the prompt is empty");
  MZ_REQUIRE(n + o.max_new_tokens <= positions, "a prompt of ", n, " tokens and ", o.max_new_tokens,
             " new tokens exceed the model's ", positions, " positions (max-position-embeddings)");
  struct Live {
    std::vector<I> tokens;
    double sum = 0;
  };
  model.start_cache(n + o.max_new_tokens, o.width);
  std::vector<Live> live(1);  // the prompt alone, in slot 0
  std::vector<std::vector<float>> rows(1, model.extend(prompt, false, 0));
  beam::Finished finished{o.width, o.length_penalty};
  bool done = false;
  for (I step = 0; step < o.max_new_tokens && !done; ++step) {
    if (step > 0) {
      rows.resize(live.size());
      for (std::size_t b = 0; b < live.size(); ++b)
        rows[b] = model.extend({live[b].tokens.back()}, false, static_cast<I>(b));
    }
    // Every live sequence's every next token, by the sum it would reach.
    std::vector<double> sums(live.size() * static_cast<std::size_t>(vocab));
    for (std::size_t b = 0; b < live.size(); ++b) {
      auto& row = rows[b];
      const I previous = live[b].tokens.empty() ? prompt.back() : live[b].tokens.back();
      if (o.no_newline_after_colon && o.lines.colon >= 0 && o.lines.newline >= 0 && previous == o.lines.colon)
        row[static_cast<std::size_t>(o.lines.newline)] = -1e10f;
      const std::vector<double> lp = log_softmax(row);
      for (I t = 0; t < vocab; ++t)
        sums[b * static_cast<std::size_t>(vocab) + static_cast<std::size_t>(t)] =
            live[b].sum + lp[static_cast<std::size_t>(t)];
    }
    const beam::Choice choice = beam::choose(sums, vocab, o.width, o.stop_token);
    for (I parent : choice.stopped) {
      std::vector<I> tokens = live[static_cast<std::size_t>(parent)].tokens;
      tokens.push_back(*o.stop_token);
      finished.add(std::move(tokens), sums[static_cast<std::size_t>(parent * vocab + *o.stop_token)], /*stopped=*/true);
    }
    // Rank 0's choices on every rank: (parent, token) for each next sequence, and whether the search is done.
    std::vector<I> agreed;
    for (const auto& [parent, token] : choice.next) agreed.insert(agreed.end(), {parent, token});
    agreed.push_back(finished.done(choice.best_sum, step + 1) ? 1 : 0);
    agreed = model.rank0_values(agreed);
    done = agreed.back() == 1;
    if (done) break;
    std::vector<Live> next;
    std::vector<I> parents;
    for (std::size_t i = 0; i + 1 < agreed.size(); i += 2) {
      const I parent = agreed[i], token = agreed[i + 1];
      Live l = live[static_cast<std::size_t>(parent)];
      l.tokens.push_back(token);
      l.sum = sums[static_cast<std::size_t>(parent * vocab + token)];
      next.push_back(std::move(l));
      parents.push_back(parent);
    }
    // Slots past the live ones keep whatever they held (the parents list is one a slot).
    for (I s = static_cast<I>(parents.size()); s < o.width; ++s) parents.push_back(s);
    model.reorder_caches(parents);
    live = std::move(next);
  }
  if (!done)
    for (auto& l : live) finished.add(l.tokens, l.sum, /*stopped=*/false);
  std::vector<Hypothesis> best = std::move(finished.kept);
  std::stable_sort(best.begin(), best.end(),
                   [](const Hypothesis& a, const Hypothesis& b) { return a.score > b.score; });
  return best;
}

}  // namespace megazero::generation
