#include "megazero/comm/communicator.h"

#include <numeric>
#include <sstream>

#include "megazero/comm/collective_check.h"
#include "megazero/comm/fault_tolerance.h"
#include "megazero/comm/watchdog.h"
#include "megazero/core/error.h"

namespace megazero {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Max:
      return "max";
  }
  return "?";
}

std::string_view collective_name(CollectiveType t) {
  switch (t) {
    case CollectiveType::AllReduce:
      return "all_reduce";
    case CollectiveType::ReduceScatter:
      return "reduce_scatter";
    case CollectiveType::AllGather:
      return "all_gather";
    case CollectiveType::Broadcast:
      return "broadcast";
    case CollectiveType::Reduce:
      return "reduce";
    case CollectiveType::Barrier:
      return "barrier";
    case CollectiveType::Send:
      return "send";
    case CollectiveType::Recv:
      return "recv";
    case CollectiveType::kCount:
      break;
  }
  return "?";
}

std::string CollectiveRecord::to_string() const {
  std::ostringstream os;
  os << group << " #" << seq << " " << collective_name(type);
  if (type == CollectiveType::AllReduce || type == CollectiveType::ReduceScatter || type == CollectiveType::Reduce)
    os << "(" << reduce_op_name(op) << ")";
  os << " " << dtype_name(dtype) << " x" << count;
  if (peer >= 0) os << (type == CollectiveType::Send || type == CollectiveType::Recv ? " peer " : " root ") << peer;
  return os.str();
}

bool CollectiveRecord::same_collective(const CollectiveRecord& o) const {
  return group == o.group && type == o.type && op == o.op && dtype == o.dtype && count == o.count && seq == o.seq &&
         peer == o.peer;
}

Communicator::Communicator(int rank, int size, std::string name)
    : rank_(rank),
      size_(size),
      name_(std::move(name)),
      checking_(check_collectives_default()),
      watch_(detail::make_watch(name_)) {}

Communicator::~Communicator() { detail::unregister_watch(watch_); }

std::shared_ptr<Device> Communicator::scratch_device() const { return make_device(DeviceKind::CPU); }

std::uint64_t Communicator::operations_in_flight() const { return watch_->in_flight(); }

void Communicator::watch_done(std::uint64_t ticket) noexcept {
  if (ticket != 0) watch_->done(ticket);
}

std::uint64_t Communicator::watch_split() {
  detail::WatchedOp op;
  op.kind = detail::WatchedOp::Kind::Split;
  return watch_->issue(op);
}

std::uint64_t Communicator::record(CollectiveType type, ReduceOp op, DType dtype, std::int64_t count, int peer,
                                   std::uint64_t counts_hash) {
  const bool p2p = type == CollectiveType::Send || type == CollectiveType::Recv;
  CollectiveRecord r{name_, type, op, dtype, count, p2p ? 0 : seq_ + 1, peer};
  // Before anything is counted: a divergence throws with this rank unchanged.
  if (checking_ && !p2p) exchange_fingerprints(r, counts_hash);
  if (!p2p) ++seq_;
  auto& c = stats_.by_type[static_cast<std::size_t>(type)];
  ++c.calls;
  c.elements += count;
  c.bytes += count * static_cast<std::int64_t>(dtype_size(dtype));
  if (hook_) hook_(r);
  if (keep_records_) records_.push_back(r);
  issuing_ticket_ = p2p ? 0 : watch_->issue({detail::WatchedOp::Kind::Collective, type, op, dtype, count, r.seq});
  return r.seq;
}

// A group of one rank holding device tensors (a GPU's, the isolated
// device's): the result is the input, so nothing is staged through the host
// or handed to a backend (a 350M-parameter model would otherwise copy its
// gradients out and back every step). Host tensors still go through the
// backend, whose own cost the planner models.
bool Communicator::local_only(const Tensor& t) const {
  return size_ == 1 && t.device().has_storage() && !t.device().host_accessible();
}

