// The CUDA kernels of RMSNorm, SwiGLU and the rotary embedding
// (megazero/cuda/{rmsnorm,swiglu,rope}_kernels.cuh), run on the CPU through
// the emulation in shim/ against the CPU kernels of megazero/kernels/
// {rmsnorm,swiglu,rope}.h on the same inputs: fp32, bf16 and fp16; RMSNorm
// with rows striding over a grid smaller than the row count, dgamma over one
// chunk of rows (straight into the accumulator) and over several (partial
// sums, then the shared finish kernel of column_tiles.cuh), fp32 and 16-bit
// accumulators, the residual gradient, dx written over dy; SwiGLU with
// saturated gates and a grid of fewer rows than the tensor; RoPE with heads
// over two shared-memory tiles, positions and blocks striding over the grid,
// the backward in place. The launchers (rmsnorm.cu, swiglu.cu, rope.cu) only
// size grids and run on a GPU (test_rmsnorm_kernels & co. with
// MEGAZERO_TEST_DEVICE=cuda). Exit code 1 on any difference beyond the
// documented rounding (the shim rounds a double result to 16 bits through
// fp32, one 16-bit step either way; its exp is libm's double one).
#include <cstdio>
#include <random>
#include <vector>

#include "emu_checks.h"
#include "emu_runtime.h"
#include "megazero/cuda/rmsnorm_kernels.cuh"
#include "megazero/cuda/rope_kernels.cuh"
#include "megazero/cuda/swiglu_kernels.cuh"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/rmsnorm.h"
#include "megazero/kernels/rope.h"
#include "megazero/kernels/swiglu.h"

using namespace megazero;
namespace dk = megazero::cuda::detail_k;
namespace gs = megazero::kernels::gpu_scratch;

