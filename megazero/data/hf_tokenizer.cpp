#include "megazero/data/hf_tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "megazero/core/error.h"

namespace megazero::data {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

json read_json(const fs::path& file, const std::string& model, const char* what) {
  std::ifstream in(file, std::ios::binary);
  MZ_REQUIRE(in.good(), "--tokenizer-model ", model, ": cannot read ", file.string(), " (", std::strerror(errno),
             "); pass a Hugging Face model's directory holding tokenizer.json and tokenizer_config.json");
  std::ostringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    throw ConfigError(detail::concat("--tokenizer-model ", model, ": ", file.string(), " is not ", what, " (", e.what(),
                                     "); a SentencePiece tokenizer.model goes with --tokenizer-type "
                                     "Llama2Tokenizer or GPTSentencePieceTokenizer"));
  }
}

// A PCRE2 pattern matching `literal` as it is.
std::string escaped(const std::string& literal) {
  std::string out;
  for (char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) out += '\\';
    out += c;
  }
  return out;
}

// Unicode NFC of text; text as it is where it is not valid UTF-8 (nothing to compose) or ASCII.
std::string nfc(std::string_view text) {
  if (std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }))
    return std::string(text);
  utf8proc_uint8_t* out = nullptr;
  const auto n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                   &out, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::string(text);
  std::string s(reinterpret_cast<char*>(out), static_cast<std::size_t>(n));
  std::free(out);
  return s;
}

// Unicode's White_Space, which an added token's lstrip/rstrip removes (Hugging
// Face's tokenizers: char::is_whitespace; transformers.js: \s, which also
// takes U+FEFF): tab to carriage return, space, U+0085, U+00A0, U+1680,
// U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000.
bool is_white_space(char32_t c) {
  return c == 0x20 || (c >= 0x09 && c <= 0x0D) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// The length in bytes of the white space (one code point) ending at text[end)
// or starting at text[pos], 0 where there is none. Every White_Space code
// point is at most three UTF-8 bytes.
std::size_t space_before(std::string_view text, std::size_t end) {
  for (std::size_t n = 1; n <= 3 && n <= end; ++n) {
    const auto* at = reinterpret_cast<const utf8proc_uint8_t*>(text.data() + end - n);
    utf8proc_int32_t c = -1;
    if (utf8proc_iterate(at, static_cast<utf8proc_ssize_t>(n), &c) == static_cast<utf8proc_ssize_t>(n))
      return c >= 0 && is_white_space(static_cast<char32_t>(c)) ? n : 0;
  }
  return 0;
}
std::size_t space_at(std::string_view text, std::size_t pos) {
  if (pos >= text.size()) return 0;
  utf8proc_int32_t c = -1;
  const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + pos),
                                  static_cast<utf8proc_ssize_t>(std::min<std::size_t>(4, text.size() - pos)), &c);
  return n > 0 && c >= 0 && is_white_space(static_cast<char32_t>(c)) ? static_cast<std::size_t>(n) : 0;
}

}  // namespace

