// ZeRO stages 0-3 on every (TP, DP) layout the launched world allows train
// exactly like plain data parallelism on one rank: same losses (1e-5 relative)
// and same final weights, with gradient accumulation, clipping, dropout and
// recompute, and the same gradient and parameter norms; communication
// volumes per step match the paper's (2 Psi for stages 0-2, 3 Psi for stage
// 3, per DP rank).
#include <gtest/gtest.h>

#include <cmath>

#include "megazero/comm/consensus.h"
#include "megazero/core/error.h"
#include "test_device.h"
#include "zero_harness.h"

using namespace megazero;
using namespace megazero::testing_util;

namespace {

struct Ref {
  std::vector<double> losses;
  std::unique_ptr<ZeroRun> run;
};

MpiCommunicator& world() { return test_world(); }

Ref reference(const ZeroRunSpec& like) {
  auto self = world().split(world().rank(), 0, "self");
  ZeroRunSpec s = like;
  s.tp = s.dp = 1;
  s.stage = 0;
  Ref r;
  r.run = std::make_unique<ZeroRun>(*self, s);
  r.losses = r.run->train();
  return r;
}

void expect_same_training(const ZeroRunSpec& spec) {
  SCOPED_TRACE(testing::Message() << "TP " << spec.tp << " DP " << spec.dp << " stage " << spec.stage << " micro "
                                  << spec.micro_batch << (spec.recompute ? " recompute" : "")
                                  << (spec.overlap ? "" : " no-overlap"));
  ZeroRun run(world(), spec);
  const auto losses = run.train();
  const Ref ref = reference(spec);
  ASSERT_EQ(losses.size(), ref.losses.size());
  bool clipped = false;
  for (std::size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i], ref.losses[i], 1e-5 * std::fabs(ref.losses[i])) << "step " << i;
    // The global gradient norm: every DP partition and TP shard, TP-replicated
    // parameters counted once, equals the one-rank norm.
    const double gn = run.results[i].stats.grad_norm, rn = ref.run->results[i].stats.grad_norm;
    EXPECT_NEAR(gn, rn, 1e-5 * rn) << "grad norm, step " << i;
    clipped = clipped || run.results[i].stats.clip_coef < 1.0;
  }
  EXPECT_TRUE(clipped) << "the test's clip threshold should clip at least one step";
  double num = 0, den = 0;
  run.for_each_owned([&](const layers::Parameter& p, std::int64_t g, double v) {
    const std::int64_t row = p.global_shape.size() > 1 ? shape_numel(p.global_shape) / p.global_shape[0] : 1;
    if (p.padding_from_row >= 0 && g / row >= p.padding_from_row) {
      EXPECT_EQ(v, 0.0) << p.name << " padding";
      return;
    }
    const double r = ref.run->master_at(p.name, g);
    num += (v - r) * (v - r);
    den += r * r;
  });
  EXPECT_LE(std::sqrt(num / std::max(den, 1e-30)), 1e-5) << "final weights";
  EXPECT_FALSE(run.results.back().stats.skipped);
  // The params norm (--log-params-norm): every DP partition and TP shard,
  // TP-replicated parameters counted once, is the one-rank master's norm,
  // which is the direct sum over its weights.
  double squares = 0;
  ref.run->for_each_owned([&](const layers::Parameter&, std::int64_t, double v) { squares += v * v; });
  const double one_rank = ref.run->engine->params_norm();
  EXPECT_NEAR(one_rank, std::sqrt(squares), 1e-12 * one_rank) << "params norm on one rank";
  EXPECT_NEAR(run.engine->params_norm(), one_rank, 1e-5 * one_rank) << "params norm";
  // The zeros in the last step's gradients (--log-num-zeros-in-grad), over
  // the whole model: exactly the zeros of every rank's own partition counted
  // here (TP-replicated parameters on TP rank 0 only) ...
  const std::int64_t zeros = run.engine->grad_zeros();
  {
    const auto g = run.engine->partition_grads().to_double_vector();
    const auto part = run.engine->partition();
    const auto all = run.params->all();
    double mine = 0;
    for (std::size_t i = 0; i < all.size(); ++i) {
      if (all[i]->tp_replicated() && run.tp->rank() != 0) continue;
      const auto r = run.engine->layout().param(i).intersect(part);
      for (auto f = r.begin; f < r.end; ++f) mine += g[static_cast<std::size_t>(f - part.begin)] == 0;
    }
    EXPECT_EQ(zeros, std::llround(all_reduce_value(world(), mine, ReduceOp::Sum))) << "zeros in the grad, by hand";
  }
  // ... and the one-rank model's, counted parameter by parameter: the word
  // embedding's rows of the tokens the last batch did not hold and its padding
  // rows (a TP layout pads the vocabulary to a multiple of 128 x TP: more
  // zeros). The keys' bias is the exception: its gradient is zero in exact
  // arithmetic (softmax ignores a constant added to a row of scores), so its
  // rounding noise is exactly zero in some reduction orders and not in
  // others; those elements (|g| below 1e-6 of the largest of their parameter)
  // may count on either side.
  std::int64_t direct = 0, either = 0;
  for (const auto* p : ref.run->params->all()) {
    const auto g = p->grad.to_double_vector();
    double largest = 0;
    for (double v : g) largest = std::max(largest, std::fabs(v));
    for (double v : g) {
      direct += v == 0;
      either += p->name.find("qkv.bias") != std::string::npos && std::fabs(v) < 1e-6 * largest;
    }
  }
  EXPECT_GT(direct, 0) << "the test's batch should leave some token rows unused";
  EXPECT_EQ(ref.run->engine->grad_zeros(), direct) << "zeros in the grad on one rank";
  std::int64_t extra_padding = 0;
  for (const auto* p : run.params->all())
    if (p->padding_from_row >= 0)
      for (const auto* q : ref.run->params->all())
        if (q->name == p->name) extra_padding += shape_numel(p->global_shape) - shape_numel(q->global_shape);
  EXPECT_LE(std::abs(zeros - (direct + extra_padding)), either) << "zeros in the grad against one rank's";
}

