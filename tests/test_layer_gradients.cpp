// Finite-difference checks, in fp64, of every layer's explicit backward and of
// the whole GPT model (dropout on: masks are deterministic functions of the
// key, so the loss is a smooth function of the parameters), with and without
// activation recompute. TP = 1 here; test_gpt_tp proves TP > 1 equal to TP = 1.
#include <gtest/gtest.h>

#include <string>

#include "gradcheck.h"
#include "test_device.h"
#include "layers/gpt_model.h"
#include "layers/layernorm.h"
#include "layers/mappings.h"
#include "megazero/comm/mpi_communicator.h"
#include "megazero/core/error.h"
#include "megazero/kernels/gelu_bias.h"

using namespace megazero;
using namespace megazero::layers;
using namespace megazero::testing_util;

namespace {

class LayerGrad : public testing::Test {
 protected:
  void SetUp() override {
    world = MpiCommunicator::world();
    self = world->split(world->rank(), 0, "self");
    ctx.tp = self.get();
    ctx.device = make_device(DeviceKind::CPU);
    ctx.dtype = DType::F64;
    cfg.num_layers = 2;
    cfg.hidden_size = 16;
    cfg.num_attention_heads = 4;
    cfg.vocab_size = 37;
    cfg.max_position_embeddings = 12;
    cfg.seq_length = 6;
    cfg.hidden_dropout = 0.2;
    cfg.attention_dropout = 0.25;
    cfg.make_vocab_size_divisible_by = 8;
    step.micro_batch = 2;
    step.seq = 6;
    step.iteration = 3;
    step.sample_offset = 5;
  }
  void TearDown() override {
    self.reset();
    world.reset();
  }
  Tensor input(std::int64_t rows, std::int64_t cols, unsigned seed) {
    Tensor x = random_like(ctx.activation({rows, cols}), seed);
    return x;
  }
  std::vector<GradTarget> param_targets(ParameterSet& ps) {
    std::vector<GradTarget> t;
    for (auto* p : ps.all()) t.push_back({p->name, p->value, p->grad});
    return t;
  }
  // Loss = sum(w * f(x)); analytic grads from backward(w); then FD.
  template <typename Fwd, typename Bwd>
  void check_layer(ParameterSet& ps, Tensor x, Fwd fwd, Bwd bwd) {
    ps.allocate(ctx.device, DType::F64);
    ps.initialize(11);
    for (auto* p : ps.all())  // make biases and LN non-trivial
      if (p->init != Init::Normal) p->value.copy_from(random_like(p->value, 5, 0.5));
    Tensor out = fwd(x);
    Tensor w = random_like(out, 99);
    ps.zero_grad();
    Tensor dx = bwd(w);
    auto targets = param_targets(ps);
    if (dx.defined()) targets.push_back({"input", x, dx});
    expect_gradients_match_fd([&] { return dot(fwd(x), w); }, targets);
  }

  // The whole model (cfg) against finite differences, then: the padding rows
  // of `padded` (never looked up / masked from the softmax) have zero gradients.
  void check_whole_model(const std::vector<const char*>& padded) {
    ParameterSet ps;
    GPTModel model(cfg, ctx, ps);
    ps.allocate(ctx.device, DType::F64);
    ps.initialize(21);
    for (auto* p : ps.all())
      if (p->init != Init::Normal) p->value.copy_from(random_like(p->value, 8, 0.5));
    const std::int64_t n = step.micro_batch * step.seq;
    Tensor ids = Tensor::empty(ctx.device, {n}, DType::I64, MemoryCategory::Activations);
    Tensor targets = Tensor::empty(ctx.device, {n}, DType::I64, MemoryCategory::Activations);
    for (std::int64_t i = 0; i < n; ++i) {
      ids.host_data<std::int64_t>()[i] = (i * 7 + 3) % cfg.vocab_size;
      targets.host_data<std::int64_t>()[i] = (i * 5 + 1) % cfg.vocab_size;
    }
    model.forward(ids, targets, step);
    ps.zero_grad();
    model.backward(1.0);
    std::vector<GradTarget> t;
    for (auto* p : ps.all()) t.push_back({p->name, p->value, p->grad});
    expect_gradients_match_fd([&] { return model.forward(ids, targets, step); }, t, 4);
    for (const char* name : padded) {
      const auto& w = ps.get(name);
      const auto g = w.grad.to_double_vector();
      for (std::int64_t r = cfg.vocab_size; r < w.local_shape[0]; ++r)
        for (std::int64_t c = 0; c < cfg.hidden_size; ++c)
          ASSERT_EQ(g[static_cast<std::size_t>(r * cfg.hidden_size + c)], 0.0) << name << " padding row " << r;
    }
  }

