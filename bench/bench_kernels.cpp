// The MLP's bias-GeLU epilogue, fused and unfused, on one [rows, cols] tensor
// (the fc1 output of one rank): forward (bias add + GeLU) and backward (GeLU
// backward + bias gradient); the memory-bound backward passes that sum a
// parameter gradient over the rows of a [rows, hidden] tensor (a bias
// gradient, dropout backward + bias gradient, LayerNorm backward, and the
// LayerNorm backward with the dropout backward in its pass) and the
// forward's bias-dropout-add over the same shape (alone and in LN's pass),
// each with the bandwidth it reached; and the vocab-parallel cross-entropy
// forward and backward on [ce-rows, ce-vocab] logits; the optimizer step's two passes over
// --adam-elements parameters (the gradient norm's sum of squares, and AdamW
// writing the working-precision parameters in the same pass), with their GB/s;
// and the floor a kernel costs on a queue (a tiny one, back to back).
// A call's time is what it takes on a queue of calls, as in a training step:
// the best of --steps samples, each of R calls between two synchronisations
// divided by R (R: enough calls for ~2 ms, 1 to 200; printed), after a
// warm-up call. One call between two synchronisations (before 2026-11-26,
// later) also timed the launch and the host's wait, ~10-20 us on a GPU, which
// swamped the calls over GPT-2 medium's [8192, 1024] tensors (20-60 us).
//   bench_kernels [--device cpu|cuda --dtype fp32|bf16|fp16 --rows 8192 --cols 2048 --hidden 8192
//                  --steps 20 --ce-rows 1024 --ce-vocab 25216 --adam-elements 50331648]
// Defaults: the paper's 100B MLP slice on a TP-16 rank (ffn 32768 / 16, seq
// 1024 x micro-batch 8, hidden 8192); GPT-2's vocabulary on a TP-2 rank
// (50432 / 2); the parameters of one 100B layer on a TP-16 rank (12 x 8192^2 /
// 16). GPT-2 medium on one GPU (B 8): --cols 4096 --hidden 1024 --ce-rows 8192
// --ce-vocab 50304 --adam-elements 354871296 (its parameters, vocabulary padded).
#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <functional>

#include "megazero/core/error.h"
#include "megazero/kernels/cross_entropy.h"
#include "megazero/kernels/dropout.h"
#include "megazero/kernels/gelu_bias.h"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/layernorm.h"
#include "megazero/kernels/optimizer_kernels.h"
#include "megazero/runtime/cli.h"
#include "megazero/runtime/entry.h"

namespace po = boost::program_options;
using namespace megazero;

