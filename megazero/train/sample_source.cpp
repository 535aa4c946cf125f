#include "megazero/train/sample_source.h"

#include <algorithm>
#include <array>
#include <optional>

#include "megazero/core/error.h"
#include "megazero/data/blend.h"
#include "megazero/data/gpt_dataset.h"

namespace megazero::train {
namespace {

// Deterministic pseudo-random tokens (splitmix64 of split, sample, position):
// for benchmarks, where only shapes and FLOPs matter.
class MockSource final : public SampleSource {
 public:
  explicit MockSource(std::int64_t vocab) : vocab_(vocab) {}
  std::int64_t vocab_size() const override { return vocab_; }
  std::string describe() const override {
    return "mock data (synthetic tokens, vocabulary " + std::to_string(vocab_) + ")";
  }
  bool has(Split) const override { return true; }
  void fill(Split split, std::int64_t first, std::int64_t B, std::int64_t S, const std::shared_ptr<Device>& device,
            Tensor& ids, Tensor& targets) override {
    ids = Tensor::empty(device, {B * S}, DType::I64, MemoryCategory::Activations);
    targets = Tensor::empty(device, {B * S}, DType::I64, MemoryCategory::Activations);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t <= S; ++t) {
        const std::int64_t tok = token(static_cast<std::uint64_t>(split), static_cast<std::uint64_t>(first + b),
                                       static_cast<std::uint64_t>(t));
        if (t < S) ids.host_data<std::int64_t>()[b * S + t] = tok;
        if (t > 0) targets.host_data<std::int64_t>()[b * S + t - 1] = tok;
      }
  }

 private:
  std::int64_t token(std::uint64_t split, std::uint64_t sample, std::uint64_t pos) const {
    std::uint64_t z =
        (split * 0x9E3779B97F4A7C15ull) ^ (sample * 0xBF58476D1CE4E5B9ull) ^ (pos * 0x94D049BB133111EBull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return static_cast<std::int64_t>((z ^ (z >> 31)) % static_cast<std::uint64_t>(vocab_));
  }
  std::int64_t vocab_;
};

// Megatron's indexed dataset, split by documents (--split), sampled in
// seq_length + 1 token windows over a seeded document order.
class DatasetSource final : public SampleSource {
 public:
  // whole: every document in that split (Megatron's --train-data-path,
  // --valid-data-path, --test-data-path), not --split's shares.
  DatasetSource(const TrainArgs& args, const std::string& prefix, std::optional<Split> whole = std::nullopt)
      : vocab_(args.model.vocab_size) {
    const std::string flag = !whole                   ? "--data-path"
                             : *whole == Split::Train ? "--train-data-path"
                             : *whole == Split::Valid ? "--valid-data-path"
                                                      : "--test-data-path";
    data_ = data::IndexedDataset::open(prefix, flag);
    std::array<double, 3> shares = {0, 0, 0};
    if (whole) shares[static_cast<std::size_t>(*whole)] = 1;
    const auto ranges =
        data::split_documents(whole ? shares : data::parse_split(args.split, "--split"), data_->num_documents());
    const char* names[] = {"train", "valid", "test"};
    for (int i = 0; i < 3; ++i)
      if (ranges[static_cast<std::size_t>(i)].size() > 0)
        splits_[i] = std::make_unique<data::GptDataset>(data_, args.model.seq_length, args.seed,
                                                        ranges[static_cast<std::size_t>(i)], names[i]);
    const int mine = whole ? static_cast<int>(*whole) : 0;
    MZ_REQUIRE(splits_[mine] && splits_[mine]->samples_per_epoch() > 0, flag, " ", prefix, ": the ", names[mine],
               " split holds too few tokens for one sample of --seq-length ", args.model.seq_length,
               " + 1; use more data, a shorter --seq-length", whole ? "" : ", or a larger training --split weight");
    if (whole) return;  // the per-split source checks that validation has its data
    // Validation on the training split would report a training loss as a validation one.
    MZ_REQUIRE(
        args.eval_iters == 0 || (splits_[1] && splits_[1]->samples_per_epoch() > 0), "--split ", args.split,
        " leaves --data-path ", prefix, " no validation samples (of ", data_->num_documents(),
        " documents) but --eval-iters ", args.eval_iters,
        " asks for validation; give the validation split a weight (e.g. --split 969,30,1) or pass --eval-iters 0");
  }
  std::int64_t vocab_size() const override { return vocab_; }
  std::string describe() const override {
    std::string s = data_->prefix() + " (" + std::to_string(data_->num_documents()) + " documents";
    const char* names[] = {"train", "valid", "test"};
    for (int i = 0; i < 3; ++i)
      if (splits_[i])
        s += std::string(", ") + names[i] + " " + std::to_string(splits_[i]->samples_per_epoch()) + " samples/epoch";
    return s + ")";
  }
  bool has(Split split) const override {
    const auto& ds = splits_[static_cast<int>(split)];
    return ds && ds->samples_per_epoch() > 0;
  }
  void fill(Split split, std::int64_t first, std::int64_t B, std::int64_t S, const std::shared_ptr<Device>& device,
            Tensor& ids, Tensor& targets) override {
    ids = Tensor::empty(device, {B * S}, DType::I64, MemoryCategory::Activations);
    targets = Tensor::empty(device, {B * S}, DType::I64, MemoryCategory::Activations);
    for (std::int64_t b = 0; b < B; ++b) fill_one(split, first + b, S, ids, targets, b);
  }
  // Sample i of `split` into row `row` of ids/targets.
  void fill_one(Split split, std::int64_t i, std::int64_t S, Tensor& ids, Tensor& targets, std::int64_t row) const {
    const auto& ds = splits_[static_cast<int>(split)] ? splits_[static_cast<int>(split)] : splits_[0];
    std::vector<std::int64_t> tokens(static_cast<std::size_t>(S + 1));
    ds->sample(i, tokens);
    // An id past the vocabulary would read no embedding row and train on
    // garbage (data tokenized for another model): a clear error instead.
    for (const std::int64_t t : tokens)
      MZ_REQUIRE(t >= 0 && t < vocab_, "--data-path ", data_->prefix(), ": token id ", t, " in sample ", i,
                 " is outside the vocabulary of --vocab-size ", vocab_,
                 "; the data was tokenized for a larger vocabulary: pass its tokenizer's size (GPT-2 BPE: 50257)");
    std::copy(tokens.begin(), tokens.end() - 1, ids.host_data<std::int64_t>() + row * S);
    std::copy(tokens.begin() + 1, tokens.end(), targets.host_data<std::int64_t>() + row * S);
  }

