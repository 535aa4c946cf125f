// The launchers of megazero/cuda/embedding.cu, whole, on the CPU
// (tests/cuda_emulation/README.md, "The launchers, whole"), with fenced device
// memory and exact-size scratch, against the CPU kernels of
// megazero/kernels/embedding.h on the same inputs. CUB's radix sort, which the
// gradient's launcher runs between its two kernels, is the shim's
// (shim/cub/device/device_radix_sort.cuh: CUB's contract, with its temporary
// storage overwritten and its result in the alternate buffers), so the
// launcher's own parts run as on a GPU: the sort's size query and its check
// against gpu_scratch's bound, the carving of one scratch block into the
// sort's storage and four lists, the key width, which buffers it reads after
// the sort, the block size and column tiles.
// - the token embedding forward: ids on and off this rank's slice, bit for bit;
// - its gradient: fp32/bf16/fp16/fp64 with fp32 and storage accumulators,
//   repeated ids, ids off the slice, one long run, rows narrower and wider
//   than a tile (128 and 256 threads, several tiles), a vocabulary slice whose
//   key needs every bit the launcher chose: bit for bit (the CPU's order);
//   one sort and two launches a call, none for no tokens;
// - a sort wanting more storage than gpu_scratch's bound: refused by name;
// - the position embedding and its gradient (a column sum: within one
//   accumulator rounding plus fp32 roundings of the column's |sum|).
// Exit code 1 on any failure.
#include <cub/device/device_radix_sort.cuh>
#include <random>
#include <string>
#include <vector>

#include "emu_device_checks.h"
#include "megazero/cuda/embedding.h"
#include "megazero/kernels/embedding.h"
#include "megazero/kernels/gpu_scratch.h"

using namespace megazero;
using namespace emu_checks;
using namespace emu_device_checks;
namespace gs = megazero::kernels::gpu_scratch;

