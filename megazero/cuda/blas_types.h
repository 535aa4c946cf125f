// Our dtypes as the CUDA math libraries name them (cuBLAS, cuBLASLt): one
// table for gemm_cuda.cpp and lt_matmul.cpp.
#pragma once

#include <library_types.h>

#include "megazero/core/dtype.h"
#include "megazero/core/error.h"

namespace megazero::cuda {

inline cudaDataType_t blas_type(DType t, const char* who) {
  switch (t) {
    case DType::F32:
      return CUDA_R_32F;
    case DType::F16:
      return CUDA_R_16F;
    case DType::BF16:
      return CUDA_R_16BF;
    case DType::F64:
      return CUDA_R_64F;
    default:
      break;
  }
  throw InternalError(detail::concat(who, ": no cuBLAS type for ", dtype_name(t)));
}

}  // namespace megazero::cuda
