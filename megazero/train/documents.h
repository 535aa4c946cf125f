// Megatron's --reset-position-ids and --reset-attention-mask: a sample of S
// tokens packs several documents, each ended by the end-of-document token
// (tools/preprocess_data --append-eod). With them, every document is seen as
// if it were alone: its positions count from 0 (the learned table's rows or
// the rotary angles) and its tokens attend to its own earlier tokens only.
//
// Megatron's rule (get_ltor_masks_and_position_ids): the end-of-document token
// at index i belongs to the document it ends; the next document starts at
// i + 1. So in each sample, start(s) = 1 + the last end-of-document index
// below s (0 if none), position(s) = s - start(s), and query s attends to the
// keys start(s) <= j <= s.
#pragma once

#include <cstdint>
#include <vector>

#include "megazero/train/train_step.h"

namespace megazero::train {

struct DocumentMasks {
  std::int64_t eod_token = -1;
  bool reset_positions = false;  // --reset-position-ids
  bool reset_attention = false;  // --reset-attention-mask
  bool any() const { return reset_positions || reset_attention; }
};

// start(s) of each of the B*S tokens of int64 host ids [B*S] (B = ids / S).
std::vector<std::int64_t> document_starts(const Tensor& ids, std::int64_t seq, std::int64_t eod_token);
// Sets each micro-batch's step.positions and step.key_starts (int64 [B*S] on
// the ids' device, the host: the trainer uploads them with the tokens) as
// `masks` asks.
void mark_documents(std::vector<MicroBatch>& mbs, const DocumentMasks& masks);

}  // namespace megazero::train
