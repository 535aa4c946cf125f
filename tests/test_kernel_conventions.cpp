// What every layer kernel family follows (megazero/kernels/conventions.h),
// checked across the families: the meta device checks shapes and computes
// nothing; the CUDA kernels' scratch is allocated through the device exactly
// as the launchers need it and never for the CPU kernels; bad shapes and
// dtypes are rejected with messages naming the operand; results are the same
// bits for any thread count; and the dtype rules of 16-bit storage (fp32
// statistics, storage or fp32 accumulators).
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernel_test_util.h"
#include "megazero/kernels/cpu_threads.h"
#include "megazero/kernels/fused_attention.h"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/layer_kernels.h"

using namespace megazero;
using namespace megazero::kernels;
using namespace kernel_test;

namespace {

TEST(LayerKernels, MetaDeviceChecksShapesAndComputesNothing) {
  auto meta = make_device(DeviceKind::Meta);
  Tensor x = Tensor::empty(meta, {4, 8}, DType::F32, MC::Other);
  Tensor g = Tensor::empty(meta, {8}, DType::F32, MC::Other), m = Tensor::empty(meta, {4}, DType::F32, MC::Other);
  layernorm_forward(x, g, g, 1e-5, x, m, m);
  gelu_forward(x, x);
  dropout_forward(x, 0.1, RngKey{}, DropoutLayout{4, 1, 1, 8, 0, 0, 1}, x);
  Tensor bad = Tensor::empty(meta, {7}, DType::F32, MC::Other);
  expect_rejected([&] { layernorm_forward(x, bad, g, 1e-5, x, m, m); }, "layernorm_forward: gamma has shape");
}

// The CUDA kernels' scratch (gpu_scratch.h) goes through the device: a meta
// device standing in for CUDA allocates exactly what the launchers will be
// given (so a plan counts it and the arena holds it), and the CPU kernels,
// or a meta device standing in for them, allocate none.
TEST(LayerKernels, GpuScratchIsAllocatedThroughTheDeviceOnlyForCudaKernels) {
  namespace gs = gpu_scratch;
  const i64 rows = 96, cols = 40, seq = 16, vocab = 50, bh = 4, d = 64;
  struct Case {
    const char* name;
    std::function<void(const std::shared_ptr<Device>&)> run;
    std::size_t cuda_bytes;
  };
  auto t = [](const std::shared_ptr<Device>& dev, const Shape& shape, DType dt) {
    Tensor x = Tensor::empty(dev, shape, dt, MC::Other);
    if (dev->has_storage()) x.zero_();
    return x;
  };
  const std::vector<Case> cases = {
      {"layernorm_backward",
       [&](const std::shared_ptr<Device>& dev) {
         Tensor x = t(dev, {rows, cols}, DType::BF16), g = t(dev, {cols}, DType::BF16);
         Tensor st = t(dev, {rows}, DType::F32), dg = t(dev, {cols}, DType::F32), db = t(dev, {cols}, DType::F32);
         Tensor dx = t(dev, {rows, cols}, DType::BF16);
         layernorm_backward(x, x, g, st, st, dx, dg, db);
       },
       gs::layernorm_backward_bytes(DType::BF16, rows, cols)},
      {"layernorm_backward_dropout",
       [&](const std::shared_ptr<Device>& dev) {
         Tensor x = t(dev, {rows, cols}, DType::BF16), g = t(dev, {cols}, DType::BF16);
         Tensor st = t(dev, {rows}, DType::F32), dg = t(dev, {cols}, DType::F32), db = t(dev, {cols}, DType::F32);
         Tensor dx = t(dev, {rows, cols}, DType::BF16), dd = t(dev, {rows, cols}, DType::BF16);
         Tensor dbias = t(dev, {cols}, DType::F32);
         layernorm_backward_dropout(x, x, g, st, st, dx, dg, db, nullptr,
                                    {0.1, RngKey{}, DropoutLayout{rows, 1, 1, cols, 0, 0, 1}, &dd, &dbias});
       },
       gs::layernorm_dropout_backward_bytes(DType::BF16, rows, cols)},
      {"bias_gelu_backward",
       [&](const std::shared_ptr<Device>& dev) {
         Tensor dy = t(dev, {rows, cols}, DType::BF16), b = t(dev, {cols}, DType::BF16);
         Tensor db = t(dev, {cols}, DType::F32);
         bias_gelu_backward(dy, dy, b, dy, db);
       },
       gs::column_sums_bytes(DType::BF16, rows, cols, 1)},
      {"dropout_backward_bias_grad",
       [&](const std::shared_ptr<Device>& dev) {
         Tensor dy = t(dev, {rows, cols}, DType::BF16), db = t(dev, {cols}, DType::F32);
         dropout_backward_bias_grad(dy, 0.1, RngKey{}, DropoutLayout{rows, 1, 1, cols, 0, 0, 1}, dy, db);
       },
       gs::dropout_bias_grad_bytes(rows, cols)},
      {"bias_grad",
       [&](const std::shared_ptr<Device>& dev) {
         Tensor dy = t(dev, {rows, cols}, DType::F32), db = t(dev, {cols}, DType::F32);
         bias_grad(dy, db);
       },
       gs::column_sums_bytes(DType::F32, rows, cols, 1)},
      {"position_embedding_backward",
       [&](const std::shared_ptr<Device>& dev) {
         Tensor dy = t(dev, {40 * seq, cols}, DType::F32), dp = t(dev, {seq, cols}, DType::F32);
         position_embedding_backward(dy, seq, dp);  // 40 samples: two chunks of rows, so partials
       },
       gs::column_sums_bytes(DType::F32, 40, seq * cols, 1)},
      {"embedding_backward",
       [&](const std::shared_ptr<Device>& dev) {
         Tensor ids = t(dev, {rows}, DType::I64), dy = t(dev, {rows, cols}, DType::F32);
         Tensor table = t(dev, {vocab, cols}, DType::F32);
         embedding_backward(ids, dy, 0, table);
       },
       gs::embedding_sort_bytes(rows)},
      {"fused_attention_backward",
       [&](const std::shared_ptr<Device>& dev) {
         Tensor q = t(dev, {bh, seq, d}, DType::BF16), lse = t(dev, {bh, seq}, DType::F32);
         Tensor dq = t(dev, {bh, seq, d}, DType::BF16), dk = t(dev, {bh, seq, d}, DType::BF16),
                dv = t(dev, {bh, seq, d}, DType::BF16);
         fused_attention_backward(q, q, q, q, q, lse, 0.125, 0.0, RngKey{}, DropoutLayout{bh, 1, seq, seq, 0, 0, 1}, dq,
                                  dk, dv);
       },
       gs::flash_backward_bytes(bh, seq)},
  };
  auto workspace_traffic = [](const std::shared_ptr<Device>& dev, const Case& c) {
    const auto before = dev->memory().snapshot()[MC::Workspace];
    c.run(dev);
    const auto after = dev->memory().snapshot()[MC::Workspace];
    EXPECT_EQ(after.live_bytes, before.live_bytes) << "scratch outlives the call";
    return std::pair{after.allocations - before.allocations, after.allocated_bytes - before.allocated_bytes};
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_GT(c.cuda_bytes, 0u);
    // Standing in for CUDA: exactly the launcher's scratch, nothing else.
    const auto [cuda_allocs, cuda_bytes] = workspace_traffic(make_meta_device(DeviceKind::CUDA), c);
    EXPECT_EQ(cuda_allocs, 1);
    EXPECT_EQ(cuda_bytes, static_cast<i64>(c.cuda_bytes));
    // The CPU kernels: none of it (the CPU attention backward has workspace
    // of its own, which a meta device standing in for the CPU reproduces).
    const auto cpu_traffic = workspace_traffic(make_device(DeviceKind::CPU), c);
    EXPECT_EQ(workspace_traffic(make_meta_device(DeviceKind::CPU), c), cpu_traffic);
    if (std::string(c.name) != "fused_attention_backward") {
      EXPECT_EQ(cpu_traffic, (std::pair<i64, i64>{0, 0}));
    }
  }
  // A position-embedding gradient over a few samples of seq x h columns (one
  // chunk of rows) takes no scratch: not 8 bytes a column for nothing.
  const auto meta = make_meta_device(DeviceKind::CUDA);
  Tensor dy = t(meta, {4 * seq, 4096}, DType::BF16), dp = t(meta, {seq, 4096}, DType::F32);
  const auto before = meta->memory().snapshot()[MC::Workspace];
  position_embedding_backward(dy, seq, dp);
  EXPECT_EQ(meta->memory().snapshot()[MC::Workspace].allocations, before.allocations);
}

// The chunking the column-sum launchers use: every row in exactly one chunk,
// within CUDA's grid limits, and the scratch holds every chunk's partials.
TEST(LayerKernels, GpuColumnSumChunksCoverEveryRowOnce) {
  namespace gs = gpu_scratch;
  for (const i64 rows : {i64{0}, i64{1}, i64{31}, i64{32}, i64{33}, i64{1000}, i64{8192}, i64{1} << 20, i64{100000007}})
    for (const i64 cols : {i64{1}, i64{8}, i64{40}, i64{1536}, i64{50304}, i64{400000}}) {
      SCOPED_TRACE(testing::Message() << rows << " x " << cols);
      // A block column covers `per_block` columns: kThreads for the
      // one-column-a-thread kernels, kTileGroups groups for the tiled ones.
      auto check = [&](const gs::Chunks& c, i64 per_block) {
        EXPECT_GE(c.col_blocks * per_block, cols);
        EXPECT_LT((c.col_blocks - 1) * per_block, std::max<i64>(cols, 1));  // no empty block column
        EXPECT_GE(c.used, 1);
        EXPECT_LE(c.used, 65535);
        EXPECT_GE(c.used * c.per_chunk, rows);
        if (rows > 0) {
          EXPECT_LT((c.used - 1) * c.per_chunk, rows);  // no empty chunk
        }
      };
      const auto plain = gs::column_chunks(rows, cols);
      check(plain, gs::kThreads);
      const auto dropout = gs::dropout_column_chunks(rows, cols);  // any cols: four a thread, the last partly
      check(dropout, gs::kTileGroups * gs::kDropoutColumns);
      EXPECT_EQ(gs::dropout_bias_grad_bytes(rows, cols),
                static_cast<std::size_t>(dropout.used * cols) * sizeof(double));
      // One wave of its resident blocks (three an SM on 132 SMs) wherever the
      // block columns alone fit in one.
      if (dropout.col_blocks <= gs::kDropoutBlocksPerSm * 132) {
        EXPECT_LE(dropout.col_blocks * dropout.used, gs::kDropoutBlocksPerSm * 132);
      }
      for (const DType dt : {DType::F32, DType::BF16, DType::F64}) {
        const std::size_t bytes = gs::column_sums_bytes(dt, rows, cols, 2);
        // One chunk (every row in it) needs no scratch: the sums go straight into the result.
        EXPECT_GE(bytes, plain.used > 1 ? static_cast<std::size_t>(plain.used * cols) * sizeof(double) : 0);
        const i64 vec = static_cast<i64>(16 / dtype_size(dt));
        std::size_t packed_bytes = 0;
        if (dt != DType::F64 && cols % vec == 0 && rows > 0) {
          const auto packed = gs::packed_column_chunks(rows, cols, vec);
          check(packed, gs::kTileGroups * vec);
          if (packed.used > 1) packed_bytes = static_cast<std::size_t>(packed.used * cols * 2) * sizeof(double);
          EXPECT_GE(bytes, packed_bytes);
        }
        if (plain.used == 1 && packed_bytes == 0) {
          EXPECT_EQ(bytes, 0u);
        }
      }
    }
}

// The dropout backward's grids at the two shapes an H200 timed it at
// (2026-11-28: 1164 GB/s at [8192, 1024], 1510 at [32768, 8192], while
// bias-dropout-add moved its bytes at 2249 and 2886): 8 x 66 and 64 x 9
// blocks, a full wave of three an SM and a third of another, before; one
// wave now, each chunk at least 64 rows.
TEST(LayerKernels, DropoutBackwardGridIsOneWave) {
  namespace gs = gpu_scratch;
  const auto small = gs::dropout_column_chunks(8192, 1024), large = gs::dropout_column_chunks(32768, 8192);
  EXPECT_EQ(small.col_blocks, 8);
  EXPECT_EQ(small.used, 49);  // 392 blocks of 396 places
  EXPECT_EQ(large.col_blocks, 64);
  EXPECT_EQ(large.used, 6);                                    // 384 blocks
  EXPECT_EQ(gs::dropout_column_chunks(200, 1024).used, 4);     // 64 rows a chunk at least
  EXPECT_EQ(gs::dropout_column_chunks(8192, 400000).used, 1);  // wider than a wave: one chunk
}

// LayerNorm's one-pass backward: every row in exactly one (block, lane, step),
// a thread's packs cover the row, blocks within 512 threads, at least 8 rows
// a lane (so the partial rows cost at most an eighth of what was read), and
// the scratch holds the partials or the split path's sums, whichever runs.
TEST(LayerKernels, LayerNormFusedBackwardPlanCoversEveryRowOnce) {
  namespace gs = gpu_scratch;
  for (const DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64})
    for (const i64 rows : {1, 7, 37, 1000, 8192, 32768})
      for (const i64 cols : {8, 64, 1000, 1024, 2048, 4096, 4104, 8192, 12288}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::to_string(rows) + " x " + std::to_string(cols));
        const auto p = gs::layernorm_fused_plan(dt, rows, cols);
        const i64 vec = static_cast<i64>(16 / dtype_size(dt));
        const i64 packs = cols / vec;
        const bool expect_fused = dt != DType::F64 && cols % vec == 0 && packs <= 2 * gs::kLayerNormFusedMaxThreads;
        ASSERT_EQ(p.fused(), expect_fused);
        if (!p.fused()) {
          EXPECT_EQ(p.partial_bytes(cols), 0u);
          continue;
        }
        EXPECT_EQ(p.threads_per_row % 32, 0);
        EXPECT_GE(p.threads_per_row * p.packs_per_thread, packs);
        EXPECT_LT((p.threads_per_row - 32) * p.packs_per_thread, packs);  // no warp without a pack
        EXPECT_LE(p.lanes * p.threads_per_row, gs::kLayerNormFusedMaxThreads);
        EXPECT_TRUE(p.packs_per_thread == 1 || p.lanes == 1);  // the kernel's shared-memory combine
        EXPECT_GE(p.rows_per_lane, gs::kLayerNormMinRowsPerLane);
        EXPECT_GE(p.blocks * p.lanes * p.rows_per_lane, rows);
        EXPECT_LT((p.blocks - 1) * p.lanes * p.rows_per_lane, rows);  // no empty block
        EXPECT_EQ(p.partial_bytes(cols), static_cast<std::size_t>(2 * p.blocks * cols) * sizeof(double));
        EXPECT_GE(gs::layernorm_backward_bytes(dt, rows, cols), p.partial_bytes(cols));
        EXPECT_GE(gs::layernorm_backward_bytes(dt, rows, cols), gs::column_sums_bytes(dt, rows, cols, 2));
      }
  // The two shapes the benchmarks time: GPT-2 medium (four rows a block at
  // once, 256 blocks) and the 100B layer (two packs a thread, 263 blocks).
  const auto gpt = gs::layernorm_fused_plan(DType::BF16, 8192, 1024);
  EXPECT_EQ(gpt.packs_per_thread, 1);
  EXPECT_EQ(gpt.lanes, 4);
  EXPECT_EQ(gpt.blocks, 256);
  const auto layer = gs::layernorm_fused_plan(DType::BF16, 32768, 8192);
  EXPECT_EQ(layer.packs_per_thread, 2);
  EXPECT_EQ(layer.threads_per_row, 512);
  EXPECT_EQ(layer.blocks, 263);
}

