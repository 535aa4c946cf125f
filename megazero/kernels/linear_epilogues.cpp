// The fused linear GEMMs of linear_epilogues.h: argument checks, then on CUDA
// (or a meta device standing in for it) cuBLASLt's epilogue, elsewhere — and
// where cuBLASLt has no kernel for a problem — the composition that defines it.
#include "megazero/kernels/linear_epilogues.h"

#include "megazero/kernels/gelu_bias.h"
#include "megazero/kernels/gemm.h"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/kernel_support.h"

#ifdef MEGAZERO_WITH_CUDA
#include "megazero/cuda/cuda_device.h"
#include "megazero/cuda/lt_matmul.h"
#endif

namespace megazero::kernels {
namespace {

using namespace detail;  // kernel_support.h

bool lt_dtype(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

// `t` is a contiguous [rows, cols] matrix of ref's dtype on ref's device.
void check_matrix(const char* op, const char* name, const Tensor& t, const Tensor& ref, i64 rows, i64 cols) {
  check_operand(op, name, t, ref, ref.dtype());
  MZ_CHECK(t.dim() == 2 && t.size(0) == rows && t.size(1) == cols, op, ": ", name, " has shape ", shape_str(t.shape()),
           ", expected (", rows, ", ", cols, ")");
}

// What the fused path needs of a problem before cuBLASLt is asked: a dtype it
// takes, a bias gradient of the GEMM's own dtype (it writes D's type; an fp32
// accumulator for 16-bit gradients takes the composition), and for the GeLU
// epilogues an aux row stride that is a multiple of 8 (its leading dimension).
bool fused_candidate(DType t, const Tensor* dbias, const Tensor* aux) {
  if (!lt_dtype(t)) return false;
  if (dbias != nullptr && dbias->dtype() != t) return false;
  if (aux != nullptr && aux->size(1) % 8 != 0) return false;
  return true;
}

// The fused path's memory, allocated as the run allocates it (the planner's
// meta device for CUDA counts the same): cuBLASLt's workspace and, for the
// bias-gradient epilogues, the gradient it writes before we add it to dbias.
struct FusedScratch {
  Tensor workspace, bias_grad;
};
FusedScratch fused_scratch(const Tensor& like, const Tensor* dbias) {
  FusedScratch s;
  s.workspace = allocate_gpu_scratch(like, gpu_scratch::kCublasWorkspaceBytes, "cuBLASLt workspace");
  if (dbias != nullptr)
    s.bias_grad = Tensor::empty(like.device_ptr(), dbias->shape(), dbias->dtype(), MemoryCategory::Workspace,
                                "cuBLASLt bias gradient");
  return s;
}

// A dry run standing in for CUDA: the GEMM for the time model, as gemm() logs it.
void log_gemm(const Tensor& like, i64 m, i64 n, i64 k) {
  static_cast<MetaDevice&>(like.device()).compute_log().add_gemm({m, n, k, 1, like.dtype()});
}

bool is_meta(const Tensor& t) { return t.device().kind() == DeviceKind::Meta; }

struct Dims {
  i64 rows, in, out;
};
// The forward entries: x [rows, in], w [out, in], bias [out], outputs [rows, out].
Dims check_forward(const char* op, const Tensor& x, const Tensor& w, const Tensor& bias,
                   std::initializer_list<Named> outputs) {
  check_float(op, "x", x);
  MZ_CHECK(x.dim() == 2 && w.dim() == 2, op, ": x and w must be 2-D, got ", x.to_string(), " and ", w.to_string());
  const Dims d{x.size(0), x.size(1), w.size(0)};
  check_matrix(op, "w", w, x, d.out, d.in);
  for (const auto& [name, t] : outputs) check_matrix(op, name, *t, x, d.rows, d.out);
  check_operand(op, "bias", bias, x, x.dtype());
  check_shape(op, "bias", bias, {d.out});
  return d;
}

// The backward entries: dy [rows, out] and a second matrix `other` [rows or
// out, in] that gives `in`; dbias [len] a gradient accumulator.
Dims check_backward(const char* op, const Tensor& dy, const char* other_name, const Tensor& other, bool other_is_w,
                    const Tensor& dbias, i64 dbias_len_of_in) {
  check_float(op, "dy", dy);
  MZ_CHECK(dy.dim() == 2 && other.dim() == 2, op, ": dy and ", other_name, " must be 2-D, got ", dy.to_string(),
           " and ", other.to_string());
  const Dims d{dy.size(0), other.size(1), dy.size(1)};
  check_matrix(op, other_name, other, dy, other_is_w ? d.out : d.rows, d.in);
  check_accumulator(op, "dbias", dbias, dy, dy.dtype());
  check_shape(op, "dbias", dbias, {dbias_len_of_in ? d.in : d.out});
  return d;
}

#ifdef MEGAZERO_WITH_CUDA
cuda::RowMajor rm(const Tensor& t) { return {t.data(), t.size(1)}; }
// On the stream of the device the scratch came from (`like`: the output the
// scratch was allocated beside), so its stream-ordered free follows the GEMM.
bool run_lt(const cuda::LtMatmul& p, const FusedScratch& s, const Tensor& like) {
  if (!cuda::lt_eligible(p)) return false;
  CudaDevice& dev = as_cuda_device(like.device());
  return cuda::lt_matmul(p, scratch_of(s.workspace), dev.stream(), dev.index());
}
#endif

}  // namespace

void linear_bias_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) {
  const auto [rows, in, out] = check_forward("linear_bias_forward", x, w, bias, {{"y", &y}});
  if (runs_cuda_kernels(x.device()) && rows * out * in > 0 && fused_candidate(x.dtype(), nullptr, nullptr)) {
    const FusedScratch s = fused_scratch(y, nullptr);
    if (is_meta(x)) return log_gemm(x, rows, out, in);
#ifdef MEGAZERO_WITH_CUDA
    if (run_lt(cuda::describe_linear_forward(cuda::LtEpilogue::Bias, rows, in, out, rm(x), rm(w), bias.data(), rm(y),
                                             rm(y), x.dtype(), y.dtype()),
               s, y))
      return;
#endif
  }
  gemm(x, false, w, true, y);
  add_bias(y, bias);
}

void linear_bias_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& pre, Tensor& out) {
  constexpr const char* op = "linear_bias_gelu_forward";
  const auto [rows, in, n_out] = check_forward(op, x, w, bias, {{"pre", &pre}, {"out", &out}});
  MZ_CHECK(pre.data() != out.data() || pre.data() == nullptr, op,
           ": pre and out must not alias (pre is kept for backward)");
  if (runs_cuda_kernels(x.device()) && rows * n_out * in > 0 && fused_candidate(x.dtype(), nullptr, &pre)) {
    const FusedScratch s = fused_scratch(out, nullptr);
    if (is_meta(x)) return log_gemm(x, rows, n_out, in);
#ifdef MEGAZERO_WITH_CUDA
    if (run_lt(cuda::describe_linear_forward(cuda::LtEpilogue::GeluAuxBias, rows, in, n_out, rm(x), rm(w), bias.data(),
                                             rm(out), rm(pre), x.dtype(), out.dtype()),
               s, out))
      return;
#endif
  }
  gemm(x, false, w, true, pre);
  add_bias(pre, bias);
  gelu_forward(pre, out);
}

