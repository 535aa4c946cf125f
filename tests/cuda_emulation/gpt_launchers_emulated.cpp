// The launchers of megazero/cuda/gelu_bias.cu, softmax.cu and
// cross_entropy.cu, whole, on the CPU (tests/cuda_emulation/README.md, "The
// launchers, whole"): the rest of a GPT layer's and loss's element-wise,
// bias, softmax and vocabulary-parallel cross-entropy launches, through their
// public headers, with fenced device memory and exact-size scratch, against
// the CPU kernels of megazero/kernels on the same inputs:
// - GeLU, bias-GeLU, squared ReLU (bit for bit), add, axpy, scale, add_bias over lengths that take the
//   16-byte pack path and the scalar one (odd lengths, unaligned operands,
//   bias periods that are not whole packs): within two storage roundings
//   (the shim's tanh of a float is libm's double one) plus a few ulps of |dy|
//   where gelu' cancels;
// - bias_gelu_backward, packed (several chunks of rows) and not (one chunk,
//   odd widths, unaligned, no bias), fp32 and storage accumulators; and
//   column_sums: dx as above, dbias within one accumulator rounding plus
//   (rows + 8) fp32 roundings of the column's sum of |dx| (it must sum the
//   dx the launcher wrote); both again with MEGAZERO_COLUMN_FINISH=kernel:
//   the same bits, one launch more than folded where chunks are summed; an unknown
//   MEGAZERO_COLUMN_FINISH refused with a ConfigError naming it;
// - the causal softmax forward and backward, one warp a row (rows of up to
//   1024, each width class) and a block a row (fp64): within four storage
//   roundings plus 1e-6;
// - the cross-entropy forward, rescale, loss and backward, with padding
//   columns, targets on and off this rank's slice, widths that take the
//   16-byte path and not: row_max and target_logit bit for bit, sum_exp and
//   loss within 1e-6 relative, dlogits within two storage roundings plus
//   1e-7 of the scale; and the one-TP-rank forward + backward launcher, fused
//   (one launch) and where the row does not fit (two), bit for bit against
//   the two launchers.
// Exit code 1 on any failure.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "emu_checks.h"
#include "emu_device_checks.h"
#include "emu_host.h"
#include "megazero/core/error.h"
#include "megazero/cuda/cross_entropy.h"
#include "megazero/cuda/gelu_bias.h"
#include "megazero/cuda/softmax.h"
#include "megazero/kernels/cross_entropy.h"
#include "megazero/kernels/gelu_bias.h"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/softmax.h"

using namespace megazero;
using namespace emu_checks;
using namespace emu_device_checks;
namespace gs = megazero::kernels::gpu_scratch;

