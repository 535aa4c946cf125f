// Tensor-parallel equivalence: a GPT split over TP = 2, 4, 8 ranks gives the
// same logits, loss and gradients (shards put back together) as TP = 1, with
// dropout on, with and without activation recompute; initialisation is bit
// identical. Each rank also builds its own TP = 1 reference on a one-rank
// communicator, so the comparison needs no gathering.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "layers/gpt_model.h"
#include "megazero/comm/mpi_communicator.h"
#include "megazero/core/error.h"
#include "megazero/kernels/conventions.h"
#include "megazero/kernels/cpu_threads.h"
#include "megazero/kernels/rng.h"
#include "test_device.h"

using namespace megazero;
using namespace megazero::layers;

namespace {

// llama: rotary embeddings, RMSNorm, SwiGLU, 16 heads in 8 query groups (one
// group per rank at TP 8), no linear biases, untied output layer.
bool g_llama = false;
// Sequence parallelism (layers/mappings.h); 16 tokens per sample split over up to 8 ranks.
bool g_sp = false;
// One Llama-style option alone (on the llama test's sizes), or none: -1.
int g_only_option = -1;
// --eod-mask-loss's row weights: tokens whose id is a multiple of 5 masked.
bool g_masked = false;
// --reset-position-ids and --reset-attention-mask (train/documents.h): a
// token whose id is a multiple of 7 ends a document.
bool g_documents = false;

// Each token's document start in its sample (Megatron's rule: the end token
// belongs to the document it ends), from the ids' function.
template <typename Id>
std::vector<std::int64_t> document_starts_of(std::int64_t samples, std::int64_t seq, Id id) {
  std::vector<std::int64_t> starts;
  for (std::int64_t b = 0; b < samples; ++b)
    for (std::int64_t s = 0, start = 0; s < seq; ++s) {
      starts.push_back(start);
      if (id(b * seq + s) % 7 == 0) start = s + 1;
    }
  return starts;
}

void mark_documents(StepInfo& step, const std::shared_ptr<Device>& device, const std::vector<std::int64_t>& starts) {
  const auto n = static_cast<std::int64_t>(starts.size());
  step.key_starts = test_support::int64_tensor(device, n, [&](std::int64_t i) { return starts[i]; });
  step.positions = test_support::int64_tensor(device, n, [&](std::int64_t i) { return i % step.seq - starts[i]; });
}

GPTConfig small_config(bool recompute, const std::string& attention) {
  GPTConfig c;
  c.attention_backend = attention;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 8;  // TP up to 8
  c.vocab_size = 101;         // padded differently at each TP degree
  c.max_position_embeddings = 16;
  c.seq_length = 12;
  c.hidden_dropout = 0.1;
  c.attention_dropout = 0.1;
  c.make_vocab_size_divisible_by = 4;
  c.recompute_activations = recompute;
  if (g_sp) {
    c.sequence_parallel = true;
    c.seq_length = 16;
  }
  if (g_only_option >= 0) {
    c.hidden_size = 64;
    c.num_attention_heads = 16;
    switch (g_only_option) {
      case 0:
        c.position_embedding_type = "rope";
        break;
      case 1:
        c.normalization = "RMSNorm";
        break;
      case 2:
        c.swiglu = true, c.ffn_hidden_size = 48;
        break;
      case 3:
        c.num_query_groups = 8;
        break;
      case 4:
        c.add_bias_linear = false;
        break;
      case 5:
        c.untie_embeddings = true;
        break;
      case 6:  // q/k LayerNorm: their weights' gradients are shares of the TP group's heads
        c.qk_layernorm = true;
        break;
      case 7:  // q/k RMSNorm with rope and grouped k/v heads
        c.qk_layernorm = true, c.normalization = "RMSNorm", c.position_embedding_type = "rope";
        c.num_query_groups = 8;
        break;
      case 8:  // rope's positions interpolated (--rotary-seq-len-interpolation-factor)
        c.position_embedding_type = "rope", c.rotary_interpolation_factor = 4;
        break;
      case 9:  // zero-centred norm weights (--apply-layernorm-1p), LayerNorm and the q/k norms
        c.layernorm_1p = true, c.qk_layernorm = true;
        break;
      case 10:  // zero-centred RMSNorm weights
        c.layernorm_1p = true, c.normalization = "RMSNorm";
        break;
      case 11:  // Xavier-uniform weights: the same values at every TP degree (the padded vocabulary too)
        c.init_xavier_uniform = true, c.untie_embeddings = true, c.swiglu = true, c.ffn_hidden_size = 48;
        break;
      case 12:  // the squared-ReLU MLP
        c.squared_relu = true;
        break;
      case 13:  // rope on interleaved pairs (--rotary-interleaved)
        c.position_embedding_type = "rope", c.rotary_interleaved = true;
        break;
      case 14:  // the residual from each norm's output (--apply-residual-connection-post-layernorm)
        c.residual_post_norm = true;
        break;
      case 15:  // biases on the QKV projection only (--disable-bias-linear --add-qkv-bias: Qwen2's)
        c.add_bias_linear = false, c.add_qkv_bias = true, c.num_query_groups = 8;
        break;
      case 16:  // Llama 3's rope scaling (--use-rope-scaling), a base whose frequencies span its three bands
        c.position_embedding_type = "rope", c.rotary_base = 500000, c.use_rope_scaling = true;
        c.rope_scaling_factor = 32;
        break;
    }
  }
  if (g_llama) {
    c.hidden_size = 64;
    c.num_attention_heads = 16;
    c.num_query_groups = 8;
    c.position_embedding_type = "rope";
    c.rotary_base = 1000;
    c.normalization = "RMSNorm";
    c.swiglu = true;
    c.ffn_hidden_size = 48;
    c.add_bias_linear = false;
    c.untie_embeddings = true;
  }
  return c;
}

struct Run {
  std::unique_ptr<ParameterSet> params;
  std::unique_ptr<GPTModel> model;
  double loss = 0;
};

// The losses' weights of --eod-mask-loss (train/loss_mask.h): 0 where the
// input id is a multiple of 5, N / kept elsewhere.
Tensor mask_weights(const TpContext& ctx, const Tensor& ids) {
  const auto v = ids.to_double_vector();
  std::int64_t kept = 0;
  for (double id : v) kept += static_cast<std::int64_t>(id) % 5 != 0;
  std::vector<double> w;
  for (double id : v)
    w.push_back(static_cast<std::int64_t>(id) % 5 != 0 ? static_cast<double>(v.size()) / static_cast<double>(kept)
                                                       : 0.0);
  Tensor t = Tensor::empty(ctx.device, {ids.numel()}, kernels::row_stat_dtype(ctx.dtype), MemoryCategory::Other);
  t.copy_from_doubles(w);
  return t;
}

// scale_known: the forward is told the backward's scale (train_step does
// so), which lets a TP-1 cross-entropy write its gradient in the forward.
Run run_model(Communicator& tp, DType dtype, bool recompute, const std::string& attention,
              GemmEpilogues epilogues = GemmEpilogues::None, bool scale_known = false) {
  TpContext ctx{&tp, test_support::test_device(), dtype};
  Run r;
  r.params = std::make_unique<ParameterSet>();
  GPTConfig cfg = small_config(recompute, attention);
  cfg.gemm_epilogues = epilogues;
  r.model = std::make_unique<GPTModel>(cfg, ctx, *r.params);
  r.model->keep_logits(true);  // the loss consumes the logits in place
  r.params->allocate(ctx.device, dtype);
  r.params->initialize(2024);
  StepInfo step;
  step.micro_batch = 2;
  step.seq = cfg.seq_length;
  step.iteration = 7;
  step.sample_offset = 4;
  if (scale_known) step.backward_scale = 1.0;
  const std::int64_t n = step.micro_batch * step.seq;
  const auto id_of = [](std::int64_t i) { return (i * 37 + 11) % 101; };
  Tensor ids = test_support::int64_tensor(ctx.device, n, id_of);
  if (g_documents) mark_documents(step, ctx.device, document_starts_of(step.micro_batch, step.seq, id_of));
  Tensor targets = test_support::int64_tensor(ctx.device, n, [](std::int64_t i) { return (i * 53 + 2) % 101; });
  r.loss = r.model->forward(ids, targets, step, g_masked ? mask_weights(ctx, ids) : Tensor());
  r.params->zero_grad();
  r.model->backward(1.0);
  return r;
}

// ||a - b|| / ||b|| over the elements this rank holds (b: reference).
struct Diff {
  double num = 0, den = 0;
  void add(double a, double b) {
    num += (a - b) * (a - b);
    den += b * b;
  }
  double rel() const { return den > 0 ? std::sqrt(num / den) : std::sqrt(num); }
};

// The model at TP = tp_size with `attention` (and --gemm-epilogues=`epilogues`)
// against TP = 1 with the unfused attention and separate bias passes (the
// reference path).
void compare(int tp_size, DType dtype, bool recompute, double tol, const std::string& attention = "unfused",
             GemmEpilogues epilogues = GemmEpilogues::None) {
  auto world = MpiCommunicator::world();
  const int me = world->rank();
  auto tp = world->split(me / tp_size, me % tp_size, "tp");
  auto self = world->split(me, 0, "self");
  Run par = run_model(*tp, dtype, recompute, attention, epilogues);
  Run ref = run_model(*self, dtype, recompute, "unfused");
  SCOPED_TRACE(testing::Message() << "tp " << tp_size << " " << dtype_name(dtype) << (recompute ? " recompute" : "")
                                  << " attention " << attention << " GEMM epilogues "
                                  << gemm_epilogues_name(epilogues));

  EXPECT_NEAR(par.loss, ref.loss, tol * std::fabs(ref.loss));

  // Logits: this rank's vocab columns against the same columns of TP = 1.
  const auto pl = par.model->logits().to_double_vector();
  const auto rl = ref.model->logits().to_double_vector();
  const std::int64_t vl = par.model->logits().size(1), vr = ref.model->logits().size(1);
  const std::int64_t start = par.model->vocab_start(), valid = par.model->vocab_valid();
  Diff logit_diff;
  for (std::int64_t row = 0; row < par.model->logits().size(0); ++row)
    for (std::int64_t c = 0; c < valid; ++c)
      logit_diff.add(pl[static_cast<std::size_t>(row * vl + c)], rl[static_cast<std::size_t>(row * vr + start + c)]);
  EXPECT_LE(logit_diff.rel(), tol) << "logits";

  // Parameters and gradients: each local element against its global element.
  for (auto* p : par.params->all()) {
    auto& q = ref.params->get(p->name);
    const auto pv = p->value.to_double_vector(), qv = q.value.to_double_vector();
    const auto pg = p->grad.to_double_vector(), qg = q.grad.to_double_vector();
    const std::int64_t row = p->global_shape.size() > 1 ? shape_numel(p->global_shape) / p->global_shape[0] : 1;
    Diff gd;
    for (std::int64_t i = 0; i < p->local_numel(); ++i) {
      const std::int64_t g = p->global_index(i);
      const auto li = static_cast<std::size_t>(i);
      if (p->padding_from_row >= 0 && g / row >= p->padding_from_row) {  // vocab padding: exists only here
        ASSERT_EQ(pv[li], 0.0) << p->name;
        ASSERT_EQ(pg[li], 0.0) << p->name << " padding gradient";
        continue;
      }
      ASSERT_EQ(pv[li], qv[static_cast<std::size_t>(g)]) << p->name << ": initialisation differs at " << g;
      gd.add(pg[li], qg[static_cast<std::size_t>(g)]);
    }
    const std::string& name = p->name;
    const std::string k_bias = "k_layernorm.bias";
    if (name.size() > k_bias.size() && name.compare(name.size() - k_bias.size(), k_bias.size(), k_bias) == 0) {
      // Zero in exact arithmetic (a shift of every key leaves each softmax row
      // unchanged): both are rounding noise, measured against the q norm's.
      Diff q_bias;
      for (double v :
           ref.params->get(name.substr(0, name.size() - k_bias.size()) + "q_layernorm.bias").grad.to_double_vector())
        q_bias.add(0.0, v);
      EXPECT_LE(std::sqrt(gd.num), tol * std::sqrt(q_bias.den)) << name << " gradient (zero but for rounding)";
      continue;
    }
    EXPECT_LE(gd.rel(), tol) << name << " gradient";
  }
}

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

}  // namespace

