#include "megazero/data/byte_level_bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "megazero/core/error.h"

namespace megazero::data {

namespace {

// bytes_to_unicode: printable bytes map to themselves, the other 68 to
// U+0100.. in byte order, so every byte string is a printable token string.
struct ByteMap {
  char32_t to_cp[256];
  ByteMap() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// One UTF-8 code point at s[i] (its length in len), or nothing for invalid UTF-8.
std::optional<char32_t> next_cp(std::string_view s, std::size_t i, std::size_t& len) {
  const auto b = static_cast<unsigned char>(s[i]);
  const int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
  len = 1;
  if (n == 0 || i + static_cast<std::size_t>(n) > s.size()) return std::nullopt;
  char32_t cp = n == 1 ? b : b & (0x7F >> n);
  for (int k = 1; k < n; ++k) {
    const auto c = static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]);
    if ((c >> 6) != 2) return std::nullopt;
    cp = (cp << 6) | (c & 0x3F);
  }
  len = static_cast<std::size_t>(n);
  return cp;
}

std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
}

}  // namespace

char32_t gpt2_byte_to_unicode(std::uint8_t b) { return byte_map().to_cp[b]; }

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// ---------------------------------------------------------------- BpeModel

BpeModel::BpeModel(const std::unordered_map<std::string, std::int64_t>& vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
                   const std::string& source)
    : ignore_merges_(ignore_merges) {
  MZ_REQUIRE(!vocab.empty(), source, ": holds no tokens");
  std::unordered_map<char32_t, int> cp_to_byte;
  for (int b = 0; b < 256; ++b) cp_to_byte[gpt2_byte_to_unicode(static_cast<std::uint8_t>(b))] = b;
  std::int64_t max_id = -1;
  for (const auto& [text, id] : vocab) {
    MZ_REQUIRE(id >= 0 && id < (1 << 24), source, ": token id ", id, " is out of range");
    max_id = std::max(max_id, id);
  }
  id_to_bytes_.assign(static_cast<std::size_t>(max_id + 1), std::string());
  std::vector<bool> seen(id_to_bytes_.size(), false);
  for (const auto& [text, id] : vocab) {
    MZ_REQUIRE(!seen[static_cast<std::size_t>(id)], source, ": id ", id, " is given to two tokens");
    seen[static_cast<std::size_t>(id)] = true;
    std::string bytes;
    for (std::size_t i = 0, len = 0; i < text.size(); i += len) {
      const auto cp = next_cp(text, i, len);
      const auto it = cp ? cp_to_byte.find(*cp) : cp_to_byte.end();
      MZ_REQUIRE(it != cp_to_byte.end(), source, ": token '", text,
                 "' is not byte-level BPE text (bytes written through GPT-2's bytes_to_unicode)");
      bytes += static_cast<char>(it->second);
    }
    const auto i32 = static_cast<std::int32_t>(id);
    if (ignore_merges_) bytes_to_id_.emplace(bytes, i32);
    id_to_bytes_[static_cast<std::size_t>(id)] = std::move(bytes);
    text_to_id_[text] = i32;
  }
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, gpt2_byte_to_unicode(static_cast<std::uint8_t>(b)));
    const auto it = text_to_id_.find(s);
    MZ_REQUIRE(it != text_to_id_.end(), source, ": has no token for byte ", b,
               " (a byte-level vocabulary has one for each of the 256)");
    byte_id_[b] = it->second;
  }
  std::int32_t rank = 0;
  for (const auto& [left, right] : merges) {
    const auto l = text_to_id_.find(left), r = text_to_id_.find(right), m = text_to_id_.find(left + right);
    MZ_REQUIRE(l != text_to_id_.end() && r != text_to_id_.end() && m != text_to_id_.end(), source, ": merge ", rank + 1,
               " ('", left, "' '", right, "') joins tokens the vocabulary does not have");
    merges_.try_emplace(pair_key(l->second, r->second), rank++, m->second);
  }
  MZ_REQUIRE(rank > 0, source, ": holds no merges");
}

