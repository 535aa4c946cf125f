// The launchers of megazero/cuda/optimizer.cu, whole, on the CPU: the .cu file
// itself, with each `kernel<<<...>>>(...)` rewritten by rewrite_launches.py
// into a checked emulated launch (shim/emu_host.h), called through
// megazero/cuda/optimizer.h with device memory that the host cannot touch
// outside a kernel and that ends at a guard page. The kernel-level test
// (optimizer_kernels_emulated) runs the kernels on grids it chooses; what
// this runs is the launchers' part: the segment tables they build (empty
// segments dropped, adjacent ones of the same decay merged, one launch per
// 240), the dtype dispatch of gradients and of the published parameters,
// the grids they size (AdamW's resident_grid from the table's last flat end,
// the gradient norm's kNormBlocks a table), the partial sums they place in
// the scratch gpu_scratch.h prescribes (allocated exactly, poisoned, so a
// partial never written or written past the end shows), and the finishing
// pass over all tables' partials. Each launch's grid, block and shared
// memory are logged (emu::host.log) and checked against the launcher's
// contract. Compared with the CPU kernels of megazero/kernels/optimizer_kernels.h:
// - adamw over ~900 segments (three tables or more after merging; empty ones,
//   gaps before, between and after them, both decays, one long segment whose
//   table takes the whole resident grid several turns), fp32/bf16/fp16/fp64
//   gradients, without and with the published parameters (fp32/bf16/fp16/fp64),
//   two steps, the second with the segments in another order (another table
//   split): master, exp_avg, exp_avg_sq and params bit for bit against
//   kernels::adamw (the same fp32 formula; built with -ffp-contract=off), the
//   gaps' NaN poison untouched in all four; empty lists launch nothing;
// - sum_of_squares over ~560 unordered, overlapping, partly empty ranges
//   (two tables after merging) of fp32 gradients, and ~200 (one table) of
//   bf16 (one element off a 256-byte boundary: the kernel's 16-byte packs
//   refused), fp16 and fp64 ones (an emulated launch of kNormBlocks blocks
//   takes seconds, so five in all): within 2 x terms x 2^-53 of
//   kernels::sum_of_squares (two orders of a sum of positive terms); no
//   ranges or only empty ones give 0 (the finish alone); scratch one double
//   short is refused before any launch.
// Exit code 1 on any failure.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "emu_checks.h"
#include "emu_device_checks.h"
#include "emu_host.h"
#include "megazero/cuda/optimizer.h"
#include "megazero/cuda/optimizer_kernels.cuh"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/optimizer_kernels.h"

using namespace megazero;
using namespace emu_checks;
using namespace emu_device_checks;
namespace gs = megazero::kernels::gpu_scratch;
using Segment = kernels::AdamSegment;
using Ranges = std::vector<std::pair<i64, i64>>;

namespace {

// What the launchers' tables hold, computed here from the list (not by
// segment_tables): the segments with empty ones dropped and one that starts
// where the previous one ends with the same decay merged into it; then each
// table's flat length, cutting those into tables of kSegmentTableCapacity.
std::vector<Segment> merged(const std::vector<Segment>& segments) {
  std::vector<Segment> out;
  for (const auto& s : segments) {
    if (s.begin == s.end) continue;
    if (!out.empty() && out.back().end == s.begin && out.back().decay == s.decay)
      out.back().end = s.end;
    else
      out.push_back(s);
  }
  return out;
}

std::vector<i64> table_lengths(const std::vector<Segment>& segments) {
  const std::vector<Segment> m = merged(segments);
  std::vector<i64> lengths;
  for (std::size_t k = 0; k < m.size(); ++k) {
    if (k % static_cast<std::size_t>(gs::kSegmentTableCapacity) == 0) lengths.push_back(0);
    lengths.back() += m[k].end - m[k].begin;
  }
  return lengths;
}

std::vector<Segment> as_segments(const Ranges& ranges) {
  std::vector<Segment> s;
  for (const auto& [b, e] : ranges) s.push_back({b, e, false});
  return s;
}

// The device's resident blocks of a kThreads-thread kernel: resident_grid's
// cap (the emulated occupancy depends on the block size only, so any function
// stands in for the kernel).
i64 resident() {
  int per_sm = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, &resident, static_cast<int>(gs::kThreads), 0);
  return static_cast<i64>(emu::device().sms) * per_sm;
}

