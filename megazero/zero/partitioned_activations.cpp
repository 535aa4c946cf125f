#include "megazero/zero/partitioned_activations.h"

#include "megazero/core/error.h"

namespace megazero::zero {

void ZeroRConfig::validate(bool recompute) const {
  MZ_REQUIRE(!partition_activations || recompute,
             "--partition-activations partitions the checkpoints of --recompute-activations; add "
             "--recompute-activations");
  MZ_REQUIRE(!contiguous_memory || recompute,
             "--contiguous-memory-optimization arranges the checkpoints of --recompute-activations; add "
             "--recompute-activations");
  MZ_REQUIRE(!cpu_checkpointing || partition_activations,
             "--cpu-checkpointing moves the partitioned checkpoints to host memory; add --partition-activations");
}

PartitionedCheckpoints::PartitionedCheckpoints(const ZeroRConfig& cfg, Communicator& tp, std::shared_ptr<Device> device,
                                               std::shared_ptr<Device> host, int num_layers)
    : cfg_(cfg), tp_(tp), device_(std::move(device)), host_(std::move(host)), num_layers_(num_layers) {
  MZ_CHECK(!cfg_.cpu_checkpointing || host_, "Pa+cpu needs a host device");
  saved_.resize(static_cast<std::size_t>(num_layers));
}

PartitionedCheckpoints::~PartitionedCheckpoints() {
  try {
    retire();
  } catch (...) {  // a destructor does not throw; a failed transfer has shown up in a step already
  }
}

// Offloads (device -> host): device work issued from now on waits for the
// copy, so memory it frees and reuses is never read by the copy. Restores
// (host -> device): the host waits for the copy (done long ago: the gather
// after it already waited on the device) before the host slice can be freed.
void PartitionedCheckpoints::retire() {
  for (Pending& p : pending_) {
    if (!p.transfer) continue;  // a dry run's: nothing was copied
    if (p.device_side.defined()) device_->queue_after(*p.transfer);
    if (p.host_side.defined()) device_->wait(*p.transfer);
  }
  pending_.clear();
}

// MD: one arena of num_layers slots, (re)reserved only when the checkpoint
// size grows; a smaller micro-batch uses the front of each slot.
void PartitionedCheckpoints::ensure_arena(std::int64_t chunk, DType dtype) {
  if (arena_.defined() && chunk <= arena_chunk_ && arena_.dtype() == dtype) return;
  arena_ = Tensor();  // release first: the old and new arena never coexist
  const auto& dev = cfg_.cpu_checkpointing ? host_ : device_;
  arena_ = Tensor::empty(dev, {num_layers_ * chunk}, dtype, MemoryCategory::ActivationCheckpoints, "checkpoint-arena");
  arena_chunk_ = chunk;
  stats_.arena_bytes = static_cast<std::int64_t>(arena_.nbytes());
}

void PartitionedCheckpoints::reserve(std::int64_t elements, DType dtype) {
  if (!cfg_.contiguous_memory) return;
  const int parts = cfg_.partitions(tp_.size());
  ensure_arena((elements + parts - 1) / parts, dtype);
}

void PartitionedCheckpoints::save(int layer, const Tensor& x) {
  MZ_CHECK(layer >= 0 && layer < num_layers_, "checkpoint of layer ", layer);
  retire();
  Saved& s = saved_[static_cast<std::size_t>(layer)];
  const std::int64_t n = x.numel();
  const int parts = cfg_.partitions(tp_.size());
  const std::int64_t chunk = (n + parts - 1) / parts;
  s.counts.assign(static_cast<std::size_t>(parts), 0);
  for (int r = 0; r < parts; ++r)
    s.counts[static_cast<std::size_t>(r)] = std::max<std::int64_t>(0, std::min(n, (r + 1) * chunk) - r * chunk);
  const int me = parts > 1 ? tp_.rank() : 0;
  const std::int64_t begin = std::min(n, me * chunk), len = s.counts[static_cast<std::size_t>(me)];
  Tensor dst;
  if (cfg_.contiguous_memory) {
    ensure_arena(chunk, x.dtype());
    ++stats_.arena_fills;
    dst = arena_.narrow(0, layer * arena_chunk_, len);
  } else {
    const auto& dev = cfg_.cpu_checkpointing ? host_ : device_;
    dst = Tensor::empty(dev, {len}, x.dtype(), MemoryCategory::ActivationCheckpoints, "checkpoint-slice");
  }
  const Tensor src = x.flatten().narrow(0, begin, len);
  if (cfg_.cpu_checkpointing) {
    // Queued behind the layer's producer on the device's side stream: the
    // host goes on, and the GPU computes while the slice crosses to the host.
    // (A dry run keeps the same tensors alive as long, without the copy: the plan's lifetimes are the run's.)
    if (len > 0)
      pending_.push_back(
          {x.device().has_storage() ? device_->copy_to_host_queued(dst.data(), src.data(), dst.nbytes()) : nullptr, src,
           Tensor()});
    stats_.host_copies_bytes += static_cast<std::int64_t>(dst.nbytes());
  } else {
    dst.copy_from(src);
  }
  s.shape = x.shape();
  s.slice = dst;
  s.present = true;
}

Tensor PartitionedCheckpoints::restore(int layer) {
  Saved& s = saved_[static_cast<std::size_t>(layer)];
  MZ_CHECK(s.present, "layer ", layer, ": backward before forward");
  retire();
  Tensor full = Tensor::empty(device_, s.shape, s.slice.dtype(), MemoryCategory::Activations);
  Tensor part = s.slice;
  if (cfg_.cpu_checkpointing) {  // back from host memory, queued; the gather below waits for it on the device
    part = Tensor::empty(device_, s.slice.shape(), s.slice.dtype(), MemoryCategory::Activations);
    if (part.numel() > 0) {
      std::shared_ptr<Device::Transfer> t;
      if (part.device().has_storage()) {
        t = device_->copy_from_host_queued(part.data(), s.slice.data(), part.nbytes());
        device_->queue_after(*t);
      }
      pending_.push_back({std::move(t), Tensor(), s.slice});
    }
    stats_.host_copies_bytes += static_cast<std::int64_t>(part.nbytes());
  }
  if (s.counts.size() > 1) {
    tp_.all_gather(part, full.flatten(), s.counts).wait();
    stats_.gathered_elements += full.numel();
  } else {
    full.flatten().copy_from(part);
  }
  s.slice = Tensor();  // the arena slot stays reserved; a separate slice is freed
  s.present = false;
  return full;
}

}  // namespace megazero::zero
