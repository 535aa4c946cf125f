// A communicator whose collectives run only when waited for: a network so
// slow that nothing arrives before its Work::wait(). Every operation is
// queued when issued and runs through the wrapped communicator (blocking)
// when its Work is waited on, after every operation queued before it, in
// issue order (the ordering every backend gives). test() reports "not yet"
// and runs nothing.
//
// Code that reads a collective's result without waiting for it reads stale
// data here on every run, not now and then as with a fast network: a ZeRO
// step that forgets a wait trains different bits, and the tests comparing
// bits catch it on any machine.
#pragma once

#include <deque>
#include <functional>
#include <memory>

#include "megazero/comm/communicator.h"

namespace megazero::testing_util {

class DeferredCommunicator final : public Communicator {
 public:
  explicit DeferredCommunicator(std::unique_ptr<Communicator> inner);
  ~DeferredCommunicator() override;
  std::string_view backend() const override { return "deferred"; }
  // Operations issued and not yet run.
  std::size_t queued() const { return queue_->ops.size(); }

 protected:
  std::unique_ptr<Communicator> do_split(int color, int key, const std::string& name) override;
  std::shared_ptr<WorkImpl> do_all_reduce(const Tensor& t, ReduceOp op) override;
  std::shared_ptr<WorkImpl> do_reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op,
                                              const std::vector<std::int64_t>& counts) override;
  std::shared_ptr<WorkImpl> do_all_gather(const Tensor& input, const Tensor& output,
                                          const std::vector<std::int64_t>& counts) override;
  std::shared_ptr<WorkImpl> do_broadcast(const Tensor& t, int root) override;
  std::shared_ptr<WorkImpl> do_reduce(const Tensor& t, int root, ReduceOp op) override;
  std::shared_ptr<WorkImpl> do_barrier() override;
  std::shared_ptr<WorkImpl> do_send(const Tensor& t, int peer, int tag) override;
  std::shared_ptr<WorkImpl> do_recv(const Tensor& t, int peer, int tag) override;

 public:
  struct Op {
    std::uint64_t id;
    std::function<void()> run;  // blocking, through the wrapped communicator
    std::uint64_t ticket;
  };
  struct Queue {
    std::deque<Op> ops;
    std::uint64_t next_id = 1, done_through = 0;
  };

 private:
  std::shared_ptr<WorkImpl> defer(std::function<void()> run);

  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<Queue> queue_ = std::make_shared<Queue>();
};

}  // namespace megazero::testing_util
