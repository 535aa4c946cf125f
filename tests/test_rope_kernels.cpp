// The rotary position embedding kernels (megazero/kernels/rope.h) on the test
// device (tests/test_device.h: the CPU here, CUDA on a GPU machine): the fp64
// forward against a naive reference written here (Hugging Face's form, the
// inverse frequency as 1 / base^(2i/D)) to 1e-12; fp32/bf16/fp16 against the
// contract's arithmetic spelled out here in fp32 (cos/sin in double rounded
// to fp32, the products and sums in fp32, one rounding to storage); the
// backward as the exact adjoint (<rope(x), y> == <x, rope_backward(y)>) and
// against central finite differences in fp64; rope(rope_backward(y)) == y;
// positions (row s of each of the N blocks turns by s, position 0 not at
// all); head sizes of several shared-memory tiles on a GPU; aliasing; the
// same bits for any thread count; bad operands (odd D among them) refused.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "megazero/core/tensor.h"
#include "megazero/kernels/rope.h"

using namespace megazero;
using namespace megazero::kernels;
using namespace kernel_test;

namespace {

// This file's tensors live on the test device.
using on_test_device::empty, on_test_device::tensor, on_test_device::zeros;

constexpr double kBase = 10000.0;

struct Dims {
  i64 n, s, d;
  Shape shape() const { return {n, s, d}; }
  std::size_t numel() const { return usize(n * s * d); }
};

// In double, Hugging Face's way: inv_freq[i] = 1 / base^(2i/D), angle s * inv_freq[i];
// sign -1: the rotation by -theta.
Vec rope_ref(const Vec& x, Dims m, double base, int sign = 1) {
  Vec y(x.size());
  const i64 h = m.d / 2;
  for (i64 b = 0; b < m.n; ++b)
    for (i64 s = 0; s < m.s; ++s)
      for (i64 i = 0; i < h; ++i) {
        const double inv_freq = 1.0 / std::pow(base, static_cast<double>(2 * i) / static_cast<double>(m.d));
        const double th = static_cast<double>(s) * inv_freq, c = std::cos(th), sn = sign * std::sin(th);
        const std::size_t k = usize((b * m.s + s) * m.d + i), k2 = k + usize(h);
        y[k] = x[k] * c - x[k2] * sn;
        y[k2] = x[k2] * c + x[k] * sn;
      }
  return y;
}

// The contract's arithmetic for fp32 compute: theta = s * base^(-2i/D) in
// double, cos and sin rounded to fp32, each product and the sum in fp32.
// (The 16-bit kernels round these fp32 values once more, to storage.)
Vec rope_f32_ref(const Vec& x, Dims m, double base, bool backward) {
  Vec y(x.size());
  const i64 h = m.d / 2;
  for (i64 b = 0; b < m.n; ++b)
    for (i64 s = 0; s < m.s; ++s)
      for (i64 i = 0; i < h; ++i) {
        const double th =
            static_cast<double>(s) * std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(m.d));
        const float c = static_cast<float>(std::cos(th)), sn = static_cast<float>(std::sin(th));
        const std::size_t k = usize((b * m.s + s) * m.d + i), k2 = k + usize(h);
        const float x0 = static_cast<float>(x[k]), x1 = static_cast<float>(x[k2]);
        const float p00 = x0 * c, p11 = x1 * sn, p10 = x1 * c, p01 = x0 * sn;
        y[k] = backward ? p00 + p11 : p00 - p11;
        y[k2] = backward ? p10 - p01 : p10 + p01;
      }
  return y;
}

Vec run(const Vec& x, Dims m, DType t, bool backward = false, double base = kBase) {
  Tensor y = empty(m.shape(), t);
  if (backward)
    rope_backward(tensor(m.shape(), x, t), base, y);
  else
    rope_forward(tensor(m.shape(), x, t), base, y);
  return vals(y);
}

// ------------------------------------------------------------ tests

