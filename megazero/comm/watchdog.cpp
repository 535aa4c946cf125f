#include "megazero/comm/watchdog.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <iomanip>
#include <sstream>
#include <thread>
#include <vector>

#include "megazero/comm/fault_tolerance.h"

namespace megazero {
namespace detail {

std::string WatchedOp::describe() const {
  std::ostringstream os;
  if (kind == Kind::Split) return "communicator split";
  if (kind == Kind::FingerprintExchange) os << "the --check-collectives fingerprint exchange before ";
  os << "collective " << collective_name(type) << " #" << seq << " (";
  if (type == CollectiveType::AllReduce || type == CollectiveType::ReduceScatter || type == CollectiveType::Reduce)
    os << reduce_op_name(op) << ", ";
  os << dtype_name(dtype) << ", " << count << " elements)";
  return os.str();
}

std::uint64_t CollectiveWatch::issue(const WatchedOp& op) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::uint64_t ticket = ++issued_;
  ring_[ticket % kRing] = Slot{ticket, op, Clock::now()};
  return ticket;
}

void CollectiveWatch::done(std::uint64_t ticket) noexcept {
  auto cur = done_.load(std::memory_order_relaxed);
  while (cur < ticket && !done_.compare_exchange_weak(cur, ticket, std::memory_order_release)) {
  }
}

std::uint64_t CollectiveWatch::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return issued_ - std::min(issued_, done_.load(std::memory_order_acquire));
}

bool CollectiveWatch::oldest_pending(Pending* out) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto head = done_.load(std::memory_order_acquire) + 1;
  if (head > issued_) return false;
  const Slot& s = ring_[head % kRing];
  if (s.ticket == head) {
    *out = Pending{head, s.op, s.issued};
    return true;
  }
  // Over kRing operations in flight: the head's slot was reused. Time it from
  // the watchdog's first sighting instead (late by at most one tick + ring).
  if (seen_ticket_ != head) {
    seen_ticket_ = head;
    seen_at_ = Clock::now();
  }
  *out = Pending{head, WatchedOp{}, seen_at_};  // seq 0 marks "details lost
  return true;
}

