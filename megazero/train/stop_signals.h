// SIGTERM and SIGUSR1 (Slurm sends one before the time limit: `#SBATCH
// --signal=USR1@120`) ask a run to stop at the next step boundary, after
// saving a checkpoint. The handler only sets a flag; the ranks agree on it
// once per iteration (one tiny all-reduce), so they all stop after the same
// step even when the signal reached only some of them.
#pragma once

#include "megazero/comm/communicator.h"

namespace megazero::train {

// Installs the handlers (idempotent).
void install_stop_signal_handlers();
// While true (start-up: parsing, planning, building the model, loading a
// checkpoint — minutes for a large model), a stop signal ends the process at
// once with exit code 5 instead of waiting for a step boundary: there is no
// state worth saving yet. The driver turns it off before its first step.
void set_stop_is_immediate(bool immediate);
// Forgets a received signal (a process that trains again after a stop: tests).
void clear_stop_signal();
// The signal received by this process, or 0.
int stop_signal_received();
// Collective over `world`: whether any rank received a stop signal.
bool stop_requested_anywhere(Communicator& world);

}  // namespace megazero::train