TEST(Rope, Fp64MatchesTheReference) {
  for (Dims m : {Dims{3, 17, 64}, Dims{2, 5, 2}, Dims{1, 300, 8}}) {
    SCOPED_TRACE(std::to_string(m.s) + " positions, D = " + std::to_string(m.d));
    std::mt19937 rng(static_cast<unsigned>(m.s));
    const Vec x = randn(m.numel(), rng);
    expect_close(run(x, m, DType::F64), rope_ref(x, m, kBase), 1e-12, 1e-12, "forward");
    expect_close(run(x, m, DType::F64, true), rope_ref(x, m, kBase, -1), 1e-12, 1e-12, "backward");
    expect_close(run(x, m, DType::F64, false, 500.0), rope_ref(x, m, 500.0), 1e-12, 1e-12, "base 500");
  }
}

// How far an fp32 or 16-bit result may be from the double reference `ref`:
// a few fp32 roundings of the terms (|x0| + |x1| bounds each: cos, sin and
// the two products and their sum are rounded), then one rounding to storage.
Vec rope_tolerance(const Vec& x, Dims m, const Vec& ref, DType t) {
  const double store_u = t == DType::F32 ? 0.0 : t == DType::BF16 ? 0x1p-8 : 0x1p-11;
  const i64 h = m.d / 2;
  Vec tol(x.size());
  for (std::size_t k = 0; k < x.size(); ++k) {
    const i64 row = static_cast<i64>(k) / m.d, i = static_cast<i64>(k) % m.d % h;
    const double terms = std::fabs(x[usize(row * m.d + i)]) + std::fabs(x[usize(row * m.d + i + h)]);
    tol[k] = 4 * 0x1p-24 * terms + 1.01 * store_u * std::fabs(ref[k]) + (t == DType::F16 ? 0x1p-25 : 0.0);
  }
  return tol;
}

// fp32 and 16-bit storage: exactly the contract's fp32 arithmetic (on the CPU
// bit for bit; elsewhere the device's double cos/sin/pow may move a value by
// an fp32 rounding), then one rounding to storage; and within a few fp32
// roundings of the double reference.
TEST(Rope, LowerPrecisionsFollowTheContractsArithmetic) {
  const Dims m{4, 33, 40};
  std::mt19937 rng(10);
  const Vec x = randn(m.numel(), rng);
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(t));
    const Vec xt = rounded(x, t);
    for (bool backward : {false, true}) {
      const std::string what = backward ? "backward" : "forward";
      const Vec got = run(xt, m, t, backward);
      if (test_dev()->kind() == DeviceKind::CPU)
        expect_same(got, rounded(rope_f32_ref(xt, m, kBase, backward), t), what);
      const Vec ref = rope_ref(xt, m, kBase, backward ? -1 : 1);
      expect_within(got, ref, rope_tolerance(xt, m, ref, t), what + " against the double reference");
    }
  }
}

TEST(Rope, BackwardIsTheExactAdjointAndMatchesFiniteDifferences) {
  const Dims m{3, 11, 16};
  std::mt19937 rng(20);
  const Vec x = randn(m.numel(), rng), w = randn(m.numel(), rng);
  const Vec fx = run(x, m, DType::F64), bw = run(w, m, DType::F64, true);
  double scale = 0;
  for (std::size_t k = 0; k < x.size(); ++k) scale += std::fabs(fx[k] * w[k]) + std::fabs(x[k] * bw[k]);
  EXPECT_NEAR(dot(fx, w), dot(x, bw), 1e-14 * scale) << "<rope(x), w> == <x, rope_backward(w)>";
  // Central differences of L = sum(w * rope(x)); rope is linear, so they are
  // exact up to rounding.
  constexpr double h = 1e-6;
  for (std::size_t k = 0; k < x.size(); ++k) {
    Vec xp = x, xm = x;
    xp[k] += h;
    xm[k] -= h;
    const double fd = (dot(w, run(xp, m, DType::F64)) - dot(w, run(xm, m, DType::F64))) / (2 * h);
    EXPECT_NEAR(bw[k], fd, 1e-6 * (std::fabs(fd) + 0.01)) << k;
  }
}

