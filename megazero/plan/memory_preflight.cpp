#include "megazero/plan/memory_preflight.h"

#include <cstdio>
#include <functional>
#include <vector>

#include "megazero/core/error.h"

namespace megazero::plan {
namespace {

std::string gib(std::int64_t bytes) {  // GiB, or MiB below one GiB
  char b[32];
  const double v = static_cast<double>(bytes);
  if (v >= 1073741824.0)
    std::snprintf(b, sizeof b, "%.2f GiB", v / 1073741824.0);
  else
    std::snprintf(b, sizeof b, "%.1f MiB", v / 1048576.0);
  return b;
}

std::int64_t needed_by(const train::TrainArgs& args, const RankMemoryPlan& p) {
  // With --device-arena the run reserves the first-fit peak as one block; without, the pool holds the live peak.
  return args.device_arena ? p.step_heap_peak : p.step_total_peak;
}

// Full recompute, each layer from its own input, of the first n layers (0: all).
void recompute_layers(train::TrainArgs& a, std::int64_t n) {
  a.model.recompute_activations = true;
  a.model.recompute_core_attention = false;
  a.model.recompute_num_layers = n;
  a.model.recompute_chunk = 1;
}

// Full recompute fits (needing `need`): the fewest of the first layers that
// still fit when only they recompute (--recompute-method block), found by
// bisection (the peak falls as more layers recompute), so the advice costs
// the least recompute. Returns the flags; `need` becomes their plan's.
std::string fewest_recomputed_layers(const train::TrainArgs& args, int world_size, int rank, DeviceKind kernels,
                                     std::int64_t free_bytes, std::int64_t& need) {
  const std::int64_t layers = args.model.num_layers;
  auto with = [&](std::int64_t n) {
    train::TrainArgs a = args;
    recompute_layers(a, n);
    return needed_by(a, plan_rank_memory(a, world_size, rank, kernels));
  };
  // lo does not fit (the user's own choice: none, or the first N), hi does (every layer).
  std::int64_t lo = args.model.recompute_activations ? args.model.recompute_num_layers : 0, hi = layers;
  std::int64_t hi_need = need;
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    const std::int64_t n = with(mid);
    if (n <= free_bytes)
      hi = mid, hi_need = n;
    else
      lo = mid;
  }
  if (hi == layers) return "--recompute-activations";
  need = hi_need;
  return "--recompute-activations --recompute-method block --recompute-num-layers " + std::to_string(hi);
}

}  // namespace

