// The rotary embedding's inverse frequency of pair i of a head of size d, the
// one formula the CPU kernel (rope.cpp) and the CUDA kernel
// (cuda/rope_kernels.cuh) share: base^(-2i/d), in double; with Llama 3's rope
// scaling (Megatron's --use-rope-scaling --rope-scaling-factor, Hugging
// Face's rope_type llama3) the frequencies whose wavelength 2 pi / f exceeds
// the original context of 8192 positions are divided by the factor, those
// below 8192 / 4 are kept, and those between are blended,
//   s = (8192 / wavelength - 1) / (4 - 1),  f' = (1 - s) f / factor + s f,
// with Megatron's fixed low / high frequency factors 1 and 4.
#pragma once

#ifdef __CUDACC__
#define MZ_ROPE_HD __host__ __device__ __forceinline__
#else
#include <cmath>
#define MZ_ROPE_HD inline
#endif

namespace megazero::kernels {

inline constexpr double kLlama3LowFreqFactor = 1.0;
inline constexpr double kLlama3HighFreqFactor = 4.0;
inline constexpr double kLlama3OriginalPositions = 8192.0;

// llama3_factor 0: no scaling (the plain frequency, bit for bit).
MZ_ROPE_HD double rope_inv_freq(double base, long long i, long long d, double llama3_factor) {
  using namespace std;
  const double f = pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(d));
  if (llama3_factor <= 0) return f;
  const double wavelength = 2.0 * 3.141592653589793 / f;
  if (wavelength < kLlama3OriginalPositions / kLlama3HighFreqFactor) return f;  // high frequencies: kept
  if (wavelength > kLlama3OriginalPositions / kLlama3LowFreqFactor) return f / llama3_factor;
  const double s =
      (kLlama3OriginalPositions / wavelength - kLlama3LowFreqFactor) / (kLlama3HighFreqFactor - kLlama3LowFreqFactor);
  return (1.0 - s) * f / llama3_factor + s * f;
}

}  // namespace megazero::kernels