TEST(Rope, ForwardUndoesBackward) {
  const Dims m{2, 50, 32};
  std::mt19937 rng(30);
  const Vec y = randn(m.numel(), rng);
  expect_close(run(run(y, m, DType::F64, true), m, DType::F64), y, 1e-13, 1e-13, "rope(rope_backward(y))");
  expect_close(run(run(y, m, DType::F64), m, DType::F64, true), y, 1e-13, 1e-13, "rope_backward(rope(y))");
  const Vec y32 = rounded(y, DType::F32);
  expect_close(run(run(y32, m, DType::F32, true), m, DType::F32), y32, 0, 1e-5, "fp32");
}

// Row s of every one of the N blocks turns by s * inv_freq: the same row in
// every block gives the same result; position 0 is the identity, bit for bit;
// and swapping the first two positions' rows is not the same as rotating them.
TEST(Rope, EachBlockRowIsItsPosition) {
  const Dims m{5, 7, 12};
  std::mt19937 rng(40);
  const Vec row_block = randn(usize(m.s * m.d), rng);
  Vec x;
  for (i64 b = 0; b < m.n; ++b) x.insert(x.end(), row_block.begin(), row_block.end());
  for (DType t : kAllDtypes) {
    SCOPED_TRACE(dtype_name(t));
    const Vec xt = rounded(x, t);
    for (bool backward : {false, true}) {
      const Vec y = run(xt, m, t, backward);
      const std::size_t block = usize(m.s * m.d);
      for (i64 b = 1; b < m.n; ++b)
        expect_same(Vec(y.begin() + static_cast<long>(b * block), y.begin() + static_cast<long>((b + 1) * block)),
                    Vec(y.begin(), y.begin() + static_cast<long>(block)), "block " + std::to_string(b));
      for (i64 b = 0; b < m.n; ++b)
        for (i64 i = 0; i < m.d; ++i) {
          const std::size_t k = usize(b * m.s * m.d + i);  // position 0
          EXPECT_EQ(y[k], xt[k]) << "position 0 turns by 0, block " << b << " element " << i;
        }
      if (t == DType::F64) {  // position s by s * inv_freq, in every block
        const Vec ref = rope_ref(xt, m, kBase, backward ? -1 : 1);
        expect_close(y, ref, 1e-12, 1e-12, "angles");
      }
    }
  }
  // One block of seq 7 is not seven blocks of seq 1: the position is the row
  // within its block.
  const Vec one = run(rounded(x, DType::F64), {m.n * m.s, 1, m.d}, DType::F64);
  EXPECT_NE(one, run(x, m, DType::F64));
  EXPECT_EQ(one, x) << "every row at position 0";
}

// Head sizes over several of the CUDA kernel's 256-pair tiles, and few
// positions with many blocks (the launcher splits the blocks).
TEST(Rope, WideHeadsAndManyBlocks) {
  for (Dims m : {Dims{2, 3, 1030}, Dims{700, 2, 6}}) {
    SCOPED_TRACE("D = " + std::to_string(m.d));
    std::mt19937 rng(static_cast<unsigned>(m.d));
    const Vec x = randn(m.numel(), rng);
    expect_close(run(x, m, DType::F64), rope_ref(x, m, kBase), 1e-12, 1e-12, "fp64");
    const Vec x32 = rounded(x, DType::F32);
    const Vec got = run(x32, m, DType::F32, true), ref = rope_ref(x32, m, kBase, -1);
    if (test_dev()->kind() == DeviceKind::CPU) expect_same(got, rope_f32_ref(x32, m, kBase, true), "fp32 backward");
    expect_within(got, ref, rope_tolerance(x32, m, ref, DType::F32), "fp32 backward against the double reference");
  }
}

TEST(Rope, OutputMayAliasTheInput) {
  const Dims m{3, 9, 20};
  std::mt19937 rng(50);
  const Vec x = randn(m.numel(), rng);
  for (DType t : kAllDtypes) {
    SCOPED_TRACE(dtype_name(t));
    for (bool backward : {false, true}) {
      Tensor a = tensor(m.shape(), x, t);
      if (backward)
        rope_backward(a, kBase, a);
      else
        rope_forward(a, kBase, a);
      expect_same(vals(a), run(x, m, t, backward), backward ? "dx aliasing dy" : "y aliasing x");
    }
  }
}

