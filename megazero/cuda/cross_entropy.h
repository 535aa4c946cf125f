// The CUDA launchers of the vocabulary-parallel cross-entropy's pieces
// (megazero/kernels/cross_entropy.h has the contracts; conventions:
// launchers.h); one block per row.
#pragma once

#include <cstdint>

#include "megazero/cuda/launchers.h"

namespace megazero::cuda {

void cross_entropy_forward(DType t, const void* logits, const std::int64_t* targets, i64 vocab_start, i64 rows,
                           i64 cols, i64 valid, void* row_max, void* sum_exp, void* target_logit, cudaStream_t s);
void rescale_sum_exp(DType stat, const void* row_max, const void* global_max, i64 rows, void* sum_exp, cudaStream_t s);
// weight: the optional row weights (the statistics' type), or nullptr.
void cross_entropy_loss(DType stat, const void* global_max, const void* sum_exp, const void* target_logit,
                        const void* weight, i64 rows, void* loss, cudaStream_t s);
void cross_entropy_backward(DType t, const void* logits, const void* global_max, const void* sum_exp,
                            const std::int64_t* targets, i64 vocab_start, i64 rows, i64 cols, i64 valid, double scale,
                            const void* weight, void* dlogits, cudaStream_t s);

// Tensor parallel size 1 (global_max = row_max): the forward, then the
// backward over the logits (dlogits may alias them), in one pass reading the
// logits once where cross_entropy_fuses (the row fits in shared memory four
// times an SM); else the two kernels. Returns whether it fused.
bool cross_entropy_fuses(DType t, i64 cols);
bool cross_entropy_forward_backward(DType t, const void* logits, const std::int64_t* targets, i64 vocab_start, i64 rows,
                                    i64 cols, i64 valid, double scale, const void* weight, void* row_max, void* sum_exp,
                                    void* target_logit, void* dlogits, cudaStream_t s);

}  // namespace megazero::cuda