std::shared_ptr<WorkImpl> Communicator::local_copy(const Tensor& input, const Tensor& output) {
  if (input.data() != output.data()) {
    Tensor out = output;
    out.copy_from(input);  // queued on the device's stream, like a kernel
  }
  return nullptr;
}

template <typename Launch>
Work Communicator::launch(std::uint64_t seq, Launch&& do_op) {
  const auto ticket = issuing_ticket_;
  std::shared_ptr<WorkImpl> impl;
  try {
    impl = do_op();
  } catch (...) {
    // Not issued after all: the error, not the watchdog, reports it.
    issuing_ticket_ = 0;
    watch_done(ticket);
    throw;
  }
  issuing_ticket_ = 0;
  if (!impl) watch_done(ticket);
  return Work(std::move(impl), seq);
}

void Communicator::exchange_fingerprints(const CollectiveRecord& r, std::uint64_t counts_hash) {
  constexpr auto words = static_cast<std::int64_t>(detail::kFingerprintWords);
  if (!check_send_.defined()) {
    auto dev = scratch_device();
    check_send_ = Tensor::empty(dev, {words}, DType::I64, MemoryCategory::Other, "check-collectives send");
    check_recv_ = Tensor::empty(dev, {words * size_}, DType::I64, MemoryCategory::Other, "check-collectives recv");
  }
  const auto mine = detail::make_fingerprint(r, counts_hash);
  check_send_.device().copy_from_host(check_send_.data(), mine.data(), check_send_.nbytes());
  issuing_ticket_ =
      watch_->issue({detail::WatchedOp::Kind::FingerprintExchange, r.type, r.op, r.dtype, r.count, r.seq});
  // The backend directly: the exchange is not itself recorded, counted or checked.
  const std::vector<std::int64_t> counts(static_cast<std::size_t>(size_), words);
  launch(0, [&] { return do_all_gather(check_send_, check_recv_, counts); }).wait();
  std::vector<std::int64_t> all(static_cast<std::size_t>(words * size_));
  check_recv_.device().copy_to_host(all.data(), check_recv_.data(), check_recv_.nbytes());
  ++fingerprints_checked_;
  const std::string mismatch = detail::compare_fingerprints(all, size_, name_);
  if (!mismatch.empty()) throw CollectiveMismatchError(mismatch);
}

std::unique_ptr<Communicator> Communicator::split(int color, int key, const std::string& name) {
  issuing_ticket_ = watch_split();
  std::unique_ptr<Communicator> child;
  launch(0, [&]() -> std::shared_ptr<WorkImpl> {
    child = do_split(color, key, name);
    return nullptr;
  });
  if (checking_) child->checking_ = true;
  return child;
}

void Communicator::check_tensor(const Tensor& t, const char* what) const {
  MZ_CHECK(t.defined(), name_, ": ", what, " of an undefined tensor");
  MZ_CHECK(t.is_contiguous(), name_, ": ", what, " needs a contiguous tensor, got a strided view ", t.to_string());
}

void Communicator::check_peer(int peer, const char* what) const {
  MZ_CHECK(peer >= 0 && peer < size_, name_, ": ", what, " peer/root ", peer, " outside [0, ", size_, ")");
}

std::vector<std::int64_t> Communicator::resolve_counts(std::vector<std::int64_t> counts, std::int64_t chunk,
                                                       const char* what) const {
  if (counts.empty()) return std::vector<std::int64_t>(static_cast<std::size_t>(size_), chunk);
  MZ_CHECK(static_cast<int>(counts.size()) == size_, name_, ": ", what, " got ", counts.size(), " counts for ", size_,
           " ranks");
  for (auto c : counts) MZ_CHECK(c >= 0, name_, ": ", what, " negative count");
  MZ_CHECK(counts[static_cast<std::size_t>(rank_)] == chunk, name_, ": ", what, " this rank's count ",
           counts[static_cast<std::size_t>(rank_)], " differs from its tensor's ", chunk, " elements");
  return counts;
}