TEST(LayerKernels, RejectsBadShapesAndDtypes) {
  Tensor x = empty({4, 8}), y = empty({4, 8}), g = empty({8}), m = empty({4});
  expect_rejected([&] { layernorm_forward(x, empty({7}), g, 1e-5, y, m, m); }, "layernorm_forward: gamma has shape");
  Tensor m3 = empty({3});
  expect_rejected([&] { layernorm_forward(x, g, g, 1e-5, y, m3, m); }, "layernorm_forward: mean must have shape");
  expect_rejected([&] { layernorm_forward(x, empty({8}, DType::F32), g, 1e-5, y, m, m); },
                  "layernorm_forward: gamma must be");  // mixed dtypes
  Tensor h = empty({4}, DType::I32), transposed = empty({8, 4}), scores = empty({2, 3, 4});
  expect_rejected([&] { gelu_forward(h, h); }, "gelu_forward: x must be fp32, fp64, bf16 or fp16");  // not a float
  expect_rejected([&] { gelu_forward(x, transposed); }, "gelu_forward: y has shape");                // shape differs
  Tensor wide_queries = empty({2, 4, 3});
  expect_rejected([&] { causal_softmax_forward(wide_queries, 1.0, wide_queries); }, "sq <= sk");  // sq > sk
  expect_rejected([&] { causal_softmax_backward(scores, scores, 1.0, scores); }, "sq == sk");     // sq != sk
  Tensor out = empty({3, 8});
  const Tensor fp64_ids = tensor({3}, {0, 1, 2}), two_ids = ids_tensor({0, 1});
  expect_rejected([&] { embedding_forward(fp64_ids, x, 0, out); }, "embedding_forward: ids must be int64");
  expect_rejected([&] { embedding_forward(two_ids, x, 0, out); }, "embedding_forward: out has shape");
  const Tensor four_ids = ids_tensor({0, 1, 2, 3});
  expect_rejected([&] { cross_entropy_forward(x, four_ids, 0, 9, m, m, m); },
                  "cross_entropy_forward: valid columns 9");  // valid > V_local
  Tensor strided = empty({4, 16}).narrow(1, 0, 8);
  expect_rejected([&] { gelu_forward(strided, y); }, "gelu_forward: x must be contiguous");
  expect_rejected([&] { add_bias(y, empty({4})); }, "add_bias: bias has shape");
}

