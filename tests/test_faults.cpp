// Faults and hangs (megazero/comm/fault_tolerance.h), in process: the activity
// label, the watchdog's bookkeeping and report (with a handler instead of the
// abort, on a fake backend whose operations finish only when told, and on MPI
// with a late rank), and --check-collectives (a correct program passes and is
// really cross-checked; every kind of divergence throws on every rank with
// both sides named, and leaves the communicator usable). How a real job ends
// is proven by the CLI tests with megazero-fault-inject (tests/CMakeLists.txt).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "megazero/comm/collective_check.h"
#include "megazero/comm/fault_tolerance.h"
#include "megazero/comm/mpi_communicator.h"
#include "megazero/comm/virtual_communicator.h"

using namespace megazero;
using testing::HasSubstr;
using testing::MatchesRegex;
using namespace std::chrono_literals;

namespace {

// A backend whose operations complete only when the test says so.
class ManualWork final : public WorkImpl {
 public:
  void wait() override {
    while (!done) std::this_thread::sleep_for(1ms);
  }
  bool test() override { return done; }
  std::atomic<bool> done{false};
};

class FakeCommunicator final : public Communicator {
 public:
  explicit FakeCommunicator(std::string name) : Communicator(0, 1, std::move(name)) {}
  std::string_view backend() const override { return "fake"; }
  // Completes the oldest pending operation.
  void complete_next() {
    auto [ticket, work] = pending_.front();
    pending_.erase(pending_.begin());
    watch_done(ticket);
    work->done = true;
  }

 protected:
  std::shared_ptr<WorkImpl> issue() {
    auto w = std::make_shared<ManualWork>();
    pending_.emplace_back(watch_ticket(), w);
    return w;
  }
  std::shared_ptr<WorkImpl> do_all_reduce(const Tensor&, ReduceOp) override { return issue(); }
  std::shared_ptr<WorkImpl> do_reduce_scatter(const Tensor&, const Tensor&, ReduceOp,
                                              const std::vector<std::int64_t>&) override {
    return issue();
  }
  std::shared_ptr<WorkImpl> do_all_gather(const Tensor&, const Tensor&, const std::vector<std::int64_t>&) override {
    return issue();
  }
  std::shared_ptr<WorkImpl> do_broadcast(const Tensor&, int) override { return issue(); }
  std::shared_ptr<WorkImpl> do_reduce(const Tensor&, int, ReduceOp) override { return issue(); }
  std::shared_ptr<WorkImpl> do_barrier() override { return nullptr; }  // "already complete"
  std::shared_ptr<WorkImpl> do_send(const Tensor&, int, int) override { return nullptr; }
  std::shared_ptr<WorkImpl> do_recv(const Tensor&, int, int) override { return nullptr; }
  std::unique_ptr<Communicator> do_split(int, int, const std::string& name) override {
    return std::make_unique<FakeCommunicator>(name);
  }