// ------------------------------------------------------------ AdamW
// ~900 segments of 0 to 50 elements (one in 37 empty, about one in five
// followed by a gap of 5), one of 40000, both decays, starting 7 elements in;
// the buffers end 3 past the last. Cut into runs of 1 to 4 neighbours, the
// runs shuffled: neighbours inside a run merge where they touch with the
// same decay, and the list is out of order.
std::vector<Segment> segment_list(i64& n, std::mt19937& rng) {
  std::uniform_int_distribution<int> len(0, 50), coin(0, 9);
  std::vector<Segment> segs;
  i64 at = 7;
  for (int k = 0; k < 900; ++k) {
    const i64 l = k % 37 == 5 ? 0 : k == 300 ? 40000 : len(rng);
    segs.push_back({at, at + l, coin(rng) < 5});
    at += l + (coin(rng) < 2 ? 5 : 0);
  }
  n = at + 3;
  return segs;
}

std::vector<Segment> shuffled_runs(const std::vector<Segment>& segs, std::mt19937& rng) {
  std::uniform_int_distribution<std::size_t> run(1, 4);
  std::vector<std::vector<Segment>> runs;
  for (std::size_t k = 0; k < segs.size();) {
    const std::size_t e = std::min(segs.size(), k + run(rng));
    runs.emplace_back(segs.begin() + static_cast<std::ptrdiff_t>(k), segs.begin() + static_cast<std::ptrdiff_t>(e));
    k = e;
  }
  std::shuffle(runs.begin(), runs.end(), rng);
  std::vector<Segment> out;
  for (const auto& r : runs) out.insert(out.end(), r.begin(), r.end());
  return out;
}

// One launch per table, each of kThreads threads, no shared memory, on
// resident_grid's blocks: the table's tiles of kThreads x kAdamPerThread
// elements, at most the resident blocks.
// beside: launched as run_queued work beside the compute stream (launch_common.h's
// t_beside_compute): one short block per kThreads threads' elements, never capped at
// the resident wave.
void expect_adamw_launches(const LaunchLog& log, const std::vector<Segment>& segs, bool& capped, bool& uncapped,
                           bool beside) {
  const auto lengths = table_lengths(segs);
  check(log.launches.size() == lengths.size(), "adamw: one launch per table", static_cast<double>(log.launches.size()),
        static_cast<double>(lengths.size()), 0);
  const i64 tile = gs::kThreads * megazero::cuda::detail_k::kAdamPerThread;
  for (std::size_t k = 0; k < std::min(lengths.size(), log.launches.size()); ++k) {
    const auto& c = log.launches[k];
    const i64 tiles = (lengths[k] + tile - 1) / tile, want = beside ? tiles : std::min(tiles, resident());
    capped = capped || tiles > resident();
    uncapped = uncapped || tiles < resident();
    check(c.grid.x == static_cast<unsigned>(want) && c.grid.y == 1,
          beside ? "adamw beside the compute: a block per tile" : "adamw: the table's resident grid", c.grid.x,
          static_cast<double>(want), k);
    check(c.block.x == static_cast<unsigned>(gs::kThreads) && c.smem == 0,
          "adamw: blocks of kThreads, no shared memory", c.block.x, static_cast<double>(gs::kThreads), k);
  }
}

struct AdamCase {
  DType g;
  bool publish;
  DType p;
  bool beside = false;  // as run_queued work: short blocks
};

