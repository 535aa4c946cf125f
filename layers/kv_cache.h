// A key/value cache for generation (tools/generate_text): each layer's keys
// (after the rotary embedding) and values of the positions already run, so a
// generation step runs only its new tokens (GPTModel::decode). One sequence,
// evaluation only, on the model's device; made by GPTModel::make_kv_cache.
#pragma once

#include <cstdint>
#include <vector>

#include "megazero/core/tensor.h"

namespace megazero::layers {

struct KvCache {
  std::int64_t capacity = 0;  // positions it can hold
  std::int64_t length = 0;    // positions it holds: the next token's position
  // Per layer: [this rank's key/value heads, capacity, head size], in the model's dtype.
  std::vector<Tensor> keys, values;
};

}  // namespace megazero::layers
