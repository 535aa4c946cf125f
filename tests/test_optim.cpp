// AdamW and the learning-rate schedule against their textbook formulas,
// written out independently here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <cstring>
#include <numbers>
#include <random>

#include "megazero/kernels/cpu_threads.h"
#include "megazero/core/error.h"
#include "megazero/kernels/optimizer_kernels.h"
#include "megazero/optim/adamw.h"
#include "megazero/optim/lr_schedule.h"

using namespace megazero;
using namespace megazero::optim;

TEST(AdamW, MatchesTheFormulaOverSeveralStepsWithAndWithoutDecay) {
  auto dev = make_device(DeviceKind::CPU);
  const std::vector<double> w0 = {0.5, -1.25, 2.0, 0.0};
  Tensor w = Tensor::empty(dev, {4}, DType::F32, MemoryCategory::OptimizerStates);
  Tensor m = Tensor::zeros(dev, {4}, DType::F32, MemoryCategory::OptimizerStates);
  Tensor v = Tensor::zeros(dev, {4}, DType::F32, MemoryCategory::OptimizerStates);
  Tensor g = Tensor::empty(dev, {4}, DType::BF16, MemoryCategory::Gradients);
  w.copy_from_doubles(w0);
  AdamConfig c;
  c.weight_decay = 0.1;
  const std::vector<DecaySegment> segs = {{0, 2, true}, {2, 4, false}};
  std::vector<double> rw = w0, rm(4, 0), rv(4, 0);
  const double lr = 0.01, scale = 0.5;
  for (int step = 1; step <= 4; ++step) {
    g.copy_from_doubles({0.25 * step, -0.5, 1.0 / step, 0.0});
    const auto grads = g.to_double_vector();  // as the optimizer sees them: rounded to bf16
    adamw_step(w, m, v, g, segs, c, lr, step, scale);
    for (int i = 0; i < 4; ++i) {
      const double gi = grads[static_cast<std::size_t>(i)] * scale;
      auto& mi = rm[static_cast<std::size_t>(i)];
      auto& vi = rv[static_cast<std::size_t>(i)];
      auto& wi = rw[static_cast<std::size_t>(i)];
      mi = c.beta1 * mi + (1 - c.beta1) * gi;
      vi = c.beta2 * vi + (1 - c.beta2) * gi * gi;
      const double mhat = mi / (1 - std::pow(c.beta1, step)), vhat = vi / (1 - std::pow(c.beta2, step));
      wi -= lr * (mhat / (std::sqrt(vhat) + c.eps) + (i < 2 ? c.weight_decay * wi : 0.0));
    }
    const auto got = w.to_double_vector();
    for (std::size_t i = 0; i < 4; ++i) EXPECT_NEAR(got[i], rw[i], 1e-6) << "step " << step << " element " << i;
  }
  EXPECT_EQ(w.to_double_vector()[3], 0.0) << "zero gradient, no decay: unchanged";
}

namespace {

// AdamW's per-element formula restated here in the kernels' order of
// operations (megazero/kernels/adamw_formula.h): fp32, each operation rounded
// on its own (this file is built with -ffp-contract=off), the per-step
// scalars computed in double and rounded to fp32 once.
struct RefAdam {
  float b1, c1, b2, c2, scale, inv_sqrt_bc2, eps, step_size, decay_factor;
};

RefAdam ref_adam(double beta1, double beta2, double eps, double wd, double lr, double bc1, double bc2, double scale) {
  return {static_cast<float>(beta1),     static_cast<float>(1 - beta1), static_cast<float>(beta2),
          static_cast<float>(1 - beta2), static_cast<float>(scale),     static_cast<float>(1 / std::sqrt(bc2)),
          static_cast<float>(eps),       static_cast<float>(lr / bc1),  static_cast<float>(1 - lr * wd)};
}

void ref_adamw(float& w, float& m, float& v, double grad, bool decay, const RefAdam& r) {
  const float g = static_cast<float>(grad) * r.scale;
  m = r.b1 * m + r.c1 * g;
  v = r.b2 * v + r.c2 * (g * g);
  const float denom = std::sqrt(v) * r.inv_sqrt_bc2 + r.eps;
  w = w * (decay ? r.decay_factor : 1.0f) - (r.step_size * m) / denom;
}

}  // namespace

