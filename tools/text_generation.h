// Text generation from a checkpoint (tools/generate_text, docs/GENERATION.md):
// the model's next-token distribution shaped as Megatron's and Hugging Face's
// samplers shape it (temperature, then top-k, then top-p), drawn with a seeded
// generator, one token at a time. A key/value cache (layers/kv_cache.h) runs
// the prompt once and each later step only its one new token; without it
// (--no-kv-cache) every step runs the whole sequence. Megatron's generation
// options ride along: log-probabilities of every token (scoring a text with
// no new tokens), top-p decay, stops at the end of a line, no line break
// after a colon.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <vector>

#include "tools/checkpoint_model.h"

namespace megazero::generation {

struct SamplingOptions {
  bool greedy = false;       // --greedy: the most likely token (the lowest id among equals)
  double temperature = 1.0;  // --temperature (> 0): logits divided by it
  std::int64_t top_k = 0;    // --top-k: keep the k most likely tokens; 0 = all
  double top_p = 1.0;        // --top-p in (0, 1]: keep the most likely tokens up to this probability mass
  std::uint64_t seed = 1234;
  // Megatron's top_p_decay / top_p_bound: after each token drawn top_p is
  // multiplied by top_p_decay (0 = off), never going below top_p_bound.
  double top_p_decay = 0;
  double top_p_bound = 0;
};
// What the caller calls each option, for the errors: generate_text's flags
// by default; the REST server passes its JSON field names.
struct OptionNames {
  const char* temperature = "--temperature";
  const char* top_k = "--top-k";
  const char* top_p = "--top-p";
  const char* greedy = "--greedy";
  const char* top_p_decay = "--top-p-decay";
  const char* top_p_bound = "--top-p-bound";
};
// ConfigError naming the option for values outside their ranges.
void validate(const SamplingOptions& o, const OptionNames& names = {});

// The probabilities sampling draws from, over the whole vocabulary: softmax of
// logits / temperature (in double), then only the top_k most likely kept
// (ties at the k-th value broken towards lower ids), then only the shortest
// run of most likely tokens whose mass reaches top_p (the token that crosses
// it included), renormalised; 0 elsewhere. Greedy: 1 at the argmax.
std::vector<double> sampling_distribution(const std::vector<float>& logits, const SamplingOptions& o);

// Draws tokens from rows of logits; the same seed and logits give the same tokens.
class TokenSampler {
 public:
  explicit TokenSampler(const SamplingOptions& o);
  std::int64_t next(const std::vector<float>& logits);

