// GPT training samples over an IndexedDataset split.
//
// A split is a contiguous range of documents. Each epoch e concatenates the
// split's documents in an order shuffled by std::mt19937_64(seed + e) into one
// token stream and cuts it into samples of seq_length + 1 tokens (inputs and
// the targets shifted by one) at a stride of seq_length, as Megatron does; the
// epoch's samples are then visited in an order shuffled by the same generator.
// Sample i is sample i % samples_per_epoch() of epoch i / samples_per_epoch().
//
// Everything is a pure function of (dataset, seq_length, seed, split, i): any
// rank, any data-parallel layout and any request order sees the same samples.
// Shuffles use a hand-written Fisher-Yates (std::shuffle's distribution is not
// the same across standard libraries).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "megazero/data/indexed_dataset.h"

namespace megazero::data {

struct DocRange {
  std::int64_t begin = 0, end = 0;  // documents [begin, end)
  std::int64_t size() const { return end - begin; }
};

enum class Split { Train = 0, Valid = 1, Test = 2 };
const char* split_name(Split s);

// "949,50,1" -> weights normalised to sum 1 (missing parts are 0, as in
// Megatron). ConfigError naming `flag` for anything else.
std::array<double, 3> parse_split(const std::string& text, const std::string& flag = "--split");
// Megatron's get_split_indices: rounded cumulative shares of num_documents.
std::array<DocRange, 3> split_documents(const std::array<double, 3>& weights, std::int64_t num_documents);

class GptDataset {
 public:
  // ConfigError (naming --split / --seq-length) if the split holds fewer than
  // seq_length + 1 tokens.
  GptDataset(std::shared_ptr<const IndexedDataset> data, std::int64_t seq_length, std::uint64_t seed, DocRange docs,
             std::string name = "train");

  std::int64_t seq_length() const { return seq_length_; }
  std::int64_t tokens_per_epoch() const { return tokens_per_epoch_; }
  std::int64_t samples_per_epoch() const { return samples_per_epoch_; }
  const std::string& name() const { return name_; }

  // The seq_length + 1 tokens of sample i (any i >= 0). Thread-safe.
  void sample(std::int64_t i, std::span<std::int64_t> out) const;
  std::vector<std::int64_t> sample(std::int64_t i) const;

 private:
  struct Epoch {
    std::int64_t index = -1;
    std::vector<std::int64_t> doc_order;  // document ids in stream order
    std::vector<std::int64_t> doc_start;  // stream offset of each, plus the total
    std::vector<std::int64_t> sample_order;
  };
  std::shared_ptr<const Epoch> epoch(std::int64_t e) const;
  std::shared_ptr<const Epoch> build_epoch(std::int64_t e) const;

  std::shared_ptr<const IndexedDataset> data_;
  std::int64_t seq_length_;
  std::uint64_t seed_;
  DocRange docs_;
  std::string name_;
  std::vector<std::int64_t> doc_tokens_;  // tokens of each document in the range
  std::int64_t tokens_per_epoch_ = 0, samples_per_epoch_ = 0;
  mutable std::mutex mutex_;
  mutable std::array<std::shared_ptr<const Epoch>, 2> cache_;  // the two most recent epochs
};

}  // namespace megazero::data