// Rows from a first position (a key/value cache's next tokens): the rows of
// the same positions in the longer sequence, bit for bit.
TEST(Rope, RowsFromAFirstPositionAreThoseOfTheLongerSequence) {
  const i64 n = 3, seq = 11, d = 20, first = 8, tail = seq - first;
  std::mt19937 rng(55);
  const Vec x = randn(static_cast<std::size_t>(n * seq * d), rng);
  Vec x_tail;
  for (i64 b = 0; b < n; ++b)
    x_tail.insert(x_tail.end(), x.begin() + static_cast<long>((b * seq + first) * d),
                  x.begin() + static_cast<long>((b + 1) * seq * d));
  for (DType t : kAllDtypes)
    for (bool backward : {false, true}) {
      SCOPED_TRACE(testing::Message() << dtype_name(t) << (backward ? " backward" : " forward"));
      Tensor whole = tensor({n, seq, d}, x, t), part = tensor({n, tail, d}, x_tail, t);
      if (backward) {
        rope_backward(whole, kBase, whole);
        rope_backward(part, kBase, part, first);
      } else {
        rope_forward(whole, kBase, whole);
        rope_forward(part, kBase, part, first);
      }
      const Vec all = vals(whole);
      Vec want;
      for (i64 b = 0; b < n; ++b)
        want.insert(want.end(), all.begin() + static_cast<long>((b * seq + first) * d),
                    all.begin() + static_cast<long>((b + 1) * seq * d));
      expect_same(vals(part), want, "rows from position 8");
    }
  Tensor x3 = tensor({1, 2, 4}, Vec(8, 1.0));
  expect_rejected([&] { rope_forward(x3, kBase, x3, -1); }, "the first position must not be negative");
}

// Per-token positions (--reset-position-ids): every row of block n turns as
// the one-row sequence from its sample's position does (sample n / heads),
// bit for bit, whatever the other samples' positions.
TEST(Rope, PerTokenPositionsTurnEachRowByItsOwnPosition) {
  const i64 samples = 2, heads = 3, seq = 7, d = 10, n = samples * heads;
  const std::vector<i64> pos = {0, 1, 2, 0, 1, 0, 1, 5, 6, 7, 8, 9, 10, 1000};
  Tensor positions = Tensor::empty(test_dev(), {samples * seq}, DType::I64, MC::Other);
  positions.copy_from(ids_tensor(pos));
  std::mt19937 rng(77);
  const Vec x = randn(static_cast<std::size_t>(n * seq * d), rng);
  for (DType t : kAllDtypes)
    for (bool backward : {false, true}) {
      SCOPED_TRACE(testing::Message() << dtype_name(t) << (backward ? " backward" : " forward"));
      Tensor all = tensor({n, seq, d}, x, t);
      if (backward)
        rope_backward(all, kBase, all, 0, positions);
      else
        rope_forward(all, kBase, all, 0, positions);
      const Vec got = vals(all);
      for (i64 b = 0; b < n; ++b)
        for (i64 r = 0; r < seq; ++r) {
          const auto at = static_cast<long>((b * seq + r) * d);
          Tensor row = tensor({1, 1, d}, Vec(x.begin() + at, x.begin() + at + d), t);
          const i64 p = pos[static_cast<std::size_t>(b / heads * seq + r)];
          if (backward)
            rope_backward(row, kBase, row, p);
          else
            rope_forward(row, kBase, row, p);
          expect_same(Vec(got.begin() + at, got.begin() + at + d), vals(row), "a row at its own position");
        }
    }
  Tensor x3 = tensor({3, 7, 4}, Vec(84, 1.0));
  expect_rejected([&] { rope_forward(x3, kBase, x3, 2, positions); }, "positions and a first position");
  expect_rejected([&] { rope_forward(x3, kBase, x3, 0, positions); }, "B dividing N = 3");
}

