#include "layers/checkpoint_store.h"

#include "megazero/core/error.h"

namespace megazero::layers {

void KeepWholeCheckpoints::save(int layer, const Tensor& x) {
  if (saved_.size() <= static_cast<std::size_t>(layer)) saved_.resize(static_cast<std::size_t>(layer) + 1);
  saved_[static_cast<std::size_t>(layer)] = x;
}

Tensor KeepWholeCheckpoints::restore(int layer) {
  MZ_CHECK(static_cast<std::size_t>(layer) < saved_.size() && saved_[static_cast<std::size_t>(layer)].defined(),
           "layer ", layer, ": backward before forward");
  Tensor x = saved_[static_cast<std::size_t>(layer)];
  saved_[static_cast<std::size_t>(layer)] = Tensor();
  return x;
}

}  // namespace megazero::layers