Work Communicator::all_reduce(const Tensor& t, ReduceOp op) {
  check_tensor(t, "all_reduce");
  const auto seq = record(CollectiveType::AllReduce, op, t.dtype(), t.numel(), -1);
  if (local_only(t)) return launch(seq, [] { return std::shared_ptr<WorkImpl>(); });
  return launch(seq, [&] { return do_all_reduce(t, op); });
}

Work Communicator::reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op,
                                  std::vector<std::int64_t> counts) {
  check_tensor(input, "reduce_scatter input");
  check_tensor(output, "reduce_scatter output");
  MZ_CHECK(input.dtype() == output.dtype(), name_, ": reduce_scatter dtypes differ");
  counts = resolve_counts(std::move(counts), output.numel(), "reduce_scatter");
  const auto total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  MZ_CHECK(total == input.numel(), name_, ": reduce_scatter input has ", input.numel(), " elements, counts sum to ",
           total);
  const auto seq =
      record(CollectiveType::ReduceScatter, op, input.dtype(), input.numel(), -1, detail::hash_counts(counts));
  if (local_only(input)) return launch(seq, [&] { return local_copy(input, output); });
  return launch(seq, [&] { return do_reduce_scatter(input, output, op, counts); });
}

Work Communicator::all_gather(const Tensor& input, const Tensor& output, std::vector<std::int64_t> counts) {
  check_tensor(input, "all_gather input");
  check_tensor(output, "all_gather output");
  MZ_CHECK(input.dtype() == output.dtype(), name_, ": all_gather dtypes differ");
  counts = resolve_counts(std::move(counts), input.numel(), "all_gather");
  const auto total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  MZ_CHECK(total == output.numel(), name_, ": all_gather output has ", output.numel(), " elements, counts sum to ",
           total);
  const auto seq =
      record(CollectiveType::AllGather, ReduceOp::Sum, input.dtype(), output.numel(), -1, detail::hash_counts(counts));
  if (local_only(input)) return launch(seq, [&] { return local_copy(input, output); });
  return launch(seq, [&] { return do_all_gather(input, output, counts); });
}

Work Communicator::broadcast(const Tensor& t, int root) {
  check_tensor(t, "broadcast");
  check_peer(root, "broadcast");
  const auto seq = record(CollectiveType::Broadcast, ReduceOp::Sum, t.dtype(), t.numel(), root);
  if (local_only(t)) return launch(seq, [] { return std::shared_ptr<WorkImpl>(); });
  return launch(seq, [&] { return do_broadcast(t, root); });
}

Work Communicator::reduce(const Tensor& t, int root, ReduceOp op) {
  check_tensor(t, "reduce");
  check_peer(root, "reduce");
  const auto seq = record(CollectiveType::Reduce, op, t.dtype(), t.numel(), root);
  if (local_only(t)) return launch(seq, [] { return std::shared_ptr<WorkImpl>(); });
  return launch(seq, [&] { return do_reduce(t, root, op); });
}

Work Communicator::barrier() {
  const auto seq = record(CollectiveType::Barrier, ReduceOp::Sum, DType::F32, 0, -1);
  return launch(seq, [&] { return do_barrier(); });
}

Work Communicator::send(const Tensor& t, int peer, int tag) {
  check_tensor(t, "send");
  check_peer(peer, "send");
  MZ_CHECK(peer != rank_, name_, ": send to self");
  record(CollectiveType::Send, ReduceOp::Sum, t.dtype(), t.numel(), peer);
  return launch(0, [&] { return do_send(t, peer, tag); });
}

Work Communicator::recv(const Tensor& t, int peer, int tag) {
  check_tensor(t, "recv");
  check_peer(peer, "recv");
  MZ_CHECK(peer != rank_, name_, ": recv from self");
  record(CollectiveType::Recv, ReduceOp::Sum, t.dtype(), t.numel(), peer);
  return launch(0, [&] { return do_recv(t, peer, tag); });
}

}  // namespace megazero
