// ZeRO with 16-bit model states: bf16 training on every layout tracks the bf16
// one-rank run within mixed-precision tolerance; per-rank memory of
// parameters + gradients + optimizer states equals the paper's Table 1 formula
// for each stage; an fp16 overflow on one rank makes every rank skip the step.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "megazero/core/error.h"
#include "test_device.h"
#include "zero_harness.h"

using namespace megazero;
using namespace megazero::testing_util;
using MC = MemoryCategory;

namespace {

MpiCommunicator& world() { return test_world(); }

}  // namespace

TEST(ZeroPrecision, Bf16AndFp16OnEveryLayoutAndStageTrackTheOneRankRun) {
  const int n = world().size();
  auto self = world().split(world().rank(), 0, "self");
  for (DType dtype : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dtype));
    ZeroRunSpec ref_spec;
    ref_spec.dtype = dtype;
    ZeroRun ref(*self, ref_spec);
    const auto ref_losses = ref.train();
    for (int tp : {1, 2, 4})
      for (int stage = 0; stage <= 3; ++stage) {
        if (n % tp || tp > n) continue;
        SCOPED_TRACE(testing::Message() << "TP " << tp << " DP " << n / tp << " stage " << stage);
        ZeroRunSpec s = ref_spec;
        s.tp = tp;
        s.dp = n / tp;
        s.stage = stage;
        ZeroRun run(world(), s);
        const auto losses = run.train();
        // bf16 keeps 8 significant bits; different reduction orders round
        // differently, so allow a few bf16 ulps of the loss (~ln 97 = 4.6).
        for (std::size_t i = 0; i < losses.size(); ++i) EXPECT_NEAR(losses[i], ref_losses[i], 0.03) << "step " << i;
        EXPECT_LT(losses.back(), losses.front()) << "training lowers the loss";
        for (const auto& r : run.results) EXPECT_FALSE(r.stats.skipped) << "no overflow at loss scale 1024";
        // On a device the host cannot read (cpu-isolated in CI; a GPU), a step
        // waits for the device twice: the grad norm and the loss. A blocking
        // copy or synchronize added anywhere in forward, backward or the
        // optimizer (on a GPU: a drained queue) shows here.
        if (!run.device->host_accessible()) {
          for (const auto& r : run.results) EXPECT_EQ(r.host_waits, 2) << "host waits per step";
        }
        if (tp != 1) continue;
        // ZeRO-Offload: the same bits in 16 bits too (the host writes the
        // 16-bit parameters as the device's AdamW does). On a device the host
        // cannot read, the host may wait once more for each chunk's
        // gradients: cpu-isolated's queued copies run only when waited on, so
        // there every chunk's wait blocks; a GPU counts a wait only for a copy
        // still running (CudaDevice::wait), so there 0 to all chunks do (the
        // H200 of 2026-11-28 counted none on this small model).
        s.offload_optimizer = true;
        ZeroRun offloaded(world(), s);
        EXPECT_EQ(offloaded.train(), losses) << "offloaded";
        if (!run.device->host_accessible()) {
          const auto chunks = static_cast<std::int64_t>(offloaded.engine->offload()->chunks());
          for (const auto& r : offloaded.results) {
            if (run.device->kind() == DeviceKind::CUDA) {
              EXPECT_GE(r.host_waits, 2) << "host waits per offloaded step";
              EXPECT_LE(r.host_waits, 2 + chunks) << "host waits per offloaded step";
            } else {
              EXPECT_EQ(r.host_waits, 2 + chunks) << "host waits per offloaded step";
            }
          }
        }
      }
  }
}

TEST(ZeroPrecision, MemoryPerRankMatchesThePapersFormula) {
  const int n = world().size();
  if (n < 2) GTEST_SKIP() << "partitioning needs a DP group of 2 or more";
  for (int tp : {1, 2}) {
    if (n % tp || n / tp < 2) continue;
    const int nd = n / tp;
    for (int stage = 0; stage <= 3; ++stage)
      for (int mode : {0, 1, 2}) {
        // 1: the optimizer state offloaded; 2 (stage 3): the parameter partition too.
        if (mode == 2 && stage != 3) continue;
        const bool offload = mode >= 1, params_offloaded = mode == 2;
        SCOPED_TRACE(testing::Message() << "TP " << tp << " DP " << nd << " stage " << stage
                                        << (offload ? " offloaded" : "")
                                        << (params_offloaded ? " with parameters" : ""));
        ZeroRunSpec s;
        s.tp = tp;
        s.dp = nd;
        s.stage = stage;
        s.dtype = DType::BF16;
        s.steps = 1;
        s.bucket = 4096;
        s.hidden = 64;  // ~60k parameters per TP rank: padding to DP x 64 stays under 1%
        s.offload_optimizer = offload;
        s.offload_params = params_offloaded;
        ZeroRun run(world(), s);
        run.train();
        const auto& mem = run.device->memory();
        const double psi = static_cast<double>(run.engine->layout().numel());  // this TP rank's (padded) parameters
        // fp32 master + Adam m + v; ZeRO-Offload moves them to host memory.
        const double k = offload ? 0 : 12;
        // Table 1: model-state bytes per device.
        const double params = params_offloaded ? 0 : stage == 3 ? 2 * psi / nd : 2 * psi;
        const double grads = stage >= 2 ? 2 * psi / nd : 2 * psi;
        const double owned = stage == 0 ? psi : psi / nd;
        const double optim = k * owned;
        EXPECT_EQ(mem.live(MC::Parameters), static_cast<std::int64_t>(params));
        EXPECT_EQ(mem.live(MC::Gradients), static_cast<std::int64_t>(grads));
        EXPECT_EQ(mem.live(MC::OptimizerStates), static_cast<std::int64_t>(optim));
        // ZeRO-Offload's host memory: the 12 bytes, and a 16-bit gradient and
        // parameter of staging, for each owned element.
        const auto& host = run.host->memory();
        EXPECT_EQ(host.live(MC::OptimizerStates), static_cast<std::int64_t>(offload ? 12 * owned : 0));
        EXPECT_EQ(host.live(MC::Gradients) + host.live(MC::Parameters),
                  static_cast<std::int64_t>(offload ? 4 * owned : 0));
        // Against the unpadded parameter count, as the paper states it: within 1%.
        const double psi_true = static_cast<double>(run.engine->layout().unpadded_numel());
        const double formula = stage == 0         ? (2 + 2 + k) * psi_true
                               : stage == 1       ? 4 * psi_true + k * psi_true / nd
                               : stage == 2       ? 2 * psi_true + (2 + k) * psi_true / nd
                               : params_offloaded ? (2 + k) * psi_true / nd
                                                  : (2 + 2 + k) * psi_true / nd;
        const double measured =
            static_cast<double>(mem.live(MC::Parameters) + mem.live(MC::Gradients) + mem.live(MC::OptimizerStates));
        EXPECT_NEAR(measured / formula, 1.0, 0.01);
        // Plus the declared constant-size buffers: two gradient buckets (stages 2-3).
        const std::int64_t buckets =
            stage >= 2 ? 2 * std::min<std::int64_t>(4096, run.engine->layout().numel()) * 2 : 0;
        EXPECT_EQ(mem.live(MC::CommBuffers), buckets);
        if (stage == 3) {
          EXPECT_GT(run.engine->gathered_peak_bytes(), 0);
          EXPECT_LT(run.engine->gathered_peak_bytes(), static_cast<std::int64_t>(2 * psi));
          RecordProperty("stage3_gathered_peak_bytes", std::to_string(run.engine->gathered_peak_bytes()));
        }
      }
  }
}

