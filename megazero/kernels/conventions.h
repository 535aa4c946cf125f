// What every layer kernel (layernorm.h, gelu_bias.h, softmax.h, dropout.h,
// embedding.h, cross_entropy.h; also fused_attention.h and the RMSNorm, SwiGLU
// and rotary contracts) follows. The kernels are the forward/backward of the
// transformer layers, written out explicitly (no autograd), as llm.c does.
// Every kernel works on contiguous tensors and dispatches on the device: CPU
// code in megazero/kernels/*.cpp, CUDA launchers in megazero/cuda/, nothing
// computed on the meta device (shapes are still checked).
// Conventions: "rows" = all leading dimensions flattened, "cols" = the last
// dimension. Backward kernels that produce parameter gradients ACCUMULATE into
// them (+=), so micro-batches accumulate; input gradients are OVERWRITTEN.
//
// Dtypes. The "storage dtype" of a call is the dtype of its activations:
// fp32, fp64 (the reference path of the gradient checks), bf16 or fp16.
//  - Activations and parameters (x, y, dy, dx, scores, probs, dprobs, logits,
//    dlogits, embedding tables and outputs, gamma, beta, bias, a, b, out) all
//    have the storage dtype; one call never mixes them.
//  - 16-bit storage is storage only: every element is loaded to fp32 (exactly),
//    the math is the fp32 path's (softmax, cross-entropy, LayerNorm and all
//    sums keep their fp32/double accumulations), and each result is rounded
//    ONCE, to nearest even (a value computed in double is not rounded to fp32
//    first). fp64 computes in fp64; fp32 and fp64 results are bit for bit what
//    they were before 16-bit storage, and no result depends on the thread count.
//  - The softmax exponentials (cross-entropy, causal softmax, fused attention)
//    and the GeLU's tanh of fp32 and 16-bit tensors are libmvec's vector expf
//    and tanhf (vector_math.h; within 4 ulp, where the scalar ones are within
//    1; their last bits depend on the ISA clone the CPU selects); fp64 keeps
//    the scalar std::exp and std::tanh.
//  - Per-row statistics (layernorm mean/rstd; the cross-entropy's row_max,
//    global_max, sum_exp, target_logit and per-token loss) have row_stat_dtype():
//    fp32 for 16-bit storage, else the storage dtype. 16-bit statistics are
//    rejected. (Max and target logit of 16-bit logits are exact in fp32.)
//  - Parameter-gradient accumulators (layernorm dgamma/dbeta, bias_grad's dbias,
//    embedding_backward's dtable, position_embedding_backward's dpos; also
//    column_sums' sums) may have the storage dtype or, for 16-bit storage,
//    fp32 (Megatron-style fp32 main grads); each independently
//    (is_grad_accumulator_dtype). The column sums are taken in double
//    (embedding rows: in fp32, from the row's old value), added to the
//    accumulator's value and rounded once per call on store.
//  - ids/targets are int64. Dropout's keep mask does not depend on the dtype.
#pragma once

#include "megazero/core/dtype.h"

namespace megazero::kernels {

// The dtype of per-row statistics for activations of `storage` dtype: fp32 for
// bf16/fp16, otherwise `storage` itself.
DType row_stat_dtype(DType storage);
// Whether `acc` may hold the parameter gradients of `storage` activations:
// acc == storage, or acc == fp32 when storage is bf16/fp16.
bool is_grad_accumulator_dtype(DType storage, DType acc);

}  // namespace megazero::kernels
