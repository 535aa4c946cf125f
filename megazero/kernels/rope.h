// Rotary position embedding (Su et al. 2021) in the rotate-half form used by
// Megatron-LM and Hugging Face's Llama: dimension i pairs with i + D/2.
// x: [N, S, D] contiguous (N = batch x heads, S = sequence, D = head size,
// even); row s is position p = first_position + s (0 in training; a key/value
// cache's next position when decoding), or, with `positions` (int64 [B*S] on
// x's device, N a multiple of B: block n belongs to sample n / (N/B)), p =
// positions[b*S + s] (--reset-position-ids: each document from 0,
// train/documents.h). For i < D/2, with
//   theta(p, i) = p * base^(-2i / D)   (inverse frequency and angle in double)
//   y[i]       = x[i] cos(theta) - x[i + D/2] sin(theta)
//   y[i + D/2] = x[i + D/2] cos(theta) + x[i] sin(theta)
// cos and sin are taken in double and rounded to the compute type (fp32 for
// fp32 and 16-bit storage, fp64 for fp64); the products are in the compute
// type, each result rounded once to storage.
// interleaved (Megatron's --rotary-interleaved; GPT-J's and Meta's original
// Llama layout): dimension 2i pairs with 2i + 1 instead, at the same angle
// theta(p, i): y[2i] = x[2i] cos - x[2i+1] sin, y[2i+1] = x[2i+1] cos + x[2i] sin.
#pragma once

#include "megazero/core/tensor.h"

namespace megazero::kernels {

// base must be finite and positive. y may alias x.
// position_scale (1 / --rotary-seq-len-interpolation-factor): theta = (p x
// position_scale) x base^(-2i/D); 1 leaves every bit as without it.
// llama3_factor (--use-rope-scaling's --rope-scaling-factor; 0: off): the
// inverse frequencies of Llama 3's rope scaling (rope_frequencies.h).
void rope_forward(const Tensor& x, double base, Tensor& y, std::int64_t first_position = 0,
                  const Tensor& positions = Tensor(), double position_scale = 1.0, bool interleaved = false,
                  double llama3_factor = 0);
// The adjoint (rotation by -theta): dx[i] = dy[i] cos + dy[i + D/2] sin,
// dx[i + D/2] = dy[i + D/2] cos - dy[i] sin. dx may alias dy.
void rope_backward(const Tensor& dy, double base, Tensor& dx, std::int64_t first_position = 0,
                   const Tensor& positions = Tensor(), double position_scale = 1.0, bool interleaved = false,
                   double llama3_factor = 0);

}  // namespace megazero::kernels