TEST(ZeroPrecision, Fp16OverflowOnOneRankSkipsEverywhereAndBacksOff) {
  const int n = world().size();
  for (int stage = 0; stage <= 3; ++stage)
    for (bool offload : {false, true}) {
      SCOPED_TRACE(testing::Message() << "stage " << stage << (offload ? " offloaded" : ""));
      ZeroRunSpec s;
      s.dp = n;
      s.stage = stage;
      s.dtype = DType::F16;
      s.micro_batch = s.global_batch / n;
      s.offload_optimizer = offload;
      ZeroRun run(world(), s);
      optim::LossScalerConfig sc;
      sc.dynamic = true;
      sc.initial_scale = 1024;
      sc.hysteresis = 1;
      optim::LossScaler scaler(sc);
      // One micro-batch by hand so a gradient can be poisoned before the step.
      run.model->set_param_hooks(run.engine.get());
      run.engine->zero_grad();
      const std::int64_t S = run.model->config().seq_length, b = s.micro_batch;
      const Tensor ids =
          test_support::int64_tensor(run.device, b * S, [&](std::int64_t i) { return (i * 7 + world().rank()) % 97; });
      layers::StepInfo step;
      step.micro_batch = b;
      step.seq = S;
      step.sample_offset = world().rank() * b;
      run.model->forward(ids, ids, step);
      run.engine->begin_backward(true);
      run.model->backward(scaler.scale() / n);
      const auto before = run.engine->master().to_double_vector();
      if (world().rank() == n - 1) {
        Tensor g = run.engine->partition_grads();
        g.narrow(0, 3, 1).copy_from_doubles({std::numeric_limits<double>::infinity()});
      }
      optim::AdamConfig adam;
      const auto st = run.engine->step(1e-3, adam, 1.0, scaler.scale(), 1);
      scaler.update(st.skipped);
      EXPECT_TRUE(st.skipped) << "every rank skips, not only the one that overflowed";
      EXPECT_EQ(run.engine->master().to_double_vector(), before) << "nothing was updated";
      EXPECT_EQ(scaler.scale(), 512.0);
      EXPECT_EQ(scaler.skipped_steps(), 1);
    }
}

TEST(ZeroPrecision, LossScalerWindowHysteresisAndFloor) {
  optim::LossScalerConfig c;
  c.dynamic = true;
  c.initial_scale = 8;
  c.window = 3;
  c.hysteresis = 2;
  c.min_scale = 2;
  optim::LossScaler s(c);
  s.update(true);  // first overflow: tolerated by hysteresis
  EXPECT_EQ(s.scale(), 8);
  s.update(true);  // second: back off
  EXPECT_EQ(s.scale(), 4);
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.scale(), 2);  // floor
  for (int i = 0; i < 3; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 4);  // grew after a window of good steps
  EXPECT_EQ(s.skipped_steps(), 4);
}

// Megatron's --loss-scale: a constant scale never grows or backs off (even with
// dynamic flags around it); overflowing steps are still counted as skipped,
// and a dynamic checkpoint's scale does not replace it.
TEST(ZeroPrecision, ConstantLossScaleStaysPut) {
  optim::LossScalerConfig c;
  c.constant_scale = 1024;
  c.window = 1;
  optim::LossScaler s(c);
  EXPECT_EQ(s.scale(), 1024);
  s.update(true);
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.scale(), 1024);
  for (int i = 0; i < 4; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.skipped_steps(), 3);
  s.restore({true, 65536, 5, 7, 2});
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.skipped_steps(), 7);
  EXPECT_FALSE(s.state().dynamic);
}