namespace {

using namespace emu_checks;

// dgamma += column sums, as rmsnorm.cu's launcher runs them: direct with one
// chunk of rows, else partial sums per chunk and the finish kernel.
template <typename S, typename G>
void emu_dgamma(Tensor& dy, Tensor& x, Tensor& rstd, Tensor& dgamma, i64 rows, i64 cols) {
  const auto ch = gs::column_chunks(rows, cols);
  const unsigned col_blocks = static_cast<unsigned>(ch.col_blocks), threads = static_cast<unsigned>(gs::kThreads);
  const float* rs = rstd.host_data<float>();
  G* dg = raw<G>(dgamma);
  if (ch.used == 1) {
    emu_launch(dim3{col_blocks, 1, 1}, threads, 0,
               [&] { dk::rmsnorm_dgamma_direct_kernel<S, float, G>(raw<S>(dy), raw<S>(x), rs, rows, cols, dg); });
    return;
  }
  std::vector<double> partial(static_cast<std::size_t>(ch.used * cols), -1e300);  // every slot written
  emu_launch(dim3{col_blocks, static_cast<unsigned>(ch.used), 1}, threads, 0, [&] {
    dk::rmsnorm_dgamma_partial_kernel<S, float>(raw<S>(dy), raw<S>(x), rs, rows, cols, ch.per_chunk, partial.data());
  });
  emu_launch(dim3{dk::finish_blocks(cols), 1, 1}, threads, 0,
             [&] { dk::column_finish_kernel<G>(cols, ch.used, partial.data(), dg); });
}

template <DType T>
void rmsnorm(std::mt19937& rng, i64 rows, i64 cols, DType acc) {
  using S = typename Storage<T>::type;
  const auto xv = randn(static_cast<std::size_t>(rows * cols), rng, 2.0),
             gv = randn(static_cast<std::size_t>(cols), rng);
  const auto wv = randn(xv.size(), rng), av = randn(xv.size(), rng), dg0 = randn(gv.size(), rng);
  const double eps = 1e-5;
  Tensor x = tensor_of({rows, cols}, xv, T), gamma = tensor_of({cols}, gv, T);
  auto stats = [&] { return Tensor::zeros(cpu(), {rows}, DType::F32, MemoryCategory::Other); };

  // Forward: the CPU kernel, and the emulated one (7 blocks stride over the rows).
  Tensor yc = tensor_of({rows, cols}, xv, T), rc = stats();
  kernels::rmsnorm_forward(x, gamma, eps, yc, rc);
  Tensor yg = tensor_of({rows, cols}, xv, T), rg = stats();  // y over a copy of x: in place
  emu_launch(dim3{7, 1, 1}, 64, 0, [&] {
    dk::rmsnorm_forward_kernel<S, float>(raw<S>(yg), raw<S>(gamma), eps, raw<S>(yg), rg.host_data<float>(), rows, cols);
  });
  expect_close(values(rg), values(rc), 0x1p-23, 0, "rstd (double sums in another order, fp32)");
  expect_close(values(yg), values(yc), ulp_of(T), 1e-7, "y (in place)");

  // Backward with the residual gradient, dx over dy, dgamma into `acc`.
  const Tensor dy = tensor_of({rows, cols}, wv, T), add = tensor_of({rows, cols}, av, T);
  Tensor dxc = tensor_of({rows, cols}, wv, T), dgc = tensor_of({cols}, dg0, acc);
  kernels::rmsnorm_backward(dy, x, gamma, rc, dxc, dgc, &add);
  Tensor dxg = tensor_of({rows, cols}, wv, T), dgg = tensor_of({cols}, dg0, acc),
         addg = add.clone(MemoryCategory::Other);
  if (acc == DType::F32)
    emu_dgamma<S, float>(dxg, x, rc, dgg, rows, cols);
  else
    emu_dgamma<S, S>(dxg, x, rc, dgg, rows, cols);
  emu_launch(dim3{5, 1, 1}, 128, 0, [&] {
    dk::rmsnorm_backward_dx_kernel<S, float>(raw<S>(dxg), raw<S>(x), raw<S>(gamma), rc.host_data<float>(), raw<S>(dxg),
                                             raw<S>(addg), rows, cols);
  });
  expect_close(values(dxg), values(dxc), ulp_of(T), 1e-6, "dx (with add_to_dx, over dy)");
  expect_close(values(dgg), values(dgc), ulp_of(acc), 1e-9, "dgamma (+= column sums)");
}

template <DType T>
void swiglu(std::mt19937& rng) {
  using S = typename Storage<T>::type;
  const i64 rows = 7, f = 45;
  auto xv = randn(static_cast<std::size_t>(rows * 2 * f), rng, 2.0);
  const double extreme[] = {-1000.0, -120.0, -30.0, 30.0, 120.0, 1000.0, 0.0, -1.2785};
  for (std::size_t k = 0; k < std::size(extreme); ++k) xv[k] = extreme[k];
  const auto dyv = randn(static_cast<std::size_t>(rows * f), rng);
  Tensor x = tensor_of({rows, 2 * f}, xv, T), dy = tensor_of({rows, f}, dyv, T);
  Tensor yc = tensor_of({rows, f}, dyv, T), yg = tensor_of({rows, f}, dyv, T);
  kernels::swiglu_forward(x, yc);
  const dim3 grid{2, 3, 1};  // 2 x 32 columns cover f = 45; 3 block rows stride over 7
  emu_launch(grid, 32, 0, [&] { dk::swiglu_forward_kernel<S>(raw<S>(x), raw<S>(yg), rows, f); });
  expect_close(values(yg), values(yc), 2 * ulp_of(T), 1e-7, "swiglu y");
  Tensor dxc = tensor_of({rows, 2 * f}, xv, T), dxg = tensor_of({rows, 2 * f}, xv, T);
  kernels::swiglu_backward(dy, x, dxc);
  emu_launch(grid, 32, 0, [&] { dk::swiglu_backward_kernel<S>(raw<S>(dy), raw<S>(x), raw<S>(dxg), rows, f); });
  expect_close(values(dxg), values(dxc), 2 * ulp_of(T), 1e-6, "swiglu dx");
}

// The CPU's cos/sin/pow are the emulation's libm: the same bits.
template <DType T>
void rope(std::mt19937& rng, bool backward, i64 first = 0) {
  using S = typename Storage<T>::type;
  const i64 n = 5, seq = 9, d = 520;  // 260 pairs: two of the kernel's 256-pair tiles
  const double base = 10000.0;
  const auto xv = randn(static_cast<std::size_t>(n * seq * d), rng);
  const Tensor x = tensor_of({n, seq, d}, xv, T);
  Tensor yc = tensor_of({n, seq, d}, xv, T), yg = tensor_of({n, seq, d}, xv, T);
  if (backward)
    kernels::rope_backward(x, base, yc, first);
  else
    kernels::rope_forward(x, base, yc, first);
  const i64 per_block = 2;                // blocks {0, 1}, {2, 3}, {4}
  emu_launch(dim3{4, 3, 1}, 64, 0, [&] {  // 4 position blocks stride over 9 positions
    if (backward)
      dk::rope_kernel<S, true>(raw<S>(yg), base, raw<S>(yg), n, seq, d, per_block, first, nullptr, 3, 1.0, false, 0.0);
    else
      dk::rope_kernel<S, false>(raw<S>(yg), base, raw<S>(yg), n, seq, d, per_block, first, nullptr, 3, 1.0, false, 0.0);
  });
  expect_close(values(yg), values(yc), 0, 0, backward ? "rope backward (in place)" : "rope forward (in place)");
}

}  // namespace

int main() {
  std::mt19937 rng(2026);
  rmsnorm<DType::F32>(rng, 20, 70, DType::F32);     // one chunk of rows: dgamma added directly
  rmsnorm<DType::F32>(rng, 100, 70, DType::F32);    // 4 chunks: partial sums and the finish pass
  rmsnorm<DType::BF16>(rng, 100, 300, DType::F32);  // two block columns
  rmsnorm<DType::BF16>(rng, 40, 33, DType::BF16);
  rmsnorm<DType::F16>(rng, 100, 70, DType::F32);
  rmsnorm<DType::F16>(rng, 20, 70, DType::F16);
  swiglu<DType::F32>(rng);
  swiglu<DType::BF16>(rng);
  swiglu<DType::F16>(rng);
  for (bool backward : {false, true}) {
    rope<DType::F32>(rng, backward);
    rope<DType::BF16>(rng, backward);
    rope<DType::F16>(rng, backward);
    rope<DType::F32>(rng, backward, 1000);  // rows from position 1000 (a key/value cache's decode)
    rope<DType::BF16>(rng, backward, 7);
  }
  if (failures) {
    std::printf("llama_kernels_emulated: %d checks failed\n", failures);
    return 1;
  }
  std::printf("llama_kernels_emulated: RMSNorm, SwiGLU and RoPE (fp32, bf16, fp16) match the CPU kernels\n");
  return 0;
}
