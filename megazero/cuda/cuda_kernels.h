// Elementwise GPU kernels the rest of the CUDA backend needs: dtype conversion
// (master weights <-> 16-bit copies, gradient casts; Tensor::copy_from of flat
// tensors) and GEMM's beta scaling. (The layer kernels' own scale is
// megazero::cuda::scale_elements, gelu_bias.h.) Launched asynchronously on `s`; pointers
// are device pointers; launch errors throw InternalError.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "megazero/core/dtype.h"

namespace megazero::cuda {

// dst[i] = src[i] converted, for F32, F16, BF16 and F64 in any combination.
// Rounds to nearest, ties to even, through the CUDA intrinsics
// (__float2half_rn, __float2bfloat16_rn, __double2half, ...), so finite values
// match megazero::convert on the host bit for bit; a NaN stays a NaN but its
// sign and payload are whatever the intrinsic produces. src and dst may not
// overlap unless they are the same pointer with the same dtype (a no-op).
void convert(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n, cudaStream_t s);

// GEMM's beta on a strided (batch, rows, cols) matrix whose last dimension has
// unit stride: x = beta * x, with BLAS semantics for beta == 0 (x becomes
// exactly 0, even where it held NaN or garbage). F32, F16, BF16, F64.
void scale_matrix(void* data, DType t, std::size_t batch, std::size_t rows, std::size_t cols, std::size_t batch_stride,
                  std::size_t row_stride, float beta, cudaStream_t s);

// dst[0] = a, dst[1] = b, queued on s: small per-call values (cuDNN's dropout
// seed and offset) written by a kernel instead of a host-to-device copy, so the
// host never stages them and the sequence stays capturable in a CUDA graph.
void store_int64_pair(std::int64_t* dst, std::int64_t a, std::int64_t b, cudaStream_t s);

}  // namespace megazero::cuda
