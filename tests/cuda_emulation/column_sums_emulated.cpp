// The tiled column sums of megazero/cuda/column_tiles.cuh (the packed bias
// gradient / dbeta, LayerNorm's dgamma and dbeta in one pass, and the finish
// kernel every fused gradient shares) and the packed bias-GeLU backward of
// gelu_bias_kernels.cuh, run on the CPU through the emulation in shim/ as the
// launchers run them (column_sums.cuh, gelu_bias.cu: partials per chunk of
// gpu_scratch::packed_column_chunks, then column_finish_kernel), against the
// CPU kernels on the same inputs:
// - sums vs kernels::bias_grad and kernels::layernorm_backward's dgamma/dbeta
//   (double sums in another order, one rounding into the accumulator: within
//   one rounding of it), fp32/bf16/fp16 storage, fp32 and 16-bit accumulators;
// - bias_gelu_backward: dx within two storage roundings of the CPU's, plus a
//   few ulps of 1 where gelu' cancels (the shim's tanh of a float is libm's
//   double one; the CPU's is a vectorised float one), and dbias within one fp32
//   rounding of bias_grad over the emulated dx (the contract: dbias sums the
//   rounded dx it wrote); with and without a bias (null: y holds it, as fc1's
//   forward epilogue leaves pre);
// - blocks of 1, 3 and 8 row lanes (32, 96, 256 threads), a tile only partly
//   inside the columns, chunks of rows not a multiple of the lanes, and
//   partials pre-filled with garbage (every slot the finish reads is written);
// - the finish folded into each partial kernel (ColumnFold: the last block of
//   a block column adds its columns' chunks): the finish kernel's bits (its
//   launch of kThreads), every ticket back at 0; and finish_column_alone, the
//   fold's one-thread-a-column finish, against the lane-order sums.
// Exit code 1 on any difference beyond that.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "emu_checks.h"
#include "emu_runtime.h"
#include "megazero/cuda/column_tiles.cuh"
#include "megazero/cuda/gelu_bias_kernels.cuh"
#include "megazero/kernels/gelu_bias.h"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/layernorm.h"

using namespace megazero;
namespace dk = megazero::cuda::detail_k;
namespace gs = megazero::kernels::gpu_scratch;