HfBpeTokenizer::HfBpeTokenizer(const std::string& path) {
  const fs::path p(path);
  std::error_code ec;
  const bool dir = fs::is_directory(p, ec);
  const fs::path json_file = dir ? p / "tokenizer.json" : p;
  const fs::path config_file = (dir ? p : p.parent_path()) / "tokenizer_config.json";
  const json j = read_json(json_file, path, "a tokenizer.json");
  const std::string where = "--tokenizer-model " + path + ": " + json_file.string();
  auto refuse = [&](const std::string& what, const std::string& fix) {
    throw ConfigError(where + ": " + what + " is not supported (megazero reads byte-level BPE tokenizers: GPT-2, " +
                      "Llama 3, Qwen, DeepSeek V3, Mistral NeMo, ...)" + (fix.empty() ? "" : "; " + fix));
  };
  MZ_REQUIRE(j.is_object() && j.contains("model") && j["model"].is_object(), where,
             ": has no \"model\" object; pass a Hugging Face tokenizer.json");

  // The model: byte-level BPE.
  const json& m = j["model"];
  const std::string type = m.value("type", "");
  if (type != "BPE")
    refuse("a \"" + type + "\" model",
           "for a SentencePiece model use --tokenizer-type Llama2Tokenizer or GPTSentencePieceTokenizer with its "
           "tokenizer.model");
  if (m.value("byte_fallback", false))
    refuse("BPE with byte_fallback (a SentencePiece-style vocabulary: Llama 2's, Mistral 7B's)",
           "use --tokenizer-type Llama2Tokenizer with the model's tokenizer.model");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && !m[k].is_null() && m[k] != "") refuse(std::string("BPE's ") + k, "");
  if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0)
    refuse("BPE dropout (a training-time sampler)", "");
  MZ_REQUIRE(m.contains("vocab") && m["vocab"].is_object() && m.contains("merges") && m["merges"].is_array(), where,
             ": the BPE model has no \"vocab\" object or \"merges\" list");
  // The added tokens are found as text, never made by merges: the vocabulary
  // may hold them in any spelling (DeepSeek V3's '<｜▁pad▁｜>').
  std::set<std::string> added_texts;
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const auto& a : j["added_tokens"])
      if (a.is_object() && a.contains("content") && a["content"].is_string())
        added_texts.insert(a["content"].get<std::string>());
  std::unordered_map<std::string, std::int64_t> vocab;
  for (const auto& [text, id] : m["vocab"].items()) {
    MZ_REQUIRE(id.is_number_integer(), where, ": token '", text, "' has no integer id");
    if (!added_texts.count(text)) vocab.emplace(text, id.get<std::int64_t>());
  }
  std::vector<std::pair<std::string, std::string>> merges;
  for (const auto& e : m["merges"]) {
    if (e.is_string()) {  // "left right" (older files)
      const std::string s = e.get<std::string>();
      const auto sp = s.find(' ');
      MZ_REQUIRE(sp != std::string::npos && sp > 0 && sp + 1 < s.size(), where, ": merge '", s,
                 "' is not 'left right'");
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else {
      MZ_REQUIRE(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(), where, ": merge ", e.dump(),
                 " is neither 'left right' nor [left, right]");
      merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    }
  }
  bpe_ = std::make_unique<BpeModel>(vocab, merges, m.value("ignore_merges", false), where);

  // The normalizer: none or NFC.
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const json& n = j["normalizer"];
    const std::string t = n.value("type", "");
    const bool empty_sequence = t == "Sequence" && n.contains("normalizers") && n["normalizers"].empty();
    if (t == "NFC")
      nfc_ = true;
    else if (!empty_sequence)
      refuse("the normalizer \"" + t + "\"", "");
  }

  // The pre-tokenizers, in order; a ByteLevel one must be among them.
  bool byte_level = false;
  std::function<void(const json&)> add_pre = [&](const json& t) {
    const std::string kind = t.value("type", "");
    if (kind == "Sequence") {
      for (const auto& sub : t.at("pretokenizers")) add_pre(sub);
    } else if (kind == "ByteLevel") {
      byte_level = true;
      PreTokenizer pre;
      pre.add_prefix_space = t.value("add_prefix_space", false);
      if (t.value("use_regex", true)) pre.split.emplace(kGpt2SplitPattern, where + ": ByteLevel's pattern");
      pre_.push_back(std::move(pre));
    } else if (kind == "Split") {
      const json& pattern = t.at("pattern");
      if (t.value("behavior", "") != "Isolated" || t.value("invert", false))
        refuse("a Split pre-tokenizer with behavior " + t.value("behavior", std::string("?")) +
                   (t.value("invert", false) ? " inverted" : ""),
               "");
      PreTokenizer pre;
      if (pattern.contains("Regex"))
        pre.split.emplace(pattern["Regex"].get<std::string>(), where + ": a Split pre-tokenizer");
      else
        pre.split.emplace(escaped(pattern.at("String").get<std::string>()), where + ": a Split pre-tokenizer");
      pre_.push_back(std::move(pre));
    } else if (kind == "Digits") {
      PreTokenizer pre;
      pre.split.emplace(t.value("individual_digits", false) ? "[0-9]" : "[0-9]+", where + ": Digits");
      pre_.push_back(std::move(pre));
    } else {
      refuse("the pre-tokenizer \"" + kind + "\"",
             kind == "Metaspace" ? "Metaspace is SentencePiece's: use --tokenizer-type Llama2Tokenizer with the "
                                   "model's tokenizer.model"
                                 : "");
    }
  };
  if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) add_pre(j["pre_tokenizer"]);
  if (!byte_level) refuse("a tokenizer without a ByteLevel pre-tokenizer (not byte-level BPE)", "");

  // The decoder must give the bytes back.
  if (j.contains("decoder") && !j["decoder"].is_null() && j["decoder"].value("type", "") != "ByteLevel")
    refuse("the decoder \"" + j["decoder"].value("type", std::string("?")) + "\"", "");

  // The added tokens, found in the text before anything else.
  vocab_size_ = bpe_->size();
  if (j.contains("added_tokens"))
    for (const auto& a : j["added_tokens"]) {
      const std::string content = a.at("content").get<std::string>();
      const auto id = a.at("id").get<std::int64_t>();
      MZ_REQUIRE(id >= 0 && id < (1 << 24) && !content.empty(), where, ": added token ", a.dump(), " is malformed");
      if (a.value("single_word", false)) refuse("the added token '" + content + "' with single_word", "");
      added_.push_back({content, static_cast<std::int32_t>(id), a.value("lstrip", false), a.value("rstrip", false)});
      vocab_size_ = std::max<std::int64_t>(vocab_size_, id + 1);
    }
  std::stable_sort(added_.begin(), added_.end(),
                   [](const Added& a, const Added& b) { return a.content.size() > b.content.size(); });
  first_.assign(256, {});
  for (std::size_t i = 0; i < added_.size(); ++i) first_[static_cast<unsigned char>(added_[i].content[0])].push_back(i);
  added_text_.assign(static_cast<std::size_t>(vocab_size_), std::string());
  for (const auto& a : added_) added_text_[static_cast<std::size_t>(a.id)] = a.content;
  auto id_of = [&](const std::string& text) -> std::optional<std::int32_t> {
    for (const auto& a : added_)
      if (a.content == text) return a.id;
    return bpe_->id(text);
  };

  // The post-processor's template around a document.
  std::function<void(const json&)> add_post = [&](const json& t) {
    const std::string kind = t.value("type", "");
    if (kind == "Sequence") {
      for (const auto& sub : t.at("processors")) add_post(sub);
    } else if (kind == "TemplateProcessing") {
      bool after = false;
      for (const auto& item : t.at("single")) {
        if (item.contains("Sequence")) {
          after = true;
          continue;
        }
        const std::string name = item.at("SpecialToken").at("id").get<std::string>();
        const json& special = t.at("special_tokens").at(name);
        for (const auto& id : special.at("ids")) (after ? suffix_ : prefix_).push_back(id.get<std::int32_t>());
      }
    } else if (kind != "ByteLevel") {
      refuse("the post-processor \"" + kind + "\"", "");
    }
  };
  try {
    if (j.contains("post_processor") && !j["post_processor"].is_null()) add_post(j["post_processor"]);
  } catch (const json::exception& e) {
    throw ConfigError(where + ": the post-processor is malformed (" + e.what() + ")");
  }
  for (const auto id : prefix_) MZ_REQUIRE(id >= 0 && id < vocab_size_, where, ": template token id ", id);
  for (const auto id : suffix_) MZ_REQUIRE(id >= 0 && id < vocab_size_, where, ": template token id ", id);

  // The end of a document: tokenizer_config.json's eos_token.
  const std::string cfg_what = "--tokenizer-model " + path + ": " + config_file.string();
  MZ_REQUIRE(fs::exists(config_file, ec), cfg_what,
             " is missing: its eos_token is the end of a document (Megatron's eod); pass the model's directory "
             "with tokenizer.json and tokenizer_config.json");
  const json cfg = read_json(config_file, path, "a tokenizer_config.json");
  MZ_REQUIRE(cfg.is_object() && cfg.contains("eos_token") && !cfg["eos_token"].is_null(), cfg_what,
             ": has no eos_token, the end of a document (Megatron's eod)");
  const json& eos = cfg["eos_token"];
  const std::string eos_text = eos.is_string() ? eos.get<std::string>() : eos.value("content", std::string());
  const auto eos_id = id_of(eos_text);
  MZ_REQUIRE(eos_id.has_value(), cfg_what, ": its eos_token '", eos_text, "' is not a token of ", json_file.string());
  eod_ = *eos_id;
}

