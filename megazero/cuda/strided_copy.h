// The CUDA device's strided copy with dtype conversion (Device::copy_strided;
// conventions: launchers.h).
#pragma once

#include "megazero/cuda/launchers.h"

namespace megazero::cuda {

// dst[idx] = convert(src[idx]) for every index of `shape` (at most 8
// dimensions), element strides for each side; the dtype conversion rounds
// once to nearest even. dst must not overlap src.
constexpr int kMaxCopyDims = 8;
void strided_copy(const void* src, DType src_type, const i64* src_strides, void* dst, DType dst_type,
                  const i64* dst_strides, const i64* shape, int ndim, cudaStream_t s);

}  // namespace megazero::cuda
