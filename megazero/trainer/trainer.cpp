#include "megazero/kernels/cpu_threads.h"
#include "megazero/kernels/openblas_core.h"
#include "megazero/trainer/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <utility>

#include "layers/gpt_model.h"
#include "megazero/checkpoint/checkpoint.h"
#include "megazero/comm/activity.h"
#include "megazero/comm/consensus.h"
#include "megazero/comm/fault_tolerance.h"
#include "megazero/comm/mpi_communicator.h"
#include "megazero/kernels/cudnn_attention.h"
#include "megazero/kernels/conventions.h"
#include "megazero/kernels/gemm.h"
#include "megazero/kernels/gpu_scratch.h"
#ifdef MEGAZERO_WITH_CUDA
#include "megazero/comm/nccl_communicator.h"
#endif
#include "megazero/plan/memory_plan.h"
#include "megazero/plan/memory_preflight.h"
#include "megazero/train/documents.h"
#include "megazero/train/loss_mask.h"
#include "megazero/train/sample_source.h"
#include "megazero/train/stop_signals.h"
#include "megazero/train/tensorboard_writer.h"
#include "megazero/train/train_step.h"
#include "megazero/trainer/iteration_log.h"
#include "megazero/trainer/peak_flops.h"
#include "megazero/trainer/kernel_profile.h"
#include "megazero/trainer/resume.h"
#include "megazero/zero/partitioned_activations.h"
#include "megazero/zero/zero_engine.h"

namespace megazero::train {
namespace {
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double max_over(Communicator& world, double v) { return rank_spread(world, v).max; }

// Test fault injection: MEGAZERO_TEST_KILL_IN_SAVE=RANK[@ITERATION] makes that
// world rank die with its shard half written (during the save of ITERATION, or
// of any iteration); MEGAZERO_TEST_NAN_LOSS_AT=ITERATION reports a NaN loss
// there, as a diverged run would.
int kill_in_save_rank(std::int64_t iteration) {
  const char* v = std::getenv("MEGAZERO_TEST_KILL_IN_SAVE");
  if (!v) return -1;
  const std::string s(v);
  const auto at = s.find('@');
  if (at != std::string::npos && std::stoll(s.substr(at + 1)) != iteration) return -1;
  return std::stoi(s.substr(0, at));
}
std::int64_t nan_loss_at() {
  const char* v = std::getenv("MEGAZERO_TEST_NAN_LOSS_AT");
  return v ? std::stoll(v) : -1;
}

}  // namespace

// Everything a run holds, under the names the steps below use.
struct Trainer::Impl {
  TrainArgs args;
  Clock::time_point t_process;
  std::unique_ptr<parallel_state::ProcessGroups> groups;
  std::unique_ptr<SampleSource> source;
  bool root = false;
  int dp = 1, local_ranks = 1, local_index = 0;
  std::int64_t global = 0, accum = 1, S = 0;  // the full global batch (after any ramp-up), its micro-batches per rank
  BatchSchedule batches;                      // each iteration's global batch (--rampup-batch-size)
  std::string host_name;
  std::shared_ptr<Device> device, host;
  bool on_gpu = false;
  layers::ParameterSet params;
  std::unique_ptr<layers::GPTModel> model_;
  std::unique_ptr<zero::ZeroEngine> engine_;
  std::unique_ptr<zero::PartitionedCheckpoints> checkpoints;
  OptimizerSettings opt;
  std::unique_ptr<optim::LossScaler> scaler_;
  checkpoint::Placement placement;
  std::int64_t start_iter = 0, consumed_at_start = 0, last_saved = -1;
  // consumed_[k]: the samples consumed before iteration start_iter + k.
  std::vector<std::int64_t> consumed_;
  std::int64_t consumed_before(std::int64_t it);
  std::int64_t batch_of(std::int64_t it) { return batches.batch_at(consumed_before(it)); }
  std::ofstream metrics;
  std::optional<TensorBoardWriter> tensorboard;  // rank 0 writes, as Megatron's
  std::unique_ptr<IterationProfile> profile;     // --profile
  // FLOPs a token: with what the recompute adds (the TFLOP/s the paper
  // reports) and without it (the model's FLOPs: MFU, as the planner's).
  double peak = 0, flops_per_token = 0, model_flops_per_token = 0;