TEST(GptTensorParallel, MatchesTpOneInFp32) {
  for (bool recompute : {false, true}) compare(world_size(), DType::F32, recompute, 1e-5);
}

TEST(GptTensorParallel, MatchesTpOneInFp64) { compare(world_size(), DType::F64, false, 1e-12); }

// Every Llama-style option at once (test_layer_gradients checks each against
// finite differences at TP 1): TP splits query groups, the stacked SwiGLU
// projections and the untied output layer and still computes TP 1's numbers.
TEST(GptTensorParallel, LlamaStyleModelMatchesTpOne) {
  g_llama = true;
  for (bool recompute : {false, true}) compare(world_size(), DType::F32, recompute, 1e-5);
  compare(world_size(), DType::F64, false, 1e-12);
  if (test_support::test_device()->kind() != DeviceKind::CUDA) compare(world_size(), DType::F32, false, 1e-5, "fused");
  g_llama = false;
}

// Each option on its own (the test above has them all at once), and --qk-layernorm.
TEST(GptTensorParallel, EachLlamaStyleOptionAloneMatchesTpOne) {
  const char* names[] = {"rope",
                         "RMSNorm",
                         "SwiGLU",
                         "8 query groups",
                         "no linear biases",
                         "untied output layer",
                         "q/k LayerNorm",
                         "q/k RMSNorm with rope and 8 query groups",
                         "rope interpolated 4x",
                         "zero-centred LayerNorm and q/k norms",
                         "zero-centred RMSNorm",
                         "Xavier-uniform weights, untied output, SwiGLU",
                         "squared-ReLU MLP",
                         "rope on interleaved pairs",
                         "post-norm residual connections",
                         "QKV biases only, 8 query groups",
                         "Llama 3 rope scaling"};
  for (int o = 0; o < 17; ++o) {
    SCOPED_TRACE(names[o]);
    g_only_option = o;
    compare(world_size(), DType::F64, o % 2 == 1, 1e-12);
  }
  g_only_option = 6;  // q/k LayerNorm under sequence parallelism and on the fused attention
  g_sp = true;
  compare(world_size(), DType::F64, false, 1e-12);
  g_only_option = 14;  // post-norm residuals under sequence parallelism: each rank's rows of the norms' outputs
  compare(world_size(), DType::F64, true, 1e-12);
  g_only_option = 6;
  g_sp = false;
  if (test_support::test_device()->kind() != DeviceKind::CUDA) compare(world_size(), DType::F64, true, 1e-12, "fused");
  g_only_option = -1;
}

