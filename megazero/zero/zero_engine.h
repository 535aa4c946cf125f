// ZeRO-DP (Rajbhandari et al., SC 2020) stages 0-3 over the data-parallel
// group, for any TP degree (each TP rank partitions its own shard's flat
// buffer). Per rank, with Psi = the TP shard's parameters and Nd = DP size:
//
//   stage 0  plain DP: full 16-bit params and grads, full fp32 master + Adam (16 Psi);
//            gradients all-reduced in buckets.
//   stage 1  Pos: full params and grads; master + Adam for the own partition
//            (4 Psi + 12 Psi/Nd); gradients reduce-scattered, params all-gathered
//            (stages 1-2: in runs of whole groups, each waited for by its first
//            forward, so the gather overlaps the next step's compute).
//   stage 2  Pos+g: full params; gradients exist in full only per group while
//            that group runs backward, are reduce-scattered in constant-size
//            buckets as soon as a bucket is complete, and only the partition is
//            kept (2 Psi + 14 Psi/Nd + buckets).
//   stage 3  Pos+g+p: params partitioned too (16 Psi/Nd); a group's params are
//            all-gathered before its forward and again before its backward,
//            released after; the next group's gather is prefetched.
//
// With offload_optimizer (ZeRO-Offload) every stage keeps its fp32 master and
// Adam moments in host memory instead: the K Psi (stage 0) or K Psi/Nd term
// leaves the device.
//
// The engine implements the model's ParamHooks; it knows parameters and flat
// buffers, nothing about layers.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "layers/param_hooks.h"
#include "layers/parameter.h"
#include "megazero/comm/communicator.h"
#include "megazero/optim/adamw.h"
#include "megazero/zero/flat_layout.h"
#include "megazero/zero/optimizer_offload.h"

namespace megazero::zero {

struct ZeroConfig {
  int stage = 0;                               // --zero-stage
  DType param_dtype = DType::F32;              // 16-bit params/grads: --bf16 / --fp16
  std::int64_t reduce_bucket_size = 50000000;  // --reduce-bucket-size, elements (the paper's CB)
  bool overlap_comm = true;                    // --overlap-comm: launch buckets during backward
  bool prefetch = true;                        // stage 3: gather the next group ahead (--stage3-prefetch)
  // Stages 1-2: the step's all-gather of the updated parameters goes out in
  // runs of whole groups of about reduce_bucket_size elements and each run
  // is waited for by its first group's pre_forward, not at the end of the
  // step (Megatron's --overlap-param-gather). Same bits either way.
  bool overlap_param_gather = true;  // --overlap-param-gather
  // Stage 0: AdamW updates the parameters in the same runs of whole groups,
  // each queued beside the compute (Device::run_queued: a side stream on a
  // GPU), and each group's next forward waits for its own run only, so the
  // update overlaps the next forward and the host does not wait for it at
  // the step's end. Same bits either way.
  bool overlap_optimizer = false;  // --overlap-optimizer
  // ZeRO-Offload (zero/optimizer_offload.h): the fp32 master and Adam's
  // moments of owned() in host memory, AdamW on the host, any stage. Same bits.
  bool offload_optimizer = false;  // --optimizer-cpu-offload
  // Stage 3 with offload_optimizer (ZeRO-Infinity's CPU parameter offload,
  // DeepSpeed's offload_param): the 16-bit parameter partition in host memory
  // too, each rank's piece uploaded into the gathered buffer before a gather.
  // The device keeps the gradient partition and the gathered groups. Same bits.
  bool offload_params = false;  // --param-cpu-offload
  // MD for gradients (stages 2-3): the transient full-size gradients of the
  // groups in backward live in two buffers reserved once (the embedding
  // group's, which stays in backward the whole pass, and one sized for the
  // largest other group) instead of one allocation per group per micro-batch.
  bool contiguous_gradients = false;  // --contiguous-memory-optimization

  void validate() const;  // ConfigError naming the flag
};

struct StepStats {
  bool skipped = false;  // an overflow (inf/NaN gradient) on some rank: nobody updated
  double grad_norm = 0;  // global norm over all DP partitions and TP shards (unscaled)
  double clip_coef = 1;
};

class ZeroEngine final : public layers::ParamHooks {
 public:
  // `host`: where offload_optimizer keeps the optimizer state (nullptr: the
  // device's host_device(); the planner passes a meta device).
  ZeroEngine(layers::ParameterSet& params, Communicator& dp, Communicator& tp, std::shared_ptr<Device> device,
             const ZeroConfig& cfg, std::shared_ptr<Device> host = nullptr);
  ~ZeroEngine() override;