 private:
  SamplingOptions o_;  // its top_p decays as tokens are drawn
  std::mt19937_64 rng_;
};

// The token ids of a line's end as the tokenizer writes them (-1: it has
// none): "\n", "\n\n" as one token, and ":" (newline_tokens in
// tools/generation_model.h finds them in a tokenizer's vocabulary).
struct LineTokens {
  std::int64_t newline = -1;
  std::int64_t double_newline = -1;
  std::int64_t colon = -1;
};
// Megatron's stop_on_eol / stop_on_double_eol.
enum class LineStop {
  None,
  Line,        // stop_on_eol: after "\n" or "\n\n"
  DoubleLine,  // stop_on_double_eol: after "\n\n", or "\n" right after "\n" (the prompt's last token counts)
};
// Whether drawing `token` after `previous` ends the generation under `stop`.
bool line_stops(LineStop stop, const LineTokens& lines, std::int64_t previous, std::int64_t token);

struct GenerateOptions {
  SamplingOptions sampling;
  std::int64_t max_new_tokens = 32;        // 0: only the prompt's log-probabilities (needs logprobs)
  std::optional<std::int64_t> stop_token;  // generation ends after drawing it (it is kept)
  LineStop line_stop = LineStop::None;     // also ends at a line's end (the token kept)
  LineTokens lines;                        // for line_stop and no_newline_after_colon
  // Megatron's prevent_newline_after_colon: after a ":" token the "\n" token
  // cannot be drawn (its logit set to -1e10, as Megatron does, also in its
  // log-probability).
  bool no_newline_after_colon = false;
  bool logprobs = false;  // Generated::logprobs
  bool kv_cache = true;   // false: --no-kv-cache
};
struct Generated {
  std::vector<std::int64_t> tokens;  // the new tokens, without the prompt
  bool stopped = false;              // ended on the stop token or a line's end
  double seconds = 0;
  // With GenerateOptions::logprobs, Megatron's output log-probabilities: for
  // each token of prompt + tokens after the first, log p(token | the tokens
  // before it) under the model's own logits (before temperature, top-k and
  // top-p, which only shape the drawing), computed in double.
  std::vector<double> logprobs;
};
// The prompt's continuation. ConfigError (naming --max-new-tokens) when the
// prompt and the new tokens exceed the model's positions, or when no token
// is asked for without logprobs; each token, as it is drawn, is passed to
// on_token (streaming output).
Generated generate(hf::CheckpointModel& model, const std::vector<std::int64_t>& prompt, const GenerateOptions& o,
                   const std::function<void(std::int64_t)>& on_token = {});

// Megatron's beam search (its server's beam_width and length_penalty): the
// `width` most likely continuations by the sum of their tokens'
// log-probabilities (the model's own, before any sampling shape), searched
// a token at a time over `width` sequences, each with its own key/value
// cache. A step ranks every live sequence's every next token; the best
// become the next step's sequences, except the stop token, which finishes a
// hypothesis where it ranks among the first `width` (and is dropped below).
// Hypotheses are scored by sum / length^length_penalty (length: the new
// tokens, the stop token counted); the search ends when `width` finished ones
// score at least what the best live sequence could (Megatron's is_done), or
// after max_new_tokens, when the live sequences join the finished ones.
// Ties rank the lower sequence, then the lower token id, first.
struct BeamOptions {
  std::int64_t width = 0;  // the sequences searched; 0 (the tools': no beam search) is refused by validate
  double length_penalty = 1.0;
  std::int64_t max_new_tokens = 32;
  std::optional<std::int64_t> stop_token;
  bool no_newline_after_colon = false;  // as GenerateOptions's, per sequence
  LineTokens lines;
};
struct Hypothesis {
  std::vector<std::int64_t> tokens;  // the new tokens (the stop token kept)
  double score = 0;                  // sum of log-probabilities / length^length_penalty
  double sum_logprobs = 0;
  bool stopped = false;  // ended on the stop token
};
// beam_search's parts, exposed for its tests.
namespace beam {
// One step's choice from the sums each live sequence's each next token would
// reach ([live sequences x vocab], row by row): the next sequences as
// (parent, token), best first, at most `width`, none the stop token; the
// parents whose stop token ranks among the first `width` candidates (each
// finishes a hypothesis; ranked lower it is dropped, as Megatron's); and the
// best candidate's sum. Ties rank the lower parent, then the lower token, first.
struct Choice {
  std::vector<std::pair<std::int64_t, std::int64_t>> next;
  std::vector<std::int64_t> stopped;
  double best_sum = 0;
};
Choice choose(const std::vector<double>& sums, std::int64_t vocab, std::int64_t width,
              std::optional<std::int64_t> stop);
// The finished hypotheses (Megatron's BeamHypotheses): the best `width` by
// score = sum / length^length_penalty (among equals the earlier added stays),
// and whether no live sequence can beat them any more: `width` kept and the
// worst at least the best live sum / length^length_penalty.
struct Finished {
  Finished(std::int64_t width_, double length_penalty_) : width(width_), length_penalty(length_penalty_) {}
  std::int64_t width;
  double length_penalty;
  std::vector<Hypothesis> kept;
  double worst = 1e9;
  void add(std::vector<std::int64_t> tokens, double sum, bool stopped);
  bool done(double best_live_sum, std::int64_t length) const;
};
}  // namespace beam

// ConfigError naming the option (generate_text's flags by default).
void validate(const BeamOptions& o, const char* width_name = "--beam-width",
              const char* penalty_name = "--length-penalty");
// The best min(width, found) hypotheses, best first; the same on every rank
// of the model's group (its choices are rank 0's).
std::vector<Hypothesis> beam_search(hf::CheckpointModel& model, const std::vector<std::int64_t>& prompt,
                                    const BeamOptions& o);

}  // namespace megazero::generation
