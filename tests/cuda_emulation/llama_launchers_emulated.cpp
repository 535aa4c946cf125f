// The launchers of megazero/cuda/rmsnorm.cu, rope.cu and swiglu.cu, whole, on
// the CPU: the .cu files themselves, with each `kernel<<<...>>>(...)`
// rewritten by rewrite_launches.py into a checked emulated launch
// (shim/emu_host.h), called through their public headers (rmsnorm_cuda.h,
// rope_cuda.h, swiglu_cuda.h) with device memory that the host cannot touch
// outside a kernel and that ends at a guard page. What llama_kernels_emulated
// (the same kernels, launched by the test) cannot see is what this runs: the
// launcher's grid and block (a block a row and 128, 256 or 512 threads by
// width; RoPE's blocks over positions and chunks of the n heads, the chunk
// size, grid.y and 128 or 256 threads it derives from them; SwiGLU's column
// blocks), its dtype dispatch (fp64 included), RMSNorm's dgamma decision (one
// chunk of gpu_scratch::column_chunks' rows: one pass straight into dgamma;
// several: partial sums in the caller's scratch, allocated to the byte as
// kernels/rmsnorm.cpp sizes it, finished by the partial kernel's last blocks,
// or with MEGAZERO_COLUMN_FINISH=kernel by a finish pass: the same bits), its
// accumulator dispatch (fp32 or the 16-bit storage), the order of its passes
// (dgamma before dx, which may overwrite dy) and its early returns (no rows).
// Each result is compared with the CPU kernels of megazero/kernels on the
// same inputs:
// - rmsnorm_forward (y apart and y over x): y within one storage rounding
//   plus 1e-7 (fp64: 2^-50 relative), rstd within one fp32 rounding;
// - rmsnorm_backward (one chunk of rows and 2, 3 or 9; 1 and 9 column
//   blocks; fp32 and 16-bit accumulators; with and without the residual
//   gradient; dx apart and over dy; no rows): dx within one storage rounding
//   plus 1e-6 (fp64: 1e-12), dgamma within one accumulator rounding plus
//   (rows + 8) fp64 roundings of the column's sum of |term| (untouched with
//   no rows);
// - rope (forward and backward, in place and not, heads over two 256-pair
//   tiles, one pair, one position, chunks of 2 and 4 heads a block): bit for
//   bit;
// - swiglu_forward/backward (saturated gates; f of one column, part of a
//   column block, exactly one, two): within two storage roundings plus 1e-7
//   (y) and 1e-6 (dx), exp being another libm's (fp64: within 2^-49
//   relative).
// And the launches each call makes: one, or RMSNorm's backward two (dgamma's
// direct or partial pass, dx; three with the finish apart); a refused one throws in the
// launcher's check_launch. Not run, for time (each block of an emulated
// launch is a barrier of its 128-512 host threads): the grid caps that make
// blocks stride (RMSNorm's 2^20 rows, RoPE's 2^20 positions, SwiGLU's 65535
// rows), which the kernel test covers with the test's own grids.
// Exit code 1 on any failure.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "emu_checks.h"
#include "emu_device_checks.h"
#include "emu_host.h"
#include "megazero/cuda/rmsnorm_cuda.h"
#include "megazero/cuda/rope_cuda.h"
#include "megazero/cuda/swiglu_cuda.h"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/rmsnorm.h"
#include "megazero/kernels/rope.h"
#include "megazero/kernels/swiglu.h"

using namespace megazero;
using namespace emu_checks;
using namespace emu_device_checks;
namespace gs = megazero::kernels::gpu_scratch;

