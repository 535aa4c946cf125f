// pretrain_gpt --dry-run --world-size N: the plan of one rank (or of every
// rank) of a virtual world of N ranks — memory from the real model and ZeRO
// engine on the meta device, optionally the step time on a hardware profile —
// printed as a table and JSON (and written with --plan-json). No training
// state is built; the launched job only needs one process.
#pragma once

#include "megazero/comm/communicator.h"
#include "megazero/train/arguments.h"

namespace megazero::plan {

// Collective over `world` (every rank validates the hardware profile; rank 0
// plans and prints). Errors are ConfigErrors agreed by every rank.
void plan_virtual_world(train::TrainArgs& args, Communicator& world);

}  // namespace megazero::plan