  std::unique_ptr<MpiCommunicator> world;
  std::unique_ptr<Communicator> self;
  TpContext ctx;
  GPTConfig cfg;
  StepInfo step;
};

}  // namespace

TEST_F(LayerGrad, ColumnParallelLinear) {
  // --gemm-epilogues: the bias (forward) and its gradient (all) in the GEMMs
  for (const GemmEpilogues epilogues : {GemmEpilogues::None, GemmEpilogues::Forward, GemmEpilogues::All})
    for (bool gather : {false, true}) {
      SCOPED_TRACE(std::string("GEMM epilogues: ") + gemm_epilogues_name(epilogues));
      ctx.gemm_epilogues = epilogues;
      ParameterSet ps;
      ColumnParallelLinear lin(ps, "lin", 5, 7, true, gather, ctx, 0.3);
      check_layer(
          ps, input(4, 5, 1), [&](const Tensor& x) { return lin.forward(x); },
          [&](const Tensor& dy) { return lin.backward(dy); });
    }
}

TEST_F(LayerGrad, RowParallelLinear) {
  ParameterSet ps;
  RowParallelLinear lin(ps, "lin", 6, 3, true, ctx, 0.3);
  check_layer(
      ps, input(4, 6, 2), [&](const Tensor& x) { return lin.forward(x); },
      [&](const Tensor& dy) { return lin.backward(dy); });
}

TEST_F(LayerGrad, LayerNormLayer) {
  ParameterSet ps;
  LayerNorm ln(ps, "ln", 9, 1e-5, ctx);
  check_layer(
      ps, input(5, 9, 3), [&](const Tensor& x) { return ln.forward(x); },
      [&](const Tensor& dy) { return ln.backward(dy); });
}

TEST_F(LayerGrad, MLP) {
  // --no-bias-gelu-fusion, Megatron's bias-GeLU fusion, --gemm-epilogues (the
  // forward's: the backward's GeLU pass takes pre with its bias), =all
  for (const char* mode : {"separate", "bias-GeLU fusion", "GEMM epilogues", "GEMM epilogues, all"}) {
    SCOPED_TRACE(mode);
    const std::string m = mode;
    cfg.bias_gelu_fusion = m != "separate";
    ctx.gemm_epilogues = m == "GEMM epilogues"        ? GemmEpilogues::Forward
                         : m == "GEMM epilogues, all" ? GemmEpilogues::All
                                                      : GemmEpilogues::None;
    ParameterSet ps;
    ParallelMLP mlp(ps, "mlp", cfg, ctx);
    check_layer(
        ps, input(4, cfg.hidden_size, 4), [&](const Tensor& x) { return mlp.forward(x); },
        [&](const Tensor& dy) { return mlp.backward(dy); });
  }
}