namespace {

int run(int argc, char** argv) {
  std::int64_t rows = 8192, cols = 2048, hidden = 8192;
  std::int64_t ce_rows = 1024, ce_vocab = 25216, adam_elements = 12 * std::int64_t{8192} * 8192 / 16;
  int steps = 20;
  std::string device_spec = "cpu", dtype_arg = "bf16";
  po::options_description d("bench_kernels");
  d.add_options()("device", po::value(&device_spec), "cpu or cuda[:N]")(
      "dtype", po::value(&dtype_arg), "fp32, bf16 or fp16")("rows", po::value(&rows))("cols", po::value(&cols))(
      "hidden", po::value(&hidden))("steps", po::value(&steps))("ce-rows", po::value(&ce_rows))(
      "ce-vocab", po::value(&ce_vocab))("adam-elements", po::value(&adam_elements));
  parse_command_line(argc, argv, d, "bench_kernels");
  MZ_REQUIRE(rows > 0 && cols > 0 && hidden > 0 && steps > 0 && ce_rows > 0 && ce_vocab > 0 && adam_elements > 0,
             "--rows, --cols, --hidden, --steps, --ce-rows, --ce-vocab and --adam-elements must be positive");
  const DType t = parse_dtype(dtype_arg, "--dtype");
  auto dev = make_device(device_spec);
  const auto C = MemoryCategory::Other;
  Tensor y = Tensor::zeros(dev, {rows, cols}, t, C), bias = Tensor::zeros(dev, {cols}, t, C);
  Tensor act = Tensor::zeros(dev, {rows, cols}, t, C), pre = Tensor::zeros(dev, {rows, cols}, t, C);
  Tensor dy = Tensor::zeros(dev, {rows, cols}, t, C), dbias = Tensor::zeros(dev, {cols}, DType::F32, C);
  int last_reps = 1;
  auto best_ms = [&](const std::function<void()>& f) {
    const auto timed = [&](int reps) {  // ms a call over `reps` calls queued back to back
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) f();
      dev->synchronize();
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
    };
    f();  // warm-up: plans, attributes, first touches
    dev->synchronize();
    last_reps = std::clamp(static_cast<int>(2.0 / std::max(timed(1), 1e-3)), 1, 200);
    double best = 1e30;
    for (int i = 0; i < steps; ++i) best = std::min(best, timed(last_reps));
    return best;
  };
  {
    // The floor: a kernel over 8 elements, so its time is the launch's and
    // the queue's (what every pass of a step pays on top of its bytes).
    Tensor tiny = Tensor::zeros(dev, {1, 8}, t, C), tiny_bias = Tensor::zeros(dev, {8}, t, C);
    const double floor_ms = best_ms([&] { kernels::add_bias(tiny, tiny_bias); });
    std::printf("a tiny kernel (a bias added to 8 elements) on a queue: %.2f us a call (%d back to back a sample)\n",
                floor_ms * 1e3, last_reps);
  }
  // Unfused forward: fc1 added its bias in place (pre = y + bias), then GeLU.
  const double copy = best_ms([&] { pre.copy_from(y); });
  const double fwd_unfused = best_ms([&] {
                               pre.copy_from(y);
                               kernels::add_bias(pre, bias);
                               kernels::gelu_forward(pre, act);
                             }) -
                             copy;
  const double fwd_fused = best_ms([&] { kernels::bias_gelu_forward(y, bias, act); });
  const double bwd_unfused = best_ms([&] {
    kernels::gelu_backward(dy, pre, act);
    kernels::bias_grad(act, dbias);
  });
  const double bwd_fused = best_ms([&] { kernels::bias_gelu_backward(dy, y, bias, act, dbias); });
  const bool folded = kernels::gpu_scratch::column_finish_folded();  // MEGAZERO_COLUMN_FINISH's, kept below
  kernels::gpu_scratch::set_column_finish_folded(false);  // the dbias finish as its own launch: the fold's A/B
  const double bwd_apart = best_ms([&] { kernels::bias_gelu_backward(dy, y, bias, act, dbias); });
  kernels::gpu_scratch::set_column_finish_folded(folded);
  const double mib = static_cast<double>(y.nbytes()) / 1048576.0;
  std::printf("bias-GeLU [%lld, %lld] %s on %s (%.1f MiB per tensor), best of %d samples of up to 200 calls\n",
              static_cast<long long>(rows), static_cast<long long>(cols), dtype_arg.c_str(), dev->name().c_str(), mib,
              steps);
  std::printf("forward:  unfused %.3f ms, fused %.3f ms (%.2fx)\n", fwd_unfused, fwd_fused, fwd_unfused / fwd_fused);
  std::printf("backward: unfused %.3f ms, fused %.3f ms (%.2fx), fused %.0f GB/s (dy, y read; dx written)\n",
              bwd_unfused, bwd_fused, bwd_unfused / bwd_fused, 3 * static_cast<double>(y.nbytes()) / bwd_fused / 1e6);
  std::printf("backward: fused, the dbias finish %s %.3f ms, launched apart %.3f ms (%.2fx)\n",
              folded ? "in the kernel" : "apart (MEGAZERO_COLUMN_FINISH=kernel)", bwd_fused, bwd_apart,
              bwd_apart / bwd_fused);

