// SwiGLU (Shazeer 2020; Llama, Megatron's --swiglu): the MLP's first linear
// produces two halves per row, the gate and the "up" projection, side by side
// (Megatron's chunk(2, dim=-1) of this rank's output):
//   x: [rows, 2F] = [gate | up],  y: [rows, F] = silu(gate) * up,
//   silu(g) = g * sigmoid(g) = g / (1 + exp(-g)).
// Computed in the compute type (fp32 for 16-bit storage, fp64 for fp64), each
// result rounded once.
#pragma once

#include "megazero/core/tensor.h"

namespace megazero::kernels {

// y must not overlap x (refused: it is half x's size, so no in-place form exists).
void swiglu_forward(const Tensor& x, Tensor& y);
// dx: [rows, 2F], overwritten: d gate = dy * up * silu'(gate), d up = dy * silu(gate),
// silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g))). dx must not alias x
// (nor overlap dy; both refused).
void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx);

}  // namespace megazero::kernels
