// megazero/cuda/dropout_kernels.cuh (the dropout backward with the bias
// gradient in the same pass), run on the CPU through the emulation in shim/
// against the CPU's dropout_backward then bias_grad on the same inputs: fp32,
// bf16 and fp16 with fp32 bias accumulators; layouts whose rows are not a
// multiple of 4 long (a Philox block split between threads and rows) or
// shorter than a tensor row (a thread's four columns cross a layout row), with
// offsets (sample_offset, group_offset of global_groups) as a TP or DP split has them; p = 0; several row
// chunks; dx written over dy; blocks of 1, 3 and 8 row lanes; where the
// layout allows, the aligned kernel too (its partials must be the element-by-
// element kernel's bit for bit; walks whose step spans layout rows, groups
// and samples); then the
// launcher's finish (column_finish_kernel of column_tiles.cuh, over partials
// pre-filled with garbage), and the same kernel finishing the sums itself
// (the launcher's default: the finish kernel's bits, its tickets back at 0).
// dx must be the CPU's bit for bit, dbias within one fp32 rounding. The same layouts run the forward kernels (dropout
// and bias-dropout-add, element by element, packed, packed with bias packs) against the CPU's dropout_forward and
// bias_dropout_add, bit for bit; and the integer keep decision against the CPU's compare at the thresholds. Exit code 1
// on any difference beyond that.
#include <cstdio>
#include <random>
#include <type_traits>
#include <vector>

#include "emu_checks.h"
#include "emu_runtime.h"
#include "megazero/cuda/dropout_kernels.cuh"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/dropout.h"
#include "megazero/kernels/gelu_bias.h"

using namespace megazero;
namespace dk = megazero::cuda::detail_k;
namespace gs = megazero::kernels::gpu_scratch;