// Sequence parallelism: the same numbers as TP 1 (which splits nothing), with
// dropout and recompute, both attention backends, GPT-2 and Llama-style.
TEST(GptTensorParallel, SequenceParallelMatchesTpOne) {
  g_sp = true;
  for (bool llama : {false, true}) {
    g_llama = llama;
    SCOPED_TRACE(llama ? "llama" : "gpt2");
    for (bool recompute : {false, true}) compare(world_size(), DType::F32, recompute, 1e-5);
    compare(world_size(), DType::F64, false, 1e-12);
    if (test_support::test_device()->kind() != DeviceKind::CUDA) compare(world_size(), DType::F32, true, 1e-5, "fused");
  }
  g_llama = g_sp = false;
}

TEST(GptTensorParallel, FusedAttentionMatchesUnfusedTpOne) {
  // Same dropout masks, so the same model to rounding, on every TP layout.
  if (test_support::test_device()->kind() == DeviceKind::CUDA) GTEST_SKIP() << "fp32/fp64: unfused only on CUDA";
  compare(world_size(), DType::F64, false, 1e-12, "fused");
  for (bool recompute : {false, true}) compare(world_size(), DType::F32, recompute, 1e-5, "fused");
}

// --attention-backend cudnn's layer plumbing (q, k, v and the context as
// strided views into the projections' buffers, gradients written in place)
// through the kernels' host reference: TP 1 unfused's numbers on every layout.
TEST(GptTensorParallel, CudnnAttentionLayoutMatchesUnfusedTpOne) {
  if (test_support::test_device()->kind() == DeviceKind::CUDA) GTEST_SKIP() << "fp32/fp64: the host reference only";
  compare(world_size(), DType::F64, false, 1e-12, "cudnn");
  for (bool recompute : {false, true}) compare(world_size(), DType::F32, recompute, 1e-5, "cudnn");
  g_sp = true;
  compare(world_size(), DType::F32, true, 1e-5, "cudnn");
  g_sp = false;
  g_llama = true;  // grouped-query attention and RoPE: q, k, v copies; dk, dv written in place, summed per group
  compare(world_size(), DType::F64, false, 1e-12, "cudnn");
  compare(world_size(), DType::F32, true, 1e-5, "cudnn");
  g_llama = false;
}

