// Vocabulary-parallel and position embeddings (megazero/kernels/embedding.h):
// rows of this rank's slice and zeros for other ids, slices that sum to the
// full table (what the TP all-reduce relies on), gradients that accumulate
// repeated ids, against finite differences in fp64; then bf16 and fp16 storage
// (HalfStorage): exact copies, fp32 or 16-bit accumulators rounded once.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "megazero/kernels/embedding.h"

using namespace megazero;
using namespace megazero::kernels;
using namespace kernel_test;

namespace {

TEST(Embedding, RowsOfTheSliceAndZerosForOtherIds) {
  std::mt19937 rng(14);
  const i64 v = 5, h = 6, start = 10;
  const Vec table = to_f32(randn(usize(v * h), rng));
  const std::vector<i64> ids = {10, 14, 9, 15, 12, 12, -1, 100, 11};
  for (DType t : {DType::F64, DType::F32}) {
    Tensor out = tensor({9, h}, Vec(usize(9 * h), 7.0), t);  // overwritten
    embedding_forward(ids_tensor(ids), tensor({v, h}, table, t), start, out);
    const Vec got = vals(out);
    for (std::size_t n = 0; n < ids.size(); ++n) {
      const bool mine = ids[n] >= start && ids[n] < start + v;
      for (i64 c = 0; c < h; ++c)
        ASSERT_EQ(got[n * usize(h) + usize(c)], mine ? table[usize((ids[n] - start) * h + c)] : 0.0) << n << "," << c;
    }
  }
}

TEST(Embedding, SlicesSumToTheFullTable) {  // what the TP all-reduce of the embedding output relies on
  std::mt19937 rng(15);
  const i64 vocab = 12, h = 4;
  const Vec table = randn(usize(vocab * h), rng);
  const std::vector<i64> ids = {0, 11, 5, 6, 3, 3, 8};
  const Tensor id = ids_tensor(ids);
  Tensor full = empty({7, h});
  embedding_forward(id, tensor({vocab, h}, table), 0, full);
  Vec sum(usize(7 * h), 0.0);
  for (i64 r = 0; r < 3; ++r) {  // 3 slices of 4 rows
    Tensor out = empty({7, h});
    const Vec part(table.begin() + r * 4 * h, table.begin() + (r + 1) * 4 * h);
    embedding_forward(id, tensor({4, h}, part), 4 * r, out);
    const Vec o = vals(out);
    for (std::size_t k = 0; k < sum.size(); ++k) sum[k] += o[k];
  }
  EXPECT_EQ(sum, vals(full));
}

TEST(Embedding, BackwardAccumulatesRepeatedIdsAndSkipsOtherSlices) {
  std::mt19937 rng(16);
  const i64 v = 4, h = 70, start = 3;  // h > 64: more than one column block
  const std::vector<i64> ids = {3, 6, 6, 2, 7, 3, 5, 6};
  const i64 n = static_cast<i64>(ids.size());
  const Vec dout = randn(usize(n * h), rng), dtable0 = randn(usize(v * h), rng), table = randn(usize(v * h), rng);
  Tensor dtable = tensor({v, h}, dtable0);
  embedding_backward(ids_tensor(ids), tensor({n, h}, dout), start, dtable);
  Vec want = dtable0;
  for (i64 i = 0; i < n; ++i)
    if (ids[usize(i)] >= start && ids[usize(i)] < start + v)
      for (i64 c = 0; c < h; ++c) want[usize((ids[usize(i)] - start) * h + c)] += dout[usize(i * h + c)];
  expect_close(vals(dtable), want, 1e-15, 1e-15, "dtable");
  const auto forward = [&](const Vec& tab) {
    Tensor out = empty({n, h});
    embedding_forward(ids_tensor(ids), tensor({v, h}, tab), start, out);
    return vals(out);
  };
  expect_fd_gradient("dtable", table, forward, dout, minus(vals(dtable), dtable0));
}

TEST(PositionEmbedding, AddAndBackward) {
  std::mt19937 rng(17);
  const i64 b = 3, s = 4, h = 5, positions = 6;  // the table has more positions than the sequence
  const Vec out0 = randn(usize(b * s * h), rng), pos = randn(usize(positions * h), rng);
  const Vec dout = randn(out0.size(), rng), dpos0 = randn(pos.size(), rng);
  const auto forward = [&](const Vec& table) {
    Tensor out = tensor({b * s, h}, out0);
    add_position_embedding(out, tensor({positions, h}, table), s);
    return vals(out);
  };
  Vec want = out0;
  for (i64 r = 0; r < b * s; ++r)
    for (i64 c = 0; c < h; ++c) want[usize(r * h + c)] += pos[usize((r % s) * h + c)];
  expect_close(forward(pos), want, 0, 0, "add_position_embedding");
  Tensor dpos = tensor({positions, h}, dpos0);
  position_embedding_backward(tensor({b * s, h}, dout), s, dpos);
  const Vec grad = minus(vals(dpos), dpos0);
  expect_fd_gradient("dpos", pos, forward, dout, grad);
  for (std::size_t k = usize(s * h); k < grad.size(); ++k) EXPECT_EQ(vals(dpos)[k], dpos0[k]) << "unused position";
  Tensor out32 = tensor({b * s, h}, to_f32(out0), DType::F32);
  add_position_embedding(out32, tensor({positions, h}, to_f32(pos), DType::F32), s);
  Vec want32 = to_f32(out0);
  for (i64 r = 0; r < b * s; ++r)
    for (i64 c = 0; c < h; ++c) want32[usize(r * h + c)] += static_cast<float>(pos[usize((r % s) * h + c)]);
  expect_close(vals(out32), want32, 1e-6, 1e-6, "fp32");
  Tensor out = tensor({b * s, h}, out0);
  const Tensor short_table = tensor({3, h}, Vec(usize(3 * h), 0.0));
  expect_rejected([&] { add_position_embedding(out, short_table, s); },
                  "exceeds the 3 positions");  // 3 positions < seq 4
}

// =========================== 16-bit storage ===========================
// (kernel_test_util.h: inputs rounded to the dtype first, the fp64 reference on
// the same values, each output within one rounding or bit for bit.)

TEST(HalfStorage, Embeddings) {
  const i64 v = 4, h = 70, start = 3;                     // h > 64: more than one column block
  const std::vector<i64> ids = {3, 6, 6, 2, 7, 3, 5, 6};  // id 4 (local row 1) is never used
  const i64 n = static_cast<i64>(ids.size());
  for (DType t : kHalfDtypes) {
    SCOPED_TRACE(dtype_name(t));
    std::mt19937 rng(60);
    const Vec table = rounded(randn(usize(v * h), rng), t), dout = rounded(randn(usize(n * h), rng), t),
              dtable0 = rounded(randn(usize(v * h), rng), t);
    Tensor out = tensor({n, h}, Vec(usize(n * h), 7.0), t);
    embedding_forward(ids_tensor(ids), tensor({v, h}, table, t), start, out);
    Vec want(usize(n * h), 0.0);
    for (i64 i = 0; i < n; ++i)
      if (ids[usize(i)] >= start && ids[usize(i)] < start + v)
        for (i64 c = 0; c < h; ++c) want[usize(i * h + c)] = table[usize((ids[usize(i)] - start) * h + c)];
    expect_same(vals(out), want, "embedding_forward copies rows exactly");

    // dtable += dout rows: summed in fp32 (<= 3 additions, each erring by
    // 2^-24 of the partial sums: atol 2^-22 sum|terms|), rounded once.
    Vec dwant = dtable0, abs_sum(dtable0.size());
    for (std::size_t k = 0; k < abs_sum.size(); ++k) abs_sum[k] = std::fabs(dtable0[k]);
    for (i64 i = 0; i < n; ++i)
      if (ids[usize(i)] >= start && ids[usize(i)] < start + v)
        for (i64 c = 0; c < h; ++c) {
          const std::size_t k = usize((ids[usize(i)] - start) * h + c);
          dwant[k] += dout[usize(i * h + c)], abs_sum[k] += std::fabs(dout[usize(i * h + c)]);
        }
    Vec atol(abs_sum.size());
    for (std::size_t k = 0; k < atol.size(); ++k) atol[k] = 0x1p-22 * abs_sum[k];
    Tensor dtable = tensor({v, h}, dtable0, t), dtable32 = tensor({v, h}, dtable0, DType::F32);
    embedding_backward(ids_tensor(ids), tensor({n, h}, dout, t), start, dtable);
    embedding_backward(ids_tensor(ids), tensor({n, h}, dout, t), start, dtable32);
    expect_one_rounding(vals(dtable), dwant, t, "dtable (16-bit)", atol);
    expect_close(vals(dtable32), dwant, 0x1p-22, 0x1p-22 * 16, "dtable (fp32)");
    // The 16-bit accumulator is the fp32 accumulation rounded once (not once per token).
    expect_same(vals(dtable), rounded(vals(dtable32), t), "dtable == fp32 accumulation rounded once");
    for (i64 c = 0; c < h; ++c) EXPECT_EQ(vals(dtable)[usize(h + c)], dtable0[usize(h + c)]) << "unused row";

    // Position embeddings.
    const i64 b = 3, s = 4, positions = 6;
    const Vec out0 = rounded(randn(usize(b * s * h), rng), t), pos = rounded(randn(usize(positions * h), rng), t);
    const Vec pdout = rounded(randn(out0.size(), rng), t), dpos0 = rounded(randn(pos.size(), rng), t);
    Tensor po = tensor({b * s, h}, out0, t), po32 = tensor({b * s, h}, out0, DType::F32);
    add_position_embedding(po, tensor({positions, h}, pos, t), s);
    add_position_embedding(po32, tensor({positions, h}, pos, DType::F32), s);
    Vec pwant = out0;
    for (i64 r = 0; r < b * s; ++r)
      for (i64 c = 0; c < h; ++c) pwant[usize(r * h + c)] += pos[usize((r % s) * h + c)];
    expect_one_rounding(vals(po), pwant, t, "add_position_embedding");
    expect_same(vals(po), rounded(vals(po32), t), "add_position_embedding == fp32 rounded once");
    Vec dpwant(dpos0.size(), 0.0);  // the kernel's sums: over samples in order, in double, then + dpos0
    for (i64 r = 0; r < b * s; ++r)
      for (i64 c = 0; c < h; ++c) dpwant[usize((r % s) * h + c)] += pdout[usize(r * h + c)];
    for (std::size_t k = 0; k < dpwant.size(); ++k) dpwant[k] = k < usize(s * h) ? dpos0[k] + dpwant[k] : dpos0[k];
    Tensor dpos = tensor({positions, h}, dpos0, t), dpos32 = tensor({positions, h}, dpos0, DType::F32);
    position_embedding_backward(tensor({b * s, h}, pdout, t), s, dpos);
    position_embedding_backward(tensor({b * s, h}, pdout, t), s, dpos32);
    expect_one_rounding(vals(dpos), dpwant, t, "dpos (16-bit)");
    expect_same(vals(dpos), round_once(dpwant, t), "dpos rounded once");
    expect_same(vals(dpos32), to_f32(dpwant), "dpos (fp32)");
  }
}

}  // namespace
