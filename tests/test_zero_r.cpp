// ZeRO-R's activation checkpoints (Pa, Pa+cpu, MD) on real MPI ranks:
//  - losses, gradient norms and final weights are bit-identical with and
//    without each policy (the slices all-gather back to the same bits);
//  - checkpoint memory per rank falls by the TP degree with Pa, measured with
//    the memory counters, and lives in host memory under Pa+cpu;
//  - Pa's extra communication is one all-gather of batch x seq x hidden per
//    layer per micro-batch (the paper's analysis).
#include <gtest/gtest.h>

#include <cstdio>

#include "megazero/core/error.h"
#include "zero_harness.h"

using namespace megazero;
using namespace megazero::testing_util;

namespace {

MpiCommunicator& world() { return test_world(); }

std::int64_t peak(const std::shared_ptr<Device>& d, MemoryCategory c) {
  return d->memory().snapshot().by_category[static_cast<std::size_t>(c)].peak_bytes;
}

ZeroRunSpec spec_for(int tp, int dp, zero::ZeroRConfig zr) {
  ZeroRunSpec s;
  s.tp = tp;
  s.dp = dp;
  s.stage = 2;
  s.recompute = true;
  s.micro_batch = 2;  // two micro-batches per rank at DP 2
  s.hidden = 64;
  s.zero_r = zr;
  return s;
}

struct Outcome {
  std::vector<double> losses, norms, master;
  std::int64_t ckpt_peak = 0, host_ckpt_peak = 0, tp_gathered = 0, micro_batches = 0, grad_arena_fills = 0;
  std::int64_t prefetched = 0;
  std::vector<std::int64_t> host_waits;  // per step
  bool device_host_accessible = true, device_is_gpu = false;
  std::int64_t micro_batches_per_step = 1;
};

Outcome run(const ZeroRunSpec& spec) {
  ZeroRun r(world(), spec);
  r.tp->reset_stats();
  Outcome o;
  o.losses = r.train();
  for (const auto& res : r.results) o.norms.push_back(res.stats.grad_norm);
  o.master = r.engine->master().to_double_vector();
  o.ckpt_peak = peak(r.device, MemoryCategory::ActivationCheckpoints);
  o.host_ckpt_peak = peak(r.host, MemoryCategory::ActivationCheckpoints);
  o.tp_gathered = r.tp->stats()[CollectiveType::AllGather].elements;
  const std::int64_t dp = spec.dp;
  o.micro_batches = r.spec.steps * (r.spec.global_batch / dp / r.spec.micro_batch);
  o.grad_arena_fills = r.engine->gradient_arena_fills();
  if (r.checkpoints) o.prefetched = r.checkpoints->stats().prefetched;
  for (const auto& res : r.results) o.host_waits.push_back(res.host_waits);
  o.device_host_accessible = r.device->host_accessible();
  o.device_is_gpu = r.device->kind() == DeviceKind::CUDA;
  o.micro_batches_per_step = r.spec.global_batch / dp / r.spec.micro_batch;
  return o;
}

Outcome run(int tp, int dp, zero::ZeroRConfig zr) { return run(spec_for(tp, dp, zr)); }

}  // namespace

TEST(ZeroR, EveryPolicyTrainsBitIdenticallyAndShrinksCheckpointsByTp) {
  for (auto [tp, dp] : {std::pair{2, 2}, std::pair{4, 1}, std::pair{2, 1}}) {
    if (tp * dp != world().size()) continue;
    SCOPED_TRACE(testing::Message() << "TP " << tp << " DP " << dp);
    zero::ZeroRConfig md;
    md.contiguous_memory = true;
    const Outcome base = run(tp, dp, {});
    const Outcome whole_md = run(tp, dp, md);
    const auto cfg = zero_test_model(true, 64);
    const std::int64_t S = cfg.seq_length, H = cfg.hidden_size, L = cfg.num_layers;
    const std::int64_t B = spec_for(tp, dp, {}).micro_batch, n = B * S * H;
    // MD alone: every layer's whole input in the arena.
    EXPECT_EQ(whole_md.ckpt_peak, L * n * 4);
    for (int mask = 1; mask < 8; ++mask) {
      zero::ZeroRConfig zr;
      zr.partition_activations = mask & 1;
      zr.cpu_checkpointing = (mask & 2) && zr.partition_activations;
      zr.contiguous_memory = mask & 4;
      if ((mask & 2) && !zr.partition_activations) continue;
      SCOPED_TRACE(testing::Message() << "Pa " << zr.partition_activations << " cpu " << zr.cpu_checkpointing << " MD "
                                      << zr.contiguous_memory);
      const Outcome o = run(tp, dp, zr);
      EXPECT_EQ(o.losses, base.losses);
      EXPECT_EQ(o.norms, base.norms);
      EXPECT_EQ(o.master, base.master);
      const std::int64_t slice = (n + tp - 1) / tp;
      const std::int64_t expect = L * (zr.partition_activations ? slice : n) * 4;
      // Device memory of checkpoints falls by TP with Pa; Pa+cpu moves it to host.
      EXPECT_EQ(o.ckpt_peak, zr.cpu_checkpointing ? 0 : expect);
      EXPECT_EQ(o.host_ckpt_peak, zr.cpu_checkpointing ? expect : 0);
      if (zr.partition_activations && !zr.cpu_checkpointing && zr.contiguous_memory) {
        EXPECT_EQ(whole_md.ckpt_peak, o.ckpt_peak * tp) << "Pa divides checkpoint memory by the TP degree";
      }
      // MD: every group's transient gradients came from the reserved arena
      // (embedding, 2 layers, final LayerNorm: 4 groups per micro-batch).
      EXPECT_EQ(o.grad_arena_fills, zr.contiguous_memory ? o.micro_batches * 4 : 0);
      // Pa+cpu: every restore was queued before it was asked for (each
      // backward's first once the logits' gradient is made, overlapping the
      // final norm's backward; the others one layer early, overlapping that
      // layer's recompute and backward); the losses above show each was
      // ordered before its gather (the isolated device lands a copy only at
      // its ordering).
      EXPECT_EQ(o.prefetched, zr.cpu_checkpointing ? o.micro_batches * L : 0);
      // One all-gather of B x S x H per layer per micro-batch, nothing else.
      EXPECT_EQ(o.tp_gathered - base.tp_gathered, zr.partition_activations ? o.micro_batches * L * n : 0);
      // Host waits per step on a device the host cannot read (cpu-isolated; a
      // GPU): the grad norm and the loss, whatever the policy — Pa+cpu's
      // copies to and from the host are queued behind the compute (on a GPU a
      // side stream ordered by events), so the host never drains the queue
      // for them. (The isolated device defers each queued copy to the first
      // wait on it, so an ordering left out shows in the losses above.)
      // On a GPU, Pa+cpu may add one a micro-batch boundary: the next
      // forward's first save waits for the previous backward's restores
      // before their host slices go (counted only if the last copy, queued
      // behind all but the last layer's backward, has not ended; the GPU
      // still has that layer queued meanwhile).
      if (!o.device_host_accessible) {
        const std::int64_t most = 2 + (o.device_is_gpu && zr.cpu_checkpointing ? o.micro_batches_per_step - 1 : 0);
        for (std::int64_t w : o.host_waits) {
          EXPECT_GE(w, 2);
          EXPECT_LE(w, most);
        }
      }
    }
  }
}

