#include "megazero/train/sample_source.h"

#include "megazero/core/error.h"

namespace megazero::train {
namespace {

// Deterministic pseudo-random tokens (splitmix64 of split, sample, position):
// for benchmarks, where only shapes and FLOPs matter.
class MockSource final : public SampleSource {
 public:
  explicit MockSource(std::int64_t vocab) : vocab_(vocab) {}
  std::int64_t vocab_size() const override { return vocab_; }
  std::string describe() const override { return "mock data (synthetic tokens, vocabulary " + std::to_string(vocab_) + ")"; }
  void fill(Split split, std::int64_t first, std::int64_t B, std::int64_t S, const std::shared_ptr<Device>& device,
            Tensor& ids, Tensor& targets) override {
    ids = Tensor::empty(device, {B * S}, DType::I64, MemoryCategory::Activations);
    targets = Tensor::empty(device, {B * S}, DType::I64, MemoryCategory::Activations);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t <= S; ++t) {
        const std::int64_t tok = token(static_cast<std::uint64_t>(split), static_cast<std::uint64_t>(first + b), static_cast<std::uint64_t>(t));
        if (t < S) ids.data_as<std::int64_t>()[b * S + t] = tok;
        if (t > 0) targets.data_as<std::int64_t>()[b * S + t - 1] = tok;
      }
  }

 private:
  std::int64_t token(std::uint64_t split, std::uint64_t sample, std::uint64_t pos) const {
    std::uint64_t z = (split * 0x9E3779B97F4A7C15ull) ^ (sample * 0xBF58476D1CE4E5B9ull) ^ (pos * 0x94D049BB133111EBull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return static_cast<std::int64_t>((z ^ (z >> 31)) % static_cast<std::uint64_t>(vocab_));
  }
  std::int64_t vocab_;
};

}  // namespace

std::unique_ptr<SampleSource> make_sample_source(const TrainArgs& args) {
  if (args.mock_data) return std::make_unique<MockSource>(args.model.vocab_size);
  throw ConfigError("--data-path " + args.data_path +
                    ": reading indexed datasets is not wired into pretrain_gpt yet; use --mock-data");
}

}  // namespace megazero::train
