// --attention-backend cudnn, in two halves.
//
// Without a GPU (CPU CI): cuDNN itself validates every tensor and operation
// descriptor we lower from megazero/cuda/sdpa_graph.h (dims, strides, types,
// each operation's operands) — forward and backward, bf16/fp16, with and
// without dropout, contiguous and interleaved-QKV strides; a deliberately
// broken graph is refused with a message naming the operation; what the
// backend cannot run is refused naming the flags. (test_sdpa_graph proves the
// graphs' math against our kernels; test_gpt_tp, test_layer_gradients and
// test_activation_memory prove the layer's strided plumbing through the
// entry's host reference.)
//
// With a GPU (tools/gpu_session.sh cudnn): the cuDNN engines against our CPU
// fused attention in fp64 on the same bf16 inputs, p = 0, through strided
// views of one QKV buffer exactly as the layer passes them; dropout
// statistically (the kept fraction is 1 - p within 5 sigma) and for
// consistency (the backward drops what the forward dropped, and a rerun
// repeats bit for bit); the plan cache (one plan per shape and direction).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <set>

#include "layers/attention.h"
#include "megazero/comm/mpi_communicator.h"
#include "megazero/core/error.h"
#include "megazero/core/tensor.h"
#include "megazero/cuda/cuda_device.h"
#include "megazero/cuda/cudnn_sdpa.h"
#include "megazero/cuda/sdpa_graph.h"
#include "megazero/kernels/cudnn_attention.h"
#include "megazero/kernels/fused_attention.h"

using namespace megazero;
namespace sdpa = megazero::cuda::sdpa;
using i64 = std::int64_t;

namespace {

// The layer's layouts: interleaved = views of the QKV rows (multi-head: q, k,
// v; with hk < h groups: k, v and dk, dv, q a contiguous copy).
sdpa::Problem problem(i64 b, i64 h, i64 s, i64 d, sdpa::ElementType t, double p, bool interleaved, i64 hk = 0) {
  sdpa::Problem pr;
  pr.b = b, pr.h = h, pr.s = s, pr.d = d, pr.hk = hk, pr.io = t, pr.scale = 1.0 / std::sqrt(static_cast<double>(d));
  pr.dropout = p;
  const i64 g = hk > 0 ? hk : h, per = h / g;
  const sdpa::Strides4 kv = interleaved ? sdpa::interleaved_strides(s, g, per + 2, d) : sdpa::bhsd_strides(b, g, s, d);
  const sdpa::Strides4 q = interleaved && per == 1 ? kv : sdpa::bhsd_strides(b, h, s, d);
  const sdpa::Strides4 rows = interleaved ? sdpa::interleaved_strides(s, h, 1, d) : sdpa::bhsd_strides(b, h, s, d);
  pr.q = pr.dq = q;
  pr.k = pr.v = pr.dk = pr.dv = kv;
  pr.o = pr.d_o = rows;
  return pr;
}

TEST(CudnnDescriptors, EveryTensorAndOperationFinalizes) {
  std::printf("[cudnn] %s\n", cuda::cudnn_versions().c_str());
  int graphs = 0;
  for (sdpa::ElementType t : {sdpa::ElementType::bf16, sdpa::ElementType::f16})
    for (double p : {0.0, 0.1})
      for (bool interleaved : {false, true})
        for (i64 hk : {0, 2, 1})             // multi-head, grouped, multi-query
          for (bool bias : {false, true}) {  // per-document masks as an additive bias
            sdpa::Problem pr = problem(2, 4, 256, 64, t, p, interleaved, hk);
            pr.bias = bias;
            const sdpa::Graph fwd = sdpa::forward_graph(pr);
            EXPECT_EQ(cuda::finalize_operations(fwd), static_cast<int>(fwd.ops.size()));
            for (bool deterministic : {false, true}) {
              pr.deterministic = deterministic;
              const sdpa::Graph bwd = sdpa::backward_graph(pr);
              EXPECT_EQ(cuda::finalize_operations(bwd), static_cast<int>(bwd.ops.size()));
              ++graphs;
            }
            ++graphs;
          }
  EXPECT_EQ(graphs, 144);
}

TEST(CudnnDescriptors, ABrokenGraphIsRefusedNamingTheOperation) {
  sdpa::Graph g = sdpa::forward_graph(problem(1, 2, 64, 32, sdpa::ElementType::bf16, 0.0, false));
  // The P V product's output claims a head size V does not have: cuDNN's
  // matmul validation must refuse it, and the message must say which op.
  for (sdpa::GraphTensor& t : g.tensors)
    if (t.uid == sdpa::kO) t.dims[3] = 48, t.strides = {2 * 64 * 48, 64 * 48, 48, 1};
  try {
    cuda::finalize_operations(g);
    FAIL() << "a P V product with mismatched dims finalized";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("matmul_p_v"), std::string::npos) << e.what();
  }
}