void adamw(const AdamCase& c, std::mt19937& rng) {
  i64 n = 0;
  const std::vector<Segment> sorted = segment_list(n, rng);
  std::vector<bool> covered(static_cast<std::size_t>(n), false);
  for (const auto& s : sorted)
    for (i64 i = s.begin; i < s.end; ++i) covered[static_cast<std::size_t>(i)] = true;
  // Gaps poisoned (NaN) in every operand: a launcher that updates or reads one shows.
  std::normal_distribution<double> normal;
  const double nan = std::nan("");
  std::vector<double> w0(static_cast<std::size_t>(n), nan), m0(w0), v0(w0), g0(w0);
  for (std::size_t i = 0; i < w0.size(); ++i)
    if (covered[i]) {
      w0[i] = normal(rng);
      m0[i] = 0.01 * normal(rng);
      v0[i] = 1e-4 * std::fabs(normal(rng));
      g0[i] = 2 * normal(rng);
    }
  Tensor w = tensor_of({n}, w0, DType::F32), m = tensor_of({n}, m0, DType::F32), v = tensor_of({n}, v0, DType::F32);
  const Tensor g = tensor_of({n}, g0, c.g);
  Tensor p;
  if (c.publish) {
    p = Tensor::empty(cpu(), {n}, c.p, MemoryCategory::Other);
    std::memset(p.data(), 0xff, p.nbytes());
  }
  const auto dw = put(w), dm = put(m), dv = put(v), dg = put(g);
  const auto dp = c.publish ? poisoned(p) : OnDevice{};

  kernels::AdamStep a{0.9, 0.95, 1e-8, 0.1, 3e-4, 0, 0, 0.5};
  bool capped = false, uncapped = false;
  for (int step = 1; step <= 2; ++step) {
    a.bc1 = 1 - std::pow(a.beta1, step);
    a.bc2 = 1 - std::pow(a.beta2, step);
    // The CPU in the list's order; the launcher on runs of it shuffled, then
    // shuffled again (other merges, another split into tables): same bits.
    const std::vector<Segment> segs = shuffled_runs(sorted, rng);
    const auto tables = table_lengths(segs);
    check(tables.size() >= 3, "adamw: three tables or more", static_cast<double>(tables.size()), 3, 0);
    std::size_t nonempty = 0;
    for (const auto& s : segs) nonempty += s.begin < s.end;
    const std::size_t after = merged(segs).size();
    check(after + 50 < nonempty, "adamw: some segments merge", static_cast<double>(after),
          static_cast<double>(nonempty), 0);
    kernels::adamw(w, m, v, g, sorted, a, p);
    LaunchLog log;
    cuda::detail_k::t_beside_compute = c.beside;
    cuda::adamw(static_cast<float*>(dw.ptr()), static_cast<float*>(dm.ptr()), static_cast<float*>(dv.ptr()), dg.ptr(),
                c.g, c.publish ? dp.ptr() : nullptr, c.publish ? c.p : DType::F32, segs, a, nullptr);
    cuda::detail_k::t_beside_compute = false;
    expect_adamw_launches(log, segs, capped, uncapped, c.beside);
  }
  check(capped && uncapped, "adamw: tables both over and under the resident grid", capped, uncapped, 0);
  const Tensor gw = get(dw, w), gm = get(dm, m), gv = get(dv, v);
  expect_bits(gw, w, "adamw master (bit for bit)");
  expect_bits(gm, m, "adamw exp_avg (bit for bit)");
  expect_bits(gv, v, "adamw exp_avg_sq (bit for bit)");
  const auto wv = values(gw), mv = values(gm), vv = values(gv);
  std::vector<double> pv;
  Tensor gp;
  if (c.publish) {
    gp = get(dp, p);
    expect_bits(gp, p, "adamw params (bit for bit)");
    // On the updated elements the new master cast as Tensor::copy_from casts it.
    const Tensor cast = gw.to(c.p, MemoryCategory::Other);
    const std::size_t e = dtype_size(c.p);
    const auto* got = static_cast<const unsigned char*>(gp.data());
    const auto* want = static_cast<const unsigned char*>(cast.data());
    pv = values(gp);
    const auto cv = values(cast);
    for (std::size_t i = 0; i < covered.size(); ++i)
      if (covered[i])
        check(std::memcmp(got + i * e, want + i * e, e) == 0, "adamw params = copy_from(master)", pv[i], cv[i], i);
  }
  std::size_t gaps = 0;
  for (std::size_t i = 0; i < covered.size(); ++i) {
    if (covered[i]) continue;
    ++gaps;
    check(std::isnan(wv[i]) && std::isnan(mv[i]) && std::isnan(vv[i]), "adamw: a gap keeps its poison", wv[i], nan, i);
    if (c.publish) check(std::isnan(pv[i]), "adamw: a gap of params keeps its poison", pv[i], nan, i);
  }
  check(covered.front() == false && covered.back() == false && gaps > 500, "adamw: gaps at both ends and between",
        static_cast<double>(gaps), 500, 0);
}

