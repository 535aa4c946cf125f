#include "megazero/trainer/resume.h"

#include <cstdio>
#include <filesystem>

#include "megazero/comm/activity.h"
#include "megazero/comm/consensus.h"
#include "megazero/core/error.h"

namespace megazero::train {

std::string mib_per_s(double bytes, double seconds) {
  char b[64];
  std::snprintf(b, sizeof b, "%.1f MiB/s", seconds > 0 ? bytes / 1048576.0 / seconds : 0.0);
  return b;
}

std::string load_path(const TrainArgs& args) {
  if (args.ckpt_step < 0) return args.load;
  return (std::filesystem::path(args.load) / checkpoint::iteration_dir_name(args.ckpt_step)).string();
}

ResumePoint resume_from_checkpoint(TrainArgs& args, zero::ZeroEngine& engine, const checkpoint::Placement& where,
                                   optim::LossScaler& scaler, OptimizerSettings& opt, bool root) {
  ResumePoint at;
  Activity activity("loading a checkpoint");
  checkpoint::LoadOptions lo;
  lo.optimizer_state = !(args.finetune || args.no_load_optim);
  const std::string load = load_path(args);
  const auto res = checkpoint::load_checkpoint(load, engine, where, lo);
  if (root)
    for (const auto& r : res.rejected) std::printf(" WARNING: skipped unusable checkpoint %s\n", r.c_str());
  if (!res.loaded && (args.ckpt_step >= 0 || args.exit_on_missing_checkpoint))
    throw AgreedConfigError(
        detail::concat(args.ckpt_step >= 0 ? "--ckpt-step " + std::to_string(args.ckpt_step) : std::string("--load"),
                       ": no checkpoint ", load, args.ckpt_step >= 0 ? "" : " (none in it yet)",
                       args.exit_on_missing_checkpoint
                           ? "; --exit-on-missing-checkpoint stops here instead of starting from random weights"
                           : "",
                       "; check the path (the --save directory of a run, or one of its iter_NNNNNNN directories)"));
  if (!res.loaded && args.finetune)
    throw AgreedConfigError(detail::concat("--finetune: no checkpoint in '", args.load,
                                           "' to fine-tune from; --load names the pretrained run's --save "
                                           "directory or one of its iter_NNNNNNN directories"));
  if (res.loaded && args.finetune) {
    // A new run from these weights: iteration 0, the data from its start, a
    // fresh optimizer, loss scale and learning-rate schedule.
    if (root) {
      std::printf(
          " --finetune: loaded the weights of %s (iteration %lld, saved at TP %d x DP %d, ZeRO stage %d) in "
          "%.2f s; training starts at iteration 0 with a fresh optimizer\n",
          res.io.path.c_str(), static_cast<long long>(res.state.iteration), res.saved_tp, res.saved_dp, res.saved_stage,
          res.io.max_seconds);
      const std::string previous = args.save.empty() ? "" : checkpoint::find_latest(args.save);
      if (!previous.empty())
        std::printf(
            " WARNING: --save %s already holds %s; --finetune starts again from --load's weights at iteration 0 "
            "(to continue that run, load it without --finetune)\n",
            args.save.c_str(), previous.c_str());
    }
  } else if (res.loaded) {
    at.iteration = res.state.iteration;
    at.consumed_samples = res.state.consumed_samples;
    if (args.no_load_optim) {
      // Adam counts its steps from here; the loss scale starts afresh (it is
      // optimizer state in Megatron too), the count of skipped steps goes on.
      opt.optimizer_start_iteration = at.iteration;
      auto counts_only = res.state.loss_scaler;
      counts_only.dynamic = false;
      scaler.restore(counts_only);
    } else {
      opt.optimizer_start_iteration = res.state.optimizer_start_iteration;
      scaler.restore(res.state.loss_scaler);
    }
    if (root) {
      std::printf(
          " loaded checkpoint %s: iteration %lld, consumed samples %lld (saved at TP %d x DP %d, ZeRO stage "
          "%d) in %.2f s: %s per rank, %s total\n",
          res.io.path.c_str(), static_cast<long long>(at.iteration), static_cast<long long>(at.consumed_samples),
          res.saved_tp, res.saved_dp, res.saved_stage, res.io.max_seconds,
          mib_per_s(static_cast<double>(res.io.rank_bytes), res.io.seconds).c_str(),
          mib_per_s(static_cast<double>(res.io.total_bytes), res.io.max_seconds).c_str());
      if (res.state.seed != args.seed)
        std::printf(
            " WARNING: the checkpoint was trained with --seed %llu, this run uses %llu: data order and "
            "dropout change from here on\n",
            static_cast<unsigned long long>(res.state.seed), static_cast<unsigned long long>(args.seed));
    }
  } else if (root) {
    std::printf(" no checkpoint in %s yet: starting from iteration 0\n", args.load.c_str());
  }
  if (res.loaded) {  // every rank holds the same manifest: this check agrees
    std::string note;
    try {
      note = model_function_check(args, res.state.config, args.finetune);
    } catch (const ConfigError& e) {
      throw AgreedConfigError(e.what());
    }
    if (root && !note.empty()) std::printf(" note: %s\n", note.c_str());
  }
  std::fflush(stdout);
  if (res.loaded && !args.finetune && !args.skip_train) {  // every rank holds the same manifest: these checks agree
    if (at.iteration > args.train_iters)
      throw AgreedConfigError(detail::concat(
          "--train-iters ", args.train_iters, " but the checkpoint ", res.io.path, " is at iteration ", at.iteration,
          ": nothing to train; --train-iters counts from the start of training (as Megatron's), so raise it above ",
          at.iteration));
    std::string note;
    try {
      note = reconcile_lr_schedule(args, res.state.config, at.iteration);
    } catch (const ConfigError& e) {
      throw AgreedConfigError(e.what());
    }
    opt.lr = args.lr;  // the schedules as reconciled
    opt.adam = args.adam;
    if (root && !note.empty()) std::printf(" note: %s\n", note.c_str());
    if (const std::string loss = loss_definition_note(args, res.state.config); root && !loss.empty())
      std::printf(" note: %s\n", loss.c_str());
    if (root && args.no_load_optim)
      std::printf(" --no-load-optim: Adam's moments start at zero and count their steps from iteration %lld%s\n",
                  static_cast<long long>(at.iteration), args.fp16 ? "; the loss scale from --initial-loss-scale" : "");
    if (root && at.iteration == args.train_iters)
      std::printf(" the checkpoint is at --train-iters %lld already: nothing to train\n",
                  static_cast<long long>(args.train_iters));
  }
  return at;
}

}  // namespace megazero::train
