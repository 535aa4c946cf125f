// GEMM on the GPU through cuBLAS. megazero tensors are row-major and cuBLAS is
// column-major; a row-major matrix is the column-major storage of its
// transpose, so we compute C^T = op(B)^T op(A)^T: cuBLAS sees C^T (N x M), with
// B as its first operand and A as its second, and nothing is copied.
//
// 16-bit inputs accumulate in fp32 (CUBLAS_COMPUTE_32F) on tensor cores; fp32
// inputs run as true fp32 (the handle keeps the default math mode, so no TF32)
// and fp64 through cublasDgemm. Shapes and dtypes were checked by gemm().
#include <cublas_v2.h>

#include <algorithm>
#include <unordered_map>

#include "megazero/core/error.h"
#include "megazero/cuda/blas_types.h"
#include "megazero/cuda/cuda_device.h"
#include "megazero/cuda/cuda_kernels.h"
#include "megazero/cuda/gemm_cuda.h"
#include "megazero/cuda/lt_matmul.h"
#include "megazero/kernels/gemm.h"

namespace megazero::cuda {
namespace {

void check_cublas(cublasStatus_t st, const char* call) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw InternalError(
        detail::concat("cuBLAS ", call, " failed: ", cublasGetStatusName(st), " (", cublasGetStatusString(st), ")"));
}

// cuBLAS handles are not thread safe and belong to one device, so each thread
// keeps one per GPU. They are destroyed at thread exit (errors ignored: the
// runtime may be unloading by then).
class HandleCache {
 public:
  ~HandleCache() {
    for (auto& [index, handle] : handles_) (void)cublasDestroy(handle);
  }
  cublasHandle_t get(int index) {
    auto it = handles_.find(index);
    if (it != handles_.end()) return it->second;
    cublasHandle_t h = nullptr;
    check_cublas(cublasCreate(&h), "cublasCreate");  // on the current device: the caller holds a guard
    handles_.emplace(index, h);
    return h;
  }

 private:
  std::unordered_map<int, cublasHandle_t> handles_;
};

cublasHandle_t handle_for(const CudaDevice& dev, kernels::GpuScratch ws) {
  thread_local HandleCache cache;
  cublasHandle_t h = cache.get(dev.index());
  // Several CudaDevice objects may share a GPU, each with its own stream, so
  // bind the stream on every call (cheap: it only stores the pointer). Setting
  // the stream drops the workspace back to cuBLAS's own pool, so hand it ours
  // after: cuBLAS then allocates nothing.
  check_cublas(cublasSetStream(h, dev.stream()), "cublasSetStream");
  MZ_CHECK(ws.data != nullptr && ws.bytes >= kernels::gpu_scratch::kCublasWorkspaceBytes, "gemm (cuda): given ",
           ws.bytes, " bytes of cuBLAS workspace, needs ", kernels::gpu_scratch::kCublasWorkspaceBytes);
  check_cublas(cublasSetWorkspace(h, ws.data, ws.bytes), "cublasSetWorkspace");
  return h;
}

// One operand as cuBLAS sees it: its memory read as a column-major matrix with
// leading dimension ld, and whether that memory holds the row-major matrix
// itself (row_major) or its transpose (a transposed view).
struct Operand {
  const void* data;
  bool row_major;
  std::int64_t ld;
  long long batch_stride;
};

Operand describe(const Tensor& x, const char* what) {
  const int d = x.dim();
  const std::int64_t rows = x.size(-2), cols = x.size(-1);
  const std::int64_t s_row = x.strides()[static_cast<std::size_t>(d - 2)];
  const std::int64_t s_col = x.strides()[static_cast<std::size_t>(d - 1)];
  const long long batch = d == 3 ? static_cast<long long>(x.strides()[0]) : 0;  // 2-D: shared by every batch
  // A size-1 dimension has a meaningless stride; cuBLAS still wants ld to be
  // at least the stored row count, hence the max().
  if (s_col == 1 || cols == 1) return {x.data(), true, std::max<std::int64_t>({s_row, cols, 1}), batch};
  MZ_CHECK(s_row == 1 || rows == 1, "gemm (cuda): ", what, " ", x.to_string(),
           " has no unit stride in either of its last two dimensions (strides ", shape_str(x.strides()),
           "); make it contiguous first");
  return {x.data(), false, std::max<std::int64_t>({s_col, rows, 1}), batch};
}

cudaDataType_t cuda_type(DType t) { return blas_type(t, "gemm (cuda)"); }

// C's leading dimension as cuBLAS counts it: C is row-major with a unit last
// stride (checked by gemm()), i.e. C^T in column-major with ldc = its row stride.
std::int64_t ldc_of(const Tensor& c) {
  return std::max<std::int64_t>({c.strides()[static_cast<std::size_t>(c.dim() - 2)], c.size(-1), 1});
}

// cuBLAS's first operand must be op(B)^T (N x K). Memory of a row-major B is
// B^T already, so it needs no transpose unless trans_b asks for one; a
// transposed view flips that. Likewise A, which must become op(A)^T.
bool transposed(const Operand& o, bool trans) { return trans != !o.row_major; }

}  // namespace

