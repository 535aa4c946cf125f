// Matrix multiply, the one kernel everything heavy goes through:
//   C = alpha * op(A) @ op(B) + beta * C,  op(X) = X or X^T (last two dims).
// A: (M, K) or (batch, M, K); B: (K, N) or (batch, K, N) — a 2-D B is shared by
// every batch (a linear layer's weight); C: (M, N) or (batch, M, N).
// Inputs may be strided views (transposes, narrows); C must have a unit stride
// in its last dimension.
//
// dtypes: A and B alike, fp32, bf16 or fp16 with fp32 accumulation; C fp32 or
// the input dtype; fp64 (reference paths in tests) with an fp64 C.
// CPU: OpenBLAS sgemm/dgemm for fp32/fp64; oneDNN matmul for bf16/fp16 (AMX /
// AVX512-BF16 where the CPU has them). Where the CPU has no native 16-bit path,
// inputs are widened to fp32 first — exact, since every bf16/fp16 value is an
// fp32 value — so results do not depend on the CPU.
#pragma once

#include <string>

#include "megazero/core/tensor.h"
#include "megazero/kernels/gpu_scratch.h"

namespace megazero {

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha = 1.0f,
          float beta = 0.0f);

// GEMM autotuning on the GPU (--gemm-autotune, TunableOp-like): every 2-D
// GEMM goes through cuBLASLt, and each new problem (shape, layouts, dtypes,
// pointer alignment) times the heuristics' candidate algorithms once on its
// own operands and keeps the fastest for the process (cuda/lt_matmul.h). Off by
// default: the choice follows the timings, so two runs may keep different
// algorithms and differ in the last bits (hence refused with
// --deterministic-mode). Batched GEMMs and the CPU are untouched. Process-wide.
void set_gemm_autotune(bool on);
bool gemm_autotune();
// One line for the log: how many problems were timed, how many kept another
// algorithm than the heuristics' first, and one call of each summed before
// and after; "" when nothing was timed. With `detail`, a line a problem follows.
std::string gemm_autotune_report(bool detail = false);

// How the CPU backend computes (A dtype) -> (C dtype): "openblas" (fp32, fp64),
// "onednn" (native 16-bit) or "fp32-widened-openblas" (16-bit widened). For reports.
std::string cpu_gemm_path(DType in, DType out);

namespace cpu {
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta);
}
#ifdef MEGAZERO_WITH_CUDA
namespace cuda {
// ws: cuBLAS's workspace (gpu_scratch::kCublasWorkspaceBytes), allocated by gemm().
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta,
          kernels::GpuScratch ws);
}  // namespace cuda
#endif

}  // namespace megazero