// cuDNN keys its dropout by (seed, offset), the offset a position in its
// Philox counter that each thread reads a window from: every field of our
// masks' key, the iteration included, must change the seed itself (an
// iteration in the offset alone gave consecutive steps overlapping masks).
TEST(CudnnAttention, DropoutSeedsDifferInEveryFieldOfTheKey) {
  const RngKey key{1234, 7, 3, kRngAttentionDropout};
  kernels::DropoutLayout layout;
  layout.sample_offset = 16;
  layout.group_offset = 4;
  std::vector<std::pair<RngKey, kernels::DropoutLayout>> variants(6, {key, layout});
  variants[1].first.seed += 1;
  variants[2].first.iteration += 1;
  variants[3].first.layer += 1;
  variants[4].second.sample_offset += 8;
  variants[5].second.group_offset += 1;
  std::set<std::int64_t> seeds;
  for (const auto& [k, l] : variants) {
    const cuda::CudnnDropoutKey c = cuda::cudnn_dropout_seed(k, l);
    EXPECT_EQ(c.offset, 0);
    EXPECT_GE(c.seed, 0);  // cuDNN reads an int64
    seeds.insert(c.seed);
  }
  EXPECT_EQ(seeds.size(), variants.size());
  // The same key twice: the same mask (forward and backward drop alike).
  EXPECT_EQ(cuda::cudnn_dropout_seed(key, layout).seed, cuda::cudnn_dropout_seed(key, layout).seed);
}

TEST(CudnnAttention, RefusesDevicesAndShapesItCannotRun) {
  using kernels::cudnn_attention_unsupported;
  EXPECT_NE(cudnn_attention_unsupported(DeviceKind::CPU, DType::BF16, 64).find("--device cuda"), std::string::npos);
  EXPECT_NE(cudnn_attention_unsupported(DeviceKind::CUDA, DType::F32, 64).find("--bf16"), std::string::npos);
  EXPECT_NE(cudnn_attention_unsupported(DeviceKind::CUDA, DType::BF16, 160).find("160"), std::string::npos);
  EXPECT_EQ(cudnn_attention_unsupported(DeviceKind::CUDA, DType::BF16, 64), "");
  EXPECT_THROW(sdpa::forward_graph(problem(1, 2, 64, 12, sdpa::ElementType::bf16, 0.0, false)), ConfigError);
}

// The layer's start-up call builds the operands' views on the meta device
// (no memory) and plans only on a GPU: nothing to do on the CPU.
layers::GPTConfig layer_config(bool rope, std::int64_t groups = 0) {
  layers::GPTConfig cfg;
  cfg.num_layers = 1;
  cfg.hidden_size = 256;
  cfg.num_attention_heads = 4;
  cfg.vocab_size = 64;
  cfg.max_position_embeddings = 128;
  cfg.seq_length = 128;
  cfg.attention_dropout = 0.1;
  cfg.attention_backend = "cudnn";
  if (rope) cfg.position_embedding_type = "rope";
  cfg.num_query_groups = groups;
  return cfg;
}

