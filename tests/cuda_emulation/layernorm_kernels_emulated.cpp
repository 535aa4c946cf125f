// LayerNorm's one-pass backward (megazero/cuda/layernorm_kernels.cuh: dx and
// the dgamma/dbeta partials in one kernel, then column_finish_many_kernel as
// the launcher layernorm.cu runs it), on the CPU through the emulation in shim/,
// against kernels::layernorm_backward on the same inputs and statistics:
// - launches of 1, 3 and 4 lanes a block, one and two packs a thread, rows
//   that leave the last block's lanes idle at different steps, rows shorter
//   than their threads' packs, and the plan's launch for GPT-2 medium's width
//   (the plan's invariants: test_kernel_conventions);
// - with and without the residual gradient added to dx, dx written over dy;
// - fp32/bf16/fp16 storage, fp32 accumulators (Megatron's main grads), the
//   partials pre-filled with garbage (every slot the finish reads is written).
// - with dx's dropout backward in the same pass (the kernel's DROP, and SUMS:
//   the bias gradient's column sums too), over a layout with other groups'
//   rows in between (row_mask's mapping), p = 0.1 and p = 0: dd must be the CPU's
//   dropout_backward of the kernel's own dx bit for bit (the same mask, scale
//   and rounding), its sums within the dbeta bound.
// And the fast forward with the bias-dropout-add before it
// (layernorm_forward_kernels.cuh): the sum must be the CPU's bias_dropout_add
// bit for bit, and the output, mean and rstd the plain fast kernel's on that
// sum bit for bit; in place over y too, p = 0.1 and 0.
// dx: within two storage roundings plus fp32 noise (the kernel's statistics
// and row sums are fp32, the CPU's double). dgamma/dbeta: within one fp32
// rounding plus (rows a lane sums + lanes) fp32 roundings of the sum of the
// terms' magnitudes — the lanes' fp32 sums. A row or lane indexed wrong is
// off by O(1). Exit code 1 on any difference beyond that.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "emu_checks.h"
#include "emu_runtime.h"
#include "megazero/cuda/column_tiles.cuh"
#include "megazero/cuda/layernorm_forward_kernels.cuh"
#include "megazero/cuda/layernorm_kernels.cuh"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/gelu_bias.h"
#include "megazero/kernels/layernorm.h"

using namespace megazero;
namespace dk = megazero::cuda::detail_k;
namespace gs = megazero::kernels::gpu_scratch;