HfBpeTokenizer::~HfBpeTokenizer() = default;

HfBpeTokenizer::HfBpeTokenizer(const HfBpeTokenizer& other)
    : bpe_(std::make_unique<BpeModel>(*other.bpe_)),
      pre_(other.pre_),
      nfc_(other.nfc_),
      added_(other.added_),
      first_(other.first_),
      added_text_(other.added_text_),
      prefix_(other.prefix_),
      suffix_(other.suffix_),
      eod_(other.eod_),
      vocab_size_(other.vocab_size_) {}

std::unique_ptr<Tokenizer> HfBpeTokenizer::clone() const {
  return std::unique_ptr<Tokenizer>(new HfBpeTokenizer(*this));
}

void HfBpeTokenizer::encode_ordinary(std::string_view text, std::vector<std::int32_t>& out) {
  if (text.empty()) return;
  const std::string normalized = nfc_ ? nfc(text) : std::string();
  if (nfc_) text = normalized;
  std::deque<std::string> store;  // pieces a prefix space made
  std::vector<std::string_view> pieces{text}, next;
  for (const auto& pre : pre_) {
    next.clear();
    for (std::string_view piece : pieces) {
      if (pre.add_prefix_space && (piece.empty() || piece.front() != ' ')) {
        std::string& spaced = store.emplace_back(1, ' ');
        spaced.append(piece);
        piece = spaced;
      }
      if (pre.split)
        pre.split->split(piece, next);
      else
        next.push_back(piece);
    }
    std::swap(pieces, next);
  }
  for (const auto piece : pieces) bpe_->encode(piece, out);
}