std::vector<std::pair<int, int>> layouts_for(int world) {
  const std::pair<int, int> all[] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}, {1, 4}, {4, 1}, {2, 4}, {4, 2}};
  std::vector<std::pair<int, int>> out;
  for (auto l : all)
    if (l.first * l.second == world) out.push_back(l);
  return out;
}

}  // namespace

TEST(Zero, EveryStageOnEveryLayoutTrainsLikeOneRank) {
  for (auto [tp, dp] : layouts_for(world().size()))
    for (int stage = 0; stage <= 3; ++stage) {
      ZeroRunSpec s;
      s.tp = tp;
      s.dp = dp;
      s.stage = stage;
      expect_same_training(s);
    }
}

// The Llama-style model (its own output layer: one more parameter group, used
// in forward after the final norm and first in backward) on every stage and
// layout, with and without contiguous gradients (MD) and recompute.
TEST(Zero, LlamaStyleModelOnEveryStageAndLayoutTrainsLikeOneRank) {
  for (auto [tp, dp] : layouts_for(world().size()))
    for (int stage = 0; stage <= 3; ++stage) {
      ZeroRunSpec s;
      s.tp = tp;
      s.dp = dp;
      s.stage = stage;
      s.llama = true;
      s.recompute = stage >= 2;
      s.zero_r.contiguous_memory = stage == 3;
      expect_same_training(s);
    }
}

// Sequence parallelism on every stage and layout, with recompute and the
// ZeRO-R store: Pa keeps each rank's own rows (nothing left to partition),
// Pa+cpu moves them to host memory, MD places them in the arena.
TEST(Zero, SequenceParallelOnEveryStageAndLayoutTrainsLikeOneRank) {
  for (auto [tp, dp] : layouts_for(world().size()))
    for (int stage = 0; stage <= 3; ++stage) {
      ZeroRunSpec s;
      s.tp = tp;
      s.dp = dp;
      s.stage = stage;
      s.sequence_parallel = true;
      s.llama = stage % 2 == 1;
      s.recompute = stage >= 1;
      s.zero_r.partition_activations = stage >= 2;
      s.zero_r.cpu_checkpointing = stage == 3;
      s.zero_r.contiguous_memory = stage >= 1;
      expect_same_training(s);
    }
}