// --gemm-epilogues: QKV's and fc1's bias and the GeLU (=all: also the bias
// gradients) inside the GEMMs. On the CPU the same passes run unfused; on CUDA
// (MEGAZERO_TEST_DEVICE=cuda) fp32 runs cuBLASLt's epilogues, fp64 the passes.
// cuBLASLt's GeLU may use the GPU's approximate tanh (~2^-11 relative) where
// the reference runs our own GeLU kernel: 1e-3 there, still far below what a
// missing bias or a wrong operand gives (order 1).
// Both sets: the forward's (the backward then takes pre with its bias) and all.
TEST(GptTensorParallel, GemmEpiloguesMatchTpOne) {
  const double f32_tol = test_support::test_device()->kind() == DeviceKind::CUDA ? 1e-3 : 1e-5;
  for (const GemmEpilogues e : {GemmEpilogues::Forward, GemmEpilogues::All}) {
    compare(world_size(), DType::F64, false, 1e-12, "unfused", e);
    for (bool recompute : {false, true}) compare(world_size(), DType::F32, recompute, f32_tol, "unfused", e);
    g_sp = true;  // fc1 and QKV gather their input rows; the bias gradients sum every row
    compare(world_size(), DType::F32, true, f32_tol, "unfused", e);
    g_sp = false;
    g_only_option = 2;  // SwiGLU with biases: the stacked [gate; up] bias in fc1's GEMM
    compare(world_size(), DType::F64, false, 1e-12, "unfused", e);
    g_only_option = -1;
  }
}

// Told the backward's scale, a TP-1 model's cross-entropy writes the logits'
// gradient in its forward (one pass over the logits): the loss and every
// gradient are the bits of the forward-then-backward path. At TP > 1 the
// all-reduce between the statistics and the gradient keeps them apart, and
// the same hint changes nothing. A backward asking another scale than the
// forward was told is refused (the logits are gone).
TEST(GptTensorParallel, CrossEntropyGradientInTheForwardMatches) {
  auto world = MpiCommunicator::world();
  const int me = world->rank(), n = world->size();
  auto self = world->split(me, 0, "self");
  auto all = world->split(0, me, "tp");
  for (Communicator* tp : {self.get(), all.get()}) {
    SCOPED_TRACE(testing::Message() << "tp " << tp->size());
    ::Run told = run_model(*tp, DType::F32, false, "unfused", GemmEpilogues::None, true);
    ::Run plain = run_model(*tp, DType::F32, false, "unfused");
    EXPECT_EQ(told.loss, plain.loss);
    for (auto* p : told.params->all())
      EXPECT_EQ(p->grad.to_double_vector(), plain.params->get(p->name).grad.to_double_vector()) << p->name;
    if (n == 1) break;
  }
  TpContext ctx{self.get(), test_support::test_device(), DType::F32};
  ParameterSet params;
  GPTModel model(small_config(false, "unfused"), ctx, params);
  params.allocate(ctx.device, DType::F32);
  params.initialize(3);
  StepInfo step;
  step.micro_batch = 2;
  step.seq = 12;
  step.backward_scale = 0.5;
  Tensor ids = test_support::int64_tensor(ctx.device, 24, [](std::int64_t i) { return (i * 37 + 11) % 101; });
  model.forward(ids, ids, step);
  EXPECT_THROW(model.backward(0.25), std::exception) << "the gradient was written for 0.5";
}

