// How many threads the CPU kernels use: OpenMP's pool (oneDNN, the kernels'
// own parallel loops) and OpenBLAS's. Here, with the kernels, not in core:
// core knows devices and memory, not the math libraries.
#pragma once

#include <string>

namespace megazero {

// Default: $MEGAZERO_NUM_THREADS, else $OMP_NUM_THREADS, else all cores.
void set_cpu_math_threads(int n);
int cpu_math_threads();
// The variable that sets the math threads ("MEGAZERO_NUM_THREADS" or
// "OMP_NUM_THREADS"), or "" when neither holds a positive count.
std::string cpu_math_threads_variable();
// Cores this process may use (OpenMP's count).
int cpu_cores();

}  // namespace megazero