TEST(CudnnAttention, PrepareAllocatesNothingAndPlansOnlyOnAGpu) {
  auto world = MpiCommunicator::world();
  layers::TpContext ctx{world.get(), make_device(DeviceKind::CPU), DType::BF16};
  layers::ParameterSet ps;
  layers::ParallelSelfAttention attn(ps, "attn", layer_config(false), 0, ctx);
  layers::StepInfo step;
  step.micro_batch = 2;
  step.seq = 128;
  const auto before = ctx.device->memory().snapshot().total_live_bytes;
  EXPECT_EQ(attn.prepare_kernels(step, 0.1), "");
  EXPECT_EQ(ctx.device->memory().snapshot().total_live_bytes, before);
}

// ---- on a GPU ----

class CudnnOnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU visible";
    gpu = make_device(DeviceKind::CUDA, 0);
    cpu = make_device(DeviceKind::CPU);
  }
  std::shared_ptr<Device> cpu, gpu;
  std::mt19937_64 rng{1234};

  // One [b, s, h, 3, d] QKV buffer (bf16) on the GPU and its [b, h, s, d] views.
  struct Qkv {
    Tensor buffer, q, k, v;
  };
  Qkv qkv(i64 b, i64 h, i64 s, i64 d, const std::function<double(i64, i64)>& value) {
    Tensor host = Tensor::empty(cpu, {b, s, h, 3 * d}, DType::BF16, MemoryCategory::Activations);
    std::vector<double> v(static_cast<std::size_t>(host.numel()));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = value(static_cast<i64>(i) % (3 * d) / d, static_cast<i64>(i));
    host.copy_from_doubles(v);
    Qkv out;
    out.buffer = Tensor::empty(gpu, {b, s, h, 3 * d}, DType::BF16, MemoryCategory::Activations);
    out.buffer.copy_from(host);
    out.q = out.buffer.narrow(3, 0, d).transpose(1, 2);
    out.k = out.buffer.narrow(3, d, d).transpose(1, 2);
    out.v = out.buffer.narrow(3, 2 * d, d).transpose(1, 2);
    return out;
  }
  // A contiguous fp64 [b*h, s, d] host copy of a [b, h, s, d] view.
  Tensor host64(const Tensor& view) {
    Tensor t = Tensor::empty(cpu, view.shape(), DType::F64, MemoryCategory::Activations);
    t.copy_from(view);
    return t.view({view.size(0) * view.size(1), view.size(2), view.size(3)});
  }
  Tensor rows(i64 b, i64 h, i64 s, i64 d) {  // [b, s, h*d] rows viewed as [b, h, s, d]
    Tensor t = Tensor::zeros(gpu, {b, s, h * d}, DType::BF16, MemoryCategory::Activations);
    return t.view({b, s, h, d}).transpose(1, 2);
  }
  Tensor random_rows(i64 b, i64 h, i64 s, i64 d) {  // rows() filled with N(0, 1) values
    Tensor out = rows(b, h, s, d);
    Tensor host = Tensor::empty(cpu, out.shape(), DType::BF16, MemoryCategory::Activations);
    std::normal_distribution<double> n(0, 1);
    std::vector<double> values(static_cast<std::size_t>(host.numel()));
    for (auto& x : values) x = n(rng);
    host.copy_from_doubles(values);
    out.copy_from(host);
    return out;
  }
  static kernels::DropoutLayout layout(i64 b, i64 h, i64 s) {
    kernels::DropoutLayout l;
    l.samples = b, l.groups = h, l.global_groups = h, l.matrix_rows = l.matrix_cols = s;
    return l;
  }
};