TEST(Zero, AccumulationRecomputeAndNoOverlap) {
  for (auto [tp, dp] : layouts_for(world().size()))
    for (int stage : {1, 2, 3}) {
      ZeroRunSpec s;
      s.tp = tp;
      s.dp = dp;
      s.stage = stage;
      s.micro_batch = 1;  // several micro-batches per rank
      s.recompute = true;
      s.overlap = stage != 2;
      expect_same_training(s);
    }
}

// Regression: with several micro-batches and few large buckets, a bucket's
// reduce-scatter from one micro-batch was still in flight when the next
// micro-batch staged new gradients into the same slot (a race: wrong and
// run-to-run different results). Every bucket size from "one bucket holds the
// model" down must train like one rank, and bit-identically when repeated.
TEST(Zero, AccumulationWithFewLargeBucketsIsCorrectAndDeterministic) {
  bool repeated = false;
  for (auto [tp, dp] : layouts_for(world().size()))
    for (int stage : {2, 3}) {
      ZeroRunSpec s;
      s.tp = tp;
      s.dp = dp;
      s.stage = stage;
      s.micro_batch = 1;
      s.bucket = std::int64_t{1} << 30;  // one bucket holds the whole model
      expect_same_training(s);
      if (dp > 1 && !repeated) {  // bit-identical when repeated (once per world: runs are slow oversubscribed)
        repeated = true;
        ZeroRun a(world(), s), b(world(), s);
        EXPECT_EQ(a.train(), b.train()) << "two identical runs differ";
      }
    }
}

// zero_grad leaves the gradients a GEMM writes first (the linear layers'
// weights, layers/parameter.h) as they are, and that GEMM overwrites them:
// gradients poisoned with NaN before training give the same bits as a run
// that zeroes every gradient and adds into it, with 4 micro-batches accumulated, at stages 0 and 1 (one flat buffer
// cleared once a step) and 2 and 3 (a group buffer a micro-batch, reused
// across groups, so it holds another group's gradients).
TEST(Zero, GradientsAGemmWritesFirstNeedNoZeroing) {
  auto self = world().split(world().rank(), 0, "self");
  for (DType dtype : {DType::F32, DType::BF16})  // BLAS's beta 0, and the 16-bit paths' (oneDNN, widened)
    for (int stage : {0, 1, 2, 3}) {
      SCOPED_TRACE(testing::Message() << "stage " << stage << " " << dtype_name(dtype));
      ZeroRunSpec s;
      s.dtype = dtype;
      s.stage = stage;
      s.micro_batch = 2;  // of a global batch of 8: 4 micro-batches
      s.steps = 2;
      ZeroRun clean(*self, s), poisoned(*self, s);
      for (auto* p : clean.params->all()) p->grad_overwritable = false;  // the reference: every gradient zeroed
      int overwritable = 0, cleared = 0;
      for (auto* p : poisoned.params->all()) {
        (p->grad_overwritable ? overwritable : cleared)++;
        if (p->grad_overwritable) {
          EXPECT_EQ(p->name.substr(p->name.size() - 7), ".weight") << p->name;
        }
        if (p->grad.defined())  // stages 0 and 1 bind every gradient at once
          p->grad.copy_from_doubles(std::vector<double>(static_cast<std::size_t>(p->local_numel()), std::nan("")));
      }
      EXPECT_GT(overwritable, 0);
      EXPECT_GT(cleared, 0) << "biases and norms are cleared";
      const auto want = clean.train(), got = poisoned.train();
      for (double l : got) EXPECT_TRUE(std::isfinite(l));
      EXPECT_EQ(got, want);
    }
}