// In fp32 the fusions change no bit on the CPU: output, input gradient, every
// parameter gradient. (--gemm-epilogues runs the unfused passes here: the
// same bits by construction, and a layer that wired the epilogues' operands
// wrongly — pre without its bias, a GeLU backward of the wrong tensor, a bias
// gradient summed twice or into the wrong layer — differs.)
TEST_F(LayerGrad, BiasGeluFusionAndGemmEpiloguesChangeNoBitInFp32) {
  ctx.dtype = DType::F32;
  struct Run {
    std::vector<double> out, dx;
    std::vector<std::vector<double>> grads;
  };
  auto run = [&](bool fusion, GemmEpilogues epilogues = GemmEpilogues::None) {
    cfg.bias_gelu_fusion = fusion;
    ctx.gemm_epilogues = epilogues;
    ParameterSet ps;
    ParallelMLP mlp(ps, "mlp", cfg, ctx);
    ps.allocate(ctx.device, DType::F32);
    ps.initialize(11);
    for (auto* p : ps.all())
      if (p->init != Init::Normal) p->value.copy_from(random_like(p->value, 5, 0.5));
    ps.zero_grad();
    const Tensor x = input(8, cfg.hidden_size, 4);
    Run r;
    const Tensor out = mlp.forward(x);
    r.out = out.to_double_vector();
    r.dx = mlp.backward(random_like(out, 99)).to_double_vector();
    for (auto* p : ps.all()) r.grads.push_back(p->grad.to_double_vector());
    return r;
  };
  const Run fused = run(true), unfused = run(false), epilogues = run(true, GemmEpilogues::Forward),
            all = run(true, GemmEpilogues::All);
  EXPECT_EQ(all.out, unfused.out);
  EXPECT_EQ(all.dx, unfused.dx);
  EXPECT_EQ(all.grads, unfused.grads);
  EXPECT_EQ(fused.out, unfused.out);
  EXPECT_EQ(fused.dx, unfused.dx);
  EXPECT_EQ(fused.grads, unfused.grads);
  EXPECT_EQ(epilogues.out, unfused.out);
  EXPECT_EQ(epilogues.dx, unfused.dx);
  EXPECT_EQ(epilogues.grads, unfused.grads);
}

TEST_F(LayerGrad, SelfAttentionWithDropout) {
  // cudnn: q/k/v and the context as strided views of the projections' buffers
  // (the kernels' host reference computes; the plumbing is the GPU's).
  for (const char* backend : {"unfused", "fused", "cudnn"}) {
    SCOPED_TRACE(backend);
    cfg.attention_backend = backend;
    ParameterSet ps;
    ParallelSelfAttention attn(ps, "attn", cfg, 0, ctx);
    check_layer(
        ps, input(step.micro_batch * step.seq, cfg.hidden_size, 5),
        [&](const Tensor& x) { return attn.forward(x, step); }, [&](const Tensor& dy) { return attn.backward(dy); });
  }
}

TEST_F(LayerGrad, TransformerLayerWithAndWithoutRecompute) {
  for (const GemmEpilogues epilogues : {GemmEpilogues::None, GemmEpilogues::Forward, GemmEpilogues::All})
    for (bool recompute : {false, true}) {
      SCOPED_TRACE(recompute ? "recompute" : "no recompute");
      SCOPED_TRACE(std::string("GEMM epilogues: ") + gemm_epilogues_name(epilogues));
      cfg.recompute_activations = recompute;
      ctx.gemm_epilogues = epilogues;
      ParameterSet ps;
      TransformerLayer layer(ps, cfg, 1, ctx);
      check_layer(
          ps, input(step.micro_batch * step.seq, cfg.hidden_size, 6),
          [&](const Tensor& x) { return layer.forward(x, step); },
          [&](const Tensor& dy) { return layer.backward(dy); });
    }
}

TEST_F(LayerGrad, WholeModelIncludingEmbeddingsTiedLogitsAndCrossEntropy) {
  for (bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recompute" : "no recompute");
    cfg.recompute_activations = recompute;
    // Padding rows of the word embedding: never looked up, masked from the softmax.
    check_whole_model({"embedding.word.weight"});
  }
}

// ---- Llama-style options (gpt_config.h): each layer, then the whole model.
namespace {
void make_llama(GPTConfig& c) {
  c.position_embedding_type = "rope";
  c.rotary_base = 500;  // small: the angles of a 6-token sequence vary a lot across dimensions
  c.normalization = "RMSNorm";
  c.swiglu = true;
  c.ffn_hidden_size = 24;
  c.num_query_groups = 2;  // 4 heads: 2 query heads per key/value head
  c.add_bias_linear = false;
  c.untie_embeddings = true;
}
}  // namespace

TEST_F(LayerGrad, RMSNormLayer) {
  cfg.normalization = "RMSNorm";
  ParameterSet ps;
  auto norm = make_normalization(ps, "ln", cfg, ctx);
  ASSERT_EQ(ps.all().size(), 1u) << "RMSNorm has a weight and no bias";
  check_layer(
      ps, input(5, cfg.hidden_size, 3), [&](const Tensor& x) { return norm->forward(x); },
      [&](const Tensor& dy) { return norm->backward(dy); });
}

