// Where a recomputing layer keeps its checkpointed input between forward and
// backward. Layers only call save() and restore(); the policy (keep it whole,
// keep a 1/TP slice and all-gather it back, keep the slice in host memory, in
// a contiguous arena) belongs to ZeRO-R (megazero/zero/partitioned_activations.h).
#pragma once

#include "layers/tp_context.h"

namespace megazero::layers {

class ActivationCheckpointStore {
 public:
  virtual ~ActivationCheckpointStore() = default;
  // Keeps `x` (the layer's input, replicated across the TP group) for layer
  // `layer` until restore(layer). The store may copy it; the caller drops x.
  virtual void save(int layer, const Tensor& x) = 0;
  // The saved input, whole and on the compute device; forgets it. Collective
  // over the TP group for stores that partition.
  virtual Tensor restore(int layer) = 0;
  // The backward's first restore will be of `layer`: a store that keeps
  // checkpoints away from the device (Pa+cpu) may start bringing it back now,
  // so the copy overlaps the backward of the layers above. The others ignore it.
  virtual void prefetch(int /*layer*/) {}
};

// The default: keeps a reference to the whole input (plain activation
// checkpointing, as without ZeRO-R).
class KeepWholeCheckpoints final : public ActivationCheckpointStore {
 public:
  void save(int layer, const Tensor& x) override;
  Tensor restore(int layer) override;

 private:
  std::vector<Tensor> saved_;
};

}  // namespace megazero::layers