// Nothing to update (no segments, or only empty ones): no launch, nothing written.
void adamw_nothing() {
  const Tensor w = tensor_of({64}, std::vector<double>(64, 1.0), DType::F32);
  const auto dw = put(w), dm = put(w), dv = put(w), dg = put(w), dp = poisoned(w);
  const kernels::AdamStep a{0.9, 0.95, 1e-8, 0.1, 3e-4, 0.1, 0.05, 1.0};
  for (const auto& segs :
       {std::vector<Segment>{}, std::vector<Segment>{{3, 3, true}, {10, 10, false}, {64, 64, true}}}) {
    LaunchLog log;
    cuda::adamw(static_cast<float*>(dw.ptr()), static_cast<float*>(dm.ptr()), static_cast<float*>(dv.ptr()), dg.ptr(),
                DType::F32, dp.ptr(), DType::BF16, segs, a, nullptr);
    check(log.launches.empty(), "adamw: no launch for no elements", static_cast<double>(log.launches.size()), 0, 0);
  }
  expect_bits(get(dw, w), w, "adamw with no elements: master untouched");
  const Tensor gp = get(dp, w);
  for (const double x : values(gp)) check(std::isnan(x), "adamw with no elements: params untouched", x, 0, 0);
}

// ------------------------------------------------------------ the gradient norm
// `count` ranges in no order: random starts, 0 to 300 elements (one in 41
// empty, one of 20000), overlapping one another; about one in six starting
// where the previous one ends (merged by the launcher).
Ranges range_list(i64 n, int count, std::mt19937& rng) {
  Ranges ranges;
  std::uniform_int_distribution<i64> at(0, n - 1), len(0, 300);
  std::uniform_int_distribution<int> coin(0, 5);
  for (int k = 0; k < count; ++k) {
    const i64 b = !ranges.empty() && coin(rng) == 0 ? ranges.back().second : at(rng);
    ranges.emplace_back(b, k % 41 == 0 ? b : std::min(n, b + (k == 7 ? 20000 : len(rng))));
  }
  return ranges;
}

// The table launches (kNormBlocks blocks of kThreads: the partials'
// layout), then one block adding all their partials.
void expect_norm_launches(const LaunchLog& log, std::size_t tables) {
  check(log.launches.size() == tables + 1, "sum_of_squares: a launch per table and the finish",
        static_cast<double>(log.launches.size()), static_cast<double>(tables + 1), 0);
  for (std::size_t k = 0; k + 1 < log.launches.size(); ++k) {
    const auto& c = log.launches[k];
    check(c.grid.x == static_cast<unsigned>(gs::kNormBlocks) && c.grid.y == 1 &&
              c.block.x == static_cast<unsigned>(gs::kThreads),
          "sum_of_squares: kNormBlocks x kThreads a table", c.grid.x, static_cast<double>(gs::kNormBlocks), k);
  }
  if (!log.launches.empty())
    check(log.launches.back().grid.x == 1 && log.launches.back().grid.y == 1, "sum_of_squares: the finish is one block",
          log.launches.back().grid.x, 1, 0);
}

