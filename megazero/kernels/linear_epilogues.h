// A linear layer's GEMM with the pass that follows it fused in (--gemm-epilogues):
// the bias add, the MLP's bias + GeLU, the GeLU backward with its bias
// gradient, and the weight gradient with its bias gradient. Each is defined
// by the plain kernels it replaces, which is what a host device computes:
//
//   linear_bias_forward       y = x w^T;        add_bias(y, bias)
//   linear_bias_gelu_forward  pre = x w^T;      add_bias(pre, bias); gelu_forward(pre, out)
//   linear_dgelu_bias_grad    dpre = dy w;      gelu_backward(dpre, pre, dpre); bias_grad(dpre, dbias)
//   linear_weight_bias_grad   dw += dy^T x;     bias_grad(dy, dbias)
//
// x [N, in], w [out, in] (a linear layer's weight), y/pre/out/dy [N, out] for
// the forward and [N, out] dy with [N, in] pre/dpre for the GeLU backward; all
// 2-D, contiguous, one dtype; dbias accumulates (+=) as bias_grad's does.
//
// On CUDA each is one cuBLASLt GEMM with an epilogue (megazero/cuda/lt_matmul.h)
// when cuBLASLt has a kernel for the problem, else the composition above. The
// epilogues round differently: the bias (and GeLU) act on the fp32 accumulator
// before its one rounding, GeLU's output comes from the unrounded input, and a
// bias gradient is cuBLASLt's sum rounded to the gradient's dtype before it is
// added to dbias (two roundings for 16-bit gradients where bias_grad has one).
// The GeLU is the tanh approximation in both.
#pragma once

#include <string>

#include "megazero/core/tensor.h"

namespace megazero::kernels {

void linear_bias_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y);
void linear_bias_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& pre, Tensor& out);
void linear_dgelu_bias_grad(const Tensor& dy, const Tensor& w, const Tensor& pre, Tensor& dpre, Tensor& dbias);
// beta_dw: 1 adds into dw (dw += dy^T x), 0 overwrites it (a gradient not yet
// written this backward: layers/parameter.h's take_grad_beta).
void linear_weight_bias_grad(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& dbias, float beta_dw = 1.0f);

// For the trainer's log: on `device`, how the epilogues run ("cuBLASLt: n
// problems fused" plus any cuBLASLt refused, computed unfused), or that they
// run as separate passes on a device without cuBLASLt.
std::string linear_epilogues_report(const Device& device);

}  // namespace megazero::kernels
