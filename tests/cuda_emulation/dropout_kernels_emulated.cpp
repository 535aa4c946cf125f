// megazero/cuda/dropout_kernels.cuh (the dropout backward with the bias
// gradient in the same pass), run on the CPU through the emulation in shim/
// against the CPU's dropout_backward then bias_grad on the same inputs: fp32,
// bf16 and fp16 with fp32 bias accumulators; layouts whose rows are not a
// multiple of 4 long (a Philox block split between threads and rows) or
// shorter than a tensor row (a thread's four columns cross a layout row), with
// offsets (sample_offset, group_offset of global_groups) as a TP or DP split has them; p = 0; several row
// chunks; dx written over dy. The finish pass (column_finish_kernel in
// column_sums.cuh: the chunks added in order, in double, rounded once) is
// done here the same way. dx must be the CPU's bit for bit, dbias within one
// fp32 rounding. Exit code 1 on any difference beyond that.
#include <cstdio>
#include <random>
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

template <DType T>
void dropout_bias_grad(std::mt19937& rng, const Case& c) {
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

  // The emulated GPU, dx written over dy; 32 threads a block (the kernel reads blockDim).
  Tensor g = tensor_of({rows, c.cols}, dv, T);
  const auto ch = gs::dropout_column_chunks(rows, c.cols);
  const unsigned threads = 32;
  const unsigned col_blocks =
      static_cast<unsigned>((c.cols + gs::kDropoutColumns * threads - 1) / (gs::kDropoutColumns * threads));
  std::vector<double> partial(gs::dropout_bias_grad_bytes(rows, c.cols) / sizeof(double), 0.0);
  emu_launch(dim3{col_blocks, static_cast<unsigned>(ch.used), 1}, threads, 0, [&] {
    dk::dropout_backward_partial_kernel<S>(raw<S>(g), c.p, dk::philox_key(key), c.l, rows, c.cols, ch.per_chunk,
                                           raw<S>(g), partial.data());
  });
  std::vector<double> dbg(bv.size());
  for (i64 col = 0; col < c.cols; ++col) {
    double acc = 0;
    for (i64 k = 0; k < ch.used; ++k) acc += partial[static_cast<std::size_t>(k * c.cols + col)];
    dbg[static_cast<std::size_t>(col)] =
        static_cast<float>(static_cast<double>(static_cast<float>(bv[static_cast<std::size_t>(col)])) + acc);
  }
  expect_close(values(g), values(dxc), 0, 0, "dx (the CPU's mask and rounding: bit for bit)");
  expect_close(dbg, values(dbc), 0x1p-23, 1e-30, "dbias (double sums, one fp32 rounding)");
}

}  // namespace

int main() {
  std::mt19937 rng(2026);
  const std::vector<Case> cases = {
      {{3, 1, 5, 6, 0, 0, 1}, 6, 0.1},      // hidden dropout: [micro-batch, 1, seq, hidden]
      {{3, 1, 5, 7, 2, 0, 1}, 7, 0.3},      // rows of 35: Philox blocks straddle rows and threads
      {{2, 3, 2, 5, 1, 2, 7}, 10, 0.5},     // offsets of a split (sample and group offsets)
      {{4, 1, 64, 33, 0, 0, 1}, 33, 0.1},   // 256 rows: several row chunks
      {{2, 1, 8, 40, 0, 0, 1}, 40, 0.0},    // p = 0: a copy and the sum
      {{1, 1, 3, 300, 0, 0, 1}, 300, 0.2},  // several column blocks
      {{6, 2, 1, 5, 1, 3, 9}, 10, 0.4},     // layout rows of 5 inside tensor rows of 10: a thread's columns cross one
  };
  for (const Case& c : cases) {
    dropout_bias_grad<DType::F32>(rng, c);
    dropout_bias_grad<DType::BF16>(rng, c);
    dropout_bias_grad<DType::F16>(rng, c);
  }
  if (failures) {
    std::printf("dropout_kernels_emulated: %d checks failed\n", failures);
    return 1;
  }
  std::printf(
      "dropout_kernels_emulated: the fused dropout backward and bias gradient match the CPU (%zu layouts, "
      "fp32, bf16, fp16)\n",
      cases.size());
  return 0;
}
