#include "megazero/trainer/iteration_log.h"

#include <cstdio>
#include <string>

#include "megazero/comm/consensus.h"
#include "megazero/core/error.h"
#include "megazero/kernels/gemm.h"
#include "megazero/kernels/linear_epilogues.h"

namespace megazero::train {

namespace {
std::string fixed(const char* format, double v) {
  char b[32];
  std::snprintf(b, sizeof b, format, v);
  return b;
}
template <typename Snapshot>
std::int64_t peak_bytes(const Snapshot& m, MemoryCategory c) {
  return m.by_category[static_cast<std::size_t>(c)].peak_bytes;
}
}  // namespace

void IterationLog::add(const StepResult& r, double iteration_s, double data_s, double step_s, double tokens) {
  ++iters_;
  time_ += iteration_s;
  data_ += data_s;
  step_ += step_s;
  tokens_ += tokens;
  fwd_ += r.forward_s;
  bwd_ += r.backward_s;
  opt_ += r.optimizer_s;
  comm_ += r.exposed_comm_s;
  waits_ += static_cast<double>(r.host_waits);
  issue_ += r.host_issue_s;
}

void IterationLog::report(const Report& at, const StepResult& r) {
  MZ_CHECK(iters_ > 0, "an iteration report with no iteration in its window");
  Communicator& world = *s_.world;
  Device& device = *s_.device;
  const TrainArgs& args = *s_.args;
  const double n = static_cast<double>(iters_);
  const double per_iter = time_ / n;
  const auto data = rank_spread(world, data_ / n), step = rank_spread(world, step_ / n);
  const auto fwd = rank_spread(world, fwd_ / n), bwd = rank_spread(world, bwd_ / n);
  const auto opt = rank_spread(world, opt_ / n), comm = rank_spread(world, comm_ / n);
  auto max_over = [&](double v) { return rank_spread(world, v).max; };
  const double host_waits = max_over(waits_ / n), host_issue = max_over(issue_ / n);
  const double peak_mib = max_over(static_cast<double>(device.memory().total_peak())) / 1048576.0;
  const auto mem = device.memory().snapshot();  // one snapshot for the peaks below
  const double ckpt_peak = max_over(static_cast<double>(peak_bytes(mem, MemoryCategory::ActivationCheckpoints)));
  const double heap_peak = max_over(static_cast<double>(mem.heap_peak_bytes));
  const double arena_misses = max_over(static_cast<double>(device.arena_stats().misses));
  const double act_peak = max_over(static_cast<double>(peak_bytes(mem, MemoryCategory::Activations)));
  const double host_ckpt_peak =
      max_over(static_cast<double>(peak_bytes(s_.host->memory().snapshot(), MemoryCategory::ActivationCheckpoints)));
  const double tokens_per_s = tokens_ / time_;
  const double tflops = s_.flops_per_token * tokens_per_s / world.size() / 1e12;
  const double mfu = s_.model_flops_per_token * tokens_per_s / world.size() / 1e12 / s_.peak_tflops;
  const double eta = per_iter * static_cast<double>(args.train_iters - at.iteration);
  if (s_.root) {
    std::printf(
        " iteration %8lld/%8lld | consumed samples %10lld | elapsed time per iteration (ms): %.1f | learning rate "
        "%.3E | global batch size %5lld | lm loss %.6E | loss scale %.1f | grad norm %.3f%s%s | number of skipped "
        "iterations %3lld | number of nan iterations %3lld | tokens/s %.0f | TFLOP/s per rank %.4f | MFU %.1f%% | "
        "peak memory (max over ranks) %.1f MiB%s | ETA %.0f s\n",
        static_cast<long long>(at.iteration), static_cast<long long>(args.train_iters),
        static_cast<long long>(at.consumed_samples), per_iter * 1e3, r.lr, static_cast<long long>(at.global_batch),
        r.loss, r.loss_scale, r.stats.grad_norm,
        args.log_params_norm ? (" | params norm " + fixed("%.3f", at.params_norm)).c_str() : "",
        args.log_num_zeros_in_grad ? (" | num zeros " + std::to_string(static_cast<long long>(at.zeros))).c_str() : "",
        static_cast<long long>(at.skipped), static_cast<long long>(at.nan_iterations), tokens_per_s, tflops,
        100.0 * mfu, peak_mib,
        args.device_arena ? (" | arena misses " + std::to_string(static_cast<long long>(arena_misses))).c_str() : "",
        eta);
    std::printf(
        "   timers (ms, min/max over ranks): data %.1f/%.1f | forward %.1f/%.1f | backward %.1f/%.1f | "
        "optimizer %.1f/%.1f | exposed DP comm %.1f/%.1f | step %.1f/%.1f (slowest: rank %d)%s\n",
        data.min * 1e3, data.max * 1e3, fwd.min * 1e3, fwd.max * 1e3, bwd.min * 1e3, bwd.max * 1e3, opt.min * 1e3,
        opt.max * 1e3, comm.min * 1e3, comm.max * 1e3, step.min * 1e3, step.max * 1e3, step.slowest,
        device.host_accessible() ? ""
        : device.kind() == DeviceKind::CUDA
            ? detail::concat(" | host waits per iteration ", host_waits, " | forward+backward issued in ",
                             fixed("%.1f", host_issue * 1e3), " ms of host time")
                  .c_str()
            : detail::concat(" | host waits per iteration ", host_waits, " (each drains the device's queue)").c_str());
    if (layers::forward_epilogues(args.model.gemm_epilogues) && !epilogues_reported_) {  // once: which GEMMs
      std::printf("   %s\n", kernels::linear_epilogues_report(device).c_str());          // cuBLASLt took
      epilogues_reported_ = true;
    }
    if (args.gemm_autotune && !autotune_reported_) {  // once: what timing the GEMMs' algorithms kept
      const std::string line = gemm_autotune_report();
      std::printf("   %s\n", line.empty() ? "GEMM autotune: no problem timed yet" : line.c_str());
      autotune_reported_ = !line.empty();
    }
    std::fflush(stdout);
    if (s_.metrics)
      *s_.metrics << "{\"iteration\": " << at.iteration << ", \"consumed_samples\": " << at.consumed_samples
                  << ", \"global_batch_size\": " << at.global_batch << ", \"loss\": " << r.loss << ", \"lr\": " << r.lr
                  << ", \"loss_scale\": " << r.loss_scale << ", \"grad_norm\": " << r.stats.grad_norm
                  << (args.log_params_norm ? detail::concat(", \"params_norm\": ", at.params_norm) : std::string())
                  << (args.log_num_zeros_in_grad ? detail::concat(", \"num_zeros\": ", at.zeros) : std::string())
                  << ", \"skipped\": " << at.skipped << ", \"nan_iterations\": " << at.nan_iterations
                  << ", \"ms_per_iteration\": " << per_iter * 1e3 << ", \"tokens_per_s\": " << tokens_per_s
                  << ", \"tflops_per_rank\": " << tflops << ", \"mfu\": " << mfu
                  << ", \"peak_memory_bytes\": " << peak_mib * 1048576.0 << ", \"forward_ms\": " << fwd.max * 1e3
                  << ", \"backward_ms\": " << bwd.max * 1e3 << ", \"optimizer_ms\": " << opt.max * 1e3
                  << ", \"exposed_dp_comm_ms\": " << comm.max * 1e3 << ", \"host_waits_per_iteration\": " << host_waits
                  << ", \"host_issue_forward_backward_ms\": " << host_issue * 1e3
                  << ", \"slowest_rank\": " << step.slowest << ", \"activations_peak_bytes\": " << act_peak
                  << ", \"checkpoints_peak_bytes\": " << ckpt_peak << ", \"first_fit_heap_peak_bytes\": " << heap_peak
                  << ", \"host_checkpoints_peak_bytes\": " << host_ckpt_peak << ", \"arena_misses\": " << arena_misses
                  << "}\n"
                  << std::flush;
  }
  if (s_.tensorboard) {  // Megatron's tags where it has them
    TensorBoardWriter& tb = *s_.tensorboard;
    const std::int64_t it = at.iteration;
    tb.add_scalar("lm loss", it, r.loss);
    tb.add_scalar("learning-rate", it, r.lr);
    tb.add_scalar("grad-norm", it, r.stats.grad_norm);
    if (args.log_params_norm) tb.add_scalar("params-norm", it, at.params_norm);
    if (args.log_num_zeros_in_grad) tb.add_scalar("num-zeros", it, static_cast<double>(at.zeros));
    tb.add_scalar("loss-scale", it, r.loss_scale);
    tb.add_scalar("batch-size", it, static_cast<double>(at.global_batch));
    tb.add_scalar("skipped-iterations", it, static_cast<double>(at.skipped));
    tb.add_scalar("nan-iterations", it, static_cast<double>(at.nan_iterations));
    tb.add_scalar("iteration-time-ms", it, per_iter * 1e3);
    tb.add_scalar("throughput/tokens-per-second", it, tokens_per_s);
    tb.add_scalar("throughput/tflops-per-rank", it, tflops);
    tb.add_scalar("throughput/mfu", it, mfu);
    tb.add_scalar("memory/peak-mib", it, peak_mib);
    tb.add_scalar("timers/data-ms", it, data.max * 1e3);
    tb.add_scalar("timers/forward-ms", it, fwd.max * 1e3);
    tb.add_scalar("timers/backward-ms", it, bwd.max * 1e3);
    tb.add_scalar("timers/optimizer-ms", it, opt.max * 1e3);
    tb.add_scalar("timers/exposed-dp-comm-ms", it, comm.max * 1e3);
    tb.flush();
  }
  iters_ = 0;
  time_ = data_ = step_ = fwd_ = bwd_ = opt_ = comm_ = waits_ = issue_ = tokens_ = 0;
}

}  // namespace megazero::train
