// RMSNorm (--normalization RMSNorm): y = x / rms(x) * weight, no bias
// (kernels/rmsnorm.h). Replicated across TP.
#pragma once

#include "layers/normalization.h"

namespace megazero::layers {

class RMSNorm final : public Normalization {
 public:
  // one_plus: --apply-layernorm-1p (NormGamma).
  RMSNorm(ParameterSet& params, const std::string& name, std::int64_t hidden, double eps, const TpContext& ctx,
          bool one_plus = false);
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& dy, const Tensor* residual_grad = nullptr) override;
  void release() override;

 private:
  TpContext ctx_;
  Parameter* gamma_;
  NormGamma applied_;
  double eps_;
  Tensor input_, rstd_;
};

}  // namespace megazero::layers