TEST_F(LayerGrad, SwigluMLPWithAndWithoutBiases) {
  cfg.swiglu = true;
  cfg.ffn_hidden_size = 12;
  for (const bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "biases" : "no biases");
    cfg.add_bias_linear = bias;
    // The stacked [gate; up] bias in fc1's GEMM, and its gradient in the weight gradient's.
    ctx.gemm_epilogues = bias ? GemmEpilogues::All : GemmEpilogues::None;
    ParameterSet ps;
    ParallelMLP mlp(ps, "mlp", cfg, ctx);
    EXPECT_EQ(ps.get("mlp.fc1.weight").global_shape, (Shape{2, 12, cfg.hidden_size})) << "[gate; up] stacked";
    EXPECT_EQ(ps.all().size(), bias ? 4u : 2u);
    check_layer(
        ps, input(4, cfg.hidden_size, 4), [&](const Tensor& x) { return mlp.forward(x); },
        [&](const Tensor& dy) { return mlp.backward(dy); });
  }
}

TEST_F(LayerGrad, SquaredReluMLPWithAndWithoutBiases) {
  cfg.squared_relu = true;
  cfg.ffn_hidden_size = 12;
  for (const bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "biases" : "no biases");
    cfg.add_bias_linear = bias;
    ctx.gemm_epilogues = bias ? GemmEpilogues::All : GemmEpilogues::None;  // nothing of the activation fuses
    ParameterSet ps;
    ParallelMLP mlp(ps, "mlp", cfg, ctx);
    EXPECT_EQ(ps.all().size(), bias ? 4u : 2u);
    check_layer(
        ps, input(4, cfg.hidden_size, 5), [&](const Tensor& x) { return mlp.forward(x); },
        [&](const Tensor& dy) { return mlp.backward(dy); });
  }
}

TEST_F(LayerGrad, AttentionWithRotaryEmbeddingsAndQueryGroups) {
  for (const std::int64_t groups : {4, 2, 1}) {  // MHA, GQA, MQA
    for (const char* backend : {"unfused", "fused", "cudnn"}) {
      SCOPED_TRACE(testing::Message() << groups << " query groups, " << backend);
      cfg.position_embedding_type = "rope";
      cfg.rotary_base = 500;
      cfg.num_query_groups = groups;
      cfg.add_bias_linear = groups != 2;
      cfg.attention_backend = backend;
      ParameterSet ps;
      ParallelSelfAttention attn(ps, "attn", cfg, 0, ctx);
      EXPECT_EQ(ps.get("attn.qkv.weight").global_shape[0], (4 + 2 * groups) * cfg.head_dim());
      check_layer(
          ps, input(step.micro_batch * step.seq, cfg.hidden_size, 5),
          [&](const Tensor& x) { return attn.forward(x, step); }, [&](const Tensor& dy) { return attn.backward(dy); });
    }
  }
}

// --disable-bias-linear --add-qkv-bias (Qwen2): the QKV projection alone has
// a bias, on each backend; the parameter count counts it.
TEST_F(LayerGrad, AttentionWithQkvBiasOnly) {
  cfg.position_embedding_type = "rope";
  cfg.num_query_groups = 2;
  cfg.add_bias_linear = false;
  cfg.add_qkv_bias = true;
  for (const char* backend : {"unfused", "fused"}) {
    SCOPED_TRACE(backend);
    cfg.attention_backend = backend;
    ParameterSet ps;
    ParallelSelfAttention attn(ps, "attn", cfg, 0, ctx);
    ASSERT_EQ(ps.all().size(), 3u) << "qkv weight and bias, dense weight";
    EXPECT_EQ(ps.get("attn.qkv.bias").global_shape, (Shape{(4 + 2 * 2) * cfg.head_dim()}));
    check_layer(
        ps, input(step.micro_batch * step.seq, cfg.hidden_size, 8),
        [&](const Tensor& x) { return attn.forward(x, step); }, [&](const Tensor& dy) { return attn.backward(dy); });
  }
  ParameterSet ps;
  GPTModel model(cfg, ctx, ps);
  std::int64_t total = 0;
  for (auto* p : ps.all()) total += shape_numel(p->global_shape);
  EXPECT_EQ(total - (cfg.padded_vocab(1) - cfg.vocab_size) * cfg.hidden_size, cfg.parameter_count());
}