// Results are bitwise identical for any number of threads, and the parallel
// paths (taken above the size threshold) agree with the serial ones.
TEST(LayerKernels, SameBitsForAnyThreadCount) {
  std::mt19937 rng(21);
  const i64 rows = 600, cols = 130;
  const Vec x = randn(usize(rows * cols), rng), w = randn(usize(rows * cols), rng), sc = randn(120000, rng, 3.0);
  auto run_all = [&]() {
    std::vector<Vec> out;
    Tensor xt = tensor({rows, cols}, x), wt = tensor({rows, cols}, w);
    Tensor y = empty({rows, cols}), mean = empty({rows}), rstd = empty({rows}),
           gamma = tensor({cols}, Vec(usize(cols), 1.5));
    Tensor dg = tensor({cols}, Vec(usize(cols), 0.0)), db = tensor({cols}, Vec(usize(cols), 0.0)),
           dx = empty({rows, cols});
    layernorm_forward(xt, gamma, gamma, 1e-5, y, mean, rstd);
    layernorm_backward(wt, xt, gamma, mean, rstd, dx, dg, db);
    out.push_back(vals(y)), out.push_back(vals(dx)), out.push_back(vals(dg)), out.push_back(vals(db));
    Tensor d = empty({rows, cols});
    dropout_forward(xt, 0.3, RngKey{1, 2, 3, kRngEmbeddingDropout}, DropoutLayout{1, 1, rows, cols, 0, 0, 1}, d);
    out.push_back(vals(d));
    Tensor s = tensor({3, 200, 200}, sc), pr = empty({3, 200, 200});
    causal_softmax_forward(s, 0.5, pr);
    out.push_back(vals(pr));
    Tensor dpos = tensor({100, cols}, Vec(usize(100 * cols), 0.0));
    position_embedding_backward(tensor({rows, cols}, w), 100, dpos);
    out.push_back(vals(dpos));
    return out;
  };
  const int before = cpu_math_threads();
  set_cpu_math_threads(1);
  const auto one = run_all();
  set_cpu_math_threads(4);
  const auto four = run_all();
  set_cpu_math_threads(before);
  for (std::size_t k = 0; k < one.size(); ++k) EXPECT_EQ(one[k], four[k]) << "output " << k;
}

