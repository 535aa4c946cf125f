// Text generation from a checkpoint (tools/generate_text, docs/GENERATION.md):
// the model's next-token distribution shaped as Megatron's and Hugging Face's
// samplers shape it (temperature, then top-k, then top-p), drawn with a seeded
// generator, one token at a time. A key/value cache (layers/kv_cache.h) runs
// the prompt once and each later step only its one new token; without it
// (--no-kv-cache) every step runs the whole sequence.
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
};
// ConfigError naming the flag for values outside their ranges.
void validate(const SamplingOptions& o);

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
  SamplingOptions o_;
  std::mt19937_64 rng_;
};

struct GenerateOptions {
  SamplingOptions sampling;
  std::int64_t max_new_tokens = 32;
  std::optional<std::int64_t> stop_token;  // generation ends after drawing it (it is kept)
  bool kv_cache = true;                    // false: --no-kv-cache
};
struct Generated {
  std::vector<std::int64_t> tokens;  // the new tokens, without the prompt
  bool stopped = false;              // ended on the stop token
  double seconds = 0;
};
// The prompt's continuation. ConfigError (naming --max-new-tokens) when the
// prompt and the new tokens exceed the model's positions; each token, as it
// is drawn, is passed to on_token (streaming output).
Generated generate(hf::CheckpointModel& model, const std::vector<std::int64_t>& prompt, const GenerateOptions& o,
                   const std::function<void(std::int64_t)>& on_token = {});

}  // namespace megazero::generation