// --rotary-interleaved: rope on pairs (2i, 2i + 1), on each backend.
TEST_F(LayerGrad, AttentionWithInterleavedRotaryPairs) {
  for (const char* backend : {"unfused", "fused", "cudnn"}) {
    SCOPED_TRACE(backend);
    cfg.position_embedding_type = "rope";
    cfg.rotary_interleaved = true;
    cfg.num_query_groups = 2;
    cfg.attention_backend = backend;
    ParameterSet ps;
    ParallelSelfAttention attn(ps, "attn", cfg, 0, ctx);
    check_layer(
        ps, input(step.micro_batch * step.seq, cfg.hidden_size, 6),
        [&](const Tensor& x) { return attn.forward(x, step); }, [&](const Tensor& dy) { return attn.backward(dy); });
  }
}

TEST_F(LayerGrad, LlamaStyleModelWithAndWithoutRecompute) {
  make_llama(cfg);
  for (bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recompute" : "no recompute");
    cfg.recompute_activations = recompute;
    ParameterSet ps;
    GPTModel model(cfg, ctx, ps);
    for (const char* absent : {"embedding.position.weight", "layers.0.ln1.bias", "layers.0.mlp.fc1.bias",
                               "layers.0.attention.qkv.bias", "layers.0.attention.dense.bias"})
      EXPECT_THROW(ps.get(absent), InternalError) << absent << " should not exist";
    std::int64_t total = 0;
    for (auto* p : ps.all()) total += shape_numel(p->global_shape);
    const std::int64_t padding = (cfg.padded_vocab(1) - cfg.vocab_size) * cfg.hidden_size * 2;
    EXPECT_EQ(total - padding, cfg.parameter_count()) << "GPTConfig::parameter_count agrees with the model";
    // The output layer's padding rows are masked from the softmax; the word
    // embedding's are never looked up: both get zero gradients.
    check_whole_model({"embedding.word.weight", "output_layer.weight"});
  }
}

// --apply-layernorm-1p: every norm's weight w applied as 1 + w, initialised
// to 0: the same function as the plain norms at initialisation (bit for bit:
// 1 + 0 is 1), and finite differences of the whole model (every norm, LayerNorm
// and RMSNorm) with the weights moved off 0.
TEST_F(LayerGrad, ZeroCentredNormWeights) {
  cfg.layernorm_1p = true;
  for (const bool rms : {false, true}) {
    SCOPED_TRACE(rms ? "RMSNorm" : "LayerNorm");
    cfg.normalization = rms ? "RMSNorm" : "LayerNorm";
    ParameterSet ps;
    auto norm = make_normalization(ps, "n", cfg, ctx);
    ps.allocate(ctx.device, DType::F64);
    ps.initialize(3);
    for (double w : ps.get("n.weight").value.to_double_vector()) ASSERT_EQ(w, 0.0) << "zero-centred: 0 at the start";
    GPTConfig plain_cfg = cfg;
    plain_cfg.layernorm_1p = false;
    ParameterSet plain_ps;
    auto plain = make_normalization(plain_ps, "n", plain_cfg, ctx);
    plain_ps.allocate(ctx.device, DType::F64);
    plain_ps.initialize(3);
    const Tensor x = input(12, cfg.hidden_size, 4);
    EXPECT_EQ(norm->forward(x).to_double_vector(), plain->forward(x).to_double_vector());
    norm->release();
    plain->release();
    check_whole_model({"embedding.word.weight"});
  }
}

