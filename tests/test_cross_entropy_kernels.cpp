// The vocabulary-parallel cross-entropy's pieces
// (megazero/kernels/cross_entropy.h): split over vocabulary slices with
// padding and combined as the TP all-reduces do, they give the unsplit loss
// and gradient (against references written here in double, and finite
// differences of the kernels' own loss); the forward leaves the logits as they
// were and the backward may overwrite them; then bf16 and fp16 storage
// (HalfStorage): fp32 statistics, long rows through the vector exponentials,
// and a gradient rounded once next to 16-bit midpoints.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernel_test_util.h"
#include "megazero/kernels/cross_entropy.h"
#include "megazero/kernels/softmax.h"

using namespace megazero;
using namespace megazero::kernels;
using namespace kernel_test;

namespace {

struct CeProblem {
  i64 n, vocab;
  Vec logits;  // [n, vocab]
  std::vector<i64> targets;
};

CeProblem ce_problem(unsigned seed) {
  std::mt19937 rng(seed);
  CeProblem p{6, 11, {}, {}};
  p.logits = to_f32(randn(usize(p.n * p.vocab), rng, 3.0));
  std::uniform_int_distribution<i64> pick(0, p.vocab - 1);
  for (i64 i = 0; i < p.n; ++i) p.targets.push_back(pick(rng));
  return p;
}

// Mean over rows of -log softmax(logits)[target], and its gradient.
double ce_loss_ref(const CeProblem& p, const Vec& logits) {
  double loss = 0;
  for (i64 r = 0; r < p.n; ++r) {
    double mx = -1e300, sum = 0;
    for (i64 c = 0; c < p.vocab; ++c) mx = std::max(mx, logits[usize(r * p.vocab + c)]);
    for (i64 c = 0; c < p.vocab; ++c) sum += std::exp(logits[usize(r * p.vocab + c)] - mx);
    loss += std::log(sum) + mx - logits[usize(r * p.vocab + p.targets[usize(r)])];
  }
  return loss / static_cast<double>(p.n);
}

Vec ce_grad_ref(const CeProblem& p) {
  Vec g(p.logits.size());
  for (i64 r = 0; r < p.n; ++r) {
    double mx = -1e300, sum = 0;
    for (i64 c = 0; c < p.vocab; ++c) mx = std::max(mx, p.logits[usize(r * p.vocab + c)]);
    for (i64 c = 0; c < p.vocab; ++c) sum += std::exp(p.logits[usize(r * p.vocab + c)] - mx);
    for (i64 c = 0; c < p.vocab; ++c)
      g[usize(r * p.vocab + c)] = (std::exp(p.logits[usize(r * p.vocab + c)] - mx) / sum - (c == p.targets[usize(r)])) /
                                  static_cast<double>(p.n);
  }
  return g;
}

// One rank's slice: global columns [start, start + valid), stored in
// `local` >= valid columns whose tail is padding (filled with huge values, which
// must not leak into max, sum or gradient).
struct Slice {
  i64 start, valid, local;
};

struct CeResult {
  double loss;
  Vec grad;  // [n, vocab], the valid columns of every slice put back together
};

// Runs the kernels per slice and combines the statistics as the TP
// all-reduces do (max; then the rescaled sums and the target logits).
// Statistics are kept in row_stat_dtype(t): fp32 for 16-bit logits.
// weights: each row's loss weight (--eod-mask-loss), or none.
CeResult ce_split(const CeProblem& p, const std::vector<Slice>& slices, DType t, const Vec* weights = nullptr) {
  const DType stat = row_stat_dtype(t);
  const Tensor w = weights ? tensor({p.n}, *weights, stat) : Tensor();
  const Tensor* wp = weights ? &w : nullptr;
  const Tensor targets = ids_tensor(p.targets);
  const auto rows = usize(p.n);
  std::vector<Tensor> logits, maxes, sums;
  Vec gmax(rows, -std::numeric_limits<double>::infinity()), gsum(rows, 0.0), target(rows, 0.0);
  for (const auto& s : slices) {
    Vec local(rows * usize(s.local), 1e4);
    for (i64 r = 0; r < p.n; ++r)
      for (i64 c = 0; c < s.valid; ++c) local[usize(r * s.local + c)] = p.logits[usize(r * p.vocab + s.start + c)];
    logits.push_back(tensor({p.n, s.local}, local, t));
    Tensor mx = empty({p.n}, stat), se = empty({p.n}, stat), tl = empty({p.n}, stat);
    const Vec before = vals(logits.back());
    cross_entropy_forward(logits.back(), targets, s.start, s.valid, mx, se, tl);  // local max and sum
    const Vec mv = vals(mx), tv = vals(tl);
    expect_same(vals(logits.back()), before, "the forward leaves the logits (padding's huge values too)");
    for (std::size_t r = 0; r < rows; ++r) gmax[r] = std::max(gmax[r], mv[r]), target[r] += tv[r];
    maxes.push_back(mx), sums.push_back(se);
  }
  const Tensor global_max = tensor({p.n}, gmax, stat);
  for (std::size_t k = 0; k < slices.size(); ++k) {
    rescale_sum_exp(maxes[k], global_max, sums[k]);  // a slice of padding only stays 0
    const Vec sv = vals(sums[k]);
    for (std::size_t r = 0; r < rows; ++r) gsum[r] += sv[r];
  }
  const Tensor global_sum = tensor({p.n}, gsum, stat);
  Tensor loss = empty({p.n}, stat);
  cross_entropy_loss(global_max, global_sum, tensor({p.n}, target, stat), loss, wp);
  CeResult out{0.0, Vec(p.logits.size(), 0.0)};
  for (double l : vals(loss)) out.loss += l / static_cast<double>(p.n);
  for (std::size_t k = 0; k < slices.size(); ++k) {
    const auto& s = slices[k];
    Tensor d = tensor({p.n, s.local}, Vec(rows * usize(s.local), 1e30), t);
    cross_entropy_backward(logits[k], global_max, global_sum, targets, s.start, s.valid, 1.0 / static_cast<double>(p.n),
                           d, wp);
    const Vec dv = vals(d);
    for (i64 r = 0; r < p.n; ++r) {
      for (i64 c = 0; c < s.valid; ++c) out.grad[usize(r * p.vocab + s.start + c)] = dv[usize(r * s.local + c)];
      for (i64 c = s.valid; c < s.local; ++c) EXPECT_EQ(dv[usize(r * s.local + c)], 0.0) << "padding column";
    }
  }
  return out;
}

// `per` columns per rank, each slice padded with 2 extra columns.
std::vector<Slice> slices_of(i64 vocab, i64 per, i64 ranks) {
  std::vector<Slice> out;
  for (i64 r = 0; r < ranks; ++r) out.push_back({r * per, std::clamp(vocab - r * per, i64{0}, per), per + 2});
  return out;
}

TEST(CrossEntropy, VocabSlicesCombineToTheUnsplitLossAndGradient) {
  const CeProblem p = ce_problem(18);
  const double loss = ce_loss_ref(p, p.logits);
  const Vec grad = ce_grad_ref(p);
  // {ranks, columns per rank}: 11 = 11, 6 + 5, 3 + 3 + 3 + 2, and 6 + 5 + 0 (a rank of padding only).
  for (auto [ranks, per] : {std::pair<i64, i64>{1, 11}, {2, 6}, {4, 3}, {3, 6}}) {
    SCOPED_TRACE(testing::Message() << ranks << " slices of " << per);
    const CeResult r64 = ce_split(p, slices_of(p.vocab, per, ranks), DType::F64);
    EXPECT_NEAR(r64.loss, loss, 1e-13);
    expect_close(r64.grad, grad, 1e-13, 1e-15, "fp64 gradient");
    const CeResult r32 = ce_split(p, slices_of(p.vocab, per, ranks), DType::F32);
    EXPECT_NEAR(r32.loss, loss, 1e-5);
    expect_close(r32.grad, grad, 1e-5, 1e-7, "fp32 gradient");
  }
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferencesOfTheKernelLoss) {
  const CeProblem p = ce_problem(19);
  const auto slices = slices_of(p.vocab, 3, 4);
  const Vec grad = ce_split(p, slices, DType::F64).grad;
  const Vec one = {1.0};
  expect_fd_gradient(
      "dlogits", p.logits,
      [&](const Vec& l) {
        CeProblem q = p;
        q.logits = l;
        return Vec{ce_split(q, slices, DType::F64).loss};
      },
      one, grad);
}

// Row weights (--eod-mask-loss): the loss is the weighted mean and the
// gradient is its derivative (finite differences of the kernels' own weighted
// loss, over vocabulary slices); a weight of 0 drops the row exactly, weights
// of 1 are the unweighted bits, and the one-rank forward + backward call
// weighs as the two kernels do.
TEST(CrossEntropy, RowWeightsWeighTheLossAndItsGradient) {
  const CeProblem p = ce_problem(21);
  const Vec weights = {0.0, 1.5, 1.0, 0.0, 2.25, 1.25};
  const auto slices = slices_of(p.vocab, 3, 4);
  const CeResult weighted = ce_split(p, slices, DType::F64, &weights);
  const CeResult plain = ce_split(p, slices, DType::F64);
  double want = 0;
  for (i64 r = 0; r < p.n; ++r) {
    CeProblem row{
        1, p.vocab, Vec(p.logits.begin() + r * p.vocab, p.logits.begin() + (r + 1) * p.vocab), {p.targets[usize(r)]}};
    want += weights[usize(r)] * ce_loss_ref(row, row.logits) / static_cast<double>(p.n);
  }
  EXPECT_NEAR(weighted.loss, want, 1e-13);
  for (i64 r = 0; r < p.n; ++r)
    for (i64 c = 0; c < p.vocab; ++c) {
      const auto i = usize(r * p.vocab + c);
      if (weights[usize(r)] == 0.0) {
        EXPECT_EQ(weighted.grad[i], 0.0) << "a dropped row's gradient is exactly 0";
      }
      if (weights[usize(r)] == 1.0) {
        EXPECT_EQ(weighted.grad[i], plain.grad[i]) << "weight 1 keeps the bits";
      }
    }
  expect_fd_gradient(
      "dlogits (weighted)", p.logits,
      [&](const Vec& l) {
        CeProblem q = p;
        q.logits = l;
        return Vec{ce_split(q, slices, DType::F64, &weights).loss};
      },
      Vec{1.0}, weighted.grad);
  const Vec ones(usize(p.n), 1.0);
  for (const DType t : {DType::F32, DType::BF16}) {
    const CeResult a = ce_split(p, slices, t, &ones), b = ce_split(p, slices, t);
    EXPECT_EQ(a.loss, b.loss);
    expect_same(a.grad, b.grad, "weights of 1");
  }
  // One rank: forward + backward in one call, weighted as the two kernels.
  const DType stat = row_stat_dtype(DType::F32);
  const Tensor targets = ids_tensor(p.targets), w = tensor({p.n}, weights, stat);
  Tensor fused = tensor({p.n, p.vocab}, p.logits, DType::F32), two = tensor({p.n, p.vocab}, p.logits, DType::F32);
  Tensor m1 = empty({p.n}, stat), s1 = empty({p.n}, stat), t1 = empty({p.n}, stat);
  Tensor m2 = empty({p.n}, stat), s2 = empty({p.n}, stat), t2 = empty({p.n}, stat);
  cross_entropy_forward_backward(fused, targets, p.vocab, 0.5, m1, s1, t1, fused, &w);
  cross_entropy_forward(two, targets, 0, p.vocab, m2, s2, t2);
  cross_entropy_backward(two, m2, s2, targets, 0, p.vocab, 0.5, two, &w);
  expect_same(vals(fused), vals(two), "forward_backward with row weights");
  // Weights of another dtype than the statistics' are refused.
  const Tensor w64 = tensor({p.n}, weights, DType::F64);
  EXPECT_THROW(cross_entropy_backward(two, m2, s2, targets, 0, p.vocab, 0.5, two, &w64), InternalError);
}

// The forward only reads the logits, and the backward may write the gradient
// over them (what the GPT head does).
TEST(CrossEntropy, ForwardLeavesTheLogitsAndBackwardOverwritesThem) {
  const CeProblem p = ce_problem(20);
  const Tensor targets = ids_tensor(p.targets);
  Tensor d = tensor({p.n, p.vocab}, p.logits);
  Tensor mx = empty({p.n}), se = empty({p.n}), tl = empty({p.n}), loss = empty({p.n});
  cross_entropy_forward(d, targets, 0, p.vocab, mx, se, tl);
  const Vec mv = vals(mx), sv = vals(se), tv = vals(tl);
  expect_same(vals(d), p.logits, "logits untouched");
  for (i64 r = 0; r < p.n; ++r) {
    double mref = -1e300, sref = 0;
    for (i64 c = 0; c < p.vocab; ++c) mref = std::max(mref, p.logits[usize(r * p.vocab + c)]);
    EXPECT_EQ(mv[usize(r)], mref) << "row max is exact";
    EXPECT_EQ(tv[usize(r)], p.logits[usize(r * p.vocab + p.targets[usize(r)])]) << "target logit is exact";
    for (i64 c = 0; c < p.vocab; ++c) sref += std::exp(p.logits[usize(r * p.vocab + c)] - mref);
    EXPECT_NEAR(sv[usize(r)], sref, 1e-14 * sref);
  }
  cross_entropy_loss(mx, se, tl, loss);
  double mean_loss = 0;
  for (double l : vals(loss)) mean_loss += l / static_cast<double>(p.n);
  EXPECT_NEAR(mean_loss, ce_loss_ref(p, p.logits), 1e-13);
  cross_entropy_backward(d, mx, se, targets, 0, p.vocab, 1.0 / static_cast<double>(p.n), d);  // in place
  expect_close(vals(d), ce_grad_ref(p), 1e-13, 1e-15, "in place");
}

// =========================== 16-bit storage ===========================
// (kernel_test_util.h: inputs rounded to the dtype first, the fp64 reference on
// the same values, each output within one rounding or bit for bit.)

TEST(HalfStorage, CrossEntropyPiecesWithFp32Statistics) {
  for (DType t : kHalfDtypes) {
    SCOPED_TRACE(dtype_name(t));
    CeProblem p = ce_problem(61);
    p.logits = rounded(p.logits, t);
    const double loss = ce_loss_ref(p, p.logits);
    const Vec grad = ce_grad_ref(p);
    for (auto [ranks, per] : {std::pair<i64, i64>{1, 11}, {2, 6}, {3, 6}}) {
      SCOPED_TRACE(testing::Message() << ranks << " slices of " << per);
      const CeResult r = ce_split(p, slices_of(p.vocab, per, ranks), t);
      // Max and target logit are exact, sum_exp and the combination fp32.
      EXPECT_NEAR(r.loss, loss, 1e-6 * std::fabs(loss));
      // The backward's exponentials are fp32 (libmvec's, within 4 ulp) and
      // dlogits is rounded once to 16 bits (relative error <= 2^-8 bf16 /
      // 2^-11 fp16: it was two roundings while the forward kept the
      // exponentials in 16 bits); the target's column cancels (p - 1),
      // hence the absolute term.
      const double eps = (t == DType::BF16 ? 0x1p-8 : 0x1p-11) + 1e-6;
      expect_close(r.grad, grad, eps, 1e-6 / static_cast<double>(p.n), "dlogits");
    }
    // The pieces one by one, against double on the same values.
    const Tensor targets = ids_tensor(p.targets);
    Tensor logits = tensor({p.n, p.vocab}, p.logits, t);
    const i64 valid = p.vocab - 2;  // the last two columns act as padding
    Tensor mx = empty({p.n}, DType::F32), se = empty({p.n}, DType::F32), tl = empty({p.n}, DType::F32);
    cross_entropy_forward(logits, targets, 0, valid, mx, se, tl);
    Vec want_mx(usize(p.n), -1e300), want_se(usize(p.n), 0.0), want_tl(usize(p.n), 0.0);
    for (i64 r = 0; r < p.n; ++r) {
      for (i64 c = 0; c < valid; ++c) want_mx[usize(r)] = std::max(want_mx[usize(r)], p.logits[usize(r * p.vocab + c)]);
      for (i64 c = 0; c < valid; ++c) {
        // fp32 exp of an exact difference, summed in double.
        const float e = std::exp(static_cast<float>(p.logits[usize(r * p.vocab + c)] - want_mx[usize(r)]));
        want_se[usize(r)] += e;
      }
      if (p.targets[usize(r)] < valid) want_tl[usize(r)] = p.logits[usize(r * p.vocab + p.targets[usize(r)])];
    }
    expect_same(vals(mx), want_mx, "row max is exact");
    expect_same(vals(tl), want_tl, "target logit is exact");
    expect_close(vals(se), want_se, 1e-7, 0, "sum_exp (fp32 exp per term, double sum)");
    expect_same(vals(logits), p.logits, "logits untouched");
    Tensor d = empty({p.n, p.vocab}, t), inplace = tensor({p.n, p.vocab}, vals(logits), t);
    cross_entropy_backward(logits, mx, se, targets, 0, valid, 0.5, d);
    cross_entropy_backward(inplace, mx, se, targets, 0, valid, 0.5, inplace);
    expect_same(vals(inplace), vals(d), "cross_entropy_backward in place");
    for (i64 r = 0; r < p.n; ++r)
      for (i64 c = valid; c < p.vocab; ++c) EXPECT_EQ(vals(d)[usize(r * p.vocab + c)], 0.0) << "padding";
  }
}

// Rows long enough for the vector exponentials' body and remainder (16 lanes
// with AVX-512; the tests above use rows of at most 11): the vocab-parallel
// cross-entropy on 1037-column slices (1030 valid) and the causal softmax on
// 40-column rows, in fp32 and 16 bits (whose rows go through a per-thread fp32
// copy). Each exponential is libmvec's, within 4 fp32 ulp of exp of the fp32
// argument: for 16-bit storage, well within the 1% slack of one rounding.
TEST(HalfStorage, LongRowsTakeTheVectorExponentialsWithinTheirBound) {
  const i64 n = 3, vocab = 1037, valid = 1030;
  std::mt19937 rng(77);
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(t));
    const Vec x = rounded(to_f32(randn(usize(n * vocab), rng, 4.0)), t);
    const std::vector<i64> targets = {5, 1029, 1033};  // the last is another rank's (>= valid)
    Tensor logits = tensor({n, vocab}, x, t);
    Tensor mx = empty({n}, DType::F32), se = empty({n}, DType::F32), tl = empty({n}, DType::F32);
    cross_entropy_forward(logits, ids_tensor(targets), 0, valid, mx, se, tl);
    const Vec m = vals(mx), sum = vals(se), target = vals(tl);
    Vec unrounded(x.size(), 0.0);  // exp of the fp32 argument, in double
    for (i64 r = 0; r < n; ++r) {
      double want_m = -1e300, want_sum = 0;
      for (i64 c = 0; c < valid; ++c) want_m = std::max(want_m, x[usize(r * vocab + c)]);
      EXPECT_EQ(m[usize(r)], want_m) << "row max is exact";
      for (i64 c = 0; c < valid; ++c) {
        // The fp32 argument the kernel exponentiates, then exp in double.
        const float arg = static_cast<float>(x[usize(r * vocab + c)]) - static_cast<float>(want_m);
        const double w = std::exp(static_cast<double>(arg));
        unrounded[usize(r * vocab + c)] = w;
        want_sum += w;
      }
      EXPECT_NEAR(sum[usize(r)], want_sum, 1e-6 * want_sum) << "sum_exp, row " << r;
      EXPECT_EQ(target[usize(r)], targets[usize(r)] < valid ? x[usize(r * vocab + targets[usize(r)])] : 0.0);
    }
    // The backward over the same rows (its own exponentials, the cloned,
    // vectorised store): each gradient is exp(arg) * 0.5 / sum_exp, the
    // exponential within 4 fp32 ulp, rounded once to the storage type.
    Tensor d = empty({n, vocab}, t);
    cross_entropy_backward(logits, mx, se, ids_tensor(targets), 0, valid, 0.5, d);
    const Vec got = vals(d);
    for (i64 r = 0; r < n; ++r) {
      const double f = 0.5 / sum[usize(r)];
      for (i64 c = 0; c < vocab; ++c) {
        const std::size_t i = usize(r * vocab + c);
        if (c >= valid) {
          ASSERT_EQ(got[i], 0.0) << "padding " << i;
          continue;
        }
        const double p = unrounded[i] * f, want = c == targets[usize(r)] ? p - 0.5 : p;
        const double exp_err = 4 * 0x1p-23 * p;  // 4 ulp: an ulp is at most 2^-23 relative
        const double store = t == DType::F32 ? 0x1p-24 : t == DType::BF16 ? 0x1p-8 : 0x1p-11;
        // fp16's subnormals (below 2^-14) are 2^-24 apart: half of that absolute.
        const double sub = t == DType::F16 ? 0x1p-25 : 0x1p-133;
        ASSERT_NEAR(got[i], want, exp_err + store * std::fabs(want) + sub) << "dlogits " << i;
      }
    }