// A gradient flagged unset (zero_grad left it, no GEMM wrote it yet):
// take_grad_beta hands the first writer 0 and every later one 1; settle_grad
// zeroes one nothing wrote; zero_grad of a ParameterSet clears all others.
TEST(Zero, UnsetGradientsAreOverwrittenOnceOrSettledToZero) {
  layers::ParameterSet ps;
  auto& w = ps.add("w", {3, 4}, -1, 0, 1, layers::Init::Normal, 0.02);
  auto& b = ps.add("b", {4}, -1, 0, 1, layers::Init::Zeros);
  auto& u = ps.add("u", {5}, -1, 0, 1, layers::Init::Normal, 0.02);
  w.grad_overwritable = u.grad_overwritable = true;
  ps.allocate(make_device(DeviceKind::CPU), DType::F32);
  Tensor flat = ps.flat_grads();  // a view of the same storage
  flat.copy_from_doubles(std::vector<double>(21, 7.0));
  ps.zero_grad();
  EXPECT_TRUE(w.grad_unset && u.grad_unset && !b.grad_unset);
  for (double v : b.grad.to_double_vector()) EXPECT_EQ(v, 0.0);
  for (double v : w.grad.to_double_vector()) EXPECT_EQ(v, 7.0) << "left for its GEMM to overwrite";
  EXPECT_EQ(layers::take_grad_beta(w), 0.0f);
  EXPECT_EQ(layers::take_grad_beta(w), 1.0f);
  EXPECT_EQ(layers::take_grad_beta(b), 1.0f);
  layers::settle_grad(u);
  EXPECT_FALSE(u.grad_unset);
  for (double v : u.grad.to_double_vector()) EXPECT_EQ(v, 0.0);
}

// Stage 3's prefetch changes when a group is gathered, never what is
// computed: without it (--stage3-prefetch false) training gives the same bits
// and no gather is issued ahead; with it, every step after the first (which
// records the order) gathers ahead.
TEST(Zero, Stage3WithoutPrefetchTrainsTheSameBitsAndGathersNothingAhead) {
  for (auto [tp, dp] : layouts_for(world().size())) {
    if (dp < 2) continue;
    ZeroRunSpec s;
    s.tp = tp;
    s.dp = dp;
    s.stage = 3;
    s.steps = 3;
    ZeroRun with(world(), s);
    s.prefetch = false;
    ZeroRun without(world(), s);
    EXPECT_EQ(without.train(), with.train()) << "TP " << tp << " DP " << dp;
    EXPECT_EQ(without.engine->prefetched_gathers(), 0);
    EXPECT_GT(with.engine->prefetched_gathers(), 0);
  }
}

// Evaluation between steps at stage 3 (forward passes only): no group is
// gathered ahead along the training order (which continues with a backward
// evaluation never runs), none is left gathered afterwards, and training goes
// on exactly as without the evaluation.
TEST(Zero, EvaluationAtStage3LeavesNothingGatheredAndChangesNoStep) {
  for (auto [tp, dp] : layouts_for(world().size())) {
    if (dp < 2) continue;
    ZeroRunSpec s;
    s.tp = tp;
    s.dp = dp;
    s.stage = 3;
    s.steps = 3;
    ZeroRun plain(world(), s), evaluated(world(), s);
    const auto want = plain.train();
    std::vector<double> got = evaluated.train(0, 1);
    EXPECT_EQ(evaluated.engine->gathered_bytes(), 0) << "after a step";
    evaluated.engine->set_evaluating(true);
    const auto cfg = evaluated.model->config();
    layers::StepInfo step;
    step.training = false;
    step.micro_batch = 1;
    step.seq = cfg.seq_length;
    const std::int64_t n = step.seq;
    Tensor ids =
        test_support::int64_tensor(evaluated.device, n, [&](std::int64_t i) { return (i * 7 + 3) % cfg.vocab_size; });
    for (int pass = 0; pass < 2; ++pass) {
      const double loss = evaluated.model->forward(ids, ids, step);
      EXPECT_TRUE(std::isfinite(loss));
      EXPECT_EQ(evaluated.engine->gathered_bytes(), 0) << "a group gathered ahead during evaluation, pass " << pass;
    }
    evaluated.engine->set_evaluating(false);
    const auto rest = evaluated.train(1, 2);
    got.insert(got.end(), rest.begin(), rest.end());
    EXPECT_EQ(got, want) << "TP " << tp << " DP " << dp;
  }
}