// Long partitions take the vectorised, multi-threaded update: it must be the
// scalar formula's bits for any thread count (no element depends on another),
// including across segment boundaries that cut vectors and thread chunks.
TEST(AdamW, LongPartitionsAreTheScalarUpdateBitForBitOnAnyThreadCount) {
  auto dev = make_device(DeviceKind::CPU);
  const std::int64_t n = 300007;
  const std::vector<DecaySegment> segs = {{0, 3, true}, {3, 150001, false}, {150001, 299990, true}, {299990, n, false}};
  AdamConfig c;
  c.weight_decay = 0.05;
  const double lr = 3e-3, scale = 0.25;
  for (DType gt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(gt));
    std::vector<double> w0(static_cast<std::size_t>(n)), g0(w0.size());
    for (std::size_t i = 0; i < w0.size(); ++i) {
      w0[i] = std::sin(0.37 * static_cast<double>(i));
      g0[i] = std::cos(0.11 * static_cast<double>(i)) * (i % 5 == 0 ? 0.0 : 1.0);
    }
    std::vector<std::vector<float>> results;
    struct RestoreThreads {
      int before = cpu_math_threads();
      ~RestoreThreads() { set_cpu_math_threads(before); }
    } restore;
    for (int threads : {1, 4}) {
      set_cpu_math_threads(threads);
      Tensor w = Tensor::empty(dev, {n}, DType::F32, MemoryCategory::OptimizerStates);
      Tensor m = Tensor::zeros(dev, {n}, DType::F32, MemoryCategory::OptimizerStates);
      Tensor v = Tensor::zeros(dev, {n}, DType::F32, MemoryCategory::OptimizerStates);
      Tensor g = Tensor::empty(dev, {n}, gt, MemoryCategory::Gradients);
      w.copy_from_doubles(w0);
      g.copy_from_doubles(g0);
      for (int step = 1; step <= 2; ++step) adamw_step(w, m, v, g, segs, c, lr, step, scale);
      std::vector<float> all(w.host_data<float>(), w.host_data<float>() + n);
      all.insert(all.end(), m.host_data<float>(), m.host_data<float>() + n);
      all.insert(all.end(), v.host_data<float>(), v.host_data<float>() + n);
      results.push_back(std::move(all));
      if (threads == 1) {
        // The scalar update, in the kernel's order of operations.
        const auto grads = g.to_double_vector();
        std::vector<float> rw(w0.begin(), w0.end()), rm(w0.size(), 0.f), rv(w0.size(), 0.f);
        for (int step = 1; step <= 2; ++step) {
          const double bc1 = 1 - std::pow(c.beta1, step), bc2 = 1 - std::pow(c.beta2, step);
          const RefAdam r = ref_adam(c.beta1, c.beta2, c.eps, c.weight_decay, lr, bc1, bc2, scale);
          for (const auto& sg : segs)
            for (std::int64_t i = sg.begin; i < sg.end; ++i) {
              const auto k = static_cast<std::size_t>(i);
              ref_adamw(rw[k], rm[k], rv[k], grads[k], sg.decay, r);
            }
        }
        const auto bits = [](float f) {
          std::uint32_t u;
          std::memcpy(&u, &f, 4);
          return u;
        };
        for (std::size_t k = 0; k < w0.size(); ++k) {
          ASSERT_EQ(bits(results[0][k]), bits(rw[k])) << "w[" << k << "]";
          ASSERT_EQ(bits(results[0][w0.size() + k]), bits(rm[k])) << "m[" << k << "]";
          ASSERT_EQ(bits(results[0][2 * w0.size() + k]), bits(rv[k])) << "v[" << k << "]";
        }
      }
    }
    EXPECT_EQ(std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)), 0)
        << "1 and 4 threads differ";
  }
}

