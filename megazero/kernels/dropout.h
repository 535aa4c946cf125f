// Dropout keyed by global coordinates, and Megatron's fused bias-dropout-add.
// Dtype rules: conventions.h (the keep mask does not depend on the dtype).
#pragma once

#include <cstdint>

#include "megazero/core/tensor.h"
#include "megazero/kernels/conventions.h"
#include "megazero/kernels/rng.h"

namespace megazero::kernels {

// How a tensor's elements map to the global indices its dropout mask is drawn
// at, so that every TP/DP layout (and recompute) draws the same mask.
// Locally the tensor is [samples, groups, matrix_rows, matrix_cols]
// (row-major, contiguous): one [matrix_rows, matrix_cols] matrix per
// (sample, group). Element (a, b, c, d) has the global index
//   ((sample_offset + a) * global_groups + (group_offset + b)) * matrix_rows * matrix_cols
//     + c * matrix_cols + d,
// where sample_offset and group_offset are this rank's offsets in the samples
// and groups dimensions and global_groups is the number of groups of all ranks.
// Attention probabilities: samples (sample_offset = the global index of this
// rank's first sample), groups = this TP rank's heads (group_offset = its first
// head, global_groups = all heads), matrix_rows = matrix_cols = seq.
// Hidden states: samples, groups = 1, matrix_rows = seq, matrix_cols = hidden.
struct DropoutLayout {
  std::int64_t samples = 1, groups = 1, matrix_rows = 1, matrix_cols = 1;
  std::int64_t sample_offset = 0, group_offset = 0, global_groups = 1;
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

// A dropout backward to run on a gradient another kernel has just written,
// in that kernel's pass where the device can (layernorm_backward_dropout):
// *out = dropout_backward(that gradient) for (p, key, layout), and *dbias,
// when given, += *out's column sums as dropout_backward_bias_grad's. A
// transformer layer's residual stream: the gradient LayerNorm's backward
// writes is the one the sub-block below it drops out.
struct DropoutBackwardOf {
  double p = 0;
  RngKey key;
  DropoutLayout layout;
  Tensor* out = nullptr;    // the dropout's input gradient: not dy's storage
  Tensor* dbias = nullptr;  // the gradient of a bias added before the dropout, or none
};
// The unfused form: dropout_backward_bias_grad(dy, ...) with a bias, else
// dropout_backward (a copy at p == 0).
void dropout_backward_of(const Tensor& dy, const DropoutBackwardOf& d);

// A bias-dropout-add whose output another kernel reads next, done in that
// kernel's pass where the device can (bias_dropout_add_layernorm):
// *out = residual + dropout(y + bias), as bias_dropout_add.
struct BiasDropoutAddOf {
  const Tensor* bias = nullptr;
  const Tensor* residual = nullptr;
  double p = 0;
  RngKey key;
  DropoutLayout layout;
  Tensor* out = nullptr;  // may be y's or the residual's storage
};

// Megatron's fused bias-dropout-add, the end of each sub-block:
//   out = residual + dropout(y + bias)   (bias [cols] along the last dimension)
// with dropout_forward's mask for the same key and layout, computed in the
// compute type and rounded once. out may alias y or residual. Its backward is
// dropout_backward (d residual = d out; d y = d bias-input = dropout_backward(d out)).
void bias_dropout_add(const Tensor& y, const Tensor& bias, const Tensor& residual, double p, const RngKey& key,
                      const DropoutLayout& layout, Tensor& out);

}  // namespace megazero::kernels