namespace {

using namespace emu_checks;

struct Case {
  kernels::DropoutLayout l;
  i64 cols;
  double p;
};

int aligned_runs = 0;  // cases the aligned backward ran on (main insists on some)

template <DType T>
void dropout_bias_grad(std::mt19937& rng, const Case& c, unsigned threads) {
  using S = typename Storage<T>::type;
  const i64 numel = c.l.samples * c.l.groups * c.l.matrix_rows * c.l.matrix_cols, rows = numel / c.cols;
  std::uniform_real_distribution<double> u(-2, 2);
  std::vector<double> dv(static_cast<std::size_t>(numel)), bv(static_cast<std::size_t>(c.cols));
  for (auto& x : dv) x = u(rng);
  for (auto& x : bv) x = u(rng);
  const RngKey key{77, 5, 3, 2};

  // The CPU: dropout_backward, then bias_grad over its rounded output.
  const Tensor dy = tensor_of({rows, c.cols}, dv, T);
  Tensor dxc = tensor_of({rows, c.cols}, dv, T), dbc = tensor_of({c.cols}, bv, DType::F32);
  kernels::dropout_backward(dy, c.p, key, c.l, dxc);
  kernels::bias_grad(dxc, dbc);

  // The emulated GPU, dx written over dy, then the launcher's finish; blocks
  // of `threads` (1, 3 or 8 row lanes: the kernels read blockDim). Element by
  // element always; the aligned kernel (four-column accesses, rows in
  // batches, the layout walked without dividing) where the launcher takes it.
  const auto ch = gs::dropout_column_chunks(rows, c.cols);
  std::vector<double> first_partial;
  auto run = [&](auto aligned, const char* dx_what, const char* db_what) {
    Tensor g = tensor_of({rows, c.cols}, dv, T);
    std::vector<double> partial(gs::dropout_bias_grad_bytes(rows, c.cols) / sizeof(double), -1e300);
    emu_launch(dim3{static_cast<unsigned>(ch.col_blocks), static_cast<unsigned>(ch.used), 1}, threads, 0, [&] {
      dk::dropout_backward_partial_kernel<S, decltype(aligned)::value>(raw<S>(g), c.p, dk::philox_key(key), c.l, rows,
                                                                       c.cols, ch.per_chunk, raw<S>(g), partial.data());
    });
    if (first_partial.empty())
      first_partial = partial;
    else  // the same rows in the same order: the same partials, bit for bit
      expect_close(partial, first_partial, 0, 0, "aligned partials vs element by element (bit for bit)");
    Tensor dbt = tensor_of({c.cols}, bv, DType::F32);
    emu_launch(dim3{dk::finish_blocks(c.cols), 1, 1}, threads, 0,
               [&] { dk::column_finish_kernel<float>(c.cols, ch.used, partial.data(), dbt.host_data<float>()); });
    expect_close(values(g), values(dxc), 0, 0, dx_what);
    expect_close(values(dbt), values(dbc), 0x1p-23, 1e-30, db_what);
    // The finish folded into the kernel (the launcher's default): the last
    // block of each block column adds the partials as the finish kernel of
    // kThreads threads (the launcher's) does, bit for bit, and leaves its
    // ticket at 0 for the next launch.
    Tensor want = tensor_of({c.cols}, bv, DType::F32);
    emu_launch(dim3{dk::finish_blocks(c.cols), 1, 1}, dk::kThreads, 0,
               [&] { dk::column_finish_kernel<float>(c.cols, ch.used, partial.data(), want.host_data<float>()); });
    Tensor gf = tensor_of({rows, c.cols}, dv, T), dbf = tensor_of({c.cols}, bv, DType::F32);
    std::vector<double> pf(partial.size(), -1e300);
    std::vector<unsigned> tickets(static_cast<std::size_t>(ch.col_blocks), 0);
    dk::ColumnFold<float> fold;
    fold.tickets = tickets.data();
    fold.targets.dst[0] = dbf.host_data<float>();
    emu_launch(dim3{static_cast<unsigned>(ch.col_blocks), static_cast<unsigned>(ch.used), 1}, threads, 0, [&] {
      dk::dropout_backward_partial_kernel<S, decltype(aligned)::value>(
          raw<S>(gf), c.p, dk::philox_key(key), c.l, rows, c.cols, ch.per_chunk, raw<S>(gf), pf.data(), fold);
    });
    expect_close(values(gf), values(dxc), 0, 0, dx_what);
    expect_close(values(dbf), values(want), 0, 0, "dbias, finished in the kernel (the finish kernel's bits)");
    for (unsigned t : tickets) check(t == 0, "a ticket left armed after the folded finish", t, 0, 0);
  };
  run(std::false_type{}, "dx (the CPU's mask and rounding: bit for bit)", "dbias (double sums, one fp32 rounding)");
  const i64 inner = c.l.matrix_rows * c.l.matrix_cols;
  if (c.cols % 4 == 0 && inner % 4 == 0) {
    run(std::true_type{}, "dx, aligned kernel (bit for bit)", "dbias, aligned kernel (one fp32 rounding)");
    ++aligned_runs;
  }
}

// The forward kernels (dropout and bias-dropout-add) in every variant the
// layout allows (element by element; 16-byte packs when the layout row is a
// multiple of the pack; with the bias as packs when cols is too), on a small
// grid so that threads stride over several groups: the CPU's output bit for bit.
template <DType T>
void dropout_forward(std::mt19937& rng, const Case& c, unsigned threads) {
  using S = typename Storage<T>::type;
  constexpr int G = dk::kVec<S> < 4 ? 4 : dk::kVec<S>;
  const i64 numel = c.l.samples * c.l.groups * c.l.matrix_rows * c.l.matrix_cols, rows = numel / c.cols;
  const i64 inner = c.l.matrix_rows * c.l.matrix_cols, lrows = c.l.samples * c.l.groups;
  const i64 groups = (inner + G - 1) / G;
  std::uniform_real_distribution<double> u(-2, 2);
  std::vector<double> yv(static_cast<std::size_t>(numel)), rv(yv.size()), bv(static_cast<std::size_t>(c.cols));
  for (auto& x : yv) x = u(rng);
  for (auto& x : rv) x = u(rng);
  for (auto& x : bv) x = u(rng);
  const RngKey key{91, 2, 7, 1};
  Tensor y = tensor_of({rows, c.cols}, yv, T), res = tensor_of({rows, c.cols}, rv, T),
         bias = tensor_of({c.cols}, bv, T);
  Tensor want_d = tensor_of({rows, c.cols}, yv, T), want_f = tensor_of({rows, c.cols}, yv, T);
  kernels::dropout_forward(y, c.p, key, c.l, want_d);
  kernels::bias_dropout_add(y, bias, res, c.p, key, c.l, want_f);

  const dim3 grid{2, 1, 1};
  auto run = [&](auto vec, auto fused, auto bias_vec, const Tensor& want, const char* what) {
    constexpr bool VEC = decltype(vec)::value, FUSED = decltype(fused)::value, BV = decltype(bias_vec)::value;
    Tensor out = tensor_of({rows, c.cols}, std::vector<double>(yv.size(), 1e4), T);
    emu_launch(grid, threads, 0, [&] {
      dk::dropout_kernel<S, VEC, FUSED, BV>(raw<S>(y), FUSED ? raw<S>(bias) : nullptr, FUSED ? raw<S>(res) : nullptr,
                                            c.p, dk::philox_key(key), c.l, raw<S>(out), inner, c.cols, groups,
                                            lrows * groups);
    });
    expect_close(values(out), values(want), 0, 0, what);
  };
  using F = std::false_type;
  using Tr = std::true_type;
  run(F{}, F{}, F{}, want_d, "dropout, element by element (bit for bit)");
  run(F{}, Tr{}, F{}, want_f, "bias-dropout-add, element by element (bit for bit)");
  if (inner % G == 0) {
    run(Tr{}, F{}, F{}, want_d, "dropout, packed (bit for bit)");
    run(Tr{}, Tr{}, F{}, want_f, "bias-dropout-add, packed (bit for bit)");
    if (c.cols % G == 0) run(Tr{}, Tr{}, Tr{}, want_f, "bias-dropout-add, packed with bias packs (bit for bit)");
  }
}

}  // namespace

