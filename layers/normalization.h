// The pre-sublayer normalisation of a transformer block, LayerNorm (GPT-2) or
// RMSNorm (Llama; --normalization RMSNorm), behind one interface so the
// transformer layer and the model do not care which. Both are replicated
// across TP (every rank normalises the whole hidden vector).
#pragma once

#include <memory>
#include <string>

#include "layers/gpt_config.h"
#include "layers/parameter.h"
#include "layers/tp_context.h"

namespace megazero::layers {

class Normalization {
 public:
  virtual ~Normalization() = default;
  virtual Tensor forward(const Tensor& x) = 0;  // [N, hidden]
  // dx (+ *residual_grad, in the same pass, when given); accumulates the
  // parameters' gradients.
  virtual Tensor backward(const Tensor& dy, const Tensor* residual_grad = nullptr) = 0;
  virtual void release() = 0;
};

// The normalisation cfg.normalization names, with parameters NAME.weight (and
// NAME.bias for LayerNorm).
std::unique_ptr<Normalization> make_normalization(ParameterSet& params, const std::string& name, const GPTConfig& cfg,
                                                  const TpContext& ctx);

}  // namespace megazero::layers