  // Initial weights from the seed, the same values as ParameterSet::initialize.
  void initialize(std::uint64_t seed);
  // Start of a step: clears the gradients.
  void zero_grad();
  // Around evaluation (forward passes only): stage 3 gathers each group as the
  // forward needs it and prefetches nothing (the recorded order continues with
  // a backward evaluation does not run, so a prefetch there would gather groups
  // nobody uses and keep them past the evaluation); training resumes at the
  // start of that order.
  void set_evaluating(bool on);
  // Before each micro-batch's backward; stages 0-1 reduce only on the last.
  void begin_backward(bool last_micro_batch);
  // Finishes the reductions, clips, updates the owned partition and makes the
  // new parameters visible. Gradients are scaled by `loss_scale`.
  StepStats step(double lr, const optim::AdamConfig& adam, double clip_grad, double loss_scale,
                 std::int64_t step_number);

  void pre_forward(int group) override;
  void post_forward(int group) override;
  void pre_backward(int group) override;
  void post_backward(int group) override;

  const ZeroConfig& config() const { return cfg_; }
  const FlatLayout& layout() const { return layout_; }
  Range owned() const { return owned_; }     // where this rank keeps master + Adam
  Range partition() const { return part_; }  // this rank's DP partition
  int dp_rank() const { return dp_.rank(); }
  const Tensor& master() {  // fp32, owned().size() elements (host memory with offload_optimizer)
    finish_step();
    return master_;
  }
  // The fp32 optimizer state of owned(): checkpoints read it to save and
  // overwrite it to load, then call load_finished().
  struct OwnedState {
    Tensor master, exp_avg, exp_avg_sq;
  };
  OwnedState owned_state() {
    finish_step();
    return {master_, exp_avg_, exp_avg_sq_};
  }
  // The global L2 norm of the fp32 master weights (Megatron's params norm):
  // each rank's partition (a TP-replicated parameter counted on TP rank 0
  // only, as the grad norm), summed over TP and DP. Collective over both
  // groups; waits for the last step's work and reads one scalar back.
  double params_norm();
  // Megatron's number of zeros in the grad: the elements of the last
  // backward's gradients that are exactly zero, counted over each rank's
  // partition as the grad norm counts them (TP-replicated parameters once),
  // summed over TP and DP. Call after the step, before the next zero_grad.
  // Collective over both groups; reads one scalar back.
  std::int64_t grad_zeros();
  // Recomputes the 16-bit parameters from freshly loaded master weights.
  void load_finished() { publish_params(); }
  // Waits for the last step's work still in flight: the parameter all-gathers
  // (stages 1-2 with overlap_param_gather), the update (stage 0 with
  // overlap_optimizer) and the offloaded update's uploads. The forward's hooks
  // wait for each group's own run; whoever reads parameters or optimizer
  // states outside them calls this first (owned_state, master and the loads do).
  void finish_step() {
    wait_pending(layout_.num_groups());
    if (offload_) offload_->finish();
  }
  // ZeRO-Offload's host side; nullptr without offload_optimizer.
  const OptimizerOffload* offload() const { return offload_.get(); }
  // offload_params: bytes of parameter pieces uploaded before gathers, since construction.
  std::int64_t param_upload_bytes() const { return param_upload_bytes_; }
  // Runs of the last step not yet waited for, and the number of runs of
  // groups a step's all-gather or update is split into (0 where it is one
  // piece waited for at the end of the step, 1 for a gather so waited).
  std::size_t step_runs_in_flight() const { return pending_.size(); }
  std::size_t step_runs() const { return group_runs_.size(); }
  const std::vector<layers::Parameter*>& parameters() const { return params_; }
  // This rank's partition of the reduced gradients (valid between the last
  // backward and step(); for diagnostics and fault-injection tests).
  Tensor partition_grads();
  // Seconds this rank's device spent waiting on DP communication since
  // zero_grad(): the communication that backward and compute did not hide.
  // Measured with device marks around each wait (Device::mark): on the CPU
  // the host's blocked time; on a GPU the compute stream's stall (an NCCL
  // wait only orders the stream, and a host-side wait the queued kernels
  // covered costs the device nothing). Waits until the last wait's mark.
  double exposed_comm_seconds();
  // The device the engine's buffers live on (the model's).
  Device& device() const { return *device_; }
  // MD: group-gradient buffers taken from the reserved arena instead of allocated.
  std::int64_t gradient_arena_fills() const { return arena_fills_; }
  // The constant-size fused communication buffers in use (the paper's CB), in words.
  std::string constant_buffers() const;
  // Stage 3: peak bytes of gathered (full) parameters at any time, and now.
  std::int64_t gathered_peak_bytes() const { return gathered_peak_; }
  std::int64_t gathered_bytes() const { return gathered_bytes_; }
  // Stage 3: gathers issued ahead of their group's use (the prefetch), since construction.
  std::int64_t prefetched_gathers() const { return prefetched_gathers_; }