  // The passes that write dx and sum a gradient over rows ([rows, hidden]).
  {
    Tensor g = Tensor::zeros(dev, {rows, hidden}, t, C), x = Tensor::zeros(dev, {rows, hidden}, t, C);
    Tensor dx = Tensor::zeros(dev, {rows, hidden}, t, C), db = Tensor::zeros(dev, {hidden}, DType::F32, C);
    Tensor gamma = Tensor::zeros(dev, {hidden}, t, C), dgamma = Tensor::zeros(dev, {hidden}, DType::F32, C);
    Tensor mean = Tensor::zeros(dev, {rows}, kernels::row_stat_dtype(t), C), rstd = mean.clone(C);
    const Tensor y_res = Tensor::zeros(dev, {rows, hidden}, t, C);
    kernels::DropoutLayout hid;
    hid.matrix_rows = rows;
    hid.matrix_cols = hidden;
    const double tensor_gb = static_cast<double>(g.nbytes()) / 1e9;
    const auto report = [&](const char* what, double ms, double tensors) {
      std::printf("  %-40s %.3f ms, %.0f GB/s\n", what, ms, tensors * tensor_gb / (ms * 1e-3));
    };
    std::printf("gradient sums and bias-dropout-add over [%lld, %lld] %s:\n", static_cast<long long>(rows),
                static_cast<long long>(hidden), dtype_arg.c_str());
    report("bias_grad (dy read)", best_ms([&] { kernels::bias_grad(g, db); }), 1);
    report("dropout backward + bias grad", best_ms([&] {
             kernels::dropout_backward_bias_grad(g, 0.1, RngKey{1, 1, 0, 0}, hid, dx, db);
           }),
           2);
    // The same two with the sums' finish as a launch of its own after the
    // partials (MEGAZERO_COLUMN_FINISH=kernel) instead of folded into the
    // partial kernel's last blocks (the default): the fold's A/B.
    kernels::gpu_scratch::set_column_finish_folded(false);
    report("  bias_grad, finish launched apart", best_ms([&] { kernels::bias_grad(g, db); }), 1);
    report("  dropout bwd + bias grad, finish apart", best_ms([&] {
             kernels::dropout_backward_bias_grad(g, 0.1, RngKey{1, 1, 0, 0}, hid, dx, db);
           }),
           2);
    kernels::gpu_scratch::set_column_finish_folded(folded);
    // The forward's residual pass (Megatron's bias-dropout-add), p = 0.1; not in place, so
    // repeated calls see the same inputs.
    Tensor hbias = Tensor::zeros(dev, {hidden}, t, C);
    report("bias-dropout-add (y, residual; out)", best_ms([&] {
             kernels::bias_dropout_add(g, hbias, x, 0.1, RngKey{1, 1, 0, 0}, hid, dx);
           }),
           3);
    // The same two dropout passes over hidden - 2 columns, where rows of a
    // length not a multiple of 4 (8 for the forward's packs) take the kernels'
    // element-by-element paths: an A/B of the packed, division-free kernels
    // against the general ones at ~the same bytes.
    if (hidden > 8) {
      const std::int64_t h2 = hidden - 2;
      Tensor g2 = Tensor::zeros(dev, {rows, h2}, t, C), x2 = Tensor::zeros(dev, {rows, h2}, t, C);
      Tensor dx2 = Tensor::zeros(dev, {rows, h2}, t, C), db2 = Tensor::zeros(dev, {h2}, DType::F32, C);
      Tensor hbias2 = Tensor::zeros(dev, {h2}, t, C);
      kernels::DropoutLayout hid2 = hid;
      hid2.matrix_cols = h2;
      const double scale = static_cast<double>(h2) / static_cast<double>(hidden);
      report("  same, element by element (h - 2)", best_ms([&] {
               kernels::dropout_backward_bias_grad(g2, 0.1, RngKey{1, 1, 0, 0}, hid2, dx2, db2);
             }),
             2 * scale);
      report("  bias-dropout-add, element by el.", best_ms([&] {
               kernels::bias_dropout_add(g2, hbias2, x2, 0.1, RngKey{1, 1, 0, 0}, hid2, dx2);
             }),
             3 * scale);
    }
    // One pass (dx, dgamma, dbeta together: the default) against the split
    // one (the sums' pass, then dx's), with the pre-LN residual gradient added
    // as the transformer layer does; GB/s counts one read of dy, x and the
    // residual and one write of dx, so the split path's second read of dy and
    // x shows as a lower figure.
    // The third: the one pass with every row's dy, x and residual gradient
    // copied a row ahead (the default does so with one pack a thread; with
    // two, GPT's widths from 4104 to 8192, it halves the blocks an SM).
    using LNP = kernels::LayerNormBackwardPasses;
    for (const auto passes : {LNP::OnePass, LNP::Split, LNP::OnePassPrefetched})
      report(passes == LNP::OnePass ? "layernorm backward, one pass"
             : passes == LNP::Split ? "layernorm backward, split"
                                    : "layernorm backward, all prefetched",
             best_ms([&] { kernels::layernorm_backward(g, x, gamma, mean, rstd, dx, dgamma, db, &y_res, passes); }), 4);
    // The transformer layer's LN2 backward and its attention output dropout's
    // backward (with the bias gradient): the two calls against the one pass
    // (kernels::layernorm_backward_dropout), over the hidden-state layout the
    // layer uses (a layout row a row). GB/s: dy, x, the residual read, dx and
    // the dropout's gradient written (5 tensors) for both.
    {
      const kernels::DropoutLayout rows_layout{rows, 1, 1, hidden, 0, 0, 1};
      const RngKey key{1, 1, 0, kRngAttentionOutputDropout};
      Tensor dd = Tensor::zeros(dev, {rows, hidden}, t, C), dbias_h = db.clone(C);
      report("layernorm + dropout bwd, two calls", best_ms([&] {
               kernels::layernorm_backward(g, x, gamma, mean, rstd, dx, dgamma, db, &y_res);
               kernels::dropout_backward_bias_grad(dx, 0.1, key, rows_layout, dd, dbias_h);
             }),
             5);
      report("layernorm + dropout bwd, one pass", best_ms([&] {
               kernels::layernorm_backward_dropout(g, x, gamma, mean, rstd, dx, dgamma, db, &y_res,
                                                   {0.1, key, rows_layout, &dd, &dbias_h},
                                                   kernels::LayerNormBackwardPasses::OnePass);
             }),
             5);
      // Every row copied ahead, the bias summed in the kernel at any width
      // (one block an SM with two packs a thread): the default (Auto) since
      // an H200 timed it 12% faster at [32768, 8192].
      report("layernorm + dropout bwd, all prefetched", best_ms([&] {
               kernels::layernorm_backward_dropout(g, x, gamma, mean, rstd, dx, dgamma, db, &y_res,
                                                   {0.1, key, rows_layout, &dd, &dbias_h},
                                                   kernels::LayerNormBackwardPasses::OnePassPrefetched);
             }),
             5);
      // The forward's counterpart: the attention output's bias-dropout-add
      // and LN2 (y and the residual read, the sum and LN2's output written: 4
      // tensors), not in place so that repeated calls see the same inputs.
      Tensor hb = Tensor::zeros(dev, {hidden}, t, C), beta = gamma.clone(C);
      report("bias-dropout-add + LN, two calls", best_ms([&] {
               kernels::bias_dropout_add(g, hb, x, 0.1, key, rows_layout, dx);
               kernels::layernorm_forward(dx, gamma, beta, 1e-5, dd, mean, rstd);
             }),
             4);
      report("bias-dropout-add + LN, one pass", best_ms([&] {
               kernels::bias_dropout_add_layernorm(g, {&hb, &x, 0.1, key, rows_layout, &dx}, gamma, beta, 1e-5, dd,
                                                   mean, rstd);
             }),
             4);
      // LN1's forward (and the final LayerNorm's): x read, y written.
      report("layernorm forward", best_ms([&] { kernels::layernorm_forward(x, gamma, beta, 1e-5, dd, mean, rstd); }),
             2);
    }
  }

