#include "megazero/plan/memory_plan.h"

#include <cstdio>
#include <sstream>

#include "layers/gpt_model.h"
#include "megazero/comm/virtual_communicator.h"
#include "megazero/optim/loss_scaler.h"
#include "megazero/kernels/conventions.h"
#include "megazero/train/train_step.h"
#include "megazero/core/error.h"
#include "megazero/zero/partitioned_activations.h"
#include "megazero/zero/zero_engine.h"
#include "parallel_state/topology.h"

namespace megazero::plan {

double paper_model_state_bytes(int stage, double psi, double nd, int pb, bool offloaded, bool params_offloaded) {
  const double K = offloaded ? 0 : 12;  // ZeRO-Offload keeps the optimizer's K bytes in host memory
  if (params_offloaded) {               // stage 3 only: the parameter partition in host memory too
    MZ_CHECK(stage == 3, "parameters are offloaded at stage 3 only");
    return (pb + K) * psi / nd;
  }
  switch (stage) {
    case 0:
      return (2.0 * pb + K) * psi;
    case 1:
      return 2.0 * pb * psi + K * psi / nd;
    case 2:
      return pb * psi + (pb + K) * psi / nd;
    case 3:
      return (2.0 * pb + K) * psi / nd;
  }
  throw InternalError("stage " + std::to_string(stage));
}

RankMemoryPlan plan_rank_memory(const train::TrainArgs& args, int world_size, int rank, DeviceKind kernels) {
  const int tp = args.parallel.tensor_model_parallel_size;
  parallel_state::TopologyOptions topo;
  topo.world_size = world_size;
  topo.tensor_model_parallel_size = tp;
  topo.ranks_per_node = args.parallel.ranks_per_node > 0 ? args.parallel.ranks_per_node : tp;
  topo.allow_tp_across_nodes = args.parallel.allow_tp_across_nodes;
  const auto topology = parallel_state::Topology::create(topo);
  MZ_REQUIRE(rank >= 0 && rank < world_size, "--plan-rank ", rank, " is outside the world of ", world_size, " ranks");
  const auto coord = topology.coord(rank);
  VirtualCommunicator tp_comm(coord.tp_rank, tp, "tp"), dp_comm(coord.dp_rank, world_size / tp, "dp");

  auto meta = make_meta_device(kernels);
  // Host memory for Pa+cpu and ZeRO-Offload, counted apart as in a run.
  auto host = make_meta_device(DeviceKind::CPU);
  RankMemoryPlan p;
  {
    layers::ParameterSet params;
    layers::GPTModel model(args.model, layers::TpContext{&tp_comm, meta, args.dtype()}, params);
    zero::ZeroEngine engine(params, dp_comm, tp_comm, meta, args.engine_config(), host);
    zero::PartitionedCheckpoints checkpoints(args.zero_r, tp_comm, meta, host,
                                             static_cast<int>(args.model.checkpoint_slots()));
    if (args.zero_r.any()) {
      model.set_checkpoint_store(&checkpoints);
      checkpoints.reserve(args.checkpoint_elements(), args.dtype());
    }
    const auto snap = meta->memory().snapshot();
    for (std::size_t c = 0; c < kNumMemoryCategories; ++c) p.bytes[c] = snap.by_category[c].live_bytes;
    {  // ZeRO-Offload's host memory: model states only (Pa+cpu's checkpoints are apart)
      const auto h = host->memory().snapshot();
      for (auto c : {MemoryCategory::Parameters, MemoryCategory::Gradients, MemoryCategory::OptimizerStates})
        p.host_offload_bytes += h.by_category[static_cast<std::size_t>(c)].live_bytes;
    }
    p.psi = engine.layout().unpadded_numel();
    for (const auto* param : params.all()) p.total_params += shape_numel(param->global_shape);
    p.psi_padded = engine.layout().numel();
    p.owned_elements = engine.owned().size();
    // Whole iterations through the code a run executes (train_step: every
    // micro-batch's forward and backward, then the optimizer step), sizes only.
    const std::int64_t B = args.micro_batch_size, S = args.model.seq_length;
    p.micro_batches = std::max<std::int64_t>(1, args.accumulation_steps(world_size / tp));
    std::vector<train::MicroBatch> mbs;
    for (std::int64_t m = 0; m < p.micro_batches; ++m) {
      train::MicroBatch mb;
      mb.ids = Tensor::empty(meta, {B * S}, DType::I64, MemoryCategory::Activations);
      mb.targets = Tensor::empty(meta, {B * S}, DType::I64, MemoryCategory::Activations);
      if (args.eod_mask_loss)  // as the trainer makes them (train/loss_mask.h)
        mb.loss_weights =
            Tensor::empty(meta, {B * S}, kernels::row_stat_dtype(args.dtype()), MemoryCategory::Activations);
      if (args.reset_position_ids)  // as the trainer makes them (train/documents.h)
        mb.step.positions = Tensor::empty(meta, {B * S}, DType::I64, MemoryCategory::Activations);
      if (args.reset_attention_mask)
        mb.step.key_starts = Tensor::empty(meta, {B * S}, DType::I64, MemoryCategory::Activations);
      mb.step.seed = args.seed;
      mb.step.micro_batch = B;
      mb.step.seq = S;
      mb.step.training = true;
      mb.step.sample_offset = m * B;
      mbs.push_back(std::move(mb));
    }
    const train::OptimizerSettings opt{args.adam, args.lr, args.clip_grad};
    optim::LossScaler scaler(args.loss_scale);
    meta->memory().reset_peaks();
    // Two iterations: the first records the order of the parameter groups, and
    // every later one prefetches along it (stage 3 holds one more gathered
    // group), so the peaks are those of both. Traffic, GEMMs and collectives
    // are the second's, the steady state's.
    train::train_step(model, engine, dp_comm, mbs, opt, scaler, 0);
    const auto before = meta->memory().snapshot();
    const std::int64_t offload_copied_before =
        (engine.offload() ? engine.offload()->copied_bytes() : 0) + engine.param_upload_bytes();
    tp_comm.reset_stats();
    dp_comm.reset_stats();
    auto& log = static_cast<MetaDevice&>(*meta).compute_log();
    log.clear();
    train::train_step(model, engine, dp_comm, mbs, opt, scaler, 1);
    const auto peak = meta->memory().snapshot();
    for (std::size_t c = 0; c < kNumMemoryCategories; ++c) p.step_peak[c] = peak.by_category[c].peak_bytes;
    p.step_total_peak = peak.total_peak_bytes;
    p.step_heap_peak = peak.heap_peak_bytes;
    const auto act = static_cast<std::size_t>(MemoryCategory::Activations);
    const auto ckpt = static_cast<std::size_t>(MemoryCategory::ActivationCheckpoints);
    p.activation_traffic_bytes = peak.by_category[act].allocated_bytes - before.by_category[act].allocated_bytes;
    p.host_copy_bytes = checkpoints.stats().host_copies_bytes;  // counted by the store as it copies
    if (engine.offload())  // the second iteration's: gradients down, parameters up (or pieces before gathers)
      p.offload_copy_bytes = engine.offload()->copied_bytes() + engine.param_upload_bytes() - offload_copied_before;
    p.host_checkpoint_peak = host->memory().snapshot().by_category[ckpt].peak_bytes;
    for (const auto& [g, calls] : log.gemms()) p.gemms.push_back({g, calls});
    const double tokens = static_cast<double>(B * S * p.micro_batches);
    p.model_flops_per_step = model.flops_per_token(true) * tokens / tp;
    p.model_flops_no_recompute = model.flops_per_token(false) * tokens / tp;
    p.tp_comm = tp_comm.stats();
    p.dp_comm = dp_comm.stats();
  }
  p.rank = rank;
  p.world = world_size;
  p.tp = tp;
  p.dp = world_size / tp;
  p.tp_rank = coord.tp_rank;
  p.dp_rank = coord.dp_rank;
  p.stage = args.zero.stage;
  p.offloaded = args.zero.offload_optimizer;
  p.params_offloaded = args.zero.offload_params;
  p.param_bytes = static_cast<int>(dtype_size(args.dtype()));
  p.dtype = std::string(dtype_name(args.dtype()));
  auto at = [&](MemoryCategory c) { return p.bytes[static_cast<std::size_t>(c)]; };
  p.model_states = at(MemoryCategory::Parameters) + at(MemoryCategory::Gradients) + at(MemoryCategory::OptimizerStates);
  p.paper_model_states = static_cast<std::int64_t>(paper_model_state_bytes(p.stage, static_cast<double>(p.psi), p.dp,
                                                                           static_cast<int>(dtype_size(args.dtype())),
                                                                           p.offloaded, p.params_offloaded));
  return p;
}

double RankMemoryPlan::gemm_flops() const {
  double f = 0;
  for (const auto& g : gemms) f += g.shape.flops() * static_cast<double>(g.calls);
  return f;
}

RankMemoryPlan plan_busiest_rank(const train::TrainArgs& args, int world_size, std::int64_t* least_peak,
                                 DeviceKind kernels) {
  RankMemoryPlan busiest;
  std::int64_t least = 0;
  for (int r = 0; r < world_size; ++r) {
    auto p = plan_rank_memory(args, world_size, r, kernels);
    if (r == 0 || p.step_total_peak < least) least = p.step_total_peak;
    if (r == 0 || p.step_total_peak > busiest.step_total_peak) busiest = std::move(p);
  }
  if (least_peak) *least_peak = least;
  return busiest;
}

std::int64_t largest_layers_that_fit(train::TrainArgs args, int world_size, int rank, std::int64_t budget,
                                     RankMemoryPlan* plan_out, DeviceKind kernels) {
  auto fits = [&](std::int64_t layers, RankMemoryPlan* out) {
    args.model.num_layers = layers;
    const auto p = plan_rank_memory(args, world_size, rank, kernels);
    if (out) *out = p;
    return p.step_total_peak <= budget;
  };
  std::int64_t lo = 0, hi = 1;
  while (fits(hi, nullptr)) {  // grow until it does not fit
    lo = hi;
    hi *= 2;
    MZ_REQUIRE(hi <= (1 << 20), "a model of over a million layers fits: the memory budget is not a limit");
  }
  while (hi - lo > 1) {
    const std::int64_t mid = (lo + hi) / 2;
    (fits(mid, nullptr) ? lo : hi) = mid;
  }
  if (lo > 0 && plan_out) fits(lo, plan_out);
  return lo;
}

namespace {
std::string gib(std::int64_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.3f GiB", static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0));
  return s;
}
}  // namespace

std::string RankMemoryPlan::to_table() const {
  std::ostringstream os;
  os << "---- memory plan: rank " << rank << " of " << world << " (TP rank " << tp_rank << " of " << tp << ", DP rank "
     << dp_rank << " of " << dp << "), ZeRO stage " << stage << ", " << dtype << " ----\n"
     << "  model parameters: " << total_params << "; of this TP shard (Psi): " << psi << " (" << psi_padded
     << " padded for DP)\n";
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c)
    if (bytes[c] > 0)
      os << "  " << memory_category_name(static_cast<MemoryCategory>(c)) << ": " << gib(bytes[c]) << "\n";
  const double rel = paper_model_states > 0 ? static_cast<double>(model_states - paper_model_states) /
                                                  static_cast<double>(paper_model_states)
                                            : 0.0;
  char d[32];
  std::snprintf(d, sizeof d, "%+.3f%%", 100.0 * rel);
  os << "  model states (parameters + gradients + optimizer): " << gib(model_states)
     << "; the paper's formula: " << gib(paper_model_states) << " (" << d << ")"
     << (offloaded ? " with the optimizer's K = 12 bytes a parameter offloaded" : "")
     << (params_offloaded ? ", and the 16-bit parameters" : "") << "\n";
  if (offloaded)
    os << "  host memory (ZeRO-Offload): " << gib(host_offload_bytes)
       << " (fp32 master + Adam moments, 12 bytes, and the gradient staging and "
       << (params_offloaded ? "the parameter partition" : "the parameter staging") << ", " << 2 * param_bytes
       << " bytes, for each of the " << owned_elements << " offloaded parameters); " << gib(offload_copy_bytes)
       << " copied between device and host per iteration\n";
  os << "  two iterations (each " << micro_batches
     << " micro-batch(es) forward + backward and the optimizer step, real code on the meta device; the second is "
        "every later one): peak activations "
     << gib(step_peak[static_cast<std::size_t>(MemoryCategory::Activations)]) << ", checkpoints "
     << gib(step_peak[static_cast<std::size_t>(MemoryCategory::ActivationCheckpoints)]) << ", total "
     << gib(step_total_peak) << " (first-fit heap " << gib(step_heap_peak) << ")\n"
     << "  communication of one iteration (the second; elements):";
  for (auto [group, st] : {std::pair{"tp", &tp_comm}, std::pair{"dp", &dp_comm}})
    for (std::size_t t = 0; t < kNumCollectiveTypes; ++t)
      if ((*st).by_type[t].calls > 0)
        os << " " << group << " " << collective_name(static_cast<CollectiveType>(t)) << " " << (*st).by_type[t].elements
           << " (" << (*st).by_type[t].calls << " calls);";
  os << "\n";
  return os.str();
}

