#include "layers/mappings.h"

#include "megazero/core/error.h"

namespace megazero::layers {
namespace {

// Own slice of the last dimension, as a contiguous tensor.
Tensor take_slice(Communicator& tp, const Tensor& x, MemoryCategory category) {
  const std::int64_t full = x.size(-1);
  MZ_CHECK(full % tp.size() == 0, "last dim ", full, " does not split over ", tp.size(), " TP ranks");
  const std::int64_t n = full / tp.size();
  return x.narrow(-1, tp.rank() * n, n).clone(category);
}

Tensor gather_last_dim(Communicator& tp, const Tensor& x, MemoryCategory category) {
  if (tp.size() == 1) return x.clone(category);
  const std::int64_t n = x.size(-1), rows = x.numel() / std::max<std::int64_t>(n, 1);
  Tensor xc = x.is_contiguous() ? x : x.clone(category);
  // all_gather concatenates whole tensors: [tp, rows, n]; then interleave.
  Tensor stacked = Tensor::empty(x.device_ptr(), {tp.size(), rows, n}, x.dtype(), category);
  tp.all_gather(xc.flatten(), stacked.view({-1})).wait();
  Shape out_shape = x.shape();
  out_shape.back() = n * tp.size();
  Tensor out = Tensor::empty(x.device_ptr(), out_shape, x.dtype(), category);
  out.view({rows, tp.size(), n}).copy_from(stacked.transpose(0, 1));
  return out;
}

// [n, ...] on each rank -> [n tp, ...], rank r's rows at [r n, (r+1) n).
Tensor gather_rows(Communicator& tp, const Tensor& x, MemoryCategory category) {
  Shape shape = x.shape();
  shape[0] *= tp.size();
  Tensor out = Tensor::empty(x.device_ptr(), shape, x.dtype(), category);
  if (tp.size() == 1) {
    out.copy_from(x);
    return out;
  }
  MZ_CHECK(x.is_contiguous(), "gather_rows of a non-contiguous ", x.to_string());
  tp.all_gather(x.flatten(), out.flatten()).wait();
  return out;
}

// [N, ...] partial sums on each rank -> this rank's rows [N/tp, ...] of their sum.
Tensor reduce_scatter_rows(Communicator& tp, const Tensor& x, MemoryCategory category) {
  MZ_CHECK(x.size(0) % tp.size() == 0, x.size(0), " rows do not split over ", tp.size(), " TP ranks");
  Shape shape = x.shape();
  shape[0] /= tp.size();
  Tensor out = Tensor::empty(x.device_ptr(), shape, x.dtype(), category);
  if (tp.size() == 1) {
    out.copy_from(x);
    return out;
  }
  MZ_CHECK(x.is_contiguous(), "reduce_scatter_rows of a non-contiguous ", x.to_string());
  tp.reduce_scatter(x.flatten(), out.flatten(), ReduceOp::Sum).wait();
  return out;
}

}  // namespace

void CopyToTpRegion::backward(Communicator& tp, const Tensor& grad) {
  if (tp.size() > 1) tp.all_reduce(grad, ReduceOp::Sum).wait();
}

void ReduceFromTpRegion::forward(Communicator& tp, const Tensor& x) {
  if (tp.size() > 1) tp.all_reduce(x, ReduceOp::Sum).wait();
}

Tensor GatherFromTpRegion::forward(Communicator& tp, const Tensor& x, MemoryCategory c) {
  return gather_last_dim(tp, x, c);
}
Tensor GatherFromTpRegion::backward(Communicator& tp, const Tensor& grad, MemoryCategory c) {
  return take_slice(tp, grad, c);
}
Tensor ScatterToTpRegion::forward(Communicator& tp, const Tensor& x, MemoryCategory c) { return take_slice(tp, x, c); }
Tensor ScatterToTpRegion::backward(Communicator& tp, const Tensor& grad, MemoryCategory c) {
  return gather_last_dim(tp, grad, c);
}

Tensor GatherFromSequenceParallelRegion::forward(Communicator& tp, const Tensor& x, MemoryCategory c) {
  return gather_rows(tp, x, c);
}
Tensor GatherFromSequenceParallelRegion::backward(Communicator& tp, const Tensor& grad, MemoryCategory c) {
  return reduce_scatter_rows(tp, grad, c);
}
Tensor ReduceScatterToSequenceParallelRegion::forward(Communicator& tp, const Tensor& x, MemoryCategory c) {
  return reduce_scatter_rows(tp, x, c);
}
Tensor ReduceScatterToSequenceParallelRegion::backward(Communicator& tp, const Tensor& grad, MemoryCategory c) {
  return gather_rows(tp, grad, c);
}

}  // namespace megazero::layers