// *out on the device after cuda::sum_of_squares, with the scratch of exactly
// sum_of_squares_bytes(ranges) (poisoned) and *out poisoned.
double launch_norm(const OnDevice& g, DType t, const Ranges& ranges, LaunchLog& log) {
  const auto ws = scratch(gs::sum_of_squares_bytes(static_cast<i64>(ranges.size())));
  emu::DeviceBuffer<double> out(1);
  out.fill_bytes(0xff);
  cuda::sum_of_squares(g.ptr(), t, ranges, ws.ws(), out.get(), nullptr);
  return out.download()[0];
}

// `count` ranges over gradients of t `shift` bytes past a 256-byte boundary,
// which make `want_tables` tables. An emulated launch of kNormBlocks x
// kThreads takes seconds (each block's reduction is two dozen barrier waits
// of its 256 host threads), so one list takes two tables, the others one.
void sum_of_squares(DType t, int count, std::size_t want_tables, std::size_t shift, std::mt19937& rng) {
  const i64 n = 30001;
  const Ranges ranges = range_list(n, count, rng);
  const Tensor g = tensor_of({n}, randn(static_cast<std::size_t>(n), rng, 3.0), t);
  const auto tables = table_lengths(as_segments(ranges));
  check(tables.size() == want_tables, "sum_of_squares: the list's tables", static_cast<double>(tables.size()),
        static_cast<double>(want_tables), 0);
  i64 terms = 0;
  for (const auto& [b, e] : ranges) terms += e - b;

  Tensor out = tensor_of({1}, {0.0}, DType::F64);
  kernels::sum_of_squares(g, ranges, out);
  const auto dg = put(g, shift);
  LaunchLog log;
  const double got = launch_norm(dg, t, ranges, log);
  expect_norm_launches(log, tables.size());
  expect_close({got}, {values(out)[0]}, 2.0 * static_cast<double>(terms) * 0x1p-53, 0,
               "sum_of_squares vs the CPU kernel (another order of positive terms)");
}

// No ranges, or only empty ones: the finish alone, 0. Scratch one double
// short: refused (InternalError) before any launch, *out untouched.
void sum_of_squares_edges() {
  const Tensor g = tensor_of({64}, std::vector<double>(64, 2.0), DType::F32);
  const auto dg = put(g);
  for (const Ranges& ranges : {Ranges{}, Ranges{{5, 5}, {9, 9}, {64, 64}}}) {
    LaunchLog log;
    const double got = launch_norm(dg, DType::F32, ranges, log);
    check(got == 0.0, "sum_of_squares over nothing: 0", got, 0, ranges.size());
    expect_norm_launches(log, 0);
  }
  Ranges ranges;
  for (int k = 0; k < 300; ++k) ranges.emplace_back(2 * (k % 32), 2 * (k % 32) + 1);  // none touch: two tables
  const std::size_t bytes = gs::sum_of_squares_bytes(static_cast<i64>(ranges.size()));
  const auto ws = scratch(bytes - sizeof(double));
  emu::DeviceBuffer<double> out(1);
  out.fill_bytes(0xff);
  bool threw = false;
  LaunchLog log;
  try {
    cuda::sum_of_squares(dg.ptr(), DType::F32, ranges, ws.ws(), out.get(), nullptr);
  } catch (const InternalError&) {
    threw = true;
  }
  check(threw, "sum_of_squares: scratch one double short is refused", threw, 1, 0);
  check(log.launches.empty(), "sum_of_squares: nothing launched on short scratch",
        static_cast<double>(log.launches.size()), 0, 0);
  check(std::isnan(out.download()[0]), "sum_of_squares: *out untouched on short scratch", out.download()[0], 0, 0);
}

