// megazero/cuda/optimizer_kernels.cuh (AdamW and the gradient norm's sum of
// squares over many segments in one launch), run on the CPU through the
// emulation in shim/, with the tables its segment_tables/range_tables build
// for the launcher:
// - the table builder: empty segments dropped, adjacent ones of the same decay
//   merged, lists cut into tables of kSegmentTableCapacity;
// - AdamW over ~800 shuffled segments (more than two tables after merging;
//   empty ones, gaps no segment covers, both decays) against the CPU's
//   kernels::adamw on the same segments, fp32/bf16/fp16/fp64 gradients, two
//   steps: bit for bit (the same fp32 formula, kernels/adamw_formula.h; the
//   host compiler fuses nothing, -ffp-contract=off), gaps untouched; and with a params output
//   (fp32/bf16/fp16/fp64, poisoned first): the CPU kernel's params bit for
//   bit, which on the updated elements are the new master cast as
//   Tensor::copy_from casts it, and the poison left in the gaps;
// - the sum of squares over ~500 unordered, overlapping, partly empty ranges
//   (more than two tables): the kernel's block sums and the finish pass bit
//   for bit against the same additions done here in the kernel's order (which
//   proves every element is read once per range it lies in), and against the
//   CPU's kernels::sum_of_squares (another order) within 2 x terms x 2^-53 of
//   the sum, the bound of two orders of a sum of positive terms;
// - the same kernel counting zeros: the CPU's kernels::count_zeros and a
//   direct count, exactly.
// Exit code 1 on any difference beyond that.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "emu_checks.h"
#include "emu_runtime.h"
#include "megazero/cuda/optimizer_kernels.cuh"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/optimizer_kernels.h"

using namespace megazero;
namespace dk = megazero::cuda::detail_k;
namespace gs = megazero::kernels::gpu_scratch;

