// Work: the handle every communication call returns (as in NCCL / c10d).
// wait() blocks until the operation finished and rethrows its error; test()
// polls. Blocking use is simply `comm.all_reduce(t).wait()`. On GPU backends
// (NCCL) "finished" is as the device sees it: wait() orders the compute
// stream, where every consumer of the result runs, and the host runs on.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>

namespace megazero {

class WorkImpl {
 public:
  virtual ~WorkImpl() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
};

class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<WorkImpl> impl, std::uint64_t seq = 0) : impl_(std::move(impl)), seq_(seq) {}
  void wait() {
    if (impl_) impl_->wait();
  }
  bool test() { return !impl_ || impl_->test(); }
  // The communicator's collective sequence number of this operation (0 for p2p).
  std::uint64_t seq() const { return seq_; }

 private:
  std::shared_ptr<WorkImpl> impl_;
  std::uint64_t seq_ = 0;
};

// A Work completed by another thread (a communicator's worker).
class ThreadWork final : public WorkImpl {
 public:
  void finish(std::exception_ptr error = nullptr) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      error_ = error;
    }
    cv_.notify_all();
  }
  void wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }
  bool test() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ && error_) std::rethrow_exception(error_);
    return done_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

// Waits for all, in order; the first error is rethrown after all were waited for.
template <typename Range>
void wait_all(Range& works) {
  std::exception_ptr first;
  for (auto& w : works) {
    try {
      w.wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace megazero