// =========================== 16-bit storage ===========================
// (kernel_test_util.h: inputs rounded to the dtype first, the fp64 reference on
// the same values, each output within one rounding or bit for bit.)

TEST(HalfStorage, DtypeRules) {
  EXPECT_EQ(row_stat_dtype(DType::BF16), DType::F32);
  EXPECT_EQ(row_stat_dtype(DType::F16), DType::F32);
  EXPECT_EQ(row_stat_dtype(DType::F32), DType::F32);
  EXPECT_EQ(row_stat_dtype(DType::F64), DType::F64);
  for (DType t : kHalfDtypes) {
    EXPECT_TRUE(is_grad_accumulator_dtype(t, t));
    EXPECT_TRUE(is_grad_accumulator_dtype(t, DType::F32));
    EXPECT_FALSE(is_grad_accumulator_dtype(t, DType::F64));
  }
  EXPECT_FALSE(is_grad_accumulator_dtype(DType::BF16, DType::F16));
  EXPECT_FALSE(is_grad_accumulator_dtype(DType::F64, DType::F32));
  EXPECT_FALSE(is_grad_accumulator_dtype(DType::F32, DType::BF16));
}

TEST(HalfStorage, StatisticsMustBeFp32AndAccumulatorsStorageOrFp32) {
  for (DType t : kHalfDtypes) {
    SCOPED_TRACE(dtype_name(t));
    const DType other = t == DType::BF16 ? DType::F16 : DType::BF16;
    const auto zeros = [](const Shape& shape, DType dt) { return Tensor::zeros(cpu(), shape, dt, MC::Other); };
    Tensor x = zeros({4, 8}, t), y = zeros({4, 8}, t), g = zeros({8}, t), m = zeros({4}, DType::F32);
    Tensor m16 = zeros({4}, t), m64 = zeros({4}, DType::F64), g64 = zeros({8}, DType::F64), g_other = zeros({8}, other);
    Tensor y_other = zeros({4, 8}, other);
    layernorm_forward(x, g, g, 1e-5, y, m, m);  // fp32 statistics: accepted
    expect_rejected([&] { layernorm_forward(x, g, g, 1e-5, y, m16, m); },
                    "layernorm_forward: mean must be fp32 (per-row statistics of 16-bit activations are kept in fp32)");
    expect_rejected([&] { layernorm_forward(x, g, g, 1e-5, y, m, m64); }, "layernorm_forward: rstd must be fp32");
    expect_rejected([&] { layernorm_forward(x, empty({8}, other), g, 1e-5, y, m, m); },
                    std::string("layernorm_forward: gamma must be ") + std::string(dtype_name(t)));
    Tensor dg = zeros({8}, t), dg32 = zeros({8}, DType::F32);
    layernorm_backward(x, x, g, m, m, y, dg, dg32);  // storage-dtype and fp32 accumulators, mixed
    expect_rejected([&] { layernorm_backward(x, x, g, m, m16, y, dg, dg); }, "layernorm_backward: rstd must be fp32");
    expect_rejected([&] { layernorm_backward(x, x, g, m, m, y, g64, dg); },
                    std::string("layernorm_backward: dgamma must be ") + std::string(dtype_name(t)) + " or fp32");
    expect_rejected([&] { layernorm_backward(x, x, g, m, m, y, dg, g_other); }, "layernorm_backward: dbeta must be");
    expect_rejected([&] { bias_grad(x, g_other); }, "bias_grad: dbias must be");
    expect_rejected([&] { column_sums(x, g_other); }, "column_sums: sums must be");
    expect_rejected(
        [&] {
          add(x, empty({4, 8}, other), y);
        },
        std::string("add: b must be ") + std::string(dtype_name(t)));
    expect_rejected([&] { gelu_backward(empty({4, 8}, DType::F32), x, y); }, "gelu_backward: dy must be");
    Tensor ids = ids_tensor({0, 1, 2, 3});
    expect_rejected([&] { embedding_backward(ids, x, 0, m64); }, "embedding_backward: dtable must be");
    Tensor dpos16 = empty({2, 8}, other);
    expect_rejected([&] { position_embedding_backward(x, 2, dpos16); },
                    "position_embedding_backward: position gradient must be");
    expect_rejected([&] { cross_entropy_forward(x, ids, 0, 8, m16, m, m); },
                    "cross_entropy_forward: row_max must be fp32");
    expect_rejected([&] { cross_entropy_forward(x, ids, 0, 8, m, m16, m); },
                    "cross_entropy_forward: sum_exp must be fp32");
    expect_rejected([&] { cross_entropy_forward(x, ids, 0, 8, m, m, m16); },
                    "cross_entropy_forward: target_logit must be fp32");
    expect_rejected([&] { rescale_sum_exp(m, m16, m); }, "rescale_sum_exp: global_max must be fp32");
    expect_rejected([&] { cross_entropy_loss(m, m, m, m16); }, "cross_entropy_loss: statistics must be fp32 or fp64");
    expect_rejected([&] { cross_entropy_backward(x, m, m16, ids, 0, 8, 1.0, y); },
                    "cross_entropy_backward: sum_exp must be fp32");
    expect_rejected([&] { cross_entropy_backward(x, m16, m, ids, 0, 8, 1.0, y); },
                    "cross_entropy_backward: global_max must be fp32");
    expect_rejected([&] { cross_entropy_backward(x, m, m, ids, 0, 8, 1.0, y_other); },
                    std::string("cross_entropy_backward: dlogits must be ") + std::string(dtype_name(t)));
    expect_rejected([&] { cross_entropy_forward_backward(x, ids, 8, 1.0, m, m16, m, x); },
                    "cross_entropy_forward_backward: sum_exp must be fp32");
    expect_rejected([&] { cross_entropy_forward_backward(x, ids, 8, 1.0, m, m, m, y_other); },
                    std::string("cross_entropy_forward_backward: dlogits must be ") + std::string(dtype_name(t)));
  }
  // fp32/fp64 storage: statistics and accumulators keep the storage dtype.
  Tensor x = empty({4, 8}, DType::F32), dbias16 = empty({8}, DType::BF16);
  expect_rejected([&] { bias_grad(x, dbias16); }, "bias_grad: dbias must be fp32 (a gradient");
  Tensor x64 = empty({4, 8}), m32 = empty({4}, DType::F32);
  const Tensor ids4 = ids_tensor({0, 1, 2, 3});
  expect_rejected([&] { cross_entropy_forward(x64, ids4, 0, 8, m32, m32, m32); },
                  "cross_entropy_forward: row_max must be fp64");
  Tensor dpos32 = empty({2, 8}, DType::F32);
  expect_rejected([&] { position_embedding_backward(x64, 2, dpos32); }, "position gradient must be fp64");
  // The meta device validates the same rules.
  auto meta = make_device(DeviceKind::Meta);
  Tensor mx = Tensor::empty(meta, {4, 8}, DType::BF16, MC::Other),
         mg = Tensor::empty(meta, {8}, DType::BF16, MC::Other);
  Tensor mm = Tensor::empty(meta, {4}, DType::F32, MC::Other), mm16 = Tensor::empty(meta, {4}, DType::BF16, MC::Other);
  layernorm_forward(mx, mg, mg, 1e-5, mx, mm, mm);
  expect_rejected([&] { layernorm_forward(mx, mg, mg, 1e-5, mx, mm16, mm); }, "mean must be fp32");
}