// The kernels' keep decision on the integer (philox.cuh: kept(w,
// keep_threshold(p))) against the CPU's float uniform compared with the double
// p, on the words around each threshold (and every low byte, which neither
// reads) for p near 0, near 1, on and off the 2^-24 grid.
void keep_decision() {
  const double ps[] = {0.1, 0.3, 0.5, 0.2, 0x1p-24, 3 * 0x1p-24, 0.75, 1 - 0x1p-24, 1 - 0x1p-30, 0.1 + 0x1p-40};
  for (const double p : ps) {
    const std::uint32_t t = dk::keep_threshold(p);
    for (std::int64_t u = static_cast<std::int64_t>(t) - 2; u <= static_cast<std::int64_t>(t) + 2; ++u) {
      if (u < 0 || u >= (std::int64_t{1} << 24)) continue;
      for (const unsigned low : {0u, 1u, 0x7fu, 0xffu}) {
        const unsigned w = (static_cast<unsigned>(u) << 8) | low;
        const bool cpu = static_cast<double>(static_cast<float>(w >> 8) * 0x1p-24f) >= p;
        check(dk::kept(w, t) == cpu, "keep decision vs the CPU's", dk::kept(w, t) ? 1.0 : 0.0, cpu ? 1.0 : 0.0,
              static_cast<std::size_t>(w));
      }
    }
  }
}

int main() {
  std::mt19937 rng(2026);
  keep_decision();
  const std::vector<Case> cases = {
      {{3, 1, 5, 6, 0, 0, 1}, 6, 0.1},      // hidden dropout: [micro-batch, 1, seq, hidden]
      {{3, 1, 5, 7, 2, 0, 1}, 7, 0.3},      // rows of 35: Philox blocks straddle rows and threads
      {{2, 3, 2, 5, 1, 2, 7}, 10, 0.5},     // offsets of a split (sample and group offsets)
      {{4, 1, 64, 33, 0, 0, 1}, 33, 0.1},   // 256 rows: several row chunks
      {{2, 1, 8, 40, 0, 0, 1}, 40, 0.0},    // p = 0: a copy and the sum
      {{1, 1, 3, 300, 0, 0, 1}, 300, 0.2},  // several column blocks
      {{6, 2, 1, 5, 1, 3, 9}, 10, 0.4},     // layout rows of 5 inside tensor rows of 10: a thread's columns cross one
      {{4, 1, 2, 16, 0, 0, 1}, 32, 0.3},    // packed forward, bias packs
      {{2, 1, 4, 12, 1, 0, 1}, 12, 0.2},    // packed forward; bf16/fp16 bias not a whole number of packs
      // The aligned backward's layout walk: a step (lanes x cols) of several
      // layout rows, groups and samples, with carries in each coordinate.
      {{6, 3, 1, 8, 2, 1, 7}, 16, 0.3},    // layout rows of 8 in tensor rows of 16, 3 of 7 groups
      {{3, 5, 3, 4, 4, 2, 9}, 20, 0.5},    // layout rows of 12 inside and across tensor rows of 20
      {{2, 1, 40, 36, 3, 0, 1}, 36, 0.1},  // 80 rows of 36: rows per lane not a multiple of the batch
  };
  for (const Case& c : cases)
    for (const unsigned threads : {32u, 96u, 256u}) {
      dropout_bias_grad<DType::F32>(rng, c, threads);
      dropout_bias_grad<DType::BF16>(rng, c, threads);
      dropout_bias_grad<DType::F16>(rng, c, threads);
      dropout_forward<DType::F32>(rng, c, threads);
      dropout_forward<DType::BF16>(rng, c, threads);
      dropout_forward<DType::F16>(rng, c, threads);
    }
  if (aligned_runs == 0) {
    std::printf("FAIL no case ran the aligned dropout backward\n");
    ++failures;
  }
  if (failures) {
    std::printf("dropout_kernels_emulated: %d checks failed\n", failures);
    return 1;
  }
  std::printf(
      "dropout_kernels_emulated: dropout, bias-dropout-add and the fused dropout backward with the bias "
      "gradient match the CPU (%zu layouts, "
      "fp32, bf16, fp16)\n",
      cases.size());
  return 0;
}