std::vector<std::int32_t> HfBpeTokenizer::encode(std::string_view text) {
  std::vector<std::int32_t> out = prefix_;
  out.reserve(text.size() / 3 + prefix_.size() + suffix_.size());
  std::size_t start = 0, pos = 0;  // text[start, pos) is ordinary text not yet encoded
  while (pos < text.size()) {
    const Added* hit = nullptr;
    for (const std::size_t i : first_[static_cast<unsigned char>(text[pos])]) {
      const auto& a = added_[i];
      if (text.compare(pos, a.content.size(), a.content) == 0) {
        hit = &a;  // the longest: added_ is longest first
        break;
      }
    }
    if (!hit) {
      ++pos;
      continue;
    }
    std::size_t end = pos;
    if (hit->lstrip)
      for (std::size_t n; end > start && (n = space_before(text.substr(start), end - start)) > 0;) end -= n;
    encode_ordinary(text.substr(start, end - start), out);
    out.push_back(hit->id);
    pos += hit->content.size();
    if (hit->rstrip)
      for (std::size_t n; (n = space_at(text, pos)) > 0;) pos += n;
    start = pos;
  }
  encode_ordinary(text.substr(start), out);
  out.insert(out.end(), suffix_.begin(), suffix_.end());
  return out;
}

std::string HfBpeTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string out;
  for (const auto id : ids) {
    MZ_REQUIRE(id >= 0 && id < vocab_size_, "token id ", id, " is outside the HuggingFaceTokenizer vocabulary (size ",
               vocab_size_, ")");
    const std::string& added = added_text_[static_cast<std::size_t>(id)];
    out += !added.empty() ? added : id < bpe_->size() ? bpe_->bytes(id) : std::string();
  }
  return out;
}

}  // namespace megazero::data