 private:
  std::int64_t vocab_;
  std::shared_ptr<const data::IndexedDataset> data_;
  std::unique_ptr<data::GptDataset> splits_[3];
};

// Several datasets mixed by weight (data/blend.h): blended sample i is sample
// pick(i).index of dataset pick(i).dataset, in every split.
class BlendedSource final : public SampleSource {
 public:
  BlendedSource(const TrainArgs& args, const std::vector<double>& weights, const std::vector<std::string>& prefixes,
                std::optional<Split> whole = std::nullopt)
      : schedule_(weights), weights_(weights), vocab_(args.model.vocab_size) {
    for (const auto& p : prefixes) sources_.push_back(std::make_unique<DatasetSource>(args, p, whole));
  }
  std::int64_t vocab_size() const override { return vocab_; }
  std::string describe() const override {
    double total = 0;
    for (double w : weights_) total += w;
    std::string s = "blend of " + std::to_string(sources_.size()) + " datasets:";
    for (std::size_t d = 0; d < sources_.size(); ++d)
      s += "\n     " + std::to_string(weights_[d] / total) + " (" + std::to_string(schedule_.slots_per_block(d)) + "/" +
           std::to_string(schedule_.block_size()) + " of each block) " + sources_[d]->describe();
    return s;
  }
  bool has(Split split) const override {
    return std::all_of(sources_.begin(), sources_.end(), [&](const auto& s) { return s->has(split); });
  }
  void fill(Split split, std::int64_t first, std::int64_t B, std::int64_t S, const std::shared_ptr<Device>& device,
            Tensor& ids, Tensor& targets) override {
    ids = Tensor::empty(device, {B * S}, DType::I64, MemoryCategory::Activations);
    targets = Tensor::empty(device, {B * S}, DType::I64, MemoryCategory::Activations);
    for (std::int64_t b = 0; b < B; ++b) {
      const auto pick = schedule_.pick(first + b);
      sources_[static_cast<std::size_t>(pick.dataset)]->fill_one(split, pick.index, S, ids, targets, b);
    }
  }

 private:
  data::BlendSchedule schedule_;
  std::vector<double> weights_;
  std::int64_t vocab_;
  std::vector<std::unique_ptr<DatasetSource>> sources_;
};

// One dataset (or blend) over --data-path's --split, or wholly one split's.
std::unique_ptr<SampleSource> dataset_source(const TrainArgs& args, const std::vector<std::string>& path,
                                             const std::string& flag, std::optional<Split> whole) {
  std::vector<double> weights;
  std::vector<std::string> prefixes;
  data::parse_blend(path, weights, prefixes, flag);
  if (prefixes.size() == 1) return std::make_unique<DatasetSource>(args, prefixes[0], whole);
  return std::make_unique<BlendedSource>(args, weights, prefixes, whole);
}

// Megatron's --train-data-path / --valid-data-path / --test-data-path: each
// split read from its own datasets, whole.
class PerSplitSource final : public SampleSource {
 public:
  explicit PerSplitSource(const TrainArgs& args) : vocab_(args.model.vocab_size) {
    const std::vector<std::string>* paths[] = {&args.train_data_path, &args.valid_data_path, &args.test_data_path};
    const char* flags[] = {"--train-data-path", "--valid-data-path", "--test-data-path"};
    for (int i = 0; i < 3; ++i)
      if (!paths[i]->empty()) parts_[i] = dataset_source(args, *paths[i], flags[i], static_cast<Split>(i));
  }
  std::int64_t vocab_size() const override { return vocab_; }
  std::string describe() const override {
    const char* names[] = {"train", "valid", "test"};
    std::string s = "a dataset per split:";
    for (int i = 0; i < 3; ++i)
      if (parts_[i]) s += std::string("\n     ") + names[i] + ": " + parts_[i]->describe();
    return s;
  }
  bool has(Split split) const override {
    const auto& p = parts_[static_cast<int>(split)];
    return p && p->has(split);
  }
  void fill(Split split, std::int64_t first, std::int64_t B, std::int64_t S, const std::shared_ptr<Device>& device,
            Tensor& ids, Tensor& targets) override {
    const auto& p = parts_[static_cast<int>(split)];
    MZ_CHECK(p, "no dataset for split ", static_cast<int>(split));  // validate() requires the ones read
    p->fill(split, first, B, S, device, ids, targets);
  }

 private:
  std::int64_t vocab_;
  std::unique_ptr<SampleSource> parts_[3];
};

}  // namespace

std::unique_ptr<SampleSource> make_sample_source(const TrainArgs& args) {
  if (args.mock_data) return std::make_unique<MockSource>(args.model.vocab_size);
  if (!args.train_data_path.empty()) return std::make_unique<PerSplitSource>(args);
  return dataset_source(args, args.data_path, "--data-path", std::nullopt);
}

}  // namespace megazero::train