namespace {

std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::uint64_t double_bits(double d) {
  std::uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}

// A ZeRO-like segment list over n elements, shuffled: runs of 0 to 400
// elements and two of 70000 (long enough for the threaded loop), gaps left
// between some, decay at random, and empty segments.
std::vector<DecaySegment> scattered_segments(std::int64_t n, std::mt19937& rng) {
  std::vector<DecaySegment> segs;
  std::uniform_int_distribution<int> len(0, 400), coin(0, 9);
  std::int64_t at = 0;
  while (at < n) {
    const bool long_one = segs.size() == 100 || segs.size() == 300;
    const std::int64_t l = std::min<std::int64_t>(n - at, long_one ? 70000 : len(rng));
    segs.push_back({at, at + l, coin(rng) < 6});
    at += l + (coin(rng) < 2 ? 3 : 0);  // a gap: elements no segment covers
  }
  segs.push_back({n, n, true});   // empty, at the end of the buffers
  segs.push_back({5, 5, false});  // empty, inside another segment
  std::shuffle(segs.begin(), segs.end(), rng);
  return segs;
}

}  // namespace

// The one call over all segments (what a GPU runs as one launch) is the scalar
// formula of each element bit for bit, equal to one call per segment (the
// pre-#21 step), in any order of the segments; elements outside every segment
// keep their values.
TEST(AdamW, OneCallOverManySegmentsIsThePerSegmentFormulaBitForBit) {
  auto dev = make_device(DeviceKind::CPU);
  const std::int64_t n = 250003;
  std::mt19937 rng(21);
  const auto segs = scattered_segments(n, rng);
  ASSERT_GT(segs.size(), 400u);
  kernels::AdamStep a{0.9, 0.95, 1e-8, 0.1, 3e-4, 0, 0, 0.125};
  for (DType gt : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(gt));
    std::vector<double> w0(static_cast<std::size_t>(n)), m0(w0.size()), v0(w0.size()), g0(w0.size());
    std::normal_distribution<double> normal;
    for (std::size_t i = 0; i < w0.size(); ++i) {
      w0[i] = normal(rng);
      m0[i] = 0.01 * normal(rng);
      v0[i] = 1e-4 * std::fabs(normal(rng));
      g0[i] = normal(rng) * (i % 7 == 0 ? 0.0 : 3.0);
    }
    auto make = [&](const std::vector<double>& x, DType t) {
      Tensor y = Tensor::empty(dev, {n}, t, MemoryCategory::OptimizerStates);
      y.copy_from_doubles(x);
      return y;
    };
    Tensor w = make(w0, DType::F32), m = make(m0, DType::F32), v = make(v0, DType::F32), g = make(g0, gt);
    Tensor pw = make(w0, DType::F32), pm = make(m0, DType::F32), pv = make(v0, DType::F32);
    const auto grads = g.to_double_vector();  // rounded to the gradient dtype
    std::vector<float> rw(w.host_data<float>(), w.host_data<float>() + n),
        rm(m.host_data<float>(), m.host_data<float>() + n), rv(v.host_data<float>(), v.host_data<float>() + n);
    for (int step = 1; step <= 2; ++step) {
      a.bc1 = 1 - std::pow(a.beta1, step);
      a.bc2 = 1 - std::pow(a.beta2, step);
      kernels::adamw(w, m, v, g, segs, a);
      for (const auto& sg : segs) kernels::adamw(pw, pm, pv, g, {sg}, a);  // one call per segment
      const RefAdam r = ref_adam(a.beta1, a.beta2, a.eps, a.weight_decay, a.lr, a.bc1, a.bc2, a.grad_scale);
      for (const auto& sg : segs)  // the scalar update, in the kernel's order of operations
        for (std::int64_t i = sg.begin; i < sg.end; ++i) {
          const auto k = static_cast<std::size_t>(i);
          ref_adamw(rw[k], rm[k], rv[k], grads[k], sg.decay, r);
        }
    }
    std::vector<bool> covered(static_cast<std::size_t>(n), false);
    for (const auto& sg : segs)
      for (std::int64_t i = sg.begin; i < sg.end; ++i) covered[static_cast<std::size_t>(i)] = true;
    const float *W = w.host_data<float>(), *M = m.host_data<float>(), *V = v.host_data<float>();
    const float *PW = pw.host_data<float>(), *PM = pm.host_data<float>(), *PV = pv.host_data<float>();
    std::int64_t untouched = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      ASSERT_EQ(float_bits(W[k]), float_bits(rw[k])) << "w[" << i << "]";
      ASSERT_EQ(float_bits(M[k]), float_bits(rm[k])) << "m[" << i << "]";
      ASSERT_EQ(float_bits(V[k]), float_bits(rv[k])) << "v[" << i << "]";
      ASSERT_EQ(float_bits(W[k]), float_bits(PW[k])) << "w[" << i << "] vs one call per segment";
      ASSERT_EQ(float_bits(M[k]), float_bits(PM[k])) << "m[" << i << "] vs one call per segment";
      ASSERT_EQ(float_bits(V[k]), float_bits(PV[k])) << "v[" << i << "] vs one call per segment";
      if (!covered[k]) {
        ++untouched;
        ASSERT_EQ(float_bits(W[k]), float_bits(static_cast<float>(w0[k]))) << "w[" << i << "] is in no segment";
      }
    }
    EXPECT_GT(untouched, 100) << "the list leaves gaps";
  }
}

