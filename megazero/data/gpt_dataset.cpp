#include "megazero/data/gpt_dataset.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

#include "megazero/core/error.h"

namespace megazero::data {

namespace {

// Uniform in [0, n) from mt19937_64's (standardised) output, by rejection.
std::uint64_t uniform_below(std::mt19937_64& g, std::uint64_t n) {
  const std::uint64_t threshold = (0 - n) % n;  // 2^64 mod n: the biased low tail
  while (true) {
    const std::uint64_t r = g();
    if (r >= threshold) return r % n;
  }
}

void fisher_yates(std::vector<std::int64_t>& v, std::mt19937_64& g) {
  for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[uniform_below(g, i)]);
}

}  // namespace

const char* split_name(Split s) {
  switch (s) {
    case Split::Train:
      return "train";
    case Split::Valid:
      return "valid";
    case Split::Test:
      return "test";
  }
  return "?";
}

std::array<double, 3> parse_split(const std::string& text, const std::string& flag) {
  const std::string fix = "; give up to three non-negative weights for train,valid,test, e.g. " + flag + " 949,50,1";
  std::array<double, 3> w{0, 0, 0};
  std::stringstream ss(text);
  std::string part;
  int k = 0;
  // A trailing comma leaves getline nothing to return: count separators too.
  MZ_REQUIRE(!text.empty() && text.back() != ',', flag, " '", text, "': has an empty part", fix);
  while (std::getline(ss, part, ',')) {
    MZ_REQUIRE(k < 3, flag, " '", text, "': has more than three parts", fix);
    std::size_t used = 0;
    double v = 0;
    try {
      v = std::stod(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MZ_REQUIRE(!part.empty() && used == part.size() && std::isfinite(v), flag, " '", text, "': '", part,
               "' is not a number", fix);
    MZ_REQUIRE(v >= 0, flag, " '", text, "': weight ", part, " is negative", fix);
    w[static_cast<std::size_t>(k++)] = v;
  }
  const double sum = w[0] + w[1] + w[2];
  MZ_REQUIRE(sum > 0, flag, " '", text, "': the weights sum to 0", fix);
  for (auto& x : w) x /= sum;
  return w;
}

std::array<DocRange, 3> split_documents(const std::array<double, 3>& weights, std::int64_t num_documents) {
  // Megatron: cumulative round(share * n), then shift so the last bound is n.
  std::array<std::int64_t, 4> b{0, 0, 0, 0};
  for (std::size_t k = 0; k < 3; ++k)
    b[k + 1] = b[k] + static_cast<std::int64_t>(std::round(weights[k] * static_cast<double>(num_documents)));
  const std::int64_t diff = b[3] - num_documents;
  for (std::size_t k = 1; k < 4; ++k) b[k] = std::clamp<std::int64_t>(b[k] - diff, 0, num_documents);
  return {DocRange{b[0], b[1]}, DocRange{b[1], b[2]}, DocRange{b[2], b[3]}};
}

GptDataset::GptDataset(std::shared_ptr<const IndexedDataset> data, std::int64_t seq_length, std::uint64_t seed,
                       DocRange docs, std::string name)
    : data_(std::move(data)), seq_length_(seq_length), seed_(seed), docs_(docs), name_(std::move(name)) {
  MZ_CHECK(data_ != nullptr, "no dataset");
  MZ_REQUIRE(seq_length_ >= 1, "--seq-length must be at least 1, got ", seq_length_);
  MZ_CHECK(docs_.begin >= 0 && docs_.begin <= docs_.end && docs_.end <= data_->num_documents(), "document range [",
           docs_.begin, ", ", docs_.end, ") of ", data_->num_documents());
  const auto& di = data_->document_indices();
  const auto& len = data_->sequence_lengths();
  for (std::int64_t d = docs_.begin; d < docs_.end; ++d) {
    std::int64_t n = 0;
    for (std::int64_t s = di[static_cast<std::size_t>(d)]; s < di[static_cast<std::size_t>(d) + 1]; ++s)
      n += len[static_cast<std::size_t>(s)];
    doc_tokens_.push_back(n);
    tokens_per_epoch_ += n;
  }
  // Samples overlap by the one token that is both the last target of one and
  // the first input of the next; the tail that fills no sample is dropped.
  samples_per_epoch_ = tokens_per_epoch_ > seq_length_ ? (tokens_per_epoch_ - 1) / seq_length_ : 0;
  MZ_REQUIRE(samples_per_epoch_ > 0, "--split: the ", name_, " split of ", data_->prefix(), " (documents ", docs_.begin,
             "..", docs_.end, ") holds ", tokens_per_epoch_, " tokens, fewer than --seq-length + 1 = ", seq_length_ + 1,
             "; give it a larger share in --split, lower --seq-length, or use a larger corpus");
}

std::shared_ptr<const GptDataset::Epoch> GptDataset::build_epoch(std::int64_t e) const {
  auto ep = std::make_shared<Epoch>();
  ep->index = e;
  std::mt19937_64 g(seed_ + static_cast<std::uint64_t>(e));
  ep->doc_order.resize(static_cast<std::size_t>(docs_.size()));
  for (std::size_t k = 0; k < ep->doc_order.size(); ++k) ep->doc_order[k] = static_cast<std::int64_t>(k);
  fisher_yates(ep->doc_order, g);
  ep->doc_start.assign(ep->doc_order.size() + 1, 0);
  for (std::size_t k = 0; k < ep->doc_order.size(); ++k)
    ep->doc_start[k + 1] = ep->doc_start[k] + doc_tokens_[static_cast<std::size_t>(ep->doc_order[k])];
  for (auto& d : ep->doc_order) d += docs_.begin;
  ep->sample_order.resize(static_cast<std::size_t>(samples_per_epoch_));
  for (std::size_t k = 0; k < ep->sample_order.size(); ++k) ep->sample_order[k] = static_cast<std::int64_t>(k);
  fisher_yates(ep->sample_order, g);
  return ep;
}

std::shared_ptr<const GptDataset::Epoch> GptDataset::epoch(std::int64_t e) const {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& c : cache_)
      if (c && c->index == e) return c;
  }
  auto ep = build_epoch(e);  // outside the lock: other epochs stay readable
  std::lock_guard<std::mutex> lock(mutex_);
  cache_[1] = std::move(cache_[0]);
  cache_[0] = ep;
  return ep;
}

