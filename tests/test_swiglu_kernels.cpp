// The SwiGLU kernels (megazero/kernels/swiglu.h) on the test device
// (tests/test_device.h: the CPU here, CUDA on a GPU machine), against a naive
// reference written here in double: the forward in fp64 to 1e-12, fp32 within
// a few fp32 roundings (the math is fp32), bf16/fp16 the fp32 result rounded
// once; the backward against central finite differences in fp64 of
// L = sum(w * y) and against the reference in every dtype; saturated gates
// (exp overflowing); higher-rank inputs; the aliasing the contract forbids
// refused (and adjacent, non-overlapping views accepted); the same bits for
// any thread count; and bad operands refused with a message.
#include <gtest/gtest.h>

#include <cmath>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "megazero/core/tensor.h"
#include "megazero/kernels/swiglu.h"

using namespace megazero;
using namespace megazero::kernels;
using namespace kernel_test;

namespace {

// This file's tensors live on the test device.
using on_test_device::empty, on_test_device::tensor, on_test_device::zeros;

// ------------------------------------------------------------ reference

double sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }

// Values and the size of the terms they are made of (no cancellation), which
// bounds the error of computing them in a lower precision.
struct Ref {
  Vec v, scale;
};

// x: [rows, 2f] = [gate | up]; y = g sigmoid(g) up.
Ref swiglu_ref(const Vec& x, i64 rows, i64 f) {
  Ref o{Vec(usize(rows * f)), Vec(usize(rows * f))};
  for (i64 r = 0; r < rows; ++r)
    for (i64 c = 0; c < f; ++c) {
      const double g = x[usize(r * 2 * f + c)], u = x[usize(r * 2 * f + f + c)];
      o.v[usize(r * f + c)] = g * sigmoid(g) * u;
      o.scale[usize(r * f + c)] = std::fabs(o.v[usize(r * f + c)]);
    }
  return o;
}

// d gate = dy up (sigmoid + g sigmoid (1 - sigmoid)), d up = dy g sigmoid.
Ref swiglu_backward_ref(const Vec& dy, const Vec& x, i64 rows, i64 f) {
  Ref o{Vec(x.size()), Vec(x.size())};
  for (i64 r = 0; r < rows; ++r)
    for (i64 c = 0; c < f; ++c) {
      const double g = x[usize(r * 2 * f + c)], u = x[usize(r * 2 * f + f + c)], d = dy[usize(r * f + c)];
      const double s = sigmoid(g);
      const std::size_t kg = usize(r * 2 * f + c), ku = kg + usize(f);
      o.v[kg] = d * u * (s + g * s * (1 - s));
      o.scale[kg] = std::fabs(d * u) * (s + std::fabs(g) * s * (1 - s));
      o.v[ku] = d * g * s;
      o.scale[ku] = std::fabs(o.v[ku]);
    }
  return o;
}

// How far a kernel result in dtype t may be from the double reference: the
// compute type's arithmetic (fp32: exp, a few operations; `ops` roundings of
// the terms' size) and one rounding to storage.
Vec tolerance(const Ref& r, DType t, double ops) {
  const double compute_u = t == DType::F64 ? 0x1p-53 : 0x1p-24;
  const double store_u = t == DType::F64 || t == DType::F32 ? 0.0 : unit_roundoff(t);
  Vec tol(r.v.size());
  for (std::size_t i = 0; i < tol.size(); ++i)
    tol[i] = ops * compute_u * r.scale[i] + 1.01 * store_u * std::fabs(r.v[i]) + subnormal_error(t);
  return tol;
}

Vec forward(const Vec& x, const Shape& shape, DType t) {
  Shape half = shape;
  half.back() /= 2;
  Tensor y = empty(half, t);
  swiglu_forward(tensor(shape, x, t), y);
  return vals(y);
}

Vec backward(const Vec& dy, const Vec& x, const Shape& shape, DType t) {
  Shape half = shape;
  half.back() /= 2;
  Tensor dx = tensor(shape, Vec(x.size(), 1e4), t);  // overwritten
  swiglu_backward(tensor(half, dy, t), tensor(shape, x, t), dx);
  return vals(dx);
}

// Gates over the range a trained MLP sees, and saturated ones: exp(-g)
// overflows for g < -89 in fp32 (silu -0) and -710 in fp64.
Vec gates_and_ups(i64 rows, i64 f, unsigned seed) {
  std::mt19937 rng(seed);
  Vec x = randn(usize(rows * 2 * f), rng, 2.0);
  const double extreme[] = {-1000.0, -120.0, -30.0, 30.0, 120.0, 1000.0, 0.0, -1.2785};
  for (std::size_t k = 0; k < std::size(extreme) && static_cast<i64>(k) < f; ++k) x[k] = extreme[k];  // row 0's gates
  return x;
}