namespace {

using namespace emu_checks;

struct Launch {
  int packs_per_thread;
  i64 threads_per_row, lanes, rows_per_lane, blocks;
};

Launch from_plan(DType t, i64 rows, i64 cols) {
  const auto p = gs::layernorm_fused_plan(t, rows, cols);
  if (!p.fused()) {
    std::printf("FAIL %lld x %lld is not fused: it tests nothing here\n", static_cast<long long>(rows),
                static_cast<long long>(cols));
    ++failures;
  }
  return {p.packs_per_thread, p.threads_per_row, p.lanes, p.rows_per_lane, p.blocks};
}

enum class Drop { None, Out, OutAndSums };

template <DType T>
void run(std::mt19937& rng, i64 rows, i64 cols, const Launch& l, bool residual, bool in_place, Drop drop = Drop::None,
         double p = 0.1, bool prefetch = false) {
  using S = typename Storage<T>::type;
  const auto xv = randn(static_cast<std::size_t>(rows * cols), rng, 2.0), dv = randn(xv.size(), rng),
             rv = randn(xv.size(), rng), gv = randn(static_cast<std::size_t>(cols), rng),
             bv = randn(static_cast<std::size_t>(cols), rng), g0 = randn(static_cast<std::size_t>(cols), rng),
             b0 = randn(static_cast<std::size_t>(cols), rng);
  const Tensor x = tensor_of({rows, cols}, xv, T), dy = tensor_of({rows, cols}, dv, T);
  const Tensor gamma = tensor_of({cols}, gv, T), beta = tensor_of({cols}, bv, T), res = tensor_of({rows, cols}, rv, T);
  Tensor y = tensor_of({rows, cols}, xv, T);
  Tensor mean = Tensor::zeros(cpu(), {rows}, DType::F32, MemoryCategory::Other),
         rstd = mean.clone(MemoryCategory::Other);
  kernels::layernorm_forward(x, gamma, beta, 1e-5, y, mean, rstd);

  // The CPU.
  Tensor dxc = tensor_of({rows, cols}, dv, T), dgc = tensor_of({cols}, g0, DType::F32),
         dbc = tensor_of({cols}, b0, DType::F32);
  kernels::layernorm_backward(dy, x, gamma, mean, rstd, dxc, dgc, dbc, residual ? &res : nullptr);

  // The emulated GPU.
  Tensor dyg = dy.clone(MemoryCategory::Other), xg = x.clone(MemoryCategory::Other),
         gg = gamma.clone(MemoryCategory::Other), rg = res.clone(MemoryCategory::Other);
  Tensor dxg = in_place ? dyg : tensor_of({rows, cols}, std::vector<double>(xv.size(), std::nan("")), T);
  Tensor dgg = tensor_of({cols}, g0, DType::F32), dbg = tensor_of({cols}, b0, DType::F32);
  const bool sums = drop == Drop::OutAndSums;
  const int nsums = sums ? 3 : 2;
  std::vector<double> partial(static_cast<std::size_t>(nsums * l.blocks * cols), -1e300);
  double* pg = partial.data();
  double* pb = pg + l.blocks * cols;
  double* pd = pb + l.blocks * cols;
  // The dropout's layout: rows of other groups in between (3 groups, this
  // tensor the third), from sample 7: global row (7 * 3 + 2) + r * 3.
  const kernels::DropoutLayout layout{rows, 1, 1, cols, 7, 2, 3};
  const RngKey key{2026, 11, 3, kRngAttentionOutputDropout};
  Tensor ddg = tensor_of({rows, cols}, std::vector<double>(xv.size(), std::nan("")), T);
  dk::RowDropout<S> rd{raw<S>(ddg), pd, {}};
  if (drop != Drop::None && !dk::row_mask(layout, rows, cols, p, dk::philox_key(key), rd.mask)) {
    std::printf("FAIL the layout's rows are not taken as the tensor's\n");
    ++failures;
  }
  const unsigned threads = static_cast<unsigned>(l.lanes * l.threads_per_row);
  const std::size_t smem =
      dk::layernorm_fused_smem_bytes(l.packs_per_thread, dk::kVec<S>, nsums, drop != Drop::None, prefetch);
  emu_launch(dim3{static_cast<unsigned>(l.blocks), 1, 1}, threads, smem, [&] {
    const auto go = [&](auto kernel) {
      kernel(raw<S>(dyg), raw<S>(xg), raw<S>(gg), mean.host_data<float>(), rstd.host_data<float>(), raw<S>(dxg),
             residual ? raw<S>(rg) : nullptr, rows, cols, static_cast<int>(l.threads_per_row), l.rows_per_lane, pg, pb,
             rd);
    };
    if (l.packs_per_thread == 1) {
      if (sums)
        go(dk::layernorm_backward_fused_kernel<S, 1, true, true>);
      else if (drop == Drop::Out)
        go(dk::layernorm_backward_fused_kernel<S, 1, true>);
      else
        go(dk::layernorm_backward_fused_kernel<S, 1>);
    } else if (prefetch) {
      if (sums)
        go(dk::layernorm_backward_fused_kernel<S, 2, true, true, true>);
      else if (drop == Drop::Out)
        go(dk::layernorm_backward_fused_kernel<S, 2, true, false, true>);
      else
        go(dk::layernorm_backward_fused_kernel<S, 2, false, false, true>);
    } else {
      if (sums)
        go(dk::layernorm_backward_fused_kernel<S, 2, true, true>);
      else if (drop == Drop::Out)
        go(dk::layernorm_backward_fused_kernel<S, 2, true>);
      else
        go(dk::layernorm_backward_fused_kernel<S, 2>);
    }
  });
  // The launcher's one finish for dgamma, dbeta (and the dropout's bias):
  // 2 row lanes, small, still in lane order.
  Tensor db = tensor_of({cols}, b0, DType::F32);
  dk::FinishTargets<float> targets;
  targets.dst[0] = dgg.host_data<float>();
  targets.dst[1] = dbg.host_data<float>();
  targets.dst[2] = sums ? db.host_data<float>() : nullptr;
  emu_launch(dim3{dk::finish_blocks(cols), static_cast<unsigned>(nsums), 1}, 64, 0,
             [&] { dk::column_finish_many_kernel<float>(cols, l.blocks, pg, targets); });

  if (drop != Drop::None) {
    // dd: the CPU's dropout backward of the kernel's own dx, bit for bit.
    Tensor want = tensor_of({rows, cols}, std::vector<double>(xv.size(), 0.0), T);
    kernels::dropout_backward(dxg, p, key, layout, want);
    const auto got_d = values(ddg), want_d = values(want);
    std::size_t dropped = 0;
    for (std::size_t k = 0; k < got_d.size(); ++k) {
      check(std::memcmp(&got_d[k], &want_d[k], sizeof(double)) == 0, "dd", got_d[k], want_d[k], k);
      dropped += want_d[k] == 0.0;
    }
    // A mask that keeps everything would pass the comparison for p = 0 only.
    const double frac = static_cast<double>(dropped) / static_cast<double>(got_d.size());
    check(p == 0 ? dropped == 0 : std::fabs(frac - p) < 0.05 + 3.0 / std::sqrt(static_cast<double>(got_d.size())),
          "dropped fraction", frac, p, 0);
    if (sums) {
      Tensor want_db = tensor_of({cols}, b0, DType::F32);
      kernels::bias_grad(want, want_db);
      std::vector<double> mag(static_cast<std::size_t>(cols));
      for (std::size_t k = 0; k < want_d.size(); ++k) mag[k % static_cast<std::size_t>(cols)] += std::fabs(want_d[k]);
      const double steps = static_cast<double>(l.rows_per_lane + l.lanes + 2) * 0x1p-24;
      const auto got_b = values(db), want_b = values(want_db);
      for (std::size_t c = 0; c < got_b.size(); ++c)
        check(std::fabs(got_b[c] - want_b[c]) <= 0x1p-23 * std::fabs(want_b[c]) + steps * mag[c], "dbias", got_b[c],
              want_b[c], c);
    }
  }

  double dx_max = 0;
  for (const double v : values(dxc)) dx_max = std::max(dx_max, std::fabs(v));
  expect_close(values(dxg), values(dxc), 2 * ulp_of(T), 1e-5 * dx_max, "dx");
  // The sums' bound: the terms' magnitudes per column, in the CPU's statistics.
  const auto xs = values(x), ds = values(dy), ms = values(mean), rs = values(rstd);
  std::vector<double> mag_g(static_cast<std::size_t>(cols)), mag_b(mag_g.size());
  for (i64 r = 0; r < rows; ++r)
    for (i64 c = 0; c < cols; ++c) {
      const std::size_t k = static_cast<std::size_t>(r * cols + c);
      mag_b[static_cast<std::size_t>(c)] += std::fabs(ds[k]);
      mag_g[static_cast<std::size_t>(c)] +=
          std::fabs(ds[k] * (xs[k] - ms[static_cast<std::size_t>(r)]) * rs[static_cast<std::size_t>(r)]);
    }
  const double steps = static_cast<double>(l.rows_per_lane + l.lanes + 2) * 0x1p-24;
  const auto got_g = values(dgg), want_g = values(dgc), got_b = values(dbg), want_b = values(dbc);
  for (std::size_t c = 0; c < got_g.size(); ++c) {
    check(std::fabs(got_g[c] - want_g[c]) <= 0x1p-23 * std::fabs(want_g[c]) + steps * mag_g[c], "dgamma", got_g[c],
          want_g[c], c);
    check(std::fabs(got_b[c] - want_b[c]) <= 0x1p-23 * std::fabs(want_b[c]) + steps * mag_b[c], "dbeta", got_b[c],
          want_b[c], c);
  }
}

template <DType T>
void forward_bda(std::mt19937& rng, i64 rows, i64 cols, unsigned threads, int packs, bool in_place, double p) {
  using S = typename Storage<T>::type;
  const auto yv = randn(static_cast<std::size_t>(rows * cols), rng), rv = randn(yv.size(), rng, 2.0),
             bv = randn(static_cast<std::size_t>(cols), rng), gv = randn(static_cast<std::size_t>(cols), rng),
             tv = randn(static_cast<std::size_t>(cols), rng);
  Tensor y = tensor_of({rows, cols}, yv, T), res = tensor_of({rows, cols}, rv, T), bias = tensor_of({cols}, bv, T);
  Tensor gamma = tensor_of({cols}, gv, T), beta = tensor_of({cols}, tv, T);
  const kernels::DropoutLayout layout{rows, 1, 1, cols, 5, 1, 2};  // global rows 11 + 2 r
  const RngKey key{2026, 7, 2, kRngAttentionOutputDropout};
  // The CPU's sum, then the plain fast kernel on it.
  Tensor sum_c = tensor_of({rows, cols}, std::vector<double>(yv.size(), 0.0), T);
  kernels::bias_dropout_add(y, bias, res, p, key, layout, sum_c);
  const auto nan_rows = [&](i64 n) {
    return tensor_of({n}, std::vector<double>(static_cast<std::size_t>(n), std::nan("")), DType::F32);
  };
  Tensor want = tensor_of({rows, cols}, std::vector<double>(yv.size(), std::nan("")), T), want_m = nan_rows(rows),
         want_r = nan_rows(rows);
  const auto run = [&](auto kernel, const S* x, S* out, float* m, float* r, const dk::RowBiasDropoutAdd<S>& bda) {
    emu_launch(dim3{static_cast<unsigned>(rows), 1, 1}, threads, 0,
               [&] { kernel(x, raw<S>(gamma), raw<S>(beta), 1e-5f, out, m, r, cols, bda); });
  };
  const auto pick = [&](auto bda_flag, auto&& go) {
    constexpr bool B = decltype(bda_flag)::value;
    if (packs == 1)
      go(dk::layernorm_forward_fast_kernel<S, 1, B>);
    else
      go(dk::layernorm_forward_fast_kernel<S, 2, B>);
  };
  pick(std::false_type{},
       [&](auto k) { run(k, raw<S>(sum_c), raw<S>(want), want_m.host_data<float>(), want_r.host_data<float>(), {}); });
  // The fused pass, the sum written over y (as the layer does) or apart.
  Tensor yg = y.clone(MemoryCategory::Other);
  Tensor sum_g = in_place ? yg : tensor_of({rows, cols}, std::vector<double>(yv.size(), std::nan("")), T);
  Tensor got = tensor_of({rows, cols}, std::vector<double>(yv.size(), std::nan("")), T), got_m = nan_rows(rows),
         got_r = nan_rows(rows);
  dk::RowBiasDropoutAdd<S> bda{raw<S>(res), raw<S>(bias), raw<S>(sum_g), {}};
  if (!dk::row_mask(layout, rows, cols, p, dk::philox_key(key), bda.mask)) {
    std::printf("FAIL the forward's layout is not taken as rows\n");
    ++failures;
  }
  pick(std::true_type{},
       [&](auto k) { run(k, raw<S>(yg), raw<S>(got), got_m.host_data<float>(), got_r.host_data<float>(), bda); });
  const auto same = [&](const Tensor& a, const Tensor& b, const char* what) {
    const auto va = values(a), vb = values(b);
    for (std::size_t k = 0; k < va.size(); ++k)
      check(std::memcmp(&va[k], &vb[k], sizeof(double)) == 0, what, va[k], vb[k], k);
  };
  same(sum_g, sum_c, "forward: the bias-dropout-add's sum");
  same(got, want, "forward: the LayerNorm of the sum");
  same(got_m, want_m, "forward: mean");
  same(got_r, want_r, "forward: rstd");
  // The mask did drop (and kept all at p = 0): the sum is the residual where dropped.
  std::size_t dropped = 0;
  const auto sums = values(sum_c), rs = values(res);
  for (std::size_t k = 0; k < sums.size(); ++k) dropped += sums[k] == rs[k];
  const double frac = static_cast<double>(dropped) / static_cast<double>(sums.size());
  check(p == 0 ? frac < 0.02 : std::fabs(frac - p) < 0.05, "forward: dropped fraction", frac, p, 0);
}

template <DType T>
void all(std::mt19937& rng) {
  using S = typename Storage<T>::type;
  constexpr i64 V = dk::kVec<S>;
  // The kernel takes its shape from the launch, so small blocks (an emulated
  // thread is a host thread) test what the plan's 512-thread blocks run:
  // - 4 lanes of one warp, 3 rows a lane, 4 blocks over 37 rows (the last
  //   block's lanes run out at different steps);
  const Launch four{1, 32, 4, 3, 4};
  run<T>(rng, 37, 29 * V, four, true, false);
  run<T>(rng, 37, 29 * V, four, false, true);
  // - 3 lanes of two warps, 5 rows a lane, 50 packs a row (the second warp's
  //   last threads hold none), dx over dy;
  const Launch three{1, 64, 3, 5, 4};
  run<T>(rng, 50, 50 * V, three, true, false);
  run<T>(rng, 50, 50 * V, three, true, true);
  // - two packs a thread, one lane: 100 packs on 64 threads (the second pack
  //   only for the first 36).
  const Launch two{2, 64, 1, 8, 3};
  run<T>(rng, 20, 100 * V, two, true, false);
  run<T>(rng, 20, 100 * V, two, false, true);
  // - with the dropout backward: one pack a thread with and without the
  //   bias sums, two packs (the launcher sums the bias after), p = 0 too.
  run<T>(rng, 37, 29 * V, four, true, false, Drop::OutAndSums);
  run<T>(rng, 50, 50 * V, three, true, true, Drop::Out);
  run<T>(rng, 50, 50 * V, three, false, false, Drop::OutAndSums, 0.0);
  run<T>(rng, 20, 100 * V, two, true, false, Drop::Out);
  // - two packs a thread with every row prefetched (bench_kernels' alternative),
  //   alone and with the dropout backward (the bias summed in the kernel too);
  run<T>(rng, 20, 100 * V, two, true, false, Drop::None, 0.1, true);
  run<T>(rng, 20, 100 * V, two, false, true, Drop::None, 0.1, true);
  run<T>(rng, 20, 100 * V, two, true, false, Drop::OutAndSums, 0.1, true);
  run<T>(rng, 20, 100 * V, two, false, true, Drop::Out, 0.1, true);
  run<T>(rng, 20, 100 * V, two, true, true, Drop::OutAndSums, 0.0, true);
  // - two packs with the bias sums and no prefetch (the launcher sums after it
  //   instead, but the instance is the prefetched one's arithmetic).
  run<T>(rng, 20, 100 * V, two, true, true, Drop::OutAndSums);
  // The forward with the bias-dropout-add: one pack a thread (29 packs on 32
  // threads), two (100 packs on 64: the second only for the first 36).
  forward_bda<T>(rng, 9, 29 * V, 32, 1, true, 0.1);
  forward_bda<T>(rng, 7, 100 * V, 64, 2, false, 0.1);
  forward_bda<T>(rng, 5, 100 * V, 64, 2, true, 0.0);
}

}  // namespace

