// What generate_text and text_generation_server share: the flags that name
// the checkpoint, its tokenizer and where the model runs, and the model they
// open from them (docs/GENERATION.md). Under mpiexec -n N the model is split
// over the N ranks at TP N; every function here is collective over `world`
// and raises the same ConfigError on every rank.
#pragma once

#include <boost/program_options.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "megazero/comm/communicator.h"
#include "megazero/data/gpt2_tokenizer.h"
#include "tools/checkpoint_model.h"
#include "tools/text_generation.h"

namespace megazero::generation {

struct ModelOptions {
  std::string load;
  std::string tokenizer_type, vocab_file, merge_file, tokenizer_model;
  std::string device = "cpu";
  std::int64_t heads = 0;            // --num-attention-heads, for configurations that lack it
  std::int64_t tensor_parallel = 0;  // --tensor-model-parallel-size: 0 = the ranks mpiexec started
};

// --load, the tokenizer flags, --device, --num-attention-heads, --tensor-model-parallel-size.
void add_model_options(boost::program_options::options_description& d, ModelOptions& o);

// The tokenizer the flags name (GPT-2 BPE by default when --vocab-file and
// --merge-file are given), or null when they name none.
std::unique_ptr<data::Tokenizer> open_tokenizer(ModelOptions& o);

// The checkpoint's model over the ranks of `world` (each its GPU of its host
// under --device cuda), checked against the tokenizer's vocabulary; rank 0
// warns of each unusable checkpoint skipped, as `program`.
std::unique_ptr<hf::CheckpointModel> open_model(const ModelOptions& o, const data::Tokenizer* tok, Communicator& world,
                                                const char* program);

// The stop token: `asked` (checked against the model's vocabulary, naming
// `flag`), or the tokenizer's end of text where the model can draw it, or none.
std::optional<std::int64_t> stop_token_of(std::optional<std::int64_t> asked, const char* flag,
                                          const hf::CheckpointModel& model, const data::Tokenizer* tok);

// The ids of "\n", "\n\n" and ":" in the tokenizer's vocabulary below
// `vocab` (the lowest id whose text is exactly that; -1 where none is), for
// the line stops and the colon rule (Megatron hard-codes GPT-2's 198, 628
// and 25, which this finds in GPT-2's vocabulary).
LineTokens line_tokens(const data::Tokenizer& tok, std::int64_t vocab);

}  // namespace megazero::generation
