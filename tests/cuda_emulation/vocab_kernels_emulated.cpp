// megazero/cuda/vocab_kernels.cuh's kernels (the vocabulary-parallel
// cross-entropy and the embedding gradient), run on the CPU through the
// emulation in shim/ against the CPU kernels of megazero/kernels/cross_entropy.h
// and embedding.h
// on the same inputs: fp32, bf16 and fp16; padding columns; a rank whose slice
// is all padding; targets on and off this rank's slice; a TP rescale (global
// max above the local one); the backward in place; embedding ids repeated,
// outside the slice, and all one row (a run of 300 tokens). CUB's radix
// sort, which the launcher runs between the two embedding kernels, is stood in
// for by std::stable_sort (the same contract: stable, by key).
// Exit code 1 on any difference beyond the documented rounding.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "emu_checks.h"
#include "emu_runtime.h"
#include "megazero/cuda/vocab_kernels.cuh"
#include "megazero/kernels/cross_entropy.h"
#include "megazero/kernels/embedding.h"

using namespace megazero;
using megazero::cuda::detail_k::i64;
namespace dk = megazero::cuda::detail_k;

namespace {

using namespace emu_checks;

// valid < cols: padding columns; valid == 0: a rank whose slice is all padding.
// Packed: the kernels as the launcher runs them on whole aligned 16-byte
// packs (cols 48; the padding starts inside a pack), else element by element.
// wide > 0: rows of `wide` columns on 32 threads, several packs a thread, so
// each thread's running max rises and its sum is rescaled on the way.
template <DType T, bool Packed>
void cross_entropy(std::mt19937& rng, i64 valid = 41, i64 wide = 0) {
  using S = typename Storage<T>::type;
  constexpr int V = Packed ? dk::kVec<S> : 1;
  const i64 n = 7, cols = wide > 0 ? wide : Packed ? 48 : 45, start = 100;
  const unsigned threads = wide > 0 ? 32 : 64;
  std::uniform_real_distribution<double> u(-6, 6);
  std::vector<double> lv(static_cast<std::size_t>(n * cols));
  for (auto& x : lv) x = u(rng);
  std::vector<std::int64_t> tv;
  for (i64 r = 0; r < n; ++r)  // some held elsewhere
    tv.push_back(r % 3 == 0 || valid == 0 ? 7 : start + (r * 13) % valid);
  const Tensor targets = ids_of(tv);
  const auto* tp = targets.host_data<std::int64_t>();
  auto stats = [&] { return Tensor::zeros(cpu(), {n}, DType::F32, MemoryCategory::Other); };
  const unsigned blocks = static_cast<unsigned>(n);

  // Forward: the CPU kernel, and the emulated GPU kernel on a copy of the same logits.
  Tensor lc = tensor_of({n, cols}, lv, T), mc = stats(), sc = stats(), tc = stats();
  kernels::cross_entropy_forward(lc, targets, start, valid, mc, sc, tc);
  Tensor lg = tensor_of({n, cols}, lv, T), mg = stats(), sg = stats(), tg = stats();
  const auto before = values(lg);
  emu_launch(dim3{blocks, 1, 1}, threads, 0, [&] {
    dk::cross_entropy_forward_kernel<S, V>(raw<S>(lg), tp, start, cols, valid, mg.host_data<float>(),
                                           sg.host_data<float>(), tg.host_data<float>());
  });
  expect_close(values(mg), values(mc), 0, 0, "row max (exact)");
  expect_close(values(tg), values(tc), 0, 0, "target logit (exact; 0 off the slice)");
  expect_close(values(sg), values(sc), 1e-6, 0, "sum of exponentials (running, rescaled)");
  expect_close(values(lg), before, 0, 0, "logits left as they were");

  // Backward in place, as if another rank's max were larger (the TP rescale).
  Tensor gmax = stats();
  for (i64 r = 0; r < n; ++r) gmax.host_data<float>()[r] = mc.host_data<float>()[r] + 0.75f * static_cast<float>(r % 2);
  kernels::rescale_sum_exp(mc, gmax, sc);
  Tensor sg2 = sc.clone(MemoryCategory::Other);
  kernels::cross_entropy_backward(lc, gmax, sc, targets, start, valid, 0.25, lc);
  emu_launch(dim3{blocks, 1, 1}, threads, 0, [&] {
    dk::cross_entropy_backward_kernel<S, V>(raw<S>(lg), gmax.host_data<float>(), sg2.host_data<float>(), tp, start,
                                            cols, valid, 0.25, nullptr, raw<S>(lg));
  });
  const auto want = values(lc);
  expect_close(values(lg), want, 2 * ulp_of(T), 1e-7, "dlogits in place");
  for (i64 r = 0; r < n; ++r)
    for (i64 c = valid; c < cols; ++c)
      check(values(lg)[static_cast<std::size_t>(r * cols + c)] == 0.0, "padding gradient", values(lg)[0], 0, c);

  // One TP rank: the fused kernel (the row kept in shared memory, cols *
  // sizeof(S) bytes: the launch gives exactly that, so a read past it
  // faults) against the two kernels with global_max = the row's max, bit for
  // bit: in place, and into another tensor (the logits left as they were).
  Tensor lu = tensor_of({n, cols}, lv, T), mu = stats(), su = stats(), tu = stats();
  emu_launch(dim3{blocks, 1, 1}, threads, 0, [&] {
    dk::cross_entropy_forward_kernel<S, V>(raw<S>(lu), tp, start, cols, valid, mu.host_data<float>(),
                                           su.host_data<float>(), tu.host_data<float>());
  });
  emu_launch(dim3{blocks, 1, 1}, threads, 0, [&] {
    dk::cross_entropy_backward_kernel<S, V>(raw<S>(lu), mu.host_data<float>(), su.host_data<float>(), tp, start, cols,
                                            valid, 0.375, nullptr, raw<S>(lu));
  });
  const std::size_t smem = static_cast<std::size_t>(cols) * sizeof(S);
  for (const bool in_place : {true, false}) {
    Tensor lf = tensor_of({n, cols}, lv, T), df = tensor_of({n, cols}, std::vector<double>(lv.size(), 7.0), T);
    Tensor mf = stats(), sf = stats(), tf = stats();
    Tensor& out = in_place ? lf : df;
    emu_launch(dim3{blocks, 1, 1}, threads, smem, [&] {
      dk::cross_entropy_fused_kernel<S, V>(raw<S>(lf), tp, start, cols, valid, 0.375, nullptr, mf.host_data<float>(),
                                           sf.host_data<float>(), tf.host_data<float>(), raw<S>(out));
    });
    const char* how = in_place ? "fused, in place" : "fused, into another tensor";
    expect_close(values(mf), values(mu), 0, 0, how);
    expect_close(values(sf), values(su), 0, 0, how);
    expect_close(values(tf), values(tu), 0, 0, how);
    expect_close(values(out), values(lu), 0, 0, how);
    if (!in_place) expect_close(values(lf), before, 0, 0, "fused: logits left as they were");
  }
}

// Ids in [lo, hi]; the slice holds rows [20, 57). lo == hi: one long run.
template <DType T>
void embedding(std::mt19937& rng, int lo = 0, int hi = 79, i64 h = 24) {
  using S = typename Storage<T>::type;
  const i64 n = 300, v = 37, start = 20;
  std::uniform_int_distribution<int> id(lo, hi);
  std::vector<std::int64_t> iv(static_cast<std::size_t>(n));
  for (auto& x : iv) x = id(rng);
  const Tensor ids = ids_of(iv);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> gv(static_cast<std::size_t>(n * h)), tv(static_cast<std::size_t>(v * h));
  for (auto& x : gv) x = u(rng);
  for (auto& x : tv) x = u(rng);
  const Tensor dout = tensor_of({n, h}, gv, T);
  Tensor dc = tensor_of({v, h}, tv, DType::F32), dg = tensor_of({v, h}, tv, DType::F32);  // fp32 accumulators
  kernels::embedding_backward(ids, dout, start, dc);

  std::vector<int> keys_in(static_cast<std::size_t>(n)), tokens_in(static_cast<std::size_t>(n));
  emu_launch(dim3{2, 1, 1}, 64, 0, [&] {  // 2 blocks x 64 threads < n: the grid-stride loop covers the rest
    dk::embedding_keys_kernel(ids.host_data<std::int64_t>(), start, v, n, keys_in.data(), tokens_in.data());
  });
  // CUB's stable radix sort of (key, token) pairs, stood in for.
  std::vector<std::size_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return keys_in[a] < keys_in[b]; });
  std::vector<int> keys, tokens;
  for (auto i : order) keys.push_back(keys_in[i]), tokens.push_back(tokens_in[i]);
  // 32 threads a block: tiles of 128 columns, gridDim.y of them across a row (h = 300: three, the last part-empty).
  const unsigned tiles =
      static_cast<unsigned>((h + 32 * dk::kEmbeddingColumnsPerThread - 1) / (32 * dk::kEmbeddingColumnsPerThread));
  emu_launch(dim3{static_cast<unsigned>(n), tiles, 1}, 32, 0, [&] {
    dk::embedding_backward_runs_kernel<S, float>(static_cast<const S*>(dout.data()), keys.data(), tokens.data(), n, v,
                                                 h, dg.host_data<float>());
  });
  expect_close(values(dg), values(dc), 0, 0, "embedding gradient (the CPU's order: bit for bit)");
}

}  // namespace