// --rotary-seq-len-interpolation-factor: a position scale of 1/2 at positions
// 2p turns each row exactly as position p unscaled (2p x 1/2 is p exactly),
// bit for bit in every dtype; a scale of 1 changes no bit; 0 is refused.
TEST(Rope, InterpolatedPositionsAreTheScaledOnes) {
  const i64 n = 3, seq = 6, d = 16;
  std::vector<i64> doubled, plain;
  for (i64 s = 0; s < seq; ++s) doubled.push_back(2 * (s + 5)), plain.push_back(s + 5);
  Tensor pd = Tensor::empty(test_dev(), {seq}, DType::I64, MC::Other), pp = pd.clone(MC::Other);
  pd.copy_from(ids_tensor(doubled));
  pp.copy_from(ids_tensor(plain));
  std::mt19937 rng(91);
  const Vec x = randn(static_cast<std::size_t>(n * seq * d), rng);
  for (DType t : kAllDtypes)
    for (bool backward : {false, true}) {
      SCOPED_TRACE(testing::Message() << dtype_name(t) << (backward ? " backward" : " forward"));
      Tensor a = tensor({n, seq, d}, x, t), b = tensor({n, seq, d}, x, t), c = tensor({n, seq, d}, x, t),
             e = tensor({n, seq, d}, x, t);
      if (backward) {
        rope_backward(a, kBase, a, 0, pd, 0.5);
        rope_backward(b, kBase, b, 0, pp);
        rope_backward(c, kBase, c, 5, Tensor(), 1.0);
        rope_backward(e, kBase, e, 5);
      } else {
        rope_forward(a, kBase, a, 0, pd, 0.5);
        rope_forward(b, kBase, b, 0, pp);
        rope_forward(c, kBase, c, 5, Tensor(), 1.0);
        rope_forward(e, kBase, e, 5);
      }
      expect_same(vals(a), vals(b), "positions 2p at scale 1/2");
      expect_same(vals(c), vals(e), "scale 1");
      expect_same(vals(b), vals(e), "positions p as a first position");
    }
  Tensor x3 = tensor({1, 2, 4}, Vec(8, 1.0));
  expect_rejected([&] { rope_forward(x3, kBase, x3, 0, Tensor(), 0.0); },
                  "the position scale must be finite and positive");
}

