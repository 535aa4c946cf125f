// Where training samples come from. A sample is a pure function of (split,
// global sample index): the global batch of iteration i is samples
// [i G, (i+1) G) whatever the DP size or micro-batch split, so layouts are
// comparable and a resumed run continues with the same data.
#pragma once

#include <memory>
#include <string>

#include "megazero/core/tensor.h"
#include "megazero/train/arguments.h"

namespace megazero::train {

enum class Split { Train, Valid, Test };

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual std::int64_t vocab_size() const = 0;
  virtual std::string describe() const = 0;
  // Whether `split` holds samples of its own (--split gave it documents).
  virtual bool has(Split split) const = 0;
  // ids/targets become int64 [B * S]: samples [first, first + B) of `split`,
  // targets shifted by one token.
  virtual void fill(Split split, std::int64_t first, std::int64_t B, std::int64_t S,
                    const std::shared_ptr<Device>& device, Tensor& ids, Tensor& targets) = 0;
};

// --mock-data: synthetic tokens; --data-path: the indexed dataset. ConfigError
// naming the flag or file otherwise.
std::unique_ptr<SampleSource> make_sample_source(const TrainArgs& args);

}  // namespace megazero::train
