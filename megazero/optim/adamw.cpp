#include "megazero/optim/adamw.h"

#include <cmath>

#include "megazero/core/error.h"
#include "megazero/kernels/optimizer_kernels.h"

namespace megazero::optim {

void adamw_step(const Tensor& master, const Tensor& exp_avg, const Tensor& exp_avg_sq, const Tensor& grads,
                const std::vector<DecaySegment>& segments, const AdamConfig& cfg, double lr, std::int64_t step,
                double grad_scale, const Tensor& params) {
  MZ_CHECK(step >= 1, "adamw: step counts from 1");
  const kernels::AdamStep a{cfg.beta1,
                            cfg.beta2,
                            cfg.eps,
                            cfg.weight_decay,
                            lr,
                            1 - std::pow(cfg.beta1, static_cast<double>(step)),
                            1 - std::pow(cfg.beta2, static_cast<double>(step)),
                            grad_scale};
  kernels::adamw(master, exp_avg, exp_avg_sq, grads, segments, a, params);
}

}  // namespace megazero::optim
