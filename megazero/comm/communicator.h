// The collective API: one small interface, implemented by the MPI backend (CPU
// tensors, any number of ranks per machine) and the NCCL backend (GPU tensors).
// Layers, ZeRO and checkpoints talk only to this interface.
//
// Contract (as with NCCL and MPI): every rank of a communicator issues the
// same collectives, with the same counts and dtypes, in the same order. Each
// collective gets a sequence number and a fingerprint (group, op, dtype, count,
// seq) that can be recorded, so a debug mode can cross-check ranks.
// Operations on one communicator execute in issue order; operations on
// different communicators may run concurrently.
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

enum class ReduceOp : std::uint8_t { Sum, Avg, Max };
std::string_view reduce_op_name(ReduceOp op);

enum class CollectiveType : std::uint8_t {
  AllReduce, ReduceScatter, AllGather, Broadcast, Reduce, Barrier, Send, Recv, kCount
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
  virtual ~Communicator() = default;
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
  // Collective over this communicator.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

  // ---- observability ----
  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }
  std::uint64_t collectives_issued() const { return seq_; }
  // Called on the issuing thread with each collective's record before it is
  // launched (the --check-collectives mode and tests hook in here).
  void set_record_hook(std::function<void(const CollectiveRecord&)> hook) { hook_ = std::move(hook); }
  // Keeps the records in memory (tests, debugging).
  void set_keep_records(bool keep) { keep_records_ = keep; }
  const std::vector<CollectiveRecord>& records() const { return records_; }

 protected:
  Communicator(int rank, int size, std::string name) : rank_(rank), size_(size), name_(std::move(name)) {}

  // Backends implement these; arguments are already validated and recorded.
  // nullptr means "already complete".
  virtual std::shared_ptr<WorkImpl> do_all_reduce(const Tensor& t, ReduceOp op) = 0;
  virtual std::shared_ptr<WorkImpl> do_reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op,
                                 const std::vector<std::int64_t>& counts) = 0;
  virtual std::shared_ptr<WorkImpl> do_all_gather(const Tensor& input, const Tensor& output, const std::vector<std::int64_t>& counts) = 0;
  virtual std::shared_ptr<WorkImpl> do_broadcast(const Tensor& t, int root) = 0;
  virtual std::shared_ptr<WorkImpl> do_reduce(const Tensor& t, int root, ReduceOp op) = 0;
  virtual std::shared_ptr<WorkImpl> do_barrier() = 0;
  virtual std::shared_ptr<WorkImpl> do_send(const Tensor& t, int peer, int tag) = 0;
  virtual std::shared_ptr<WorkImpl> do_recv(const Tensor& t, int peer, int tag) = 0;

 private:
  std::uint64_t record(CollectiveType type, ReduceOp op, DType dtype, std::int64_t count, int peer);
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
};

}  // namespace megazero
