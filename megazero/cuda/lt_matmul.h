// cuBLASLt GEMMs with an epilogue, behind kernels/linear_epilogues.h: the
// linear layers' bias add, the MLP's bias + GeLU (keeping GeLU's input for the
// backward), the GeLU backward with its bias gradient, and a weight gradient
// with its bias gradient, each inside the GEMM's kernel instead of an
// element-wise pass over its output.
//
// Split so a machine without a GPU checks what it can: LtMatmul is plain data
// (the problem as cuBLASLt sees it, column-major), made from our row-major
// tensors by the describe_* functions, which CPU tests interpret by cuBLASLt's
// documented semantics against the kernels' definitions; lt_descriptors_ok()
// has cuBLASLt itself create and set every descriptor (host objects, no
// handle); only the heuristics and the matmul need a GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "megazero/core/dtype.h"
#include "megazero/kernels/gpu_scratch.h"

namespace megazero::cuda {

enum class LtEpilogue {
  None,         // D = alpha op(A) op(B) + beta D: a plain GEMM (gemm_cuda.cpp's, when autotuned)
  Bias,         // D += bias[i] (bias: [m], input)
  GeluAuxBias,  // aux = D + bias[i]; D = gelu(aux) (tanh approximation; aux: output)
  DGeluBGrad,   // D = D * gelu'(aux); bias[i] = sum_j D[i, j] (aux: input; bias: [m], output)
  BGradB,       // bias[j] = sum_l op(B)[l, j], the sum over k (bias: [n], output)
};
const char* lt_epilogue_name(LtEpilogue e);

// One cuBLASLt matmul, column-major as cuBLAS counts:
//   D[m x n] = alpha * op(A)[m x k] * op(B)[k x n] + beta * D, then the epilogue.
// A is stored [m x k] (or [k x m] when trans_a) with leading dimension lda; B
// likewise; D (also C: beta accumulates in place) [m x n] with ldd; aux (the
// GeLU input) [m x n] with aux_ld.
struct LtMatmul {
  LtEpilogue epilogue = LtEpilogue::Bias;
  std::int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  std::int64_t lda = 0, ldb = 0, ldd = 0, aux_ld = 0;
  DType in = DType::F32, out = DType::F32;  // A and B; C, D, aux and the bias (gradient)
  float alpha = 1.0f, beta = 0.0f;
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  void* bias = nullptr;
  void* aux = nullptr;
};

// Our row-major operands (x [N, in], w [out, in], y/pre/dy [N, out], dx/dpre
// [N, in], dw [out, in]), each a pointer and its row stride in elements. A
// row-major matrix is the column-major storage of its transpose, so each
// problem is computed transposed (D = Y^T etc.) and nothing is copied.
struct RowMajor {
  const void* data;
  std::int64_t row_stride;
};
// y = x w^T + bias (Bias), or pre = x w^T + bias and y = gelu(pre) (GeluAuxBias).
LtMatmul describe_linear_forward(LtEpilogue e, std::int64_t rows, std::int64_t in, std::int64_t out, RowMajor x,
                                 RowMajor w, const void* bias, RowMajor y, RowMajor pre, DType in_type, DType out_type);
// dpre = (dy w) * gelu'(pre), bias_grad = column sums of dpre (dy [N, out], w [out, in], pre/dpre [N, in]).
LtMatmul describe_linear_dgelu(std::int64_t rows, std::int64_t in, std::int64_t out, RowMajor dy, RowMajor w,
                               RowMajor pre, RowMajor dpre, void* bias_grad, DType type);
// dw += dy^T x, bias_grad = column sums of dy (dy [N, out], x [N, in], dw [out, in]).
LtMatmul describe_linear_wgrad(std::int64_t rows, std::int64_t in, std::int64_t out, RowMajor dy, RowMajor x,
                               RowMajor dw, void* bias_grad, DType type);

// Whether cuBLASLt can be asked at all: bf16/fp16/fp32 operands, an aux
// leading dimension it accepts (a multiple of 8), no empty dimension. The
// heuristics decide the rest.
bool lt_eligible(const LtMatmul& p);

// cuBLASLt creates the matmul descriptor with every attribute of `p` set, the
// four matrix layouts and the preference (no handle, no GPU needed). Empty on
// success, else the call and cuBLASLt's status.
std::string lt_descriptors_error(const LtMatmul& p, std::size_t workspace_bytes);

// Runs `p` on `stream` (of GPU `device`) with `ws` as cuBLASLt's workspace when cuBLASLt has an
// algorithm for it (the heuristics' first, cached per problem and pointer
// alignment); returns false without touching memory when it has none, so the
// caller computes the same by other kernels. Throws on a failing launch.
//
// With autotuning on (set_lt_autotune, which megazero::set_gemm_autotune sets), a problem's
// first call times up to kAutotuneCandidates of the heuristics' algorithms on
// its own operands and keeps the fastest: each runs into a scratch D (an
// accumulating problem reads C from p.d and never writes it), so the call then
// computes its result once, with the chosen algorithm. Epilogue outputs other
// than D (aux, the bias gradient) are written by the timing runs too and
// overwritten by the call. The stream is drained for the timing.
bool lt_matmul(const LtMatmul& p, kernels::GpuScratch ws, cudaStream_t stream, int device);
constexpr int kAutotuneCandidates = 8;
void set_lt_autotune(bool on);
bool lt_autotune();

// Which of `ms` (a candidate's milliseconds; a negative value: it failed) is
// the fastest, the earliest of equal ones; 0 when none ran (the heuristics'
// first, as without autotuning).
int fastest_candidate(const std::vector<double>& ms);

// What this process has run: problems cuBLASLt took, problems it refused (one
// line each: the epilogue, shape and dtypes), for the trainer's log; and what
// autotuning chose.
struct LtReport {
  std::size_t fused_problems = 0;                      // with an epilogue
  std::string refused;                                 // "" when none
  std::size_t autotuned = 0;                           // problems timed
  std::size_t autotune_changed = 0;                    // ... that kept another algorithm than the heuristics' first
  double autotune_first_ms = 0, autotune_best_ms = 0;  // one call of each timed problem, summed
  std::vector<std::string> autotune_lines;  // one a timed problem: its shape, the first's and the kept one's time
};
LtReport lt_report();

}  // namespace megazero::cuda
