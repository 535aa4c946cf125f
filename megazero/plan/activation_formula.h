// What one transformer layer keeps for its backward, as a formula — the
// counterpart for megazero's layers of Korthikanti et al. (2022), eq. 1-2:
// activations per layer sbh(10 + 24/t + 5as/(ht)) without and sbh/t(34 +
// 5as/h) with sequence parallelism (fp16, dropout masks kept as bytes).
//
// Per token of the micro-batch, a layer (training, no full recompute) keeps:
//   residual-stream part (replicated across TP, 1/TP under sequence parallelism):
//     norm 1's and norm 2's outputs (the QKV and first MLP GEMMs' inputs), the
//     residual after attention (norm 2's input) and the layer's output (the next
//     layer's input): 4h elements, plus each norm's row statistics (LayerNorm:
//     mean and rstd; RMSNorm: rstd) in the row-statistics dtype;
//   TP-split part (1/TP always):
//     q (h), k and v (query groups x head size each), the attention output
//     projection's input (h), the MLP's pre-activation (ffn; SwiGLU 2 ffn) and
//     activation (ffn); unfused attention: the probabilities (heads x seq),
//     again after dropout when attention dropout is on (not with selective
//     recompute, which makes them again in backward); fused attention: its
//     output (h) and one log-sum-exp per head.
// Dropout masks are regenerated from their keys, never kept (the paper's
// 2sbh + sbh mask bytes per layer do not exist here).
//
// tests/test_activation_memory.cpp measures what the real layers keep and
// holds this formula to the byte, with and without sequence parallelism.
#pragma once

#include <cstdint>

#include "layers/gpt_config.h"
#include "megazero/core/dtype.h"

namespace megazero::plan {

struct LayerActivationBytes {
  std::int64_t residual_stream = 0;  // split by sequence parallelism
  std::int64_t tp_split = 0;         // split by TP in any case
  std::int64_t total() const { return residual_stream + tp_split; }
};

// Bytes per rank that one layer keeps for backward for a micro-batch of
// `tokens` (micro-batch x seq) tokens of sequence length `seq`, at TP `tp`
// with activations of `dtype`, under cfg's sequence_parallel, attention
// backend and dropout.
LayerActivationBytes layer_activation_bytes(const layers::GPTConfig& cfg, int tp, DType dtype, std::int64_t tokens,
                                            std::int64_t seq);

}  // namespace megazero::plan