// --eod-mask-loss: the weighted loss and its gradients at TP n (and under
// sequence parallelism) are TP 1's; the loss is the mean of the unweighted
// per-token losses over the kept tokens; a cross-entropy told the backward's
// scale (its gradient written in the forward) weighs the same.
TEST(GptTensorParallel, MaskedLossMatchesTpOne) {
  g_masked = true;
  compare(world_size(), DType::F64, false, 1e-12);
  compare(world_size(), DType::F32, true, 1e-5);
  g_sp = true;
  compare(world_size(), DType::F64, false, 1e-12);
  g_sp = false;
  auto world = MpiCommunicator::world();
  auto self = world->split(world->rank(), 0, "self");
  ::Run told = run_model(*self, DType::F32, false, "unfused", GemmEpilogues::None, true);
  ::Run plain = run_model(*self, DType::F32, false, "unfused");
  EXPECT_EQ(told.loss, plain.loss);
  for (auto* p : told.params->all())
    EXPECT_EQ(p->grad.to_double_vector(), plain.params->get(p->name).grad.to_double_vector()) << p->name;
  g_masked = false;

  TpContext ctx{self.get(), test_support::test_device(), DType::F64};
  ParameterSet params;
  GPTModel model(small_config(false, "unfused"), ctx, params);
  params.allocate(ctx.device, DType::F64);
  params.initialize(3);
  StepInfo step;
  step.micro_batch = 2;
  step.seq = 12;
  step.training = false;
  Tensor ids = test_support::int64_tensor(ctx.device, 24, [](std::int64_t i) { return (i * 37 + 11) % 101; });
  const Tensor weights = mask_weights(ctx, ids);
  const auto losses = model.forward_losses(ids, ids, step).to_double_vector();
  const auto w = weights.to_double_vector();
  double kept_sum = 0;
  std::int64_t kept = 0, masked = 0;
  for (std::size_t i = 0; i < losses.size(); ++i)
    if (w[i] > 0)
      kept_sum += losses[i], ++kept;
    else
      ++masked;
  ASSERT_GT(masked, 0) << "the test's ids must hold masked tokens";
  EXPECT_NEAR(model.forward(ids, ids, step, weights), kept_sum / static_cast<double>(kept), 1e-13);
  const auto weighted = model.forward_losses(ids, ids, step, weights).to_double_vector();
  for (std::size_t i = 0; i < losses.size(); ++i) {
    if (w[i] == 0) {
      EXPECT_EQ(weighted[i], 0.0) << "masked token " << i;
    }
  }
}

// --reset-position-ids and --reset-attention-mask at TP n (and with sequence
// parallelism, recompute, the Llama-style model's rotary embeddings and query
// groups, the fused attention) are TP 1's with the unfused attention.
TEST(GptTensorParallel, DocumentMasksMatchTpOne) {
  g_documents = true;
  const auto starts = document_starts_of(2, 12, [](std::int64_t i) { return (i * 37 + 11) % 101; });
  ASSERT_GT(std::count_if(starts.begin(), starts.end(), [](std::int64_t s) { return s > 0; }), 4)
      << "the test's ids must end documents inside the samples";
  compare(world_size(), DType::F64, false, 1e-12);
  compare(world_size(), DType::F32, true, 1e-5);
  g_sp = true;
  compare(world_size(), DType::F64, false, 1e-12);
  g_sp = false;
  g_llama = true;
  compare(world_size(), DType::F64, true, 1e-12);
  const bool cuda = test_support::test_device()->kind() == DeviceKind::CUDA;  // fp32/fp64: unfused only there
  if (!cuda) compare(world_size(), DType::F64, false, 1e-12, "fused");        // the fused kernels' masks
  if (!cuda) compare(world_size(), DType::F64, false, 1e-12, "cudnn");  // its plumbing, through the host reference
  g_llama = false;
  if (!cuda) compare(world_size(), DType::F32, false, 1e-5, "fused");
  if (!cuda) compare(world_size(), DType::F32, false, 1e-5, "cudnn");
  g_documents = false;
}

