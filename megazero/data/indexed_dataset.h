// Megatron-LM's indexed dataset (MMIDIDX): token ids in PREFIX.bin, an index in
// PREFIX.idx, byte-compatible with megatron/core/datasets/indexed_dataset.py so
// either framework reads the other's files. docs/DATA.md gives the layout.
//
// IndexedDataset mmaps the .bin read-only and checks every header field and
// every bound of the .idx when opened: a file that opens can be read without
// further checks. IndexedDatasetBuilder writes both files crash-safely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace megazero::data {

// Megatron's DType codes (indexed_dataset.py); only integer codes hold tokens.
enum class TokenDType : std::uint8_t { U8 = 1, I8 = 2, I16 = 3, I32 = 4, I64 = 5, F64 = 6, F32 = 7, U16 = 8 };
std::size_t token_dtype_size(TokenDType t);
const char* token_dtype_name(TokenDType t);
// uint16 when every id fits (GPT-2: 50257), else int32 — as Megatron picks.
TokenDType token_dtype_for_vocab(std::int64_t vocab_size);

template <typename T>
constexpr TokenDType token_dtype_of();
template <>
constexpr TokenDType token_dtype_of<std::uint8_t>() {
  return TokenDType::U8;
}
template <>
constexpr TokenDType token_dtype_of<std::int8_t>() {
  return TokenDType::I8;
}
template <>
constexpr TokenDType token_dtype_of<std::int16_t>() {
  return TokenDType::I16;
}
template <>
constexpr TokenDType token_dtype_of<std::int32_t>() {
  return TokenDType::I32;
}
template <>
constexpr TokenDType token_dtype_of<std::int64_t>() {
  return TokenDType::I64;
}
template <>
constexpr TokenDType token_dtype_of<std::uint16_t>() {
  return TokenDType::U16;
}

class IndexedDataset {
 public:
  // prefix is the path without .bin/.idx; flag names where it came from
  // ("--data-path") so errors point at the flag. Throws ConfigError naming the
  // file, what is wrong and the fix.
  static std::shared_ptr<const IndexedDataset> open(const std::string& prefix, const std::string& flag = "--data-path");
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  TokenDType dtype() const { return dtype_; }
  std::int64_t num_sequences() const { return static_cast<std::int64_t>(lengths_.size()); }
  // Documents are runs of sequences; one sequence per document unless the
  // corpus was split into sentences.
  std::int64_t num_documents() const { return static_cast<std::int64_t>(doc_index_.size()) - 1; }
  std::int64_t num_tokens() const { return num_tokens_; }
  std::int64_t sequence_length(std::int64_t i) const;
  const std::vector<std::int32_t>& sequence_lengths() const { return lengths_; }
  // Sequence range of document d is [document_indices()[d], document_indices()[d+1]).
  const std::vector<std::int64_t>& document_indices() const { return doc_index_; }

  // Tokens of sequence i, widened to int64.
  std::vector<std::int64_t> sequence(std::int64_t i) const;
  // count tokens of sequence i from offset, widened into out.
  void read(std::int64_t i, std::int64_t offset, std::int64_t count, std::int64_t* out) const;
  // Zero-copy view of sequence i; T must match dtype() (InternalError if not).
  template <typename T>
  std::span<const T> tokens(std::int64_t i) const {
    check_view(i, token_dtype_of<T>());
    return {reinterpret_cast<const T*>(bin_ + pointer(i)), static_cast<std::size_t>(lengths_[i])};
  }

 private:
  IndexedDataset() = default;
  std::int64_t pointer(std::int64_t i) const { return pointers_[static_cast<std::size_t>(i)]; }
  void check_view(std::int64_t i, TokenDType t) const;

  std::string prefix_;
  TokenDType dtype_ = TokenDType::U16;
  std::vector<std::int32_t> lengths_;
  std::vector<std::int64_t> pointers_, doc_index_;
  std::int64_t num_tokens_ = 0;
  const std::byte* bin_ = nullptr;  // mmap of PREFIX.bin (nullptr when empty)
  std::size_t bin_size_ = 0;
};

// Writes PREFIX.bin and PREFIX.idx. Data goes to PREFIX.{bin,idx}.tmp-PID,
// which finalize() fsyncs and renames into place (removing an old .idx first),
// so a crash never leaves a half-written file under a final name; at worst a
// lone .bin, which IndexedDataset::open reports as a missing .idx.
class IndexedDatasetBuilder {
 public:
  IndexedDatasetBuilder(std::string prefix, TokenDType dtype, std::string flag = "--output-prefix");
  ~IndexedDatasetBuilder();  // removes the temporary files unless finalized
  IndexedDatasetBuilder(const IndexedDatasetBuilder&) = delete;
  IndexedDatasetBuilder& operator=(const IndexedDatasetBuilder&) = delete;

  // Appends one sequence; ConfigError if a token does not fit the dtype.
  template <typename T>
  void add_sequence(std::span<const T> tokens) {
    static_assert(std::is_integral_v<T>);
    std::vector<std::int64_t> wide(tokens.begin(), tokens.end());
    add_sequence_i64(wide);
  }
  void add_sequence(const std::vector<std::int32_t>& tokens) { add_sequence(std::span<const std::int32_t>(tokens)); }
  void end_document();  // the sequences since the last call form one document
  void finalize();      // ends an open document, writes the index, renames

  std::int64_t num_sequences() const { return static_cast<std::int64_t>(lengths_.size()); }
  std::int64_t num_tokens() const { return num_tokens_; }

 private:
  void add_sequence_i64(const std::vector<std::int64_t>& tokens);
  void flush();
  [[noreturn]] void fail(const std::string& file, const std::string& what) const;

  std::string prefix_, flag_, bin_tmp_, idx_tmp_;
  TokenDType dtype_;
  int bin_fd_ = -1;
  std::vector<char> buffer_;
  std::vector<std::int32_t> lengths_;
  std::vector<std::int64_t> doc_index_{0};
  std::int64_t num_tokens_ = 0;
  bool finalized_ = false;
};

}  // namespace megazero::data
