// LayerNorm over the hidden dimension; gamma and beta replicated across TP
// (every TP rank holds the full vector and computes the same result).
#pragma once

#include "layers/normalization.h"

namespace megazero::layers {

class LayerNorm final : public Normalization {
 public:
  // one_plus: --apply-layernorm-1p (NormGamma).
  LayerNorm(ParameterSet& params, const std::string& name, std::int64_t hidden, double eps, const TpContext& ctx,
            bool one_plus = false);
  Tensor forward(const Tensor& x) override;  // [N, hidden]
  Tensor forward_bias_dropout_add(const Tensor& y, const kernels::BiasDropoutAddOf& before) override;
  // dx (+ *residual_grad, in the same pass, when given); accumulates dgamma, dbeta.
  Tensor backward(const Tensor& dy, const Tensor* residual_grad = nullptr) override;
  Tensor backward_dropout(const Tensor& dy, const Tensor* residual_grad,
                          const kernels::DropoutBackwardOf& then) override;
  void release() override;

 private:
  TpContext ctx_;
  Parameter* gamma_;
  Parameter* beta_;
  NormGamma applied_;
  double eps_;
  Tensor input_, mean_, rstd_;
};

}  // namespace megazero::layers
