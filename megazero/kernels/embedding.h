// Vocabulary-parallel token embeddings and position embeddings. Dtype rules
// and accumulate vs overwrite: conventions.h.
#pragma once

#include <cstdint>

#include "megazero/core/tensor.h"
#include "megazero/kernels/conventions.h"

namespace megazero::kernels {

// ids: int64 [N] global token ids; table: [V_local, H] holding global rows
// [vocab_start, vocab_start + V_local). Rows of ids outside the slice are 0.
void embedding_forward(const Tensor& ids, const Tensor& table, std::int64_t vocab_start, Tensor& out);
// dtable[id - vocab_start] += dout[n] for ids inside the slice.
void embedding_backward(const Tensor& ids, const Tensor& dout, std::int64_t vocab_start, Tensor& dtable);
// Position embeddings: out[b*S + s, :] += pos_table[s, :] for a [B*S, H] tensor.
void add_position_embedding(Tensor& out, const Tensor& pos_table, std::int64_t seq);
// dpos[s, :] += sum_b dout[b*S + s, :].
void position_embedding_backward(const Tensor& dout, std::int64_t seq, Tensor& dpos);

}  // namespace megazero::kernels
