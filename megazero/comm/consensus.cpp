#include "megazero/comm/consensus.h"

#include <cstring>

namespace megazero {

void agree_on_error(Communicator& comm, const std::string& local_error) {
  auto cpu = make_device(DeviceKind::CPU);
  // Max over (size - rank) of failing ranks picks the lowest failing rank.
  Tensor flag = Tensor::empty(cpu, {1}, DType::I32, MemoryCategory::CommBuffers);
  flag.host_data<std::int32_t>()[0] = local_error.empty() ? 0 : comm.size() - comm.rank();
  comm.all_reduce(flag, ReduceOp::Max).wait();
  const int v = flag.host_data<std::int32_t>()[0];
  if (v == 0) return;
  const int root = comm.size() - v;
  const std::string message = broadcast_string(comm, local_error, root);
  if (root == 0) throw AgreedConfigError(message);
  throw AgreedConfigError(message + " (reported by rank " + std::to_string(root) + ")");
}

double all_reduce_value(Communicator& comm, double v, ReduceOp op) {
  Tensor t = Tensor::empty(make_device(DeviceKind::CPU), {1}, DType::F64, MemoryCategory::Workspace);
  t.host_data<double>()[0] = v;
  comm.all_reduce(t, op).wait();
  return t.host_data<double>()[0];
}

RankSpread rank_spread(Communicator& comm, double v) {
  auto cpu = make_device(DeviceKind::CPU);
  Tensor t = Tensor::empty(cpu, {2}, DType::F64, MemoryCategory::Workspace);
  t.host_data<double>()[0] = v;
  t.host_data<double>()[1] = -v;
  comm.all_reduce(t, ReduceOp::Max).wait();
  const double mx = t.host_data<double>()[0];
  // The lowest rank holding the max: the max of (size - rank) over them.
  Tensor who = Tensor::empty(cpu, {1}, DType::I64, MemoryCategory::Workspace);
  who.host_data<std::int64_t>()[0] = v == mx ? comm.size() - comm.rank() : 0;
  comm.all_reduce(who, ReduceOp::Max).wait();
  return {-t.host_data<double>()[1], mx, comm.size() - static_cast<int>(who.host_data<std::int64_t>()[0])};
}

std::string broadcast_string(Communicator& comm, const std::string& s, int root) {
  auto cpu = make_device(DeviceKind::CPU);
  Tensor len = Tensor::empty(cpu, {1}, DType::I64, MemoryCategory::CommBuffers);
  len.host_data<std::int64_t>()[0] = static_cast<std::int64_t>(s.size());
  comm.broadcast(len, root).wait();
  Tensor text = Tensor::empty(cpu, {len.host_data<std::int64_t>()[0]}, DType::U8, MemoryCategory::CommBuffers);
  if (comm.rank() == root && !s.empty()) std::memcpy(text.host_bytes(), s.data(), s.size());
  comm.broadcast(text, root).wait();
  return std::string(static_cast<const char*>(text.host_bytes()), static_cast<std::size_t>(text.numel()));
}

}  // namespace megazero
