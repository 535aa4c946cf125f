#include "tools/generation_model.h"

#include <algorithm>
#include <cstdio>

#include "megazero/comm/consensus.h"
#include "megazero/core/device.h"
#include "megazero/core/error.h"
#include "parallel_state/process_groups.h"

namespace megazero::generation {

namespace po = boost::program_options;
using I = std::int64_t;

void add_model_options(po::options_description& d, ModelOptions& o) {
  d.add_options()("load", po::value(&o.load),
                  "a pretrain_gpt --save directory (its newest checkpoint) or one iter_NNNNNNN directory; any TP x DP "
                  "x ZeRO layout")(
      "tokenizer-type", po::value(&o.tokenizer_type),
      "GPT2BPETokenizer (with --vocab-file and --merge-file; the default when they are given), ByteLevel, "
      "Llama2Tokenizer, GPTSentencePieceTokenizer or HuggingFaceTokenizer (with --tokenizer-model)")(
      "tokenizer-model", po::value(&o.tokenizer_model),
      "the SentencePiece model (tokenizer.model) of Llama2Tokenizer and GPTSentencePieceTokenizer, or the directory "
      "of HuggingFaceTokenizer's tokenizer.json and tokenizer_config.json")(
      "vocab-file", po::value(&o.vocab_file), "GPT-2 encoder.json")("merge-file", po::value(&o.merge_file),
                                                                    "GPT-2 vocab.bpe")(
      "device", po::value(&o.device),
      "where the model runs: cpu, cuda, cuda:N or cpu-isolated; under mpiexec, cuda is each rank's GPU of its host")(
      "num-attention-heads", po::value(&o.heads), "only for checkpoints whose configuration lacks it")(
      "tensor-model-parallel-size", po::value(&o.tensor_parallel),
      "the model split over this many ranks: the number mpiexec starts (the default); 1 without mpiexec");
}

std::unique_ptr<data::Tokenizer> open_tokenizer(ModelOptions& o) {
  if (o.tokenizer_type.empty() && (!o.vocab_file.empty() || !o.merge_file.empty()))
    o.tokenizer_type = "GPT2BPETokenizer";
  MZ_REQUIRE(!o.tokenizer_type.empty() || o.tokenizer_model.empty(),
             "--tokenizer-model needs --tokenizer-type Llama2Tokenizer, GPTSentencePieceTokenizer or "
             "HuggingFaceTokenizer");
  if (o.tokenizer_type.empty()) return nullptr;
  MZ_REQUIRE(o.tokenizer_type != "NullTokenizer",
             "--tokenizer-type NullTokenizer: its text is token ids, which generate_text takes as --prompt-tokens and "
             "the server as \"prompt_tokens\", and prints as ids without a tokenizer: drop --tokenizer-type");
  return data::make_tokenizer(o.tokenizer_type, o.vocab_file, o.merge_file, o.tokenizer_model);
}

namespace {
// --device cuda under mpiexec: each rank the GPU of its place among the
// ranks on its host (as pretrain_gpt picks it).
std::string rank_device(const std::string& device, Communicator& world) {
  if (device != "cuda" || world.size() == 1) return device;
  const auto hosts = parallel_state::gather_host_names(world);
  const std::string& me = hosts[static_cast<std::size_t>(world.rank())];
  const auto local = std::count(hosts.begin(), hosts.begin() + world.rank(), me);
  return run_consistently(world, [&] {
    const int gpus = cuda_visible_devices();
    MZ_REQUIRE(gpus > 0, "--device cuda: no GPU is visible on ", me,
               " (check CUDA_VISIBLE_DEVICES and the driver, or use --device cpu)");
    return "cuda:" + std::to_string(local % gpus);
  });
}
}  // namespace

std::unique_ptr<hf::CheckpointModel> open_model(const ModelOptions& o, const data::Tokenizer* tok, Communicator& world,
                                                const char* program) {
  run_consistently(world, [&] {
    MZ_REQUIRE(!o.load.empty(), "--load is required: a checkpoint directory (pretrain_gpt --save, or an import)");
    MZ_REQUIRE(o.tensor_parallel == 0 || o.tensor_parallel == world.size(), "--tensor-model-parallel-size ",
               o.tensor_parallel, ": ", program, " splits the model over all its ranks, and mpiexec started ",
               world.size(), "; start it with mpiexec -n ", o.tensor_parallel,
               o.tensor_parallel == 1 ? " (or without mpiexec)" : "", " or leave the flag out");
  });
  auto model = std::make_unique<hf::CheckpointModel>(o.load, world, o.heads,
                                                     rank_device(o.device.empty() ? "cpu" : o.device, world));
  if (world.rank() == 0)
    for (const auto& r : model->rejected())
      std::fprintf(stderr, "%s: WARNING: skipped unusable checkpoint %s\n", program, r.c_str());
  const I vocab = model->config().vocab_size;
  run_consistently(world, [&] {
    MZ_REQUIRE(!tok || tok->vocab_size() >= vocab, "the model's vocabulary of ", vocab, " tokens is larger than the ",
               tok ? tok->name() : "", " tokenizer's ", tok ? tok->vocab_size() : 0,
               ": its tokens could not be written as text; use the tokenizer the data was made with");
  });
  return model;
}

std::optional<I> stop_token_of(std::optional<I> asked, const char* flag, const hf::CheckpointModel& model,
                               const data::Tokenizer* tok) {
  const I vocab = model.config().vocab_size;
  if (asked) {
    MZ_REQUIRE(*asked >= 0 && *asked < vocab, flag, " ", *asked, " is outside the model's vocabulary [0, ", vocab,
               "): it could never be drawn; give a token id of the model, or --no-stop");
    return asked;
  }
  if (tok && tok->eod() < vocab) return tok->eod();
  return std::nullopt;
}

LineTokens line_tokens(const data::Tokenizer& tok, I vocab) {
  LineTokens l;
  const I n = std::min(vocab, tok.vocab_size());
  for (I id = 0; id < n && (l.newline < 0 || l.double_newline < 0 || l.colon < 0); ++id) {
    const std::string text = tok.decode({static_cast<std::int32_t>(id)});
    I* slot = text == "\n" ? &l.newline : text == "\n\n" ? &l.double_newline : text == ":" ? &l.colon : nullptr;
    if (slot && *slot < 0) *slot = id;
  }
  return l;
}

}  // namespace megazero::generation
