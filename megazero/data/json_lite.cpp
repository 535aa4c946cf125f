#include "megazero/data/json_lite.h"

#include <stdexcept>

namespace megazero::data {

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

namespace {

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("malformed JSON at byte " + std::to_string(pos_) + ": " + what);
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() {
    if (at_end()) fail("unexpected end of input");
    return s_[pos_];
  }
  void expect(char c) {
    skip_ws();
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  bool consume(char c) {
    skip_ws();
    if (!at_end() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  unsigned hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= static_cast<unsigned>(c - 'A' + 10);
      else
        fail("bad hex digit in \\u escape");
    }
    return v;
  }

  std::string string() {
    expect('"');
    std::string out;
    while (true) {
      const char c = peek();
      ++pos_;
      if (c == '"') return out;
      if (c != '\\') {
        out += c;  // raw UTF-8 passes through unchanged
        continue;
      }
      const char e = peek();
      ++pos_;
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          char32_t cp = hex4();
          // A high surrogate must pair with a low one; a lone one becomes U+FFFD
          // as Python and JavaScript decoders do.
          if (cp >= 0xD800 && cp < 0xDC00 && pos_ + 6 <= s_.size() && s_[pos_] == '\\' && s_[pos_ + 1] == 'u') {
            const std::size_t save = pos_;
            pos_ += 2;
            const char32_t lo = hex4();
            if (lo >= 0xDC00 && lo < 0xE000)
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            else
              pos_ = save;
          }
          if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD;
          append_utf8(out, cp);
          break;
        }
        default:
          fail(std::string("unknown escape '\\") + e + "'");
      }
    }
  }

  std::int64_t integer() {
    skip_ws();
    const std::size_t start = pos_;
    if (!at_end() && s_[pos_] == '-') ++pos_;
    while (!at_end() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    if (pos_ == start || (pos_ == start + 1 && s_[start] == '-')) fail("expected an integer");
    if (!at_end() && (s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E'))
      fail("expected an integer, got a fraction");
    return std::stoll(std::string(s_.substr(start, pos_ - start)));
  }

  // Skips any value without building it (nested objects and arrays included).
  void skip_value() {
    skip_ws();
    const char c = peek();
    if (c == '"') {
      string();
    } else if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++pos_;
      if (consume(close)) return;
      do {
        if (c == '{') {
          string();
          expect(':');
        }
        skip_value();
      } while (consume(','));
      expect(close);
    } else {
      const std::size_t start = pos_;
      while (!at_end() && std::string_view(",}] \t\r\n").find(s_[pos_]) == std::string_view::npos) ++pos_;
      const std::string_view tok = s_.substr(start, pos_ - start);
      if (tok.empty()) fail("expected a value");
      if (tok != "true" && tok != "false" && tok != "null" &&
          tok.find_first_not_of("0123456789+-.eE") != std::string_view::npos)
        fail("expected a value, got '" + std::string(tok) + "'");
    }
  }

  void finish() {
    skip_ws();
    if (!at_end()) fail("trailing characters after the top-level value");
  }

 private:
  std::string_view s_;
  std::size_t pos_ = 0;
};

}  // namespace

std::unordered_map<std::string, std::int64_t> parse_json_string_int_map(std::string_view json) {
  Parser p(json);
  std::unordered_map<std::string, std::int64_t> out;
  p.expect('{');
  if (!p.consume('}')) {
    do {
      std::string key = p.string();
      p.expect(':');
      out[std::move(key)] = p.integer();
    } while (p.consume(','));
    p.expect('}');
  }
  p.finish();
  return out;
}

bool json_object_string_field(std::string_view json, std::string_view key, std::string& out) {
  Parser p(json);
  bool found = false;
  p.expect('{');
  if (!p.consume('}')) {
    do {
      const std::string k = p.string();
      p.expect(':');
      if (k == key) {
        p.skip_ws();
        if (p.peek() != '"') p.fail("field \"" + k + "\" is not a string");
        out = p.string();
        found = true;
      } else {
        p.skip_value();
      }
    } while (p.consume(','));
    p.expect('}');
  }
  p.finish();
  return found;
}

}  // namespace megazero::data
