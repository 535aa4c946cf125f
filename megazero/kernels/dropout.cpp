// Dropout and bias-dropout-add (dropout.h): shape checks, device dispatch and
// the CPU kernels. Each public function validates its arguments (also on the
// meta device, where nothing is computed), then runs a template over the
// storage type S (float, double, BFloat16 or Half) on raw pointers: elements
// are read with ld() into the compute type C = compute_t<S> and written with
// st<S>(), which rounds once to nearest even (kernel_support.h). The keep mask
// is a pure function of (key, global index) (kernel_support.h:
// dropout_row_base), so it does not depend on the dtype, the thread count or
// how ranks split the tensor.
#include "megazero/kernels/dropout.h"

#include <algorithm>

#include "megazero/core/error.h"
#include "megazero/kernels/gelu_bias.h"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/kernel_support.h"
#ifdef MEGAZERO_WITH_CUDA
#include "megazero/cuda/dropout.h"
#endif

namespace megazero::kernels {

namespace {

using namespace detail;  // kernel_support.h

// out = in * keep / (1 - p), keep = uniform_at(key, global index) >= p (the
// keep decision never looks at the data or its dtype). Work is split into
// chunks of a [matrix_rows, matrix_cols] block so that every thread has some
// even when samples * groups is small (hidden states have groups = 1).
template <typename S>
void dropout_cpu(const S* in, double p, const RngKey& key, const DropoutLayout& l, S* out) {
  using C = compute_t<S>;
  constexpr i64 kChunk = UniformStream::kFillMax;
  const i64 inner = l.matrix_rows * l.matrix_cols;
  const i64 chunks = (inner + kChunk - 1) / kChunk;
  const C keep_scale = static_cast<C>(1.0 / (1.0 - p));
#pragma omp parallel for num_threads(threads()) schedule(static) if (l.samples * l.groups * inner > kParallelMin / 8)
  for (i64 item = 0; item < l.samples * l.groups * chunks; ++item) {
    const i64 row = item / chunks, k0 = (item % chunks) * kChunk, k1 = std::min(inner, k0 + kChunk);
    const std::uint64_t base = dropout_row_base(l, row);
    alignas(64) float u[kChunk];
    UniformStream(key).fill(base + static_cast<std::uint64_t>(k0), k1 - k0, u);
    for (i64 k = k0; k < k1; ++k) {
      const i64 idx = row * inner + k;
      const bool keep = u[k - k0] >= p;
      out[idx] = keep ? st<S>(ld(in[idx]) * keep_scale) : zero<S>();
    }
  }
}

void dropout(const char* op, const Tensor& in, double p, const RngKey& key, const DropoutLayout& layout, Tensor& out) {
  check_float(op, "input", in);
  check_operands(op, in, in.dtype(), {{"input", &in}, {"output", &out}});
  check_shape(op, "output", out, in.shape());
  MZ_CHECK(p >= 0.0 && p < 1.0, op, ": dropout probability ", p, " must be in [0, 1)");
  check_layout(op, layout, in.numel());
  MZ_ON_CUDA(in, cuda::dropout(in.dtype(), in.data(), p, key, layout, out.data(), stream_of(in)));
  if (!on_host(op, in)) return;
  with_storage_type(in.dtype(), [&](auto tag) {
    using S = decltype(tag);
    if (p == 0.0) {  // no RNG at all: an identity, also in cost
      if (ptr<S>(out) != ptr<S>(in)) std::copy_n(ptr<S>(in), in.numel(), ptr<S>(out));
      return;
    }
    dropout_cpu(ptr<const S>(in), p, key, layout, ptr<S>(out));
  });
}

}  // namespace

void bias_dropout_add(const Tensor& y, const Tensor& bias, const Tensor& residual, double p, const RngKey& key,
                      const DropoutLayout& layout, Tensor& out) {
  constexpr const char* op = "bias_dropout_add";
  check_float(op, "y", y);
  const Rows s = rows_of(op, "y", y);
  check_operands(op, y, y.dtype(), {{"y", &y}, {"bias", &bias}, {"residual", &residual}, {"out", &out}});
  check_shape(op, "bias", bias, {s.cols});
  check_shapes(op, y.shape(), {{"residual", &residual}, {"out", &out}});
  MZ_CHECK(p >= 0.0 && p < 1.0, op, ": dropout probability ", p, " must be in [0, 1)");
  check_layout(op, layout, y.numel());
  MZ_ON_CUDA(y, cuda::bias_dropout_add(y.dtype(), y.data(), bias.data(), residual.data(), p, key, layout, out.data(),
                                       s.cols, stream_of(y)));
  if (!on_host(op, y)) return;
  with_storage_type(y.dtype(), [&](auto tag) {
    using S = decltype(tag);
    using C = compute_t<S>;
    const S* yp = ptr<const S>(y);
    const S* bp = ptr<const S>(bias);
    const S* rp = ptr<const S>(residual);
    S* op_ = ptr<S>(out);
    const C keep_scale = static_cast<C>(p > 0 ? 1.0 / (1.0 - p) : 1.0);
    const i64 inner = layout.matrix_rows * layout.matrix_cols, cols = s.cols;
#pragma omp parallel for num_threads(threads()) schedule(static) if (y.numel() > kParallelMin)
    for (i64 row = 0; row < layout.samples * layout.groups; ++row) {
      const std::uint64_t base = dropout_row_base(layout, row);
      const UniformStream uniform(key);
      alignas(64) float u[UniformStream::kFillMax];
      for (i64 k0 = 0; k0 < inner; k0 += UniformStream::kFillMax) {
        const i64 k1 = std::min(inner, k0 + UniformStream::kFillMax);
        if (p > 0.0) uniform.fill(base + static_cast<std::uint64_t>(k0), k1 - k0, u);
        for (i64 k = k0; k < k1; ++k) {
          const i64 idx = row * inner + k;
          const bool keep = p == 0.0 || u[k - k0] >= p;
          const C v = keep ? (ld(yp[idx]) + ld(bp[idx % cols])) * keep_scale : C(0);
          op_[idx] = st<S>(ld(rp[idx]) + v);
        }
      }
    }
  });
}

void dropout_forward(const Tensor& x, double p, const RngKey& key, const DropoutLayout& layout, Tensor& y) {
  dropout("dropout_forward", x, p, key, layout, y);
}

// The mask is a pure function of (key, global index): regenerating it costs
// compute but no memory, and matches the forward bit for bit.
void dropout_backward(const Tensor& dy, double p, const RngKey& key, const DropoutLayout& layout, Tensor& dx) {
  dropout("dropout_backward", dy, p, key, layout, dx);
}

void dropout_backward_bias_grad(const Tensor& dy, double p, const RngKey& key, const DropoutLayout& layout, Tensor& dx,
                                Tensor& dbias) {
  constexpr const char* op = "dropout_backward_bias_grad";
  check_float(op, "dy", dy);
  const Rows s = rows_of(op, "dy", dy);
  check_operands(op, dy, dy.dtype(), {{"dy", &dy}, {"dx", &dx}});
  check_shape(op, "dx", dx, dy.shape());
  check_accumulator(op, "dbias", dbias, dy, dy.dtype());
  check_shape(op, "dbias", dbias, {s.cols});
  MZ_CHECK(p >= 0.0 && p < 1.0, op, ": dropout probability ", p, " must be in [0, 1)");
  check_layout(op, layout, dy.numel());
  const Tensor ws = allocate_gpu_scratch(dy, gpu_scratch::dropout_bias_grad_bytes(s.rows, s.cols),
                                         "dropout_backward_bias_grad scratch");
  MZ_ON_CUDA(dy, cuda::dropout_backward_bias_grad(dy.dtype(), dy.data(), p, key, layout, dx.data(), dbias.data(),
                                                  dbias.dtype(), s.rows, s.cols, scratch_of(ws), stream_of(dy)));
  if (!on_host(op, dy)) return;
  dropout(op, dy, p, key, layout, dx);
  bias_grad(dx, dbias);
}

void dropout_backward_of(const Tensor& dy, const DropoutBackwardOf& d) {
  MZ_CHECK(d.out != nullptr, "dropout_backward_of: no output tensor");
  if (d.dbias)
    dropout_backward_bias_grad(dy, d.p, d.key, d.layout, *d.out, *d.dbias);
  else
    dropout_backward(dy, d.p, d.key, d.layout, *d.out);
}

}  // namespace megazero::kernels
