// The tensor-parallel communication "mappings", as conjugate pairs: each
// struct's backward is the adjoint of its forward. Keeping all TP communication
// of the model in this one file makes the TP math auditable.
//
//   CopyToTpRegion      forward: identity        backward: all-reduce (sum)
//   ReduceFromTpRegion  forward: all-reduce(sum) backward: identity
//   GatherFromTpRegion  forward: all-gather along the last dim   backward: keep own slice
//   ScatterToTpRegion   forward: keep own slice of the last dim   backward: all-gather
//
// Identity directions are spelled out (as no-ops) so every layer calls both
// halves and a reader can check each pair.
#pragma once

#include "megazero/comm/communicator.h"

namespace megazero::layers {

struct CopyToTpRegion {
  static void forward(Communicator&, const Tensor&) {}
  static void backward(Communicator& tp, const Tensor& grad);
};

struct ReduceFromTpRegion {
  static void forward(Communicator& tp, const Tensor& x);
  static void backward(Communicator&, const Tensor&) {}
};

struct GatherFromTpRegion {
  // x: [..., n] on each rank -> [..., n * tp], rank r's columns at [r n, (r+1) n).
  static Tensor forward(Communicator& tp, const Tensor& x, MemoryCategory category);
  static Tensor backward(Communicator& tp, const Tensor& grad, MemoryCategory category);
};

struct ScatterToTpRegion {
  static Tensor forward(Communicator& tp, const Tensor& x, MemoryCategory category);
  static Tensor backward(Communicator& tp, const Tensor& grad, MemoryCategory category);
};

}  // namespace megazero::layers
