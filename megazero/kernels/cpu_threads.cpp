#include "megazero/kernels/cpu_threads.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>

#include "megazero/core/error.h"
#include "megazero/kernels/openblas_core.h"

extern "C" void openblas_set_num_threads(int num_threads);  // from OpenBLAS

namespace megazero {

std::string cpu_math_threads_variable() {
  for (const char* var : {"MEGAZERO_NUM_THREADS", "OMP_NUM_THREADS"})
    if (const char* v = std::getenv(var); v && std::atoi(v) > 0) return var;
  return "";
}

int cpu_cores() { return omp_get_num_procs(); }

namespace {
int initial_threads() {
  const std::string var = cpu_math_threads_variable();
  return var.empty() ? omp_get_num_procs() : std::atoi(std::getenv(var.c_str()));
}
int g_threads = 0;  // process-wide by nature: OpenMP's pool is process-wide
}  // namespace

void set_cpu_math_threads(int n) {
  MZ_REQUIRE(n > 0, "math threads must be positive, got ", n, " (set MEGAZERO_NUM_THREADS to 1 or more)");
  openblas_core();  // OpenBLAS's kernels chosen before its first call
  g_threads = n;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int cpu_math_threads() {
  if (g_threads == 0) set_cpu_math_threads(initial_threads());
  return g_threads;
}

void parallel_ranges(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& body) {
  if (n <= 0) return;
  const std::int64_t parts = n < (std::int64_t{1} << 14) ? 1 : std::min<std::int64_t>(cpu_math_threads(), n);
#pragma omp parallel for num_threads(static_cast <int>(parts)) schedule(static) if (parts > 1)
  for (std::int64_t t = 0; t < parts; ++t) body(n * t / parts, n * (t + 1) / parts);
}

}  // namespace megazero