std::optional<std::int32_t> BpeModel::id(const std::string& text) const {
  const auto it = text_to_id_.find(text);
  if (it == text_to_id_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::encode(std::string_view piece, std::vector<std::int32_t>& out) {
  if (piece.empty()) return;
  if (ignore_merges_) {
    const auto whole = bytes_to_id_.find(std::string(piece));
    if (whole != bytes_to_id_.end()) {
      out.push_back(whole->second);
      return;
    }
  }
  const auto hit = cache_.find(std::string(piece));
  if (hit != cache_.end()) {
    out.insert(out.end(), hit->second.begin(), hit->second.end());
    return;
  }
  std::vector<std::int32_t> word(piece.size());
  for (std::size_t i = 0; i < piece.size(); ++i) word[i] = byte_id_[static_cast<unsigned char>(piece[i])];
  // encoder.py's loop: merge every occurrence of the lowest-ranked pair until
  // no adjacent pair is a merge.
  while (word.size() > 1) {
    std::int32_t best_rank = -1, first = 0, second = 0, merged = 0;
    for (std::size_t i = 0; i + 1 < word.size(); ++i) {
      const auto m = merges_.find(pair_key(word[i], word[i + 1]));
      if (m != merges_.end() && (best_rank < 0 || m->second.first < best_rank)) {
        best_rank = m->second.first;
        first = word[i];
        second = word[i + 1];
        merged = m->second.second;
      }
    }
    if (best_rank < 0) break;
    std::size_t w = 0;
    for (std::size_t i = 0; i < word.size(); ++w) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        word[w] = merged;
        i += 2;
      } else {
        word[w] = word[i++];
      }
    }
    word.resize(w);
  }
  out.insert(out.end(), word.begin(), word.end());
  if (cache_.size() >= kCacheLimit) cache_.clear();
  cache_.emplace(std::string(piece), std::move(word));
}

// ---------------------------------------------------------------- RegexSplitter

struct RegexSplitter::Impl {
  std::string pattern, source;
  pcre2_code* code = nullptr;
  pcre2_match_data* match = nullptr;
  ~Impl() {
    if (match) pcre2_match_data_free(match);
    if (code) pcre2_code_free(code);
  }
};

RegexSplitter::RegexSplitter(const std::string& pattern, const std::string& source) : impl_(std::make_unique<Impl>()) {
  impl_->pattern = pattern;
  impl_->source = source;
  int error = 0;
  PCRE2_SIZE at = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &at, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(error, msg, sizeof msg);
    throw ConfigError(detail::concat(source, ": the pattern '", pattern, "' does not compile (",
                                     reinterpret_cast<char*>(msg), " at offset ", at, ")"));
  }
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);  // where JIT is missing, the interpreter matches alike
  impl_->match = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
}

RegexSplitter::~RegexSplitter() = default;
RegexSplitter::RegexSplitter(const RegexSplitter& other) : RegexSplitter(other.impl_->pattern, other.impl_->source) {}
RegexSplitter::RegexSplitter(RegexSplitter&&) noexcept = default;
RegexSplitter& RegexSplitter::operator=(RegexSplitter&&) noexcept = default;

void RegexSplitter::split(std::string_view text, std::vector<std::string_view>& out) const {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t done = 0, from = 0;  // text[0, done) is cut; matching resumes at from
  while (from < text.size()) {
    const int rc = pcre2_match(impl_->code, subject, text.size(), from, 0, impl_->match, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    MZ_CHECK(rc > 0, "PCRE2 matching failed with code ", rc);
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(impl_->match);
    const std::size_t b = ov[0], e = ov[1];
    if (e == b) {  // an empty match cuts nothing: go on after the next byte
      from = b + 1;
      continue;
    }
    if (b > done) out.push_back(text.substr(done, b - done));
    out.push_back(text.substr(b, e - b));
    done = from = e;
  }
  if (done < text.size()) out.push_back(text.substr(done));
}

}  // namespace megazero::data