namespace {

Tensor like(const Tensor& t) { return t.clone(MemoryCategory::Other); }

// Two storage roundings plus `slack` ulps of the largest |want|.
void expect_elements(const Tensor& got, const Tensor& want, double slack, const char* what) {
  expect_close(values(got), values(want), 2 * ulp(want.dtype()), slack * ulp(want.dtype()) * largest(want), what);
}

// ------------------------------------------------------------ element-wise
void elementwise(DType t, i64 n, std::size_t shift, std::mt19937& rng) {
  const Tensor x = tensor_of({n}, randn(n, rng, 2.0), t), dy = tensor_of({n}, randn(n, rng), t);
  const auto dx_ = put(x, shift), ddy = put(dy, shift);

  Tensor y = like(x);
  kernels::gelu_forward(x, y);
  auto out = poisoned(y, shift);
  cuda::gelu_forward(t, dx_.ptr(), out.ptr(), n, nullptr);
  expect_elements(get(out, y), y, 4, "gelu_forward");

  Tensor g = like(x);
  kernels::gelu_backward(dy, x, g);
  out = poisoned(g, shift);
  cuda::gelu_backward(t, ddy.ptr(), dx_.ptr(), out.ptr(), n, nullptr);
  expect_elements(get(out, g), g, 16, "gelu_backward");

  // Squared ReLU: no transcendental, the same compute type: the CPU's bits.
  Tensor sq = like(x);
  kernels::squared_relu_forward(x, sq);
  out = poisoned(sq, shift);
  cuda::squared_relu_forward(t, dx_.ptr(), out.ptr(), n, nullptr);
  expect_bits(get(out, sq), sq, "squared_relu_forward");
  Tensor dsq = like(x);
  kernels::squared_relu_backward(dy, x, dsq);
  out = poisoned(dsq, shift);
  cuda::squared_relu_backward(t, ddy.ptr(), dx_.ptr(), out.ptr(), n, nullptr);
  expect_bits(get(out, dsq), dsq, "squared_relu_backward");

  Tensor sum = like(x);
  kernels::add(x, dy, sum);
  out = poisoned(sum, shift);
  cuda::add(t, dx_.ptr(), ddy.ptr(), out.ptr(), n, nullptr);
  expect_bits(get(out, sum), sum, "add");

  Tensor ax = like(dy);
  kernels::axpy(0.75, x, ax);
  out = put(dy, shift);
  cuda::axpy(t, 0.75, dx_.ptr(), out.ptr(), n, nullptr);
  expect_bits(get(out, ax), ax, "axpy");

  Tensor sc = like(x);
  kernels::scale(sc, -1.5);
  out = put(x, shift);
  cuda::scale_elements(t, out.ptr(), n, -1.5, nullptr);
  expect_bits(get(out, sc), sc, "scale_elements");
}

void bias_maps(DType t, i64 rows, i64 cols, std::size_t shift, std::mt19937& rng) {
  const Tensor y = tensor_of({rows, cols}, randn(rows * cols, rng, 2.0), t),
               bias = tensor_of({cols}, randn(cols, rng), t);
  const auto dy_ = put(y, shift), db = put(bias);
  Tensor out = like(y);
  kernels::bias_gelu_forward(y, bias, out);
  auto o = poisoned(out, shift);
  cuda::bias_gelu_forward(t, dy_.ptr(), db.ptr(), o.ptr(), rows, cols, nullptr);
  expect_elements(get(o, out), out, 4, "bias_gelu_forward");

  Tensor added = like(y);
  kernels::add_bias(added, bias);
  o = put(y, shift);
  cuda::add_bias(t, o.ptr(), db.ptr(), rows, cols, nullptr);
  expect_bits(get(o, added), added, "add_bias");
}

// dbias's bound: one accumulator rounding plus (rows + 8) fp32 roundings of
// the column's sum of |terms| and |dbias0|.
std::vector<double> column_magnitudes(const Tensor& terms, const Tensor& start, i64 cols) {
  std::vector<double> mag = values(start);
  for (auto& v : mag) v = std::fabs(v);
  const auto ts = values(terms);
  for (std::size_t i = 0; i < ts.size(); ++i) mag[i % static_cast<std::size_t>(cols)] += std::fabs(ts[i]);
  return mag;
}

// Whether a column sum of [rows, cols] adds chunks of rows (so its partial
// kernel folds the finish): packed (16-byte packs, aligned, more than one
// chunk) or, where the packed path declines, one column a thread over
// several chunks.
bool sums_chunks(DType t, i64 rows, i64 cols, std::size_t shift) {
  const i64 v = static_cast<i64>(16 / dtype_size(t));
  const bool packed =
      t != DType::F64 && cols % v == 0 && shift == 0 && gs::packed_column_chunks(rows, cols, v).used > 1;
  return packed || gs::column_chunks(rows, cols).used > 1;
}

void bias_gelu_backward(DType t, DType acc, i64 rows, i64 cols, bool with_bias, std::size_t shift, std::mt19937& rng) {
  const Tensor dy = tensor_of({rows, cols}, randn(rows * cols, rng), t),
               y = tensor_of({rows, cols}, randn(rows * cols, rng, 2.0), t);
  const Tensor bias = tensor_of({cols}, randn(cols, rng), t), db0 = tensor_of({cols}, randn(cols, rng), acc);
  Tensor dx = like(dy), dbias = like(db0);
  kernels::bias_gelu_backward(dy, y, with_bias ? bias : Tensor(), dx, dbias);

  const auto ddy = put(dy, shift), dyy = put(y), dbi = put(bias), ddx = poisoned(dx, shift), ddb = put(db0);
  const auto ws = scratch(gs::column_sums_bytes(t, rows, cols, 1));
  cuda::bias_gelu_backward(t, ddy.ptr(), dyy.ptr(), with_bias ? dbi.ptr() : nullptr, ddx.ptr(), ddb.ptr(), acc, rows,
                           cols, ws.ws(), nullptr);
  const Tensor got_dx = get(ddx, dx);
  expect_elements(got_dx, dx, 16, "bias_gelu_backward dx");
  // dbias sums the dx the launcher wrote.
  Tensor want = like(db0);
  kernels::bias_grad(got_dx, want);
  expect_sums(get(ddb, dbias), want, column_magnitudes(got_dx, db0, cols), rows, "bias_gelu_backward dbias");
  // The partial kernel (packed, or one column a thread over several chunks)
  // finishes dbias itself, unless told not to: the same bits.
  const bool folds = sums_chunks(t, rows, cols, shift);
  expect_fold_agrees(
      [&] {
        const auto fdx = poisoned(dx, shift), fdb = put(db0);
        const auto fws = scratch(gs::column_sums_bytes(t, rows, cols, 1));
        cuda::bias_gelu_backward(t, ddy.ptr(), dyy.ptr(), with_bias ? dbi.ptr() : nullptr, fdx.ptr(), fdb.ptr(), acc,
                                 rows, cols, fws.ws(), nullptr);
        return std::vector<Tensor>{get(fdx, dx), get(fdb, dbias)};
      },
      folds, "bias_gelu_backward: folded finish vs its own launch");
}

void column_sums(DType t, DType acc, i64 rows, i64 cols, std::size_t shift, std::mt19937& rng) {
  const Tensor x = tensor_of({rows, cols}, randn(rows * cols, rng), t), s0 = tensor_of({cols}, randn(cols, rng), acc);
  Tensor sums = like(s0);
  kernels::column_sums(x, sums);
  const auto dx = put(x, shift), ds = put(s0);
  const auto ws = scratch(gs::column_sums_bytes(t, rows, cols, 1));
  cuda::column_sums(t, dx.ptr(), ds.ptr(), acc, rows, cols, ws.ws(), nullptr, "the test");
  expect_sums(get(ds, sums), sums, column_magnitudes(x, s0, cols), rows, "column_sums");
  const bool folds = sums_chunks(t, rows, cols, shift);
  expect_fold_agrees(
      [&] {
        const auto fs = put(s0);
        const auto fws = scratch(gs::column_sums_bytes(t, rows, cols, 1));
        cuda::column_sums(t, dx.ptr(), fs.ptr(), acc, rows, cols, fws.ws(), nullptr, "the test");
        return std::vector<Tensor>{get(fs, sums)};
      },
      folds, "column_sums: folded finish vs its own launch");
}

// ------------------------------------------------------------ softmax
void softmax(DType t, i64 mats, i64 n, std::mt19937& rng) {
  const Tensor scores = tensor_of({mats, n, n}, randn(mats * n * n, rng, 3.0), t);
  const Tensor dprobs = tensor_of({mats, n, n}, randn(mats * n * n, rng), t);
  const double scale = 0.125;
  Tensor probs = like(scores);
  kernels::causal_softmax_forward(scores, scale, probs);
  const auto ds = put(scores), dp = poisoned(probs);
  cuda::causal_softmax_forward(t, ds.ptr(), scale, dp.ptr(), mats, n, n, nullptr);
  const Tensor got_p = get(dp, probs);
  expect_close(values(got_p), values(probs), 4 * ulp(t), 1e-6, "causal_softmax_forward");
  // The last few queries over all the keys (a key/value cache's decode step).
  for (const i64 sq : {i64{1}, std::min<i64>(3, n)}) {
    const Tensor last = tensor_of({mats, sq, n}, randn(mats * sq * n, rng, 3.0), t);
    Tensor want = like(last);
    kernels::causal_softmax_forward(last, scale, want);
    const auto dl = put(last), dw = poisoned(want);
    cuda::causal_softmax_forward(t, dl.ptr(), scale, dw.ptr(), mats, sq, n, nullptr);
    expect_close(values(get(dw, want)), values(want), 4 * ulp(t), 1e-6, "causal_softmax_forward, queries < keys");
  }

  // The backward of the launcher's own probabilities.
  Tensor dscores = like(dprobs);
  kernels::causal_softmax_backward(dprobs, got_p, scale, dscores);
  const auto ddp = put(dprobs), dpp = put(got_p), dds = poisoned(dscores);
  cuda::causal_softmax_backward(t, ddp.ptr(), dpp.ptr(), scale, dds.ptr(), mats, n, nullptr);
  expect_close(values(get(dds, dscores)), values(dscores), 4 * ulp(t), 1e-6 * largest(dscores),
               "causal_softmax_backward");
}

// Per-document masks (--reset-attention-mask): `samples` samples of `heads`
// matrices, each sample's documents starting at its own rows, so a row
// reading another sample's starts, or the mask's lower end off by one, shows.
void softmax_documents(DType t, i64 samples, i64 heads, i64 n, std::mt19937& rng) {
  const i64 mats = samples * heads;
  std::vector<std::int64_t> starts(static_cast<std::size_t>(samples * n));
  for (i64 b = 0; b < samples; ++b) {
    std::int64_t start = 0;
    for (i64 i = 0; i < n; ++i) {
      if (i > 0 && rng() % 5 == 0) start = i;  // a document starts at row i
      starts[static_cast<std::size_t>(b * n + i)] = start;
    }
  }
  const Tensor key_starts = ids_of(starts);
  const Tensor scores = tensor_of({mats, n, n}, randn(mats * n * n, rng, 3.0), t);
  const Tensor dprobs = tensor_of({mats, n, n}, randn(mats * n * n, rng), t);
  const double scale = 0.125;
  Tensor probs = like(scores), dscores = like(dprobs);
  kernels::causal_softmax_forward(scores, scale, probs, key_starts);
  kernels::causal_softmax_backward(dprobs, probs, scale, dscores, key_starts);
  const auto ks = put(key_starts), ds = put(scores), dp = poisoned(probs);
  const auto* kp = static_cast<const std::int64_t*>(ks.ptr());
  cuda::causal_softmax_forward(t, ds.ptr(), scale, dp.ptr(), mats, n, n, nullptr, kp, heads * n);
  const Tensor got_p = get(dp, probs);
  expect_close(values(got_p), values(probs), 4 * ulp(t), 1e-6, "causal_softmax_forward, per-document masks");
  const auto ddp = put(dprobs), dpp = put(probs), dds = poisoned(dscores);
  cuda::causal_softmax_backward(t, ddp.ptr(), dpp.ptr(), scale, dds.ptr(), mats, n, nullptr, kp, heads * n);
  expect_close(values(get(dds, dscores)), values(dscores), 4 * ulp(t), 1e-6 * largest(dscores),
               "causal_softmax_backward, per-document masks");
  // The same masks as cuDNN's additive bias [samples, 1, n, n]: 0 from the
  // row's document start on, a large negative (rounded to t) before it.
  const Tensor bias_like = Tensor::empty(cpu(), {samples, 1, n, n}, t, MemoryCategory::Other);
  const auto db = poisoned(bias_like);
  cuda::document_mask_bias(t, kp, samples, n, db.ptr(), nullptr);
  const std::vector<double> got_bias = values(get(db, bias_like));
  const double masked = values(tensor_of({1}, {cuda::document_mask_bias_value(t)}, t))[0];
  int wrong = masked < -6e4 && std::isfinite(masked) ? 0 : 1;  // finite (cuDNN's advice) and far below any score
  for (i64 b = 0; b < samples; ++b)
    for (i64 i = 0; i < n; ++i)
      for (i64 j = 0; j < n; ++j) {
        const double want = j >= starts[static_cast<std::size_t>(b * n + i)] ? 0.0 : masked;
        wrong += got_bias[static_cast<std::size_t>((b * n + i) * n + j)] != want;
      }
  expect_close({static_cast<double>(wrong)}, {0.0}, 0, 0, "document_mask_bias: wrong elements");
}

// ------------------------------------------------------------ cross-entropy
void cross_entropy(DType t, i64 rows, i64 cols, i64 valid, i64 vocab_start, std::mt19937& rng) {
  const DType stat = t == DType::F64 ? DType::F64 : DType::F32;
  const Tensor logits = tensor_of({rows, cols}, randn(rows * cols, rng, 3.0), t);
  // Targets over a vocabulary three slices wide: some on this rank's slice
  // (its valid columns), some off it.
  std::vector<std::int64_t> ids(static_cast<std::size_t>(rows));
  std::uniform_int_distribution<std::int64_t> pick(0, 3 * valid - 1);
  for (auto& id : ids) id = pick(rng);
  ids[0] = vocab_start;              // this slice's first column
  ids[1] = vocab_start + valid - 1;  // and its last real one
  const Tensor targets = ids_of(ids);
  const Tensor zero = Tensor::zeros(cpu(), {rows}, stat, MemoryCategory::Other);
  Tensor row_max = like(zero), sum_exp = like(zero), target_logit = like(zero);
  kernels::cross_entropy_forward(logits, targets, vocab_start, valid, row_max, sum_exp, target_logit);

  const auto dl = put(logits), dt = put(targets), dm = poisoned(zero), dse = poisoned(zero), dtl = poisoned(zero);
  cuda::cross_entropy_forward(t, dl.ptr(), static_cast<const std::int64_t*>(dt.ptr()), vocab_start, rows, cols, valid,
                              dm.ptr(), dse.ptr(), dtl.ptr(), nullptr);
  expect_bits(get(dm, zero), row_max, "cross_entropy_forward row_max");
  expect_close(values(get(dse, zero)), values(sum_exp), 1e-6, 0, "cross_entropy_forward sum_exp");
  expect_bits(get(dtl, zero), target_logit, "cross_entropy_forward target_logit");

  // As if another rank's max were larger by 0.5: rescale, then the loss.
  std::vector<double> g = values(row_max);
  for (std::size_t i = 1; i < g.size(); i += 2) g[i] += 0.5;
  const Tensor global_max = tensor_of({rows}, g, stat);
  const auto dgm = put(global_max);
  Tensor rescaled = like(sum_exp);
  kernels::rescale_sum_exp(row_max, global_max, rescaled);
  const auto drs = put(sum_exp);
  cuda::rescale_sum_exp(stat, dm.ptr(), dgm.ptr(), rows, drs.ptr(), nullptr);
  const Tensor got_rs = get(drs, sum_exp);
  expect_close(values(got_rs), values(rescaled), 1e-6, 0, "rescale_sum_exp");

  Tensor loss = like(zero);
  kernels::cross_entropy_loss(global_max, rescaled, target_logit, loss);
  const auto dloss = poisoned(zero), drs2 = put(rescaled);
  cuda::cross_entropy_loss(stat, dgm.ptr(), drs2.ptr(), dtl.ptr(), nullptr, rows, dloss.ptr(), nullptr);
  expect_close(values(get(dloss, zero)), values(loss), 1e-6, 1e-6, "cross_entropy_loss");

  // Row weights (--eod-mask-loss): 0 drops a row, 1 keeps its bits, others
  // scale it; the launcher against the CPU kernel with the same weights.
  std::vector<double> wv(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < wv.size(); ++i) wv[i] = i % 3 == 0 ? 0.0 : i % 3 == 1 ? 1.0 : 1.75;
  const Tensor weight = tensor_of({rows}, wv, stat);
  const auto dw = put(weight);
  Tensor wloss = like(zero);
  kernels::cross_entropy_loss(global_max, rescaled, target_logit, wloss, &weight);
  const auto dwloss = poisoned(zero);
  cuda::cross_entropy_loss(stat, dgm.ptr(), drs2.ptr(), dtl.ptr(), dw.ptr(), rows, dwloss.ptr(), nullptr);
  const Tensor got_wloss = get(dwloss, zero);
  expect_close(values(got_wloss), values(wloss), 1e-6, 1e-6, "cross_entropy_loss with row weights");
  for (std::size_t i = 0; i < wv.size(); ++i) {
    const double want = wv[i] == 0.0 ? 0.0 : wv[i] == 1.0 ? values(get(dloss, zero))[i] : values(got_wloss)[i];
    check(values(got_wloss)[i] == want, "weighted loss: weight 0 gives 0, weight 1 the unweighted bits",
          values(got_wloss)[i], want, static_cast<i64>(i));
  }

  const double scale = 1.0 / static_cast<double>(rows);
  Tensor dlogits = like(logits);
  kernels::cross_entropy_backward(logits, global_max, rescaled, targets, vocab_start, valid, scale, dlogits);
  const auto dd = poisoned(logits);
  cuda::cross_entropy_backward(t, dl.ptr(), dgm.ptr(), drs2.ptr(), static_cast<const std::int64_t*>(dt.ptr()),
                               vocab_start, rows, cols, valid, scale, nullptr, dd.ptr(), nullptr);
  const Tensor got_d = get(dd, logits);
  expect_close(values(got_d), values(dlogits), 2 * ulp(t), 1e-7 * scale, "cross_entropy_backward");
  Tensor wdlogits = like(logits);
  kernels::cross_entropy_backward(logits, global_max, rescaled, targets, vocab_start, valid, scale, wdlogits, &weight);
  const auto dwd = poisoned(logits);
  cuda::cross_entropy_backward(t, dl.ptr(), dgm.ptr(), drs2.ptr(), static_cast<const std::int64_t*>(dt.ptr()),
                               vocab_start, rows, cols, valid, scale, dw.ptr(), dwd.ptr(), nullptr);
  const Tensor got_wd = get(dwd, logits);
  expect_close(values(got_wd), values(wdlogits), 2 * ulp(t), 1e-7 * scale, "cross_entropy_backward with row weights");
  for (i64 r = 0; r < rows; ++r)
    for (i64 c = 0; c < cols; ++c) {
      const auto i = static_cast<std::size_t>(r * cols + c);
      const double w = wv[static_cast<std::size_t>(r)];
      if (w == 0.0 || w == 1.0)
        check(values(got_wd)[i] == (w == 0.0 ? 0.0 : values(got_d)[i]),
              "weighted gradient: weight 0 gives 0, weight 1 the unweighted bits", values(got_wd)[i],
              w == 0.0 ? 0.0 : values(got_d)[i], static_cast<i64>(i));
    }

  // One TP rank: the fused launcher in place, against the two launchers with
  // global_max = row_max, bit for bit; one launch where the row fits in
  // shared memory twice an SM, else the two kernels (an opt-in maximum cut
  // below twice the row).
  const auto du = put(logits);
  cuda::cross_entropy_backward(t, dl.ptr(), dm.ptr(), dse.ptr(), static_cast<const std::int64_t*>(dt.ptr()),
                               vocab_start, rows, cols, valid, scale, nullptr, du.ptr(), nullptr);
  const Tensor want_d = get(du, logits);
  const auto dwu = put(logits);
  cuda::cross_entropy_backward(t, dl.ptr(), dm.ptr(), dse.ptr(), static_cast<const std::int64_t*>(dt.ptr()),
                               vocab_start, rows, cols, valid, scale, dw.ptr(), dwu.ptr(), nullptr);
  const Tensor want_wd = get(dwu, logits);
  const int optin = emu::device().smem_optin;
  for (const bool fits : {true, false})
    for (const bool weighted : {false, true}) {
      emu::device().smem_optin = fits ? optin : static_cast<int>(2 * cols * static_cast<i64>(dtype_size(t)) - 1);
      const auto df = put(logits), dmf = poisoned(zero), dsf = poisoned(zero), dtf = poisoned(zero);
      const Launches n;
      const bool fused = cuda::cross_entropy_forward_backward(
          t, df.ptr(), static_cast<const std::int64_t*>(dt.ptr()), vocab_start, rows, cols, valid, scale,
          weighted ? dw.ptr() : nullptr, dmf.ptr(), dsf.ptr(), dtf.ptr(), df.ptr(), nullptr);
      const char* how = fits       ? weighted ? "cross_entropy_forward_backward (fused, row weights)"
                                              : "cross_entropy_forward_backward (fused)"
                        : weighted ? "cross_entropy_forward_backward (two kernels, row weights)"
                                   : "cross_entropy_forward_backward (two kernels)";
      check(fused == fits, how, fused, fits, 0);
      n.expect(fits ? 1 : 2, how);
      expect_bits(get(dmf, zero), get(dm, zero), how);
      expect_bits(get(dsf, zero), get(dse, zero), how);
      expect_bits(get(dtf, zero), get(dtl, zero), how);
      expect_bits(get(df, logits), weighted ? want_wd : want_d, how);
    }
  emu::device().smem_optin = optin;
}

// A MEGAZERO_COLUMN_FINISH the launchers do not know: a ConfigError naming
// the variable, both values and what was given (the trainer reads it so at
// start-up); a known value read after it is kept.
void column_finish_refused() {
  namespace g = megazero::kernels::gpu_scratch;
  setenv("MEGAZERO_COLUMN_FINISH", "fold", 1);
  std::string message;
  try {
    g::read_column_finish_setting();
  } catch (const megazero::ConfigError& e) {
    message = e.what();
  }
  const bool named = message.find("MEGAZERO_COLUMN_FINISH") != std::string::npos &&
                     message.find("'folded'") != std::string::npos && message.find("'kernel'") != std::string::npos &&
                     message.find("'fold'") != std::string::npos;
  check(named, "MEGAZERO_COLUMN_FINISH=fold: a ConfigError naming the variable, its values and what was given", 0, 1,
        0);
  setenv("MEGAZERO_COLUMN_FINISH", "kernel", 1);
  check(!g::read_column_finish_setting() && !g::column_finish_folded(), "MEGAZERO_COLUMN_FINISH=kernel: kept", 0, 1, 0);
  unsetenv("MEGAZERO_COLUMN_FINISH");
  check(g::read_column_finish_setting() && g::column_finish_folded(), "MEGAZERO_COLUMN_FINISH unset: folded", 0, 1, 0);
}

}  // namespace