void linear_dgelu_bias_grad(const Tensor& dy, const Tensor& w, const Tensor& pre, Tensor& dpre, Tensor& dbias) {
  constexpr const char* op = "linear_dgelu_bias_grad";
  const auto [rows, in, out] = check_backward(op, dy, "w", w, /*other_is_w=*/true, dbias, /*dbias_len_of_in=*/true);
  check_matrix(op, "pre", pre, dy, rows, in);
  check_matrix(op, "dpre", dpre, dy, rows, in);
  MZ_CHECK(dpre.data() != pre.data() || pre.data() == nullptr, op, ": dpre must not alias pre");
  if (runs_cuda_kernels(dy.device()) && rows * out * in > 0 && fused_candidate(dy.dtype(), &dbias, &pre)) {
    const FusedScratch s = fused_scratch(dpre, &dbias);
    if (is_meta(dy)) return log_gemm(dy, rows, in, out);
#ifdef MEGAZERO_WITH_CUDA
    Tensor grad = s.bias_grad;
    if (run_lt(cuda::describe_linear_dgelu(rows, in, out, rm(dy), rm(w), rm(pre), rm(dpre), grad.data(), dy.dtype()), s,
               dpre)) {
      add(dbias, grad, dbias);
      return;
    }
#endif
  }
  gemm(dy, false, w, false, dpre);
  gelu_backward(dpre, pre, dpre);
  bias_grad(dpre, dbias);
}

void linear_weight_bias_grad(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& dbias, float beta_dw) {
  constexpr const char* op = "linear_weight_bias_grad";
  const auto [rows, in, out] = check_backward(op, dy, "x", x, /*other_is_w=*/false, dbias, /*dbias_len_of_in=*/false);
  check_matrix(op, "dw", dw, dy, out, in);
  if (runs_cuda_kernels(dy.device()) && rows * out * in > 0 && fused_candidate(dy.dtype(), &dbias, nullptr)) {
    const FusedScratch s = fused_scratch(dw, &dbias);
    if (is_meta(dy)) return log_gemm(dy, out, in, rows);
#ifdef MEGAZERO_WITH_CUDA
    Tensor grad = s.bias_grad;
    cuda::LtMatmul p = cuda::describe_linear_wgrad(rows, in, out, rm(dy), rm(x), rm(dw), grad.data(), dy.dtype());
    p.beta = beta_dw;
    if (run_lt(p, s, dw)) {
      add(dbias, grad, dbias);
      return;
    }
#endif
  }
  gemm(dy, true, x, false, dw, 1.0f, beta_dw);
  bias_grad(dy, dbias);
}

std::string linear_epilogues_report(const Device& device) {
  if (device.kind() != DeviceKind::CUDA)
    return ::megazero::detail::concat("GEMM epilogues: no cuBLASLt on ", device.name(),
                                      ": the same math as separate passes (GEMM, then bias/GeLU kernels)");
#ifdef MEGAZERO_WITH_CUDA
  const cuda::LtReport r = cuda::lt_report();
  return ::megazero::detail::concat("GEMM epilogues: cuBLASLt fused ", r.fused_problems, " problem shapes",
                                    r.refused.empty() ? std::string() : "; refused (run unfused): " + r.refused);
#else
  return "GEMM epilogues: built without CUDA";
#endif
}

}  // namespace megazero::kernels