namespace {

using namespace emu_checks;

template <DType T>
struct EmuStorage {
  using type = typename Storage<T>::type;
};
template <>
struct EmuStorage<DType::F64> {
  using type = double;
};

void check_bits(const Tensor& got, const Tensor& want, const char* what) {
  check(got.nbytes() == want.nbytes() && std::memcmp(got.data(), want.data(), got.nbytes()) == 0, what, 0, 0, 0);
  if (got.nbytes() != want.nbytes()) return;
  const auto a = values(got), b = values(want);
  expect_close(a, b, 0, 0, what);  // names the first elements that differ
}

void table_builder() {
  using S = kernels::AdamSegment;
  auto t = dk::segment_tables({{0, 10, true}, {10, 20, true}, {20, 20, false}, {20, 30, false}, {40, 50, false}});
  check(t.size() == 1 && t[0].count == 3, "merged table count", static_cast<double>(t.empty() ? -1 : t[0].count), 3, 0);
  if (t.size() == 1 && t[0].count == 3) {
    check(t[0].end[0] == 20 && t[0].end[1] == 30 && t[0].end[2] == 40, "flat ends", static_cast<double>(t[0].end[2]),
          40, 0);
    check(t[0].offset[0] == 0 && t[0].offset[1] == 0 && t[0].offset[2] == 10, "offsets",
          static_cast<double>(t[0].offset[2]), 10, 0);
    check(t[0].decay[0] == 1u, "decay bits", t[0].decay[0], 1, 0);
  }
  check(dk::segment_tables({}).empty() && dk::segment_tables({{3, 3, true}}).empty(), "no table for nothing", 0, 0, 0);
  std::vector<S> many;
  for (int k = 0; k < 2 * dk::kTableCapacity + 1; ++k) many.push_back({2 * k, 2 * k + 1, k % 2 == 0});
  t = dk::segment_tables(many);
  check(t.size() == 3 && t[2].count == 1, "tables of 240", static_cast<double>(t.size()), 3, 0);
  check(static_cast<i64>(t.size()) <= gs::segment_table_chunks(static_cast<i64>(many.size())),
        "the scratch bound holds", static_cast<double>(t.size()), 0, 0);
  check(t.size() == 3 && t[1].offset[0] == 2 * dk::kTableCapacity && t[1].end[0] == 1, "a second table starts at 0", 0,
        0, 0);
}

// The emulated GPU's storage type of a params output, or NoParams for none.
template <DType P, bool kNone>
using ParamsStorage = std::conditional_t<kNone, dk::NoParams, typename EmuStorage<P>::type>;

// AdamW with gradients of T and, unless kNone, a params output of P.
template <DType T, DType P = DType::F32, bool kNone = true>
void adamw(std::mt19937& rng) {
  using G = typename EmuStorage<T>::type;
  using PS = ParamsStorage<P, kNone>;
  const i64 n = 120001;
  std::vector<kernels::AdamSegment> segs;
  std::uniform_int_distribution<int> len(0, 300), coin(0, 9);
  for (i64 at = 0; at < n;) {
    const i64 l = std::min<i64>(n - at, segs.size() == 50 ? 20000 : len(rng));
    segs.push_back({at, at + l, coin(rng) < 5});
    at += l + (coin(rng) < 2 ? 5 : 0);
  }
  std::shuffle(segs.begin(), segs.end(), rng);
  const auto tables = dk::segment_tables(segs);
  check(tables.size() >= 3, "AdamW: more than two tables", static_cast<double>(tables.size()), 3, 0);

  std::normal_distribution<double> normal;
  std::vector<double> w0(static_cast<std::size_t>(n)), m0(w0.size()), v0(w0.size()), g0(w0.size());
  for (std::size_t i = 0; i < w0.size(); ++i) {
    w0[i] = normal(rng);
    m0[i] = 0.01 * normal(rng);
    v0[i] = 1e-4 * std::fabs(normal(rng));
    g0[i] = 2 * normal(rng);
  }
  Tensor wc = tensor_of({n}, w0, DType::F32), mc = tensor_of({n}, m0, DType::F32), vc = tensor_of({n}, v0, DType::F32);
  Tensor wg = tensor_of({n}, w0, DType::F32), mg = tensor_of({n}, m0, DType::F32), vg = tensor_of({n}, v0, DType::F32);
  const Tensor g = tensor_of({n}, g0, T);
  // The params outputs start poisoned (768: exact in every dtype, far from any
  // weight), so an element the kernel should not write shows.
  constexpr double kPoison = 768.0;
  Tensor pc, pg;
  if constexpr (!kNone) {
    pc = tensor_of({n}, std::vector<double>(w0.size(), kPoison), P);
    pg = tensor_of({n}, std::vector<double>(w0.size(), kPoison), P);
  }
  PS* const pg_data = kNone ? nullptr : static_cast<PS*>(pg.data());
  kernels::AdamStep a{0.9, 0.95, 1e-8, 0.1, 3e-4, 0, 0, 0.5};
  for (int step = 1; step <= 2; ++step) {
    a.bc1 = 1 - std::pow(a.beta1, step);
    a.bc2 = 1 - std::pow(a.beta2, step);
    kernels::adamw(wc, mc, vc, g, segs, a, pc);
    // 3 blocks of 64 threads: each thread strides over ~470 flat indices per
    // table (in steps of kAdamUnroll runs of kAdamRun indices, 64 runs apart, the last step part
    // past the end), crossing many segments, some inside one step.
    for (const auto& t : tables)
      emu_launch(dim3{3, 1, 1}, 64, 0, [&] {
        dk::adamw_segments_kernel<G, PS>(wg.host_data<float>(), mg.host_data<float>(), vg.host_data<float>(),
                                         static_cast<const G*>(g.data()), pg_data, t, kernels::adam_coefficients(a));
      });
  }
  check_bits(wg, wc, "AdamW w (bit for bit)");
  check_bits(mg, mc, "AdamW exp_avg (bit for bit)");
  check_bits(vg, vc, "AdamW exp_avg_sq (bit for bit)");
  std::vector<bool> covered(static_cast<std::size_t>(n), false);
  for (const auto& s : segs)
    for (i64 i = s.begin; i < s.end; ++i) covered[static_cast<std::size_t>(i)] = true;
  const auto wv = values(wg);
  std::size_t gaps = 0;
  for (std::size_t i = 0; i < covered.size(); ++i)
    if (!covered[i]) {
      ++gaps;
      check(wv[i] == static_cast<double>(static_cast<float>(w0[i])), "AdamW: a gap is untouched", wv[i], w0[i], i);
    }
  check(gaps > 100, "AdamW: the list has gaps", static_cast<double>(gaps), 100, 0);
  if constexpr (!kNone) {
    // The GPU's params are the CPU kernel's bit for bit, and on the updated
    // elements the master cast as copy_from casts it (the old publish pass);
    // the gaps keep the poison.
    check_bits(pg, pc, "AdamW params (bit for bit)");
    const Tensor cast = wg.to(P, MemoryCategory::Other);
    const std::size_t bytes = dtype_size(P);
    const auto* got = static_cast<const unsigned char*>(pg.data());
    const auto* want = static_cast<const unsigned char*>(cast.data());
    const auto pv = values(pg), cv = values(cast);
    for (std::size_t i = 0; i < covered.size(); ++i) {
      if (covered[i])
        check(std::memcmp(got + i * bytes, want + i * bytes, bytes) == 0, "AdamW params = copy_from(master)", pv[i],
              cv[i], i);
      else
        check(pv[i] == kPoison, "AdamW params: a gap is untouched", pv[i], kPoison, i);
    }
  }
}

// block_sum's order: a shuffle-down tree in each warp, then the same tree over
// the warps' sums (zeros past the last warp).
double tree32(std::vector<double> v) {
  v.resize(32, 0.0);
  for (int o = 16; o > 0; o >>= 1)
    for (int l = 0; l + o < 32; ++l) v[static_cast<std::size_t>(l)] += v[static_cast<std::size_t>(l + o)];
  return v[0];
}

double block_sum_order(const std::vector<double>& per_thread) {
  std::vector<double> warps;
  for (std::size_t w = 0; w < per_thread.size(); w += 32)
    warps.push_back(tree32(std::vector<double>(per_thread.begin() + static_cast<std::ptrdiff_t>(w),
                                               per_thread.begin() + static_cast<std::ptrdiff_t>(w + 32))));
  return tree32(warps);
}

template <DType T>
void sum_of_squares(std::mt19937& rng) {
  using G = typename EmuStorage<T>::type;
  const i64 n = 70001;
  std::vector<std::pair<i64, i64>> ranges;
  std::uniform_int_distribution<i64> at(0, n - 1), len(0, 400);
  for (int k = 0; k < 520; ++k) {
    const i64 b = at(rng);
    ranges.emplace_back(b, k % 41 == 0 ? b : std::min(n, b + (k == 7 ? 30000 : len(rng))));
  }
  std::normal_distribution<double> normal;
  std::vector<double> g0(static_cast<std::size_t>(n));
  for (auto& x : g0) x = 3 * normal(rng);
  const Tensor g = tensor_of({n}, g0, T);
  const auto gv = values(g);
  const auto tables = dk::range_tables(ranges);
  check(tables.size() >= 3, "sum of squares: more than two tables", static_cast<double>(tables.size()), 3, 0);
  check(static_cast<i64>(tables.size()) <= gs::segment_table_chunks(static_cast<i64>(ranges.size())),
        "the scratch bound holds", static_cast<double>(tables.size()), 0, 0);

  // The launcher's structure on a smaller grid: `blocks` partials per table, then one finishing block.
  const unsigned blocks = 5, threads = 64, finish_threads = 128;
  std::vector<double> partial(tables.size() * blocks, -1.0);
  for (std::size_t c = 0; c < tables.size(); ++c)
    emu_launch(dim3{blocks, 1, 1}, threads, 0, [&] {
      dk::sum_sq_segments_kernel<G>(static_cast<const G*>(g.data()), tables[c], partial.data() + c * blocks);
    });
  double got = -1;
  emu_launch(dim3{1, 1, 1}, finish_threads, 0,
             [&] { dk::sum_partials_kernel<double>(partial.data(), static_cast<i64>(partial.size()), &got); });

  // The same additions in the kernel's order, from the ranges (not the tables).
  std::vector<double> want_partial;
  std::int64_t terms = 0;
  for (std::size_t first = 0, c = 0; c < tables.size(); ++c) {
    // The table's ranges: non-empty ones, adjacent ones merged, kTableCapacity of those.
    std::vector<std::pair<i64, i64>> mine;
    for (; first < ranges.size(); ++first) {
      const auto [b, e] = ranges[first];
      if (b == e) continue;
      if (!mine.empty() && mine.back().second == b) {
        mine.back().second = e;
        continue;
      }
      if (mine.size() == static_cast<std::size_t>(dk::kTableCapacity)) break;
      mine.emplace_back(b, e);
    }
    std::vector<i64> flat;  // flat index -> element
    for (const auto& [b, e] : mine)
      for (i64 i = b; i < e; ++i) flat.push_back(i);
    terms += static_cast<std::int64_t>(flat.size());
    for (unsigned b = 0; b < blocks; ++b) {
      std::vector<double> acc(threads, 0.0);
      const std::size_t run = dk::kNormRun;
      for (unsigned t = 0; t < threads; ++t)
        for (std::size_t j0 = (b * threads + t) * run; j0 < flat.size(); j0 += blocks * threads * run)
          for (std::size_t j = j0; j < std::min(j0 + run, flat.size()); ++j) {
            const double x = gv[static_cast<std::size_t>(flat[j])];
            acc[t] += x * x;
          }
      want_partial.push_back(block_sum_order(acc));
    }
  }
  expect_close(partial, want_partial, 0, 0, "sum of squares: block sums in the kernel's order (bit for bit)");
  std::vector<double> acc(finish_threads, 0.0);
  for (std::size_t i = 0; i < want_partial.size(); ++i) acc[i % finish_threads] += want_partial[i];
  expect_close({got}, {block_sum_order(acc)}, 0, 0, "sum of squares: the finish pass (bit for bit)");

  Tensor out = tensor_of({1}, {0.0}, DType::F64);
  kernels::sum_of_squares(g, ranges, out);
  const double cpu = values(out)[0];
  expect_close({got}, {cpu}, 2.0 * static_cast<double>(terms) * 0x1p-53, 0,
               "sum of squares vs the CPU kernel (another order of positive terms)");

  double zero = -1;  // no ranges: the finish pass alone writes 0
  emu_launch(dim3{1, 1, 1}, 64, 0, [&] { dk::sum_partials_kernel<double>(partial.data(), 0, &zero); });
  check(zero == 0.0, "no ranges: zero", zero, 0, 0);
}

// The same kernel counting zeros (--log-num-zeros-in-grad): a third of the
// elements +0 or -0, ranges as above (overlapping ones count twice, the
// unaligned runs' slots past the end count nothing): the emulated launches'
// count is the CPU kernel's and a direct count over the ranges, exactly.
template <DType T>
void count_zeros(std::mt19937& rng) {
  using G = typename EmuStorage<T>::type;
  const i64 n = 50003;
  std::vector<std::pair<i64, i64>> ranges;
  std::uniform_int_distribution<i64> at(0, n - 1), len(0, 300);
  for (int k = 0; k < 480; ++k) {
    const i64 b = at(rng);
    ranges.emplace_back(b, k % 37 == 0 ? b : std::min(n, b + (k == 5 ? 20000 : len(rng))));
  }
  std::normal_distribution<double> normal;
  std::uniform_int_distribution<int> pick(0, 5);
  std::vector<double> g0(static_cast<std::size_t>(n));
  for (auto& x : g0) {
    const int c = pick(rng);
    x = c == 0 ? 0.0 : c == 1 ? -0.0 : normal(rng);
  }
  const Tensor g = tensor_of({n}, g0, T);
  const auto gv = values(g);
  double direct = 0;
  for (const auto& [b, e] : ranges)
    for (i64 i = b; i < e; ++i) direct += gv[static_cast<std::size_t>(i)] == 0;
  check(direct > 1000, "count zeros: the data has zeros", direct, 1000, 0);

  const auto tables = dk::range_tables(ranges);
  const unsigned blocks = 5, threads = 64;
  std::vector<double> partial(tables.size() * blocks, -1.0);
  for (std::size_t c = 0; c < tables.size(); ++c)
    emu_launch(dim3{blocks, 1, 1}, threads, 0, [&] {
      dk::sum_sq_segments_kernel<G, dk::RangeSum::Zeros>(static_cast<const G*>(g.data()), tables[c],
                                                         partial.data() + c * blocks);
    });
  double got = -1;
  emu_launch(dim3{1, 1, 1}, 128, 0,
             [&] { dk::sum_partials_kernel<double>(partial.data(), static_cast<i64>(partial.size()), &got); });
  Tensor out = tensor_of({1}, {-1.0}, DType::F64);
  kernels::count_zeros(g, ranges, out);
  expect_close({got}, {direct}, 0, 0, "count zeros: the emulated GPU's count is the direct count");
  expect_close({values(out)[0]}, {direct}, 0, 0, "count zeros: the CPU kernel's count is the direct count");
}

}  // namespace

