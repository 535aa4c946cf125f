// Vocabulary-parallel and position embeddings (embedding.h): shape checks,
// device dispatch and the CPU kernels. Each public function validates its
// arguments (also on the meta device, where nothing is computed), then runs a
// template over the storage type S (float, double, BFloat16 or Half) on raw
// pointers: elements are read with ld() into the compute type C = compute_t<S>
// and written with st<S>(), which rounds once to nearest even
// (kernel_support.h). Gradients are summed in a fixed token or row order, so
// results are bitwise identical for any thread count.
#include "megazero/kernels/embedding.h"

#include <algorithm>
#include <vector>

#include "megazero/core/error.h"
#include "megazero/kernels/cpu_loops.h"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/kernel_support.h"
#ifdef MEGAZERO_WITH_CUDA
#include "megazero/cuda/embedding.h"
#endif

namespace megazero::kernels {

using namespace detail;  // kernel_support.h, cpu_loops.h

void embedding_forward(const Tensor& ids, const Tensor& table, std::int64_t vocab_start, Tensor& out) {
  constexpr const char* op = "embedding_forward";
  check_float(op, "table", table);
  MZ_CHECK(table.dim() == 2, op, ": table must be [V_local, H], got ", table.to_string());
  const i64 v = table.size(0), h = table.size(1);
  check_operand(op, "table", table, table, table.dtype());
  check_operand(op, "ids", ids, table, DType::I64);
  MZ_CHECK(ids.dim() == 1, op, ": ids must be [N], got ", ids.to_string());
  const i64 n = ids.size(0);
  check_operand(op, "out", out, table, table.dtype());
  check_shape(op, "out", out, {n, h});
  MZ_ON_CUDA(table, cuda::embedding_forward(table.dtype(), ptr<const std::int64_t>(ids), table.data(), vocab_start, v,
                                            h, out.data(), n, stream_of(table)));
  if (!on_host(op, table)) return;
  with_storage_type(table.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const std::int64_t* id = ptr<const std::int64_t>(ids);
    const S* tab = ptr<const S>(table);
    S* o = ptr<S>(out);
#pragma omp parallel for num_threads(threads()) schedule(static) if (n * h > kParallelMin)
    for (i64 i = 0; i < n; ++i) {
      const i64 row = local_column(id[i], vocab_start, v);
      if (row >= 0)
        std::copy_n(tab + row * h, h, o + i * h);
      else
        std::fill_n(o + i * h, h, zero<S>());  // another rank's row; the all-reduce fills it
    }
  });
}

