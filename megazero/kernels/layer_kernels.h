// All the layer kernel families at once, for code that uses several of them
// or was written before the split. Prefer the family's own header:
//   conventions.h    the dtype rules every kernel follows (row_stat_dtype,
//                    is_grad_accumulator_dtype), rows/cols, accumulate vs overwrite
//   layernorm.h      LayerNorm forward/backward
//   gelu_bias.h      GeLU, bias-GeLU, bias add and gradient, add, axpy, scale
//   softmax.h        the causal softmax of attention scores
//   dropout.h        dropout by global coordinates (DropoutLayout), bias-dropout-add
//   embedding.h      vocabulary-parallel and position embeddings
//   cross_entropy.h  the vocabulary-parallel cross-entropy's pieces
// (fused_attention.h, optimizer_kernels.h, gemm.h, rmsnorm.h, swiglu.h and
// rope.h are not included here.)
#pragma once

#include "megazero/kernels/conventions.h"
#include "megazero/kernels/cross_entropy.h"
#include "megazero/kernels/dropout.h"
#include "megazero/kernels/embedding.h"
#include "megazero/kernels/gelu_bias.h"
#include "megazero/kernels/layernorm.h"
#include "megazero/kernels/softmax.h"