int main() {
  std::mt19937 rng(2121);
  table_builder();
  adamw<DType::F32>(rng);
  adamw<DType::BF16>(rng);
  adamw<DType::F16>(rng);
  adamw<DType::F64>(rng);
  // With the params output (ZeRO's publish in the same pass): every output
  // dtype, and every gradient dtype with the 16-bit ones.
  adamw<DType::BF16, DType::BF16, false>(rng);
  adamw<DType::F16, DType::F16, false>(rng);
  adamw<DType::F32, DType::F32, false>(rng);
  adamw<DType::F64, DType::F64, false>(rng);
  adamw<DType::F32, DType::BF16, false>(rng);
  adamw<DType::F16, DType::BF16, false>(rng);
  adamw<DType::BF16, DType::F16, false>(rng);
  sum_of_squares<DType::F32>(rng);
  sum_of_squares<DType::BF16>(rng);
  sum_of_squares<DType::F16>(rng);
  sum_of_squares<DType::F64>(rng);
  count_zeros<DType::F32>(rng);
  count_zeros<DType::BF16>(rng);
  count_zeros<DType::F16>(rng);
  count_zeros<DType::F64>(rng);
  if (failures) {
    std::printf("%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("optimizer kernels: the emulated GPU matches the CPU\n");
  return 0;
}
