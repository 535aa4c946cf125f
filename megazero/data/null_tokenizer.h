// Megatron's NullTokenizer: text that is already token ids, written as
// decimal integers separated by white space ("17 4 2051"), with vocabulary
// size V (--vocab-size). Ids 0..V-1 are the data's; V itself is the end of a
// document (what --append-eod writes and --eod-mask-loss masks), so the
// model's vocabulary is V + 1, as Megatron builds it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "megazero/data/gpt2_tokenizer.h"

namespace megazero::data {

class NullTokenizer : public Tokenizer {
 public:
  // vocab_size: V, the ids the text may hold (ConfigError unless 1 <= V < 2^31 - 1).
  explicit NullTokenizer(std::int64_t vocab_size);

  // ConfigError naming the piece for anything but a decimal id in [0, V]
  // (signs, hex, fractions, ids past the vocabulary).
  std::vector<std::int32_t> encode(std::string_view text) override;
  std::string decode(const std::vector<std::int32_t>& ids) const override;  // ids joined by single spaces
  std::int64_t vocab_size() const override { return eod_ + std::int64_t{1}; }
  std::int32_t eod() const override { return eod_; }
  std::string name() const override { return "NullTokenizer"; }
  std::unique_ptr<Tokenizer> clone() const override { return std::make_unique<NullTokenizer>(eod_); }

 private:
  std::int32_t eod_;
};

}  // namespace megazero::data