 private:
  struct InFlight {
    std::size_t bucket;
    int slot;  // staging slot (stages 2-3), -1 for in-place (stages 0-1)
    Work work;
  };

  void bind_full(Tensor layers::Parameter::*member, const Tensor& flat, Range within);
  void launch_ready_buckets(std::int64_t final_from);
  void launch(std::size_t bucket);
  void complete_oldest();
  void flush();
  int acquire_slot();
  void stage_group_grads(int group);
  void gather(int group);
  void issue_gather(int group);
  void release(int group);
  void publish_params();
  void issue_param_gathers();
  void queue_updates(const optim::AdamConfig& adam, double lr, std::int64_t step_number, double grad_scale);
  void wait_pending(int up_to_group);  // the runs covering groups <= up_to_group, in issue order
  void clear_full_grads();
  void clear_deferred_grads();
  // out[0] (an fp64 scalar on the gradients' device) = the squared norm of this rank's counted gradients.
  void sum_of_squares(const Tensor& grads, Tensor& out) const;

  std::vector<layers::Parameter*> params_;
  std::vector<layers::GradAt> grads_in(Range within) const;
  Communicator& dp_;
  Communicator& tp_;
  std::shared_ptr<Device> device_;
  ZeroConfig cfg_;
  FlatLayout layout_;
  Range part_, owned_;
  std::vector<optim::DecaySegment> owned_segments_;
  // Partition-relative ranges the grad norm counts (a TP-replicated parameter
  // only on TP rank 0), non-empty, in order.
  std::vector<std::pair<std::int64_t, std::int64_t>> norm_ranges_;

  Tensor master_, exp_avg_, exp_avg_sq_;  // fp32, owned (offload_'s, in host memory, with offload_optimizer)
  std::unique_ptr<OptimizerOffload> offload_;
  std::shared_ptr<Device> host_;         // offload_optimizer / offload_params: where their state lives
  std::int64_t param_upload_bytes_ = 0;  // offload_params: pieces uploaded before gathers
  Tensor params_full_, params_part_;     // param dtype
  Tensor grads_full_, grads_part_;       // param dtype
  std::map<int, Tensor> group_grads_;    // stages 2-3: grads of groups in backward
  Tensor grad_arena_[2];                 // MD: [0] the first group's, [1] any other group's
  std::int64_t arena_fills_ = 0;

  // Bucketed reduction.
  std::vector<Range> buckets_;
  std::int64_t next_bucket_ = -1;  // highest bucket not yet launched this micro-batch
  bool reduce_now_ = false;
  std::vector<Tensor> slots_;
  std::vector<int> slot_of_bucket_;
  std::vector<bool> slot_busy_;
  std::deque<InFlight> in_flight_;

  // Stage 3 gathering.
  struct Gathered {
    Tensor buffer;
    Work work;
    bool bound = false;
  };
  std::map<int, Gathered> gathered_;
  std::vector<int> sequence_;  // group order of pre_* calls, recorded on the first step
  bool recording_ = true, evaluating_ = false;
  std::size_t seq_pos_ = 0;
  std::int64_t gathered_bytes_ = 0, gathered_peak_ = 0, prefetched_gathers_ = 0;
  std::vector<std::pair<std::shared_ptr<Device::Mark>, std::shared_ptr<Device::Mark>>> comm_waits_;

  // The runs of whole groups (about reduce_bucket_size elements each, tiling
  // [0, numel()): the padding rides with the last) that the step's
  // all-gather (stages 1-2) or update (stage 0, overlap_optimizer) is split
  // into, and those runs in flight, oldest first, each with the first group it
  // covers: a gather's Work or an update's handle.
  struct GroupRun {
    int first_group, last_group;
    Range range;
  };
  std::vector<GroupRun> group_runs_;
  struct Pending {
    int first_group;
    Work gather;
    std::shared_ptr<Device::Transfer> update;
  };
  std::deque<Pending> pending_;
  // Stage 0 with overlap_optimizer: zero_grad found the update in flight, so
  // the full gradients (which it reads) are cleared when the backward begins.
  bool clear_grads_at_backward_ = false;
  void timed_wait(Work& w);
};

}  // namespace megazero::zero
