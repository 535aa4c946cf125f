#include "megazero/plan/time_model.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "megazero/core/error.h"

namespace megazero::plan {
namespace {

struct GroupPlacement {
  int size = 1, nodes = 1;
  double bandwidth = 0, latency = 0;  // bytes/s, s
};

// A group of `size` ranks with `per_node` of them on each node it spans.
GroupPlacement place(int size, int per_node, const HardwareProfile& hw) {
  GroupPlacement g;
  g.size = size;
  per_node = std::max(1, std::min(per_node, size));
  g.nodes = (size + per_node - 1) / per_node;
  const double intra = hw.intra_node.bus_bandwidth_gbps * 1e9;
  if (g.nodes == 1) {
    g.bandwidth = intra;
    g.latency = hw.intra_node.latency_us * 1e-6;
  } else {
    // Every device of the node runs a group of this kind at the same time:
    // devices_per_node / per_node groups share the node's NICs.
    const double share = std::min(hw.inter_node_gbps * per_node / hw.devices_per_node, hw.inter_node_group_gbps) * 1e9;
    g.bandwidth = std::min(intra, share);
    g.latency = hw.inter_node_latency_us * 1e-6;
  }
  return g;
}

double collective_seconds(CollectiveType t, const CollectiveCounter& c, const GroupPlacement& g) {
  if (g.size <= 1 || c.calls == 0) return 0;
  const double p = g.size;
  double factor = 0, steps = 0;
  switch (t) {
    case CollectiveType::AllReduce:
      factor = 2 * (p - 1) / p;
      steps = 2 * (p - 1);
      break;
    case CollectiveType::ReduceScatter:
    case CollectiveType::AllGather:
      factor = (p - 1) / p;
      steps = p - 1;
      break;
    case CollectiveType::Broadcast:
    case CollectiveType::Reduce:
      factor = 1;
      steps = p - 1;
      break;
    case CollectiveType::Barrier:
      factor = 0;
      steps = 2 * (p - 1);
      break;
    case CollectiveType::Send:
    case CollectiveType::Recv:
      factor = 1;
      steps = 1;
      break;
    case CollectiveType::kCount:
      break;
  }
  return factor * static_cast<double>(c.bytes) / g.bandwidth + static_cast<double>(c.calls) * steps * g.latency;
}

double all_seconds(const CommStats& s, const GroupPlacement& g) {
  double t = 0;
  for (std::size_t i = 0; i < kNumCollectiveTypes; ++i)
    t += collective_seconds(static_cast<CollectiveType>(i), s.by_type[i], g);
  return t;
}

double gemm_seconds(const GemmShape& s, const HardwareProfile& hw) {
  const double elem = static_cast<double>(dtype_size(s.dtype));
  const double bytes = static_cast<double>(s.m * s.k + s.k * s.n + s.m * s.n) * static_cast<double>(s.batch) * elem;
  const double compute = s.flops() / (hw.peak_flops(s.dtype) * hw.gemm_efficiency);
  return std::max(compute, bytes / (hw.memory_bandwidth_gbps * 1e9)) + hw.kernel_overhead_us * 1e-6;
}

}  // namespace

StepTimeEstimate estimate_step_time(const train::TrainArgs& args, const RankMemoryPlan& plan,
                                    const HardwareProfile& hw) {
  StepTimeEstimate e;
  e.hardware = hw.name;
  const double membw = hw.memory_bandwidth_gbps * 1e9;
  for (const auto& g : plan.gemms) e.gemm_s += gemm_seconds(g.shape, hw) * static_cast<double>(g.calls);
  e.elementwise_s = static_cast<double>(plan.activation_traffic_bytes) * hw.elementwise_traffic_factor / membw;
  e.compute_s = e.gemm_s + e.elementwise_s;

  // TP ranks are adjacent (Topology); a DP group takes one rank of each TP group.
  const int dpn = hw.devices_per_node;
  const GroupPlacement tp = place(plan.tp, dpn, hw);
  const GroupPlacement dp = place(plan.dp, std::max(1, dpn / plan.tp), hw);
  e.tp_nodes = tp.nodes;
  e.dp_nodes = dp.nodes;
  e.tp_comm_s = all_seconds(plan.tp_comm, tp);
  e.host_copy_s = static_cast<double>(plan.host_copy_bytes) / (hw.host_link_gbps * 1e9);

  // DP: what may hide behind compute, and in which window.
  auto dp_type = [&](CollectiveType t) { return collective_seconds(t, plan.dp_comm[t], dp); };
  e.dp_comm_s = all_seconds(plan.dp_comm, dp);
  // A layer's forward, recompute and backward are 1 : 1 : 2; R of L layers
  // recompute (full: all, block: the first N), so the backward's share of the
  // compute is (2L + R) / (3L + R): 3/4 with every layer, 2/3 with none.
  const double L = static_cast<double>(args.model.num_layers);
  const double R = static_cast<double>(args.model.recomputed_layers());
  const double backward_share = (2 * L + R) / (3 * L + R);
  const double mb = static_cast<double>(plan.micro_batches);
  double hideable = 0, window = 0;
  switch (plan.stage) {
    case 0:
      hideable = dp_type(CollectiveType::AllReduce);
      window = e.compute_s * backward_share / mb;
      break;
    case 1:
      hideable = dp_type(CollectiveType::ReduceScatter);
      window = e.compute_s * backward_share / mb;
      break;
    case 2:
      hideable = dp_type(CollectiveType::ReduceScatter);
      window = e.compute_s * backward_share;
      break;
    default:
      hideable = dp_type(CollectiveType::ReduceScatter) + dp_type(CollectiveType::AllGather);
      window = e.compute_s;
  }
  if (!args.zero.overlap_comm) window = 0;
  // The last bucket is reduced after the backward pass has ended.
  const double dp_bytes = static_cast<double>(std::max<std::int64_t>(
      1, plan.dp_comm[plan.stage == 0 ? CollectiveType::AllReduce : CollectiveType::ReduceScatter].bytes));
  const double bucket_bytes =
      static_cast<double>(args.zero.reduce_bucket_size) * static_cast<double>(dtype_size(args.dtype()));
  const double tail = hideable * std::min(1.0, bucket_bytes / dp_bytes);
  // Either compute hides all but the last bucket, or the excess shows.
  const double hidden_part_exposed = window > 0 ? std::max(hideable - window, tail) : hideable;
  e.dp_exposed_s = hidden_part_exposed + (e.dp_comm_s - hideable);
  // Stages 1-2 with --overlap-param-gather: the step's parameter all-gather
  // runs during the next step's first forward, each run of groups waited for
  // by its first layer, so all but the first run (about a bucket: the
  // embedding's group is its own) may hide behind that forward.
  if ((plan.stage == 1 || plan.stage == 2) && args.zero.overlap_param_gather) {
    const double gather = dp_type(CollectiveType::AllGather);
    const double gather_bytes =
        static_cast<double>(std::max<std::int64_t>(1, plan.dp_comm[CollectiveType::AllGather].bytes));
    const double first_run = gather * std::min(1.0, bucket_bytes / gather_bytes);
    const double forward_window = e.compute_s * (1 - backward_share) / mb;
    e.dp_exposed_s -= gather - std::max(gather - forward_window, first_run);
  }

  // Adam: read and write fp32 master, m and v; read the gradient, write the 16-bit parameter.
  const double pb = static_cast<double>(dtype_size(args.dtype()));
  e.optimizer_s = static_cast<double>(plan.owned_elements) * (24.0 + 2.0 * pb) / membw;
  if (plan.offloaded) {
    // ZeRO-Offload: the same bytes streamed through host memory, and the
    // gradients down and parameters up over the host link; the two pipelined
    // chunk by chunk, so the slower one is the step's.
    MZ_REQUIRE(hw.host_memory_gbps > 0, "--hardware ", hw.name,
               " has no host_memory_gbps: --optimizer-cpu-offload runs AdamW in host memory; add the host's memory "
               "bandwidth per device to the profile");
    e.optimizer_on_host = true;
    e.optimizer_s = std::max(static_cast<double>(plan.owned_elements) * (24.0 + 2.0 * pb) / (hw.host_memory_gbps * 1e9),
                             static_cast<double>(plan.offload_copy_bytes) / (hw.host_link_gbps * 1e9));
  }

  e.step_s = e.compute_s + e.tp_comm_s + e.host_copy_s + e.dp_exposed_s + e.optimizer_s;
  e.tflops_per_gpu = plan.model_flops_per_step / e.step_s / 1e12;
  e.mfu = plan.model_flops_no_recompute / e.step_s / hw.peak_flops(args.dtype());
  e.samples_per_s = static_cast<double>(args.micro_batch_size) * mb * plan.dp / e.step_s;
  e.memory_gib = static_cast<double>(plan.step_total_peak) / 1073741824.0;
  e.device_memory_gib = hw.memory_gib;
  e.fits = e.memory_gib <= hw.memory_gib;
  return e;
}

std::string StepTimeEstimate::to_table() const {
  char b[1600];
  std::snprintf(b, sizeof b,
                "---- time estimate on %s (one iteration of the planned rank) ----\n"
                "  compute %.3f s (GEMMs %.3f s, elementwise %.3f s)\n"
                "  TP communication %.3f s (group spans %d node(s); exposed)\n"
                "  DP communication %.3f s, %.3f s of it exposed (group spans %d node(s))\n"
                "  Pa+cpu host copies %.3f s, optimizer %.3f s%s\n"
                "  step %.3f s: %.1f TFLOP/s per GPU (model FLOPs with recompute), MFU %.1f%%, %.1f samples/s\n"
                "  memory %.2f GiB of %.0f GiB: %s\n",
                hardware.c_str(), compute_s, gemm_s, elementwise_s, tp_comm_s, tp_nodes, dp_comm_s, dp_exposed_s,
                dp_nodes, host_copy_s, optimizer_s, optimizer_on_host ? " (on the host: ZeRO-Offload)" : "", step_s,
                tflops_per_gpu, 100.0 * mfu, samples_per_s, memory_gib, device_memory_gib,
                fits ? "fits" : "DOES NOT FIT");
  return b;
}

std::string StepTimeEstimate::to_json() const {
  std::ostringstream os;
  os.precision(6);
  os << "{\"hardware\": \"" << hardware << "\", \"gemm_s\": " << gemm_s << ", \"elementwise_s\": " << elementwise_s
     << ", \"compute_s\": " << compute_s << ", \"tp_comm_s\": " << tp_comm_s << ", \"host_copy_s\": " << host_copy_s
     << ", \"dp_comm_s\": " << dp_comm_s << ", \"dp_exposed_s\": " << dp_exposed_s
     << ", \"optimizer_s\": " << optimizer_s << ", \"optimizer_on_host\": " << (optimizer_on_host ? "true" : "false")
     << ", \"step_s\": " << step_s << ", \"tflops_per_gpu\": " << tflops_per_gpu << ", \"mfu\": " << mfu
     << ", \"samples_per_s\": " << samples_per_s << ", \"tp_nodes\": " << tp_nodes << ", \"dp_nodes\": " << dp_nodes
     << ", \"memory_gib\": " << memory_gib << ", \"device_memory_gib\": " << device_memory_gib
     << ", \"fits\": " << (fits ? "true" : "false") << "}";
  return os.str();
}

}  // namespace megazero::plan
