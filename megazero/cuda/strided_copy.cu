// Strided copies with dtype conversion on the GPU (megazero/cuda/strided_copy.h;
// Device::copy_strided of the CUDA device): a device memcpy or the flat cast
// kernel for contiguous layouts, a warp per row when rows are contiguous
// (head splits and merges), else one thread per element.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "megazero/cuda/cuda_kernels.h"
#include "megazero/cuda/kernel_common.cuh"
#include "megazero/cuda/layer_helpers.cuh"
#include "megazero/cuda/strided_copy.h"

namespace megazero::cuda {
using namespace detail_k;

namespace {

struct CopyGeometry {
  i64 shape[kMaxCopyDims];
  i64 src_stride[kMaxCopyDims];
  i64 dst_stride[kMaxCopyDims];
  int ndim;
};

template <typename A, typename B>
__device__ __forceinline__ B convert_value(A x) {
  if constexpr (std::is_same_v<A, B>)
    return x;
  else
    return st<B>(ld(x));
}

// Element offsets on both sides of the flat index `i` over dimensions [0, ndim).
__device__ __forceinline__ void offsets_of(const CopyGeometry& geo, int ndim, i64 i, i64& so, i64& dof) {
  so = dof = 0;
  for (int d = ndim - 1; d >= 0; --d) {
    const i64 idx = i % geo.shape[d];
    i /= geo.shape[d];
    so += idx * geo.src_stride[d];
    dof += idx * geo.dst_stride[d];
  }
}

template <typename A, typename B>
__global__ void strided_copy_kernel(const A* src, B* dst, CopyGeometry geo, i64 n) {
  const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    i64 so, dof;
    offsets_of(geo, geo.ndim, i, so, dof);
    dst[dof] = convert_value<A, B>(src[so]);
  }
}

// Rows of contiguous elements (the last dimension has unit stride on both
// sides: head splits and merges): one warp per row, whose offsets take one
// index decomposition instead of one per element.
template <typename A, typename B>
__global__ void row_copy_kernel(const A* src, B* dst, CopyGeometry geo, i64 rows, i64 inner) {
  const i64 row = static_cast<i64>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  i64 so, dof;
  offsets_of(geo, geo.ndim - 1, row, so, dof);
  for (i64 j = threadIdx.x & 31; j < inner; j += 32) dst[dof + j] = convert_value<A, B>(src[so + j]);
}

// Whether `stride` is the contiguous (row-major) layout of `geo.shape`.
bool contiguous_layout(const CopyGeometry& geo, const i64* stride) {
  i64 expect = 1;
  for (int d = geo.ndim - 1; d >= 0; --d) {
    if (geo.shape[d] != 1 && stride[d] != expect) return false;
    expect *= geo.shape[d];
  }
  return true;
}

template <typename A, typename B>
void launch_copy(const void* src, void* dst, const CopyGeometry& geo, i64 n, cudaStream_t s) {
  const int last = geo.ndim - 1;
  // Enough rows to give every SM warps; otherwise the element-wise kernel.
  if (last >= 0 && geo.shape[last] >= 16 && n / geo.shape[last] >= 1024 && geo.src_stride[last] == 1 &&
      geo.dst_stride[last] == 1) {
    const i64 rows = n / geo.shape[last];
    row_copy_kernel<A, B><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, s>>>(
        static_cast<const A*>(src), static_cast<B*>(dst), geo, rows, geo.shape[last]);
  } else {
    strided_copy_kernel<A, B>
        <<<blocks_for(n), kThreads, 0, s>>>(static_cast<const A*>(src), static_cast<B*>(dst), geo, n);
  }
}

}  // namespace

void strided_copy(const void* src, DType src_type, const i64* src_strides, void* dst, DType dst_type,
                  const i64* dst_strides, const i64* shape, int ndim, cudaStream_t s) {
  MZ_CHECK(ndim >= 0 && ndim <= kMaxCopyDims, "strided copy of ", ndim, " dimensions (at most ", kMaxCopyDims, ")");
  CopyGeometry geo{};
  geo.ndim = ndim;
  i64 n = 1;
  for (int d = 0; d < ndim; ++d) {
    geo.shape[d] = shape[d];
    geo.src_stride[d] = src_strides[d];
    geo.dst_stride[d] = dst_strides[d];
    n *= shape[d];
  }
  if (n == 0) return;
  if (contiguous_layout(geo, geo.src_stride) && contiguous_layout(geo, geo.dst_stride)) {
    // Flat (fp32 master weights into 16-bit parameters): a device memcpy or the plain cast kernel,
    // which rounds as the host's megazero::convert does.
    if (src_type == dst_type)
      MZ_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * dtype_size(src_type), cudaMemcpyDeviceToDevice,
                               s) == cudaSuccess,
               "strided copy: device copy failed");
    else
      convert(src, src_type, dst, dst_type, static_cast<std::size_t>(n), s);
    return;
  }
  if (src_type == dst_type && !is_floating(src_type)) {  // ids and other integers: a byte-exact move
    const auto launch = [&](auto tag) {
      using T = decltype(tag);
      launch_copy<T, T>(src, dst, geo, n, s);
    };
    switch (dtype_size(src_type)) {
      case 1:
        launch(std::uint8_t{});
        break;
      case 2:
        launch(std::uint16_t{});
        break;
      case 4:
        launch(std::uint32_t{});
        break;
      default:
        launch(std::uint64_t{});
        break;
    }
    check_launch("strided copy");
    return;
  }
  with_storage(src_type, [&](auto a) {
    using A = decltype(a);
    with_storage(dst_type, [&](auto b) {
      using B = decltype(b);
      launch_copy<A, B>(src, dst, geo, n, s);
    });
  });
  check_launch("strided copy");
}

}  // namespace megazero::cuda