  void setup(std::unique_ptr<Communicator> world_comm);
  void build();
  void save(std::int64_t iteration);
  // This rank's micro-batches of iteration `it`, tokens on the host
  // (host_micro_batches, one rank's bad data an error on every rank alike),
  // with --eod-mask-loss's weights (train/loss_mask.h; with
  // --calculate-per-token-loss an all-reduce over DP, hence outside
  // run_consistently): host_batch. upload brings them where the model runs.
  std::vector<MicroBatch> host_micro_batches(std::int64_t it, Split split);
  std::vector<MicroBatch> host_batch(std::int64_t it, Split split) {
    auto mbs = run_consistently(groups->world(), [&] { return host_micro_batches(it, split); });
    if (args.eod_mask_loss)
      weigh_micro_batches(mbs, {args.eod_token_id, args.per_token_loss}, groups->dp(),
                          kernels::row_stat_dtype(args.dtype()));
    mark_documents(mbs, {args.eod_token_id, args.reset_position_ids, args.reset_attention_mask});
    return mbs;
  }
  void upload(std::vector<MicroBatch>& mbs);
  // The mean loss over --eval-iters batches of `split` (validation or test).
  double evaluate(std::int64_t at, Split split = Split::Valid);
  // The end of a run (and --skip-train): validation, then test where --split
  // gave it documents (as Megatron's end of training).
  void evaluate_at_end(std::int64_t at, TrainResult& result);
  TrainResult train();
  void scalar(const std::string& tag, std::int64_t step, double v) {
    if (tensorboard) tensorboard->add_scalar(tag, step, v);
  }
};

void Trainer::Impl::setup(std::unique_ptr<Communicator> world_comm) {
  set_collective_timeout(args.collective_timeout);
  set_check_collectives_default(args.check_collectives);
  world_comm->enable_collective_checking(args.check_collectives);
  groups = parallel_state::ProcessGroups::create(std::move(world_comm), args.parallel);
  Communicator& world = groups->world();
  root = world.rank() == 0;
  dp = groups->dp_size();
  // A misspelt MEGAZERO_COLUMN_FINISH is refused here on any device (read once
  // and kept: the CUDA launchers ask the kept setting at each column sum).
  run_consistently(world, [] { kernels::gpu_scratch::read_column_finish_setting(); });
  source = run_consistently(world, [&] { return make_sample_source(args); });
  args.model.vocab_size = source->vocab_size();
  run_consistently(world, [&] { args.model.validate(groups->tp_size()); });
  global = args.global_batch_size > 0 ? args.global_batch_size : args.micro_batch_size * dp;
  accum = global / (args.micro_batch_size * dp);
  batches = args.batch_schedule(dp);
  S = args.model.seq_length;
  // This rank's place among the ranks on its host (the real machine, whatever
  // --ranks-per-node says): it shares the host's cores and picks its GPU by it.
  const auto& hosts = groups->hosts();
  host_name = hosts[static_cast<std::size_t>(world.rank())];
  local_ranks = static_cast<int>(std::count(hosts.begin(), hosts.end(), host_name));
  local_index = static_cast<int>(std::count(hosts.begin(), hosts.begin() + world.rank(), host_name));
  // Math threads: the environment's count, else this host's cores shared by
  // the ranks on it (every rank taking all cores makes two ranks on two
  // cores several times slower than one thread each).
  std::string threads_from = cpu_math_threads_variable();
  if (threads_from.empty()) {
    set_cpu_math_threads(std::max(1, cpu_cores() / local_ranks));
    threads_from =
        std::to_string(cpu_cores()) + " cores shared by " + std::to_string(local_ranks) + " ranks on this host";
  }
  if (root) {
    std::cout << "math threads per rank: " << cpu_math_threads() << " (" << threads_from
              << "; set MEGAZERO_NUM_THREADS to override)\n";
    for (const auto& note : args.notes) std::cout << "note: " << note << "\n";
    std::cout << groups->describe() << "---- resolved configuration ----\n"
              << args.to_config() << "---- data: " << source->describe() << "\n"
              << std::flush;
  }
}

void Trainer::Impl::build() {
  Communicator& world = groups->world();
  // --device cuda: the GPU of this rank's place on its host. cpu-isolated: the
  // CPU kernels over memory host code cannot touch (a GPU's rules, for tests).
  device = run_consistently(world, [&] {
    if (args.device != "cuda") return make_device(args.device);
    const int gpus = cuda_visible_devices();
    MZ_REQUIRE(gpus > 0, "--device cuda: no GPU is visible on ", host_name,
               " (check CUDA_VISIBLE_DEVICES and the driver, or use --device cpu)");
    return make_device(DeviceKind::CUDA, local_index % gpus);
  });
  on_gpu = device->kind() == DeviceKind::CUDA;
  set_gemm_autotune(args.gemm_autotune);  // process-wide; validate() allowed it on cuda only
  // This rank's plan (the model, the engine and two iterations on the meta
  // device, in the order this run allocates), made once if the pre-flight or
  // the arena needs it.
  std::optional<plan::RankMemoryPlan> rank_plan;
  auto my_plan = [&]() -> const plan::RankMemoryPlan& {
    if (!rank_plan) {
      Activity activity("planning this rank's memory");
      rank_plan = plan::plan_rank_memory(args, world.size(), world.rank(), device->kind());
    }
    return *rank_plan;
  };
  // The memory pre-flight (a device with a capacity: a GPU): a run that cannot
  // fit is refused before it allocates, on every rank alike, saying what would fit.
  // Host memory is shared by the ranks on the host, a GPU by the ranks mapped
  // to it: each gets its share of what is available.
  auto device_memory = device->memory_info();
  const bool shared_host = device_memory && device->host_accessible();
  const int sharers = shared_host ? local_ranks
                      : on_gpu    ? plan::ranks_sharing_gpu(local_ranks, local_index, cuda_visible_devices())
                                  : 1;
  if (device_memory) device_memory->free /= sharers;
  // ZeRO-Offload keeps its state in host memory (page-locked on a GPU), which
  // the ranks of this host share: each needs its plan's bytes of its share.
  // Where the device is host memory itself, they come out of the device's share.
  auto mib = [](std::int64_t bytes) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f MiB", static_cast<double>(bytes) / 1048576.0);
    return std::string(b);
  };
  std::int64_t offloaded_bytes = 0;
  if (args.zero.offload_optimizer) {
    const auto host_memory = make_device(DeviceKind::CPU)->memory_info();
    run_consistently(world, [&] {
      offloaded_bytes = my_plan().host_offload_bytes;
      if (shared_host || !host_memory) return;
      const std::int64_t share = host_memory->free / local_ranks;
      MZ_REQUIRE(offloaded_bytes <= share, "--optimizer-cpu-offload: rank ", world.rank(), " keeps ",
                 mib(offloaded_bytes), " of optimizer state in host memory, but ", host_name, " has ", mib(share),
                 " available for each of its ", local_ranks,
                 " ranks: leave --optimizer-cpu-offload out, or spread the run over more nodes (a larger "
                 "data-parallel group divides the state)");
    });
    if (shared_host) device_memory->free = std::max<std::int64_t>(0, device_memory->free - offloaded_bytes);
  }
  const std::string memory_name =
      shared_host
          ? detail::concat("this rank's share of the host's available memory (1/", local_ranks, ")",
                           offloaded_bytes > 0
                               ? " less the " + mib(offloaded_bytes) + " of optimizer state ZeRO-Offload keeps there"
                               : "")
      : sharers > 1
          ? detail::concat("this rank's share of ", device->name(), " (1/", sharers, ": ", sharers, " ranks use it)")
          : device->name();
  if (device_memory) {
    const auto verdict = run_consistently(world, [&] {
      const auto v =
          plan::memory_preflight(args, world.size(), world.rank(), device->kind(), my_plan(), device_memory->free);
      MZ_REQUIRE(v.fits, plan::preflight_error(v, memory_name, world.rank(), device_memory->total));
      return v;
    });
    const double most = max_over(world, static_cast<double>(verdict.needed));
    const double least_free = -max_over(world, -static_cast<double>(verdict.available));
    if (root)
      std::printf(
          "memory pre-flight: planned peak %.1f MiB per rank (the largest%s), %.1f MiB free %s "
          "(the least over ranks%s)\n",
          most / 1048576.0, args.device_arena ? ", the arena's first-fit peak" : "", least_free / 1048576.0,
          shared_host   ? "per rank in host memory"
          : sharers > 1 ? "per rank on the shared device"
                        : "on the device",
          shared_host ? "" : "; the CUDA context and NCCL's buffers come out of it");
  }
  if (args.device_arena) {
    // The arena's size: the plan's first-fit heap peak, which the tracker's model of this device reproduces.
    Activity activity("planning the device arena");
    device->reserve_arena(static_cast<std::size_t>(my_plan().step_heap_peak));
    const double most = max_over(world, static_cast<double>(my_plan().step_heap_peak));
    if (root)
      std::printf("device arena (MD): %.1f MiB reserved per rank (the largest; each rank its planned first-fit peak)\n",
                  most / 1048576.0);
  }
  // --distributed-backend: the TP and DP groups on NCCL when asked, or by
  // default when every rank has a GPU of its own (NCCL refuses two ranks on
  // one GPU); otherwise MPI, staging GPU tensors through host memory.
  const int gpus = on_gpu ? cuda_visible_devices() : 0;
  const bool shares_gpu = on_gpu && local_ranks > gpus;
  const bool any_shares = max_over(world, shares_gpu ? 1.0 : 0.0) > 0;
  run_consistently(world, [&] {
    MZ_REQUIRE(args.distributed_backend != "nccl" || !any_shares, "--distributed-backend nccl: ranks share a GPU ", "(",
               local_ranks, " ranks on ", host_name, " for ", gpus,
               " visible GPUs) and NCCL takes one GPU per rank; start fewer ranks per node or use "
               "--distributed-backend mpi");
  });
  const bool use_shm = args.distributed_backend == "shm";
  int shm_groups = 0, shm_device_groups = 0;  // of two or more ranks; those with device slots
  if (use_shm) {
    run_consistently(world, [&] {
      MZ_REQUIRE(local_ranks == world.size(), "--distributed-backend shm: the job's ", world.size(),
                 " ranks run on more than one machine (", local_ranks, " on ", host_name,
                 "); shared memory joins the ranks of one machine; use --distributed-backend mpi, or nccl with a GPU "
                 "per rank");
    });
    // A refusal (MEGAZERO_SHM_SLOT_BYTES, /dev/shm too small) comes from
    // every rank of a group alike; agreed on the world, it is printed once.
    run_consistently(world, [&] {
      groups->use_device_groups([&](Communicator& bootstrap, const std::string& name) -> std::unique_ptr<Communicator> {
        auto* mpi = dynamic_cast<MpiCommunicator*>(&bootstrap);
        MZ_CHECK(mpi, "--distributed-backend shm: the groups' bootstrap is not MPI");
        auto comm = MpiCommunicator::with_shared_memory(*mpi, name, device);
        shm_groups += comm->size() > 1 ? 1 : 0;
        shm_device_groups += comm->has_device_slots() ? 1 : 0;
        return comm;
      });
    });
  }
  const bool use_nccl = on_gpu && !any_shares && args.distributed_backend != "mpi" && !use_shm;
  if (use_nccl) {
#ifdef MEGAZERO_WITH_CUDA
    auto gpu = std::dynamic_pointer_cast<CudaDevice>(device);
    MZ_CHECK(gpu, "--device cuda made no CudaDevice");
    groups->use_device_groups([&](Communicator& bootstrap, const std::string& name) -> std::unique_ptr<Communicator> {
      return std::make_unique<NcclCommunicator>(bootstrap, gpu, name);
    });
#endif
  }
  if (root)
    std::printf("collectives: tp %s, dp %s, world %s%s\n", std::string(groups->tp().backend()).c_str(),
                std::string(groups->dp().backend()).c_str(), std::string(world.backend()).c_str(),
                !device->host_accessible() && use_shm && shm_groups > 0 && shm_device_groups == shm_groups
                    ? " (device tensors through shared device memory)"
                : !device->host_accessible() && use_shm && shm_groups > 0
                    ? " (device tensors through shared host memory)"
                : on_gpu && !use_nccl && any_shares
                    ? " (GPU tensors staged through host memory; for ranks sharing a GPU, --distributed-backend "
                      "shm moves them without MPI's messages)"
                : on_gpu && !use_nccl ? " (GPU tensors staged through host memory)"
                                      : "");
  model_ =
      std::make_unique<layers::GPTModel>(args.model, layers::TpContext{&groups->tp(), device, args.dtype()}, params);
  auto& model = *model_;
  const zero::ZeroConfig zc = args.engine_config();
  // Host memory for Pa+cpu and ZeRO-Offload (page-locked on a GPU), with its own counters.
  host = device->host_device();
  engine_ = std::make_unique<zero::ZeroEngine>(params, groups->dp(), groups->tp(), device, zc, host);
  auto& engine = *engine_;
  engine.initialize(args.seed);
  // The engine owns the parameters' storage from here on, not only inside a
  // training step: an evaluation before any step (--skip-train, a resume at
  // --train-iters) gathers stage 3's groups as the step's forward does.
  model.set_param_hooks(&engine);
  if (root && engine.offload()) std::printf("%s\n", engine.offload()->describe().c_str());
  // ZeRO-R: where recomputing layers keep their inputs (Pa, Pa+cpu, MD).
  if (args.zero_r.any()) {
    checkpoints = std::make_unique<zero::PartitionedCheckpoints>(args.zero_r, groups->tp(), device, host,
                                                                 static_cast<int>(args.model.checkpoint_slots()));
    model.set_checkpoint_store(checkpoints.get());
    checkpoints->reserve(args.checkpoint_elements(), args.dtype());
  }
  if (on_gpu && args.model.cudnn_attention()) {
    // cuDNN's plans for this run's attention shapes, built before the first
    // step: a graph cuDNN cannot run is refused here, on every rank alike.
    Activity activity("building cuDNN attention plans");
    layers::StepInfo shape;
    shape.micro_batch = args.micro_batch_size;
    shape.seq = S;
    if (args.reset_attention_mask)  // the plans with the documents' bias (only its shape is read)
      shape.key_starts = Tensor::empty(make_meta_device(DeviceKind::CUDA), {args.micro_batch_size * S}, DType::I64,
                                       MemoryCategory::Other);
    const auto started = std::chrono::steady_clock::now();
    std::vector<std::string> lines;
    run_consistently(world, [&] {
      lines.push_back(model.prepare_kernels(shape, args.model.attention_dropout));
      if (args.eval_iters > 0 && args.model.attention_dropout > 0) lines.push_back(model.prepare_kernels(shape, 0.0));
    });
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    if (root)
      for (const std::string& line : lines) std::printf("%s [%.0f ms for all plans]\n", line.c_str(), ms);
  }
  if (root) {
    // Megatron prints the parameter count; this also names the model's
    // kernel choices, so a log says which path a run took.
    std::int64_t total = 0;
    for (const auto* p : params.all()) total += shape_numel(p->global_shape);
    const auto& m = args.model;
    std::ostringstream base;
    base << m.rotary_base;
    const std::string architecture =
        m.position_embedding_type + " positions" +
        (m.rope() ? " (base " + base.str() + (m.rotary_interleaved ? ", interleaved pairs" : "") + ")" : "") + ", " +
        m.normalization + ", " +
        (m.swiglu         ? "SwiGLU"
         : m.squared_relu ? "squared-ReLU"
                          : "GeLU") +
        " MLP, " +
        (m.query_groups() == m.num_attention_heads ? std::string("one key/value head per head")
                                                   : std::to_string(m.query_groups()) + " query groups") +
        (m.add_bias_linear ? ""
         : m.add_qkv_bias  ? ", biases on the QKV projection only"
                           : ", no linear biases") +
        (m.untie_embeddings ? ", untied output layer" : ", output tied to the word embedding") +
        (m.init_xavier_uniform ? ", Xavier-uniform weights" : "");
    std::printf(
        "model: %lld layers, hidden %lld, %lld heads, ffn %lld, sequence %lld, vocabulary %lld (padded to "
        "%lld): %.2fM parameters, %.2fM held by each TP rank; %s; attention %s, bias-GeLU fusion %s, "
        "recompute %s, sequence parallel %s\n",
        static_cast<long long>(m.num_layers), static_cast<long long>(m.hidden_size),
        static_cast<long long>(m.num_attention_heads), static_cast<long long>(m.ffn()),
        static_cast<long long>(m.seq_length), static_cast<long long>(m.vocab_size),
        static_cast<long long>(m.padded_vocab(groups->tp_size())), static_cast<double>(total) / 1e6,
        static_cast<double>(params.local_numel()) / 1e6, architecture.c_str(), m.attention_backend.c_str(),
        m.swiglu || !m.add_bias_linear ? "off"
        : layers::forward_epilogues(m.gemm_epilogues)
            ? (layers::backward_epilogues(m.gemm_epilogues) ? "in the GEMM, backward too (--gemm-epilogues=all)"
                                                            : "in the GEMM (--gemm-epilogues)")
        : m.bias_gelu_fusion ? "on"
                             : "off",
        m.recompute_summary().c_str(),
        !m.sequence_parallel    ? "off"
        : groups->tp_size() > 1 ? "on"
                                : "off (nothing to split at TP 1)");
    // cuDNN attention stays a choice (its dropout masks and its backward's
    // summation order are its own), but a GPU run that could take it is told.
    if (on_gpu && !m.cudnn_attention() &&
        kernels::cudnn_attention_unsupported(DeviceKind::CUDA, args.dtype(), m.head_dim()).empty())
      std::printf(
          "hint: --attention-backend cudnn can run this model and is the fastest attention on a GPU (measured in "
          "docs/PERFORMANCE.md); add --deterministic-mode where reruns must repeat bit for bit\n");
    if (!args.zero_config_expansion.empty()) std::printf("%s\n", args.zero_config_expansion.c_str());
    const std::string tp_split = "1/" + std::to_string(groups->tp_size()) + " per TP rank";
    std::printf("ZeRO-R: activation checkpoints %s%s%s; constant buffers (CB): %s\n",
                !args.model.recompute_activations ? "off (no --recompute-activations)"
                : args.zero_r.inputs_split_across_tp
                    ? ("already " + tp_split + " by --sequence-parallel" +
                       (args.zero_r.partition_activations ? " (Pa has nothing left to partition)" : ""))
                          .c_str()
                : args.zero_r.partition_activations
                    ? ("partitioned 1/" + std::to_string(groups->tp_size()) + " per TP rank (Pa)").c_str()
                    : "whole on every TP rank",
                args.zero_r.cpu_checkpointing ? ", in host memory (Pa+cpu)" : "",
                args.zero_r.contiguous_memory ? ", in one pre-allocated arena (MD)" : "",
                engine.constant_buffers().c_str());
    // Where the step's tail goes: the timers read differently when it overlaps the next forward.
    if (args.zero.stage == 0 && args.zero.overlap_optimizer)
      std::printf(
          "optimizer: AdamW beside the next forward, in runs of whole layers (%zu here; --overlap-optimizer); the "
          "optimizer timer counts the gradient norm only, the update shows in the forward's time where "
          "it is not hidden\n",
          engine.step_runs());
    else if ((args.zero.stage == 1 || args.zero.stage == 2) && args.zero.overlap_param_gather)
      std::printf(
          "parameter all-gather: during the next forward, in runs of whole layers (%zu here; --overlap-param-gather); "
          "what it does not hide is exposed DP comm there\n",
          engine.step_runs());
    std::fflush(stdout);
  }
  opt = OptimizerSettings{args.adam, args.lr, args.clip_grad};
  optim::LossScalerConfig lsc = args.loss_scale;
  lsc.dynamic = args.fp16 && lsc.constant_scale == 0;
  scaler_ = std::make_unique<optim::LossScaler>(lsc);
  auto& scaler = *scaler_;

