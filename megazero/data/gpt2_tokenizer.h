// Tokenizers for the data pipeline.
//  - Gpt2BpeTokenizer: GPT-2's byte-level BPE from encoder.json + vocab.bpe,
//    token-for-token equal to OpenAI's encoder.py (its pattern matched by
//    PCRE2 with Unicode's letter, number and space classes).
//  - ByteLevelTokenizer: id = byte value, plus an end-of-text id 256. Needs no
//    files; for tests and for runs without the GPT-2 vocabulary.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "megazero/data/byte_level_bpe.h"

namespace megazero::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<std::int32_t> encode(std::string_view text) = 0;
  virtual std::string decode(const std::vector<std::int32_t>& ids) const = 0;
  virtual std::int64_t vocab_size() const = 0;
  virtual std::int32_t eod() const = 0;  // the end-of-document token
  virtual std::string name() const = 0;
  // An independent copy for another thread (encode keeps a cache): cheaper
  // than reading the files again (preprocess_data --workers).
  virtual std::unique_ptr<Tokenizer> clone() const = 0;
};

class ByteLevelTokenizer : public Tokenizer {
 public:
  std::vector<std::int32_t> encode(std::string_view text) override;
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  std::int64_t vocab_size() const override { return 257; }
  std::int32_t eod() const override { return 256; }
  std::string name() const override { return "ByteLevel"; }
  std::unique_ptr<Tokenizer> clone() const override { return std::make_unique<ByteLevelTokenizer>(); }
};

class Gpt2BpeTokenizer : public Tokenizer {
 public:
  // Throws ConfigError naming the file (and the flag, --vocab-file or
  // --merge-file) when a file is missing or malformed, or the two disagree.
  Gpt2BpeTokenizer(const std::string& vocab_file, const std::string& merge_file);
  ~Gpt2BpeTokenizer() override;

  std::vector<std::int32_t> encode(std::string_view text) override;
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  std::int64_t vocab_size() const override;
  std::int32_t eod() const override { return eod_; }
  std::string name() const override { return "GPT2BPETokenizer"; }
  std::unique_ptr<Tokenizer> clone() const override;

  // The pre-tokenizer alone: GPT-2's regex split of text into UTF-8 pieces.
  static std::vector<std::string_view> pretokenize(std::string_view text);

 private:
  Gpt2BpeTokenizer(const Gpt2BpeTokenizer& other);  // clone's
  RegexSplitter split_;
  std::unique_ptr<BpeModel> bpe_;
  std::vector<std::string_view> pieces_;  // encode's, kept to reuse its storage
  std::int32_t eod_ = -1;
};

// The tokenizer types megazero reads and writes data with.
inline constexpr const char* kTokenizerTypes =
    "GPT2BPETokenizer, ByteLevel, Llama2Tokenizer, GPTSentencePieceTokenizer, HuggingFaceTokenizer, NullTokenizer";
// "GPT2BPETokenizer" (needs both files), "ByteLevel", the SentencePiece ones
// (data/sentencepiece_tokenizer.h) or "HuggingFaceTokenizer"
// (data/hf_tokenizer.h), which need tokenizer_model, or "NullTokenizer"
// (data/null_tokenizer.h), which needs null_vocab_size (--vocab-size);
// ConfigError otherwise, and for a file given to a type that does not read it.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, const std::string& vocab_file,
                                          const std::string& merge_file, const std::string& tokenizer_model = "",
                                          std::int64_t null_vocab_size = 0);

}  // namespace megazero::data
