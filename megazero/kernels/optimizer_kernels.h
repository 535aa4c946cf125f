// The optimizer's element-wise kernels over ZeRO's flat fp32 partitions: the
// AdamW update and the gradient norm's sum of squares. Entry points dispatch
// on the device like the layer kernels (CPU code here, CUDA launchers in
// megazero/cuda), so the optimizer and the ZeRO engine above never name a device.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "megazero/core/tensor.h"

namespace megazero::kernels {

// One AdamW step's scalars: bias corrections bc1 = 1 - beta1^t, bc2 = 1 - beta2^t;
// gradients are multiplied by grad_scale first (1 / loss scale x clip coefficient).
struct AdamStep {
  double beta1, beta2, eps, weight_decay, lr, bc1, bc2, grad_scale;
};

// A run of elements [begin, end) of the optimizer's buffers sharing the weight-decay choice.
struct AdamSegment {
  std::int64_t begin = 0, end = 0;
  bool decay = true;
};

// The elements of `segments` of master, exp_avg, exp_avg_sq (fp32, one device,
// contiguous) updated in place from grads (any floating dtype, as many
// elements); weight decay applied on a segment with `decay`. Segments may come
// in any order and be empty; they must not overlap (checked: an element would
// be updated twice, and on a GPU by two threads at once). Elements outside
// every segment are untouched. Each element is adamw_formula.h's fp32 formula,
// nothing summed: the same bits on a CPU and a GPU, for any thread count,
// order or split of the segments.
// A GPU runs all of them in one launch (one per 240 after merging adjacent
// segments of the same decay: gpu_scratch::kSegmentTableCapacity).
//
// params (optional; undefined for none): the working-precision copy of the
// weights, written in the same pass (ZeRO's publish without a second read of
// the master). fp32, fp64, bf16 or fp16, contiguous, as many elements, on
// master's device, overlapping no other operand. For every element i the call
// updates, params[i] = the new master[i] converted as Tensor::copy_from
// converts fp32 (round to nearest even: float_to_bf16 / float_to_half on the
// CPU, __float2bfloat16_rn / __float2half_rn on a GPU), so the bits are those
// of adamw then params.copy_from(master) on those elements. Elements outside
// every segment are untouched, as in master; master, exp_avg and exp_avg_sq
// get the same bits with or without params.
void adamw(const Tensor& master, const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& grads,
           const std::vector<AdamSegment>& segments, const AdamStep& a, const Tensor& params = Tensor());

// out (fp64, one element, on grads' device; it stays there for the
// all-reduces) = the sum of squares of grads over the [begin, end) ranges, in
// double and in an order that does not depend on where the buffer sits.
// Ranges may come in any order, be empty or overlap (an element in two ranges
// counts twice). A GPU sums all ranges in one launch (one per 240 after
// merging adjacent ranges) and adds the launches' block sums in a second, in
// a fixed order, with its partial sums in a scratch allocation made here
// (planned too); its order is not the CPU's, so the two agree to rounding.
void sum_of_squares(const Tensor& grads, const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges,
                    const Tensor& out);

// out (fp64, one element, on grads' device) = how many elements of grads in
// the ranges are zero (+0 or -0; NaN is not): Megatron's "number of zeros in
// the grad". Ranges as sum_of_squares takes them (an element in two ranges
// counts twice); on a GPU its launches with a count for a square. Exact up to
// 2^53 elements.
void count_zeros(const Tensor& grads, const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges,
                 const Tensor& out);

// Sets flat's elements in the [begin, end) ranges to zero (any dtype,
// contiguous): what zero_grad clears of a gradient buffer, the parameters a
// GEMM will not overwrite (layers/parameter.h). Ranges may come in any order,
// be empty or overlap; elements outside every range are untouched. A GPU
// clears all of them in one launch (one per 240 after merging adjacent ranges).
void zero_ranges(const Tensor& flat, const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges);

}  // namespace megazero::kernels
