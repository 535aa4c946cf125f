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
    drop_prefetch();
    retire(/*host_sides=*/true);
  } catch (...) {  // a destructor does not throw; a failed transfer has shown up in a step already
  }
}

// Offloads (device -> host): device work issued from now on waits for the
// copy, so memory it frees and reuses is never read by the copy. Restores
// (host -> device) were ordered before the gather that reads them; their
// host slices wait for `host_sides` (the next forward's first save): the
// host then waits for copies that ended long ago, instead of for the copy
// one layer back in backward, which held the host within a layer of the GPU.
void PartitionedCheckpoints::retire(bool host_sides) {
  std::vector<Pending> keep;
  for (Pending& p : pending_) {
    if (p.host_side.defined() && !host_sides) {
      keep.push_back(std::move(p));
      continue;
    }
    if (!p.transfer) continue;  // a dry run's: nothing was copied, the tensors released as a run's are
    if (p.device_side.defined()) device_->queue_after(*p.transfer);
    if (p.host_side.defined()) device_->wait(*p.transfer);
  }
  pending_ = std::move(keep);
}

PartitionedCheckpoints::Fetch PartitionedCheckpoints::fetch(int layer) {
  const Saved& s = saved_[static_cast<std::size_t>(layer)];
  Fetch f;
  f.layer = layer;
  f.host_side = s.slice;
  f.part = Tensor::empty(device_, s.slice.shape(), s.slice.dtype(), MemoryCategory::Activations, "checkpoint-fetch");
  if (f.part.numel() > 0 && f.part.device().has_storage())
    f.transfer = device_->copy_from_host_queued(f.part.data(), s.slice.data(), f.part.nbytes());
  stats_.host_copies_bytes += static_cast<std::int64_t>(f.part.nbytes());
  return f;
}

void PartitionedCheckpoints::drop_prefetch() {
  if (prefetch_.layer < 0) return;
  // The device tensor's stream-ordered free must follow the copy into it.
  if (prefetch_.transfer) device_->queue_after(*prefetch_.transfer);
  pending_.push_back({prefetch_.transfer, Tensor(), prefetch_.host_side});
  prefetch_ = Fetch();
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
  drop_prefetch();
  retire(/*host_sides=*/true);
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

void PartitionedCheckpoints::prefetch(int layer) {
  MZ_CHECK(layer >= 0 && layer < num_layers_, "prefetch of layer ", layer);
  if (!cfg_.cpu_checkpointing || prefetch_.layer == layer || !saved_[static_cast<std::size_t>(layer)].present) return;
  drop_prefetch();
  prefetch_ = fetch(layer);
}

Tensor PartitionedCheckpoints::restore(int layer) {
  MZ_CHECK(layer >= 0 && layer < num_layers_, "restore of layer ", layer);
  Saved& s = saved_[static_cast<std::size_t>(layer)];
  MZ_CHECK(s.present, "layer ", layer, ": backward before forward");
  retire(/*host_sides=*/false);
  Tensor full = Tensor::empty(device_, s.shape, s.slice.dtype(), MemoryCategory::Activations);
  Tensor part = s.slice;
  if (cfg_.cpu_checkpointing) {
    // Back from host memory, queued: usually the prefetch the previous
    // restore issued, so the copy ran while that layer computed.
    Fetch f;
    if (prefetch_.layer == layer) {
      f = std::move(prefetch_);
      prefetch_ = Fetch();
      ++stats_.prefetched;
    } else {
      drop_prefetch();
      f = fetch(layer);
    }
    if (f.transfer) device_->queue_after(*f.transfer);  // the gather below waits for it on the device
    pending_.push_back({f.transfer, Tensor(), f.host_side});
    part = f.part;
    // Backward restores layers top down: queue the next one's copy now,
    // behind the work issued so far, so it overlaps this layer's recompute
    // and backward (one slice more on the device meanwhile, planned too).
    for (int next = layer - 1; next >= 0; --next) {
      if (!saved_[static_cast<std::size_t>(next)].present) continue;
      prefetch_ = fetch(next);
      break;
    }
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