// Stages 1-2 leave the step's all-gather of the updated parameters in flight,
// in runs of whole groups, and each forward waits for its group's run. Over a
// DP group whose collectives run only when waited for, a forward that read a
// group before its wait would compute with the last step's parameters: the
// same bits as gathering at the end of the step prove every wait is in place.
TEST(Zero, ParameterGatherOverlapsTheNextForwardWithTheSameBits) {
  for (auto [tp, dp] : layouts_for(world().size())) {
    if (dp < 2) continue;
    for (int stage : {1, 2}) {
      SCOPED_TRACE(testing::Message() << "TP " << tp << " DP " << dp << " stage " << stage);
      ZeroRunSpec s;
      s.tp = tp;
      s.dp = dp;
      s.stage = stage;
      s.steps = 3;
      s.overlap_param_gather = false;
      ZeroRun at_step_end(world(), s);
      const auto want = at_step_end.train();
      EXPECT_EQ(at_step_end.engine->step_runs(), 1u);
      EXPECT_EQ(at_step_end.engine->step_runs_in_flight(), 0u);
      s.overlap_param_gather = true;
      s.deferred_dp = true;
      ZeroRun overlapped(world(), s);
      EXPECT_EQ(overlapped.train(), want);
      // Several runs (the test's buckets hold 1000 elements), all still in flight after the step.
      const auto runs = overlapped.engine->step_runs();
      EXPECT_GT(runs, 2u);
      EXPECT_EQ(overlapped.engine->step_runs_in_flight(), runs);
      overlapped.engine->finish_step();
      EXPECT_EQ(overlapped.engine->step_runs_in_flight(), 0u);
      // The next step trains the same bits too (the first forward waited run by run).
      const auto more_want = at_step_end.train(3, 1), more = overlapped.train(3, 1);
      EXPECT_EQ(more, more_want);
    }
  }
}

// Stage 0 with --overlap-optimizer: AdamW runs run by run of groups, queued
// beside the compute, and each group's next forward waits for its own run. On
// the isolated device (the cpu_isolated runs of this suite) queued work runs
// only when something waits for it, so a forward that read a group before its
// wait, or a gradient cleared under the update, would train other bits; on
// the CPU the work runs as queued and this checks the split update's bits.
TEST(Zero, OptimizerBesideTheNextForwardTrainsTheSameBits) {
  for (auto [tp, dp] : layouts_for(world().size())) {
    SCOPED_TRACE(testing::Message() << "TP " << tp << " DP " << dp);
    ZeroRunSpec s;
    s.tp = tp;
    s.dp = dp;
    s.stage = 0;
    s.steps = 3;
    s.micro_batch = 1;  // accumulation: the gradients' clear waits for the update
    ZeroRun at_step_end(world(), s);
    const auto want = at_step_end.train();
    EXPECT_EQ(at_step_end.engine->step_runs(), 0u);
    s.overlap_optimizer = true;
    ZeroRun beside(world(), s);
    EXPECT_EQ(beside.train(), want);
    const auto runs = beside.engine->step_runs();
    EXPECT_GT(runs, 2u);
    EXPECT_EQ(beside.engine->step_runs_in_flight(), runs) << "the last update is left to the next forward";
    // The optimizer states as a checkpoint reads them: every run waited for first.
    const auto st = beside.engine->owned_state();
    const auto ref = at_step_end.engine->owned_state();
    EXPECT_EQ(beside.engine->step_runs_in_flight(), 0u);
    EXPECT_EQ(st.exp_avg_sq.to_double_vector(), ref.exp_avg_sq.to_double_vector());
    EXPECT_EQ(beside.train(3, 1), at_step_end.train(3, 1));
  }
}

