// Megatron's --tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR for
// the byte-level BPE tokenizers of Hugging Face's tokenizer.json (GPT-2,
// Llama 3, Qwen 2.5 and 3, DeepSeek V3, Mistral NeMo, ...), encoding and
// decoding as Hugging Face's `tokenizers` does:
//  1. the added tokens (<|endoftext|>, <|begin_of_text|>, ...) are found in
//     the text first, the longest at the leftmost place, and are their ids;
//  2. the text between them is normalized (none, or Unicode NFC), cut by the
//     pre-tokenizers (Split by a pattern, ByteLevel with GPT-2's pattern or
//     none, a Sequence of them) and each piece is BPE-encoded (byte_level_bpe.h);
//  3. the post-processor's template puts its tokens around a document (Llama
//     3's <|begin_of_text|> first), as Megatron's tokenize() does.
// The end of a document is tokenizer_config.json's eos_token, as Megatron's
// eod (the tokenizer's eos_token_id). Anything else tokenizer.json may hold (a
// WordPiece or Unigram model, byte fallback, Metaspace, other normalizers) is
// refused naming what it is.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "megazero/data/gpt2_tokenizer.h"

namespace megazero::data {

class HfBpeTokenizer : public Tokenizer {
 public:
  // path: a directory holding tokenizer.json and tokenizer_config.json (a
  // Hugging Face model's), or a tokenizer.json file with tokenizer_config.json
  // beside it. ConfigError naming --tokenizer-model, the file and the part.
  explicit HfBpeTokenizer(const std::string& path);
  ~HfBpeTokenizer() override;

  std::vector<std::int32_t> encode(std::string_view text) override;
  // Every token's bytes, the added ones' text too (Hugging Face's decode
  // without skip_special_tokens or clean_up_tokenization_spaces: the exact text).
  std::string decode(const std::vector<std::int32_t>& ids) const override;
  std::int64_t vocab_size() const override { return vocab_size_; }
  std::int32_t eod() const override { return eod_; }
  std::string name() const override { return "HuggingFaceTokenizer"; }
  std::unique_ptr<Tokenizer> clone() const override;
  // The ids the post-processor puts before and after each document.
  const std::vector<std::int32_t>& prefix() const { return prefix_; }
  const std::vector<std::int32_t>& suffix() const { return suffix_; }

 private:
  HfBpeTokenizer(const HfBpeTokenizer& other);  // clone's
  struct PreTokenizer {
    std::optional<RegexSplitter> split;  // Split, or ByteLevel with use_regex
    bool add_prefix_space = false;       // ByteLevel's
  };
  struct Added {
    std::string content;
    std::int32_t id;
    bool lstrip, rstrip;
  };
  void encode_ordinary(std::string_view text, std::vector<std::int32_t>& out);

  std::unique_ptr<BpeModel> bpe_;
  std::vector<PreTokenizer> pre_;
  bool nfc_ = false;
  std::vector<Added> added_;                     // longest first
  std::vector<std::vector<std::size_t>> first_;  // byte -> indices into added_ starting with it
  std::vector<std::string> added_text_;          // id -> an added token's text ("" for none)
  std::vector<std::int32_t> prefix_, suffix_;
  std::int32_t eod_ = -1;
  std::int64_t vocab_size_ = 0;
};

}  // namespace megazero::data
