// Shape checking and device dispatch for gemm(); the kernels live in
// gemm_cpu.cpp and megazero/cuda/gemm_cuda.cpp.
#include "megazero/kernels/gemm.h"

#include "megazero/core/error.h"
#include "megazero/kernels/gpu_scratch.h"
#ifdef MEGAZERO_WITH_CUDA
#include "megazero/cuda/lt_matmul.h"
#endif

#include <cstdio>

namespace megazero {

// The switch itself lives with the code it steers (cuda/lt_matmul); a build
// without CUDA has nothing to tune.
#ifdef MEGAZERO_WITH_CUDA
void set_gemm_autotune(bool on) { cuda::set_lt_autotune(on); }
bool gemm_autotune() { return cuda::lt_autotune(); }
#else
void set_gemm_autotune(bool) {}
bool gemm_autotune() { return false; }
#endif

std::string gemm_autotune_report(bool detail) {
#ifdef MEGAZERO_WITH_CUDA
  const cuda::LtReport r = cuda::lt_report();
  if (r.autotuned == 0) return "";
  char head[256];
  std::snprintf(head, sizeof head,
                "GEMM autotune: %zu problems timed, %zu kept another algorithm than cuBLASLt's heuristics' first; "
                "one call of each: %.3f ms with the first, %.3f ms with the kept (%.3fx)",
                r.autotuned, r.autotune_changed, r.autotune_first_ms, r.autotune_best_ms,
                r.autotune_best_ms > 0 ? r.autotune_first_ms / r.autotune_best_ms : 0.0);
  std::string out = head;
  if (detail)
    for (const std::string& line : r.autotune_lines) out += "\n  " + line;
  return out;
#else
  (void)detail;
  return "";
#endif
}

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta) {
  MZ_CHECK(a.dim() == 2 || a.dim() == 3, "gemm: A must be 2-D or 3-D, got ", a.to_string());
  MZ_CHECK(b.dim() == 2 || b.dim() == 3, "gemm: B must be 2-D or 3-D, got ", b.to_string());
  MZ_CHECK(c.dim() == a.dim(), "gemm: C ", c.to_string(), " must have A's rank ", a.to_string());
  MZ_CHECK(b.dim() <= a.dim(), "gemm: a 3-D B needs a 3-D A");
  const std::int64_t m = a.size(trans_a ? -1 : -2), k = a.size(trans_a ? -2 : -1);
  const std::int64_t kb = b.size(trans_b ? -1 : -2), n = b.size(trans_b ? -2 : -1);
  MZ_CHECK(k == kb, "gemm: inner dimensions differ: op(A) ", m, "x", k, ", op(B) ", kb, "x", n);
  MZ_CHECK(c.size(-2) == m && c.size(-1) == n, "gemm: C ", c.to_string(), " should be ", m, "x", n);
  if (a.dim() == 3) {
    MZ_CHECK(c.size(0) == a.size(0), "gemm: batch of C differs from A");
    if (b.dim() == 3) MZ_CHECK(b.size(0) == a.size(0), "gemm: batch of B differs from A");
  }
  MZ_CHECK(a.dtype() == b.dtype(), "gemm: A is ", dtype_name(a.dtype()), ", B is ", dtype_name(b.dtype()));
  MZ_CHECK(c.dtype() == a.dtype() || c.dtype() == DType::F32, "gemm: C must be fp32 or ", dtype_name(a.dtype()));
  MZ_CHECK(c.strides().back() == 1 || n == 1, "gemm: C needs a unit stride in its last dimension");
  MZ_CHECK(a.device_ptr() == b.device_ptr() && a.device_ptr() == c.device_ptr(),
           "gemm: A, B and C must be on one device");
  // cuBLAS's workspace, ours rather than its own cudaMalloc: counted, planned
  // (a meta device standing in for CUDA allocates it too) and in the arena.
  const Tensor ws = c.numel() > 0 && k > 0 ? kernels::allocate_gpu_scratch(
                                                 c, kernels::gpu_scratch::kCublasWorkspaceBytes, "cuBLAS workspace")
                                           : Tensor();
  switch (a.device().kind()) {
    case DeviceKind::Meta: {  // dry run: shapes checked, nothing computed, the work logged for the time model
      auto& meta = static_cast<MetaDevice&>(a.device());
      meta.compute_log().add_gemm({m, n, k, a.dim() == 3 ? a.size(0) : 1, a.dtype()});
      // Standing in for the CPU: the CPU kernel's own allocations, by the CPU
      // kernel's code (without storage it allocates and computes nothing).
      if (meta.kernels() == DeviceKind::CPU) cpu::gemm(a, trans_a, b, trans_b, c, alpha, beta);
      return;
    }
    case DeviceKind::CPU:
      cpu::gemm(a, trans_a, b, trans_b, c, alpha, beta);
      return;
    case DeviceKind::CUDA:
#ifdef MEGAZERO_WITH_CUDA
      cuda::gemm(a, trans_a, b, trans_b, c, alpha, beta, kernels::scratch_of(ws));
      return;
#else
      break;
#endif
  }
  MZ_CHECK(false, "gemm: no kernel for device ", a.device().name());
}

}  // namespace megazero