int main() {
  std::mt19937 rng(2026);
  all<DType::F32>(rng);
  all<DType::BF16>(rng);
  all<DType::F16>(rng);
  // The plan's own launch for GPT-2 medium's rows (4 lanes of 128 threads), on
  // fewer rows: one block of 512 threads, 8 rows a lane.
  run<DType::BF16>(rng, 30, 1024, from_plan(DType::BF16, 30, 1024), true, false);
  run<DType::BF16>(rng, 30, 1024, from_plan(DType::BF16, 30, 1024), true, false, Drop::OutAndSums);
  // Layouts the one pass must not take: rows of several groups, fewer samples.
  {
    dk::RowMask<float> m{};
    check(!dk::row_mask(kernels::DropoutLayout{10, 2, 1, 64, 0, 0, 2}, 20, 64, 0.1, dk::PhiloxKey{}, m),
          "row_mask took a two-group layout", 1, 0, 0);
    check(!dk::row_mask(kernels::DropoutLayout{10, 1, 2, 64, 0, 0, 1}, 20, 64, 0.1, dk::PhiloxKey{}, m),
          "row_mask took a layout of two rows a sample", 1, 0, 0);
  }
  // Two blocks an SM (228 KB of shared memory, 1 KB reserved a block, the
  // kernel's 256 static bytes) at each launch the launcher makes with the
  // dropout: one pack a thread with the bias sums, two packs without.
  for (const auto& [packs, sums] : {std::pair{1, 3}, std::pair{2, 2}}) {
    const std::size_t smem = dk::layernorm_fused_smem_bytes(packs, 8, sums, true);
    check(2 * (smem + 1024 + 256) <= 228 * 1024, "shared memory for two blocks an SM", static_cast<double>(smem),
          114 * 1024, static_cast<std::size_t>(packs));
  }
  // The prefetched alternative's largest launch (two 16-bit packs a thread,
  // the dropout and its bias sums) within a block's 227 KB of dynamic shared
  // memory (sm_90's most; the kernel's 256 static bytes on top).
  for (const int vec : {8, 4}) {
    const std::size_t smem = dk::layernorm_fused_smem_bytes(2, vec, 3, true, true);
    check(smem + 256 <= 227 * 1024, "shared memory for one prefetched block", static_cast<double>(smem), 227 * 1024,
          static_cast<std::size_t>(vec));
  }
  if (failures) {
    std::printf("layernorm_kernels_emulated: %d checks failed\n", failures);
    return 1;
  }
  std::printf(
      "layernorm_kernels_emulated: the one-pass LayerNorm backward (dx, dgamma, dbeta; dx's dropout backward and its "
      "bias sums) and the forward with the bias-dropout-add match the CPU (fp32, bf16, fp16; 1, 3 and 4 lanes a block; "
      "one and two packs a thread)\n");
  return 0;
}