// --apply-residual-connection-post-layernorm: the layer computes
// x1 = ln1(x) + attn(ln1(x)), out = ln2(x1) + mlp(ln2(x1)) (composed here from
// sub-modules holding the same weights; dropout off), its backward matches
// finite differences (dropout on; with and without recompute; unfused and
// fused attention), and so does the whole model's, GPT-2- and Llama-style.
TEST_F(LayerGrad, PostNormResidualConnection) {
  cfg.residual_post_norm = true;
  {
    GPTConfig c = cfg;
    c.hidden_dropout = c.attention_dropout = 0;
    ParameterSet ps, parts;
    TransformerLayer layer(ps, c, 1, ctx);
    auto ln1 = make_normalization(parts, "layers.1.ln1", c, ctx);
    ParallelSelfAttention attn(parts, "layers.1.attention", c, 1, ctx);
    auto ln2 = make_normalization(parts, "layers.1.ln2", c, ctx);
    ParallelMLP mlp(parts, "layers.1.mlp", c, ctx);
    ps.allocate(ctx.device, DType::F64);
    ps.initialize(11);
    parts.allocate(ctx.device, DType::F64);
    ASSERT_EQ(ps.all().size(), parts.all().size());
    for (auto* p : ps.all()) {
      if (p->init != Init::Normal) p->value.copy_from(random_like(p->value, 5, 0.5));
      parts.get(p->name).value.copy_from(p->value);
    }
    const Tensor x = input(step.micro_batch * step.seq, c.hidden_size, 7);
    const auto got = layer.forward(x, step).to_double_vector();
    const Tensor h1 = ln1->forward(x);
    Tensor x1 = attn.forward(h1, step);
    kernels::add(h1, x1, x1);
    const Tensor h2 = ln2->forward(x1);
    Tensor out = mlp.forward(h2);
    kernels::add(h2, out, out);
    const auto want = out.to_double_vector();
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-12) << "element " << i;
    // And not the pre-norm layer's: the flag changes the function.
    GPTConfig pre_cfg = c;
    pre_cfg.residual_post_norm = false;
    ParameterSet pre_ps;
    TransformerLayer pre(pre_ps, pre_cfg, 1, ctx);
    pre_ps.allocate(ctx.device, DType::F64);
    for (auto* p : ps.all()) pre_ps.get(p->name).value.copy_from(p->value);
    EXPECT_NE(pre.forward(x, step).to_double_vector(), got);
  }
  for (const char* backend : {"unfused", "fused"})
    for (bool recompute : {false, true}) {
      SCOPED_TRACE(testing::Message() << backend << (recompute ? ", recompute" : ""));
      cfg.attention_backend = backend;
      cfg.recompute_activations = recompute;
      ParameterSet ps;
      TransformerLayer layer(ps, cfg, 1, ctx);
      check_layer(
          ps, input(step.micro_batch * step.seq, cfg.hidden_size, 6),
          [&](const Tensor& x) { return layer.forward(x, step); },
          [&](const Tensor& dy) { return layer.backward(dy); });
    }
  cfg.attention_backend = "unfused";
  check_whole_model({"embedding.word.weight"});
  make_llama(cfg);
  check_whole_model({"embedding.word.weight"});
}

// --qk-layernorm: q and k normalised per head (LayerNorm, or RMSNorm with the
// Llama-style model) before the rotary embedding, on every backend (cudnn:
// its plumbing through the host reference), against finite differences; the
// parameter count includes the two [head size] norms a layer.
TEST_F(LayerGrad, QkLayerNormOnEveryBackendAndInTheWholeModel) {
  cfg.qk_layernorm = true;
  for (const char* backend : {"unfused", "fused", "cudnn"}) {
    SCOPED_TRACE(backend);
    cfg.attention_backend = backend;
    for (const bool rope : {false, true}) {
      cfg.position_embedding_type = rope ? "rope" : "learned_absolute";
      cfg.rotary_base = 500;
      ParameterSet ps;
      ParallelSelfAttention attn(ps, "attn", cfg, 0, ctx);
      EXPECT_EQ(ps.get("attn.q_layernorm.weight").global_shape, (Shape{cfg.head_dim()}));
      EXPECT_EQ(ps.get("attn.k_layernorm.bias").global_shape, (Shape{cfg.head_dim()}));
      check_layer(
          ps, input(step.micro_batch * step.seq, cfg.hidden_size, 5),
          [&](const Tensor& x) { return attn.forward(x, step); }, [&](const Tensor& dy) { return attn.backward(dy); });
    }
  }
  cfg.attention_backend = "unfused";
  cfg.position_embedding_type = "learned_absolute";
  check_whole_model({"embedding.word.weight"});
  make_llama(cfg);  // RMSNorm q/k norms, grouped k/v heads, rope
  ParameterSet ps;
  GPTModel model(cfg, ctx, ps);
  std::int64_t total = 0;
  for (auto* p : ps.all()) total += shape_numel(p->global_shape);
  EXPECT_EQ(total - (cfg.padded_vocab(1) - cfg.vocab_size) * cfg.hidden_size * 2, cfg.parameter_count());
  EXPECT_THROW(ps.get("layers.0.attention.q_layernorm.bias"), InternalError) << "RMSNorm has no bias";
  check_whole_model({"embedding.word.weight", "output_layer.weight"});
}