int main() {
  std::mt19937 rng(2026);
  cross_entropy<DType::F32, false>(rng);
  cross_entropy<DType::BF16, false>(rng);
  cross_entropy<DType::F16, false>(rng);
  cross_entropy<DType::BF16, false>(rng, 0);  // this rank holds only padding
  cross_entropy<DType::F32, true>(rng);
  cross_entropy<DType::BF16, true>(rng);
  cross_entropy<DType::F16, true>(rng);
  cross_entropy<DType::BF16, true>(rng, 0);
  cross_entropy<DType::BF16, true>(rng, 1270, 32 * 8 * 5);  // 5 packs a thread, padding in the last
  cross_entropy<DType::F32, true>(rng, 637, 32 * 4 * 5);
  cross_entropy<DType::F16, false>(rng, 290, 300);
  embedding<DType::F32>(rng);
  embedding<DType::BF16>(rng);
  embedding<DType::F32>(rng, 33, 33);       // every token the same row: a run of 300
  embedding<DType::BF16>(rng, 0, 79, 300);  // rows wider than a tile of columns
  embedding<DType::F32>(rng, 30, 33, 300);  // long runs, several tiles
  if (failures) {
    std::printf("vocab_kernels_emulated: %d checks failed\n", failures);
    return 1;
  }
  std::printf(
      "vocab_kernels_emulated: cross-entropy (fp32, bf16, fp16; packed and element by element) and the embedding "
      "gradient match the CPU\n");
  return 0;
}