 private:
  std::vector<std::pair<std::uint64_t, std::shared_ptr<ManualWork>>> pending_;
};

// Collects watchdog reports instead of aborting; restores everything on exit.
class Reports {
 public:
  explicit Reports(double timeout_s) : previous_(collective_timeout()) {
    set_watchdog_handler([this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.push_back(line);
    });
    set_collective_timeout(timeout_s);
  }
  ~Reports() {
    set_collective_timeout(previous_);  // the test main's watchdog, on multi-rank runs
    set_watchdog_handler(nullptr);
  }
  std::vector<std::string> lines() {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_;
  }
  // Waits up to `limit` for at least n reports.
  std::vector<std::string> wait_for(std::size_t n, std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (lines().size() < n && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(10ms);
    return lines();
  }

 private:
  const double previous_;
  std::mutex mu_;
  std::vector<std::string> lines_;
};

Tensor filled(std::int64_t n, DType t, double v) {
  Tensor x = Tensor::empty(make_device(DeviceKind::CPU), {n}, t, MemoryCategory::CommBuffers);
  x.copy_from_doubles(std::vector<double>(static_cast<std::size_t>(n), v));
  return x;
}

std::unique_ptr<MpiCommunicator> world_comm(const std::string& name) { return MpiCommunicator::world(name); }

}  // namespace

TEST(Activity, LabelIterationAndScopes) {
  set_activity_iteration(-1);
  set_activity("");
  EXPECT_EQ(describe_activity(), "no activity label set");
  set_activity("startup");
  EXPECT_EQ(describe_activity(), "startup");
  set_activity_iteration(12);
  EXPECT_EQ(describe_activity(), "iteration 12: startup");
  {
    Activity outer("backward");
    EXPECT_EQ(describe_activity(), "iteration 12: backward");
    {
      Activity inner(std::string(500, 'x'));  // truncated, not refused
      EXPECT_EQ(describe_activity(), "iteration 12: " + std::string(kMaxActivityLength, 'x'));
    }
    EXPECT_EQ(describe_activity(), "iteration 12: backward");
  }
  EXPECT_EQ(describe_activity(), "iteration 12: startup");
  set_activity("");
  EXPECT_EQ(describe_activity(), "iteration 12");
  set_activity_iteration(-1);
}

TEST(Watchdog, RejectsNegativeTimeout) {
  const double before = collective_timeout();  // 0, or the test main's watchdog on multi-rank runs
  EXPECT_THROW(set_collective_timeout(-1), ConfigError);
  EXPECT_EQ(collective_timeout(), before) << "a refused value changes nothing";
}

TEST(Watchdog, ReportsAStuckOperationOnceWithItsActivity) {
  FakeCommunicator comm("fake-dp");
  Tensor x = filled(3, DType::F32, 1);
  comm.barrier().wait();  // completes at issue (do_barrier returns nullptr): never in flight
  EXPECT_EQ(comm.operations_in_flight(), 0u);
  Work first = comm.all_reduce(x, ReduceOp::Max);
  EXPECT_EQ(comm.operations_in_flight(), 1u);
  struct IterationGuard {
    IterationGuard() { set_activity_iteration(7); }
    ~IterationGuard() { set_activity_iteration(-1); }
  } iteration;
  Activity label("optimizer step");
  {
    Reports reports(0.2);
    auto lines = reports.wait_for(1, 5000ms);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_THAT(lines[0], MatchesRegex("megazero: watchdog: rank -?[0-9]+ \\(host .+, pid [0-9]+\\): collective "
                                       "all_reduce #2 \\(max, fp32, 3 elements\\) on communicator 'fake-dp' has not "
                                       "completed after [0-9.]+ s while iteration 7: optimizer step; a peer is .*"
                                       "\\(try --check-collectives\\); aborting the job"));
    std::this_thread::sleep_for(400ms);
    EXPECT_EQ(reports.lines().size(), 1u) << "each stuck operation is reported once";
    comm.complete_next();
    first.wait();
    EXPECT_EQ(comm.operations_in_flight(), 0u);
    // The next stuck one is reported in its turn.
    Work second = comm.broadcast(x, 0);
    lines = reports.wait_for(2, 5000ms);
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_THAT(lines[1], HasSubstr("collective broadcast #3 (fp32, 3 elements) on communicator 'fake-dp'"));
    comm.complete_next();
  }
}

TEST(Watchdog, QuietWhileCollectivesComplete) {
  auto world = world_comm("test-faults");
  Reports reports(2.0);
  Tensor x = filled(64, DType::F32, 1);
  for (int round = 0; round < 25; ++round) {  // a fixed count: every rank issues the same
    std::vector<Work> works;
    for (int i = 0; i < 4; ++i) works.push_back(world->all_reduce(x));
    wait_all(works);
  }
  auto half = world->split(world->rank() % 2, world->rank(), "test-faults-half");
  half->barrier().wait();
  EXPECT_EQ(world->operations_in_flight(), 0u);
  EXPECT_EQ(half->operations_in_flight(), 0u);
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(reports.lines().empty()) << reports.lines().front();
}

// A rank that arrives late: its peers' watchdogs report the all-reduce they
// are blocked in (main thread in Work::wait, worker inside MPI); the late rank,
// busy elsewhere, reports nothing.
TEST(Watchdog, ReportsPeersBlockedInMpi) {
  auto world = world_comm("test-faults");
  if (world->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int late = world->size() - 1;
  Tensor x = filled(8, DType::F32, 1);
  world->all_reduce(x).wait();
  {
    Reports reports(0.3);
    Activity label("waiting for a late rank");
    if (world->rank() == late) std::this_thread::sleep_for(1500ms);
    world->all_reduce(x).wait();
    if (world->rank() == late) {
      EXPECT_TRUE(reports.lines().empty());
    } else {
      ASSERT_EQ(reports.lines().size(), 1u);
      EXPECT_THAT(reports.lines()[0], HasSubstr("collective all_reduce #2 (sum, fp32, 8 elements) on communicator "
                                                "'test-faults' has not completed after"));
      EXPECT_THAT(reports.lines()[0], HasSubstr("while waiting for a late rank"));
    }
  }
  world->barrier().wait();
}

class CheckCollectives : public testing::Test {
 protected:
  void SetUp() override {
    world = world_comm("test-check");
    world->enable_collective_checking(true);
  }
  std::unique_ptr<MpiCommunicator> world;
};

// Runs a mix of every collective; returns how many it issued.
std::uint64_t run_mix(Communicator& c) {
  const int n = c.size(), me = c.rank();
  Tensor x = filled(10, DType::F32, 1);
  c.all_reduce(x).wait();
  EXPECT_EQ(x.to_double_vector()[9], n);
  // Uneven counts: rank r holds r + 1 elements.
  std::vector<std::int64_t> counts;
  for (int r = 0; r < n; ++r) counts.push_back(r + 1);
  const std::int64_t total = n * (n + 1) / 2;
  Tensor part = filled(me + 1, DType::BF16, 2);
  Tensor full = filled(total, DType::BF16, 0);
  c.all_gather(part, full, counts).wait();
  EXPECT_EQ(full.to_double_vector()[static_cast<std::size_t>(total - 1)], 2);
  Tensor mine = filled(me + 1, DType::BF16, 0);
  c.reduce_scatter(full, mine, ReduceOp::Avg, counts).wait();
  EXPECT_EQ(mine.to_double_vector()[0], 2);
  c.broadcast(x, n - 1).wait();
  c.reduce(x, 0, ReduceOp::Max).wait();
  c.barrier().wait();
  if (n >= 2) {  // p2p is not checked
    Tensor y = filled(4, DType::F64, me);
    if (me == 0) c.send(y, 1).wait();
    if (me == 1) c.recv(y, 0).wait();
  }
  return 6;
}

TEST_F(CheckCollectives, CorrectProgramPassesAndIsReallyChecked) {
  auto plain = world_comm("test-check");
  ASSERT_FALSE(plain->collective_checking());
  const auto issued = run_mix(*world);
  EXPECT_EQ(world->fingerprints_checked(), issued);
  EXPECT_EQ(world->collectives_issued(), issued);
  // The exchanges count in neither the sequence numbers nor the statistics.
  run_mix(*plain);
  EXPECT_EQ(plain->fingerprints_checked(), 0u);
  for (std::size_t t = 0; t < kNumCollectiveTypes; ++t) {
    EXPECT_EQ(world->stats().by_type[t].calls, plain->stats().by_type[t].calls) << t;
    EXPECT_EQ(world->stats().by_type[t].bytes, plain->stats().by_type[t].bytes) << t;
  }
  EXPECT_EQ(world->operations_in_flight(), 0u);
}

TEST_F(CheckCollectives, SplitsAndNewCommunicatorsInherit) {
  auto child = world->split(0, world->rank(), "test-check-child");
  EXPECT_TRUE(child->collective_checking());
  auto plain = world_comm("test-plain");
  EXPECT_FALSE(plain->collective_checking());
  EXPECT_FALSE(plain->split(0, plain->rank(), "x")->collective_checking());
  set_check_collectives_default(true);
  EXPECT_TRUE(world_comm("test-default")->collective_checking());
  EXPECT_TRUE(plain->split(0, plain->rank(), "y")->collective_checking());
  set_check_collectives_default(false);
  child->all_reduce(filled(3, DType::F32, 1)).wait();
  EXPECT_EQ(child->fingerprints_checked(), 1u);
}

// The memory planner's virtual communicators (a rank of a virtual world, no
// peers) never exchange fingerprints: with --check-collectives on by default
// (the trainer sets it before planning) an exchange that moves nothing read an
// unwritten buffer as every peer's fingerprint and stopped the run.
TEST(CheckCollectivesVirtual, ThePlannersCommunicatorsAreNotChecked) {
  set_check_collectives_default(true);
  VirtualCommunicator v(1, 4, "dp");
  set_check_collectives_default(false);
  EXPECT_FALSE(v.collective_checking());
  auto meta = make_device(DeviceKind::Meta);
  Tensor part = Tensor::empty(meta, {8}, DType::BF16, MemoryCategory::CommBuffers);
  Tensor full = Tensor::empty(meta, {32}, DType::BF16, MemoryCategory::CommBuffers);
  EXPECT_NO_THROW(v.all_gather(part, full).wait());
  EXPECT_NO_THROW(v.reduce_scatter(full, part).wait());
  EXPECT_EQ(v.fingerprints_checked(), 0u);
  EXPECT_EQ(v.collectives_issued(), 2u);
}

// Each case: the last rank issues something else than the others. Every rank
// must throw the same message, naming both sides, before anything reaches MPI.
TEST_F(CheckCollectives, EveryDivergenceThrowsOnEveryRank) {
  const int n = world->size(), me = world->rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const bool odd = me == n - 1;
  const std::string other = "rank " + std::to_string(n - 1) + " issued ";
  auto expect_divergence = [&](const std::function<void()>& issue, const std::string& mine_text,
                               const std::string& other_text) {
    const auto seq = world->collectives_issued();
    try {
      issue();
      ADD_FAILURE() << "no divergence reported; expected " << other_text;
    } catch (const CollectiveMismatchError& e) {
      EXPECT_EQ(std::string(e.what()),
                "--check-collectives: collective #" + std::to_string(seq + 1) +
                    " on communicator 'test-check' diverged: rank 0 issued " + mine_text + " but " + other +
                    other_text + "; every rank of a communicator must issue the same collectives in the same order");
    }
    EXPECT_EQ(world->collectives_issued(), seq);  // nothing was issued
  };
  Tensor x = filled(16, DType::F32, 1);
  Tensor x17 = filled(17, DType::F32, 1);
  Tensor xd = filled(16, DType::F64, 1);
  Tensor gathered = filled(16 * n, DType::F32, 0);
  expect_divergence([&] { world->all_reduce(odd ? x17 : x).wait(); }, "all_reduce(sum, fp32, 16)",
                    "all_reduce(sum, fp32, 17)");
  expect_divergence([&] { world->all_reduce(x, odd ? ReduceOp::Max : ReduceOp::Sum).wait(); },
                    "all_reduce(sum, fp32, 16)", "all_reduce(max, fp32, 16)");
  expect_divergence([&] { world->all_reduce(odd ? xd : x).wait(); }, "all_reduce(sum, fp32, 16)",
                    "all_reduce(sum, fp64, 16)");
  expect_divergence([&] { odd ? world->all_gather(x, gathered).wait() : world->all_reduce(x).wait(); },
                    "all_reduce(sum, fp32, 16)", "all_gather(fp32, " + std::to_string(16 * n) + ")");
  expect_divergence([&] { world->broadcast(x, odd ? 1 : 0).wait(); }, "broadcast(fp32, 16, root 0)",
                    "broadcast(fp32, 16, root 1)");
  // Uneven all-gather with equal totals but different per-rank counts: the
  // last rank thinks rank 0 holds one element more and itself one less.
  std::vector<std::int64_t> counts(static_cast<std::size_t>(n), 2);
  if (odd) {
    counts.front() = 3;
    counts.back() = 1;
  }
  Tensor part = filled(counts[static_cast<std::size_t>(me)], DType::F32, 1);
  Tensor full = filled(2 * n, DType::F32, 0);
  const std::string ag = "all_gather(fp32, " + std::to_string(2 * n) + ")";
  expect_divergence([&] { world->all_gather(part, full, counts).wait(); }, ag, ag + " with different per-rank counts");
  expect_divergence([&] { odd ? world->barrier().wait() : world->all_reduce(x).wait(); }, "all_reduce(sum, fp32, 16)",
                    "barrier()");
  // Still usable, and in step, afterwards.
  world->all_reduce(x).wait();
  EXPECT_EQ(x.to_double_vector()[0], n);
}

// What needs a desynchronised job (which would hang without the check) is
// tested on the comparison itself: a rank that skipped a collective, and garbage.
TEST(CheckCollectivesCompare, SkippedCollectiveAndGarbage) {
  CollectiveRecord a{"tp", CollectiveType::AllReduce, ReduceOp::Sum, DType::F32, 4096, 12, -1};
  CollectiveRecord b = a;
  b.seq = 11;
  std::vector<std::int64_t> all;
  for (const auto& r : {a, a, b}) {
    const auto f = detail::make_fingerprint(r, 0);
    all.insert(all.end(), f.begin(), f.end());
  }
  EXPECT_EQ(detail::compare_fingerprints(std::vector<std::int64_t>(all.begin(), all.begin() + 16), 2, "tp"), "");
  EXPECT_THAT(detail::compare_fingerprints(all, 3, "tp"),
              HasSubstr("collective #12 on communicator 'tp' diverged: rank 0 issued all_reduce(sum, fp32, 4096) but "
                        "rank 2 issued all_reduce(sum, fp32, 4096) as its collective #11 (one of them skipped or "
                        "added a collective)"));
  all[16] = 42;  // rank 2's magic word
  EXPECT_THAT(detail::compare_fingerprints(all, 3, "tp"), HasSubstr("rank 2 issued something unreadable"));
}