TEST(HalfStorage, SameBitsForAnyThreadCount) {
  std::mt19937 rng(62);
  const i64 rows = 600, cols = 130, v = 50;
  const Vec x = randn(usize(rows * cols), rng), w = randn(usize(rows * cols), rng), sc = randn(120000, rng, 3.0);
  std::vector<i64> idv(usize(rows));
  for (auto& id : idv) id = std::uniform_int_distribution<i64>(0, v - 1)(rng);
  auto run_all = [&](DType t) {
    std::vector<Vec> out;
    Tensor xt = tensor({rows, cols}, x, t), wt = tensor({rows, cols}, w, t);
    Tensor y = empty({rows, cols}, t), mean = empty({rows}, DType::F32), rstd = empty({rows}, DType::F32),
           gamma = tensor({cols}, Vec(usize(cols), 1.5), t);
    Tensor dg = tensor({cols}, Vec(usize(cols), 0.0), t), db = tensor({cols}, Vec(usize(cols), 0.0), DType::F32),
           dx = empty({rows, cols}, t);
    layernorm_forward(xt, gamma, gamma, 1e-5, y, mean, rstd);
    layernorm_backward(wt, xt, gamma, mean, rstd, dx, dg, db);
    out.push_back(vals(y)), out.push_back(vals(dx)), out.push_back(vals(dg)), out.push_back(vals(db));
    Tensor d = empty({rows, cols}, t);
    dropout_forward(xt, 0.3, RngKey{1, 2, 3, kRngEmbeddingDropout}, DropoutLayout{1, 1, rows, cols, 0, 0, 1}, d);
    out.push_back(vals(d));
    Tensor s = tensor({3, 200, 200}, sc, t), pr = empty({3, 200, 200}, t);
    causal_softmax_forward(s, 0.5, pr);
    out.push_back(vals(pr));
    Tensor dpos = tensor({100, cols}, Vec(usize(100 * cols), 0.0), t);
    position_embedding_backward(wt, 100, dpos);
    out.push_back(vals(dpos));
    for (DType acc : {t, DType::F32}) {
      Tensor dtable = tensor({v, cols}, Vec(usize(v * cols), 0.0), acc);
      embedding_backward(ids_tensor(idv), wt, 0, dtable);
      out.push_back(vals(dtable));
    }
    return out;
  };
  expect_same_bits_with_1_and_4_threads(kHalfDtypes, run_all);
}

}  // namespace
