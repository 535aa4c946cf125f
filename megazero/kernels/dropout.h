// Dropout keyed by global coordinates, and Megatron's fused bias-dropout-add.
// Dtype rules: conventions.h (the keep mask does not depend on the dtype).
#pragma once

#include <cstdint>

#include "megazero/core/tensor.h"
#include "megazero/kernels/conventions.h"
#include "megazero/kernels/rng.h"

namespace megazero::kernels {

// ---- dropout keyed by global coordinates ----
// A tensor is seen as [A, B, C, D] locally (rows-major, contiguous); element
// (a, b, c, d) has global index ((a0 + a) * GB + (b0 + b)) * C * D + c * D + d,
// where a0/b0 are this rank's offsets in dims A/B and GB the global size of B.
// For attention probabilities: A = samples (a0 = global sample offset),
// B = heads (b0 = first head of this TP rank, GB = all heads), C = D = seq.
// For hidden states: A = samples, B = 1, C = seq, D = hidden.
struct DropoutLayout {
  std::int64_t A = 1, B = 1, C = 1, D = 1;
  std::int64_t a0 = 0, b0 = 0, GB = 1;
};

// y = x * keep / (1 - p) with keep = uniform_at(key, global index) >= p,
// the same mask for every dtype. p == 0 copies. y may alias x.
void dropout_forward(const Tensor& x, double p, const RngKey& key, const DropoutLayout& layout, Tensor& y);
// dx = dy * keep / (1 - p), regenerating the same mask. dx may alias dy.
void dropout_backward(const Tensor& dy, double p, const RngKey& key, const DropoutLayout& layout, Tensor& dx);
// dropout_backward and the gradient of a bias added before the dropout (the
// bias of bias-dropout-add): dx as dropout_backward (may alias dy), and
// dbias[c] += sum_r dx[r, c] over dx's rounded values, dy taken as [rows,
// cols] by its last dimension. On a GPU one pass over dy; on the CPU the two
// kernels (p == 0: a copy and the sum).
void dropout_backward_bias_grad(const Tensor& dy, double p, const RngKey& key, const DropoutLayout& layout, Tensor& dx,
                                Tensor& dbias);

// Megatron's fused bias-dropout-add, the end of each sub-block:
//   out = residual + dropout(y + bias)   (bias [cols] along the last dimension)
// with dropout_forward's mask for the same key and layout, computed in the
// compute type and rounded once. out may alias y or residual. Its backward is
// dropout_backward (d residual = d out; d y = d bias-input = dropout_backward(d out)).
void bias_dropout_add(const Tensor& y, const Tensor& bias, const Tensor& residual, double p, const RngKey& key,
                      const DropoutLayout& layout, Tensor& out);

}  // namespace megazero::kernels
