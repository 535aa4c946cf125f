// The pre-sublayer normalisation of a transformer block, LayerNorm (GPT-2) or
// RMSNorm (Llama; --normalization RMSNorm), behind one interface so the
// transformer layer and the model do not care which. Both are replicated
// across TP (every rank normalises the whole hidden vector).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "layers/gpt_config.h"
#include "layers/parameter.h"
#include "layers/tp_context.h"
#include "megazero/kernels/dropout.h"

namespace megazero::layers {

class Normalization {
 public:
  virtual ~Normalization() = default;
  virtual Tensor forward(const Tensor& x) = 0;  // [N, hidden]
  // *before.out = the bias-dropout-add of y (the residual stream: the
  // previous sub-block's output added in), then forward of it: in one pass
  // where the norm's kernels can (kernels::bias_dropout_add_layernorm), else
  // one call after the other.
  virtual Tensor forward_bias_dropout_add(const Tensor& y, const kernels::BiasDropoutAddOf& before) {
    kernels::bias_dropout_add(y, *before.bias, *before.residual, before.p, before.key, before.layout, *before.out);
    return forward(*before.out);
  }
  // dx (+ *residual_grad, in the same pass, when given); accumulates the
  // parameters' gradients.
  virtual Tensor backward(const Tensor& dy, const Tensor* residual_grad = nullptr) = 0;
  // backward, then *then.out = the dropout backward of dx (the residual
  // stream's gradient entering the sub-block below the norm) and its bias
  // gradient: in the same pass where the norm's kernels can
  // (kernels::layernorm_backward_dropout), else one call after the other.
  virtual Tensor backward_dropout(const Tensor& dy, const Tensor* residual_grad,
                                  const kernels::DropoutBackwardOf& then) {
    Tensor dx = backward(dy, residual_grad);
    kernels::dropout_backward_of(dx, then);
    return dx;
  }
  virtual void release() = 0;
};

// Under sequence parallelism a norm sees 1/TP of the token rows (and a
// --qk-layernorm norm only its rank's heads: TpContext::partial_rows), so the
// gradients of its (replicated) parameters are partial sums over the TP group.
// grad(i) is what the kernels accumulate this micro-batch's share into: the
// accumulator itself when the rows are whole, else a zeroed stand-in
// that finish() sums over the TP group (one all-reduce for all of them) and
// adds to the accumulator. Summing the accumulators themselves would count
// earlier micro-batches TP times.
class NormGradients {
 public:
  NormGradients(const TpContext& ctx, std::vector<Tensor*> accumulators);
  Tensor& grad(std::size_t i) { return ctx_.partial_rows() ? parts_[i] : *accumulators_[i]; }
  void finish();

 private:
  TpContext ctx_;
  std::vector<Tensor*> accumulators_;
  Tensor stacked_;  // the stand-ins, back to back: one collective
  std::vector<Tensor> parts_;
};

// The gamma a norm's kernels apply: the weight itself, or with
// --apply-layernorm-1p 1 + weight (one small add a call into a tensor the
// backward reuses; d gamma = d weight, so the kernels accumulate the weight's
// gradient unchanged).
class NormGamma {
 public:
  NormGamma(Parameter* weight, bool one_plus) : weight_(weight), one_plus_(one_plus) {}
  const Tensor& forward();   // the gamma of this forward, kept for its backward
  const Tensor& backward();  // the forward's
  void release() { gamma_ = Tensor(); }
  Parameter& weight() { return *weight_; }

 private:
  Parameter* weight_;
  bool one_plus_;
  Tensor ones_, gamma_;
};

// The normalisation cfg.normalization names, with parameters NAME.weight (and
// NAME.bias for LayerNorm).
std::unique_ptr<Normalization> make_normalization(ParameterSet& params, const std::string& name, const GPTConfig& cfg,
                                                  const TpContext& ctx);
// The same kind over `width` elements a row (--qk-layernorm: the head size).
std::unique_ptr<Normalization> make_normalization(ParameterSet& params, const std::string& name, const GPTConfig& cfg,
                                                  const TpContext& ctx, std::int64_t width);

}  // namespace megazero::layers
