// The collective API: one small interface, implemented by the MPI backend (CPU
// tensors, any number of ranks per machine) and the NCCL backend (GPU tensors).
// Layers, ZeRO and checkpoints talk only to this interface.
//
// Contract (as with NCCL and MPI): every rank of a communicator issues the
// same collectives, with the same counts and dtypes, in the same order. Each
// collective gets a sequence number and a fingerprint (group, op, dtype, count,
// seq) that can be recorded, and that the --check-collectives mode exchanges
// and compares across ranks before each collective (collective_check.cpp).
// Operations on one communicator execute in issue order; operations on
// different communicators may run concurrently.
//
// Hangs: every collective and split is watched from issue to completion by the
// process-wide collective watchdog (watchdog.h, switched on by
// set_collective_timeout in fault_tolerance.h). Backends report completion
// through watch_ticket()/watch_done().
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "megazero/comm/work.h"
#include "megazero/core/tensor.h"

namespace megazero {

namespace detail {
class CollectiveWatch;
}

enum class ReduceOp : std::uint8_t { Sum, Avg, Max };
std::string_view reduce_op_name(ReduceOp op);

enum class CollectiveType : std::uint8_t {
  AllReduce,
  ReduceScatter,
  AllGather,
  Broadcast,
  Reduce,
  Barrier,
  Send,
  Recv,
  kCount
};
inline constexpr std::size_t kNumCollectiveTypes = static_cast<std::size_t>(CollectiveType::kCount);
std::string_view collective_name(CollectiveType t);

// What a rank issued. `count` is the element count the rank contributes
// (all-reduce: the tensor; reduce-scatter: the full input; all-gather: the
// full output); `peer` is the root (broadcast/reduce) or peer (send/recv).
struct CollectiveRecord {
  std::string group;
  CollectiveType type = CollectiveType::Barrier;
  ReduceOp op = ReduceOp::Sum;
  DType dtype = DType::F32;
  std::int64_t count = 0;
  std::uint64_t seq = 0;
  int peer = -1;
  std::string to_string() const;
  // Fields that must agree across ranks (everything but p2p peers).
  bool same_collective(const CollectiveRecord& other) const;
};

struct CollectiveCounter {
  std::int64_t calls = 0;
  std::int64_t elements = 0;
  std::int64_t bytes = 0;  // bytes of the tensor(s) the rank passed, see CollectiveRecord::count
};
struct CommStats {
  std::array<CollectiveCounter, kNumCollectiveTypes> by_type{};
  const CollectiveCounter& operator[](CollectiveType t) const { return by_type[static_cast<std::size_t>(t)]; }
};

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  virtual std::string_view backend() const = 0;