  // Resume: the newest good checkpoint under --load, in whatever layout it was saved.
  placement = checkpoint::Placement::of(*groups);
  if (!args.load.empty()) {
    const ResumePoint at = resume_from_checkpoint(args, engine, placement, scaler, opt, root);
    start_iter = at.iteration;
    consumed_at_start = at.consumed_samples;
  }
  run_consistently(world, [&] {
    if (!root || args.metrics_file.empty()) return;
    metrics.open(args.metrics_file, std::ios::trunc);
    MZ_REQUIRE(metrics.good(), "--metrics-file: cannot write '", args.metrics_file, "'");
  });
  run_consistently(world, [&] {
    if (root && !args.tensorboard_dir.empty()) tensorboard.emplace(args.tensorboard_dir);
  });
  if (args.profile)
    run_consistently(world, [&] {
      profile = std::make_unique<IterationProfile>(args, world.rank(), world.size(), device, start_iter);
      profile->check_ready();
    });
  // MFU's peak (trainer/peak_flops.h): --peak-tflops, an H100's on a GPU, or
  // measured on the CPU by the first rank of each host (its siblings share
  // its cores and threads setting: probing at once they would only slow each
  // other, and each probe is ~9 GFLOP, ~0.1 s of a core); the ranks take the
  // best measured, so every rank reports against the same number.
  if (args.peak_tflops > 0) {
    peak = args.peak_tflops;
  } else {
    PeakFlops p = on_gpu ? gpu_default_peak() : local_index == 0 ? measure_cpu_peak(args.dtype()) : PeakFlops{0.0, ""};
    peak = max_over(world, p.tflops);
    if (root) std::printf("MFU against %.4g TFLOP/s per rank (%s; --peak-tflops sets it)\n", peak, p.source.c_str());
  }
  if (!on_gpu && root && !openblas_core().note.empty()) std::printf("CPU math: %s\n", openblas_core().note.c_str());
  flops_per_token = model.flops_per_token(true);
  model_flops_per_token = model.flops_per_token(false);
  consumed_.assign(1, consumed_at_start);
  if (args.weight_decay_incr_style != "constant") {  // Megatron's schedule, in samples as the learning rate's
    opt.weight_decay_at = [this](std::int64_t it) {
      return args.weight_decay_schedule().at_samples(consumed_before(it), global);
    };
    if (root)
      std::printf(" weight decay: %g -> %g (%s) over %lld iterations\n", args.start_weight_decay, args.end_weight_decay,
                  args.weight_decay_incr_style.c_str(), static_cast<long long>(args.weight_decay_incr_iters));
  }
  if (batches.ramps()) {
    // Megatron's schedule in samples: an iteration of a smaller batch moves it less.
    opt.lr_at = [this](std::int64_t it) { return opt.lr.at_samples(consumed_before(it), global); };
    if (root)
      std::printf(" batch-size ramp-up: %s; this run starts at a global batch of %lld\n", batches.describe().c_str(),
                  static_cast<long long>(batch_of(start_iter)));
  }
  if (args.eod_mask_loss && root)
    std::printf(" loss: no loss where the input is token %lld (--eod-mask-loss); the mean over the kept tokens of %s\n",
                static_cast<long long>(args.eod_token_id),
                args.per_token_loss ? "the global batch (--calculate-per-token-loss)" : "each micro-batch");
  if ((args.reset_position_ids || args.reset_attention_mask) && root)
    std::printf(" documents: token %lld ends each; %s%s%s\n", static_cast<long long>(args.eod_token_id),
                args.reset_position_ids ? "positions restart at 0 after it (--reset-position-ids)" : "",
                args.reset_position_ids && args.reset_attention_mask ? "; " : "",
                args.reset_attention_mask ? "attention stays within each document (--reset-attention-mask)" : "");
}

