// The planner's time model: one iteration's time on a hardware profile, priced
// from what the real code did on the meta device (memory_plan.h) — every GEMM
// by shape, the activation bytes written, the checkpoint bytes sent to host
// memory, every collective's calls and bytes per group — never from a second
// formula of the model.
//
//   GEMM          roofline per call: max(FLOPs / (peak x gemm_efficiency),
//                 bytes / memory bandwidth) + a fixed per-call overhead
//   elementwise   activation bytes written x traffic factor / memory bandwidth
//   collective    ring algorithm: factor x bytes / bandwidth + steps x latency,
//                 with factor 2(p-1)/p for all-reduce, (p-1)/p for
//                 reduce-scatter and all-gather, and steps 2(p-1) or (p-1).
//                 A group inside one node gets the intra-node bus bandwidth; a
//                 group spanning nodes shares its node's NICs with the other
//                 groups of its kind that run at the same time (with TP 16 on a
//                 16-GPU node the 16 DP groups split the node's bandwidth).
//   overlap       Megatron's TP all-reduces, Pa's all-gathers and Pa+cpu's
//                 copies are exposed (they sit on the critical path); DP
//                 gradient reductions overlap the backward pass of the
//                 micro-batches that issue them (stages 0-1: the last one;
//                 2-3: every one), stage 3's parameter gathers overlap all
//                 compute (prefetch); the last bucket and the stage 1-2
//                 parameter all-gather after the optimizer step are exposed.
//   optimizer     Adam on the owned partition, memory bound.
#pragma once

#include <string>

#include "megazero/plan/hardware_profile.h"
#include "megazero/plan/memory_plan.h"

namespace megazero::plan {

struct StepTimeEstimate {
  std::string hardware;
  // Seconds per iteration on the planned rank, by part.
  double gemm_s = 0, elementwise_s = 0, compute_s = 0;
  double tp_comm_s = 0;     // TP group: Megatron all-reduces, Pa all-gathers (exposed)
  double host_copy_s = 0;   // Pa+cpu: checkpoints to host memory and back (exposed)
  double dp_comm_s = 0;     // DP group, all of it
  double dp_exposed_s = 0;  // the part that compute did not hide
  double optimizer_s = 0;
  bool optimizer_on_host = false;  // ZeRO-Offload: AdamW in host memory, its copies over the host link
  double step_s = 0;
  // Throughput: the paper's metric is model FLOPs with recompute per GPU
  // (Narayanan et al. eq. 3, 96 B s l h^2 (...)); MFU uses the FLOPs without
  // recompute (factor 72) over the profile's peak.
  double tflops_per_gpu = 0, mfu = 0;
  double samples_per_s = 0;        // the whole world
  int tp_nodes = 1, dp_nodes = 1;  // nodes each group spans
  double memory_gib = 0, device_memory_gib = 0;
  bool fits = true;  // step peak within the device memory
  std::string to_table() const;
  std::string to_json() const;
};

StepTimeEstimate estimate_step_time(const train::TrainArgs& args, const RankMemoryPlan& plan,
                                    const HardwareProfile& hw);

}  // namespace megazero::plan
