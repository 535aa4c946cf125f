// The plain GEMM of megazero::gemm (kernels/gemm.h) as cuBLASLt sees it, for
// autotuning (cuda/lt_matmul.h): the same column-major problem gemm_cuda.cpp
// hands cuBLAS (C^T = op(B)^T op(A)^T, nothing copied), so a CPU test checks
// the translation by cuBLASLt's documented semantics without a GPU.
#pragma once

#include "megazero/core/tensor.h"
#include "megazero/cuda/lt_matmul.h"

namespace megazero::cuda {

// c = alpha op(a) op(b) + beta c for 2-D a, b, c (checked by gemm(): shapes,
// dtypes, c's unit last stride; a and b may be transposed or narrowed views).
LtMatmul describe_gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha,
                       float beta);

}  // namespace megazero::cuda