  // The forward reads the logits (one sweep, nothing written); the backward
  // reads them and writes dlogits (not in place here, so repeated calls see
  // the same inputs).
  const DType stat = kernels::row_stat_dtype(t);
  Tensor logits = Tensor::zeros(dev, {ce_rows, ce_vocab}, t, C);
  Tensor targets = Tensor::zeros(dev, {ce_rows}, DType::I64, C);
  Tensor row_max = Tensor::zeros(dev, {ce_rows}, stat, C), sum_exp = Tensor::zeros(dev, {ce_rows}, stat, C);
  Tensor target_logit = Tensor::zeros(dev, {ce_rows}, stat, C);
  const double ce_fwd =
      best_ms([&] { kernels::cross_entropy_forward(logits, targets, 0, ce_vocab, row_max, sum_exp, target_logit); });
  Tensor dlogits = Tensor::zeros(dev, {ce_rows, ce_vocab}, t, C);
  const double ce_bwd =
      best_ms([&] { kernels::cross_entropy_backward(logits, row_max, sum_exp, targets, 0, ce_vocab, 1.0, dlogits); });
  // One TP rank: both in one call (one pass over the logits where the row
  // fits in shared memory twice an SM), against the two above.
  bool fused = false;
  const double ce_one = best_ms([&] {
    fused = kernels::cross_entropy_forward_backward(logits, targets, ce_vocab, 1.0, row_max, sum_exp, target_logit,
                                                    dlogits);
  });
  const double logits_gb = static_cast<double>(logits.nbytes()) / 1e9;
  std::printf(
      "cross-entropy [%lld, %lld] %s: forward %.3f ms (%.2f ns per logit, %.0f GB/s: read once), "
      "backward %.3f ms (%.0f GB/s: read once, written once); TP 1 forward + backward in one call %.3f ms "
      "(%s, %.0f GB/s: read once, written once; %.2fx the two)\n",
      static_cast<long long>(ce_rows), static_cast<long long>(ce_vocab), dtype_arg.c_str(), ce_fwd,
      ce_fwd * 1e6 / static_cast<double>(ce_rows * ce_vocab), logits_gb / (ce_fwd * 1e-3), ce_bwd,
      2 * logits_gb / (ce_bwd * 1e-3), ce_one, fused ? "one pass" : "two kernels", 2 * logits_gb / (ce_one * 1e-3),
      (ce_fwd + ce_bwd) / ce_one);
  logits = dlogits = Tensor();

