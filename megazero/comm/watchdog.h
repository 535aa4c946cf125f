// The collective watchdog (internal; the public switch is fault_tolerance.h).
//
// Why: a rank that dies, hangs or issues a different collective leaves its
// peers blocked inside MPI/NCCL forever, and a blocked process cannot report
// anything. So every communicator notes each operation it issues (a ticket)
// and its backend notes when the operation finishes; one process-wide thread
// looks at the oldest unfinished operation of every communicator about once a
// second and, past the timeout, prints one line (rank, host, pid, the
// operation, the activity label) and ends the whole job with MPI_Abort and
// kExitCollectiveTimeout. It works whatever the main thread is blocked in.
//
// Cost per operation: one uncontended mutex and a 48-byte write into a ring;
// completion is one atomic. Operations of one communicator finish in issue
// order (its worker thread / its stream), so "finished up to ticket t" is a
// single number and the oldest unfinished one is always ticket finished + 1.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "megazero/comm/communicator.h"

namespace megazero::detail {

// What was issued, for the report. kind tells a collective from the
// --check-collectives fingerprint exchange before it, or a split.
struct WatchedOp {
  enum class Kind : std::uint8_t { Collective, FingerprintExchange, Split };
  Kind kind = Kind::Collective;
  CollectiveType type = CollectiveType::Barrier;
  ReduceOp op = ReduceOp::Sum;
  DType dtype = DType::F32;
  std::int64_t count = 0;
  std::uint64_t seq = 0;
  std::string describe() const;  // "collective all_reduce #57 (sum, f32, 1024 elements)"
};

// One per communicator, shared with the watchdog (and with completion
// callbacks that may outlive the communicator, hence shared_ptr).
class CollectiveWatch {
 public:
  using Clock = std::chrono::steady_clock;
  explicit CollectiveWatch(std::string name) : name_(std::move(name)) {}

  // Called on the issuing thread; returns the ticket (1, 2, ...).
  std::uint64_t issue(const WatchedOp& op);
  // Called by whoever sees the operation finish; marks it and every earlier
  // ticket done. Lock-free, safe from any thread or a CUDA host callback.
  void done(std::uint64_t ticket) noexcept;
  std::uint64_t in_flight() const;

  // For the watchdog: the oldest unfinished operation and when it was issued
  // (when the watchdog first saw it, if the ring no longer holds it).
  struct Pending {
    std::uint64_t ticket;
    WatchedOp op;
    Clock::time_point issued;
  };
  bool oldest_pending(Pending* out);
  const std::string& name() const { return name_; }
  // The watchdog reports each stuck ticket once (tests install a handler that returns).
  std::uint64_t reported = 0;  // watchdog thread only

 private:
  struct Slot {
    std::uint64_t ticket = 0;
    WatchedOp op;
    Clock::time_point issued;
  };
  static constexpr std::size_t kRing = 256;  // more in flight than this: see oldest_pending

  const std::string name_;
  mutable std::mutex mu_;
  std::uint64_t issued_ = 0;
  std::atomic<std::uint64_t> done_{0};
  std::array<Slot, kRing> ring_{};
  // The watchdog's own first sighting of a ticket the ring lost.
  std::uint64_t seen_ticket_ = 0;
  Clock::time_point seen_at_{};
};

// Registers a communicator's watch with the process-wide watchdog (weakly:
// the communicator unregisters in its destructor).
std::shared_ptr<CollectiveWatch> make_watch(const std::string& name);
void unregister_watch(const std::shared_ptr<CollectiveWatch>& watch);

}  // namespace megazero::detail
