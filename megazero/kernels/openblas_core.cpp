#include "megazero/kernels/openblas_core.h"

#include <dlfcn.h>

#include <cstdlib>

#include "megazero/core/error.h"

extern "C" char* openblas_get_corename(void);  // from OpenBLAS

namespace megazero {

std::string openblas_core_for(bool avx512, bool avx2_fma) {
  if (avx512) return "SkylakeX";
  if (avx2_fma) return "Haswell";
  return "";
}

namespace {

OpenBlasCore choose_core() {
  OpenBlasCore c;
  c.loaded = c.used = openblas_get_corename();
  if (c.loaded != "Prescott") return c;
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const std::string want = openblas_core_for(avx512, avx2_fma);
  if (want.empty()) return c;  // an SSE3-class CPU: Prescott is right
  if (const char* forced = std::getenv("OPENBLAS_CORETYPE")) {
    c.note = detail::concat("OPENBLAS_CORETYPE=", forced, " runs OpenBLAS's Prescott (SSE3) kernels as asked; ",
                            "this CPU takes its ", want, " ones (unset the variable for them)");
    return c;
  }
  // OpenBLAS's DYNAMIC_ARCH entry points: the active kernel table and the
  // initialiser that fills it (it returns early while the table is set).
  // Absent from a build for one fixed CPU, which has nothing to re-select.
  auto** table = static_cast<void**>(dlsym(RTLD_DEFAULT, "gotoblas"));
  auto* init = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
  if (!table || !init) {
    c.note =
        "OpenBLAS fell back to its Prescott (SSE3) kernels on this CPU and is not a DYNAMIC_ARCH build; set "
        "OPENBLAS_CORETYPE or install an OpenBLAS built for this CPU";
    return c;
  }
  setenv("OPENBLAS_CORETYPE", want.c_str(), 1);
  *table = nullptr;
  init();
  unsetenv("OPENBLAS_CORETYPE");
  c.used = openblas_get_corename();
  c.note = c.used == want ? detail::concat("OpenBLAS fell back to its Prescott (SSE3) kernels on this CPU; its ", want,
                                           " kernels run instead (OPENBLAS_CORETYPE chooses)")
                          : detail::concat("OpenBLAS fell back to its Prescott (SSE3) kernels on this CPU and ",
                                           "did not take ", want, "; set OPENBLAS_CORETYPE");
  return c;
}

}  // namespace

const OpenBlasCore& openblas_core() {
  static const OpenBlasCore core = choose_core();
  return core;
}

}  // namespace megazero