// ------------------------------------------------------------ tests

TEST(SwiGlu, ForwardMatchesTheReferenceInEveryDtype) {
  const i64 rows = 9, f = 37;
  const Shape shape{rows, 2 * f};
  const Vec x = gates_and_ups(rows, f, 1);
  for (DType t : kAllDtypes) {
    SCOPED_TRACE(dtype_name(t));
    const Vec xt = rounded(x, t);
    const Ref want = swiglu_ref(xt, rows, f);
    const Vec got = forward(xt, shape, t);
    if (t == DType::F64)
      expect_within(got, want.v, tolerance(want, t, 1e-12 / 0x1p-53), "y (fp64: 1e-12)");
    else
      expect_within(got, want.v, tolerance(want, t, 8), "y");
    for (double v : got) EXPECT_TRUE(std::isfinite(v));
    if (t == DType::BF16 || t == DType::F16)  // computed in fp32, rounded once
      expect_same(got, rounded(forward(xt, shape, DType::F32), t), "y == the fp32 kernel's y rounded once");
  }
}

TEST(SwiGlu, LeadingDimensionsAreRows) {
  const Shape shape{2, 3, 10};
  const Vec x = gates_and_ups(6, 5, 2);
  const Vec flat = forward(x, {6, 10}, DType::F64);
  Tensor y = empty({2, 3, 5});
  swiglu_forward(tensor(shape, x), y);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 5}));
  expect_same(vals(y), flat, "[2, 3, 2F] as [6, 2F]");
  Tensor dx = empty(shape);
  const Vec dy(30, 0.5);
  swiglu_backward(tensor({2, 3, 5}, dy), tensor(shape, x), dx);
  expect_same(vals(dx), backward(dy, x, {6, 10}, DType::F64), "backward");
}

TEST(SwiGlu, Fp64BackwardMatchesFiniteDifferences) {
  const i64 rows = 4, f = 6;
  std::mt19937 rng(30);
  const Vec x = randn(usize(rows * 2 * f), rng, 2.0), w = randn(usize(rows * f), rng);
  const Vec dx = backward(w, x, {rows, 2 * f}, DType::F64);
  expect_fd_gradient(
      "dx", x,
      [&](const Vec& v) {
        return forward(v, {rows, 2 * f}, DType::F64);
      },
      w, dx);
  const Ref want = swiglu_backward_ref(w, x, rows, f);
  expect_within(dx, want.v, tolerance(want, DType::F64, 1e-12 / 0x1p-53), "dx against the formula (1e-12)");
}

TEST(SwiGlu, BackwardMatchesTheReferenceInEveryDtype) {
  const i64 rows = 9, f = 37;
  const Shape shape{rows, 2 * f};
  const Vec x = gates_and_ups(rows, f, 3);
  std::mt19937 rng(31);
  const Vec dy = randn(usize(rows * f), rng);
  for (DType t : kAllDtypes) {
    SCOPED_TRACE(dtype_name(t));
    const Vec xt = rounded(x, t), dyt = rounded(dy, t);
    const Ref want = swiglu_backward_ref(dyt, xt, rows, f);
    const Vec got = backward(dyt, xt, shape, t);
    if (t == DType::F64)
      expect_within(got, want.v, tolerance(want, t, 1e-12 / 0x1p-53), "dx (fp64: 1e-12)");
    else
      expect_within(got, want.v, tolerance(want, t, 12), "dx");
    for (double v : got) EXPECT_TRUE(std::isfinite(v));
    if (t == DType::BF16 || t == DType::F16)
      expect_same(got, rounded(backward(dyt, xt, shape, DType::F32), t), "dx == the fp32 kernel's dx rounded once");
  }
}

// The contract forbids dx over x (and y over x, dx over dy: the halves have
// other sizes): refused, not silently wrong. Views of one buffer that only
// touch are accepted.
TEST(SwiGlu, OverlappingOperandsAreRefusedAdjacentViewsAccepted) {
  const i64 rows = 3, f = 4;
  for (DType t : kAllDtypes) {
    SCOPED_TRACE(dtype_name(t));
    const Vec x = gates_and_ups(rows, f, 4), dy(usize(rows * f), 0.25);
    Tensor xt = tensor({rows, 2 * f}, x, t), dyt = tensor({rows, f}, dy, t);
    expect_rejected([&] { swiglu_backward(dyt, xt, xt); }, "swiglu_backward: dx must not alias x");
    Tensor buf = zeros({rows * 3 * f}, t);
    Tensor lo = Tensor::view_of(buf.buffer(), {rows, 2 * f}, t, 0);
    Tensor hi = Tensor::view_of(buf.buffer(), {rows, f}, t, rows * 2 * f);       // right after lo
    Tensor mid = Tensor::view_of(buf.buffer(), {rows, f}, t, rows * 2 * f - 1);  // one element into lo
    expect_rejected([&] { swiglu_backward(mid, xt, lo); }, "swiglu_backward: dx must not alias dy");
    expect_rejected([&] { swiglu_forward(lo, mid); }, "swiglu_forward: y overlaps x");
    hi.copy_from(dyt);
    swiglu_backward(hi, xt, lo);
    expect_same(vals(lo), backward(dy, x, {rows, 2 * f}, t), "dx next to dy in one buffer");
    lo.copy_from(xt);
    swiglu_forward(lo, hi);
    expect_same(vals(hi), forward(x, {rows, 2 * f}, t), "y next to x in one buffer");
  }
}