LtMatmul describe_gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha,
                       float beta) {
  MZ_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2, "describe_gemm: 2-D operands only");
  const Operand oa = describe(a, "A"), ob = describe(b, "B");
  LtMatmul p;
  p.epilogue = LtEpilogue::None;
  p.m = c.size(-1), p.n = c.size(-2), p.k = a.size(trans_a ? -2 : -1);
  p.trans_a = transposed(ob, trans_b), p.a = ob.data, p.lda = ob.ld;
  p.trans_b = transposed(oa, trans_a), p.b = oa.data, p.ldb = oa.ld;
  p.d = c.data(), p.ldd = ldc_of(c);
  p.in = a.dtype(), p.out = c.dtype();
  p.alpha = alpha, p.beta = beta;
  return p;
}

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta,
          kernels::GpuScratch ws) {
  const std::int64_t m = c.size(-2), n = c.size(-1);
  const std::int64_t k = a.size(trans_a ? -2 : -1);
  const std::int64_t batch = a.dim() == 3 ? a.size(0) : 1;
  if (m == 0 || n == 0 || batch == 0) return;
  MZ_CHECK(a.dtype() != DType::F64 || c.dtype() == DType::F64, "gemm (cuda): fp64 inputs need an fp64 C, got ",
           c.to_string());

  CudaDevice& dev = as_cuda_device(c.device());
  CudaDeviceGuard guard(dev.index());
  const std::int64_t ldc = ldc_of(c);
  const long long stride_c = c.dim() == 3 ? static_cast<long long>(c.strides()[0]) : 0;
  if (k == 0) {
    // An empty inner dimension (e.g. an empty shard) leaves C = beta * C; do
    // it ourselves rather than rely on every cuBLAS path honouring k == 0.
    scale_matrix(c.data(), c.dtype(), static_cast<std::size_t>(batch), static_cast<std::size_t>(m),
                 static_cast<std::size_t>(n), static_cast<std::size_t>(stride_c), static_cast<std::size_t>(ldc), beta,
                 dev.stream());
    return;
  }
  // Autotuned (lt_matmul.h): 2-D problems through cuBLASLt, the same
  // column-major problem as below; cuBLAS where cuBLASLt has no algorithm.
  if (lt_autotune() && batch == 1 && a.dim() == 2 && a.dtype() != DType::F64) {
    const LtMatmul p = describe_gemm(a, trans_a, b, trans_b, c, alpha, beta);
    if (lt_eligible(p) && lt_matmul(p, ws, dev.stream(), dev.index())) return;
  }
  cublasHandle_t h = handle_for(dev, ws);

  const Operand oa = describe(a, "A"), ob = describe(b, "B");
  const cublasOperation_t op_b = transposed(ob, trans_b) ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = transposed(oa, trans_a) ? CUBLAS_OP_T : CUBLAS_OP_N;

  if (a.dtype() == DType::F64) {
    const double alpha64 = alpha, beta64 = beta;
    check_cublas(
        cublasDgemmStridedBatched_64(h, op_b, op_a, n, m, k, &alpha64, static_cast<const double*>(ob.data), ob.ld,
                                     ob.batch_stride, static_cast<const double*>(oa.data), oa.ld, oa.batch_stride,
                                     &beta64, static_cast<double*>(c.data()), ldc, stride_c, batch),
        "cublasDgemmStridedBatched_64");
    return;
  }
  // alpha/beta are fp32 host scalars, as CUBLAS_COMPUTE_32F requires.
  check_cublas(cublasGemmStridedBatchedEx_64(h, op_b, op_a, n, m, k, &alpha, ob.data, cuda_type(b.dtype()), ob.ld,
                                             ob.batch_stride, oa.data, cuda_type(a.dtype()), oa.ld, oa.batch_stride,
                                             &beta, c.data(), cuda_type(c.dtype()), ldc, stride_c, batch,
                                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmStridedBatchedEx_64");
}

}  // namespace megazero::cuda
