// The causal softmax's CUDA launchers (megazero/kernels/softmax.h has the
// contracts; conventions: launchers.h).
#pragma once

#include "megazero/cuda/launchers.h"

namespace megazero::cuda {

// mats matrices of [sq, n] scores, the queries the last sq of the n positions.
// key_starts (sq == n), when given: the first key of row i of the matrices of
// sample b is key_starts[b * sq + i], b = row / rows_per_sample.
void causal_softmax_forward(DType t, const void* scores, double scale, void* probs, i64 mats, i64 sq, i64 n,
                            cudaStream_t s, const std::int64_t* key_starts = nullptr, i64 rows_per_sample = 1);
void causal_softmax_backward(DType t, const void* dprobs, const void* probs, double scale, void* dscores, i64 mats,
                             i64 n, cudaStream_t s, const std::int64_t* key_starts = nullptr, i64 rows_per_sample = 1);

// Per-document masks as cuDNN's additive attention bias (cudnn_sdpa.cpp):
// bias [samples, 1, s, s] of dtype t, element (b, i, j) 0 where key j is at or
// after row i's document start key_starts[b * s + i] (clamped to [0, i]) and
// document_mask_bias_value(t) before it: a large finite negative, not -inf,
// which the cuDNN frontend's advice says its backward's subtractions can turn
// into NaN. The causal mask above the diagonal stays the attention graph's own.
float document_mask_bias_value(DType t);
void document_mask_bias(DType t, const std::int64_t* key_starts, i64 samples, i64 s, void* bias, cudaStream_t st);

}  // namespace megazero::cuda