// The params output (ZeRO's publish in AdamW's pass): master and moments the
// bits of the call without it; params, on every updated element, the bits of
// the old way (adamw, then params.copy_from(master)); elsewhere untouched. On
// 1 and 4 threads (the long segments take the threaded loop); 16-bit params
// cast in the update loop (fp16 gradients) and after it (the others).
TEST(AdamW, ParamsOutputIsTheCopyFromOfTheNewMasterBitForBit) {
  auto dev = make_device(DeviceKind::CPU);
  const std::int64_t n = 250003;
  std::mt19937 rng(2121);
  const auto segs = scattered_segments(n, rng);
  std::vector<bool> covered(static_cast<std::size_t>(n), false);
  for (const auto& sg : segs)
    for (std::int64_t i = sg.begin; i < sg.end; ++i) covered[static_cast<std::size_t>(i)] = true;
  std::vector<double> w0(static_cast<std::size_t>(n)), m0(w0.size()), v0(w0.size()), g0(w0.size());
  std::normal_distribution<double> normal;
  for (std::size_t i = 0; i < w0.size(); ++i) {
    // Weights over many binades (subnormal fp16 included), so the casts round in every regime.
    w0[i] = normal(rng) * std::ldexp(1.0, static_cast<int>(i % 41) - 28);
    m0[i] = 0.01 * normal(rng);
    v0[i] = 1e-4 * std::fabs(normal(rng));
    g0[i] = normal(rng) * (i % 7 == 0 ? 0.0 : 3.0);
  }
  auto make = [&](const std::vector<double>& x, DType t) {
    Tensor y = Tensor::empty(dev, {n}, t, MemoryCategory::OptimizerStates);
    y.copy_from_doubles(x);
    return y;
  };
  struct RestoreThreads {
    int before = cpu_math_threads();
    ~RestoreThreads() { set_cpu_math_threads(before); }
  } restore;
  // 768: exact in every dtype and far from every weight.
  const std::vector<double> poison(w0.size(), 768.0);
  for (DType gt : {DType::BF16, DType::F32, DType::F16}) {
    for (DType pt : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
      for (int threads : {1, 4}) {
        SCOPED_TRACE(::testing::Message()
                     << "grads " << dtype_name(gt) << ", params " << dtype_name(pt) << ", " << threads << " threads");
        set_cpu_math_threads(threads);
        const Tensor g = make(g0, gt);
        Tensor w = make(w0, DType::F32), m = make(m0, DType::F32), v = make(v0, DType::F32);
        Tensor ow = make(w0, DType::F32), om = make(m0, DType::F32), ov = make(v0, DType::F32);
        Tensor params = make(poison, pt), old_params = make(poison, pt);
        const Tensor poisoned = make(poison, pt);
        kernels::AdamStep a{0.9, 0.95, 1e-8, 0.1, 3e-4, 0, 0, 0.125};
        for (int step = 1; step <= 2; ++step) {
          a.bc1 = 1 - std::pow(a.beta1, step);
          a.bc2 = 1 - std::pow(a.beta2, step);
          kernels::adamw(w, m, v, g, segs, a, params);
          kernels::adamw(ow, om, ov, g, segs, a);  // the old way: the step, then the publish cast
          old_params.copy_from(ow);
        }
        ASSERT_EQ(std::memcmp(w.data(), ow.data(), w.nbytes()), 0) << "master";
        ASSERT_EQ(std::memcmp(m.data(), om.data(), m.nbytes()), 0) << "exp_avg";
        ASSERT_EQ(std::memcmp(v.data(), ov.data(), v.nbytes()), 0) << "exp_avg_sq";
        const auto bytes = dtype_size(pt);
        const auto* got = static_cast<const unsigned char*>(params.data());
        const auto* cast = static_cast<const unsigned char*>(old_params.data());
        const auto* bad = static_cast<const unsigned char*>(poisoned.data());
        std::int64_t gaps = 0;
        for (std::size_t k = 0; k < covered.size(); ++k) {
          gaps += covered[k] ? 0 : 1;
          ASSERT_EQ(std::memcmp(got + k * bytes, (covered[k] ? cast : bad) + k * bytes, bytes), 0)
              << "params[" << k << "] " << (covered[k] ? "is not copy_from(master)" : "is in no segment but changed");
        }
        EXPECT_GT(gaps, 100) << "the list leaves gaps";
      }
    }
  }
}

