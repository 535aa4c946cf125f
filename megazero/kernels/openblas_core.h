// Which of OpenBLAS's kernel sets the fp32/fp64 GEMMs run (kernels/gemm_cpu).
//
// Debian 12's OpenBLAS 0.3.21 is built DYNAMIC_ARCH: at load it picks its
// kernels by the CPU's model number, and on an Intel model it does not know
// it falls back to its Prescott (SSE3) kernels whatever the CPU can do
// (OpenBLAS issue #4267, fixed in 0.3.25). An Emerald Rapids Xeon (family 6,
// model 0xCF) is such a CPU: fp32 GEMMs ran at ~35 GFLOP/s on 2 cores there
// instead of ~250 with the AVX-512 kernels (docs/PERFORMANCE.md).
#pragma once

#include <string>

namespace megazero {

struct OpenBlasCore {
  std::string loaded;  // what OpenBLAS chose at load ("Prescott", "SkylakeX", ...)
  std::string used;    // what runs now
  // Why `used` differs from `loaded` or why it could not, for the log ("" when
  // OpenBLAS's own choice stands without remark).
  std::string note;
};

// Once per process, before the first BLAS call (gemm_cpu and
// set_cpu_math_threads call it): when OpenBLAS fell back to Prescott, the
// user left OPENBLAS_CORETYPE unset, and the CPU has AVX-512 (F, BW, DQ, VL)
// or AVX2 with FMA, OpenBLAS's own dynamic-arch initialiser is run again
// with OPENBLAS_CORETYPE=SkylakeX or Haswell, as if the user had set it
// (the variable is then unset again). A set OPENBLAS_CORETYPE is always
// obeyed. Thread-safe; later calls return the first call's answer.
const OpenBlasCore& openblas_core();

// The kernel set OpenBLAS would pick for a CPU with these features once it
// falls back to Prescott, or "" to leave it: SkylakeX for AVX-512 F/BW/DQ/VL,
// Haswell for AVX2 with FMA.
std::string openblas_core_for(bool avx512, bool avx2_fma);

}  // namespace megazero