namespace {

// kernels/rmsnorm.cpp's dgamma_scratch_bytes (rmsnorm_cuda.h's contract):
// a row of doubles per chunk of rows when there is more than one.
std::size_t rmsnorm_scratch_bytes(i64 rows, i64 cols) {
  const auto ch = gs::column_chunks(rows, cols);
  return ch.used > 1 ? static_cast<std::size_t>(ch.used * cols) * sizeof(double) : 0;
}

DType stat_of(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }

// ------------------------------------------------------------ RMSNorm
void rmsnorm_forward(DType t, i64 rows, i64 cols, bool in_place, std::mt19937& rng) {
  const Tensor x = tensor_of({rows, cols}, randn(rows * cols, rng, 2.0), t),
               gamma = tensor_of({cols}, randn(cols, rng), t);
  Tensor y = Tensor::zeros(cpu(), {rows, cols}, t, MemoryCategory::Other);
  Tensor rstd = Tensor::zeros(cpu(), {rows}, stat_of(t), MemoryCategory::Other);
  kernels::rmsnorm_forward(x, gamma, 1e-5, y, rstd);

  const auto dx = put(x), dg = put(gamma), dy = poisoned(y), dr = poisoned(rstd);
  const Launches n;
  cuda::rmsnorm_forward(t, dx.ptr(), dg.ptr(), 1e-5, in_place ? dx.ptr() : dy.ptr(), dr.ptr(), rows, cols, nullptr);
  n.expect(1, "rmsnorm_forward: launches");
  // y = x * rstd * gamma: rstd may differ by an ulp (its sum's order, checked
  // below) and the product rounds twice, so two ulps (one failed on other data).
  expect_close(values(get(in_place ? dx : dy, y)), values(y), 2 * ulp(t), t == DType::F64 ? 0 : 1e-7,
               in_place ? "rmsnorm_forward y (over x)" : "rmsnorm_forward y");
  expect_close(values(get(dr, rstd)), values(rstd), t == DType::F64 ? 0x1p-50 : 0x1p-23, 0, "rmsnorm_forward rstd");
}

struct Backward {
  DType t;
  i64 rows, cols;
  DType acc;
  bool add, in_place;  // the residual gradient; dx over dy
};

void rmsnorm_backward(const Backward& c, std::mt19937& rng) {
  const i64 rows = c.rows, cols = c.cols;
  const Tensor x = tensor_of({rows, cols}, randn(rows * cols, rng, 2.0), c.t),
               gamma = tensor_of({cols}, randn(cols, rng), c.t);
  const Tensor dy = tensor_of({rows, cols}, randn(rows * cols, rng), c.t);
  const Tensor add = tensor_of({rows, cols}, randn(rows * cols, rng), c.t);
  const Tensor g0 = tensor_of({cols}, randn(cols, rng), c.acc);
  Tensor y = x.clone(MemoryCategory::Other), rstd = Tensor::zeros(cpu(), {rows}, stat_of(c.t), MemoryCategory::Other);
  kernels::rmsnorm_forward(x, gamma, 1e-5, y, rstd);
  Tensor dx = Tensor::zeros(cpu(), {rows, cols}, c.t, MemoryCategory::Other), dgamma = g0.clone(MemoryCategory::Other);
  kernels::rmsnorm_backward(dy, x, gamma, rstd, dx, dgamma, c.add ? &add : nullptr);
  // |dgamma0| + sum_r |dy x rstd|: the scale of each column's rounding.
  std::vector<double> mag = values(g0);
  for (auto& v : mag) v = std::fabs(v);
  const auto xs = values(x), ds = values(dy), rs = values(rstd);
  for (i64 r = 0; r < rows; ++r)
    for (i64 k = 0; k < cols; ++k) {
      const auto i = static_cast<std::size_t>(r * cols + k);
      mag[static_cast<std::size_t>(k)] += std::fabs(ds[i] * xs[i] * rs[static_cast<std::size_t>(r)]);
    }

  const auto ddy = put(dy), dxx = put(x), dg = put(gamma), dr = put(rstd), dadd = put(add), ddx = poisoned(dx),
             dgam = put(g0);
  const auto ws = scratch(rmsnorm_scratch_bytes(rows, cols));
  const bool chunked = gs::column_chunks(rows, cols).used > 1;
  const Launches n;
  cuda::rmsnorm_backward(c.t, ddy.ptr(), dxx.ptr(), dg.ptr(), dr.ptr(), c.in_place ? ddy.ptr() : ddx.ptr(), dgam.ptr(),
                         c.acc, c.add ? dadd.ptr() : nullptr, rows, cols, ws.ws(), nullptr);
  // dgamma: direct, or partial sums finished by the kernel's last blocks; then dx.
  n.expect(2, chunked ? "rmsnorm_backward: launches (partial with its finish, dx)"
                      : "rmsnorm_backward: launches (direct, dx)");
  const bool f64 = c.t == DType::F64;
  expect_close(values(get(c.in_place ? ddy : ddx, dx)), values(dx), ulp(c.t), f64 ? 1e-12 : 1e-6,
               c.in_place ? "rmsnorm_backward dx (over dy)" : "rmsnorm_backward dx");
  const auto g = values(get(dgam, dgamma)), w = values(dgamma);
  const double steps = static_cast<double>(rows + 8) * 0x1p-52;
  for (std::size_t k = 0; k < g.size(); ++k)
    check(std::fabs(g[k] - w[k]) <= ulp(c.acc) * std::fabs(w[k]) + steps * mag[k],
          chunked ? "rmsnorm_backward dgamma (chunks)" : "rmsnorm_backward dgamma (direct)", g[k], w[k], k);
  // The finish as a launch of its own (MEGAZERO_COLUMN_FINISH=kernel): the same bits.
  expect_fold_agrees(
      [&] {
        const auto fdy = put(dy), fdx = poisoned(dx), fg = put(g0);
        const auto fws = scratch(rmsnorm_scratch_bytes(rows, cols));
        cuda::rmsnorm_backward(c.t, fdy.ptr(), dxx.ptr(), dg.ptr(), dr.ptr(), c.in_place ? fdy.ptr() : fdx.ptr(),
                               fg.ptr(), c.acc, c.add ? dadd.ptr() : nullptr, rows, cols, fws.ws(), nullptr);
        return std::vector<Tensor>{get(c.in_place ? fdy : fdx, dx), get(fg, dgamma)};
      },
      chunked, "rmsnorm_backward: folded finish vs its own launch");
}

// No rows: the forward launches nothing; the backward adds nothing to dgamma
// (its one launch, the direct pass over zero rows) and launches no dx pass.
void rmsnorm_no_rows(DType t, DType acc, i64 cols, std::mt19937& rng) {
  const Tensor gamma = tensor_of({cols}, randn(cols, rng), t), g0 = tensor_of({cols}, randn(cols, rng), acc);
  const auto dg = put(gamma), dgam = put(g0), empty = poisoned(Tensor::empty(cpu(), {0}, t, MemoryCategory::Other));
  const Launches n;
  cuda::rmsnorm_forward(t, empty.ptr(), dg.ptr(), 1e-5, empty.ptr(), empty.ptr(), 0, cols, nullptr);
  n.expect(0, "rmsnorm_forward, no rows: launches");
  const Launches m;
  cuda::rmsnorm_backward(t, empty.ptr(), empty.ptr(), dg.ptr(), empty.ptr(), empty.ptr(), dgam.ptr(), acc, nullptr, 0,
                         cols, {}, nullptr);
  m.expect(1, "rmsnorm_backward, no rows: launches");
  expect_bits(get(dgam, g0), g0, "rmsnorm_backward, no rows: dgamma unchanged");
}

// ------------------------------------------------------------ RoPE
// The CPU's cos/sin/pow are the emulation's libm: the same bits.
void rope(DType t, i64 n, i64 seq, i64 d, bool backward, bool in_place, std::mt19937& rng, i64 first = 0,
          bool interleaved = false, double llama3 = 0) {
  const double base = 10000.0;
  const Tensor x = tensor_of({n, seq, d}, randn(n * seq * d, rng), t);
  Tensor y = x.clone(MemoryCategory::Other);
  if (backward)
    kernels::rope_backward(x, base, y, first, Tensor(), 1.0, interleaved, llama3);
  else
    kernels::rope_forward(x, base, y, first, Tensor(), 1.0, interleaved, llama3);
  const auto dx = put(x), dy = poisoned(y);
  const Launches l;
  cuda::rope(t, dx.ptr(), base, in_place ? dx.ptr() : dy.ptr(), n, seq, d, backward, nullptr, first, nullptr, 1, 1.0,
             interleaved, llama3);
  l.expect(1, "rope: launches");
  expect_bits(get(in_place ? dx : dy, y), y,
              backward ? (in_place ? "rope backward (in place)" : "rope backward")
                       : (in_place ? "rope forward (in place)" : "rope forward"));
}

// Per-token positions (--reset-position-ids): `samples` samples of `heads`
// blocks, each sample's documents restarting at 0 at its own places, so that
// a block mixing two samples' rows, or a sample's position read for another,
// shows.
void rope_positions(DType t, i64 samples, i64 heads, i64 seq, i64 d, bool backward, std::mt19937& rng) {
  const double base = 10000.0;
  const i64 n = samples * heads;
  std::vector<std::int64_t> pos(static_cast<std::size_t>(samples * seq));
  for (i64 b = 0; b < samples; ++b) {
    i64 start = 0;
    for (i64 s = 0; s < seq; ++s) {
      if (s > 0 && rng() % 4 == 0) start = s;                      // a document starts here
      pos[static_cast<std::size_t>(b * seq + s)] = s - start + b;  // + b: the samples' positions differ
    }
  }
  const Tensor positions = ids_of(pos);
  const Tensor x = tensor_of({n, seq, d}, randn(n * seq * d, rng), t);
  Tensor y = x.clone(MemoryCategory::Other);
  if (backward)
    kernels::rope_backward(x, base, y, 0, positions);
  else
    kernels::rope_forward(x, base, y, 0, positions);
  const auto dx = put(x), dy = poisoned(y), dpos = put(positions);
  const Launches l;
  cuda::rope(t, dx.ptr(), base, dy.ptr(), n, seq, d, backward, nullptr, 0, static_cast<const std::int64_t*>(dpos.ptr()),
             samples);
  l.expect(1, "rope with positions: launches");
  expect_bits(get(dy, y), y, backward ? "rope backward, per-token positions" : "rope forward, per-token positions");
}

// ------------------------------------------------------------ SwiGLU
void swiglu(DType t, i64 rows, i64 f, std::mt19937& rng) {
  auto xv = randn(rows * 2 * f, rng, 2.0);
  const double extreme[] = {-1000.0, 1000.0, -120.0, 120.0, -30.0, 30.0, 0.0, -1.2785};
  for (std::size_t k = 0; k < std::size(extreme) && k < xv.size(); ++k) xv[k * 7 % xv.size()] = extreme[k];
  const Tensor x = tensor_of({rows, 2 * f}, xv, t), dy = tensor_of({rows, f}, randn(rows * f, rng), t);
  Tensor y = Tensor::zeros(cpu(), {rows, f}, t, MemoryCategory::Other);
  Tensor dx = Tensor::zeros(cpu(), {rows, 2 * f}, t, MemoryCategory::Other);
  kernels::swiglu_forward(x, y);
  kernels::swiglu_backward(dy, x, dx);

  const auto dxx = put(x), ddy = put(dy), dout = poisoned(y), ddx = poisoned(dx);
  const bool f64 = t == DType::F64;
  const Launches n;
  cuda::swiglu_forward(t, dxx.ptr(), dout.ptr(), rows, f, nullptr);
  n.expect(1, "swiglu_forward: launches");
  expect_close(values(get(dout, y)), values(y), 2 * ulp(t), f64 ? 0 : 1e-7, "swiglu_forward y");
  const Launches m;
  cuda::swiglu_backward(t, ddy.ptr(), dxx.ptr(), ddx.ptr(), rows, f, nullptr);
  m.expect(1, "swiglu_backward: launches");
  expect_close(values(get(ddx, dx)), values(dx), 2 * ulp(t), f64 ? 0 : 1e-6, "swiglu_backward dx");
}

}  // namespace