int main() {
  return run_launcher_test([] {
    std::mt19937 rng(2027);
    column_finish_refused();
    for (const DType t : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
      const i64 v = 16 / static_cast<i64>(dtype_size(t));
      const std::size_t e = dtype_size(t);
      elementwise(t, 300 * v, 0, rng);      // packs
      elementwise(t, 300 * v + 3, 0, rng);  // packs and a scalar tail
      elementwise(t, 300 * v, e, rng);      // unaligned: scalar
      bias_maps(t, 9, 24 * v, 0, rng);      // whole packs a period
      bias_maps(t, 9, 24 * v + 2, 0, rng);  // a period of part packs: scalar
      bias_maps(t, 9, 24 * v, e, rng);      // unaligned
      for (const DType acc : {DType::F32, t}) {
        // fp64 activations take fp64 accumulators only.
        if ((acc == t && t == DType::F32) || (t == DType::F64 && acc != t)) continue;
        bias_gelu_backward(t, acc, 150, 16 * v, true, 0, rng);   // several chunks: packed
        bias_gelu_backward(t, acc, 150, 16 * v, false, 0, rng);  // no bias
        bias_gelu_backward(t, acc, 40, 16 * v, true, 0, rng);    // one chunk
        bias_gelu_backward(t, acc, 150, 16 * v + 1, true, 0, rng);
        bias_gelu_backward(t, acc, 150, 16 * v, true, e, rng);
        column_sums(t, acc, 150, 40 * v, 0, rng);
        column_sums(t, acc, 20, 40 * v + 3, 0, rng);
        column_sums(t, acc, 150, 40 * v + 3, 0, rng);  // one column a thread, several chunks
      }
      // Each warp width class; fp64 takes a block a row (a block a row costs
      // the emulation ~30 ms, so fp32's rows over 1024 are left to test_cuda).
      if (t == DType::F64)
        for (const i64 n : {5, 40}) softmax(t, 1, n, rng);
      else
        for (const i64 n : {20, 33, 65, 129, 257, 513}) softmax(t, 1, n, rng);  // just over each class's bottom
      if (t == DType::F64)
        softmax_documents(t, 2, 1, 6, rng);  // a block a row
      else
        for (const i64 n : {33, 129}) softmax_documents(t, 2, 3, n, rng);
      cross_entropy(t, 6, 64 * v, 64 * v, 64 * v, rng);       // 16-byte path, no padding
      cross_entropy(t, 6, 64 * v, 64 * v - 5, 0, rng);        // padding columns
      cross_entropy(t, 6, 64 * v + 3, 64 * v + 3, 128, rng);  // odd width
    }
  });
}
