// The one way every megazero executable starts and ends, so that a bad flag or
// a crash ends the whole job the same way on every rank:
//  - AgreedConfigError (all ranks agreed): rank 0 prints "PROG: error: ...",
//    every rank finalises MPI and exits 2.
//  - ConfigError on some ranks only: that rank prints it with its rank and host,
//    then MPI_Abort(2) so no other rank waits forever.
//  - Anything else (InternalError, std::exception): as above with exit code 3.
//    That includes CollectiveMismatchError from --check-collectives.
//  - A collective stuck past --collective-timeout: the watchdog thread aborts
//    the job with exit code 4 (megazero/comm/fault_tolerance.h).
#pragma once

#include <functional>

namespace megazero {

// Runs body() between MPI initialisation and finalisation; returns its exit code.
// Registers the device backends this build has (CUDA) with core's device
// factory; run_main does it first, test mains call it themselves.
void register_device_backends();

int run_main(const char* program, int argc, char** argv, const std::function<int(int, char**)>& body);

}  // namespace megazero
