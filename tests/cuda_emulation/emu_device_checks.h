// What the launcher-emulation tests share (tests/cuda_emulation/README.md,
// "The launchers, whole"): megazero tensors moved into and out of the
// emulated device memory of shim/emu_host.h, exact-size scratch, the launches
// a call made, and the comparisons against the CPU kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "emu_checks.h"
#include "emu_host.h"
#include "megazero/kernels/gpu_scratch.h"

namespace emu_device_checks {

using namespace emu_checks;

// A tensor's bytes in emulated device memory, `shift` bytes past a 256-byte
// boundary (an element's size: an operand the 16-byte paths must refuse).
struct OnDevice {
  std::unique_ptr<emu::DeviceBuffer<unsigned char>> buf;
  std::size_t shift = 0;
  void* ptr() const { return buf->get() + shift; }
};

inline OnDevice put(const Tensor& t, std::size_t shift = 0) {
  OnDevice d{std::make_unique<emu::DeviceBuffer<unsigned char>>(t.nbytes() + shift), shift};
  std::vector<unsigned char> bytes(t.nbytes() + shift, 0);
  std::memcpy(bytes.data() + shift, t.data(), t.nbytes());
  d.buf->upload(bytes);
  return d;
}

// `like`'s shape and dtype with every byte 0xff (NaN): an output.
inline OnDevice poisoned(const Tensor& like, std::size_t shift = 0) {
  OnDevice d{std::make_unique<emu::DeviceBuffer<unsigned char>>(like.nbytes() + shift), shift};
  d.buf->fill_bytes(0xff);
  return d;
}

inline Tensor get(const OnDevice& d, const Tensor& like) {
  Tensor t = like.clone(MemoryCategory::Other);
  const auto bytes = d.buf->download();
  std::memcpy(t.data(), bytes.data() + d.shift, t.nbytes());
  return t;
}

// Scratch of exactly `bytes`, filled with 0xff and ending at the guard page;
// none (as allocate_gpu_scratch gives for 0 bytes) when the call needs none.
struct Scratch {
  std::unique_ptr<emu::DeviceBuffer<unsigned char>> buf;
  megazero::kernels::GpuScratch ws() const {
    return buf ? megazero::kernels::GpuScratch{buf->get(), buf->size()} : megazero::kernels::GpuScratch{};
  }
};
inline Scratch scratch(std::size_t bytes) {
  if (bytes == 0) return {};
  auto b = std::make_unique<emu::DeviceBuffer<unsigned char>>(bytes, 8);
  b->fill_bytes(0xff);
  return {std::move(b)};
}

// One rounding of a dtype, fp64's included.
inline double ulp(DType t) { return t == DType::F64 ? 0x1p-50 : ulp_of(t); }

// Element by element, the same bytes (NaN poison included); names those that differ.
inline void expect_bits(const Tensor& got, const Tensor& want, const char* what) {
  const std::size_t e = dtype_size(want.dtype());
  const auto* g = static_cast<const unsigned char*>(got.data());
  const auto* w = static_cast<const unsigned char*>(want.data());
  if (std::memcmp(g, w, want.nbytes()) == 0) return;
  const auto gv = values(got), wv = values(want);
  for (std::size_t i = 0; i < gv.size(); ++i) check(std::memcmp(g + i * e, w + i * e, e) == 0, what, gv[i], wv[i], i);
}

// |got - want| <= ulp(acc) |want| + (rows + 8) 2^-24 mag[c]: a sum over rows
// in fp32 pieces, rounded once into the accumulator.
inline void expect_sums(const Tensor& got, const Tensor& want, const std::vector<double>& mag, i64 rows,
                        const char* what) {
  const auto g = values(got), w = values(want);
  const double steps = static_cast<double>(rows + 8) * 0x1p-24;
  for (std::size_t c = 0; c < g.size(); ++c)
    check(std::fabs(g[c] - w[c]) <= ulp(got.dtype()) * std::fabs(w[c]) + steps * mag[c], what, g[c], w[c], c);
}

// The largest |element|.
inline double largest(const Tensor& t) {
  double m = 0;
  for (const double v : values(t)) m = std::max(m, std::fabs(v));
  return m;
}

// Within two storage roundings plus 1e-5 (fp64: 1e-12) of the largest |want|.
inline void expect_rows(const Tensor& got, const Tensor& want, const char* what) {
  const double slack = want.dtype() == DType::F64 ? 1e-12 : 1e-5;
  expect_close(values(got), values(want), 2 * ulp(want.dtype()), slack * largest(want), what);
}

// How many launches one call made (a refused one throws in the launcher's
// check_launch).
struct Launches {
  long before = emu::host.launches;
  void expect(long want, const char* what) const {
    check(emu::host.launches - before == want, what, static_cast<double>(emu::host.launches - before),
          static_cast<double>(want), 0);
  }
};

// A column-summing launcher call (`call` launches into fresh outputs and
// returns them) run twice: with the finish folded into its kernel (the
// default) and as MEGAZERO_COLUMN_FINISH=kernel has it (the finish as a launch of
// its own). The outputs must agree bit for bit; where the launcher `folds`
// (it sums chunks of rows), the folded call makes one launch fewer, else the
// two calls launch alike.
template <typename Call>
void expect_fold_agrees(Call call, bool folds, const char* what) {
  const Launches a;
  const std::vector<Tensor> folded = call();
  const long n_folded = emu::host.launches - a.before;
  megazero::kernels::gpu_scratch::set_column_finish_folded(false);
  const Launches b;
  const std::vector<Tensor> apart = call();
  const long n_apart = emu::host.launches - b.before;
  megazero::kernels::gpu_scratch::set_column_finish_folded(true);
  check(n_apart == n_folded + (folds ? 1 : 0), what, static_cast<double>(n_folded), static_cast<double>(n_apart), 0);
  for (std::size_t i = 0; i < folded.size(); ++i) expect_bits(folded[i], apart[i], what);
}

// The launches one call made, with their configurations, for launchers whose
// grid-stride kernels give the same results on any grid.
struct LaunchLog {
  std::vector<emu::LaunchConfig> launches;
  LaunchLog() { emu::host.log = &launches; }
  ~LaunchLog() { emu::host.log = nullptr; }
  LaunchLog(const LaunchLog&) = delete;
  LaunchLog& operator=(const LaunchLog&) = delete;
};

// A launcher test's main: the fault report on, a device of 3 SMs (resident
// grids of a few blocks, so grid-stride loops take turns), then `body`;
// exit code 1 on any failed check or exception (a refused launch throws in
// the launcher's check_launch).
template <typename Body>
int run_launcher_test(Body&& body) {
  emu::report_faults();
  emu::device().sms = 3;
  try {
    body();
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf("%ld emulated launches, %ld refused\n", emu::host.launches, emu::host.refused);
  if (failures) {
    std::printf("%d failures\n", failures);
    return 1;
  }
  std::printf("every launcher matches its reference\n");
  return 0;
}

}  // namespace emu_device_checks