// zero_grad's clearing pass through cuda::zero_ranges: ~400 unordered,
// overlapping, partly empty ranges (two tables after merging) over a buffer of
// t, one element past a 256-byte boundary: exactly the CPU's kernels::zero_ranges
// (the ranges zero, every other byte as it was), one launch of kThreads a table
// on at most the resident grid; an empty list launches nothing.
void zero_ranges(DType t, std::mt19937& rng) {
  const i64 n = 30011;
  std::vector<double> v(static_cast<std::size_t>(n));
  std::normal_distribution<double> normal;
  for (auto& x : v) x = normal(rng) + 3.0;
  const Tensor x = tensor_of({n}, v, t);
  Ranges ranges;
  std::uniform_int_distribution<i64> at(0, n - 1), len(0, 90);
  for (int k = 0; k < 400; ++k) {
    const i64 b = at(rng);
    ranges.emplace_back(b, k % 23 == 0 ? b : std::min(n, b + len(rng)));
  }
  const auto tables = megazero::cuda::detail_k::range_tables(ranges);
  check(tables.size() == 2, "zero_ranges: the list's tables", static_cast<double>(tables.size()), 2, 0);
  const auto dx = put(x, dtype_size(t));  // one element off a 256-byte boundary
  LaunchLog log;
  cuda::zero_ranges(dx.ptr(), t, ranges, nullptr);
  Tensor want = x.clone(MemoryCategory::Other);
  kernels::zero_ranges(want, ranges);
  expect_bits(get(dx, x), want, "zero_ranges vs the CPU kernel");
  check(log.launches.size() == tables.size(), "zero_ranges: a launch a table", static_cast<double>(log.launches.size()),
        static_cast<double>(tables.size()), 0);
  for (std::size_t k = 0; k < log.launches.size(); ++k)
    check(log.launches[k].block.x == static_cast<unsigned>(gs::kThreads) && log.launches[k].grid.x >= 1 &&
              static_cast<i64>(log.launches[k].grid.x) <= resident(),
          "zero_ranges: kThreads a block, at most the resident grid", log.launches[k].grid.x,
          static_cast<double>(resident()), k);
  LaunchLog none;
  cuda::zero_ranges(dx.ptr(), t, {{5, 5}}, nullptr);
  check(none.launches.empty(), "zero_ranges over nothing launches nothing", static_cast<double>(none.launches.size()),
        0, 0);
}

}  // namespace

int main() {
  return run_launcher_test([] {
    std::mt19937 rng(2027);
    emu::host = {};

    adamw_nothing();
    for (const DType t : {DType::F32, DType::BF16, DType::F16, DType::F64}) adamw({t, false, DType::F32}, rng);
    // With the published parameters: every output dtype, 16-bit gradients with both 16-bit outputs.
    for (const AdamCase& c : {AdamCase{DType::BF16, true, DType::BF16}, AdamCase{DType::F16, true, DType::F16},
                              AdamCase{DType::F32, true, DType::F32}, AdamCase{DType::F64, true, DType::F64},
                              AdamCase{DType::F32, true, DType::BF16}, AdamCase{DType::BF16, true, DType::F16}})
      adamw(c, rng);
    // Beside the compute stream (ZeRO stage 0's --overlap-optimizer): more, shorter blocks, same bits.
    adamw({DType::BF16, true, DType::BF16, true}, rng);

    sum_of_squares_edges();
    sum_of_squares(DType::F32, 560, 2, 0, rng);
    sum_of_squares(DType::BF16, 200, 1, 2, rng);  // one element off: the kernel's 16-byte packs refused
    sum_of_squares(DType::F16, 200, 1, 0, rng);
    sum_of_squares(DType::F64, 200, 1, 0, rng);
    for (const DType t : {DType::F32, DType::BF16, DType::F16, DType::F64}) zero_ranges(t, rng);
  });
}
