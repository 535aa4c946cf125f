#include "megazero/cuda/cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "megazero/core/error.h"
#include "megazero/cuda/cuda_device.h"

namespace megazero::cuda {
namespace {

constexpr unsigned kThreads = 256;
// Enough blocks to fill any current GPU several times over; the grid-stride
// loops cover larger n, so the grid size never overflows.
constexpr std::size_t kMaxBlocks = 8192;

unsigned blocks_for(std::size_t n) {
  return static_cast<unsigned>(std::min<std::size_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw InternalError(detail::concat("CUDA kernel launch failed in ", what, ": ", cudaGetErrorName(err), " (",
                                       cudaGetErrorString(err), ")"));
}

// Every value passes through fp32 (exact for fp16/bf16 sources) and is rounded
// once into the destination. fp64 is narrowed to fp32 first, exactly like the
// host's megazero::convert, so both give the same bits.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(double x) { return __double2float_rn(x); }

template <typename D>
__device__ __forceinline__ D from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ double from_float<double>(float x) {
  return static_cast<double>(x);
}

template <typename S, typename D>
__device__ __forceinline__ D convert_one(S x) {
  return from_float<D>(to_float(x));
}
// Never launched (equal dtypes are a memcpy) but instantiated by the dispatch;
// keep it exact rather than detouring through fp32.
template <>
__device__ __forceinline__ double convert_one<double, double>(double x) {
  return x;
}

template <typename S, typename D>
__global__ void convert_kernel(const S* __restrict__ src, D* __restrict__ dst, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = convert_one<S, D>(src[i]);
}

template <typename T>
__global__ void scale_matrix_kernel(T* data, std::size_t rows, std::size_t cols, std::size_t batch_stride,
                                    std::size_t row_stride, std::size_t n, float beta) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::size_t col = i % cols, row = (i / cols) % rows, b = i / (cols * rows);
    T& x = data[b * batch_stride + row * row_stride + col];
    // beta == 0 must not read x: BLAS lets C be uninitialised then.
    if constexpr (std::is_same_v<T, double>) {
      x = beta == 0.0f ? 0.0 : x * static_cast<double>(beta);
    } else {
      x = from_float<T>(beta == 0.0f ? 0.0f : to_float(x) * beta);
    }
  }
}

template <typename S, typename D>
void launch_convert(const void* src, void* dst, std::size_t n, cudaStream_t s) {
  convert_kernel<S, D><<<blocks_for(n), kThreads, 0, s>>>(static_cast<const S*>(src), static_cast<D*>(dst), n);
  check_launch("convert");
}

// Calls f with a value of the C++ type that stores dtype t.
template <typename F>
void with_float_type(DType t, const char* what, F&& f) {
  switch (t) {
    case DType::F32:
      f(float{});
      return;
    case DType::F16:
      f(__half{});
      return;
    case DType::BF16:
      f(__nv_bfloat16{});
      return;
    case DType::F64:
      f(double{});
      return;
    default:
      break;
  }
  throw InternalError(
      detail::concat("cuda::", what, ": floating dtypes only (fp32, fp16, bf16, fp64), got ", dtype_name(t)));
}

}  // namespace

void convert(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n, cudaStream_t s) {
  if (n == 0) return;
  if (src_type == dst_type) {
    MZ_CHECK(is_floating(src_type), "cuda::convert: floating dtypes only, got ", dtype_name(src_type));
    if (src != dst) MZ_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * dtype_size(src_type), cudaMemcpyDeviceToDevice, s));
    return;
  }
  with_float_type(src_type, "convert", [&](auto s_tag) {
    with_float_type(dst_type, "convert",
                    [&](auto d_tag) { launch_convert<decltype(s_tag), decltype(d_tag)>(src, dst, n, s); });
  });
}

void scale_matrix(void* data, DType t, std::size_t batch, std::size_t rows, std::size_t cols, std::size_t batch_stride,
                  std::size_t row_stride, float beta, cudaStream_t s) {
  const std::size_t n = batch * rows * cols;
  if (n == 0) return;
  with_float_type(t, "scale_matrix", [&](auto tag) {
    using T = decltype(tag);
    scale_matrix_kernel<T>
        <<<blocks_for(n), kThreads, 0, s>>>(static_cast<T*>(data), rows, cols, batch_stride, row_stride, n, beta);
    check_launch("scale_matrix");
  });
}

namespace {
__global__ void store_int64_pair_kernel(std::int64_t* dst, std::int64_t a, std::int64_t b) {
  dst[0] = a;
  dst[1] = b;
}
}  // namespace

void store_int64_pair(std::int64_t* dst, std::int64_t a, std::int64_t b, cudaStream_t s) {
  store_int64_pair_kernel<<<1, 1, 0, s>>>(dst, a, b);
  check_launch("store_int64_pair");
}

}  // namespace megazero::cuda