void Trainer::Impl::save(std::int64_t iteration) {
  auto& engine = *engine_;
  auto& scaler = *scaler_;
  Activity activity("saving a checkpoint");
  checkpoint::TrainState st;
  st.iteration = iteration;
  st.consumed_samples = consumed_before(iteration);
  st.seed = args.seed;
  st.loss_scaler = scaler.state();
  st.config = args.to_config();
  st.optimizer_start_iteration = opt.optimizer_start_iteration;
  checkpoint::SaveOptions so;
  so.keep = args.keep_checkpoints;
  so.optimizer_state = !args.no_save_optim;
  so.kill_rank_midway = kill_in_save_rank(iteration);
  const auto io = checkpoint::save_checkpoint(args.save, st, engine, placement, so);
  if (root)
    std::printf(" saved checkpoint %s in %.2f s: %.1f MiB, %s per rank, %s total\n", io.path.c_str(), io.max_seconds,
                static_cast<double>(io.total_bytes) / 1048576.0,
                mib_per_s(static_cast<double>(io.rank_bytes), io.seconds).c_str(),
                mib_per_s(static_cast<double>(io.total_bytes), io.max_seconds).c_str());
  std::fflush(stdout);
}

std::int64_t Trainer::Impl::consumed_before(std::int64_t it) {
  MZ_CHECK(it >= start_iter, "consumed_before(", it, ") before the run's first iteration ", start_iter);
  while (static_cast<std::int64_t>(consumed_.size()) <= it - start_iter)
    consumed_.push_back(consumed_.back() + batches.batch_at(consumed_.back()));
  return consumed_[static_cast<std::size_t>(it - start_iter)];
}