namespace {

const std::int64_t* id_ptr(const OnDevice& d) { return static_cast<const std::int64_t*>(d.ptr()); }

std::vector<std::int64_t> random_ids(std::mt19937& rng, i64 n, int lo, int hi) {
  std::uniform_int_distribution<int> id(lo, hi);
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = id(rng);
  return v;
}

void forward(DType t, i64 n, i64 v, i64 h, i64 start, std::mt19937& rng) {
  const Tensor ids = ids_of(random_ids(rng, n, 0, static_cast<int>(start + v + 10)));
  const Tensor table = tensor_of({v, h}, randn(static_cast<std::size_t>(v * h), rng), t);
  Tensor out = tensor_of({n, h}, std::vector<double>(static_cast<std::size_t>(n * h), 5.0), t);
  kernels::embedding_forward(ids, table, start, out);
  const auto di = put(ids), dt = put(table), dout = poisoned(out);
  cuda::embedding_forward(t, id_ptr(di), dt.ptr(), start, v, h, dout.ptr(), n, nullptr);
  expect_bits(get(dout, out), out, "embedding_forward");
}

// ids in [lo, hi]; the slice holds rows [start, start + v). edges: every
// 7th id is lo and the next hi (a run of the first row among ids off the
// slice, whose key is v: a sort over too few key bits mixes them).
void backward(DType t, DType acc, i64 n, i64 v, i64 h, i64 start, int lo, int hi, std::mt19937& rng,
              bool edges = false) {
  std::vector<std::int64_t> iv = random_ids(rng, n, lo, hi);
  if (edges)
    for (std::size_t i = 0; i + 1 < iv.size(); i += 7) iv[i] = lo, iv[i + 1] = hi;
  const Tensor ids = ids_of(iv);
  const Tensor dout = tensor_of({n, h}, randn(static_cast<std::size_t>(n * h), rng), t);
  Tensor want = tensor_of({v, h}, randn(static_cast<std::size_t>(v * h), rng), acc);  // accumulated into
  const auto dtab = put(want);
  kernels::embedding_backward(ids, dout, start, want);
  const auto di = put(ids), dd = put(dout);
  const auto ws = scratch(n > 0 && h > 0 ? gs::embedding_sort_bytes(n) : 0);
  const long sorts = emu::cub_sorts;
  const Launches launches;
  cuda::embedding_backward(t, id_ptr(di), dd.ptr(), start, n, v, h, dtab.ptr(), acc, ws.ws(), nullptr);
  const bool work = n > 0 && h > 0;
  launches.expect(work ? 2 : 0, "embedding_backward: launches (keys, runs)");
  check(emu::cub_sorts - sorts == (work ? 1 : 0), "embedding_backward: sorts",
        static_cast<double>(emu::cub_sorts - sorts), work ? 1 : 0, 0);
  expect_bits(get(dtab, want), want, "embedding_backward (the CPU's order: bit for bit)");
}

// CUB asking for more temporary storage than gpu_scratch's bound leaves room
// for: the launcher refuses, naming the bound, and writes nothing.
void sort_bound_refused(std::mt19937& rng) {
  const i64 n = 64, v = 40, h = 16;
  const Tensor ids = ids_of(random_ids(rng, n, 0, 39));
  const Tensor dout = tensor_of({n, h}, randn(static_cast<std::size_t>(n * h), rng), DType::F32);
  const Tensor table = tensor_of({v, h}, std::vector<double>(static_cast<std::size_t>(v * h), 1.0), DType::F32);
  const auto di = put(ids), dd = put(dout), dtab = put(table);
  const auto ws = scratch(gs::embedding_sort_bytes(n));
  emu::cub_sort_temp_bytes_override = gs::embedding_sort_lists_offset(n) + 256;
  std::string why;
  try {
    cuda::embedding_backward(DType::F32, id_ptr(di), dd.ptr(), 0, n, v, h, dtab.ptr(), DType::F32, ws.ws(), nullptr);
  } catch (const std::exception& e) {
    why = e.what();
  }
  emu::cub_sort_temp_bytes_override = 0;
  check(why.find("embedding_sort_lists_offset") != std::string::npos, "a sort over the bound is refused by name", 0, 1,
        0);
  expect_bits(get(dtab, table), table, "a refused gradient writes nothing");
}

void positions(DType t, DType acc, i64 batch, i64 seq, i64 h, std::mt19937& rng) {
  const i64 rows = batch * seq;
  Tensor out = tensor_of({rows, h}, randn(static_cast<std::size_t>(rows * h), rng), t);
  const Tensor pos = tensor_of({seq + 3, h}, randn(static_cast<std::size_t>((seq + 3) * h), rng), t);
  const auto dout_in = put(out), dpos_tab = put(pos);
  kernels::add_position_embedding(out, pos, seq);
  cuda::add_position_embedding(t, dout_in.ptr(), dpos_tab.ptr(), rows * h, seq * h, nullptr);
  expect_bits(get(dout_in, out), out, "add_position_embedding");

  const Tensor g = tensor_of({rows, h}, randn(static_cast<std::size_t>(rows * h), rng), t);
  Tensor want = tensor_of({seq + 3, h}, randn(static_cast<std::size_t>((seq + 3) * h), rng), acc);
  const auto dg = put(g), dp = put(want);
  kernels::position_embedding_backward(g, seq, want);
  const auto ws = scratch(gs::column_sums_bytes(t, batch, seq * h, 1));
  cuda::position_embedding_backward(t, dg.ptr(), batch, seq * h, dp.ptr(), acc, ws.ws(), nullptr);
  // The magnitude a column's sum is rounded against: the sum of |dout| over the batch, plus the start value.
  std::vector<double> mag(static_cast<std::size_t>((seq + 3) * h), 0.0);
  const auto gv = values(g);
  for (i64 r = 0; r < rows; ++r)
    for (i64 c = 0; c < h; ++c)
      mag[static_cast<std::size_t>((r % seq) * h + c)] += std::fabs(gv[static_cast<std::size_t>(r * h + c)]);
  for (std::size_t i = 0; i < mag.size(); ++i) mag[i] += std::fabs(values(want)[i]);
  expect_sums(get(dp, want), want, mag, batch, "position_embedding_backward");
}

}  // namespace

int main() {
  return run_launcher_test([] {
    std::mt19937 rng(2028);
    for (const DType t : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
      forward(t, 50, 37, 24, 20, rng);
      forward(t, 7, 37, 300, 0, rng);
      for (const DType acc : {DType::F32, t}) {
        if ((acc == t && t == DType::F32) || (t == DType::F64 && acc != t)) continue;
        backward(t, acc, 300, 37, 24, 20, 0, 79, rng);   // repeated ids, some off the slice, one tile
        backward(t, acc, 120, 37, 24, 20, 33, 33, rng);  // every token one row: a run of 120
        backward(t, acc, 30, 37, 1100, 20, 0, 79, rng);  // 256 threads, three tiles (the last part-empty)
        positions(t, acc, 3, 5, 24, rng);
      }
    }
    backward(DType::BF16, DType::F32, 200, 1024, 8, 0, 0, 1100, rng, true);  // keys up to 1024 (off the slice): 11 bits
    backward(DType::F32, DType::F32, 0, 37, 24, 0, 0, 36, rng);              // no tokens: nothing launched
    sort_bound_refused(rng);
  });
}
