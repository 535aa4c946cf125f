// GeLU, bias and element-wise kernels: the MLP's activation, Megatron's
// bias-GeLU fusion, bias add and its gradient (a column sum), add, axpy and
// scale. Dtype rules, rows/cols and accumulate vs overwrite: conventions.h.
#pragma once

#include "megazero/core/tensor.h"
#include "megazero/kernels/conventions.h"

namespace megazero::kernels {

// ---- GeLU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) ----
void gelu_forward(const Tensor& x, Tensor& y);                      // y may alias x
void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx);  // dx may alias dy
// Megatron's bias-GeLU fusion, the MLP's first linear without its own bias add:
// out = gelu(y + bias) with y + bias kept in the compute type (fp32 for 16-bit
// storage; for fp32 this is add_bias then gelu_forward bit for bit). bias is
// [cols] along the last dimension; out may alias y.
void bias_gelu_forward(const Tensor& y, const Tensor& bias, Tensor& out);
// Its backward: dx = dy * gelu'(y + bias), rounded to storage (dx may alias
// dy), and dbias += sum_r dx[r, :] of those rounded values — gelu_backward then
// bias_grad, in one pass over dy on a GPU. bias undefined: y holds the bias
// already (fc1's GEMM epilogue wrote pre = x W + b), dx = dy * gelu'(y).
void bias_gelu_backward(const Tensor& dy, const Tensor& y, const Tensor& bias, Tensor& dx, Tensor& dbias);

// ---- squared ReLU (Megatron's --squared-relu, Primer/Nemotron): relu(x)^2 ----
void squared_relu_forward(const Tensor& x, Tensor& y);                      // y may alias x
void squared_relu_backward(const Tensor& dy, const Tensor& x, Tensor& dx);  // dx = dy * 2 relu(x); may alias dy

// ---- column sums, bias and element-wise ----
// sums[c] += sum_r x[r, c]: x taken as [rows, cols] by its last dimension,
// sums [cols] an accumulator (storage dtype, or fp32 for 16-bit x); each column
// summed in double in row order and rounded once. A [N, 1] view sums N values
// into one (the training step's loss sum).
void column_sums(const Tensor& x, Tensor& sums);
void add_bias(Tensor& y, const Tensor& bias);             // y[r, c] += bias[c]
void bias_grad(const Tensor& dy, Tensor& dbias);          // add_bias's backward: column_sums of dy into dbias
void add(const Tensor& a, const Tensor& b, Tensor& out);  // out = a + b (out may alias a or b)
void axpy(double alpha, const Tensor& x, Tensor& y);      // y += alpha * x
void scale(Tensor& x, double alpha);                      // x *= alpha

}  // namespace megazero::kernels