std::vector<MicroBatch> Trainer::Impl::host_micro_batches(std::int64_t it, Split split) {
  std::vector<MicroBatch> mbs;
  // Training: this iteration's batch (it ramps up with --rampup-batch-size);
  // evaluation: always the full one.
  const bool train = split == Split::Train;
  const std::int64_t batch = train ? batch_of(it) : global;
  for (std::int64_t m = 0; m < batch / (args.micro_batch_size * dp); ++m) {
    MicroBatch mb;
    mb.step.seed = args.seed;
    mb.step.iteration = static_cast<std::uint64_t>(it);
    mb.step.micro_batch = args.micro_batch_size;
    mb.step.seq = S;
    mb.step.training = split == Split::Train;
    mb.step.sample_offset = groups->dp_rank() * (batch / dp) + m * args.micro_batch_size;
    // Training reads from the data position (consumed samples), so a resumed
    // run continues where the checkpoint left off.
    const std::int64_t base = train ? consumed_before(it) : it * global;
    source->fill(split, base + mb.step.sample_offset, args.micro_batch_size, S, host, mb.ids, mb.targets);
    mbs.push_back(std::move(mb));
  }
  return mbs;
}

void Trainer::Impl::upload(std::vector<MicroBatch>& mbs) {
  if (device->host_accessible()) return;
  for (auto& mb : mbs)
    for (Tensor* t : {&mb.ids, &mb.targets, &mb.loss_weights, &mb.step.positions, &mb.step.key_starts}) {
      // made on the host; one copy each to the device
      if (!t->defined()) continue;
      Tensor d = Tensor::empty(device, t->shape(), t->dtype(), MemoryCategory::Activations);
      d.copy_from(*t);
      *t = d;
    }
}