namespace {

// Leaked on purpose: the watchdog thread is detached and may run while static
// destructors do at exit, so nothing it touches is ever destroyed.
struct Watchdog {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<double> timeout_s{0};  // read without the lock on every NCCL issue
  bool started = false;
  std::vector<std::weak_ptr<CollectiveWatch>> watches;
  std::function<void(const std::string&)> handler;
};

Watchdog& watchdog() {
  static auto* w = new Watchdog;
  return *w;
}

int world_rank() {
  int init = 0, fin = 0, rank = -1;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

std::string report(const CollectiveWatch& w, const CollectiveWatch::Pending& p, double waited_s) {
  std::ostringstream os;
  os << "megazero: watchdog: rank " << world_rank() << " (host " << host_name() << ", pid " << getpid() << "): ";
  if (p.op.seq == 0 && p.op.kind != WatchedOp::Kind::Split)
    os << "operation " << p.ticket << " (details lost: over 256 in flight)";
  else
    os << p.op.describe();
  os << " on communicator '" << w.name() << "' has not completed after ";
  if (waited_s < 10)
    os << std::fixed << std::setprecision(1) << waited_s;
  else
    os << std::lround(waited_s);
  os << " s while " << describe_activity();
  if (p.op.kind == WatchedOp::Kind::FingerprintExchange)
    os << "; a peer is likely dead or stuck, or issued fewer collectives here (the fingerprints matched so far)";
  else
    os << "; a peer is likely dead, stuck or issuing a different collective (try --check-collectives)";
  os << "; aborting the job";
  return os.str();
}

// Polls about ten times per timeout, between 0.1 s and 1 s apart: a report
// comes at most ~10% (or 1 s) late, and an idle job wakes at most 10 times a second.
void watchdog_loop() {
  Watchdog& wd = watchdog();
  std::unique_lock<std::mutex> lock(wd.mu);
  for (;;) {
    if (wd.timeout_s <= 0) {
      wd.cv.wait(lock);
      continue;
    }
    const double tick = std::clamp(wd.timeout_s.load() / 10, 0.1, 1.0);
    wd.cv.wait_for(lock, std::chrono::duration<double>(tick));
    const double timeout = wd.timeout_s;
    if (timeout <= 0) continue;
    const auto now = CollectiveWatch::Clock::now();
    // The oldest overdue operation over all communicators is the root cause;
    // later ones usually wait behind it.
    std::shared_ptr<CollectiveWatch> worst;
    CollectiveWatch::Pending worst_p{};
    double worst_s = 0;
    std::erase_if(wd.watches, [](const auto& w) { return w.expired(); });
    for (const auto& weak : wd.watches) {
      auto w = weak.lock();
      CollectiveWatch::Pending p{};
      if (!w || !w->oldest_pending(&p) || p.ticket <= w->reported) continue;
      const double waited = std::chrono::duration<double>(now - p.issued).count();
      if (waited >= timeout && waited > worst_s) {
        worst = w;
        worst_p = p;
        worst_s = waited;
      }
    }
    if (!worst) continue;
    const std::string line = report(*worst, worst_p, worst_s);
    worst->reported = worst_p.ticket;
    if (wd.handler) {
      // Under the lock, so that once set_watchdog_handler returns the old
      // handler is not running (tests destroy what it captured).
      wd.handler(line);
      continue;
    }
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
    abort_world(kExitCollectiveTimeout);
  }
}

}  // namespace

std::shared_ptr<CollectiveWatch> make_watch(const std::string& name) {
  auto w = std::make_shared<CollectiveWatch>(name);
  Watchdog& wd = watchdog();
  std::lock_guard<std::mutex> lock(wd.mu);
  wd.watches.push_back(w);
  return w;
}

void unregister_watch(const std::shared_ptr<CollectiveWatch>& watch) {
  Watchdog& wd = watchdog();
  std::lock_guard<std::mutex> lock(wd.mu);
  std::erase_if(wd.watches, [&](const auto& w) { return w.expired() || w.lock() == watch; });
}

}  // namespace detail

void abort_world(int code) {
  // A world of one rank has no other rank to take down: finalize MPI and exit,
  // so the job's exit code is exactly `code`. Without the finalize, Hydra's
  // proxy sees the rank's connection close without one and, about one run in
  // six here, hangs the rank up (SIGHUP) before it has exited: mpiexec then
  // reports 1 (through MPI_Abort too), failing a sweep's OOM classification.
  // Nothing else can be inside MPI here: a one-rank group's collectives finish
  // at once, and this rank's threads wait on their queues, not in MPI. (MPI
  // wants the finalize from the thread that initialised it: from a
  // communicator's worker thread, exit without one.)
  int size = 0;
  if (detail::world_rank() >= 0) MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size <= 1) {
    int finalized = 0, main_thread = 0;
    MPI_Finalized(&finalized);
    if (size == 1 && !finalized) MPI_Is_thread_main(&main_thread);
    if (main_thread) MPI_Finalize();
    std::_Exit(code);
  }
  // MPI_Abort works from this thread while others are blocked inside MPI
  // (MPI_THREAD_MULTIPLE); the process manager then kills every rank.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void set_collective_timeout(double seconds) {
  MZ_REQUIRE(std::isfinite(seconds) && seconds >= 0,
             "--collective-timeout must be >= 0 seconds (0 turns the watchdog off), got ", seconds);
  auto& wd = detail::watchdog();
  {
    std::lock_guard<std::mutex> lock(wd.mu);
    wd.timeout_s = seconds;
    if (seconds > 0 && !wd.started) {
      wd.started = true;
      std::thread(detail::watchdog_loop).detach();
    }
  }
  wd.cv.notify_all();
}

double collective_timeout() { return detail::watchdog().timeout_s.load(std::memory_order_relaxed); }

void set_watchdog_handler(std::function<void(const std::string&)> handler) {
  auto& wd = detail::watchdog();
  std::lock_guard<std::mutex> lock(wd.mu);
  wd.handler = std::move(handler);
}

}  // namespace megazero
