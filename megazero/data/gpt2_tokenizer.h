// Tokenizers for the data pipeline.
//  - Gpt2BpeTokenizer: GPT-2's byte-level BPE from encoder.json + vocab.bpe,
//    token-for-token equal to OpenAI's encoder.py (see docs/DATA.md for the one
//    approximation: Unicode letter/number classes come from a small table).
//  - ByteLevelTokenizer: id = byte value, plus an end-of-text id 256. Needs no
//    files; for tests and for runs without the GPT-2 vocabulary.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace megazero::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<std::int32_t> encode(std::string_view text) = 0;
  virtual std::string decode(const std::vector<std::int32_t>& ids) const = 0;
  virtual std::int64_t vocab_size() const = 0;
  virtual std::int32_t eod() const = 0;  // the end-of-document token
  virtual std::string name() const = 0;
};

class ByteLevelTokenizer : public Tokenizer {
 public:
  std::vector<std::int32_t> encode(std::string_view text) override;
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  std::int64_t vocab_size() const override { return 257; }
  std::int32_t eod() const override { return 256; }
  std::string name() const override { return "ByteLevel"; }
};

class Gpt2BpeTokenizer : public Tokenizer {
 public:
  // Throws ConfigError naming the file (and the flag, --vocab-file or
  // --merge-file) when a file is missing or malformed, or the two disagree.
  Gpt2BpeTokenizer(const std::string& vocab_file, const std::string& merge_file);

  std::vector<std::int32_t> encode(std::string_view text) override;
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  std::int64_t vocab_size() const override { return static_cast<std::int64_t>(id_to_bytes_.size()); }
  std::int32_t eod() const override { return eod_; }
  std::string name() const override { return "GPT2BPETokenizer"; }

  // The pre-tokenizer alone: GPT-2's regex split of text into UTF-8 pieces.
  static std::vector<std::string_view> pretokenize(std::string_view text);

 private:
  void bpe(std::string_view piece, std::vector<std::int32_t>& out);

  std::vector<std::string> id_to_bytes_;  // id -> raw bytes it stands for
  std::int32_t byte_id_[256] = {};        // byte -> id of its one-byte token
  // (left id, right id) -> (merge rank, merged id)
  std::unordered_map<std::uint64_t, std::pair<std::int32_t, std::int32_t>> merges_;
  std::int32_t eod_ = -1;
  // Pieces repeat heavily in text ("the", " and"); caching their BPE makes
  // encoding several times faster. Cleared when it grows past kCacheLimit.
  std::unordered_map<std::string, std::vector<std::int32_t>> cache_;
  static constexpr std::size_t kCacheLimit = 1 << 20;
};

// The tokenizer types megazero reads and writes data with.
inline constexpr const char* kTokenizerTypes =
    "GPT2BPETokenizer, ByteLevel, Llama2Tokenizer, GPTSentencePieceTokenizer";
// "GPT2BPETokenizer" (needs both files), "ByteLevel", or the SentencePiece
// ones (data/sentencepiece_tokenizer.h: need tokenizer_model); ConfigError
// otherwise, and for a file given to a type that does not read it.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, const std::string& vocab_file,
                                          const std::string& merge_file, const std::string& tokenizer_model = "");

// GPT-2's reversible byte <-> printable code point map (bytes_to_unicode()).
char32_t gpt2_byte_to_unicode(std::uint8_t b);

}  // namespace megazero::data
