// A communicator for one rank of a virtual world: the memory planner builds
// the real model and ZeRO engine for rank r of, say, 400 ranks on one
// process, with tensors on the meta device (sizes, no storage). Collectives
// complete at once and move nothing; they are still counted (stats()), so
// the plan can report communication volume from the code that would run.
#pragma once

#include "megazero/comm/communicator.h"

namespace megazero {

class VirtualCommunicator final : public Communicator {
 public:
  // Never checks collectives (--check-collectives): it has no peers to
  // exchange fingerprints with, and an exchange that moves nothing would read
  // an unwritten buffer as every peer's fingerprint.
  VirtualCommunicator(int rank, int size, std::string name) : Communicator(rank, size, std::move(name)) {
    enable_collective_checking(false);
  }
  std::string_view backend() const override { return "virtual"; }

 protected:
  std::unique_ptr<Communicator> do_split(int color, int key, const std::string& name) override;
  std::shared_ptr<WorkImpl> do_all_reduce(const Tensor&, ReduceOp) override { return nullptr; }
  std::shared_ptr<WorkImpl> do_reduce_scatter(const Tensor&, const Tensor&, ReduceOp,
                                              const std::vector<std::int64_t>&) override {
    return nullptr;
  }
  std::shared_ptr<WorkImpl> do_all_gather(const Tensor&, const Tensor&, const std::vector<std::int64_t>&) override {
    return nullptr;
  }
  std::shared_ptr<WorkImpl> do_broadcast(const Tensor&, int) override { return nullptr; }
  std::shared_ptr<WorkImpl> do_reduce(const Tensor&, int, ReduceOp) override { return nullptr; }
  std::shared_ptr<WorkImpl> do_barrier() override { return nullptr; }
  std::shared_ptr<WorkImpl> do_send(const Tensor&, int, int) override { return nullptr; }
  std::shared_ptr<WorkImpl> do_recv(const Tensor&, int, int) override { return nullptr; }
};

}  // namespace megazero
