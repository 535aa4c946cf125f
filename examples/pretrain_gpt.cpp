// pretrain_gpt: trains a GPT with tensor parallelism x ZeRO data parallelism,
// as Megatron's pretrain_gpt.py does (same flag names). The trainer is the
// library's (megazero/trainer/trainer.h); this file parses, agrees and runs it.
//   mpiexec -n 4 pretrain_gpt --config configs/gpt_tiny.cfg --tensor-model-parallel-size 2 --zero-stage 2
#include <chrono>
#include <iostream>
#include <optional>

#include "megazero/comm/consensus.h"
#include "megazero/comm/mpi_communicator.h"
#include "megazero/plan/dry_run.h"
#include "megazero/runtime/entry.h"
#include "megazero/train/arguments.h"
#include "megazero/train/stop_signals.h"
#include "megazero/trainer/trainer.h"

using namespace megazero;
using namespace megazero::train;

namespace {

int run(int argc, char** argv) {
  // First: a stop signal (SIGTERM/SIGUSR1) during start-up ends the run at
  // once (nothing to save yet); from the first step on it saves and exits 5.
  install_stop_signal_handlers();
  set_stop_is_immediate(true);
  const auto t_process = std::chrono::steady_clock::now();  // --exit-duration-in-mins counts from here
  auto world_comm = MpiCommunicator::world();
  std::string help;
  // Rank 0 alone reads the --config file and hands its text to the others.
  const auto config_text = shared_config_text(*world_comm, argc, argv);
  auto parse = [&](const std::optional<std::string>& checkpoint_config) {
    return run_consistently(*world_comm, [&] {
      TrainArgs a = parse_train_args(argc, argv, &help, config_text, checkpoint_config);
      MZ_REQUIRE(a.world_size == 0 || a.dry_run, "--world-size plans a virtual world and needs --dry-run");
      MZ_REQUIRE(a.world_size == 0 || (a.plan_rank >= -1 && a.plan_rank < a.world_size), "--plan-rank ", a.plan_rank,
                 " is outside the world of ", a.world_size, " ranks");
      // With --use-checkpoint-args the model's flags may be missing until the
      // checkpoint's configuration supplies them: checked on the second parse.
      if (!a.help && !(a.use_checkpoint_args && !checkpoint_config)) {
        a.validate();
        a.apply_decrease_batch_size(a.world_size > 0 ? a.world_size : world_comm->size());
        a.validate_layout(a.world_size > 0 ? a.world_size : world_comm->size());
      }
      return a;
    });
  };
  TrainArgs args = parse(std::nullopt);
  // Megatron's --use-checkpoint-args: the model's flags from the checkpoint to load.
  if (args.use_checkpoint_args && !args.help) args = parse(checkpoint_args_config(args, *world_comm));
  // Ranks started with different flags (an MPMD launch, a per-node wrapper
  // gone wrong) would build different models and hang or train garbage: every
  // rank compares its resolved configuration with rank 0's before anything else.
  agree_on_error(*world_comm, config_difference(broadcast_string(*world_comm, args.fingerprint()), args.fingerprint(),
                                                world_comm->rank()));
  if (args.help) {
    if (world_comm->rank() == 0) std::cout << help << std::flush;
    return 0;
  }
  if (args.dry_run && args.world_size > 0) {  // a virtual world: validated above; plan one rank
    plan::plan_virtual_world(args, *world_comm);
    return 0;
  }
  Trainer trainer(std::move(args), std::move(world_comm), t_process);
  if (trainer.args().dry_run) return 0;  // the configuration is printed; nothing is built
  trainer.build();
  return trainer.train().exit_code;
}

}  // namespace

int main(int argc, char** argv) { return run_main("pretrain_gpt", argc, argv, run); }