TEST(SwiGlu, SameBitsForAnyThreadCount) {
  if (test_dev()->kind() != DeviceKind::CPU) GTEST_SKIP() << "CPU threads only";
  const i64 rows = 300, f = 200;
  const Vec x = gates_and_ups(rows, f, 5);
  std::mt19937 rng(50);
  const Vec dy = randn(usize(rows * f), rng);
  expect_same_bits_with_1_and_4_threads(kAllDtypes, [&](DType t) {
    return std::vector<Vec>{forward(x, {rows, 2 * f}, t), backward(dy, x, {rows, 2 * f}, t)};
  });
}

TEST(SwiGlu, MetaDeviceChecksShapesOnly) {
  const auto meta = make_device(DeviceKind::Meta);
  const auto t = [&](const Shape& s, DType dt) { return Tensor::empty(meta, s, dt, MC::Other); };
  Tensor x = t({4, 16}, DType::BF16), y = t({4, 8}, DType::BF16), dx = t({4, 16}, DType::BF16);
  swiglu_forward(x, y);
  swiglu_backward(y, x, dx);
  Tensor bad = t({4, 9}, DType::BF16);
  expect_rejected([&] { swiglu_forward(x, bad); }, "swiglu_forward: y has shape (4, 9), expected (4, 8)");
}

TEST(SwiGlu, RefusesBadOperands) {
  for (DType t : kAllDtypes) {
    SCOPED_TRACE(dtype_name(t));
    const DType other = t == DType::F32 ? DType::F64 : DType::F32;
    const std::string name(dtype_name(t));
    Tensor x = zeros({4, 16}, t), y = zeros({4, 8}, t), dx = zeros({4, 16}, t);
    swiglu_forward(x, y);
    swiglu_backward(y, x, dx);
    expect_rejected(
        [&] {
          swiglu_forward(zeros({4, 15}, t), out(zeros({4, 7}, t)));
        },
        "swiglu_forward: x's last dimension 15 must be even");
    expect_rejected(
        [&] {
          swiglu_forward(x, out(zeros({4, 16}, t)));
        },
        "swiglu_forward: y has shape (4, 16), expected (4, 8)");
    expect_rejected([&] { swiglu_forward(x, out(zeros({2, 2, 8}, t))); }, "swiglu_forward: y has shape");
    expect_rejected([&] { swiglu_forward(x, out(zeros({4, 8}, other))); }, "swiglu_forward: y must be " + name);
    expect_rejected(
        [&] {
          swiglu_forward(zeros({16, 4}, t).transpose(0, 1), y);
        },
        "swiglu_forward: x must be contiguous");
    expect_rejected(
        [&] {
          swiglu_backward(zeros({4, 16}, t), x, dx);
        },
        "swiglu_backward: dy has shape (4, 16), expected (4, 8)");
    expect_rejected(
        [&] {
          swiglu_backward(y, x, out(zeros({4, 8}, t)));
        },
        "swiglu_backward: dx has shape (4, 8), expected (4, 16)");
    expect_rejected([&] { swiglu_backward(zeros({4, 8}, other), x, dx); }, "swiglu_backward: dy must be " + name);
    expect_rejected([&] { swiglu_backward(y, x, out(zeros({4, 16}, other))); }, "swiglu_backward: dx must be " + name);
    expect_rejected(
        [&] {
          swiglu_backward(y, zeros({4, 15}, t), dx);
        },
        "swiglu_backward: x's last dimension 15 must be even");
  }
  expect_rejected(
      [&] {
        swiglu_forward(zeros({4, 16}, DType::I64), out(zeros({4, 8}, DType::I64)));
      },
      "swiglu_forward: x must be fp32, fp64, bf16 or fp16");
  expect_rejected([&] { swiglu_forward(zeros({}, DType::F32), out(zeros({}, DType::F32))); },
                  "swiglu_forward: x needs at least one dimension");
}

}  // namespace