void GptDataset::sample(std::int64_t i, std::span<std::int64_t> out) const {
  MZ_CHECK(i >= 0, "sample ", i);
  MZ_CHECK(static_cast<std::int64_t>(out.size()) == seq_length_ + 1, "output of ", out.size(), " tokens");
  const auto ep = epoch(i / samples_per_epoch_);
  std::int64_t pos = ep->sample_order[static_cast<std::size_t>(i % samples_per_epoch_)] * seq_length_;
  std::int64_t* dst = out.data();
  std::int64_t left = seq_length_ + 1;
  // The document holding stream offset pos, then sequences and documents onward.
  std::size_t k = static_cast<std::size_t>(std::upper_bound(ep->doc_start.begin(), ep->doc_start.end(), pos) -
                                           ep->doc_start.begin() - 1);
  std::int64_t skip = pos - ep->doc_start[k];
  const auto& di = data_->document_indices();
  while (left > 0) {
    MZ_CHECK(k < ep->doc_order.size(), "sample ", i, " runs past the epoch");
    const auto d = static_cast<std::size_t>(ep->doc_order[k++]);
    for (std::int64_t s = di[d]; s < di[d + 1] && left > 0; ++s) {
      const std::int64_t len = data_->sequence_length(s);
      if (skip >= len) {
        skip -= len;
        continue;
      }
      const std::int64_t take = std::min(left, len - skip);
      data_->read(s, skip, take, dst);
      dst += take;
      left -= take;
      skip = 0;
    }
  }
}

std::vector<std::int64_t> GptDataset::sample(std::int64_t i) const {
  std::vector<std::int64_t> out(static_cast<std::size_t>(seq_length_ + 1));
  sample(i, out);
  return out;
}

}  // namespace megazero::data