// The contract's edges: no segments is a no-op, overlapping segments (in any
// order) and segments outside the buffers are refused before anything runs.
TEST(AdamW, OverlappingOrOutOfRangeSegmentsAreRefused) {
  auto dev = make_device(DeviceKind::CPU);
  Tensor w = Tensor::zeros(dev, {100}, DType::F32, MemoryCategory::OptimizerStates);
  w.copy_from_doubles(std::vector<double>(100, 1.0));
  Tensor m = Tensor::zeros(dev, {100}, DType::F32, MemoryCategory::OptimizerStates);
  Tensor v = Tensor::zeros(dev, {100}, DType::F32, MemoryCategory::OptimizerStates);
  Tensor g = Tensor::zeros(dev, {100}, DType::BF16, MemoryCategory::Gradients);
  const kernels::AdamStep a{0.9, 0.999, 1e-8, 0.5, 0.1, 0.1, 0.001, 1.0};
  kernels::adamw(w, m, v, g, {}, a);
  EXPECT_EQ(w.to_double_vector(), std::vector<double>(100, 1.0));
  EXPECT_THROW(kernels::adamw(w, m, v, g, {{50, 60, true}, {0, 10, true}, {55, 70, false}}, a), InternalError);
  EXPECT_THROW(kernels::adamw(w, m, v, g, {{0, 10, true}, {9, 20, true}}, a), InternalError);
  EXPECT_THROW(kernels::adamw(w, m, v, g, {{90, 101, true}}, a), InternalError);
  EXPECT_THROW(kernels::adamw(w, m, v, g, {{10, 5, true}}, a), InternalError);
  // A params output: as many elements, a floating dtype, contiguous, named in the refusal.
  const auto refused = [&](const Tensor& params, const char* what) {
    try {
      kernels::adamw(w, m, v, g, {{0, 10, true}}, a, params);
      ADD_FAILURE() << what << " was accepted";
    } catch (const InternalError& e) {
      EXPECT_NE(std::string(e.what()).find("params"), std::string::npos) << e.what();
    }
  };
  refused(Tensor::zeros(dev, {99}, DType::BF16, MemoryCategory::Parameters), "99 elements");
  refused(Tensor::zeros(dev, {100}, DType::I32, MemoryCategory::Parameters), "an int32 output");
  refused(Tensor::zeros(dev, {100, 2}, DType::BF16, MemoryCategory::Parameters).select(1, 0), "a strided output");
  EXPECT_EQ(w.to_double_vector(), std::vector<double>(100, 1.0)) << "a refused call changes nothing";
  kernels::adamw(w, m, v, g, {{20, 30, true}, {0, 20, false}, {30, 30, true}}, a);  // touching, out of order
  const auto got = w.to_double_vector();
  EXPECT_EQ(got[0], 1.0) << "zero gradient, no decay";
  EXPECT_LT(got[25], 1.0) << "decay";
  EXPECT_EQ(got[30], 1.0) << "in no segment";
}

