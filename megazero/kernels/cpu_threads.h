// How many threads the CPU kernels use: OpenMP's pool (oneDNN, the kernels'
// own parallel loops) and OpenBLAS's. Here, with the kernels, not in core:
// core knows devices and memory, not the math libraries.
#pragma once

#include <cstdint>
#include <functional>
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

// body(begin, end) over [0, n) split into contiguous ranges, one per math
// thread (one range when n is small). For host work whose every element is a
// pure function of its index (weight initialisation), so its results do not
// depend on the thread count.
void parallel_ranges(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& body);

}  // namespace megazero