std::string RankMemoryPlan::to_json() const {
  std::ostringstream os;
  os << "{\"rank\": " << rank << ", \"world\": " << world << ", \"tp\": " << tp << ", \"dp\": " << dp
     << ", \"zero_stage\": " << stage << ", \"dtype\": \"" << dtype << "\", \"psi\": " << psi
     << ", \"psi_padded\": " << psi_padded << ", \"bytes\": {";
  bool first = true;
  for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
    os << (first ? "" : ", ") << "\"" << memory_category_name(static_cast<MemoryCategory>(c)) << "\": " << bytes[c];
    first = false;
  }
  os << "}, \"model_states\": " << model_states << ", \"paper_model_states\": " << paper_model_states
     << ", \"step_activations_peak\": " << step_peak[static_cast<std::size_t>(MemoryCategory::Activations)]
     << ", \"step_checkpoints_peak\": " << step_peak[static_cast<std::size_t>(MemoryCategory::ActivationCheckpoints)]
     << ", \"step_total_peak\": " << step_total_peak << ", \"step_heap_peak\": " << step_heap_peak
     << ", \"offload_optimizer\": " << (offloaded ? "true" : "false")
     << ", \"offload_params\": " << (params_offloaded ? "true" : "false")
     << ", \"host_offload_bytes\": " << host_offload_bytes << ", \"offload_copy_bytes\": " << offload_copy_bytes << "}";
  return os.str();
}

}  // namespace megazero::plan