TEST(Zero, OverlapOptimizerIsRefusedBeyondStage0) {
  for (int stage = 1; stage <= 3; ++stage) {
    zero::ZeroConfig c;
    c.stage = stage;
    c.overlap_optimizer = true;
    try {
      c.validate();
      ADD_FAILURE() << "stage " << stage << " accepted --overlap-optimizer";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--overlap-optimizer is for --zero-stage 0"), std::string::npos) << e.what();
    }
  }
}

// ZeRO-Offload: the master and Adam's moments in host memory, AdamW on the
// host, gradients down and parameters up in chunks (the test's buckets of
// 1000 elements make several). kernels::adamw is one formula on every device,
// so every stage trains the bits of the same run on the device, and the state
// a checkpoint reads is the same. On the isolated device a queued copy runs
// only when waited for: an update that read a gradient chunk before its
// download, or a forward that read parameters before their upload, would
// train other bits. Accumulation and a DP group whose collectives run only
// when waited for (the stage 1-2 all-gather after the uploads) included.
TEST(Zero, OffloadedOptimizerTrainsTheSameBitsOnEveryStage) {
  for (auto [tp, dp] : layouts_for(world().size())) {
    for (int stage = 0; stage <= 3; ++stage) {
      SCOPED_TRACE(testing::Message() << "TP " << tp << " DP " << dp << " stage " << stage);
      ZeroRunSpec s;
      s.tp = tp;
      s.dp = dp;
      s.stage = stage;
      s.steps = 3;
      s.micro_batch = 1;
      s.deferred_dp = dp > 1;
      ZeroRun on_device(world(), s);
      const auto want = on_device.train();
      s.offload_optimizer = true;
      ZeroRun offloaded(world(), s);
      ASSERT_NE(offloaded.engine->offload(), nullptr);
      EXPECT_GT(offloaded.engine->offload()->chunks(), 2u);
      EXPECT_EQ(offloaded.train(), want);
      // The state lives in host memory, none of it on the device.
      const auto st = offloaded.engine->owned_state();
      EXPECT_TRUE(st.master.device().host_accessible());
      EXPECT_EQ(offloaded.device->memory().live(MemoryCategory::OptimizerStates), 0);
      EXPECT_EQ(offloaded.host->memory().live(MemoryCategory::OptimizerStates), 12 * offloaded.engine->owned().size());
      const auto ref = on_device.engine->owned_state();
      EXPECT_EQ(st.master.to_double_vector(), ref.master.to_double_vector());
      EXPECT_EQ(st.exp_avg.to_double_vector(), ref.exp_avg.to_double_vector());
      EXPECT_EQ(st.exp_avg_sq.to_double_vector(), ref.exp_avg_sq.to_double_vector());
      // Both ways per step: the owned gradients down, the parameters up.
      const auto moved = offloaded.engine->offload()->copied_bytes();
      EXPECT_EQ(moved, 3 * 2 * offloaded.engine->owned().size() * 4);
      EXPECT_DOUBLE_EQ(offloaded.engine->params_norm(), on_device.engine->params_norm());
      // Stage 3 with the parameter partition in host memory too: each gather
      // uploads this rank's piece first (the isolated device runs the upload
      // only when the device is ordered after it: a gather issued before
      // would all-gather stale pieces).
      std::unique_ptr<ZeroRun> both;
      if (stage == 3) {
        s.offload_params = true;
        both = std::make_unique<ZeroRun>(world(), s);
        EXPECT_EQ(both->train(), want);
        EXPECT_EQ(both->device->memory().live(MemoryCategory::Parameters), 0) << "only gathered groups, all released";
        EXPECT_EQ(both->host->memory().live(MemoryCategory::Parameters), 4 * both->engine->owned().size())
            << "the partition (fp32 in this test), no staging";
        EXPECT_GT(both->engine->param_upload_bytes(), 0);
        EXPECT_EQ(both->engine->offload()->copied_bytes(), 3 * both->engine->owned().size() * 4)
            << "gradients down only: the update writes the parameters in host memory";
        EXPECT_EQ(both->engine->owned_state().exp_avg_sq.to_double_vector(), ref.exp_avg_sq.to_double_vector());
      }
      // One more step each (every forward after the first waits for what the last step left in flight).
      const auto more = on_device.train(3, 1);
      EXPECT_EQ(offloaded.train(3, 1), more);
      if (both) {
        EXPECT_EQ(both->train(3, 1), more);
      }
    }
  }
}