    const i64 sn = 40;
    const Shape shape{1, 2, sn, sn};
    const Vec scores = rounded(to_f32(randn(usize(numel(shape)), rng, 4.0)), t);
    const Vec want = causal_softmax_ref(scores, 2, sn, 0.3);
    const Vec p = softmax_run(shape, scores, 0.3, t);
    if (t == DType::F32)
      expect_close(p, want, 2e-6, 1e-8, "causal softmax");
    else
      expect_one_rounding(p, want, t, "causal softmax");
  }
}

// The cross-entropy backward's 16-bit store in its vector loop, next to
// 16-bit midpoints (times powers of two). Just above the midpoint between 1
// and the next value (1 + half an ulp + 2^-30) must round up; just below the
// midpoint between that value and the one after (1 + 3 half ulps - 2^-30) must
// round down. Rounded to fp32 first, both would land on the midpoint and round
// to even: the wrong way in both cases. The kernel rounds to odd in fp32
// first. Logits of 0 and a max of 0 make every exponential exactly 1; row r's
// sum of 2^r makes its gradient exactly scale * 2^-r before the store; the
// targets are another rank's.
TEST(HalfStorage, CrossEntropyBackwardRoundsLongRowsOnceNextToMidpoints) {
  for (auto [t, half_ulp] : {std::pair{DType::BF16, 0x1p-8}, std::pair{DType::F16, 0x1p-11}}) {
    SCOPED_TRACE(dtype_name(t));
    const i64 rows = 13, vocab = 1037;
    Vec sums(usize(rows));
    for (i64 r = 0; r < rows; ++r) sums[usize(r)] = std::ldexp(1.0, static_cast<int>(r));
    const Tensor zero_max = tensor({rows}, Vec(usize(rows), 0.0), DType::F32), sum = tensor({rows}, sums, DType::F32);
    const Tensor others = ids_tensor(std::vector<i64>(usize(rows), vocab));
    // {the product's factor (exp(0) / 1 * scale), what it rounds to}
    for (auto [scale, rounded] : {std::pair{1.0 + half_ulp + 0x1p-30, 1.0 + 2 * half_ulp},
                                  std::pair{1.0 + 3 * half_ulp - 0x1p-30, 1.0 + 2 * half_ulp}}) {
      Tensor d = empty({rows, vocab}, t);
      cross_entropy_backward(tensor({rows, vocab}, Vec(usize(rows * vocab), 0.0), t), zero_max, sum, others, 0, vocab,
                             scale, d);
      Vec want(usize(rows * vocab));
      for (i64 r = 0; r < rows; ++r)
        for (i64 c = 0; c < vocab; ++c) want[usize(r * vocab + c)] = std::ldexp(rounded, -static_cast<int>(r));
      expect_same(vals(d), want, scale < 1.0 + 2 * half_ulp ? "just above a midpoint" : "just below a midpoint");
    }
  }
}

}  // namespace