PreflightVerdict memory_preflight(const train::TrainArgs& args, int world_size, int rank, DeviceKind kernels,
                                  const RankMemoryPlan& plan, std::int64_t free_bytes) {
  PreflightVerdict v;
  v.needed = needed_by(args, plan);
  v.available = free_bytes;
  v.fits = v.needed <= free_bytes;
  if (v.fits) return v;

  // One flag at a time, each as the user would add it to the command line.
  struct Change {
    std::string flags;
    std::function<void(train::TrainArgs&)> apply;
  };
  std::vector<Change> changes;
  for (int s = args.zero.stage + 1; s <= 3; ++s)
    changes.push_back({"--zero-stage " + std::to_string(s), [s](train::TrainArgs& a) { a.zero.stage = s; }});
  // ZeRO-Offload: the optimizer's 12 bytes a parameter to host memory (what a
  // DeepSpeed user reaches for; it costs PCIe and host time, not recompute).
  if (!args.zero.offload_optimizer && !args.zero.overlap_optimizer)
    changes.push_back({"--optimizer-cpu-offload", [](train::TrainArgs& a) { a.zero.offload_optimizer = true; }});
  const bool unfused = !args.model.fused_attention() && !args.model.cudnn_attention();
  if (!args.model.recompute_activations && !args.model.recompute_core_attention && unfused)
    changes.push_back(
        {"--recompute-granularity selective", [](train::TrainArgs& a) { a.model.recompute_core_attention = true; }});
  const bool all_recompute = args.model.recompute_activations && args.model.recompute_num_layers == 0;
  if (!all_recompute)
    changes.push_back({"--recompute-activations", [](train::TrainArgs& a) { recompute_layers(a, 0); }});
  const int dp = world_size / args.parallel.tensor_model_parallel_size;
  const std::int64_t global = args.global_batch_size > 0 ? args.global_batch_size : args.micro_batch_size * dp;
  for (std::int64_t mb = args.micro_batch_size / 2; mb >= 1; mb /= 2)
    if (global % (mb * dp) == 0)
      changes.push_back({"--micro-batch-size " + std::to_string(mb) + " --global-batch-size " + std::to_string(global),
                         [mb, global](train::TrainArgs& a) {
                           a.micro_batch_size = mb;
                           a.global_batch_size = global;
                         }});
  std::string fitting;
  for (const auto& c : changes) {
    train::TrainArgs a = args;
    c.apply(a);
    std::int64_t need = needed_by(a, plan_rank_memory(a, world_size, rank, kernels));
    std::string flags = c.flags;
    if (need <= free_bytes && c.flags == "--recompute-activations")
      flags = fewest_recomputed_layers(args, world_size, rank, kernels, free_bytes, need);
    if (need <= free_bytes) {
      fitting += (fitting.empty() ? "" : ", ") + flags + " (" + gib(need) + ")";
      if (c.flags.rfind("--micro-batch-size", 0) == 0) break;  // the largest micro-batch that fits is enough
    }
  }
  if (!fitting.empty()) {
    v.advice = "each of these fits alone: " + fitting;
    return v;
  }
  // All at once: recompute, micro-batch 1 and the stage that needs least
  // (stage 3 is not always it: a small model's constant buffers can outweigh
  // what partitioning saves).
  std::int64_t least = -1;
  int best_stage = args.zero.stage;
  for (int s = args.zero.stage; s <= 3; ++s) {
    train::TrainArgs a = args;
    a.zero.stage = s;
    recompute_layers(a, 0);
    a.micro_batch_size = 1;
    a.global_batch_size = global;
    const std::int64_t need = needed_by(a, plan_rank_memory(a, world_size, rank, kernels));
    if (least < 0 || need < least) {
      least = need;
      best_stage = s;
    }
  }
  const std::string combined = "--zero-stage " + std::to_string(best_stage) +
                               " --recompute-activations --micro-batch-size 1 --global-batch-size " +
                               std::to_string(global);
  v.advice = least <= free_bytes ? combined + " together fit (" + gib(least) + ")"
                                 : "even " + combined + " needs " + gib(least) +
                                       ": add ranks (a larger data-parallel group divides the model states) or raise "
                                       "--tensor-model-parallel-size, or use a smaller model";
  return v;
}

std::string preflight_error(const PreflightVerdict& v, const std::string& device_name, int rank,
                            std::int64_t total_bytes) {
  return detail::concat("memory pre-flight: rank ", rank, "'s plan needs ", gib(v.needed), " (", v.needed,
                        " bytes) at its peak but ", device_name, " has ", gib(v.available), " free of ",
                        gib(total_bytes), "; ", v.advice,
                        " (pretrain_gpt --dry-run --world-size N --plan-rank R prints the whole plan)");
}

int ranks_sharing_gpu(int local_ranks, int local_index, int gpus) {
  MZ_CHECK(gpus > 0 && local_ranks > 0 && local_index >= 0 && local_index < local_ranks, "ranks_sharing_gpu(",
           local_ranks, ", ", local_index, ", ", gpus, ")");
  const int gpu = local_index % gpus;  // local ranks gpu, gpu + gpus, ... (below local_ranks) share it
  return (local_ranks - gpu + gpus - 1) / gpus;
}

}  // namespace megazero::plan
