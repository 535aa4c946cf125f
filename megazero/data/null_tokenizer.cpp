#include "megazero/data/null_tokenizer.h"

#include <limits>

#include "megazero/core/error.h"

namespace megazero::data {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

}  // namespace

NullTokenizer::NullTokenizer(std::int64_t vocab_size) : eod_(0) {
  MZ_REQUIRE(vocab_size >= 1 && vocab_size < std::numeric_limits<std::int32_t>::max(),
             "--tokenizer-type NullTokenizer needs --vocab-size N, the number of token ids the data holds (1 to ",
             std::numeric_limits<std::int32_t>::max() - 1, "; id N then ends a document); got ", vocab_size);
  eod_ = static_cast<std::int32_t>(vocab_size);
}

std::vector<std::int32_t> NullTokenizer::encode(std::string_view text) {
  std::vector<std::int32_t> out;
  std::size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && is_space(text[i])) ++i;
    if (i == text.size()) break;
    const std::size_t begin = i;
    while (i < text.size() && !is_space(text[i])) ++i;
    const std::string_view piece = text.substr(begin, i - begin);
    // Digits only, at most as many as V's: no sign, no leading '+', no 0x.
    std::int64_t id = 0;
    bool ok = piece.size() <= 10;
    for (char c : piece) {
      if (c < '0' || c > '9') {
        ok = false;
        break;
      }
      id = id * 10 + (c - '0');
    }
    MZ_REQUIRE(ok && id <= eod_, "--tokenizer-type NullTokenizer: '", std::string(piece.substr(0, 40)),
               piece.size() > 40 ? "...'" : "'",
               " is not a token id: the text must be decimal ids from 0 to --vocab-size (", eod_,
               ", the end of a document) separated by spaces");
    out.push_back(static_cast<std::int32_t>(id));
  }
  return out;
}

std::string NullTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string out;
  for (std::size_t k = 0; k < ids.size(); ++k) {
    MZ_REQUIRE(ids[k] >= 0 && ids[k] <= eod_, "token id ", ids[k], " is outside NullTokenizer's vocabulary [0, ", eod_,
               "]");
    if (k) out += ' ';
    out += std::to_string(ids[k]);
  }
  return out;
}

}  // namespace megazero::data