// Megatron's --reset-position-ids and --reset-attention-mask: each sample
// packs documents (train/documents.h); positions restart per document (the
// learned table's rows as a lookup, or the rotary angles) and the softmax
// keeps each query's own document only.
TEST_F(LayerGrad, WholeModelWithDocumentsPackedIntoSamples) {
  // Sample 0: documents [0, 3), [3, 5), [5, 6); sample 1: [0, 2), [2, 6).
  const std::vector<std::int64_t> starts = {0, 0, 0, 3, 3, 5, 0, 0, 2, 2, 2, 2};
  const auto n = static_cast<std::int64_t>(starts.size());
  step.key_starts = test_support::int64_tensor(ctx.device, n, [&](std::int64_t i) { return starts[i]; });
  step.positions = test_support::int64_tensor(ctx.device, n, [&](std::int64_t i) { return i % 6 - starts[i]; });
  for (const char* backend : {"unfused", "fused", "cudnn"})  // cudnn: its plumbing through the host reference
    for (const bool llama : {false, true}) {
      SCOPED_TRACE(testing::Message() << (llama ? "Llama-style (rotary), " : "GPT (learned positions), ") << backend);
      cfg.attention_backend = backend;
      if (llama) make_llama(cfg);
      check_whole_model(llama ? std::vector<const char*>{"embedding.word.weight", "output_layer.weight"}
                              : std::vector<const char*>{"embedding.word.weight"});
    }
}

TEST_F(LayerGrad, GPT2ParameterCountIsTheModels) {
  ParameterSet ps;
  GPTModel model(cfg, ctx, ps);
  std::int64_t total = 0;
  for (auto* p : ps.all()) total += shape_numel(p->global_shape);
  EXPECT_EQ(total - (cfg.padded_vocab(1) - cfg.vocab_size) * cfg.hidden_size, cfg.parameter_count());
}

TEST_F(LayerGrad, ModelRejectsBadShapesAndIds) {
  auto expect_error = [&](GPTConfig c, const std::string& needle, int tp = 1) {
    try {
      c.validate(tp);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  GPTConfig c = cfg;
  c.num_attention_heads = 5;
  expect_error(c, "--hidden-size 16 is not divisible by --num-attention-heads 5");
  expect_error(cfg, "--num-attention-heads 4 is not divisible by --tensor-model-parallel-size 3", 3);
  c = cfg;
  c.seq_length = 13;
  expect_error(c, "--seq-length 13 is longer than --max-position-embeddings 12");
  c = cfg;
  c.hidden_dropout = 1.0;
  expect_error(c, "--hidden-dropout");
  c = cfg;
  c.num_query_groups = 3;
  expect_error(c, "--num-attention-heads 4 is not divisible by --num-query-groups 3");
  c.num_query_groups = 2;
  expect_error(c, "--num-query-groups 2 is not divisible by --tensor-model-parallel-size 4", 4);
  c = cfg;
  c.hidden_size = 12;
  c.num_attention_heads = 4;  // head size 3
  c.position_embedding_type = "rope";
  expect_error(c, "rope needs an even head size");
  c = cfg;
  c.normalization = "rmsnorm";
  expect_error(c, "--normalization must be LayerNorm or RMSNorm");

  ParameterSet ps;
  GPTModel model(cfg, ctx, ps);
  ps.allocate(ctx.device, DType::F64);
  ps.initialize(1);
  const std::int64_t n = step.micro_batch * step.seq;
  Tensor ids = Tensor::zeros(ctx.device, {n}, DType::I64, MemoryCategory::Activations);
  ids.host_data<std::int64_t>()[3] = cfg.vocab_size;  // one past the end
  try {
    model.forward(ids, ids, step);
    ADD_FAILURE() << "out-of-range id accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("token id 37 at position 3"), std::string::npos) << e.what();
  }
  StepInfo too_long = step;
  too_long.seq = 13;
  too_long.micro_batch = 1;
  Tensor long_ids = Tensor::zeros(ctx.device, {13}, DType::I64, MemoryCategory::Activations);
  EXPECT_THROW(model.forward(long_ids, long_ids, too_long), ConfigError);
}
