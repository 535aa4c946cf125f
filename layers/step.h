// What a forward pass needs to know about where it is in training: the keys of
// its dropout masks. Masks depend on the *global* sample index, so the same
// sample gets the same mask whatever the DP size or micro-batch split.
#pragma once

#include "megazero/core/tensor.h"
#include "megazero/kernels/dropout.h"

#include <cstdint>
#include <optional>

namespace megazero::layers {

struct KvCache;

struct StepInfo {
  std::uint64_t seed = 1234;    // --seed
  std::uint64_t iteration = 0;  // training iteration
  std::int64_t sample_offset =
      0;  // global index (within the iteration's global batch) of this micro-batch's first sample
  std::int64_t micro_batch = 1;  // samples in this micro-batch (B)
  std::int64_t seq = 1;          // sequence length (S)
  bool training = true;          // false: evaluation (no dropout, nothing kept for a backward)
  // The scale the backward of this forward will be given (train_step knows it
  // before the forward: the loss scale over the micro-batches and DP ranks).
  // Set, it lets the cross-entropy write its gradient in the forward's pass
  // over the logits (layers/cross_entropy.h); the backward must then use it.
  std::optional<double> backward_scale;
  // Generation (GPTModel::decode): the seq tokens follow the cache's
  // positions; attention reads and extends it. Evaluation only.
  KvCache* kv_cache = nullptr;
  // Documents packed into a sample (Megatron's --reset-position-ids and
  // --reset-attention-mask; train/documents.h makes them from the tokens):
  // int64 [B*S] on the model's device, or undefined (positions 0..S-1, every
  // earlier token of the sample attended to).
  Tensor positions;   // each token's position within its document
  Tensor key_starts;  // where each token's document starts in its sample: attention stays inside it
};

// Dropout coordinates of residual-stream activations [rows, hidden] whose
// first row is token row `first_row` of the micro-batch: element (r, c) is
// global token row sample_offset * S + first_row + r, column c. The mask is
// thus the same whether a rank holds every row (replicated across TP: each
// TP rank draws the same mask) or, under sequence parallelism, its share.
inline kernels::DropoutLayout hidden_dropout_layout(const StepInfo& step, std::int64_t first_row, std::int64_t rows,
                                                    std::int64_t hidden) {
  return {rows, 1, 1, hidden, step.sample_offset * step.seq + first_row, 0, 1};
}

}  // namespace megazero::layers