// The point of the masks: a document packed after another one computes the
// losses it computes at the start of a sample on its own: the same positions,
// the same keys. Without the masks it does not (what the test would miss).
TEST(GptTensorParallel, PackedDocumentsComputeAsIfAlone) {
  auto world = MpiCommunicator::world();
  auto self = world->split(world->rank(), 0, "self");
  TpContext ctx{self.get(), test_support::test_device(), DType::F64};
  for (const bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "Llama-style (rotary)" : "GPT (learned positions)");
    g_llama = llama;
    GPTConfig cfg = small_config(false, "unfused");
    g_llama = false;
    ParameterSet params;
    GPTModel model(cfg, ctx, params);
    params.allocate(ctx.device, DType::F64);
    params.initialize(9);
    // Sample 0: document A (5 tokens, the last its end token 0) then document
    // B (7 tokens); sample 1: document B first, then other tokens.
    const std::int64_t S = 12, a = 5, len_b = S - a;
    const std::vector<std::int64_t> doc_a = {3, 8, 15, 22, 0}, doc_b = {4, 9, 13, 20, 1, 2, 6},
                                    tail = {30, 31, 32, 33, 34};
    std::vector<std::int64_t> v = doc_a;
    v.insert(v.end(), doc_b.begin(), doc_b.end());
    v.insert(v.end(), doc_b.begin(), doc_b.end());
    v.insert(v.end(), tail.begin(), tail.end());
    const auto at = [&](std::int64_t i) { return v[static_cast<std::size_t>(i)]; };
    const Tensor ids = test_support::int64_tensor(ctx.device, 2 * S, at);
    const Tensor targets =
        test_support::int64_tensor(ctx.device, 2 * S, [&](std::int64_t i) { return (at(i) * 5 + 1) % 101; });
    StepInfo step;
    step.micro_batch = 2;
    step.seq = S;
    step.training = false;
    const auto plain = model.forward_losses(ids, targets, step).to_double_vector();
    // The end token of A is 0, a multiple of 7: so is 21 ... none inside B or the tail.
    mark_documents(step, ctx.device, document_starts_of(2, S, at));
    const auto packed = model.forward_losses(ids, targets, step).to_double_vector();
    double moved = 0;
    for (std::int64_t t = 0; t < len_b; ++t) {
      const auto in_first = static_cast<std::size_t>(a + t), alone = static_cast<std::size_t>(S + t);
      EXPECT_NEAR(packed[in_first], packed[alone], 1e-12 * std::fabs(packed[alone])) << "token " << t << " of B";
      EXPECT_EQ(packed[alone], plain[alone]) << "a document at a sample's start is not changed by the masks";
      moved = std::max(moved, std::fabs(plain[in_first] - plain[alone]));
    }
    EXPECT_GT(moved, 1e-3) << "without the masks, B after A computes other losses";
    for (std::int64_t t = 0; t < a; ++t)
      EXPECT_EQ(packed[static_cast<std::size_t>(t)], plain[static_cast<std::size_t>(t)]) << "document A, token " << t;
  }
}

// Every recompute granularity computes the same bits as none, at this TP
// layout: full recompute of every layer, of the first 1 or 2 of 3 layers
// (--recompute-method block), of every layer in chunks of 2 or 3 layers that
// keep one input (--recompute-method uniform) and selective (the unfused
// attention's probabilities dropped after forward and made again in
// backward); and each keeps less after the forward than no recompute (and
// block 2 than block 1, full than block 2, chunks of 2 than full, of 3 than
// of 2).
TEST(GptTensorParallel, BlockAndSelectiveRecomputeGiveTheSameBits) {
  auto world = MpiCommunicator::world();
  struct Mode {
    const char* name;
    bool full;
    std::int64_t first_layers;
    bool selective;
    std::int64_t chunk = 1;
  };
  const Mode modes[] = {{"none", false, 0, false},       {"selective", false, 0, true},
                        {"block 1", true, 1, false},     {"block 2", true, 2, false},
                        {"full", true, 0, false},        {"uniform 2", true, 0, false, 2},
                        {"uniform 3", true, 0, false, 3}};
  for (const char* attention : {"unfused", "fused"}) {
    struct Result {
      double loss = 0;
      std::int64_t kept = 0;  // activation bytes live between forward and backward
      std::map<std::string, std::vector<double>> grads;
    };
    std::vector<Result> results;
    for (const Mode& m : modes) {
      SCOPED_TRACE(testing::Message() << attention << " attention, recompute " << m.name);
      GPTConfig cfg = small_config(false, attention);
      cfg.num_layers = 3;
      cfg.recompute_activations = m.full;
      cfg.recompute_num_layers = m.first_layers;
      cfg.recompute_core_attention = m.selective;
      cfg.recompute_chunk = m.chunk;
      cfg.validate(world->size());
      TpContext ctx{world.get(), test_support::test_device(), DType::F32};
      ParameterSet params;
      GPTModel model(cfg, ctx, params);
      params.allocate(ctx.device, DType::F32);
      params.initialize(2024);
      StepInfo step;
      step.micro_batch = 2;
      step.seq = cfg.seq_length;
      step.iteration = 7;
      const std::int64_t n = step.micro_batch * step.seq;
      Tensor ids = test_support::int64_tensor(ctx.device, n, [](std::int64_t i) { return (i * 37 + 11) % 101; });
      Tensor targets = test_support::int64_tensor(ctx.device, n, [](std::int64_t i) { return (i * 53 + 2) % 101; });
      const auto before = ctx.device->memory().live(MemoryCategory::Activations) +
                          ctx.device->memory().live(MemoryCategory::ActivationCheckpoints);
      Result r;
      r.loss = model.forward(ids, targets, step);
      r.kept = ctx.device->memory().live(MemoryCategory::Activations) +
               ctx.device->memory().live(MemoryCategory::ActivationCheckpoints) - before;
      params.zero_grad();
      model.backward(1.0);
      for (auto* p : params.all()) r.grads[p->name] = p->grad.to_double_vector();
      results.push_back(std::move(r));
    }
    for (std::size_t i = 1; i < results.size(); ++i) {
      SCOPED_TRACE(testing::Message() << attention << " attention, recompute " << modes[i].name);
      EXPECT_EQ(results[i].loss, results[0].loss);
      for (const auto& [name, g] : results[0].grads) EXPECT_EQ(results[i].grads.at(name), g) << name;
      // Selective and block 1 against none, block 2 and full against the
      // mode before them; selective drops nothing where the attention keeps
      // no probabilities.
      const std::int64_t than = results[modes[i].selective || modes[i].first_layers == 1 ? 0 : i - 1].kept;
      if (modes[i].selective && std::string(attention) == "fused")
        EXPECT_EQ(results[i].kept, than);
      else
        EXPECT_LT(results[i].kept, than);
    }
  }
}

