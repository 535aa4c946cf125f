// GoogleTest main for every megazero test binary, single- or multi-rank.
// MPI is initialised around RUN_ALL_TESTS; a failure on any rank makes every rank
// exit non-zero (the result is all-reduced), so CTest sees it however mpiexec
// reports exit codes. Ranks other than 0 print only their failures.
//
// Multi-rank binaries run under the collective watchdog (fault_tolerance.h):
// a test whose ranks diverge — one rank's ASSERT leaves a test early while its
// peers wait in a collective — would otherwise hang, silent, until CTest's
// timeout; the watchdog ends the job after MEGAZERO_TEST_COLLECTIVE_TIMEOUT
// seconds (default 120: the longest multi-rank test binary runs ~22 s in all
// on the 2-core CI machine; 0: off) with one line naming the rank and the
// stuck collective, exit code 4.
#include <gtest/gtest.h>
#include <mpi.h>

#include "megazero/comm/fault_tolerance.h"
#include "megazero/runtime/entry.h"

#include <cstdio>
#include <cstdlib>

namespace {

// Prints failures of a non-zero rank with the rank in front, and nothing else.
class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  megazero::register_device_backends();
  int provided = 0;
  // MULTIPLE: each communicator runs its collectives on its own worker thread.
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  testing::InitGoogleTest(&argc, argv);
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) {
    const char* t = std::getenv("MEGAZERO_TEST_COLLECTIVE_TIMEOUT");
    megazero::set_collective_timeout(t && *t ? std::atof(t) : 120.0);
  }
  if (rank != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&local_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed;
}