// Two ways to keep one layer input of the 2 layers' two, each the same bits
// as recomputing each layer from its own input (on stages 2 and 3, with MD
// and with Pa+cpu+MD): --recompute-method block --recompute-num-layers 1
// (only the first layer recomputes; the second keeps its activations) and
// --recompute-method uniform --recompute-num-layers 2 (both recompute from
// the first's input). Checkpoint memory (whole, Pa's slice, or in host
// memory) and Pa's all-gathers are one layer's; the one restore was queued
// while the layers above ran their backward.
TEST(ZeroR, BlockAndChunkedRecomputeKeepOneInput) {
  for (auto [tp, dp] : {std::pair{2, 2}, std::pair{4, 1}, std::pair{2, 1}}) {
    if (tp * dp != world().size()) continue;
    SCOPED_TRACE(testing::Message() << "TP " << tp << " DP " << dp);
    const Outcome full = run(tp, dp, {});
    const auto cfg = zero_test_model(true, 64);
    ASSERT_EQ(cfg.num_layers, 2);
    const std::int64_t n = spec_for(tp, dp, {}).micro_batch * cfg.seq_length * cfg.hidden_size;
    zero::ZeroRConfig md, pa_cpu_md;
    md.contiguous_memory = true;
    pa_cpu_md.partition_activations = pa_cpu_md.cpu_checkpointing = pa_cpu_md.contiguous_memory = true;
    for (const bool chunked : {false, true})
      for (const zero::ZeroRConfig& zr : {md, pa_cpu_md})
        for (const int stage : {2, 3}) {
          SCOPED_TRACE(testing::Message() << (chunked ? "uniform 2" : "block 1") << ", "
                                          << (zr.partition_activations ? "Pa+cpu MD" : "MD") << ", stage " << stage);
          ZeroRunSpec s = spec_for(tp, dp, zr);
          if (chunked)
            s.recompute_chunk = 2;
          else
            s.recompute_first_layers = 1;
          s.stage = stage;
          const Outcome o = run(s);
          EXPECT_EQ(o.losses, full.losses);
          EXPECT_EQ(o.norms, full.norms);
          EXPECT_EQ(o.master, full.master);
          const std::int64_t one = (zr.partition_activations ? (n + tp - 1) / tp : n) * 4;
          EXPECT_EQ(o.ckpt_peak, zr.cpu_checkpointing ? 0 : one);
          EXPECT_EQ(o.host_ckpt_peak, zr.cpu_checkpointing ? one : 0);
          EXPECT_EQ(o.tp_gathered - full.tp_gathered, zr.partition_activations ? o.micro_batches * n : 0);
          EXPECT_EQ(o.prefetched, zr.cpu_checkpointing ? o.micro_batches : 0);
        }
  }
}

TEST(ZeroR, FlagsNeedTheirPrerequisites) {
  zero::ZeroRConfig pa;
  pa.partition_activations = true;
  EXPECT_THROW(pa.validate(false), ConfigError);
  EXPECT_NO_THROW(pa.validate(true));
  zero::ZeroRConfig cpu;
  cpu.cpu_checkpointing = true;
  EXPECT_THROW(cpu.validate(true), ConfigError);
  zero::ZeroRConfig md;
  md.contiguous_memory = true;
  EXPECT_THROW(md.validate(false), ConfigError);
}
