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

// Elements [begin, end) of master, exp_avg, exp_avg_sq (fp32, one device,
// contiguous) updated in place from grads (any floating dtype, as many
// elements); weight decay applied when `decay`. The same bits for any thread
// count: each element is the scalar formula, nothing summed.
void adamw(const Tensor& master, const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& grads,
           std::int64_t begin, std::int64_t end, bool decay, const AdamStep& a);

// out (fp64, one element, on grads' device; it stays there for the
// all-reduces) = the sum of squares of grads over the [begin, end) ranges, in
// double and in an order that does not depend on where the buffer sits. A GPU
// takes its partial sums from a scratch allocation made here (planned too).
void sum_of_squares(const Tensor& grads, const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges,
                    const Tensor& out);

}  // namespace megazero::kernels