namespace {

using namespace emu_checks;

struct Shape2 {
  i64 rows, cols;
};

// The launcher's finish: dst += the chunks' partials.
template <typename G>
void finish(const double* partial, i64 cols, i64 chunks, G* dst, unsigned threads) {
  emu_launch(dim3{dk::finish_blocks(cols), 1, 1}, threads, 0,
             [&] { dk::column_finish_kernel<G>(cols, chunks, partial, dst); });
}

// The finish folded into the partial kernel (the launchers' default): `run`
// launches the kernel with `fold` (fresh tickets, `sums` accumulators from
// `starts`) over partials pre-filled with garbage, [sums][chunks][cols]; each
// accumulator must then be what the launcher's finish kernel (kThreads
// threads) adds over those partials, bit for bit, and every ticket back at 0.
template <typename G, typename Run>
void expect_folded(const std::vector<Tensor>& starts, i64 cols, const gs::Chunks& c, Run run, const char* what) {
  std::vector<Tensor> got, want;
  for (const Tensor& t : starts) got.push_back(t.clone(MemoryCategory::Other));
  for (const Tensor& t : starts) want.push_back(t.clone(MemoryCategory::Other));
  std::vector<double> partial(static_cast<std::size_t>(2 * c.used * cols), -1e300);
  std::vector<unsigned> tickets(static_cast<std::size_t>(c.col_blocks), 0);
  dk::ColumnFold<G> fold;
  fold.tickets = tickets.data();
  for (std::size_t y = 0; y < got.size(); ++y) fold.targets.dst[y] = static_cast<G*>(got[y].data());
  run(partial.data(), fold);
  for (std::size_t y = 0; y < want.size(); ++y) {
    finish<G>(partial.data() + static_cast<i64>(y) * c.used * cols, cols, c.used, static_cast<G*>(want[y].data()),
              dk::kThreads);
    expect_close(values(got[y]), values(want[y]), 0, 0, what);
  }
  for (unsigned t : tickets) check(t == 0, "a ticket left armed after the folded finish", t, 0, 0);
}

// dbeta (and with LN dgamma) += column sums through the packed tiles.
template <DType T, typename G>
void sums(std::mt19937& rng, Shape2 sh, bool ln, DType acc, unsigned threads) {
  using S = typename Storage<T>::type;
  const i64 rows = sh.rows, cols = sh.cols, V = dk::kVec<S>;
  const auto c = gs::packed_column_chunks(rows, cols, V);
  if (c.used == 1) {  // the launcher takes the plain path then
    std::printf("FAIL case %lld x %lld has one chunk: it tests nothing here\n", static_cast<long long>(rows),
                static_cast<long long>(cols));
    ++failures;
    return;
  }
  const auto xv = randn(static_cast<std::size_t>(rows * cols), rng, 2.0);
  const auto dv = randn(xv.size(), rng), g0 = randn(static_cast<std::size_t>(cols), rng),
             b0 = randn(static_cast<std::size_t>(cols), rng);
  const Tensor x = tensor_of({rows, cols}, xv, T), dy = tensor_of({rows, cols}, dv, T);
  const Tensor gamma = tensor_of({cols}, g0, T), beta = tensor_of({cols}, b0, T);
  Tensor y = tensor_of({rows, cols}, xv, T);
  Tensor mean = Tensor::zeros(cpu(), {rows}, DType::F32, MemoryCategory::Other),
         rstd = mean.clone(MemoryCategory::Other);
  kernels::layernorm_forward(x, gamma, beta, 1e-5, y, mean, rstd);

  // The CPU.
  Tensor dgc = tensor_of({cols}, g0, acc), dbc = tensor_of({cols}, b0, acc), dxc = tensor_of({rows, cols}, dv, T);
  if (ln)
    kernels::layernorm_backward(dy, x, gamma, mean, rstd, dxc, dgc, dbc);
  else
    kernels::bias_grad(dy, dbc);

  // The emulated GPU: partials pre-filled with garbage.
  Tensor dgg = tensor_of({cols}, g0, acc), dbg = tensor_of({cols}, b0, acc);
  std::vector<double> pb(static_cast<std::size_t>(c.used * cols), -1e300), pg(pb.size(), -1e300);
  Tensor dyg = dy.clone(MemoryCategory::Other), xg = x.clone(MemoryCategory::Other);
  emu_launch(dim3{static_cast<unsigned>(c.col_blocks), static_cast<unsigned>(c.used), 1}, threads, 0, [&] {
    if (ln)
      dk::column_partial_packed_kernel<S, true>(raw<S>(dyg), raw<S>(xg), mean.host_data<float>(),
                                                rstd.host_data<float>(), rows, cols, c.per_chunk, pb.data(), pg.data());
    else
      dk::column_partial_packed_kernel<S, false>(raw<S>(dyg), nullptr, nullptr, nullptr, rows, cols, c.per_chunk,
                                                 pb.data(), nullptr);
  });
  finish<G>(pb.data(), cols, c.used, static_cast<G*>(dbg.data()), threads);
  if (ln) finish<G>(pg.data(), cols, c.used, static_cast<G*>(dgg.data()), threads);
  expect_close(values(dbg), values(dbc), ulp_of(acc), 1e-12, ln ? "dbeta (LN)" : "bias_grad");
  if (ln) expect_close(values(dgg), values(dgc), ulp_of(acc), 1e-12, "dgamma (LN)");

  std::vector<Tensor> starts = {tensor_of({cols}, b0, acc)};
  if (ln) starts.push_back(tensor_of({cols}, g0, acc));
  expect_folded<G>(
      starts, cols, c,
      [&](double* partial, const dk::ColumnFold<G>& fold) {
        emu_launch(dim3{static_cast<unsigned>(c.col_blocks), static_cast<unsigned>(c.used), 1}, threads, 0, [&] {
          if (ln)
            dk::column_partial_packed_kernel<S, true>(raw<S>(dyg), raw<S>(xg), mean.host_data<float>(),
                                                      rstd.host_data<float>(), rows, cols, c.per_chunk, partial,
                                                      partial + c.used * cols, fold);
          else
            dk::column_partial_packed_kernel<S, false>(raw<S>(dyg), nullptr, nullptr, nullptr, rows, cols, c.per_chunk,
                                                       partial, nullptr, fold);
        });
      },
      ln ? "dbeta, dgamma finished in the kernel (the finish kernel's bits)"
         : "bias_grad finished in the kernel (the finish kernel's bits)");
}

// kNoBias: y holds the bias (fc1's GEMM epilogue wrote it); the kernel gets a
// null bias and the CPU an undefined one.
template <DType T, bool kNoBias = false>
void bias_gelu(std::mt19937& rng, Shape2 sh, unsigned threads) {
  using S = typename Storage<T>::type;
  const i64 rows = sh.rows, cols = sh.cols, V = dk::kVec<S>;
  const auto c = gs::packed_column_chunks(rows, cols, V);
  const auto yv = randn(static_cast<std::size_t>(rows * cols), rng, 2.0), dv = randn(yv.size(), rng),
             bv = randn(static_cast<std::size_t>(cols), rng), d0 = randn(static_cast<std::size_t>(cols), rng);
  const Tensor y = tensor_of({rows, cols}, yv, T), bias = tensor_of({cols}, bv, T);
  // The CPU, dx over dy.
  Tensor dxc = tensor_of({rows, cols}, dv, T), dbc = tensor_of({cols}, d0, DType::F32);
  kernels::bias_gelu_backward(dxc, y, kNoBias ? Tensor() : bias, dxc, dbc);
  // The emulated GPU, dx over dy too.
  Tensor dxg = tensor_of({rows, cols}, dv, T), dbg = tensor_of({cols}, d0, DType::F32);
  std::vector<double> partial(static_cast<std::size_t>(c.used * cols), -1e300);
  Tensor yg = y.clone(MemoryCategory::Other), bg = bias.clone(MemoryCategory::Other);
  emu_launch(dim3{static_cast<unsigned>(c.col_blocks), static_cast<unsigned>(c.used), 1}, threads, 0, [&] {
    dk::bias_gelu_backward_packed_kernel<S>(raw<S>(dxg), raw<S>(yg), kNoBias ? nullptr : raw<S>(bg), raw<S>(dxg), rows,
                                            cols, c.per_chunk, partial.data());
  });
  finish<float>(partial.data(), cols, c.used, dbg.host_data<float>(), threads);
  // Near saturation gelu' cancels (1 + tanh): gelu'(x) ~ (1 + t)(0.5 + 0.5 x
  // (1 - t) du), ~17 (1 + t) at x = -5, where a float tanh may round to -1
  // on one side only. So the absolute error of either float formula is up to
  // ~10 fp32 ulps of 1 times |dy|: an indexing slip is O(1).
  double dy_max = 1;
  for (const double d : dv) dy_max = std::max(dy_max, std::fabs(d));
  expect_close(values(dxg), values(dxc), 2 * ulp_of(T), 16 * ulp_of(T) * dy_max, "bias_gelu dx");
  // dbias must be the sum of the dx this kernel wrote.
  Tensor dbw = tensor_of({cols}, d0, DType::F32);
  kernels::bias_grad(dxg, dbw);
  expect_close(values(dbg), values(dbw), ulp_of(DType::F32), 1e-12, "bias_gelu dbias (sums the written dx)");

  expect_folded<float>(
      {tensor_of({cols}, d0, DType::F32)}, cols, c,
      [&](double* partial_f, const dk::ColumnFold<float>& fold) {
        Tensor dxf = tensor_of({rows, cols}, dv, T);
        emu_launch(dim3{static_cast<unsigned>(c.col_blocks), static_cast<unsigned>(c.used), 1}, threads, 0, [&] {
          dk::bias_gelu_backward_packed_kernel<S>(raw<S>(dxf), raw<S>(yg), kNoBias ? nullptr : raw<S>(bg), raw<S>(dxf),
                                                  rows, cols, c.per_chunk, partial_f, fold);
        });
        expect_close(values(dxf), values(dxg), 0, 0, "bias_gelu dx, folded kernel (the same bits)");
      },
      "bias_gelu dbias finished in the kernel (the finish kernel's bits)");
}

template <DType T>
void all(std::mt19937& rng) {
  using S = typename Storage<T>::type;
  const i64 V = dk::kVec<S>;
  // Several chunks (of 50, 54 and 63 rows: not all multiples of 3 or 8
  // lanes); a second block column only partly inside the columns.
  const std::vector<Shape2> shapes = {{200, 4 * V}, {213, 40 * V}, {1000, 3 * V}};
  for (const Shape2& sh : shapes)
    for (const unsigned threads : {32u, 96u, 256u}) {
      sums<T, float>(rng, sh, false, DType::F32, threads);
      sums<T, float>(rng, sh, true, DType::F32, threads);
      sums<T, S>(rng, sh, true, T, threads);
      bias_gelu<T>(rng, sh, threads);
      bias_gelu<T, true>(rng, sh, threads);
    }
}

// column_finish_kernel's contract, bit for bit: lane l adds chunks l, l +
// lanes, ... in order, the lanes are added in lane order, then dst once. The
// partials span 2^-30..2^30, so another order or a chunk read twice or not at
// all changes the double sum; counts below, at and past the kernel's batch of
// loads and its multiples, on 1, 3 and 8 lanes, and a tile partly outside.
void finish_order(std::mt19937& rng) {
  std::uniform_real_distribution<double> mant(1, 2);
  std::uniform_int_distribution<int> expo(-30, 30), sign(0, 1);
  const i64 cols = 37;
  for (const i64 chunks : {1, 2, 7, 8, 9, 16, 23, 64, 67, 133, 256})
    for (const unsigned threads : {32u, 96u, 256u}) {
      const int lanes = static_cast<int>(threads / dk::kTileGroups);
      std::vector<double> partial(static_cast<std::size_t>(chunks * cols)), dst(static_cast<std::size_t>(cols));
      for (auto& v : partial) v = (sign(rng) ? -1 : 1) * std::ldexp(mant(rng), expo(rng));
      for (auto& v : dst) v = mant(rng);
      std::vector<double> want = dst;
      for (i64 c = 0; c < cols; ++c) {
        double total = 0;
        for (int l = 0; l < lanes; ++l) {
          double lane = 0;
          for (i64 k = l; k < chunks; k += lanes) lane += partial[static_cast<std::size_t>(k * cols + c)];
          total = l == 0 ? lane : total + lane;
        }
        want[static_cast<std::size_t>(c)] += total;
      }
      if (lanes == dk::kRowLanes) {  // the folded finish: one thread a column, kThreads' lanes
        std::vector<double> alone = dst;
        for (i64 c = 0; c < cols; ++c) dk::finish_column_alone<double>(cols, chunks, partial.data(), c, alone.data());
        for (i64 c = 0; c < cols; ++c)
          check(alone[static_cast<std::size_t>(c)] == want[static_cast<std::size_t>(c)],
                "finish_column_alone: the finish kernel's lane-order sums, bit for bit",
                alone[static_cast<std::size_t>(c)], want[static_cast<std::size_t>(c)], static_cast<std::size_t>(c));
      }
      finish<double>(partial.data(), cols, chunks, dst.data(), threads);
      for (i64 c = 0; c < cols; ++c)
        check(dst[static_cast<std::size_t>(c)] == want[static_cast<std::size_t>(c)],
              "column_finish_kernel: the lane-order sums, bit for bit", dst[static_cast<std::size_t>(c)],
              want[static_cast<std::size_t>(c)], static_cast<std::size_t>(c));
    }
}

// column_finish_many_kernel: two or three sums whose partials lie back to
// back, each finished as column_finish_kernel finishes it alone, bit for bit
// (a sum taken from the wrong slice of partials, or written to the wrong
// target, differs at every column).
void finish_many(std::mt19937& rng) {
  std::uniform_real_distribution<double> mant(1, 2);
  std::uniform_int_distribution<int> expo(-30, 30), sign(0, 1);
  const i64 cols = 45;
  for (const int n : {2, 3})
    for (const i64 chunks : {1, 9, 64}) {
      std::vector<double> partial(static_cast<std::size_t>(n * chunks * cols));
      for (auto& v : partial) v = (sign(rng) ? -1 : 1) * std::ldexp(mant(rng), expo(rng));
      std::vector<std::vector<double>> got(static_cast<std::size_t>(n)), want(got.size());
      dk::FinishTargets<double> targets;
      for (int y = 0; y < n; ++y) {
        auto& g = got[static_cast<std::size_t>(y)];
        g.resize(static_cast<std::size_t>(cols));
        for (auto& v : g) v = mant(rng);
        want[static_cast<std::size_t>(y)] = g;
        targets.dst[y] = g.data();
        const double* mine = partial.data() + y * chunks * cols;
        emu_launch(dim3{dk::finish_blocks(cols), 1, 1}, 256, 0, [&] {
          dk::column_finish_kernel<double>(cols, chunks, mine, want[static_cast<std::size_t>(y)].data());
        });
      }
      emu_launch(dim3{dk::finish_blocks(cols), static_cast<unsigned>(n), 1}, 256, 0,
                 [&] { dk::column_finish_many_kernel<double>(cols, chunks, partial.data(), targets); });
      for (int y = 0; y < n; ++y)
        for (i64 c = 0; c < cols; ++c) {
          const double a = got[static_cast<std::size_t>(y)][static_cast<std::size_t>(c)],
                       b = want[static_cast<std::size_t>(y)][static_cast<std::size_t>(c)];
          check(a == b, "column_finish_many_kernel: each sum as column_finish_kernel's", a, b,
                static_cast<std::size_t>(y * cols + c));
        }
    }
}

}  // namespace

int main() {
  std::mt19937 rng(2026);
  finish_order(rng);
  finish_many(rng);
  all<DType::F32>(rng);
  all<DType::BF16>(rng);
  all<DType::F16>(rng);
  if (failures) {
    std::printf("column_sums_emulated: %d checks failed\n", failures);
    return 1;
  }
  std::printf(
      "column_sums_emulated: the tiled column sums (bias, LayerNorm dgamma/dbeta, finish) and the packed bias-GeLU "
      "backward match the CPU (fp32, bf16, fp16; 1, 3, 8 row lanes)\n");
  return 0;
}