int main() {
  return run_launcher_test([] {
    std::mt19937 rng(2026);

    for (const DType t : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
      // RMSNorm: 128 threads a row over fewer columns and over several turns,
      // 256 and 512 threads; y over x.
      rmsnorm_forward(t, 3, 33, false, rng);
      rmsnorm_forward(t, 4, 300, true, rng);
      rmsnorm_forward(t, 3, 512, false, rng);
      rmsnorm_forward(t, 2, 2049, true, rng);
      // dgamma's accumulators: fp32 and the storage type (fp64 for fp64).
      for (const DType acc : {DType::F32, t}) {
        if (acc == DType::F32 && t == DType::F64) continue;
        if (acc == t && t == DType::F32) continue;
        rmsnorm_backward({t, 5, 70, acc, true, false}, rng);  // one chunk: straight into dgamma
        rmsnorm_backward({t, 33, 70, acc, true, true}, rng);  // 2 chunks (17 and 16 rows), dx over dy
        rmsnorm_no_rows(t, acc, 70, rng);
      }
      rmsnorm_backward({t, 2, 2049, t == DType::F64 ? t : DType::F32, false, true},
                       rng);  // 9 column blocks, 512 threads
      // RoPE: heads of 260 pairs (two tiles), one head a block, 256 threads;
      // one position, one pair.
      for (const bool backward : {false, true}) {
        rope(t, 3, 9, 520, backward, backward, rng);
        rope(t, 2, 1, 2, backward, !backward, rng);
        // One row at position 1023 (a key/value cache's decode), from a generator
        // of its own: the data of the checks after it stay as they were.
        std::mt19937 decode_rng(1023);
        rope(t, 4, 1, 64, backward, true, decode_rng, 1023);
        // --rotary-interleaved: pairs (2i, 2i + 1), two tiles and one pair.
        rope(t, 3, 9, 520, backward, !backward, rng, 0, true);
        rope(t, 2, 1, 2, backward, backward, rng, 5, true);
        // --use-rope-scaling (Llama 3's frequencies; all three bands at D 520, base 10000), from
        // a generator of its own.
        std::mt19937 llama3_rng(8);
        rope(t, 3, 9, 520, backward, !backward, llama3_rng, 4000, false, 8.0);
      }
      // SwiGLU: one column block, partly used; two; exactly one; one column.
      swiglu(t, 7, 45, rng);
      swiglu(t, 3, 300, rng);
      swiglu(t, 2, 256, rng);
      swiglu(t, 5, 1, rng);
    }
    // dgamma over 3 chunks (24, 24, 22 rows) of 2 column blocks, and over 9
    // (the finish's 8 lanes: lane 0 adds two).
    rmsnorm_backward({DType::BF16, 70, 300, DType::BF16, false, false}, rng);
    rmsnorm_backward({DType::F32, 257, 3, DType::F32, true, true}, rng);
    // RoPE with chunks of 2 heads a block: 6 block rows where 9 were asked
    // for, the last of one head, half of 3 pairs, 128 threads; and chunks of 4
    // heads at 256 threads.
    rope(DType::F32, 11, 60, 6, false, false, rng);
    rope(DType::F16, 11, 60, 6, true, true, rng);
    rope(DType::BF16, 8, 264, 128, true, false, rng);
    // Per-token positions: 3 samples of 4 heads (chunks within a sample), 1
    // sample of 1 head, 5 samples of 11 heads of 3 pairs.
    for (const bool backward : {false, true}) {
      rope_positions(DType::F32, 3, 4, 17, 64, backward, rng);
      rope_positions(DType::BF16, 1, 1, 9, 520, backward, rng);
      rope_positions(DType::F16, 5, 11, 30, 6, backward, rng);
    }
  });
}
