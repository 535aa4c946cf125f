// The device kernels of SwiGLU (contract: megazero/kernels/swiglu.h;
// launchers: swiglu.cu). Kept apart, kernels only, so that tests/cuda_emulation
// runs them on the CPU as they are. Grid: x over column blocks of f, y over
// rows (grid-stride), so no thread divides an index.
#pragma once

#include <cstdint>

#include "megazero/cuda/kernel_common.cuh"

namespace megazero::cuda::detail_k {

// sigmoid(g) and silu(g) = g / (1 + exp(-g)) in the compute type C, the CPU
// kernel's formula (kernels/swiglu.cpp: silu_parts).
template <typename C>
__device__ __forceinline__ void swiglu_parts(C g, C& sig, C& silu) {
  const C d = C(1) + static_cast<C>(exp(-g));
  sig = C(1) / d;
  silu = g / d;
}

// x: [rows, 2f] = [gate | up]; y[r, c] = silu(gate) * up.
template <typename S>
__global__ void swiglu_forward_kernel(const S* x, S* y, i64 rows, i64 f) {
  using C = compute_t<S>;
  const i64 c = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= f) return;
  for (i64 r = blockIdx.y; r < rows; r += gridDim.y) {
    const S* gate = x + r * 2 * f;
    C sig, silu;
    swiglu_parts<C>(ld(gate[c]), sig, silu);
    y[r * f + c] = st<S>(silu * ld(gate[f + c]));
  }
}

// dx[r, c] = dy * up * silu'(gate), dx[r, f + c] = dy * silu(gate),
// silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g))).
template <typename S>
__global__ void swiglu_backward_kernel(const S* dy, const S* x, S* dx, i64 rows, i64 f) {
  using C = compute_t<S>;
  const i64 c = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= f) return;
  for (i64 r = blockIdx.y; r < rows; r += gridDim.y) {
    const S* gate = x + r * 2 * f;
    const C g = ld(gate[c]), u = ld(gate[f + c]), d = ld(dy[r * f + c]);
    C sig, silu;
    swiglu_parts<C>(g, sig, silu);
    dx[r * 2 * f + c] = st<S>(d * u * (sig * (C(1) + g * (C(1) - sig))));
    dx[r * 2 * f + f + c] = st<S>(d * silu);
  }
}

}  // namespace megazero::cuda::detail_k
