// GeLU, bias and element-wise kernels on the GPU: the launchers of
// megazero/cuda/gelu_bias.h (contracts: megazero/kernels/gelu_bias.h).
// Element-wise kernels move 16-byte packs; bias gradients are column sums
// (column_sums.cuh), and bias_gelu_backward writes dx and sums dbias in one
// pass.
#include <cuda_runtime.h>

#include "megazero/cuda/column_sums.cuh"
#include "megazero/cuda/gelu_bias.h"
#include "megazero/cuda/gelu_bias_kernels.cuh"
#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/layer_helpers.cuh"

namespace megazero::cuda {
using namespace detail_k;

namespace {

// ---------------------------------------------------------------- typed bodies
// (nvcc allows __device__ lambdas in function templates but not in generic
// lambdas, so the dtype dispatch calls these templates.)

template <typename S>
void gelu_forward_t(const void* x, void* y, i64 n, cudaStream_t s) {
  using C = compute_t<S>;
  map(
      static_cast<S*>(y), static_cast<const S*>(x), static_cast<const S*>(nullptr), n,
      [] __device__(C v, C, i64) { return gelu(v); }, s, "gelu_forward");
}

template <typename S>
void gelu_backward_t(const void* dy, const void* x, void* dx, i64 n, cudaStream_t s) {
  using C = compute_t<S>;
  map(
      static_cast<S*>(dx), static_cast<const S*>(dy), static_cast<const S*>(x), n,
      [] __device__(C g, C v, i64) { return g * gelu_grad(v); }, s, "gelu_backward");
}

// relu(x)^2 and its backward dy * 2 relu(x), in the compute type, as the CPU's.
template <typename S>
void squared_relu_forward_t(const void* x, void* y, i64 n, cudaStream_t s) {
  using C = compute_t<S>;
  map(
      static_cast<S*>(y), static_cast<const S*>(x), static_cast<const S*>(nullptr), n,
      [] __device__(C v, C, i64) {
        const C r = v < C(0) ? C(0) : v;  // a NaN stays NaN, as on the CPU
        return r * r;
      },
      s, "squared_relu_forward");
}

template <typename S>
void squared_relu_backward_t(const void* dy, const void* x, void* dx, i64 n, cudaStream_t s) {
  using C = compute_t<S>;
  map(
      static_cast<S*>(dx), static_cast<const S*>(dy), static_cast<const S*>(x), n,
      [] __device__(C g, C v, i64) { return g * (C(2) * (v < C(0) ? C(0) : v)); }, s, "squared_relu_backward");
}

template <typename S>
void bias_gelu_forward_t(const void* y, const void* bias, void* out, i64 rows, i64 cols, cudaStream_t s) {
  using C = compute_t<S>;
  periodic_map(
      static_cast<S*>(out), static_cast<const S*>(y), static_cast<const S*>(bias), rows * cols, cols,
      [] __device__(C v, C b) { return gelu(v + b); }, s, "bias_gelu_forward");
}

// dx and dbias in one pass: packed when the row is whole packs and the
// pointers are aligned (scratch: column_sums_bytes covers both forms), else
// the column sum's term writes the rounded dx and returns it. Either way dbias
// sums exactly the values gelu_backward then bias_grad would.
template <typename S, typename G>
void bias_gelu_backward_t(const void* dy, const void* y, const void* bias, void* dx, void* dbias, i64 rows, i64 cols,
                          kernels::GpuScratch ws, cudaStream_t s) {
  const S* dyp = static_cast<const S*>(dy);
  const S* yp = static_cast<const S*>(y);
  const S* bp = static_cast<const S*>(bias);
  S* dxp = static_cast<S*>(dx);
  if (cols == 0) return;
  if constexpr (!std::is_same_v<S, double>) {
    constexpr int V = kVec<S>;
    const auto c = kernels::gpu_scratch::packed_column_chunks(rows, cols, V);
    if (rows > 0 && c.used > 1 && cols % V == 0 && aligned16(dy) && aligned16(y) && aligned16(bias) && aligned16(dx)) {
      double* partial =
          scratch_as<double>(ws, static_cast<std::size_t>(c.used * cols) * sizeof(double), "bias_gelu_backward");
      const ColumnFold<G> fold = column_fold<G>({static_cast<G*>(dbias)}, c.col_blocks, s);
      bias_gelu_backward_packed_kernel<S>
          <<<dim3(static_cast<unsigned>(c.col_blocks), static_cast<unsigned>(c.used)), kThreads, 0, s>>>(
              dyp, yp, bp, dxp, rows, cols, c.per_chunk, partial, fold);
      check_launch("bias_gelu_backward");
      if (!fold.tickets) finish_columns(static_cast<G*>(dbias), cols, c.used, partial, s, "bias_gelu_backward");
      return;
    }
  }
  column_sum(
      static_cast<G*>(dbias), rows, cols,
      [=] __device__(i64 r, i64 c) {
        const i64 i = r * cols + c;
        const S v = st<S>(ld(dyp[i]) * gelu_grad(bp ? ld(yp[i]) + ld(bp[c]) : ld(yp[i])));
        dxp[i] = v;
        return static_cast<double>(ld(v));
      },
      ws, s, "bias_gelu_backward");
}

template <typename S>
void add_t(const void* a, const void* b, void* out, i64 n, cudaStream_t s) {
  using C = compute_t<S>;
  map(
      static_cast<S*>(out), static_cast<const S*>(a), static_cast<const S*>(b), n,
      [] __device__(C u, C v, i64) { return u + v; }, s, "add");
}

template <typename S>
void axpy_t(double alpha, const void* x, void* y, i64 n, cudaStream_t s) {
  using C = compute_t<S>;
  const C a = static_cast<C>(alpha);
  map(
      static_cast<S*>(y), static_cast<const S*>(y), static_cast<const S*>(x), n,
      [=] __device__(C u, C v, i64) { return u + a * v; }, s, "axpy");
}

template <typename S>
void scale_t(void* x, i64 n, double alpha, cudaStream_t s) {
  using C = compute_t<S>;
  const C a = static_cast<C>(alpha);
  map(
      static_cast<S*>(x), static_cast<const S*>(x), static_cast<const S*>(nullptr), n,
      [=] __device__(C v, C, i64) { return v * a; }, s, "scale");
}

}  // namespace

void gelu_forward(DType t, const void* x, void* y, i64 n, cudaStream_t s) {
  MZ_BY_STORAGE(t, gelu_forward_t, x, y, n, s);
}

void gelu_backward(DType t, const void* dy, const void* x, void* dx, i64 n, cudaStream_t s) {
  MZ_BY_STORAGE(t, gelu_backward_t, dy, x, dx, n, s);
}

void squared_relu_forward(DType t, const void* x, void* y, i64 n, cudaStream_t s) {
  MZ_BY_STORAGE(t, squared_relu_forward_t, x, y, n, s);
}

void squared_relu_backward(DType t, const void* dy, const void* x, void* dx, i64 n, cudaStream_t s) {
  MZ_BY_STORAGE(t, squared_relu_backward_t, dy, x, dx, n, s);
}

void bias_gelu_forward(DType t, const void* y, const void* bias, void* out, i64 rows, i64 cols, cudaStream_t s) {
  MZ_BY_STORAGE(t, bias_gelu_forward_t, y, bias, out, rows, cols, s);
}

void bias_gelu_backward(DType t, const void* dy, const void* y, const void* bias, void* dx, void* dbias,
                        DType dbias_type, i64 rows, i64 cols, kernels::GpuScratch ws, cudaStream_t s) {
  MZ_BY_STORAGE_AND_ACC(t, dbias_type, bias_gelu_backward_t, dy, y, bias, dx, dbias, rows, cols, ws, s);
}

void add_bias(DType t, void* y, const void* bias, i64 rows, i64 cols, cudaStream_t s) {
  MZ_BY_STORAGE(t, add_periodic_t, y, bias, rows * cols, cols, s, "add_bias");
}

void column_sums(DType t, const void* x, void* sums, DType sums_type, i64 rows, i64 cols, kernels::GpuScratch ws,
                 cudaStream_t s, const char* what) {
  MZ_BY_STORAGE_AND_ACC(t, sums_type, sum_rows_t, x, sums, rows, cols, ws, s, what);
}

void add(DType t, const void* a, const void* b, void* out, i64 n, cudaStream_t s) {
  MZ_BY_STORAGE(t, add_t, a, b, out, n, s);
}

void axpy(DType t, double alpha, const void* x, void* y, i64 n, cudaStream_t s) {
  MZ_BY_STORAGE(t, axpy_t, alpha, x, y, n, s);
}

void scale_elements(DType t, void* x, i64 n, double alpha, cudaStream_t s) {
  MZ_BY_STORAGE(t, scale_t, x, n, alpha, s);
}

}  // namespace megazero::cuda
