// The fused causal attention (kernels/fused_attention.h) against:
//  - an independent reference written here with plain loops in double
//    (softmax over j <= i, the dropout mask from uniform_at of the global
//    index, then the product with v), forward and log-sum-exp;
//  - central finite differences in fp64 of L = sum(w * out) for dq, dk, dv;
//  - the unfused kernel sequence (gemm, causal_softmax_*, dropout_*, gemm)
//    that layers/attention.cpp runs for --attention-backend unfused, in fp64
//    (to 1e-12), fp32 and bf16/fp16 (to their rounding);
//  - itself on a TP slice of the heads (the dropout mask follows the layout).
// Sequence lengths cover one block, several blocks and a ragged last block.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "megazero/core/error.h"
#include "megazero/core/tensor.h"
#include "megazero/kernels/dropout.h"
#include "megazero/kernels/fused_attention.h"
#include "megazero/kernels/gemm.h"
#include "megazero/kernels/softmax.h"

using namespace megazero;
using namespace megazero::kernels;
using MC = MemoryCategory;
using Vec = std::vector<double>;
using i64 = std::int64_t;

namespace {

const std::shared_ptr<Device>& cpu() {
  static const auto device = make_device(DeviceKind::CPU);
  return device;
}

Tensor tensor(const Shape& shape, const Vec& values, DType t) {
  Tensor out = Tensor::empty(cpu(), shape, t, MC::Other);
  out.copy_from_doubles(values);
  return out;
}

Vec randn(i64 n, std::mt19937& rng, double sd = 1.0) {
  std::normal_distribution<double> d(0.0, sd);
  Vec v(static_cast<std::size_t>(n));
  for (auto& x : v) x = static_cast<float>(d(rng));  // fp32-exact, so every dtype run sees the same inputs
  return v;
}

void expect_close(const Vec& got, const Vec& want, double rtol, double atol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool ok = std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i]);
    if (!ok && reported++ < 5) ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
  }
}