double Trainer::Impl::evaluate(std::int64_t at, Split split) {
  auto& model = *model_;
  // Stage 3 gathers without prefetching along the training order meanwhile.
  struct Evaluating {
    zero::ZeroEngine& engine;
    explicit Evaluating(zero::ZeroEngine& e) : engine(e) { engine.set_evaluating(true); }
    ~Evaluating() {
      try {
        engine.set_evaluating(false);
      } catch (...) {  // unwinding from a failed evaluation: that error is the one to report
      }
    }
  } evaluating(*engine_);
  double sum = 0;
  for (std::int64_t e = 0; e < args.eval_iters; ++e) {
    auto mbs = host_batch(at * 1000003 + e, split);
    upload(mbs);
    for (auto& mb : mbs) sum += model.forward(mb.ids, mb.targets, mb.step, mb.loss_weights);
  }
  const double loss = all_reduce_value(
      groups->dp(), args.eval_iters > 0 ? sum / static_cast<double>(args.eval_iters * accum) : 0, ReduceOp::Avg);
  const char* name = split == Split::Test ? "test" : "validation";
  if (root)
    std::printf(" %s loss at iteration %lld: %.4f | ppl %.2f\n", name, static_cast<long long>(at), loss,
                std::exp(loss));
  scalar(std::string("lm loss ") + name, at, loss);
  scalar(std::string("lm loss ") + name + " ppl", at, std::exp(loss));
  if (tensorboard) tensorboard->flush();
  return loss;
}

