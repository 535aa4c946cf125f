// Faults and hangs: the switches a driver wires to its flags.
//
//  --collective-timeout SECONDS  -> set_collective_timeout(SECONDS)
//      A collective (on any communicator, any backend) that has not completed
//      SECONDS after it was issued makes the collective watchdog print one line
//      naming the rank, host, pid, the collective and the activity label
//      (activity.h), and end the whole job with exit code
//      kExitCollectiveTimeout (4). 0 turns it off. Recommended default: 600 s
//      (NCCL's usual timeout): far above any legitimate wait (rank skew, a
//      rank-0-only checkpoint save or dataset index build), yet a dead job
//      frees its nodes in minutes instead of at the Slurm time limit.
//  --check-collectives           -> set_check_collectives_default(true)
//      Every communicator created afterwards (including splits) cross-checks
//      each collective's fingerprint with its peers before issuing it, and
//      throws CollectiveMismatchError on every rank at the first divergence.
//      A debug mode: it costs one small all-gather per collective and makes
//      every collective wait for the ones before it (see docs/COLLECTIVES.md).
//
// Call both early in main, before the communicators are made.
#pragma once

#include <functional>
#include <string>

#include "megazero/comm/activity.h"
#include "megazero/core/error.h"

namespace megazero {

// seconds >= 0 (ConfigError otherwise); 0 = off. Starts the watchdog thread
// on first use. Process-wide; may be changed at any time.
void set_collective_timeout(double seconds);
double collective_timeout();

// Default for communicators created afterwards; Communicator::
// enable_collective_checking overrides it per communicator.
void set_check_collectives_default(bool on);
bool check_collectives_default();

// Raised on every rank of a communicator whose ranks issued different
// collectives (a megazero bug: exit code 3 through run_main).
class CollectiveMismatchError : public InternalError {
 public:
  using InternalError::InternalError;
};

// Ends the whole job with exit code `code`, from any thread, even while others
// are blocked inside MPI: MPI_Abort after a 0.2 s pause, because MPICH's hydra
// drops output still in flight when it kills the job (measured: the last
// lines a rank printed were lost in ~1 run in 10) and the report is the point.
// std::_Exit(code) where MPI is not running. Print and fflush first.
[[noreturn]] void abort_world(int code);

// Testing hook: replaces "print the report and MPI_Abort" by a call of
// handler(report line); each stuck operation is then reported once. nullptr
// restores the default. The handler runs on the watchdog thread under its
// lock: it must not call the functions of this header.
void set_watchdog_handler(std::function<void(const std::string&)> handler);

}  // namespace megazero