double max_abs(const Vec& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// One attention problem: BH = samples x local heads matrices of S x D.
struct Problem {
  i64 samples = 2, heads = 3, s = 9, d = 8;
  double scale = 0.35, p = 0.0;
  RngKey key{7, 3, 1, kRngAttentionDropout};
  i64 sample_offset = 0, head_offset = 0, global_heads = 3;
  i64 bh() const { return samples * heads; }
  Shape shape() const { return {bh(), s, d}; }
  DropoutLayout layout() const {
    DropoutLayout l;
    l.samples = samples;
    l.sample_offset = sample_offset;
    l.groups = heads;
    l.group_offset = head_offset;
    l.global_groups = global_heads;
    l.matrix_rows = l.matrix_cols = s;
    return l;
  }
};

struct Inputs {
  Vec q, k, v, w;  // w: the weights of L = sum(w * out), i.e. dout
};

Inputs make_inputs(const Problem& pr, unsigned seed) {
  std::mt19937 rng(seed);
  const i64 n = pr.bh() * pr.s * pr.d;
  return {randn(n, rng), randn(n, rng), randn(n, rng), randn(n, rng)};
}

// Plain loops in double: out and lse.
void reference(const Problem& pr, const Inputs& in, Vec& out, Vec& lse) {
  const DropoutLayout l = pr.layout();
  out.assign(static_cast<std::size_t>(pr.bh() * pr.s * pr.d), 0.0);
  lse.assign(static_cast<std::size_t>(pr.bh() * pr.s), 0.0);
  for (i64 b = 0; b < pr.bh(); ++b) {
    const i64 global = (l.sample_offset + b / l.groups) * l.global_groups + l.group_offset + b % l.groups;
    for (i64 i = 0; i < pr.s; ++i) {
      Vec sc(static_cast<std::size_t>(i + 1));
      double mx = -INFINITY;
      for (i64 j = 0; j <= i; ++j) {
        double acc = 0;
        for (i64 c = 0; c < pr.d; ++c)
          acc += in.q[static_cast<std::size_t>((b * pr.s + i) * pr.d + c)] *
                 in.k[static_cast<std::size_t>((b * pr.s + j) * pr.d + c)];
        sc[static_cast<std::size_t>(j)] = pr.scale * acc;
        mx = std::max(mx, pr.scale * acc);
      }
      double sum = 0;
      for (double x : sc) sum += std::exp(x - mx);
      lse[static_cast<std::size_t>(b * pr.s + i)] = mx + std::log(sum);
      for (i64 j = 0; j <= i; ++j) {
        double prob = std::exp(sc[static_cast<std::size_t>(j)] - mx) / sum;
        if (pr.p > 0) {
          const auto idx = static_cast<std::uint64_t>(global * pr.s * pr.s + i * pr.s + j);
          prob = uniform_at(pr.key, idx) >= pr.p ? prob / (1.0 - pr.p) : 0.0;
        }
        for (i64 c = 0; c < pr.d; ++c)
          out[static_cast<std::size_t>((b * pr.s + i) * pr.d + c)] +=
              prob * in.v[static_cast<std::size_t>((b * pr.s + j) * pr.d + c)];
      }
    }
  }
}

struct Result {
  Vec out, lse, dq, dk, dv;
};

Result run_fused(const Problem& pr, const Inputs& in, DType t, bool backward = true) {
  const Tensor q = tensor(pr.shape(), in.q, t), k = tensor(pr.shape(), in.k, t), v = tensor(pr.shape(), in.v, t);
  Tensor out = Tensor::empty(cpu(), pr.shape(), t, MC::Other);
  Tensor lse = Tensor::empty(cpu(), {pr.bh(), pr.s}, row_stat_dtype(t), MC::Other);
  fused_attention_forward(q, k, v, pr.scale, pr.p, pr.key, pr.layout(), out, lse);
  Result r{out.to_double_vector(), lse.to_double_vector(), {}, {}, {}};
  if (!backward) return r;
  Tensor dq = Tensor::empty(cpu(), pr.shape(), t, MC::Other), dk = Tensor::empty(cpu(), pr.shape(), t, MC::Other),
         dv = Tensor::empty(cpu(), pr.shape(), t, MC::Other);
  dk.copy_from_doubles(Vec(in.q.size(), 1e30));  // overwritten, not accumulated into
  fused_attention_backward(q, k, v, out, tensor(pr.shape(), in.w, t), lse, pr.scale, pr.p, pr.key, pr.layout(), dq, dk,
                           dv);
  r.dq = dq.to_double_vector();
  r.dk = dk.to_double_vector();
  r.dv = dv.to_double_vector();
  return r;
}

// The unfused path of layers/attention.cpp, kernel by kernel.
Result run_unfused(const Problem& pr, const Inputs& in, DType t) {
  const Tensor q = tensor(pr.shape(), in.q, t), k = tensor(pr.shape(), in.k, t), v = tensor(pr.shape(), in.v, t);
  const Shape sq{pr.bh(), pr.s, pr.s};
  Tensor probs = Tensor::empty(cpu(), sq, t, MC::Other), dropped = Tensor::empty(cpu(), sq, t, MC::Other);
  gemm(q, false, k, true, probs);
  causal_softmax_forward(probs, pr.scale, probs);
  dropout_forward(probs, pr.p, pr.key, pr.layout(), dropped);
  Tensor out = Tensor::empty(cpu(), pr.shape(), t, MC::Other);
  gemm(dropped, false, v, false, out);
  const Tensor dout = tensor(pr.shape(), in.w, t);
  Tensor dprobs = Tensor::empty(cpu(), sq, t, MC::Other);
  Tensor dq = Tensor::empty(cpu(), pr.shape(), t, MC::Other), dk = Tensor::empty(cpu(), pr.shape(), t, MC::Other),
         dv = Tensor::empty(cpu(), pr.shape(), t, MC::Other);
  gemm(dout, false, v, true, dprobs);
  gemm(dropped, true, dout, false, dv);
  dropout_backward(dprobs, pr.p, pr.key, pr.layout(), dprobs);
  causal_softmax_backward(dprobs, probs, pr.scale, dprobs);
  gemm(dprobs, false, k, false, dq);
  gemm(dprobs, true, q, false, dk);
  return {out.to_double_vector(), {}, dq.to_double_vector(), dk.to_double_vector(), dv.to_double_vector()};
}

double loss(const Problem& pr, const Inputs& in) {
  const Vec out = run_fused(pr, in, DType::F64, false).out;
  double l = 0;
  for (std::size_t i = 0; i < out.size(); ++i) l += in.w[i] * out[i];
  return l;
}

// Central differences of L at every element of one input (which: 0 q, 1 k, 2 v).
void expect_fd(const Problem& pr, const Inputs& in, int which, const Vec& grad, const std::string& what) {
  constexpr double h = 1e-6;
  const double gmax = max_abs(grad);
  int reported = 0;
  for (std::size_t e = 0; e < grad.size(); ++e) {
    Inputs plus = in, minus = in;
    Vec* pv[] = {&plus.q, &plus.k, &plus.v};
    Vec* mv[] = {&minus.q, &minus.k, &minus.v};
    (*pv[which])[e] += h;
    (*mv[which])[e] -= h;
    const double fd = (loss(pr, plus) - loss(pr, minus)) / (2 * h);
    if (std::fabs(fd - grad[e]) > 1e-6 * std::fabs(fd) + 1e-8 * gmax + 1e-9 && reported++ < 5)
      ADD_FAILURE() << what << "[" << e << "]: analytic " << grad[e] << ", finite difference " << fd;
  }
}

TEST(FusedAttention, ForwardMatchesThePlainReference) {
  for (double p : {0.0, 0.3}) {
    for (i64 s : {1, 9, 128, 131, 300}) {  // one element, one block, exactly one block, ragged, three blocks
      Problem pr;
      pr.s = s;
      pr.p = p;
      pr.samples = s > 100 ? 1 : 2;
      const Inputs in = make_inputs(pr, static_cast<unsigned>(s));
      Vec out, lse;
      reference(pr, in, out, lse);
      const Result r = run_fused(pr, in, DType::F64, false);
      const std::string what = "S " + std::to_string(s) + " p " + std::to_string(p);
      expect_close(r.out, out, 1e-12, 1e-13, "out " + what);
      expect_close(r.lse, lse, 1e-13, 1e-13, "lse " + what);
    }
  }
}

TEST(FusedAttention, BackwardMatchesFiniteDifferences) {
  for (double p : {0.0, 0.25}) {
    Problem pr;
    pr.samples = 1;
    pr.heads = 2;
    pr.global_heads = 2;
    pr.s = 6;
    pr.d = 4;
    pr.p = p;
    const Inputs in = make_inputs(pr, 11);
    const Result r = run_fused(pr, in, DType::F64);
    const std::string what = " p " + std::to_string(p);
    expect_fd(pr, in, 0, r.dq, "dq" + what);
    expect_fd(pr, in, 1, r.dk, "dk" + what);
    expect_fd(pr, in, 2, r.dv, "dv" + what);
  }
}

TEST(FusedAttention, MatchesTheUnfusedKernelsInEveryDtype) {
  for (double p : {0.0, 0.2}) {
    for (i64 s : {17, 200}) {
      Problem pr;
      pr.s = s;
      pr.p = p;
      pr.d = 16;
      const Inputs in = make_inputs(pr, 5 + static_cast<unsigned>(s));
      const Result ref = run_unfused(pr, in, DType::F64);
      const std::string what = " S " + std::to_string(s) + " p " + std::to_string(p);
      const Result f64 = run_fused(pr, in, DType::F64);
      expect_close(f64.out, ref.out, 1e-12, 1e-13, "fp64 out" + what);
      expect_close(f64.dq, ref.dq, 1e-11, 1e-12, "fp64 dq" + what);
      expect_close(f64.dk, ref.dk, 1e-11, 1e-12, "fp64 dk" + what);
      expect_close(f64.dv, ref.dv, 1e-11, 1e-12, "fp64 dv" + what);
      // fp32: a few fp32 roundings of O(1) values; 16-bit: a few roundings of
      // 8 (bf16) or 11 (fp16) bits, relative to each tensor's largest element.
      for (DType t : {DType::F32, DType::BF16, DType::F16}) {
        const double tol = t == DType::F32 ? 2e-5 : t == DType::F16 ? 2e-2 : 8e-2;
        const Result f = run_fused(pr, in, t);
        const Result u = run_unfused(pr, in, t);
        std::string tw(" ");
        tw += dtype_name(t);
        tw += what;
        const std::pair<const Vec*, const Vec*> pairs[] = {
            {&f.out, &ref.out}, {&f.dq, &ref.dq}, {&f.dk, &ref.dk}, {&f.dv, &ref.dv}};
        const char* names[] = {"out", "dq", "dk", "dv"};
        for (int n = 0; n < 4; ++n) {
          expect_close(*pairs[n].first, *pairs[n].second, 0, tol * max_abs(*pairs[n].second), names[n] + tw);
        }
        // ... and no further from the fp64 truth than the unfused path is, give or take.
        const Vec* unfused[] = {&u.out, &u.dq, &u.dk, &u.dv};
        for (int n = 0; n < 4; ++n) {
          double ef = 0, eu = 0;
          for (std::size_t e = 0; e < pairs[n].second->size(); ++e) {
            ef = std::max(ef, std::fabs((*pairs[n].first)[e] - (*pairs[n].second)[e]));
            eu = std::max(eu, std::fabs((*unfused[n])[e] - (*pairs[n].second)[e]));
          }
          EXPECT_LE(ef, 2.0 * eu + 1e-6 * max_abs(*pairs[n].second)) << names[n] << tw;
        }
      }
    }
  }
}

TEST(FusedAttention, ATensorParallelSliceOfHeadsIsTheSliceOfTheWhole) {
  // All 4 heads on one rank against heads 2..3 on the second of two TP ranks,
  // and the second sample on its own DP rank: the same dropout mask, the same numbers.
  Problem whole;
  whole.samples = 2;
  whole.heads = whole.global_heads = 4;
  whole.s = 12;
  whole.p = 0.3;
  const Inputs in = make_inputs(whole, 21);
  const Result all = run_fused(whole, in, DType::F64);
  Problem slice = whole;
  slice.samples = 1;
  slice.sample_offset = 1;
  slice.heads = 2;
  slice.head_offset = 2;
  const i64 per = whole.s * whole.d;
  auto cut = [&](const Vec& v) {  // sample 1, heads 2..3 of a [2, 4, S, D] tensor
    const auto first = static_cast<std::ptrdiff_t>((1 * 4 + 2) * per);
    return Vec(v.begin() + first, v.begin() + first + 2 * per);
  };
  const Inputs part{cut(in.q), cut(in.k), cut(in.v), cut(in.w)};
  const Result r = run_fused(slice, part, DType::F64);
  expect_close(r.out, cut(all.out), 1e-14, 1e-15, "out");
  expect_close(r.dq, cut(all.dq), 1e-13, 1e-14, "dq");
  expect_close(r.dk, cut(all.dk), 1e-13, 1e-14, "dk");
  expect_close(r.dv, cut(all.dv), 1e-13, 1e-14, "dv");
}

// Grouped-query attention: k and v with one head per `group` query heads
// compute what the same k and v repeated per query head compute (dk, dv per
// query head), and a k that does not divide the heads is refused.
TEST(FusedAttention, GroupedKeysAndValuesAreTheRepeatedOnes) {
  Problem pr;
  pr.samples = 2, pr.heads = 4, pr.global_heads = 4, pr.s = 11, pr.p = 0.2;
  std::mt19937 rng(5);
  for (const i64 group : {2, 4}) {
    SCOPED_TRACE(testing::Message() << "group " << group);
    const i64 per_head = pr.s * pr.d, kv_heads = pr.bh() / group;
    Inputs in = make_inputs(pr, 17);
    const Vec kg = randn(kv_heads * per_head, rng), vg = randn(kv_heads * per_head, rng);
    for (i64 h = 0; h < pr.bh(); ++h)
      for (i64 e = 0; e < per_head; ++e) {
        const auto at = static_cast<std::size_t>(h * per_head + e),
                   from = static_cast<std::size_t>(h / group * per_head + e);
        in.k[at] = kg[from], in.v[at] = vg[from];
      }
    const Result repeated = run_fused(pr, in, DType::F32);
    const Shape kv_shape{kv_heads, pr.s, pr.d};
    const Tensor q = tensor(pr.shape(), in.q, DType::F32), k = tensor(kv_shape, kg, DType::F32),
                 v = tensor(kv_shape, vg, DType::F32);
    Tensor out = Tensor::empty(cpu(), pr.shape(), DType::F32, MC::Other);
    Tensor lse = Tensor::empty(cpu(), {pr.bh(), pr.s}, DType::F32, MC::Other);
    fused_attention_forward(q, k, v, pr.scale, pr.p, pr.key, pr.layout(), out, lse);
    EXPECT_EQ(out.to_double_vector(), repeated.out);
    EXPECT_EQ(lse.to_double_vector(), repeated.lse);
    Tensor dq = Tensor::empty(cpu(), pr.shape(), DType::F32, MC::Other),
           dk = Tensor::empty(cpu(), pr.shape(), DType::F32, MC::Other),
           dv = Tensor::empty(cpu(), pr.shape(), DType::F32, MC::Other);
    fused_attention_backward(q, k, v, out, tensor(pr.shape(), in.w, DType::F32), lse, pr.scale, pr.p, pr.key,
                             pr.layout(), dq, dk, dv);
    EXPECT_EQ(dq.to_double_vector(), repeated.dq);
    EXPECT_EQ(dk.to_double_vector(), repeated.dk) << "dk per query head";
    EXPECT_EQ(dv.to_double_vector(), repeated.dv) << "dv per query head";
  }
  const Tensor q = tensor(pr.shape(), Vec(static_cast<std::size_t>(pr.bh() * pr.s * pr.d), 0.0), DType::F32);
  const Tensor k3 = Tensor::zeros(cpu(), {3, pr.s, pr.d}, DType::F32, MC::Other);
  Tensor out = Tensor::empty(cpu(), pr.shape(), DType::F32, MC::Other);
  Tensor lse = Tensor::empty(cpu(), {pr.bh(), pr.s}, DType::F32, MC::Other);
  EXPECT_THROW(fused_attention_forward(q, k3, k3, pr.scale, 0.0, pr.key, pr.layout(), out, lse), InternalError);
}

TEST(FusedAttention, RejectsBadArgumentsNamingThem) {
  Problem pr;
  const Inputs in = make_inputs(pr, 1);
  const Tensor q = tensor(pr.shape(), in.q, DType::F32), k = tensor(pr.shape(), in.k, DType::F32);
  Tensor out = Tensor::empty(cpu(), pr.shape(), DType::F32, MC::Other);
  Tensor lse = Tensor::empty(cpu(), {pr.bh(), pr.s}, DType::F32, MC::Other);
  const Tensor short_v = Tensor::empty(cpu(), {pr.bh(), pr.s - 1, pr.d}, DType::F32, MC::Other);
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(
      message([&] { fused_attention_forward(q, k, short_v, 1, 0, pr.key, pr.layout(), out, lse); }).find("v has shape"),
      std::string::npos);
  Tensor lse16 = Tensor::empty(cpu(), {pr.bh(), pr.s}, DType::BF16, MC::Other);
  EXPECT_NE(message([&] {
              fused_attention_forward(q, k, q, 1, 0, pr.key, pr.layout(), out, lse16);
            }).find("lse must be fp32"),
            std::string::npos);
  DropoutLayout wrong = pr.layout();
  wrong.matrix_rows = pr.s + 1;
  EXPECT_NE(message([&] { fused_attention_forward(q, k, q, 1, 0.1, pr.key, wrong, out, lse); }).find("dropout layout"),
            std::string::npos);
  EXPECT_NE(message([&] { fused_attention_forward(q, k, q, 1, 1.0, pr.key, pr.layout(), out, lse); }).find("[0, 1)"),
            std::string::npos);
  // What the CUDA kernel takes; the CPU takes everything.
  EXPECT_EQ(fused_attention_unsupported(DeviceKind::CPU, DType::F64, 1000), "");
  EXPECT_EQ(fused_attention_unsupported(DeviceKind::CUDA, DType::BF16, 128), "");
  EXPECT_EQ(fused_attention_unsupported(DeviceKind::CUDA, DType::F16, 8), "");
  EXPECT_NE(fused_attention_unsupported(DeviceKind::CUDA, DType::F32, 64).find("--bf16"), std::string::npos);
  EXPECT_NE(fused_attention_unsupported(DeviceKind::CUDA, DType::BF16, 256).find("256"), std::string::npos);
  EXPECT_NE(fused_attention_unsupported(DeviceKind::CUDA, DType::BF16, 12).find("12"), std::string::npos);
}

TEST(FusedAttention, NeverHoldsTheWholeScoreMatrix) {
  // The point of fusing: with S = 1024 the unfused path keeps two [BH, S, S]
  // tensors (16 MiB here in fp32); the fused path's workspace is one block of
  // query rows at a time, and what backward needs is the output and lse.
  Problem pr;
  pr.samples = 1;
  pr.heads = pr.global_heads = 2;
  pr.s = 1024;
  pr.d = 16;
  pr.p = 0.1;
  auto meta = make_meta_device(DeviceKind::CPU);
  auto make = [&](const Shape& s, DType t) { return Tensor::empty(meta, s, t, MC::Activations); };
  const Tensor q = make(pr.shape(), DType::F32), k = make(pr.shape(), DType::F32), v = make(pr.shape(), DType::F32);
  Tensor out = make(pr.shape(), DType::F32), lse = make({pr.bh(), pr.s}, DType::F32);
  meta->memory().reset_peaks();
  const auto before = meta->memory().total_live();
  fused_attention_forward(q, k, v, 0.25, pr.p, pr.key, pr.layout(), out, lse);
  Tensor dq = make(pr.shape(), DType::F32), dk = make(pr.shape(), DType::F32), dv = make(pr.shape(), DType::F32);
  fused_attention_backward(q, k, v, out, out, lse, 0.25, pr.p, pr.key, pr.layout(), dq, dk, dv);
  const double score_matrix = static_cast<double>(pr.bh() * pr.s * pr.s * 4);
  const double workspace = static_cast<double>(meta->memory().peak(MC::Workspace));
  EXPECT_EQ(meta->memory().total_live() - before, 3 * pr.bh() * pr.s * pr.d * 4) << "dq, dk, dv only";
  EXPECT_LT(workspace, 0.5 * score_matrix) << "peak workspace " << workspace << " bytes";
  EXPECT_GT(workspace, 0.0);
}

}  // namespace
