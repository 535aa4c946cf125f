// GeLU, bias and element-wise kernels on the GPU: the launchers of
// megazero/cuda/gelu_bias.h (contracts: megazero/kernels/gelu_bias.h).
// Element-wise kernels move 16-byte packs; bias gradients are column sums
// (column_sums.cuh), and bias_gelu_backward writes dx and sums dbias in one
// pass.
#include <cuda_runtime.h>

#include "megazero/cuda/column_sums.cuh"
#include "megazero/cuda/gelu_bias.h"
#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/layer_helpers.cuh"

namespace megazero::cuda {
using namespace detail_k;

namespace {

// ---------------------------------------------------------------- GeLU

constexpr double kGeluC = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kGeluA = 0.044715;

template <typename T>
__device__ __forceinline__ T gelu(T x) {
  const T u = static_cast<T>(kGeluC) * (x + static_cast<T>(kGeluA) * x * x * x);
  return static_cast<T>(0.5) * x * (static_cast<T>(1) + tanh(u));
}

template <typename T>
__device__ __forceinline__ T gelu_grad(T x) {
  const T u = static_cast<T>(kGeluC) * (x + static_cast<T>(kGeluA) * x * x * x);
  const T t = tanh(u);
  const T du = static_cast<T>(kGeluC) * (static_cast<T>(1) + static_cast<T>(3 * kGeluA) * x * x);
  return static_cast<T>(0.5) * (static_cast<T>(1) + t) + static_cast<T>(0.5) * x * (static_cast<T>(1) - t * t) * du;
}

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

template <typename S>
void bias_gelu_forward_t(const void* y, const void* bias, void* out, i64 rows, i64 cols, cudaStream_t s) {
  using C = compute_t<S>;
  periodic_map(
      static_cast<S*>(out), static_cast<const S*>(y), static_cast<const S*>(bias), rows * cols, cols,
      [] __device__(C v, C b) { return gelu(v + b); }, s, "bias_gelu_forward");
}

// bias_gelu_backward with 16-byte packs: each thread owns kVec<S> columns over
// a chunk of rows, loads a row's dy and y packs, writes its dx pack, and sums
// the rounded dx per column in double (column_finish_kernel adds the chunks).
template <typename S>
__global__ void bias_gelu_backward_packed_kernel(const S* dy, const S* y, const S* bias, S* dx, i64 rows, i64 cols,
                                                 i64 rows_per_chunk, double* partial) {
  constexpr int V = kVec<S>;
  const i64 q = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q * V >= cols) return;
  const i64 r0 = static_cast<i64>(blockIdx.y) * rows_per_chunk, r1 = min(rows, r0 + rows_per_chunk);
  const Pack<S> b = reinterpret_cast<const Pack<S>*>(bias)[q];
  double acc[V] = {};
  for (i64 r = r0; r < r1; ++r) {
    const Pack<S> d = reinterpret_cast<const Pack<S>*>(dy + r * cols)[q];
    const Pack<S> x = reinterpret_cast<const Pack<S>*>(y + r * cols)[q];
    Pack<S> o;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      o.v[j] = st<S>(ld(d.v[j]) * gelu_grad(ld(x.v[j]) + ld(b.v[j])));
      acc[j] += static_cast<double>(ld(o.v[j]));
    }
    reinterpret_cast<Pack<S>*>(dx + r * cols)[q] = o;
  }
  const i64 base = static_cast<i64>(blockIdx.y) * cols + q * V;
#pragma unroll
  for (int j = 0; j < V; ++j) partial[base + j] = acc[j];
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
      bias_gelu_backward_packed_kernel<S>
          <<<dim3(static_cast<unsigned>(c.col_blocks), static_cast<unsigned>(c.used)), kThreads, 0, s>>>(
              dyp, yp, bp, dxp, rows, cols, c.per_chunk, partial);
      check_launch("bias_gelu_backward");
      finish_columns(static_cast<G*>(dbias), cols, c.used, partial, s, "bias_gelu_backward");
      return;
    }
  }
  column_sum(
      static_cast<G*>(dbias), rows, cols,
      [=] __device__(i64 r, i64 c) {
        const i64 i = r * cols + c;
        const S v = st<S>(ld(dyp[i]) * gelu_grad(ld(yp[i]) + ld(bp[c])));
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