// --use-rope-scaling (Llama 3's rope scaling): the fp64 kernel against Hugging
// Face's _compute_llama3_parameters written here (wavelength = 2 pi / inv_freq
// against the original 8192 positions / 1 and / 4; the medium band blended),
// at positions 5000 + s where the bands' angles differ a lot; all three bands
// are exercised; the scaled rotation is not the plain one; a factor of 0 is
// the plain rotation bit for bit in every dtype; factors below 1 refused.
TEST(Rope, Llama3ScalingDividesTheLowFrequencies) {
  const double base = 500000.0, factor = 8.0;
  const i64 n = 2, seq = 7, d = 128, first = 5000;
  int bands[3] = {0, 0, 0};
  auto inv_freq = [&](i64 i) {
    const double f = 1.0 / std::pow(base, static_cast<double>(2 * i) / static_cast<double>(d));
    const double wavelen = 2 * M_PI / f, low_wavelen = 8192.0 / 1.0, high_wavelen = 8192.0 / 4.0;
    if (wavelen > low_wavelen) return ++bands[0], f / factor;
    if (wavelen < high_wavelen) return ++bands[2], f;
    ++bands[1];
    const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
    return (1 - smooth) * f / factor + smooth * f;
  };
  std::mt19937 rng(17);
  const Vec x = randn(usize(n * seq * d), rng);
  Vec want(x.size());
  for (i64 b = 0; b < n; ++b)
    for (i64 s = 0; s < seq; ++s)
      for (i64 i = 0; i < d / 2; ++i) {
        const double th = static_cast<double>(first + s) * inv_freq(i), c = std::cos(th), sn = std::sin(th);
        const std::size_t k = usize((b * seq + s) * d + i), k2 = k + usize(d / 2);
        want[k] = x[k] * c - x[k2] * sn;
        want[k2] = x[k2] * c + x[k] * sn;
      }
  EXPECT_GT(bands[0], 0);
  EXPECT_GT(bands[1], 0) << "the blended band";
  EXPECT_GT(bands[2], 0);
  Tensor y = tensor({n, seq, d}, x, DType::F64), plain = tensor({n, seq, d}, x, DType::F64);
  rope_forward(y, base, y, first, Tensor(), 1.0, false, factor);
  rope_forward(plain, base, plain, first);
  expect_close(vals(y), want, 1e-12, 1e-12, "forward with Llama 3 scaling");
  double apart = 0;
  for (std::size_t k = 0; k < want.size(); ++k) apart = std::max(apart, std::fabs(vals(plain)[k] - want[k]));
  EXPECT_GT(apart, 0.1) << "the scaling turns the low frequencies otherwise";
  rope_backward(y, base, y, first, Tensor(), 1.0, false, factor);
  expect_close(vals(y), x, 1e-12, 1e-12, "backward undoes forward");
  for (DType t : kAllDtypes) {
    Tensor a = tensor({n, seq, d}, x, t), b = tensor({n, seq, d}, x, t);
    rope_forward(a, base, a, first, Tensor(), 1.0, false, 0.0);
    rope_forward(b, base, b, first);
    expect_same(vals(a), vals(b), "factor 0 is the plain rotation, " + std::string(dtype_name(t)));
  }
  Tensor x3 = tensor({1, 2, 4}, Vec(8, 1.0));
  expect_rejected([&] { rope_forward(x3, kBase, x3, 0, Tensor(), 1.0, false, 0.5); },
                  "the Llama 3 rope scaling factor must be 0 (off) or at least 1");
}

// --rotary-interleaved pairs (2i, 2i + 1) at the same angle i: exactly the
// rotate-half form on each head with its dimensions permuted (2i -> i, 2i + 1
// -> i + D/2) and permuted back, bit for bit in every dtype, forward and
// backward, from a first position and at per-token positions (the same
// permutation Meta's and Hugging Face's Llama checkpoints differ by).
TEST(Rope, InterleavedPairsAreTheHalvesOfPermutedHeads) {
  const Dims m{3, 7, 12};
  const i64 half = m.d / 2;
  auto permute = [&](const Vec& v, bool to_halves) {
    Vec out(v.size());
    for (i64 row = 0; row < m.n * m.s; ++row)
      for (i64 i = 0; i < half; ++i)
        for (i64 j : {0, 1}) {
          const std::size_t inter = usize(row * m.d + 2 * i + j), halves = usize(row * m.d + i + j * half);
          if (to_halves)
            out[halves] = v[inter];
          else
            out[inter] = v[halves];
        }
    return out;
  };
  std::vector<i64> pos;
  for (i64 s = 0; s < m.s; ++s) pos.push_back(s < 3 ? s : s - 3);  // a document starting at row 3
  Tensor positions = Tensor::empty(test_dev(), {m.s}, DType::I64, MC::Other);
  positions.copy_from(ids_tensor(pos));
  std::mt19937 rng(12);
  const Vec x = randn(m.numel(), rng);
  for (DType t : kAllDtypes)
    for (bool backward : {false, true})
      for (int where = 0; where < 2; ++where) {
        SCOPED_TRACE(testing::Message() << dtype_name(t) << (backward ? " backward" : " forward")
                                        << (where ? " per-token positions" : " from position 4"));
        const i64 first = where ? 0 : 4;
        const Tensor p = where ? positions : Tensor();
        Tensor inter = tensor(m.shape(), x, t), halves = tensor(m.shape(), permute(x, true), t);
        if (backward) {
          rope_backward(inter, kBase, inter, first, p, 1.0, true);
          rope_backward(halves, kBase, halves, first, p);
        } else {
          rope_forward(inter, kBase, inter, first, p, 1.0, true);
          rope_forward(halves, kBase, halves, first, p);
        }
        expect_same(vals(inter), permute(vals(halves), false), "interleaved = halves of the permuted heads");
        EXPECT_NE(vals(inter), vals(tensor(m.shape(), x, t))) << "and something turned";
      }
}