TEST(GptTensorParallel, SmallerTpGroupsInsideTheWorld) {
  // e.g. 8 ranks as 4 TP groups of 2: every group computes the same thing.
  if (world_size() < 4) GTEST_SKIP() << "needs 4 ranks";
  compare(2, DType::F32, true, 1e-5);
}

TEST(GptTensorParallel, HeadsNotDivisibleByTpIsRefused) {
  auto world = MpiCommunicator::world();
  if (world->size() == 1) GTEST_SKIP();
  GPTConfig c = small_config(false, "unfused");
  c.num_attention_heads = 8 * world->size() + 1;
  c.hidden_size = c.num_attention_heads * 4;
  ParameterSet ps;
  TpContext ctx{world.get(), make_device(DeviceKind::CPU), DType::F32};
  EXPECT_THROW(GPTModel(c, ctx, ps), ConfigError);
}

// An evaluation forward (no dropout, no backward to follow) keeps no
// activations: all it leaves allocated is the per-token losses it returns, so
// the next training step starts from the memory it was planned from.
TEST(GptTensorParallel, EvaluationKeepsNothingForABackward) {
  auto world = MpiCommunicator::world();
  for (const char* attention : {"unfused", "fused"})
    for (bool recompute : {false, true}) {
      SCOPED_TRACE(testing::Message() << attention << (recompute ? " recompute" : ""));
      TpContext ctx{world.get(), make_device(DeviceKind::CPU), DType::F32};
      ParameterSet params;
      GPTModel model(small_config(recompute, attention), ctx, params);
      params.allocate(ctx.device, DType::F32);
      params.initialize(7);
      StepInfo step;
      step.micro_batch = 2;
      step.seq = 12;
      step.training = false;
      const std::int64_t n = step.micro_batch * step.seq;
      Tensor ids = test_support::int64_tensor(ctx.device, n, [](std::int64_t i) { return (i * 37 + 11) % 101; });
      const auto before = ctx.device->memory().live(MemoryCategory::Activations);
      const Tensor losses = model.forward_losses(ids, ids, step);
      EXPECT_GT(ctx.device->memory().peak(MemoryCategory::Activations), before + 10 * losses.nbytes());
      EXPECT_EQ(ctx.device->memory().live(MemoryCategory::Activations),
                before + static_cast<std::int64_t>(losses.nbytes()));
      EXPECT_THROW(model.backward(1.0), std::exception) << "no backward after an evaluation forward";
    }
}

