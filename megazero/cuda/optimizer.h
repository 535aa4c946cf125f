// The CUDA launchers of the optimizer's kernels (megazero/kernels/optimizer_kernels.h
// has the contracts; conventions: launchers.h).
#pragma once

#include <utility>
#include <vector>

#include "megazero/cuda/launchers.h"
#include "megazero/kernels/optimizer_kernels.h"

namespace megazero::cuda {

// AdamW on the segments of fp32 master/moments with gradients of `grad_type`;
// the CPU's formula (kernels/adamw_formula.h: fp32, the same bits). p (null for none):
// the params output of `param_type`, written with the new weights in the same
// kernel. One launch per kernels::gpu_scratch::kSegmentTableCapacity segments
// after merging adjacent ones (optimizer_kernels.cuh), none for an empty list.
void adamw(float* w, float* m, float* v, const void* g, DType grad_type, void* p, DType param_type,
           const std::vector<kernels::AdamSegment>& segments, const kernels::AdamStep& a, cudaStream_t s);

// *out (device memory) = the sum of squares of g over the ranges, in double
// and in a fixed order: one launch per table of ranges, then one adding their
// block sums. ws: sum_of_squares_bytes(ranges.size()).
void sum_of_squares(const void* g, DType t, const std::vector<std::pair<i64, i64>>& ranges, kernels::GpuScratch ws,
                    double* out, cudaStream_t s);
// *out = how many of g's elements in the ranges are zero, as a double: the same
// launches as sum_of_squares, the same scratch.
void count_zeros(const void* g, DType t, const std::vector<std::pair<i64, i64>>& ranges, kernels::GpuScratch ws,
                 double* out, cudaStream_t s);

// Zeroes x's elements (of `t`, any float dtype) in the ranges: one launch a
// table of ranges (adjacent ones merged), none for an empty list.
void zero_ranges(void* x, DType t, const std::vector<std::pair<i64, i64>>& ranges, cudaStream_t s);

}  // namespace megazero::cuda
