// Byte-level BPE, the model GPT-2's files (gpt2_tokenizer.h) and Hugging
// Face's tokenizer.json of type "BPE" over ByteLevel pieces (hf_tokenizer.h)
// share: every token stands for a byte string, written in the vocabulary
// through GPT-2's bytes_to_unicode; a piece of text starts as one token a byte
// and the lowest-ranked adjacent pair is merged (every occurrence of it) until
// no adjacent pair is a merge. And the regular-expression split both use to
// cut text into pieces first (PCRE2 with Unicode properties: GPT-2's pattern,
// or a tokenizer.json's).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace megazero::data {

// GPT-2's reversible byte <-> printable code point map (bytes_to_unicode()).
char32_t gpt2_byte_to_unicode(std::uint8_t b);

// Appends the UTF-8 encoding of code point cp to out.
void append_utf8(std::string& out, char32_t cp);

class BpeModel {
 public:
  // vocab: token text -> id; merges: (left text, right text), by rank.
  // ignore_merges (Hugging Face's, Llama 3's): a piece that is a token
  // whole is that token, unmerged. ConfigError for a token that is not byte
  // text, an id given twice, a byte without its own token or a merge of
  // tokens the vocabulary lacks; `source` names the file(s) and the fix.
  BpeModel(const std::unordered_map<std::string, std::int64_t>& vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
           const std::string& source);

  // Appends the tokens of one piece (raw bytes).
  void encode(std::string_view piece, std::vector<std::int32_t>& out);
  // One past the largest id; ids without a token are empty byte strings.
  std::int64_t size() const { return static_cast<std::int64_t>(id_to_bytes_.size()); }
  // The raw bytes a token stands for ("" for an id the vocabulary skips).
  const std::string& bytes(std::int32_t id) const { return id_to_bytes_[static_cast<std::size_t>(id)]; }
  // The id of a token by its vocabulary text.
  std::optional<std::int32_t> id(const std::string& text) const;

 private:
  std::vector<std::string> id_to_bytes_;
  std::unordered_map<std::string, std::int32_t> text_to_id_;
  std::unordered_map<std::string, std::int32_t> bytes_to_id_;  // for ignore_merges
  std::int32_t byte_id_[256] = {};
  // (left id, right id) -> (merge rank, merged id)
  std::unordered_map<std::uint64_t, std::pair<std::int32_t, std::int32_t>> merges_;
  bool ignore_merges_ = false;
  // Pieces repeat heavily in text ("the", " and"); caching their BPE makes
  // encoding several times faster. Cleared when it grows past kCacheLimit.
  std::unordered_map<std::string, std::vector<std::int32_t>> cache_;
  static constexpr std::size_t kCacheLimit = 1 << 20;
};

// Text cut by a regular expression as Hugging Face's Split pre-tokenizer with
// behavior "Isolated" cuts it: each match is a piece, and so is each run of
// text between matches. PCRE2 in UTF mode with Unicode properties (\p{L},
// \p{N}, \s as Unicode White_Space) and invalid UTF-8 allowed: invalid bytes
// match nothing and fall between matches, so every byte string is cut whole.
class RegexSplitter {
 public:
  // ConfigError naming `source` for a pattern PCRE2 cannot compile.
  RegexSplitter(const std::string& pattern, const std::string& source);
  ~RegexSplitter();
  RegexSplitter(RegexSplitter&&) noexcept;
  RegexSplitter& operator=(RegexSplitter&&) noexcept;
  RegexSplitter(const RegexSplitter& other);  // the pattern compiled again (match data is per splitter)
  // Appends text's pieces to out, in order; together they are text.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// GPT-2's pre-tokenizer pattern (OpenAI's encoder.py, Hugging Face's ByteLevel with use_regex).
inline constexpr const char* kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace megazero::data