  // The optimizer step's passes over one flat partition: gradients and
  // published parameters of --dtype, fp32 master and moments, one segment (what
  // a ZeRO partition merges to). Zero gradients keep every value finite and
  // normal over repeated calls.
  {
    const std::int64_t n = adam_elements;
    const auto O = MemoryCategory::OptimizerStates;
    Tensor w = Tensor::zeros(dev, {n}, DType::F32, O), m = Tensor::zeros(dev, {n}, DType::F32, O);
    Tensor v = Tensor::zeros(dev, {n}, DType::F32, O), grads = Tensor::zeros(dev, {n}, t, C);
    Tensor params = Tensor::zeros(dev, {n}, t, C), sum = Tensor::zeros(dev, {1}, DType::F64, C);
    const kernels::AdamStep a{0.9, 0.95, 1e-8, 0.1, 3e-4, 0.1, 0.05, 1.0};
    const double norm_ms = best_ms([&] { kernels::sum_of_squares(grads, {{0, n}}, sum); });
    const double adam_ms = best_ms([&] { kernels::adamw(w, m, v, grads, {{0, n, true}}, a, params); });
    const double gb = static_cast<double>(n) / 1e9, g16 = static_cast<double>(dtype_size(t));
    std::printf(
        "optimizer over %lld parameters (%s gradients and parameters): grad norm %.3f ms (%.0f GB/s), "
        "AdamW + publish %.3f ms (%.0f GB/s: master and moments read and written, gradient read, "
        "parameter written)\n",
        static_cast<long long>(n), dtype_arg.c_str(), norm_ms, g16 * gb / (norm_ms * 1e-3), adam_ms,
        (24 + 2 * g16) * gb / (adam_ms * 1e-3));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return run_main("bench_kernels", argc, argv, run); }
