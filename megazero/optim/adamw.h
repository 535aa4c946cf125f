// AdamW (Loshchilov & Hutter) on flat fp32 buffers: the optimizer ZeRO runs on
// the partition a rank owns. Decoupled weight decay, bias correction.
#pragma once

#include <cstdint>
#include <vector>

#include "megazero/core/tensor.h"
#include "megazero/kernels/optimizer_kernels.h"

namespace megazero::optim {

struct AdamConfig {
  double beta1 = 0.9;          // --adam-beta1
  double beta2 = 0.999;        // --adam-beta2
  double eps = 1e-8;           // --adam-eps
  double weight_decay = 0.01;  // --weight-decay (not applied to biases and LayerNorm)
};

// A run of elements [begin, end) (relative to the buffers) sharing weight
// decay: the kernel's segment, so a step hands its list over as it is.
using DecaySegment = kernels::AdamSegment;

// One AdamW step over the segments of n elements (any order, disjoint; the
// contract of kernels::adamw). grads (any floating dtype, n elements) are
// multiplied by grad_scale first (1 / loss scale x clip coefficient).
// master, exp_avg, exp_avg_sq: fp32, n elements, updated in place. `step` is
// the 1-based step count for bias correction. One kernel call for all
// segments (on a GPU one launch per 240 merged segments). params (optional):
// the working-precision weights, written in the same pass with the new master
// values of the updated elements, converted as copy_from converts them.
void adamw_step(const Tensor& master, const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& grads,
                const std::vector<DecaySegment>& segments, const AdamConfig& cfg, double lr, std::int64_t step,
                double grad_scale, const Tensor& params = Tensor());

}  // namespace megazero::optim
