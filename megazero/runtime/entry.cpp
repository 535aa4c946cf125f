#include "megazero/runtime/entry.h"

#include <mpi.h>

#include <cstdio>

#include "megazero/comm/consensus.h"
#include "megazero/comm/fault_tolerance.h"
#include "megazero/comm/mpi_communicator.h"
#include "megazero/core/error.h"
#ifdef MEGAZERO_WITH_CUDA
#include "megazero/cuda/cuda_device.h"
#endif
#include "megazero/runtime/cli.h"

namespace megazero {
namespace {

int world_rank() {
  int init = 0, fin = 0, rank = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

[[noreturn]] void abort_job(const char* program, const char* kind, const char* what, int code) {
  std::fprintf(stderr, "%s: %s on rank %d (host %s): %s\n", program, kind, world_rank(),
               MpiCommunicator::host_name().c_str(), what);
  std::fflush(stderr);
  abort_world(code);
}

}  // namespace

void register_device_backends() {
#ifdef MEGAZERO_WITH_CUDA
  register_cuda_backend();
#endif
}

int run_main(const char* program, int argc, char** argv, const std::function<int(int, char**)>& body) {
  register_device_backends();
  std::unique_ptr<MpiEnvironment> env;
  try {
    env = std::make_unique<MpiEnvironment>(&argc, &argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return kExitConfigError;
  }
  int code = 0;
  try {
    code = body(argc, argv);
  } catch (const HelpRequested& h) {
    if (world_rank() == 0) std::fputs(h.text.c_str(), stdout);
    code = 0;
  } catch (const AgreedConfigError& e) {
    if (world_rank() == 0) std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    code = kExitConfigError;
  } catch (const ConfigError& e) {
    abort_job(program, "error", e.what(), kExitConfigError);
  } catch (const std::exception& e) {
    abort_job(program, "internal error", e.what(), kExitInternalError);
  }
  std::fflush(stdout);
  return code;
}

}  // namespace megazero