TEST(Zero, OffloadsOutsideTheirStagesAreRefused) {
  auto refused = [](zero::ZeroConfig c, const std::string& why) {
    try {
      c.validate();
      ADD_FAILURE() << "accepted; expected: " << why;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  zero::ZeroConfig c;
  c.offload_optimizer = true;
  c.overlap_optimizer = true;
  refused(c, "--optimizer-cpu-offload runs AdamW on the host");
  c.overlap_optimizer = false;
  c.offload_params = true;
  for (int stage = 0; stage <= 2; ++stage) {
    c.stage = stage;
    refused(c, "--param-cpu-offload keeps each rank's parameter partition in host memory, which only --zero-stage 3");
  }
  c.stage = 3;
  c.offload_optimizer = false;
  refused(c, "--param-cpu-offload needs --optimizer-cpu-offload");
  c.offload_optimizer = true;
  EXPECT_NO_THROW(c.validate());
}

// Every stage, with accumulation and the stage-3 prefetch, over a DP group whose
// collectives run only when waited for: a result read before its wait (a
// gradient bucket, a prefetched gather, the parameter all-gather) would be
// stale, so the same bits as the plain communicator's mean every read waits.
TEST(Zero, EveryStageWaitsForEveryCollectiveItReads) {
  for (auto [tp, dp] : layouts_for(world().size())) {
    if (dp < 2) continue;
    for (int stage = 0; stage <= 3; ++stage) {
      SCOPED_TRACE(testing::Message() << "TP " << tp << " DP " << dp << " stage " << stage);
      ZeroRunSpec s;
      s.tp = tp;
      s.dp = dp;
      s.stage = stage;
      s.steps = 2;
      s.micro_batch = 1;  // accumulation over the rank's micro-batches
      const auto want = ZeroRun(world(), s).train();
      s.deferred_dp = true;
      EXPECT_EQ(ZeroRun(world(), s).train(), want);
    }
  }
}

TEST(Zero, CommunicationVolumeMatchesThePaper) {
  const int n = world().size();
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE(testing::Message() << "stage " << stage);
    ZeroRunSpec s;
    s.dp = n;
    s.stage = stage;
    s.steps = 1;
    s.micro_batch = s.global_batch / n;  // one micro-batch: the paper's accounting
    ZeroRun run(world(), s);
    run.dp->reset_stats();
    run.train();
    const auto psi = run.engine->layout().numel();
    const auto& st = run.dp->stats();
    // Besides the model states, each step all-reduces two scalars on the DP
    // group: the squared gradient norm and the logged loss.
    const std::int64_t scalars = 2;
    if (stage == 0) {
      EXPECT_EQ(st[CollectiveType::AllReduce].elements, psi + scalars);  // an all-reduce moves 2 Psi
      EXPECT_EQ(st[CollectiveType::ReduceScatter].elements, 0);
      EXPECT_EQ(st[CollectiveType::AllGather].elements, 0);
    } else {
      EXPECT_EQ(st[CollectiveType::AllReduce].elements, scalars);
      EXPECT_EQ(st[CollectiveType::ReduceScatter].elements, psi);                     // Psi
      EXPECT_EQ(st[CollectiveType::AllGather].elements, (stage == 3 ? 2 : 1) * psi);  // Psi, or 2 Psi (fwd + bwd)
    }
  }
}

TEST(Zero, InvalidStageIsRefused) {
  zero::ZeroConfig c;
  c.stage = 4;
  try {
    c.validate();
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--zero-stage"), std::string::npos);
  }
}