double max_rel(const Tensor& got, const Tensor& want) {
  const auto a = got.to_double_vector(), b = want.to_double_vector();
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num = std::max(num, std::abs(a[i] - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return num / std::max(den, 1e-30);
}

// What the trainer does at start-up (ParallelSelfAttention::prepare_kernels)
// builds exactly the plans the layer's steps then use: no new plan after it.
TEST_F(CudnnOnGpu, LayerPrepareBuildsThePlansTheStepsUse) {
  auto world = MpiCommunicator::world();
  for (auto [rope, groups] : {std::pair<bool, std::int64_t>{false, 0}, {true, 0}, {false, 2}, {true, 1}}) {
    SCOPED_TRACE(testing::Message() << (rope ? "rope" : "learned positions") << ", groups " << groups);
    layers::TpContext ctx{world.get(), gpu, DType::BF16};
    layers::ParameterSet ps;
    const layers::GPTConfig cfg = layer_config(rope, groups);
    layers::ParallelSelfAttention attn(ps, "attn", cfg, 0, ctx);
    ps.allocate(gpu, DType::BF16);
    ps.initialize(3);
    layers::StepInfo step;
    step.micro_batch = 2;
    step.seq = cfg.seq_length;
    step.iteration = 1;
    const std::string line = attn.prepare_kernels(step, cfg.attention_dropout);
    std::printf("[cudnn] %s\n", line.c_str());
    EXPECT_NE(line.find("backward engine"), std::string::npos) << line;
    const std::size_t plans = cuda::cudnn_sdpa_cached_plans();
    Tensor x =
        Tensor::empty(gpu, {step.micro_batch * step.seq, cfg.hidden_size}, DType::BF16, MemoryCategory::Activations);
    {
      Tensor host = Tensor::empty(cpu, x.shape(), DType::BF16, MemoryCategory::Activations);
      std::normal_distribution<double> n(0, 1);
      std::vector<double> values(static_cast<std::size_t>(host.numel()));
      for (auto& v : values) v = n(rng);
      host.copy_from_doubles(values);
      x.copy_from(host);
    }
    const Tensor y = attn.forward(x, step);
    const Tensor dx = attn.backward(y);
    for (double v : dx.to_double_vector()) ASSERT_TRUE(std::isfinite(v));
    EXPECT_EQ(cuda::cudnn_sdpa_cached_plans(), plans) << "the step planned again: its operands differ from prepare's";
  }
}

TEST_F(CudnnOnGpu, MatchesTheCpuFusedAttentionWithoutDropout) {
  for (auto [b, h, s, d] : {std::array<i64, 4>{2, 4, 256, 64}, {1, 2, 1000, 128}, {3, 1, 77, 32}}) {
    std::normal_distribution<double> n(0, 1);
    Qkv in = qkv(b, h, s, d, [&](i64, i64) { return n(rng); });
    Tensor o = rows(b, h, s, d), lse = Tensor::empty(gpu, {b * h, s}, DType::F32, MemoryCategory::Activations);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const auto l = layout(b, h, s);
    kernels::cudnn_attention_forward(in.q, in.k, in.v, scale, 0.0, RngKey{}, l, o, lse);

    const Tensor q = host64(in.q), k = host64(in.k), v = host64(in.v);
    Tensor ref_o = Tensor::empty(cpu, {b * h, s, d}, DType::F64, MemoryCategory::Activations);
    Tensor ref_lse = Tensor::empty(cpu, {b * h, s}, DType::F64, MemoryCategory::Activations);
    kernels::fused_attention_forward(q, k, v, scale, 0.0, RngKey{}, l, ref_o, ref_lse);
    EXPECT_LT(max_rel(host64(o), ref_o), 1e-2) << b << "x" << h << "x" << s << "x" << d;
    EXPECT_LT(max_rel(lse, ref_lse), 1e-3);

    Tensor d_o = random_rows(b, h, s, d);
    Tensor dqkv = Tensor::zeros(gpu, {b, s, h, 3 * d}, DType::BF16, MemoryCategory::Activations);
    Tensor dq = dqkv.narrow(3, 0, d).transpose(1, 2), dk = dqkv.narrow(3, d, d).transpose(1, 2),
           dv = dqkv.narrow(3, 2 * d, d).transpose(1, 2);
    Tensor rdq = Tensor::empty(cpu, {b * h, s, d}, DType::F64, MemoryCategory::Activations);
    Tensor rdk = rdq.clone(MemoryCategory::Activations), rdv = rdq.clone(MemoryCategory::Activations);
    kernels::fused_attention_backward(q, k, v, host64(o), host64(d_o), ref_lse, scale, 0.0, RngKey{}, l, rdq, rdk, rdv);
    for (bool deterministic : {false, true}) {  // cuDNN's default (fp32 dQ accumulator) and deterministic backward
      SCOPED_TRACE(deterministic ? "deterministic" : "default");
      kernels::cudnn_attention_backward(in.q, in.k, in.v, o, d_o, lse, scale, 0.0, RngKey{}, l, deterministic, dq, dk,
                                        dv);
      EXPECT_LT(max_rel(host64(dq), rdq), 2e-2);
      EXPECT_LT(max_rel(host64(dk), rdk), 2e-2);
      EXPECT_LT(max_rel(host64(dv), rdv), 2e-2);
      if (deterministic) {  // and it repeats bit for bit
        const auto first = host64(dq).to_double_vector();
        kernels::cudnn_attention_backward(in.q, in.k, in.v, o, d_o, lse, scale, 0.0, RngKey{}, l, true, dq, dk, dv);
        EXPECT_EQ(host64(dq).to_double_vector(), first);
      }
    }
  }
  EXPECT_GE(cuda::cudnn_sdpa_cached_plans(), 6u);
}

// Per-document masks (--reset-attention-mask) as cuDNN's additive bias, in
// place in the QKV rows (the layer's multi-head layout): the CPU's fused
// attention with the same key starts, forward and both backwards; and the
// masks matter (without them the output differs).
TEST_F(CudnnOnGpu, DocumentMasksMatchTheCpu) {
  const i64 b = 2, h = 4, s = 256, d = 64;
  std::normal_distribution<double> n(0, 1);
  Qkv in = qkv(b, h, s, d, [&](i64, i64) { return n(rng); });
  Tensor starts_host = Tensor::empty(cpu, {b * s}, DType::I64, MemoryCategory::Activations);
  for (i64 sample = 0; sample < b; ++sample)
    for (i64 i = 0, start = 0; i < s; ++i) {
      if (i == 64 + sample || i == 65 + sample || i == 130 || i == 200) start = i;
      starts_host.host_data<std::int64_t>()[sample * s + i] = start;
    }
  Tensor starts = Tensor::empty(gpu, {b * s}, DType::I64, MemoryCategory::Activations);
  starts.copy_from(starts_host);
  Tensor o = rows(b, h, s, d), lse = Tensor::empty(gpu, {b * h, s}, DType::F32, MemoryCategory::Activations);
  Tensor plain_o = rows(b, h, s, d);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const auto l = layout(b, h, s);
  kernels::cudnn_attention_forward(in.q, in.k, in.v, scale, 0.0, RngKey{}, l, o, lse, starts);
  kernels::cudnn_attention_forward(in.q, in.k, in.v, scale, 0.0, RngKey{}, l, plain_o, lse);
  kernels::cudnn_attention_forward(in.q, in.k, in.v, scale, 0.0, RngKey{}, l, o, lse, starts);  // lse: the masked one
  const Tensor q = host64(in.q), k = host64(in.k), v = host64(in.v);
  Tensor ref_o = Tensor::empty(cpu, {b * h, s, d}, DType::F64, MemoryCategory::Activations);
  Tensor ref_lse = Tensor::empty(cpu, {b * h, s}, DType::F64, MemoryCategory::Activations);
  kernels::fused_attention_forward(q, k, v, scale, 0.0, RngKey{}, l, ref_o, ref_lse, starts_host);
  EXPECT_LT(max_rel(host64(o), ref_o), 1e-2);
  EXPECT_LT(max_rel(lse, ref_lse), 1e-3);
  EXPECT_GT(max_rel(host64(plain_o), ref_o), 0.1) << "the masks must change the output";
  Tensor d_o = random_rows(b, h, s, d);
  Tensor dqkv = Tensor::zeros(gpu, {b, s, h, 3 * d}, DType::BF16, MemoryCategory::Activations);
  Tensor dq = dqkv.narrow(3, 0, d).transpose(1, 2), dk = dqkv.narrow(3, d, d).transpose(1, 2),
         dv = dqkv.narrow(3, 2 * d, d).transpose(1, 2);
  Tensor rdq = Tensor::empty(cpu, {b * h, s, d}, DType::F64, MemoryCategory::Activations);
  Tensor rdk = rdq.clone(MemoryCategory::Activations), rdv = rdq.clone(MemoryCategory::Activations);
  kernels::fused_attention_backward(q, k, v, host64(o), host64(d_o), ref_lse, scale, 0.0, RngKey{}, l, rdq, rdk, rdv,
                                    starts_host);
  for (bool deterministic : {false, true}) {
    SCOPED_TRACE(deterministic ? "deterministic" : "default");
    kernels::cudnn_attention_backward(in.q, in.k, in.v, o, d_o, lse, scale, 0.0, RngKey{}, l, deterministic, dq, dk, dv,
                                      starts);
    EXPECT_LT(max_rel(host64(dq), rdq), 2e-2);
    EXPECT_LT(max_rel(host64(dk), rdk), 2e-2);
    EXPECT_LT(max_rel(host64(dv), rdv), 2e-2);
  }
}

// Grouped-query attention: k, v with h / 2 heads (and multi-query, one); dk,
// dv come out summed over each group.
TEST_F(CudnnOnGpu, GroupedKeyValueHeadsMatchTheCpu) {
  const i64 b = 2, h = 4, s = 192, d = 64;
  for (i64 hk : {2, 1}) {
    SCOPED_TRACE(testing::Message() << hk << " k/v heads");
    std::normal_distribution<double> n(0, 1);
    auto random = [&](i64 heads) {
      Tensor host = Tensor::empty(cpu, {b, heads, s, d}, DType::BF16, MemoryCategory::Activations);
      std::vector<double> values(static_cast<std::size_t>(host.numel()));
      for (auto& x : values) x = n(rng);
      host.copy_from_doubles(values);
      Tensor g = Tensor::empty(gpu, host.shape(), DType::BF16, MemoryCategory::Activations);
      g.copy_from(host);
      return g;
    };
    const Tensor q = random(h), k = random(hk), v = random(hk), d_o = random(h);
    Tensor o = Tensor::empty(gpu, {b, h, s, d}, DType::BF16, MemoryCategory::Activations);
    Tensor lse = Tensor::empty(gpu, {b * h, s}, DType::F32, MemoryCategory::Activations);
    const double scale = 0.125;
    const auto l = layout(b, h, s);
    kernels::cudnn_attention_forward(q, k, v, scale, 0.0, RngKey{}, l, o, lse);
    Tensor dq = Tensor::empty(gpu, {b, h, s, d}, DType::BF16, MemoryCategory::Activations);
    Tensor dk = Tensor::empty(gpu, {b, hk, s, d}, DType::BF16, MemoryCategory::Activations);
    Tensor dv = Tensor::empty(gpu, {b, hk, s, d}, DType::BF16, MemoryCategory::Activations);
    kernels::cudnn_attention_backward(q, k, v, o, d_o, lse, scale, 0.0, RngKey{}, l, false, dq, dk, dv);

    // The CPU's fused attention in fp64 (grouped k/v; dk, dv per query head, summed here).
    const Tensor hq = host64(q), hk64 = host64(k), hv = host64(v), hdo = host64(d_o);
    Tensor ro = Tensor::empty(cpu, {b * h, s, d}, DType::F64, MemoryCategory::Activations);
    Tensor rl = Tensor::empty(cpu, {b * h, s}, DType::F64, MemoryCategory::Activations);
    kernels::fused_attention_forward(hq, hk64, hv, scale, 0.0, RngKey{}, l, ro, rl);
    Tensor rdq = ro.clone(MemoryCategory::Activations), rdk = ro.clone(MemoryCategory::Activations),
           rdv = ro.clone(MemoryCategory::Activations);
    kernels::fused_attention_backward(hq, hk64, hv, ro, hdo, rl, scale, 0.0, RngKey{}, l, rdq, rdk, rdv);
    EXPECT_LT(max_rel(host64(o), ro), 1e-2);
    EXPECT_LT(max_rel(host64(dq), rdq), 2e-2);
    const auto sum_groups = [&](const Tensor& per_head) {
      const auto x = per_head.to_double_vector();
      std::vector<double> out(static_cast<std::size_t>(b * hk * s * d), 0.0);
      const i64 block = s * d, per = h / hk;
      for (i64 bh = 0; bh < b * h; ++bh)
        for (i64 e = 0; e < block; ++e)
          out[static_cast<std::size_t>((bh / per) * block + e)] += x[static_cast<std::size_t>(bh * block + e)];
      Tensor t = Tensor::empty(cpu, {b * hk, s, d}, DType::F64, MemoryCategory::Activations);
      t.copy_from_doubles(out);
      return t;
    };
    EXPECT_LT(max_rel(host64(dk), sum_groups(rdk)), 2e-2);
    EXPECT_LT(max_rel(host64(dv), sum_groups(rdv)), 2e-2);
  }
}

// q = 0 makes every causal row uniform (P[i, j] = 1 / (i + 1)); v = e_0 makes
// O[i, 0] = (kept among j <= i) / ((i + 1) (1 - p)).
TEST_F(CudnnOnGpu, DropoutKeepsOneMinusPAndBackwardDropsTheSame) {
  const i64 b = 2, h = 4, s = 256, d = 64;
  const double p = 0.2;
  Qkv in = qkv(b, h, s, d, [&](i64 part, i64 i) { return part == 2 ? (i % d == 0 ? 1.0 : 0.0) : 0.0; });
  Tensor o = rows(b, h, s, d), lse = Tensor::empty(gpu, {b * h, s}, DType::F32, MemoryCategory::Activations);
  const RngKey key{7, 3, 1, 0};
  const auto l = layout(b, h, s);
  kernels::cudnn_attention_forward(in.q, in.k, in.v, 1.0, p, key, l, o, lse);
  const Tensor ho = host64(o);
  const auto ov = ho.to_double_vector();
  double kept = 0, total = 0, sum_o = 0;
  for (i64 bh = 0; bh < b * h; ++bh)
    for (i64 i = 0; i < s; ++i) {
      const double x = ov[static_cast<std::size_t>((bh * s + i) * d)];
      kept += x * (1 - p) * static_cast<double>(i + 1);
      total += static_cast<double>(i + 1);
      sum_o += x;
    }
  const double sigma = std::sqrt(p * (1 - p) / total);
  EXPECT_NEAR(kept / total, 1 - p, 5 * sigma + 0.01) << "kept " << kept << " of " << total;

  // Rerun: the same key repeats the mask bit for bit.
  Tensor o2 = rows(b, h, s, d);
  kernels::cudnn_attention_forward(in.q, in.k, in.v, 1.0, p, key, l, o2, lse);
  EXPECT_EQ(host64(o2).to_double_vector(), ov);

  // dO = e_0 on every row: sum_j dV[j, 0] = sum_i sum_j P~[i, j] = sum_i O[i, 0]
  // exactly when backward drops the elements forward dropped.
  Tensor d_o = rows(b, h, s, d);
  {
    Tensor host = Tensor::zeros(cpu, d_o.shape(), DType::BF16, MemoryCategory::Activations);
    std::vector<double> v(static_cast<std::size_t>(host.numel()), 0.0);
    for (std::size_t i = 0; i < v.size(); i += static_cast<std::size_t>(d)) v[i] = 1.0;
    host.copy_from_doubles(v);
    d_o.copy_from(host);
  }
  Tensor dqkv = Tensor::zeros(gpu, {b, s, h, 3 * d}, DType::BF16, MemoryCategory::Activations);
  Tensor dq = dqkv.narrow(3, 0, d).transpose(1, 2), dk = dqkv.narrow(3, d, d).transpose(1, 2),
         dv = dqkv.narrow(3, 2 * d, d).transpose(1, 2);
  kernels::cudnn_attention_backward(in.q, in.k, in.v, o, d_o, lse, 1.0, p, key, l, false, dq, dk, dv);
  const auto dvv = host64(dv).to_double_vector();
  double sum_dv = 0;
  for (std::size_t i = 0; i < dvv.size(); i += static_cast<std::size_t>(d)) sum_dv += dvv[i];
  EXPECT_NEAR(sum_dv, sum_o, 1e-2 * sum_o);
}

}  // namespace