// Many ranges (ZeRO's counted parameters; here unordered, overlapping, some
// empty) against a double reference, for each gradient dtype; and the same
// bits wherever the buffer sits (a view at an odd element offset).
TEST(SumOfSquares, ManyRangesMatchADoubleReferenceWhereverTheBufferSits) {
  auto dev = make_device(DeviceKind::CPU);
  const std::int64_t n = 200003;
  std::mt19937 rng(7);
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  std::uniform_int_distribution<std::int64_t> at(0, n);
  for (int k = 0; k < 600; ++k) {
    std::int64_t b = at(rng), e = std::min<std::int64_t>(n, b + at(rng) % (k % 50 == 0 ? 60000 : 700));
    if (k % 37 == 0) e = b;  // empty
    ranges.emplace_back(b, e);
  }
  std::vector<double> g0(static_cast<std::size_t>(n));
  std::normal_distribution<double> normal;
  for (auto& x : g0) x = normal(rng) * 4;
  for (DType gt : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
    SCOPED_TRACE(dtype_name(gt));
    Tensor g = Tensor::empty(dev, {n}, gt, MemoryCategory::Gradients);
    g.copy_from_doubles(g0);
    const auto gv = g.to_double_vector();
    double ref = 0;
    std::int64_t terms = 0;
    for (const auto& [b, e] : ranges)
      for (std::int64_t i = b; i < e; ++i) {
        ref += gv[static_cast<std::size_t>(i)] * gv[static_cast<std::size_t>(i)];
        ++terms;
      }
    Tensor out = Tensor::zeros(dev, {1}, DType::F64, MemoryCategory::Workspace);
    kernels::sum_of_squares(g, ranges, out);
    const double got = out.to_double_vector()[0];
    // Positive terms: each order's error is below terms x 2^-53 of the sum.
    EXPECT_NEAR(got, ref, 2.0 * static_cast<double>(terms) * 0x1p-53 * ref);
    Tensor big = Tensor::zeros(dev, {n + 3}, gt, MemoryCategory::Gradients);
    Tensor shifted = big.narrow(0, 3, n);
    shifted.copy_from(g);
    Tensor out2 = Tensor::zeros(dev, {1}, DType::F64, MemoryCategory::Workspace);
    kernels::sum_of_squares(shifted, ranges, out2);
    EXPECT_EQ(double_bits(out2.to_double_vector()[0]), double_bits(got)) << "the buffer at another address";
  }
  Tensor g = Tensor::zeros(dev, {10}, DType::F32, MemoryCategory::Gradients);
  Tensor out = Tensor::empty(dev, {1}, DType::F64, MemoryCategory::Workspace);
  out.copy_from_doubles({5.0});
  kernels::sum_of_squares(g, {}, out);
  EXPECT_EQ(out.to_double_vector()[0], 0.0) << "no ranges: zero";
}

// zero_grad's clearing pass: unordered, overlapping and empty ranges zeroed,
// every other element untouched, in every dtype; out-of-range refused.
TEST(ZeroRanges, ClearsTheRangesAndNothingElse) {
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
    SCOPED_TRACE(dtype_name(t));
    auto dev = make_device(DeviceKind::CPU);
    const std::int64_t n = 5003;
    std::vector<double> v(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = 1.0 + static_cast<double>(i % 97);
    Tensor x = Tensor::empty(dev, {n}, t, MemoryCategory::Gradients);
    x.copy_from_doubles(v);
    const std::vector<std::pair<std::int64_t, std::int64_t>> ranges{{4000, 4100}, {0, 3},       {10, 10},  {50, 70},
                                                                    {60, 90},     {5000, 5003}, {300, 301}};
    kernels::zero_ranges(x, ranges);
    const auto got = x.to_double_vector();
    for (std::int64_t i = 0; i < n; ++i) {
      bool cleared = false;
      for (const auto& [b, e] : ranges) cleared = cleared || (i >= b && i < e);
      ASSERT_EQ(got[static_cast<std::size_t>(i)], cleared ? 0.0 : v[static_cast<std::size_t>(i)]) << "element " << i;
    }
    EXPECT_THROW(kernels::zero_ranges(x, {{5000, 5004}}), InternalError);
    EXPECT_THROW(kernels::zero_ranges(x, {{7, 6}}), InternalError);
  }
}

