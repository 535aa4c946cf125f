// SwiGLU (swiglu.h): argument checks, the CUDA dispatch (cuda/swiglu.cu) and
// the CPU kernels. Element-wise in the compute type C (fp32 for fp32 and
// 16-bit storage, fp64 for fp64), each result rounded once into storage;
// rows are split over threads, so nothing depends on the thread count.
#include "megazero/kernels/swiglu.h"

#include <cmath>

#include "megazero/core/error.h"
#include "megazero/kernels/kernel_support.h"
#ifdef MEGAZERO_WITH_CUDA
#include "megazero/cuda/swiglu_cuda.h"
#endif

namespace megazero::kernels {

namespace {

using namespace detail;  // kernel_support.h

// sigmoid(g) and silu(g) = g / (1 + exp(-g)) in the compute type (the CUDA
// kernels' swiglu_parts in cuda/swiglu_kernels.cuh is the same formula).
// exp(-g) overflows to inf for very negative g: sigmoid 0, silu -0.
template <typename C>
struct SiluParts {
  C sig, silu;
};
template <typename C>
SiluParts<C> silu_parts(C g) {
  const C d = C(1) + std::exp(-g);
  return {C(1) / d, g / d};
}

// y[r, c] = silu(x[r, c]) * x[r, F + c].
template <typename S>
void swiglu_forward_cpu(const S* x, S* y, i64 rows, i64 f) {
  using C = compute_t<S>;
#pragma omp parallel for num_threads(threads()) schedule(static) if (rows * f > kParallelMin)
  for (i64 r = 0; r < rows; ++r) {
    const S* gate = x + r * 2 * f;
    const S* up = gate + f;
    S* yr = y + r * f;
    for (i64 c = 0; c < f; ++c) yr[c] = st<S>(silu_parts<C>(ld(gate[c])).silu * ld(up[c]));
  }
}

// d gate = dy * up * silu'(gate), d up = dy * silu(gate),
// silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g))).
template <typename S>
void swiglu_backward_cpu(const S* dy, const S* x, S* dx, i64 rows, i64 f) {
  using C = compute_t<S>;
#pragma omp parallel for num_threads(threads()) schedule(static) if (rows * f > kParallelMin)
  for (i64 r = 0; r < rows; ++r) {
    const S* gate = x + r * 2 * f;
    const S* up = gate + f;
    const S* dyr = dy + r * f;
    S* dgate = dx + r * 2 * f;
    S* dup = dgate + f;
    for (i64 c = 0; c < f; ++c) {
      const C g = ld(gate[c]), u = ld(up[c]), d = ld(dyr[c]);
      const SiluParts<C> p = silu_parts(g);
      dgate[c] = st<S>(d * u * (p.sig * (C(1) + g * (C(1) - p.sig))));
      dup[c] = st<S>(d * p.silu);
    }
  }
}

// Whether two contiguous tensors share any byte of memory.
bool overlap(const Tensor& a, const Tensor& b) {
  if (a.buffer() != b.buffer() || a.numel() == 0 || b.numel() == 0) return false;
  const i64 a0 = a.storage_offset() * static_cast<i64>(dtype_size(a.dtype()));
  const i64 b0 = b.storage_offset() * static_cast<i64>(dtype_size(b.dtype()));
  return a0 < b0 + static_cast<i64>(b.nbytes()) && b0 < a0 + static_cast<i64>(a.nbytes());
}

// x: [..., 2F] = [gate | up]; returns {rows, F} and checks that `half` (y or
// dy) is x's shape with the last dimension F.
Rows check_halves(const char* op, const Tensor& x, const char* half_name, const Tensor& half) {
  const Rows s = rows_of(op, "x", x);
  MZ_CHECK(s.cols % 2 == 0, op, ": x's last dimension ", s.cols,
           " must be even: [gate | up], two halves of F columns side by side, got ", x.to_string());
  Shape want = x.shape();
  want.back() = s.cols / 2;
  check_shape(op, half_name, half, want);
  return {s.rows, s.cols / 2};
}

}  // namespace

void swiglu_forward(const Tensor& x, Tensor& y) {
  constexpr const char* op = "swiglu_forward";
  check_float(op, "x", x);
  check_operands(op, x, x.dtype(), {{"x", &x}, {"y", &y}});
  const Rows s = check_halves(op, x, "y", y);
  MZ_CHECK(!overlap(x, y), op, ": y overlaps x (", y.to_string(), " over ", x.to_string(),
           "); it is half x's size, so it needs its own memory");
  MZ_ON_CUDA(x, cuda::swiglu_forward(x.dtype(), x.data(), y.data(), s.rows, s.cols, stream_of(x)));
  if (!on_host(op, x)) return;
  with_storage_type(x.dtype(), [&](auto tag) {
    using S = decltype(tag);
    swiglu_forward_cpu(ptr<const S>(x), ptr<S>(y), s.rows, s.cols);
  });
}

void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  constexpr const char* op = "swiglu_backward";
  check_float(op, "x", x);
  check_operands(op, x, x.dtype(), {{"dy", &dy}, {"x", &x}, {"dx", &dx}});
  const Rows s = check_halves(op, x, "dy", dy);
  check_shape(op, "dx", dx, x.shape());
  MZ_CHECK(!overlap(dx, x), op, ": dx must not alias x (", dx.to_string(), " over ", x.to_string(), ")");
  MZ_CHECK(!overlap(dx, dy), op, ": dx must not alias dy (", dx.to_string(), " over ", dy.to_string(),
           "); dx is twice dy's size");
  MZ_ON_CUDA(x, cuda::swiglu_backward(x.dtype(), dy.data(), x.data(), dx.data(), s.rows, s.cols, stream_of(x)));
  if (!on_host(op, x)) return;
  with_storage_type(x.dtype(), [&](auto tag) {
    using S = decltype(tag);
    swiglu_backward_cpu(ptr<const S>(dy), ptr<const S>(x), ptr<S>(dx), s.rows, s.cols);
  });
}

}  // namespace megazero::kernels