  // In place on `t`.
  Work all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum);
  // input holds every rank's chunk back to back; output gets this rank's chunk,
  // reduced. counts[r] = elements of rank r's chunk; empty = equal chunks of
  // output.numel() each.
  Work reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op = ReduceOp::Sum,
                      std::vector<std::int64_t> counts = {});
  // output gets every rank's input back to back; counts as in reduce_scatter.
  Work all_gather(const Tensor& input, const Tensor& output, std::vector<std::int64_t> counts = {});
  Work broadcast(const Tensor& t, int root);
  // In place; the result is defined on `root` only.
  Work reduce(const Tensor& t, int root, ReduceOp op = ReduceOp::Sum);
  Work barrier();
  // Point to point; these do not take part in the collective sequence.
  Work send(const Tensor& t, int peer, int tag = 0);
  Work recv(const Tensor& t, int peer, int tag = 0);

  // New communicator of the ranks that pass the same color, ordered by key.
  // Collective over this communicator. The child checks collectives if this
  // communicator or the process-wide default does.
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name);

  // ---- observability ----
  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }
  std::uint64_t collectives_issued() const { return seq_; }
  // Called on the issuing thread with each collective's record before it is
  // launched (tests and tools hook in here).
  void set_record_hook(std::function<void(const CollectiveRecord&)> hook) { hook_ = std::move(hook); }
  // Keeps the records in memory (tests, debugging).
  void set_keep_records(bool keep) { keep_records_ = keep; }
  const std::vector<CollectiveRecord>& records() const { return records_; }

  // ---- faults (fault_tolerance.h) ----
  // --check-collectives on this communicator: before each collective (not
  // send/recv) the ranks all-gather their fingerprints and every rank throws
  // CollectiveMismatchError at the first divergence, before anything
  // mismatched reaches the backend. Call on every rank alike. Starts as
  // check_collectives_default(). The exchanges count in neither stats() nor
  // the sequence numbers.
  void enable_collective_checking(bool on) { checking_ = on; }
  bool collective_checking() const { return checking_; }
  std::uint64_t fingerprints_checked() const { return fingerprints_checked_; }
  // Issued operations (collectives, exchanges, splits) not yet completed.
  std::uint64_t operations_in_flight() const;

 protected:
  Communicator(int rank, int size, std::string name);

  virtual std::unique_ptr<Communicator> do_split(int color, int key, const std::string& name) = 0;
  // Where the --check-collectives exchange buffers live (the backend's
  // collectives must accept tensors there). CPU unless overridden.
  virtual std::shared_ptr<Device> scratch_device() const;

  // Watchdog bookkeeping for backends. Inside do_* (and do_split) the ticket
  // of the operation being issued, 0 for send/recv. The backend calls
  // watch_done(ticket) once it has completed (any thread), before its Work's
  // wait() returns; an operation whose do_* returns nullptr is marked done by
  // the base class. Done(t) also means every earlier ticket is done: a backend
  // must complete one communicator's operations in issue order.
  std::uint64_t watch_ticket() const { return issuing_ticket_; }
  void watch_done(std::uint64_t ticket) noexcept;
  // For completion callbacks that may outlive this object (CUDA host functions).
  const std::shared_ptr<detail::CollectiveWatch>& watch() const { return watch_; }
  // Watches a backend-specific split-like operation: returns its ticket.
  std::uint64_t watch_split();

  // Backends implement these; arguments are already validated and recorded.
  // nullptr means "already complete".
  virtual std::shared_ptr<WorkImpl> do_all_reduce(const Tensor& t, ReduceOp op) = 0;
  virtual std::shared_ptr<WorkImpl> do_reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op,
                                                      const std::vector<std::int64_t>& counts) = 0;
  virtual std::shared_ptr<WorkImpl> do_all_gather(const Tensor& input, const Tensor& output,
                                                  const std::vector<std::int64_t>& counts) = 0;
  virtual std::shared_ptr<WorkImpl> do_broadcast(const Tensor& t, int root) = 0;
  virtual std::shared_ptr<WorkImpl> do_reduce(const Tensor& t, int root, ReduceOp op) = 0;
  virtual std::shared_ptr<WorkImpl> do_barrier() = 0;
  virtual std::shared_ptr<WorkImpl> do_send(const Tensor& t, int peer, int tag) = 0;
  virtual std::shared_ptr<WorkImpl> do_recv(const Tensor& t, int peer, int tag) = 0;

 private:
  // Checks (in --check-collectives mode), records and watches a collective
  // about to be issued; returns its seq (0 for p2p). counts_hash covers the
  // per-rank counts of uneven reduce-scatter/all-gather.
  std::uint64_t record(CollectiveType type, ReduceOp op, DType dtype, std::int64_t count, int peer,
                       std::uint64_t counts_hash = 0);
  // Runs the backend call of the operation just recorded, keeping the watch right.
  // Size-1 groups on GPU tensors complete locally (see communicator.cpp).
  bool local_only(const Tensor& t) const;
  static std::shared_ptr<WorkImpl> local_copy(const Tensor& input, const Tensor& output);
  template <typename Launch>
  Work launch(std::uint64_t seq, Launch&& do_op);
  void exchange_fingerprints(const CollectiveRecord& r, std::uint64_t counts_hash);
  std::vector<std::int64_t> resolve_counts(std::vector<std::int64_t> counts, std::int64_t chunk,
                                           const char* what) const;
  void check_tensor(const Tensor& t, const char* what) const;
  void check_peer(int peer, const char* what) const;

  int rank_, size_;
  std::string name_;
  std::uint64_t seq_ = 0;
  CommStats stats_;
  std::function<void(const CollectiveRecord&)> hook_;
  bool keep_records_ = false;
  std::vector<CollectiveRecord> records_;
  bool checking_ = false;
  std::uint64_t fingerprints_checked_ = 0;
  Tensor check_send_, check_recv_;  // made on first use
  std::shared_ptr<detail::CollectiveWatch> watch_;
  std::uint64_t issuing_ticket_ = 0;
};

}  // namespace megazero