TEST(LrSchedule, WarmupThenCosineLinearConstant) {
  LrSchedule s;
  s.max_lr = 1.0;
  s.min_lr = 0.1;
  s.warmup_iters = 4;
  s.decay_iters = 14;
  EXPECT_DOUBLE_EQ(s.at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.at(4), 1.0);  // decay starts at 0
  EXPECT_NEAR(s.at(9), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 0.5)), 1e-12);
  EXPECT_DOUBLE_EQ(s.at(14), 0.1);
  EXPECT_DOUBLE_EQ(s.at(100), 0.1);  // stays at the minimum
  s.style = "linear";
  EXPECT_NEAR(s.at(9), 0.1 + 0.9 * 0.5, 1e-12);
  s.style = "constant";
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  s.style = "exponential";
  EXPECT_THROW(s.validate(), ConfigError);
  s.style = "cosine";
  s.min_lr = 2.0;
  try {
    s.validate();
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--min-lr"), std::string::npos);
  }
}

// Megatron's --lr-warmup-init: the warmup rises linearly from it to --lr; and
// the schedule read in samples (a batch-size ramp-up) is the iteration
// schedule at consumed / full batch, bit for bit at whole batches.
TEST(LrSchedule, WarmupInitAndTheScheduleInSamples) {
  LrSchedule s;
  s.max_lr = 1.0;
  s.init_lr = 0.2;
  s.warmup_iters = 4;
  s.decay_iters = 14;
  EXPECT_DOUBLE_EQ(s.at(0), 0.2 + 0.8 * 0.25);
  EXPECT_DOUBLE_EQ(s.at(2), 0.2 + 0.8 * 0.75);
  EXPECT_DOUBLE_EQ(s.at(3), 1.0);
  EXPECT_NO_THROW(s.validate());
  s.init_lr = 1.5;
  EXPECT_THROW(s.validate(), ConfigError);
  // DeepSpeed's logarithmic warmup, a step ahead as the linear one.
  s.warmup_style = "log";
  s.init_lr = 0;
  EXPECT_DOUBLE_EQ(s.at(0), std::log(2.0) / std::log(5.0));
  EXPECT_DOUBLE_EQ(s.at(2), std::log(4.0) / std::log(5.0));
  EXPECT_DOUBLE_EQ(s.at(3), 1.0);
  s.warmup_style = "exponential";
  EXPECT_THROW(s.validate(), ConfigError);
  s.warmup_style = "linear";
  for (std::int64_t it = 0; it < 20; ++it) EXPECT_EQ(s.at_samples(it * 64, 64), s.at(it)) << it;
  EXPECT_DOUBLE_EQ(s.at_samples(32, 64), 1.0 * 1.5 / 4) << "half an iteration into the warmup";
  EXPECT_NEAR(s.at_samples(9 * 64 + 16, 64), 0.5 * (1 + std::cos(std::numbers::pi * 5.25 / 10)), 1e-12);
}

