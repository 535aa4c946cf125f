// The exponentials of the CPU softmaxes (vocab-parallel cross-entropy, causal
// softmax, fused attention) and the GeLU's tanh in SIMD: glibc's libmvec
// vector expf and tanhf, chosen for
// the CPU at load time (AVX-512, AVX2 or SSE). The scalar std::exp loop these
// replace was 16% of the main job's step (the cross-entropy over 25k logits a
// token). glibc documents libmvec's expf to within 4 ulp (tests/
// test_vector_math measures 2 here), where the scalar expf is within 1. fp64
// stays on the scalar std::exp: it is the tests' reference arithmetic.
#pragma once

#include <cstdint>

namespace megazero::kernels {

// max over i < n of scale * x[i]; -inf when n == 0.
float scaled_max(const float* x, float scale, std::int64_t n);
double scaled_max(const double* x, double scale, std::int64_t n);

// y[i] = exp(scale * x[i] - shift) for i < n (y may be x); returns the sum of
// the y[i], accumulated in double.
double exp_scaled_shifted(const float* x, float scale, float shift, float* y, std::int64_t n);
double exp_scaled_shifted(const double* x, double scale, double shift, double* y, std::int64_t n);

// t[i] = tanh(u[i]) for i < n (t may be u). Every element goes through the
// same vector routine, the tail too (padded to a full block), so an element's
// tanh does not depend on where it sits: two loops over the same values in
// different runs (fused and unfused GeLU) get the same bits.
void tanh_f32(const float* u, float* t, std::int64_t n);

}  // namespace megazero::kernels