void Trainer::Impl::evaluate_at_end(std::int64_t at, TrainResult& result) {
  if (args.eval_iters == 0) return;
  result.validation_loss = evaluate(at);
  if (source->has(Split::Test)) result.test_loss = evaluate(at, Split::Test);
}

TrainResult Trainer::Impl::train() {
  Communicator& world = groups->world();
  auto& model = *model_;
  auto& engine = *engine_;
  auto& scaler = *scaler_;
  TrainResult result;
  result.start_iteration = start_iter;
  result.last_iteration = start_iter;
  result.consumed_samples = consumed_at_start;
  const auto t_start = Clock::now();
  double first_loss = 0, last_loss = 0;
  std::int64_t nan_total = 0;
  IterationLog log({&world, device.get(), host.get(), &args, root, flops_per_token, model_flops_per_token, peak,
                    metrics.is_open() ? &metrics : nullptr, tensorboard ? &*tensorboard : nullptr});
  const std::int64_t nan_at = nan_loss_at();
  bool first = true;
  std::optional<std::vector<MicroBatch>> next_mbs;  // the next iteration's, made during this step
  std::exception_ptr next_error;                    // what making them raised, for the next iteration
  double next_data_s = 0;
  if (args.skip_train) {  // Megatron's: the evaluation alone
    if (root)
      std::printf(" --skip-train: evaluating the model of iteration %lld; nothing is trained or saved\n",
                  static_cast<long long>(start_iter));
    evaluate_at_end(start_iter, result);
    return result;
  }
  // From here a stop signal waits for the step boundary and saves.
  set_stop_is_immediate(false);
  if (stop_signal_received() != 0 && root)  // one that came in between is still honoured below
    std::printf("a stop signal arrived during start-up; stopping after the first step\n");
  for (std::int64_t it = start_iter; it < args.train_iters; ++it) {
    set_activity_iteration(it + 1);
    if (profile) profile->before(it + 1);
    const auto t0 = Clock::now();
    // Bad data (a token id past --vocab-size) fails one rank's samples: every
    // rank stops alike, with that rank's message (one tiny all-reduce). Made
    // during the previous step where it could be (below); an error found
    // then is raised here, so that step still logs and saves as it would
    // have.
    if (next_error) std::rethrow_exception(std::exchange(next_error, nullptr));
    std::vector<MicroBatch> mbs;
    double t_data = 0;
    if (next_mbs) {
      mbs = std::move(*next_mbs);
      next_mbs.reset();
      t_data = next_data_s;
    } else {
      mbs = host_batch(it, Split::Train);
    }
    upload(mbs);
    t_data += seconds_since(t0);
    const auto t1 = Clock::now();
    // The next iteration's tokens are made while the device runs this step's
    // optimizer (the host would otherwise make them with the device idle, ~0.2
    // ms a step of GPT-2 medium's 49 on the 2026-11-26 H200). Every rank
    // decides alike (the same iteration counts), so the all-reduce inside
    // stays collective; a stop after this step leaves them unused.
    const auto prefetch = [&] {
      if (it + 1 >= args.train_iters) return;
      const auto tp = Clock::now();
      Activity activity("the next iteration's batch (made during the optimizer step)");
      try {
        next_mbs = host_batch(it + 1, Split::Train);
      } catch (...) {
        next_error = std::current_exception();
      }
      next_data_s = seconds_since(tp);
    };
    const std::int64_t batch = batch_of(it);
    StepResult r = train_step(model, engine, groups->dp(), mbs, opt, scaler, it, prefetch);
    if (it + 1 == nan_at) r.loss = std::nan("");
    const double t_step = seconds_since(t1);
    log.add(r, seconds_since(t0), t_data, t_step, static_cast<double>(batch * S));
    if (profile) profile->after(it + 1);
    result.losses.push_back(r.loss);
    result.learning_rates.push_back(r.lr);
    result.weight_decays.push_back(r.weight_decay);
    result.global_batches.push_back(batch);
    result.consumed_samples = consumed_before(it + 1);
    result.last_iteration = it + 1;
    if (first) first_loss = r.loss;
    first = false;
    last_loss = r.loss;
    // The loss is the all-reduced mean: every rank takes the same branch. With
    // fp16 a non-finite loss is an overflow the scaler already handled.
    if (!std::isfinite(r.loss) && !args.fp16) {
      ++nan_total;
      if (args.on_nan_loss == "stop")
        throw AgreedConfigError(detail::concat(
            "the loss is ", r.loss, " at iteration ", it + 1,
            "; training stopped instead of continuing on garbage (the step was not applied): lower --lr, raise "
            "--lr-warmup-iters or use --clip-grad, resume from the last checkpoint with --load, or pass "
            "--on-nan-loss skip to skip such iterations"));
    }
    if ((it + 1) % args.log_interval == 0 || it + 1 == args.train_iters) {
      IterationLog::Report at;
      at.iteration = it + 1;
      at.consumed_samples = consumed_before(it + 1);
      at.global_batch = batch;
      at.skipped = scaler.skipped_steps();
      at.nan_iterations = nan_total;
      at.params_norm = args.log_params_norm ? engine.params_norm() : 0.0;  // collective: every rank
      at.zeros = args.log_num_zeros_in_grad ? engine.grad_zeros() : 0;     // collective too
      log.report(at, r);
    }
    if (args.eval_interval > 0 && args.eval_iters > 0 && (it + 1) % args.eval_interval == 0 &&
        it + 1 < args.train_iters) {
      Activity activity("evaluation");
      evaluate(it + 1);
    }
    if (!args.save.empty() && args.save_interval > 0 && (it + 1) % args.save_interval == 0) {
      save(it + 1);
      last_saved = it + 1;
    }
    // --exit-interval / --exit-duration-in-mins (Megatron's): save and exit 0.
    // Rank 0's clock decides, so every rank stops after the same step.
    const bool exit_interval_hit = args.exit_interval > 0 && (it + 1) % args.exit_interval == 0;
    const bool exit_duration_hit =
        args.exit_duration_in_mins > 0 &&
        broadcast_string(world, seconds_since(t_process) / 60.0 >= args.exit_duration_in_mins ? "1" : "0") == "1";
    if ((exit_interval_hit || exit_duration_hit) && it + 1 < args.train_iters) {
      if (profile) profile->finish(it + 1);
      if (!args.save.empty() && last_saved != it + 1) save(it + 1);
      if (root)
        std::printf("exiting after iteration %lld: %s reached%s\n", static_cast<long long>(it + 1),
                    exit_interval_hit ? "--exit-interval" : "--exit-duration-in-mins",
                    args.save.empty() ? " (no --save: nothing saved)" : ", checkpoint saved");
      std::fflush(stdout);
      return result;
    }
    if (stop_requested_anywhere(world)) {
      if (profile) profile->finish(it + 1);
      if (!args.save.empty() && last_saved != it + 1) save(it + 1);
      if (root)
        std::printf("stopping after iteration %lld on a stop signal (SIGTERM/SIGUSR1)%s; exit code %d\n",
                    static_cast<long long>(it + 1),
                    args.save.empty() ? " without a checkpoint (no --save)" : ", checkpoint saved",
                    kExitStoppedBySignal);
      std::fflush(stdout);
      result.exit_code = kExitStoppedBySignal;
      return result;
    }
  }
  set_activity_iteration(-1);
  if (!args.save.empty() && last_saved != args.train_iters && start_iter < args.train_iters) save(args.train_iters);
  set_activity("final evaluation");
  evaluate_at_end(args.train_iters, result);
  const double valid = result.validation_loss;
  if (root && checkpoints && args.zero_r.contiguous_memory && args.train_iters > start_iter) {
    // MD: what the arenas replaced — allocations that would have been made
    // (and freed) among short-lived activations every iteration.
    const double iters = static_cast<double>(args.train_iters - start_iter);
    std::printf(
        "MD: per iteration, %.0f activation checkpoints placed in a %.2f MiB arena and %.0f group gradients "
        "in reserved buffers, instead of as many allocations interleaved with transient activations\n",
        static_cast<double>(checkpoints->stats().arena_fills) / iters,
        static_cast<double>(checkpoints->stats().arena_bytes) / 1048576.0,
        static_cast<double>(engine.gradient_arena_fills()) / iters);
  }
  if (root) {
    char vtext[64];
    if (args.eval_iters > 0)
      std::snprintf(vtext, sizeof vtext, "validation loss %.4f", valid);
    else
      std::snprintf(vtext, sizeof vtext, "no validation (--eval-iters 0)");
    if (args.train_iters > start_iter)
      std::printf("training done: %lld iterations in %.1f s, loss %.4f -> %.4f, %s\n",
                  static_cast<long long>(args.train_iters - start_iter), seconds_since(t_start), first_loss, last_loss,
                  vtext);
    else  // a resume at --train-iters: the evaluation alone
      std::printf("training done: nothing to train (the checkpoint is at iteration %lld), %s\n",
                  static_cast<long long>(start_iter), vtext);
  }
  return result;
}

Trainer::Trainer(TrainArgs args, std::unique_ptr<Communicator> world, Clock::time_point process_start)
    : impl_(std::make_unique<Impl>()) {
  impl_->args = std::move(args);
  impl_->t_process = process_start;
  impl_->setup(std::move(world));
}
Trainer::~Trainer() = default;
void Trainer::build() { impl_->build(); }
TrainResult Trainer::train() { return impl_->train(); }
double Trainer::evaluate(std::int64_t iteration) { return impl_->evaluate(iteration); }
void Trainer::save(std::int64_t iteration) { impl_->save(iteration); }
const TrainArgs& Trainer::args() const { return impl_->args; }
Communicator& Trainer::world() { return impl_->groups->world(); }

std::string checkpoint_args_config(const TrainArgs& args, Communicator& world) {
  std::string text;
  run_consistently(world, [&] {
    if (world.rank() == 0) text = checkpoint::stored_configuration(load_path(args));
  });
  return broadcast_string(world, text);
}

}  // namespace megazero::train