// Megatron's warmup-stable-decay: the warmup, --lr until the anneal's first
// iteration, then the anneal's shape over --lr-wsd-decay-iters ending at
// --lr-decay-iters; and inverse-square-root, --lr * sqrt(warmup / it) floored
// at --min-lr and --min-lr past the decay. Values from each shape's closed
// form at chosen points.
TEST(LrSchedule, WarmupStableDecayAndInverseSquareRoot) {
  LrSchedule s;
  s.max_lr = 1.0;
  s.min_lr = 0.1;
  s.warmup_iters = 2;
  s.decay_iters = 20;
  s.style = "WSD";
  EXPECT_THROW(s.validate(), ConfigError) << "WSD without its anneal's length";
  s.wsd_decay_iters = 19;
  EXPECT_THROW(s.validate(), ConfigError) << "an anneal reaching into the warmup";
  s.wsd_decay_iters = 8;  // anneal from iteration 12 to 20
  EXPECT_NO_THROW(s.validate());
  EXPECT_DOUBLE_EQ(s.at(0), 0.5) << "the warmup is the usual one";
  for (std::int64_t it = 2; it <= 12; ++it) EXPECT_EQ(s.at(it), 1.0) << "stable at --lr, iteration " << it;
  const double r = 0.25;  // iteration 14
  EXPECT_NEAR(s.at(14), 0.1 + 0.9 * (2 * std::sqrt(std::sqrt(0.5)) - 1), 1e-12) << "exponential: 2 * 0.5^r - 1";
  EXPECT_NEAR(s.at(16), 0.1 + 0.9 * (2 * std::sqrt(0.5) - 1), 1e-12);
  const std::map<std::string, double> shape = {{"linear", 1 - r},
                                               {"cosine", 0.5 * (1 + std::cos(std::numbers::pi * r))},
                                               {"minus_sqrt", 1 - 0.5},
                                               {"exponential", 2 * std::pow(0.5, r) - 1}};
  for (const auto& [style, coef] : shape) {
    s.wsd_style = style;
    EXPECT_NO_THROW(s.validate()) << style;
    EXPECT_NEAR(s.at(14), 0.1 + 0.9 * coef, 1e-12) << style;
    EXPECT_NEAR(s.at(20), 0.1, 1e-12) << style << " ends at --min-lr";
    EXPECT_NEAR(s.at(50), 0.1, 1e-12) << style << " stays there";
    EXPECT_GT(s.at(13), s.at(19)) << style << " falls";
  }
  s.wsd_style = "sqrt";
  EXPECT_THROW(s.validate(), ConfigError);
  s.wsd_style = "linear";
  // In samples (a batch ramp-up): the anneal read at consumed / full batch.
  EXPECT_DOUBLE_EQ(s.at_samples(13 * 8 + 4, 8), 0.1 + 0.9 * (1 - 1.5 / 8));

  s.style = "inverse-square-root";
  s.warmup_iters = 4;
  EXPECT_NO_THROW(s.validate());
  EXPECT_DOUBLE_EQ(s.at(4), 1.0);
  EXPECT_DOUBLE_EQ(s.at(16), 0.5) << "sqrt(4 / 16)";
  EXPECT_DOUBLE_EQ(s.at(20), 1.0 / std::sqrt(5.0));
  EXPECT_DOUBLE_EQ(s.at(21), 0.1) << "past --lr-decay-iters";
  s.decay_iters = 1000;
  EXPECT_DOUBLE_EQ(s.at(900), 0.1) << "floored at --min-lr (sqrt(4 / 900) = 0.067)";
  s.warmup_iters = 0;
  EXPECT_DOUBLE_EQ(s.at(0), 1.0) << "no warmup: --lr at the first iteration";
  EXPECT_DOUBLE_EQ(s.at(4), 0.5);
}

// Megatron's weight-decay schedule: start to end over the increase's samples,
// linear or cosine (a half cosine rising from start), then the end value;
// constant must keep one value.
TEST(LrSchedule, WeightDecayIncreasesLinearlyOrByCosine) {
  WeightDecaySchedule w{0.0, 0.2, "linear", 4};
  EXPECT_DOUBLE_EQ(w.at_samples(0, 8), 0.0);
  EXPECT_DOUBLE_EQ(w.at_samples(8, 8), 0.05);
  EXPECT_DOUBLE_EQ(w.at_samples(12, 8), 0.075) << "half an iteration's samples";
  EXPECT_DOUBLE_EQ(w.at_samples(32, 8), 0.2);
  EXPECT_DOUBLE_EQ(w.at_samples(400, 8), 0.2);
  w.style = "cosine";
  EXPECT_NEAR(w.at_samples(16, 8), 0.1, 1e-15) << "the midpoint";
  EXPECT_NEAR(w.at_samples(8, 8), 0.2 * 0.5 * (std::cos(std::numbers::pi * 0.75) + 1), 1e-15);
  EXPECT_NO_THROW(w.validate());
  w.style = "constant";
  EXPECT_THROW(w.validate(), ConfigError) << "constant with two values";
  w.end = 0.0;
  EXPECT_NO_THROW(w.validate());
  w.style = "exponential";
  EXPECT_THROW(w.validate(), ConfigError);
}
