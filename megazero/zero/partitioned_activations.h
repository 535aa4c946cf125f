// ZeRO-R's activation-checkpoint policies (the paper, section 6.1):
//
//   Pa      --partition-activations: a recomputing layer's input is replicated
//           across the TP group, so each TP rank keeps only its 1/TP slice and
//           the slices are all-gathered just before that layer's recompute.
//           Checkpoint memory per rank falls by the TP degree, for one extra
//           all-gather of batch x seq x hidden per layer.
//   Pa+cpu  --cpu-checkpointing: those slices live in host memory (pinned on
//           GPU builds) and are copied back for the recompute.
//   MD      --contiguous-memory-optimization: the checkpoints of all layers
//           live in one pre-allocated arena, filled slot by slot as forward
//           produces them, instead of as many allocations interleaved with
//           short-lived activations (which fragment device memory).
//
// Layers know none of this: they call save()/restore() of layers/checkpoint_store.h.
#pragma once

#include <memory>
#include <vector>

#include "layers/checkpoint_store.h"
#include "megazero/comm/communicator.h"

namespace megazero::zero {

struct ZeroRConfig {
  bool partition_activations = false;  // Pa
  bool cpu_checkpointing = false;      // Pa+cpu
  bool contiguous_memory = false;      // MD
  // Sequence parallelism already leaves each TP rank 1/TP of every layer
  // input (its own token rows, not a slice of a replicated tensor): Pa has
  // nothing left to partition and keeps the rank's rows whole; Pa+cpu and MD
  // still apply to them.
  bool inputs_split_across_tp = false;
  // The TP ranks a checkpoint is partitioned over.
  int partitions(int tp_size) const { return partition_activations && !inputs_split_across_tp ? tp_size : 1; }
  bool any() const { return partition_activations || cpu_checkpointing || contiguous_memory; }
  // ConfigError naming the flag: each needs --recompute-activations; Pa+cpu needs Pa.
  void validate(bool recompute_activations) const;
};

class PartitionedCheckpoints final : public layers::ActivationCheckpointStore {
 public:
  // `host` holds the slices under Pa+cpu (its own memory counters).
  PartitionedCheckpoints(const ZeroRConfig& cfg, Communicator& tp, std::shared_ptr<Device> device,
                         std::shared_ptr<Device> host, int num_layers);
  ~PartitionedCheckpoints() override;
  void save(int layer, const Tensor& x) override;
  Tensor restore(int layer) override;
  void prefetch(int layer) override;  // Pa+cpu: queues the copy back of `layer`'s slice
  // MD: reserve the arena now, for layer inputs of `elements` (micro-batch x
  // seq x hidden), so it sits with the model states at the bottom of memory
  // instead of being carved out mid-forward among transient activations.
  void reserve(std::int64_t elements, DType dtype);

  struct Stats {
    std::int64_t arena_bytes = 0;        // MD: reserved once, reused every micro-batch
    std::int64_t arena_fills = 0;        // checkpoints placed in the arena (allocations avoided)
    std::int64_t gathered_elements = 0;  // Pa: elements all-gathered for recompute
    std::int64_t host_copies_bytes = 0;  // Pa+cpu: bytes moved to and from host memory
    std::int64_t prefetched = 0;         // Pa+cpu: restores whose copy back was queued before they were asked for
  };
  const Stats& stats() const { return stats_; }
  const ZeroRConfig& config() const { return cfg_; }

 private:
  struct Saved {
    Shape shape;
    Tensor slice;                      // this rank's part (all of it without Pa)
    std::vector<std::int64_t> counts;  // Pa: every rank's slice length
    bool present = false;
  };
  void ensure_arena(std::int64_t chunk, DType dtype);
  // Pa+cpu's copies are queued behind the compute (Device::copy_*_queued): a
  // pending one keeps what it reads or writes alive until it is ordered
  // before whatever may reuse that memory: an offload's device side at the
  // next save or restore (a GPU-side wait), a restore's host side at the next
  // forward's first save (the host waits then, long after the copy ended, not
  // once a layer in backward).
  struct Pending {
    std::shared_ptr<Device::Transfer> transfer;
    Tensor device_side, host_side;
  };
  void retire(bool host_sides);
  // A restore's copy back to the device, queued: `part` is valid for device
  // work issued after queue_after(*transfer).
  struct Fetch {
    int layer = -1;
    Tensor part, host_side;
    std::shared_ptr<Device::Transfer> transfer;
  };
  Fetch fetch(int layer);
  void drop_prefetch();  // a prefetch nobody asked for: ordered, its host side kept pending

  ZeroRConfig cfg_;
  Communicator& tp_;
  std::shared_ptr<Device> device_, host_;
  int num_layers_;
  std::vector<Saved> saved_;
  Tensor arena_;
  std::int64_t arena_chunk_ = 0;
  Stats stats_;
  std::vector<Pending> pending_;
  // Pa+cpu: the next layer backward will restore (the one below the last
  // restored), its copy back queued while this layer computes.
  Fetch prefetch_;
};

}  // namespace megazero::zero