TEST(Rope, SameBitsForAnyThreadCount) {
  if (test_dev()->kind() != DeviceKind::CPU) GTEST_SKIP() << "CPU threads only";
  const Dims m{16, 128, 64};
  std::mt19937 rng(60);
  const Vec x = randn(m.numel(), rng);
  expect_same_bits_with_1_and_4_threads(kAllDtypes, [&](DType t) {
    return std::vector<Vec>{run(x, m, t), run(x, m, t, true)};
  });
}

TEST(Rope, MetaDeviceChecksShapesOnly) {
  const auto meta = make_device(DeviceKind::Meta);
  Tensor x = Tensor::empty(meta, {4, 8, 16}, DType::BF16, MC::Other);
  rope_forward(x, kBase, x);
  rope_backward(x, kBase, x);
  Tensor odd = Tensor::empty(meta, {4, 8, 15}, DType::BF16, MC::Other);
  expect_rejected([&] { rope_forward(odd, kBase, odd); }, "rope_forward: the head size D = 15 must be even");
}

TEST(Rope, RefusesBadOperands) {
  for (DType t : kAllDtypes) {
    SCOPED_TRACE(dtype_name(t));
    const DType other = t == DType::F32 ? DType::F64 : DType::F32;
    const std::string name(dtype_name(t));
    Tensor x = zeros({2, 3, 8}, t), y = zeros({2, 3, 8}, t);
    rope_forward(x, kBase, y);
    rope_backward(x, kBase, y);
    expect_rejected(
        [&] {
          rope_forward(zeros({2, 3, 7}, t), kBase, out(zeros({2, 3, 7}, t)));
        },
        "rope_forward: the head size D = 7 must be even");
    expect_rejected(
        [&] {
          rope_backward(zeros({2, 3, 5}, t), kBase, out(zeros({2, 3, 5}, t)));
        },
        "rope_backward: the head size D = 5 must be even");
    expect_rejected([&] { rope_forward(zeros({2, 3, 0}, t), kBase, out(zeros({2, 3, 0}, t))); }, "the head size D = 0");
    expect_rejected(
        [&] {
          rope_forward(zeros({6, 8}, t), kBase, out(zeros({6, 8}, t)));
        },
        "rope_forward: x must be [N, S, D]");
    expect_rejected(
        [&] {
          rope_forward(zeros({1, 2, 3, 8}, t), kBase, out(zeros({1, 2, 3, 8}, t)));
        },
        "rope_forward: x must be [N, S, D]");
    expect_rejected([&] { rope_forward(x, kBase, out(zeros({2, 4, 8}, t))); }, "rope_forward: y has shape (2, 4, 8)");
    expect_rejected([&] { rope_forward(x, kBase, out(zeros({2, 3, 8}, other))); }, "rope_forward: y must be " + name);
    expect_rejected(
        [&] {
          rope_backward(x, kBase, out(zeros({3, 2, 8}, t)));
        },
        "rope_backward: dx has shape (3, 2, 8)");
    expect_rejected([&] { rope_forward(x, 0.0, y); }, "rope_forward: base must be finite and positive");
    expect_rejected([&] { rope_forward(x, -2.0, y); }, "base must be finite and positive");
    expect_rejected([&] { rope_forward(x, std::nan(""), y); }, "base must be finite and positive");
    expect_rejected(
        [&] {
          rope_forward(zeros({2, 8, 3}, t).transpose(1, 2), kBase, y);
        },
        "rope_forward: x must be contiguous");
  }
  expect_rejected(
      [&] {
        rope_forward(zeros({2, 3, 8}, DType::I32), kBase, out(zeros({2, 3, 8}, DType::I32)));
      },
      "rope_forward: x must be fp32, fp64, bf16 or fp16");
}

}  // namespace