namespace {
// dtable[row] += dout[i] for the tokens i whose id is in the slice. Repeated ids
// add into one row in token order, so the result is fixed whatever the threads.
template <typename S, typename G>
void embedding_backward_cpu(const std::int64_t* id, const S* g, i64 vocab_start, i64 n, i64 v, i64 h, G* dt) {
  constexpr i64 kBlock = 64;
  if constexpr (!is_16bit_v<G>) {
    // An fp32/fp64 accumulator sums in place. Threads split the columns, never
    // the tokens, so there are no races.
    const i64 blocks = (h + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(threads()) schedule(static) if (n * h > kParallelMin)
    for (i64 blk = 0; blk < blocks; ++blk) {
      const i64 c0 = blk * kBlock, c1 = std::min(h, c0 + kBlock);
      for (i64 i = 0; i < n; ++i) {
        const i64 row = local_column(id[i], vocab_start, v);
        if (row < 0) continue;
        for (i64 c = c0; c < c1; ++c) dt[row * h + c] += ld(g[i * h + c]);
      }
    }
  } else {
    // A 16-bit accumulator is rounded once per call: the tokens of each row are
    // listed (a counting sort, stable in token order) and summed in fp32 from
    // the row's old value; threads split the rows.
    std::vector<i64> first(static_cast<std::size_t>(v) + 1, 0);
    for (i64 i = 0; i < n; ++i) {
      const i64 row = local_column(id[i], vocab_start, v);
      if (row >= 0) ++first[static_cast<std::size_t>(row) + 1];
    }
    for (std::size_t r = 0; r < static_cast<std::size_t>(v); ++r) first[r + 1] += first[r];
    std::vector<i64> tokens(static_cast<std::size_t>(first.back())), next(first.begin(), first.end() - 1);
    for (i64 i = 0; i < n; ++i) {
      const i64 row = local_column(id[i], vocab_start, v);
      if (row >= 0) tokens[static_cast<std::size_t>(next[static_cast<std::size_t>(row)]++)] = i;
    }
#pragma omp parallel for num_threads(threads()) schedule(static) if (n * h > kParallelMin)
    for (i64 row = 0; row < v; ++row) {
      const i64 t0 = first[static_cast<std::size_t>(row)], t1 = first[static_cast<std::size_t>(row) + 1];
      if (t0 == t1) continue;
      for (i64 c0 = 0; c0 < h; c0 += kBlock) {
        const i64 len = std::min(kBlock, h - c0);
        G* dr = dt + row * h + c0;
        float acc[kBlock];
        for (i64 k = 0; k < len; ++k) acc[k] = ld(dr[k]);
        for (i64 t = t0; t < t1; ++t) {
          const S* gr = g + tokens[static_cast<std::size_t>(t)] * h + c0;
          for (i64 k = 0; k < len; ++k) acc[k] += ld(gr[k]);
        }
        for (i64 k = 0; k < len; ++k) dr[k] = st<G>(acc[k]);
      }
    }
  }
}
}  // namespace

void embedding_backward(const Tensor& ids, const Tensor& dout, std::int64_t vocab_start, Tensor& dtable) {
  constexpr const char* op = "embedding_backward";
  check_float(op, "dout", dout);
  check_accumulator(op, "dtable", dtable, dout, dout.dtype());
  MZ_CHECK(dtable.dim() == 2, op, ": dtable must be [V_local, H], got ", dtable.to_string());
  const i64 v = dtable.size(0), h = dtable.size(1);
  check_operand(op, "ids", ids, dtable, DType::I64);
  MZ_CHECK(ids.dim() == 1, op, ": ids must be [N], got ", ids.to_string());
  const i64 n = ids.size(0);
  check_operand(op, "dout", dout, dtable, dout.dtype());
  check_shape(op, "dout", dout, {n, h});
  const Tensor ws = allocate_gpu_scratch(dtable, n > 0 && h > 0 ? gpu_scratch::embedding_sort_bytes(n) : 0,
                                         "embedding_backward sort");
  MZ_ON_CUDA(dtable, cuda::embedding_backward(dout.dtype(), ptr<const std::int64_t>(ids), dout.data(), vocab_start, n,
                                              v, h, dtable.data(), dtable.dtype(), scratch_of(ws), stream_of(dtable)));
  if (!on_host(op, dtable)) return;
  with_storage_type(dout.dtype(), [&](auto tag) {
    using S = decltype(tag);
    with_accumulator_type<S>(dtable, [&](auto acc_tag) {
      using G = decltype(acc_tag);
      embedding_backward_cpu(ptr<const std::int64_t>(ids), ptr<const S>(dout), vocab_start, n, v, h, ptr<G>(dtable));
    });
  });
}

namespace {
// out/dout is [B * seq, H]; pos_table/dpos holds at least `seq` positions of H.
// The position table has the activations' dtype; a gradient `accumulator` may
// also be fp32 for 16-bit activations.
Rows check_positions(const char* op, const Tensor& act, const Tensor& pos, std::int64_t seq, bool accumulator) {
  check_float(op, "activations", act);
  check_operand(op, "activations", act, act, act.dtype());
  if (accumulator)
    check_accumulator(op, "position gradient", pos, act, act.dtype());
  else
    check_operand(op, "position table", pos, act, act.dtype());
  MZ_CHECK(act.dim() == 2, op, ": activations must be [B*S, H], got ", act.to_string());
  MZ_CHECK(pos.dim() == 2 && pos.size(1) == act.size(1), op, ": position table must be [P, ", act.size(1), "], got ",
           pos.to_string());
  MZ_CHECK(seq > 0 && act.size(0) % seq == 0, op, ": ", act.size(0), " rows are not a whole number of sequences of ",
           seq);
  MZ_CHECK(pos.size(0) >= seq, op, ": sequence length ", seq, " exceeds the ", pos.size(0), " positions of the table");
  return {act.size(0) / seq, act.size(1)};  // {batch, hidden}
}
}  // namespace

void add_position_embedding(Tensor& out, const Tensor& pos_table, std::int64_t seq) {
  constexpr const char* op = "add_position_embedding";
  const Rows s = check_positions(op, out, pos_table, seq, false);
  MZ_ON_CUDA(out, cuda::add_position_embedding(out.dtype(), out.data(), pos_table.data(), out.numel(), seq * s.cols,
                                               stream_of(out)));
  if (!on_host(op, out)) return;
  with_storage_type(out.dtype(), [&](auto tag) {
    using S = decltype(tag);
    S* o = ptr<S>(out);
    const S* pos = ptr<const S>(pos_table);
    const i64 per_sample = seq * s.cols;  // out[b*S + s, :] is element b * per_sample + (s * H + h)
    elementwise(o, out.numel(), [=](i64 i) { return st<S>(ld(o[i]) + ld(pos[i % per_sample])); });
  });
}

void position_embedding_backward(const Tensor& dout, std::int64_t seq, Tensor& dpos) {
  constexpr const char* op = "position_embedding_backward";
  const Rows s = check_positions(op, dout, dpos, seq, true);
  const Tensor ws = allocate_gpu_scratch(dout, gpu_scratch::column_sums_bytes(dout.dtype(), s.rows, seq * s.cols, 1),
                                         "position_embedding_backward scratch");
  MZ_ON_CUDA(dout, cuda::position_embedding_backward(dout.dtype(), dout.data(), s.rows, seq * s.cols, dpos.data(),
                                                     dpos.dtype(), scratch_of(ws), stream_of(dout)));
  if (!on_host(op, dout)) return;
  with_storage_type(dout.dtype(), [&](auto tag) {
    using S = decltype(tag);
    const S* g = ptr<const S>(dout);
    const i64 per_sample = seq * s.cols;
    // The first seq rows of dpos, flattened, are a sum over samples b of dout's
    // b-th [seq * H] block.
    with_accumulator_type<S>(dpos, [&](auto acc_tag) {
      using G = decltype(acc_tag);
      accumulate_columns(ptr<G>(dpos), s.rows, per_sample,
                         [=](i64 b, i64 j) { return static_cast<double>(ld(g[b * per_sample + j])); });
    });
  });
}

}  // namespace megazero::kernels
