// The seam between the model and whoever manages parameter storage (ZeRO).
// The model calls these around each parameter group (an embedding block, a
// transformer layer, the final LayerNorm) in execution order; the default does
// nothing. ZeRO stage 3 gathers a group's parameters in pre_* and releases
// them in post_forward; stages 2-3 bind gradient storage in pre_backward and
// reduce it in post_backward. Layers stay ignorant of ZeRO.
//
// Contract: between pre_forward(g) and post_forward(g), and between
// pre_backward(g) and post_backward(g), group g's Parameter::value (and in
// backward ::grad) views are valid. post_backward(g) means "g's gradients for
// this micro-batch are final".
#pragma once

namespace megazero::layers {

class ParamHooks {
 public:
  virtual ~ParamHooks() = default;
  virtual void pre_forward(int /*group*/) {}
  virtual void post_forward(int /*group*/) {}
  virtual void pre_backward(int /*group*/) {}
  virtual void post_backward(int /*group*/) {}
};

}  // namespace megazero::layers
