// The dtype rules of conventions.h.
#include "megazero/kernels/conventions.h"

namespace megazero::kernels {

DType row_stat_dtype(DType storage) { return storage == DType::BF16 || storage == DType::F16 ? DType::F32 : storage; }

bool is_grad_accumulator_dtype(DType storage, DType acc) {
  return acc == storage || (acc == DType::F32 && (storage == DType::BF16 || storage == DType::F16));
}

}  // namespace megazero::kernels
