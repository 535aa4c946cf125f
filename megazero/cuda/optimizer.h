// The CUDA launchers of the optimizer's kernels (megazero/kernels/optimizer_kernels.h
// has the contracts; conventions: launchers.h).
#pragma once

#include <utility>
#include <vector>

#include "megazero/cuda/launchers.h"

namespace megazero::cuda {

// AdamW on elements [begin, end) of fp32 master/moments with gradients of
// `grad_type`; the CPU's formula (double arithmetic, decoupled decay).
struct AdamArgs {
  double beta1, beta2, eps, weight_decay, lr, bc1, bc2, grad_scale;
};
void adamw(float* w, float* m, float* v, const void* g, DType grad_type, i64 begin, i64 end, bool decay,
           const AdamArgs& a, cudaStream_t s);

// *out (device memory) = the sum of squares of g over the ranges, in double
// and in a fixed order. ws: sum_of_squares_bytes(ranges.size()).
void sum_of_squares(const void* g, DType t, const std::vector<std::pair<i64, i64>>& ranges, kernels::GpuScratch ws,
                    double* out, cudaStream_t s);

}  // namespace megazero::cuda
