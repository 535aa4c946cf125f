#include "deferred_communicator.h"

#include "megazero/core/error.h"

namespace megazero::testing_util {

namespace {

// Runs the queue up to and including `id` when waited for.
class DeferredWork final : public WorkImpl {
 public:
  DeferredWork(std::shared_ptr<DeferredCommunicator::Queue> q, std::uint64_t id,
               std::function<void(std::uint64_t)> done)
      : q_(std::move(q)), id_(id), done_(std::move(done)) {}
  void wait() override {
    while (q_->done_through < id_) {
      MZ_CHECK(!q_->ops.empty(), "deferred operation ", id_, " is neither queued nor done");
      DeferredCommunicator::Op op = std::move(q_->ops.front());
      q_->ops.pop_front();
      op.run();
      q_->done_through = op.id;
      done_(op.ticket);
    }
  }
  bool test() override { return q_->done_through >= id_; }

 private:
  std::shared_ptr<DeferredCommunicator::Queue> q_;
  std::uint64_t id_;
  std::function<void(std::uint64_t)> done_;
};

}  // namespace

DeferredCommunicator::DeferredCommunicator(std::unique_ptr<Communicator> inner)
    : Communicator(inner->rank(), inner->size(), inner->name()), inner_(std::move(inner)) {
  // The fingerprint exchange would itself be deferred; the wrapped communicator checks what it runs.
  enable_collective_checking(false);
}

DeferredCommunicator::~DeferredCommunicator() {
  // What nobody waited for never ran on any rank alike: drop it, and tell the watchdog.
  for (const Op& op : queue_->ops) watch_done(op.ticket);
}

std::shared_ptr<WorkImpl> DeferredCommunicator::defer(std::function<void()> run) {
  const std::uint64_t id = queue_->next_id++;
  queue_->ops.push_back({id, std::move(run), watch_ticket()});
  return std::make_shared<DeferredWork>(queue_, id, [this](std::uint64_t ticket) { watch_done(ticket); });
}

std::unique_ptr<Communicator> DeferredCommunicator::do_split(int color, int key, const std::string& name) {
  MZ_CHECK(queue_->ops.empty(), "split of '", this->name(), "' with deferred operations queued");
  return std::make_unique<DeferredCommunicator>(inner_->split(color, key, name));
}

// Tensors are handles: the captured copies keep the buffers alive until the operation runs.
std::shared_ptr<WorkImpl> DeferredCommunicator::do_all_reduce(const Tensor& t, ReduceOp op) {
  return defer([this, t, op] { inner_->all_reduce(t, op).wait(); });
}
std::shared_ptr<WorkImpl> DeferredCommunicator::do_reduce_scatter(const Tensor& input, const Tensor& output,
                                                                  ReduceOp op,
                                                                  const std::vector<std::int64_t>& counts) {
  return defer([this, input, output, op, counts] { inner_->reduce_scatter(input, output, op, counts).wait(); });
}
std::shared_ptr<WorkImpl> DeferredCommunicator::do_all_gather(const Tensor& input, const Tensor& output,
                                                              const std::vector<std::int64_t>& counts) {
  return defer([this, input, output, counts] { inner_->all_gather(input, output, counts).wait(); });
}
std::shared_ptr<WorkImpl> DeferredCommunicator::do_broadcast(const Tensor& t, int root) {
  return defer([this, t, root] { inner_->broadcast(t, root).wait(); });
}
std::shared_ptr<WorkImpl> DeferredCommunicator::do_reduce(const Tensor& t, int root, ReduceOp op) {
  return defer([this, t, root, op] { inner_->reduce(t, root, op).wait(); });
}
std::shared_ptr<WorkImpl> DeferredCommunicator::do_barrier() {
  return defer([this] { inner_->barrier().wait(); });
}
std::shared_ptr<WorkImpl> DeferredCommunicator::do_send(const Tensor& t, int peer, int tag) {
  return defer([this, t, peer, tag] { inner_->send(t, peer, tag).wait(); });
}
std::shared_ptr<WorkImpl> DeferredCommunicator::do_recv(const Tensor& t, int peer, int tag) {
  return defer([this, t, peer, tag] { inner_->recv(t, peer, tag).wait(); });
}

}  // namespace megazero::testing_util
