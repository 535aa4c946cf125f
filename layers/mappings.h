// The tensor-parallel communication "mappings", as conjugate pairs: each
// struct's backward is the adjoint of its forward. Keeping all TP communication
// of the model in this one file makes the TP math auditable.
//
//   CopyToTpRegion      forward: identity        backward: all-reduce (sum)
//   ReduceFromTpRegion  forward: all-reduce(sum) backward: identity
//   GatherFromTpRegion  forward: all-gather along the last dim   backward: keep own slice
//   ScatterToTpRegion   forward: keep own slice of the last dim   backward: all-gather
//
// Sequence parallelism (Korthikanti et al. 2022) splits the residual stream
// across the TP group along the tokens: rank r holds rows [r n, (r+1) n) of
// the [B*S, H] activations (n = B*S / TP; the rows are sample-major, so for the
// per-token operations there — norms, dropout, residual adds — this is
// Megatron's split of the sequence). Its conjugate pairs replace the
// all-reduces around the TP-split GEMMs:
//
//   GatherFromSequenceParallelRegion       forward: all-gather rows        backward: reduce-scatter rows (sum)
//   ReduceScatterToSequenceParallelRegion  forward: reduce-scatter rows    backward: all-gather rows
//
// (an all-reduce is a reduce-scatter then an all-gather: the same bytes, but
// what lies between the two is computed on 1/TP of the rows and kept 1/TP).
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

// Entering a TP-split GEMM from the sequence-parallel region: its input
// gradient is a partial sum over the TP group, hence the reduce-scatter.
struct GatherFromSequenceParallelRegion {
  static Tensor forward(Communicator& tp, const Tensor& x, MemoryCategory category);
  static Tensor backward(Communicator& tp, const Tensor& grad, MemoryCategory category);
};

// Leaving a row-parallel GEMM (whose output is a partial sum) for the
// sequence-parallel region.
struct ReduceScatterToSequenceParallelRegion {
  static Tensor forward(Communicator& tp, const Tensor& x, MemoryCategory category);
  static Tensor backward(Communicator& tp, const Tensor& grad, MemoryCategory category);
};

}  // namespace megazero::layers
