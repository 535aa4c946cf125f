// Shared set-up for the ZeRO tests: a small GPT on a (TP, DP) layout carved out
// of the MPI world, fed the same global batches whatever the layout (sample s
// of iteration i is a pure function of (i, s); DP rank d takes its contiguous
// share, split into micro-batches), trained with the real train_step.
#pragma once

#include <memory>
#include <vector>

#include "layers/gpt_model.h"
#include "megazero/comm/mpi_communicator.h"
#include "megazero/train/train_step.h"
#include "megazero/zero/partitioned_activations.h"

namespace megazero::testing_util {

struct ZeroRunSpec {
  int tp = 1, dp = 1, stage = 0;
  DType dtype = DType::F32;
  std::int64_t global_batch = 8, micro_batch = 2;
  bool recompute = false;
  std::int64_t recompute_first_layers = 0;  // --recompute-method block: only these layers recompute (0: all)
  std::int64_t recompute_chunk = 1;         // --recompute-method uniform: layers recomputed from one kept input
  std::int64_t bucket = 1000;               // elements: small, so models span many buckets
  bool overlap = true;
  bool prefetch = true;              // stage 3's gather of the next group ahead
  bool overlap_param_gather = true;  // stages 1-2: the step's all-gather waited for by the next forward
  bool overlap_optimizer = false;    // stage 0: AdamW run by run beside the next forward
  bool offload_optimizer = false;    // ZeRO-Offload: master + Adam in host memory, AdamW on the host
  bool offload_params = false;       // stage 3 with it: the parameter partition in host memory too
  // The DP group's collectives run only when waited for (deferred_communicator.h):
  // a read of a collective's result without its wait reads stale data, every time.
  bool deferred_dp = false;
  int steps = 3;
  std::int64_t hidden = 32;  // model width (the memory test uses a wider one: padding < 1%)
  zero::ZeroRConfig zero_r;  // Pa / Pa+cpu / MD (needs recompute)
  bool llama = false;        // rope, RMSNorm, SwiGLU, 8 heads in 4 query groups, no biases, untied output layer
  bool sequence_parallel = false;
};

layers::GPTConfig zero_test_model(bool recompute, std::int64_t hidden = 32, bool llama = false);

// The world communicator of a test binary: created on first use (tests may
// run filtered), destroyed before MPI_Finalize by a GoogleTest environment.
MpiCommunicator& test_world();

// A fresh directory /tmp/<prefix>-XXXXXX made by rank 0, the same path on every rank of test_world().
std::string shared_temp_dir(const std::string& prefix);

class ZeroRun {
 public:
  // Collective over `world`; ranks beyond tp x dp must not call this. `self`
  // runs TP = DP = 1 on each rank alone.
  ZeroRun(Communicator& world, const ZeroRunSpec& spec);
  ~ZeroRun();
  // Losses of iterations [first, first + count) (count -1: up to spec.steps).
  // The loss scaler persists across calls, as in one run.
  std::vector<double> train(int first = 0, int count = -1);
  // Owned fp32 master values keyed by (parameter name, global element index).
  double master_at(const std::string& name, std::int64_t global_index) const;
  void for_each_owned(const std::function<void(const layers::Parameter&, std::int64_t global, double v)>& fn) const;

  ZeroRunSpec spec;
  std::unique_ptr<Communicator> tp, dp;
  std::unique_ptr<layers::ParameterSet> params;
  std::unique_ptr<layers::GPTModel> model;
  std::unique_ptr<zero::ZeroEngine> engine;
  std::shared_ptr<Device> device;
  std::unique_ptr<optim::LossScaler> scaler;
  std::shared_ptr<Device> host;  // Pa+cpu's and ZeRO-Offload's host memory, with its own counters
  std::unique_ptr<zero::PartitionedCheckpoints> checkpoints;
  std::vector<train::StepResult> results;
};

}  // namespace megazero::testing_util
