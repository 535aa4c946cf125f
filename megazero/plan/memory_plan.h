// The memory planner: what one rank of a (possibly huge, virtual) world holds,
// measured by building the real model and ZeRO engine for that rank on the
// meta device — sizes are counted by the same memory tracker as in a run and
// come from the same partitioning code (zero/flat_layout.h), so the plan
// cannot drift from what a run allocates. Nothing is stored: planning the
// paper's 100B model for one of its 400 ranks takes well under a second.
//
// Covers model states (16-bit parameters and gradients, fp32 master + Adam),
// the constant communication buffers (CB) and the MD checkpoint arena, and
// compares model states with the paper's formulas (docs/paper/README.md);
// then runs one whole iteration (train_step) on the meta device (the kernels
// check shapes and skip the arithmetic) for the step's peak.
// The iteration's GEMMs, traffic and communication feed the time model
// (time_model.h).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "megazero/comm/communicator.h"
#include "megazero/core/device.h"
#include "megazero/core/memory_tracker.h"
#include "megazero/train/arguments.h"

namespace megazero::plan {

struct RankMemoryPlan {
  int rank = 0, world = 1, tp = 1, dp = 1, tp_rank = 0, dp_rank = 0, stage = 0;
  std::string dtype;
  std::int64_t psi = 0;           // parameters of this rank's TP shard (the paper's Psi with MP)
  std::int64_t psi_padded = 0;    // after padding to DP x 64 elements
  std::int64_t total_params = 0;  // the whole model (global shapes, vocabulary padding included)
  std::array<std::int64_t, kNumMemoryCategories> bytes{};  // live after set-up, by category
  std::int64_t owned_elements = 0;                         // this rank's optimizer partition (master + Adam)
  // One whole iteration (train_step: every micro-batch's forward and backward,
  // then the optimizer step) run on the meta device: the peak of each category
  // and of the total (model states included), and the first-fit heap peak
  // (with fragmentation).
  std::int64_t micro_batches = 1;
  std::array<std::int64_t, kNumMemoryCategories> step_peak{};
  std::int64_t step_total_peak = 0, step_heap_peak = 0;
  // What that iteration computed and moved, for the time model: every GEMM by
  // shape, the bytes of activations written (elementwise traffic), the bytes
  // of checkpoints moved to host memory and back (Pa+cpu), and the communication the
  // communicators counted — elements and calls by collective type, per group.
  struct GemmCalls {
    GemmShape shape;
    std::int64_t calls = 0;
  };
  std::vector<GemmCalls> gemms;
  double gemm_flops() const;        // sum over gemms
  double model_flops_per_step = 0;  // this rank's share of the model's analytic FLOPs (Narayanan et al. eq. 3), as run
  double model_flops_no_recompute = 0;  // the same without recompute (for MFU)
  std::int64_t activation_traffic_bytes = 0;
  std::int64_t host_copy_bytes = 0, host_checkpoint_peak = 0;
  CommStats tp_comm, dp_comm;
  std::int64_t model_states = 0;        // parameters + gradients + optimizer states
  std::int64_t paper_model_states = 0;  // the paper's formula for this stage, Psi and Nd
  // ZeRO-Offload (--optimizer-cpu-offload): host bytes of the optimizer state
  // and its staging, the elements it updates, and the bytes copied between
  // device and host in one iteration (gradients down, parameters up).
  bool offloaded = false, params_offloaded = false;             // --optimizer-cpu-offload, --param-cpu-offload
  int param_bytes = 2;                                          // of the working precision
  std::int64_t host_offload_bytes = 0, offload_copy_bytes = 0;  // the state covers owned_elements
  std::string to_table() const;
  std::string to_json() const;
};

// The paper's per-device model-state bytes (K = 12): stage 0 (2+2+K) Psi,
// 1: 4 Psi + K Psi/Nd, 2: 2 Psi + (2+K) Psi/Nd, 3: (2+2+K) Psi/Nd — with 16-bit
// parameters and gradients; fp32 runs count 4 + 4 bytes instead of 2 + 2.
// `offloaded` (ZeRO-Offload): the device's share with K = 0; `params_offloaded`
// (stage 3, with it): the 16-bit parameter partition in host memory too.
double paper_model_state_bytes(int stage, double psi, double nd, int param_bytes, bool offloaded = false,
                               bool params_offloaded = false);

// Plans `rank` of a world of `world_size` ranks for the run `args` describes
// (args.validate / validate_layout must have passed). `kernels`: the backend
// whose kernels the run uses — CUDA (cuBLAS keeps its workspace outside the
// counters) or CPU (16-bit GEMMs without native support widen their operands
// into counted workspace; the plan then counts that too).
RankMemoryPlan plan_rank_memory(const train::TrainArgs& args, int world_size, int rank,
                                DeviceKind kernels = DeviceKind::CUDA);

// Plans every rank of the world; returns the plan with the largest step peak
// (ties: the lowest rank) and stores the smallest peak in *least_peak.
RankMemoryPlan plan_busiest_rank(const train::TrainArgs& args, int world_size, std::int64_t* least_peak = nullptr,
                                 DeviceKind kernels = DeviceKind::CUDA);

// The largest --num-layers (other flags as given) whose planned step peak on
// `rank` stays within `budget_bytes`; 0 if not even one layer fits. Binary
// search over real plans (each well under a second).
std::int64_t largest_layers_that_fit(train::TrainArgs args, int world_size, int rank, std::int64_t budget_bytes,
                                     RankMemoryPlan* plan_out = nullptr, DeviceKind kernels = DeviceKind::CUDA);

}  // namespace megazero::plan