// --init-method-xavier-uniform: every weight U(-a, a) with a = sqrt(6 / (fan_in
// + fan_out)) of its TP-1 matrix, the fans worked out here from the model's
// shapes (not from the parameters); biases and norms as without it. The
// layouts' bit-for-bit agreement is EachLlamaStyleOptionAloneMatchesTpOne's.
// Initialisation (Parameter::init_values, on the math threads): each local
// element of a column shard with padded rows is the documented function of
// its global index — init_std x normal_at, or the Xavier bound x a uniform,
// 0 in the padding — the same bits on 1 and 2 threads and from any start.
TEST(Initialisation, EachValueIsTheDocumentedFunctionOfItsGlobalIndexOnAnyThreadCount) {
  const int threads = cpu_math_threads();
  for (Init init : {Init::Normal, Init::XavierUniform}) {
    Parameter p;
    p.name = "layers.2.mlp.fc1.weight";
    p.global_shape = {4096, 24};
    p.split_dim = 1;
    p.shard_start = 8;
    p.local_shape = {4096, 8};
    p.padding_from_row = 4000;
    p.init = init;
    p.init_std = 0.02;
    const std::int64_t n = p.local_numel();
    std::vector<double> one(static_cast<std::size_t>(n)), two(one.size()), tail(one.size() - 1001);
    set_cpu_math_threads(1);
    p.init_values(9, 0, n, one.data());
    set_cpu_math_threads(2);
    p.init_values(9, 0, n, two.data());
    p.init_values(9, 1001, n, tail.data());
    set_cpu_math_threads(threads);
    const RngKey key{9, 0, p.id(), kRngInit};
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t r = i / 8, g = r * 24 + 8 + i % 8;
      const double want = r >= 4000 ? 0.0
                          : init == Init::Normal
                              ? 0.02 * normal_at(key, static_cast<std::uint64_t>(g))
                              : p.xavier_bound() * (2.0 * uniform_at(key, static_cast<std::uint64_t>(g)) - 1.0);
      const auto li = static_cast<std::size_t>(i);
      ASSERT_EQ(one[li], want) << "element " << i;
      ASSERT_EQ(two[li], want) << "element " << i << " on 2 threads";
      if (i >= 1001) {
        ASSERT_EQ(tail[li - 1001], want) << "element " << i << " from a later start";
      }
      ASSERT_EQ(p.init_value(9, i), want) << "element " << i << " alone";
    }
  }
}

TEST(GptTensorParallel, XavierUniformWeightsHaveTheirFansBounds) {
  auto world = MpiCommunicator::world();
  auto self = world->split(world->rank(), 0, "self");
  GPTConfig c;
  c.num_layers = 1, c.hidden_size = 64, c.num_attention_heads = 4, c.num_query_groups = 2, c.vocab_size = 1000;
  c.max_position_embeddings = 96, c.seq_length = 16, c.ffn_hidden_size = 160, c.swiglu = true;
  c.untie_embeddings = true, c.init_xavier_uniform = true;
  TpContext ctx{self.get(), test_support::test_device(), DType::F64};
  ParameterSet params;
  GPTModel model(c, ctx, params);
  params.allocate(ctx.device, DType::F64);
  params.initialize(77);
  const std::int64_t h = 64, head = 16, vocab = 1000;
  const std::map<std::string, std::pair<std::int64_t, std::int64_t>> fans = {
      // name: fan_in, fan_out
      {"embedding.word.weight", {h, vocab}},
      {"embedding.position.weight", {h, 96}},
      {"layers.0.attention.qkv.weight", {h, (4 + 2 * 2) * head}},
      {"layers.0.attention.dense.weight", {h, h}},
      {"layers.0.mlp.fc1.weight", {h, 2 * 160}},
      {"layers.0.mlp.fc2.weight", {160, h}},
      {"output_layer.weight", {h, vocab}}};
  int weights = 0;
  for (const auto* p : params.all()) {
    const auto v = p->value.to_double_vector();
    const auto it = fans.find(p->name);
    if (it == fans.end()) {  // biases and norms: zeros and ones as ever
      EXPECT_NE(p->init, Init::XavierUniform) << p->name;
      for (double x : v) ASSERT_TRUE(x == 0.0 || x == 1.0) << p->name;
      continue;
    }
    ++weights;
    ASSERT_EQ(p->init, Init::XavierUniform) << p->name;
    const double a = std::sqrt(6.0 / static_cast<double>(it->second.first + it->second.second));
    const auto cols = static_cast<std::int64_t>(v.size()) / p->global_shape[0];
    double sum = 0, squares = 0, largest = 0;
    double n = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (p->padding_from_row >= 0 && static_cast<std::int64_t>(i) / cols >= p->padding_from_row) {
        ASSERT_EQ(v[i], 0.0) << p->name << " padding";
        continue;
      }
      ASSERT_LT(std::fabs(v[i]), a) << p->name;
      sum += v[i], squares += v[i] * v[i], largest = std::max(largest, std::fabs(v[i])), ++n;
    }
    const double mean = sum / n, var = squares / n - mean * mean;
    SCOPED_TRACE(p->name + ": " + std::to_string(static_cast<long>(n)) + " values, bound " + std::to_string(a));
    EXPECT_GT(largest, 0.99 * a) << "uniform up to the bound";
    EXPECT_NEAR(var, a * a / 3, 0.08 * a * a / 3) << "U(-a, a)'s variance";
    EXPECT_NEAR(mean, 0.0, 5 * a / std::sqrt(3.0 * n)) << "centred";
  }
  EXPECT_EQ(weights, 7);
}
