// Hugging Face GPT-2 and Llama export/import (tools/hf_gpt2.h, docs/HF_EXPORT.md):
//  - a model trained at TP 2 x DP 2 (ZeRO-2), GPT-2 or Llama-style, exports to
//    HF names whose every element is the checkpoint's global master value under
//    the expected transpose / QKV reorder / q, k, v and gate, up carving
//    (checked here with index arithmetic of its own; for Llama also on
//    checkpoints whose every element is distinct, with GQA, MQA and MHA, tied
//    and untied, with and without biases);
//  - importing that export gives a checkpoint that loads at TP 2 x DP 2 with
//    logits identical bit for bit to the original's, and at TP 1 x DP 4 ZeRO-3
//    equal up to reduction order; exporting the import gives the same bytes;
//  - fp16/bf16 exports are the fp32 values rounded to nearest even;
//  - broken inputs fail with ConfigErrors naming the file, the tensor and the fix.
// The numerical checks against independent GPT-2 and Llama forwards (numpy,
// HF's formulas) are tests/cli/hf_export_e2e.sh and hf_llama_e2e.sh.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>

#include "megazero/checkpoint/checkpoint.h"
#include "megazero/checkpoint/safetensors.h"
#include "megazero/comm/consensus.h"
#include "megazero/core/error.h"
#include "test_device.h"
#include "megazero/train/arguments.h"
#include "megazero/zero/zero_engine.h"
#include "tools/checkpoint_model.h"
#include "tools/hf_gpt2.h"
#include "zero_harness.h"

using namespace megazero;
using namespace megazero::testing_util;
namespace fs = std::filesystem;
using I = std::int64_t;

namespace {

MpiCommunicator& world() { return test_world(); }
void barrier() { world().barrier().wait(); }

std::string shared_temp_dir() { return testing_util::shared_temp_dir("mz-hf"); }

std::string local_temp_dir() {
  char tmpl[] = "/tmp/mz-hf-XXXXXX";
  return ::mkdtemp(tmpl);
}

ZeroRunSpec spec_of(int tp, int dp, int stage, bool llama = false) {
  ZeroRunSpec s;
  s.tp = tp;
  s.dp = dp;
  s.stage = stage;
  s.steps = 2;
  s.llama = llama;  // rope, RMSNorm, SwiGLU, 8 heads in 4 query groups, no biases, untied output layer
  return s;
}

checkpoint::Placement place(ZeroRun& r) { return {&world(), r.tp->rank(), r.tp->size()}; }

void save(ZeroRun& r, const std::string& dir, int iteration) {
  checkpoint::TrainState s;
  s.iteration = iteration;
  s.seed = 77;
  s.config = hf::resolved_config(r.model->config(), 77);
  checkpoint::save_checkpoint(dir, s, *r.engine, place(r));
}

// This rank's logits [B*S, V_local] of a fixed evaluation batch (no dropout).
std::vector<float> eval_logits(ZeroRun& r) {
  const auto& c = r.model->config();
  const I B = 2, S = c.seq_length;
  Tensor ids = test_support::int64_tensor(r.device, B * S, [&](I i) { return (i * 37 + 11) % c.vocab_size; });
  Tensor targets = test_support::int64_tensor(r.device, B * S, [&](I i) { return (i * 53 + 5) % c.vocab_size; });
  layers::StepInfo step;
  step.micro_batch = B;
  step.seq = S;
  step.training = false;
  r.model->set_param_hooks(r.engine.get());
  r.model->keep_logits(true);  // the loss consumes its logits in place
  r.model->forward(ids, targets, step);
  const std::vector<double> l = r.model->logits().to_double_vector();  // fp32 logits: exact in double
  return std::vector<float>(l.begin(), l.end());
}

std::vector<float> tensor_of(const checkpoint::SafetensorsFile& f, const std::string& name,
                             const std::vector<I>& shape) {
  const auto& e = f.entry(name);
  EXPECT_EQ(e.shape, shape) << name;
  EXPECT_EQ(e.dtype, DType::F32) << name;
  std::vector<float> v(e.end - e.begin >= 4 ? (e.end - e.begin) / 4 : 0);
  std::memcpy(v.data(), f.data(e), v.size() * 4);
  return v;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every exported element against the checkpoint's global master tensors, with
// the HF layout spelled out independently of hf::to_hf.
void check_export_layout(const std::string& ckpt, const std::string& hf_dir) {
  checkpoint::CheckpointReader reader(checkpoint::find_latest(ckpt));
  checkpoint::SafetensorsFile f(hf_dir + "/model.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const auto c = zero_test_model(false);
  const I h = c.hidden_size, H = c.num_attention_heads, hd = h / H, V = c.vocab_size, F = 4 * h,
          P = c.max_position_embeddings;
  EXPECT_EQ(f.tensors().size(), static_cast<std::size_t>(4 + 12 * c.num_layers));
  auto ours = [&](const std::string& n) { return reader.global_tensor(n, "master"); };
  auto same = [&](const std::string& what, const std::vector<float>& hf, I n, auto&& expected) {
    I bad = 0, nonzero = 0;
    for (I i = 0; i < n; ++i) {
      bad += hf[static_cast<std::size_t>(i)] != expected(i);
      nonzero += hf[static_cast<std::size_t>(i)] != 0;
    }
    EXPECT_EQ(bad, 0) << what;
    EXPECT_GT(nonzero, 0) << what << ": all zero, the check would prove nothing";
  };
  // Embeddings: HF has no vocabulary padding.
  const auto wte = ours("embedding.word.weight");
  EXPECT_EQ(static_cast<I>(wte.size()), c.padded_vocab(2) * h);
  same("wte", tensor_of(f, "wte.weight", {V, h}), V * h, [&](I i) { return wte[static_cast<std::size_t>(i)]; });
  const auto wpe = ours("embedding.position.weight");
  same("wpe", tensor_of(f, "wpe.weight", {P, h}), P * h, [&](I i) { return wpe[static_cast<std::size_t>(i)]; });
  // Conv1D [in, out] is our Linear [out, in] transposed: hf[i][o] = ours[o][i].
  auto transposed = [&](const std::vector<float>& w, I out, I in) {
    return [&w, out, in](I k) { return w[static_cast<std::size_t>((k % out) * in + k / out)]; };
  };
  for (I l = 0; l < c.num_layers; ++l) {
    const std::string o = "layers." + std::to_string(l) + ".", x = "h." + std::to_string(l) + ".";
    for (const auto& [a, b] : {std::pair{"ln1", "ln_1"}, std::pair{"ln2", "ln_2"}})
      for (const char* wb : {".weight", ".bias"}) {
        const auto v = ours(o + a + wb);
        const auto e = tensor_of(f, x + b + wb, {h});
        EXPECT_EQ(e, v) << x + b + wb;
      }
    // Fused QKV: our output row (head, which, d) is HF's column which*h + head*hd + d.
    const auto qkv = ours(o + "attention.qkv.weight"), qkv_b = ours(o + "attention.qkv.bias");
    const auto cw = tensor_of(f, x + "attn.c_attn.weight", {h, 3 * h}),
               cb = tensor_of(f, x + "attn.c_attn.bias", {3 * h});
    I bad = 0;
    for (I head = 0; head < H; ++head)
      for (I which = 0; which < 3; ++which)
        for (I d = 0; d < hd; ++d) {
          const I row = (head * 3 + which) * hd + d, col = which * h + head * hd + d;
          bad += cb[static_cast<std::size_t>(col)] != qkv_b[static_cast<std::size_t>(row)];
          for (I i = 0; i < h; ++i)
            bad += cw[static_cast<std::size_t>(i * 3 * h + col)] != qkv[static_cast<std::size_t>(row * h + i)];
        }
    EXPECT_EQ(bad, 0) << x << "attn.c_attn";
    EXPECT_NE(qkv_b, std::vector<float>(qkv_b.size(), 0.0f)) << "trained QKV bias should be nonzero";
    const auto dense = ours(o + "attention.dense.weight"), fc1 = ours(o + "mlp.fc1.weight"),
               fc2 = ours(o + "mlp.fc2.weight");
    same(x + "attn.c_proj.weight", tensor_of(f, x + "attn.c_proj.weight", {h, h}), h * h, transposed(dense, h, h));
    same(x + "mlp.c_fc.weight", tensor_of(f, x + "mlp.c_fc.weight", {h, F}), h * F, transposed(fc1, F, h));
    same(x + "mlp.c_proj.weight", tensor_of(f, x + "mlp.c_proj.weight", {F, h}), F * h, transposed(fc2, h, F));
    EXPECT_EQ(tensor_of(f, x + "attn.c_proj.bias", {h}), ours(o + "attention.dense.bias"));
    EXPECT_EQ(tensor_of(f, x + "mlp.c_fc.bias", {F}), ours(o + "mlp.fc1.bias"));
    EXPECT_EQ(tensor_of(f, x + "mlp.c_proj.bias", {h}), ours(o + "mlp.fc2.bias"));
  }
  EXPECT_EQ(tensor_of(f, "ln_f.weight", {h}), ours("final_ln.weight"));
  EXPECT_EQ(tensor_of(f, "ln_f.bias", {h}), ours("final_ln.bias"));

  const auto j = nlohmann::json::parse(slurp(hf_dir + "/config.json"));
  EXPECT_EQ(j.at("model_type"), "gpt2");
  EXPECT_EQ(j.at("architectures").at(0), "GPT2LMHeadModel");
  EXPECT_EQ(j.at("vocab_size"), V);  // the real vocabulary, not the padded one
  EXPECT_EQ(j.at("n_positions"), P);
  EXPECT_EQ(j.at("n_embd"), h);
  EXPECT_EQ(j.at("n_layer"), c.num_layers);
  EXPECT_EQ(j.at("n_head"), H);
  EXPECT_EQ(j.at("n_inner"), F);
  EXPECT_EQ(j.at("activation_function"), "gelu_new");
  EXPECT_EQ(j.at("layer_norm_epsilon"), 1e-5);
  EXPECT_EQ(j.at("resid_pdrop"), c.hidden_dropout);
  EXPECT_EQ(j.at("embd_pdrop"), c.hidden_dropout);
  EXPECT_EQ(j.at("attn_pdrop"), c.attention_dropout);
  EXPECT_EQ(j.at("tie_word_embeddings"), true);
}

// The same for a Llama-style checkpoint of model `c`: HF's names and layout
// spelled out independently of hf::to_hf. Our QKV rows are walked in their
// order, [group][q heads of the group, k, v][head_dim], each compared with the
// HF row it must land on (q_proj rows [head][d], head = group x heads per
// group + slot; k_proj and v_proj rows [group][d]).
void check_llama_layout(const std::string& ckpt, const std::string& hf_dir, const layers::GPTConfig& c) {
  checkpoint::CheckpointReader reader(checkpoint::find_latest(ckpt));
  checkpoint::SafetensorsFile f(hf_dir + "/model.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const I h = c.hidden_size, H = c.num_attention_heads, G = c.num_query_groups > 0 ? c.num_query_groups : H;
  const I hd = h / H, P = H / G, V = c.vocab_size, F = c.ffn_hidden_size, L = c.num_layers;
  const bool bias = c.add_bias_linear;
  std::set<std::string> expected = {"model.embed_tokens.weight", "model.norm.weight"}, got;
  if (c.untie_embeddings) expected.insert("lm_head.weight");
  for (I l = 0; l < L; ++l) {
    const std::string x = "model.layers." + std::to_string(l) + ".";
    for (const char* n : {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
                          "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                          "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"})
      expected.insert(x + n);
    if (bias)
      for (const char* n : {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias",
                            "self_attn.o_proj.bias", "mlp.gate_proj.bias", "mlp.up_proj.bias", "mlp.down_proj.bias"})
        expected.insert(x + n);
  }
  for (const auto& [name, e] : f.tensors()) got.insert(name);
  EXPECT_EQ(got, expected);
  auto ours = [&](const std::string& n) { return reader.global_tensor(n, "master"); };
  auto slice = [](const std::vector<float>& v, I begin, I count) {
    return std::vector<float>(v.begin() + begin, v.begin() + begin + count);
  };
  EXPECT_EQ(tensor_of(f, "model.embed_tokens.weight", {V, h}), slice(ours("embedding.word.weight"), 0, V * h));
  for (I l = 0; l < L; ++l) {
    const std::string o = "layers." + std::to_string(l) + ".", x = "model.layers." + std::to_string(l) + ".";
    EXPECT_EQ(tensor_of(f, x + "input_layernorm.weight", {h}), ours(o + "ln1.weight"));
    EXPECT_EQ(tensor_of(f, x + "post_attention_layernorm.weight", {h}), ours(o + "ln2.weight"));
    for (const bool w : {true, false}) {  // weights [rows, h], then biases [rows]
      if (!w && !bias) continue;
      const std::string suffix = w ? ".weight" : ".bias";
      const I cols = w ? h : 1;
      auto shape = [&](I rows) { return w ? std::vector<I>{rows, h} : std::vector<I>{rows}; };
      const auto qkv = ours(o + "attention.qkv" + suffix);
      const auto q = tensor_of(f, x + "self_attn.q_proj" + suffix, shape(H * hd)),
                 k = tensor_of(f, x + "self_attn.k_proj" + suffix, shape(G * hd)),
                 v = tensor_of(f, x + "self_attn.v_proj" + suffix, shape(G * hd));
      I bad = 0, row = 0;
      for (I g = 0; g < G; ++g)
        for (I slot = 0; slot < P + 2; ++slot)
          for (I d = 0; d < hd; ++d, ++row) {
            const std::vector<float>& dst = slot < P ? q : slot == P ? k : v;
            const I hf_row = slot < P ? (g * P + slot) * hd + d : g * hd + d;
            for (I i = 0; i < cols; ++i)
              bad += dst[static_cast<std::size_t>(hf_row * cols + i)] != qkv[static_cast<std::size_t>(row * cols + i)];
          }
      EXPECT_EQ(row * cols, static_cast<I>(qkv.size())) << "every QKV row walked";
      EXPECT_EQ(bad, 0) << x << "self_attn q/k/v" << suffix;
      // SwiGLU's fc1 is [gate; up]: the first F rows gate, the next F up.
      const auto fc1 = ours(o + "mlp.fc1" + suffix);
      EXPECT_EQ(tensor_of(f, x + "mlp.gate_proj" + suffix, shape(F)), slice(fc1, 0, F * cols)) << x;
      EXPECT_EQ(tensor_of(f, x + "mlp.up_proj" + suffix, shape(F)), slice(fc1, F * cols, F * cols)) << x;
    }
    // nn.Linear is [out, in], as ours: no transpose.
    EXPECT_EQ(tensor_of(f, x + "self_attn.o_proj.weight", {h, h}), ours(o + "attention.dense.weight"));
    EXPECT_EQ(tensor_of(f, x + "mlp.down_proj.weight", {h, F}), ours(o + "mlp.fc2.weight"));
    if (bias) {
      EXPECT_EQ(tensor_of(f, x + "self_attn.o_proj.bias", {h}), ours(o + "attention.dense.bias"));
      EXPECT_EQ(tensor_of(f, x + "mlp.down_proj.bias", {h}), ours(o + "mlp.fc2.bias"));
    }
  }
  EXPECT_EQ(tensor_of(f, "model.norm.weight", {h}), ours("final_ln.weight"));
  if (c.untie_embeddings) {
    EXPECT_EQ(tensor_of(f, "lm_head.weight", {V, h}), slice(ours("output_layer.weight"), 0, V * h));
  }

  const auto j = nlohmann::json::parse(slurp(hf_dir + "/config.json"));
  EXPECT_EQ(j.at("model_type"), "llama");
  EXPECT_EQ(j.at("architectures"), nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(j.at("vocab_size"), V);
  EXPECT_EQ(j.at("hidden_size"), h);
  EXPECT_EQ(j.at("intermediate_size"), F);
  EXPECT_EQ(j.at("num_hidden_layers"), L);
  EXPECT_EQ(j.at("num_attention_heads"), H);
  EXPECT_EQ(j.at("num_key_value_heads"), G);
  EXPECT_EQ(j.at("head_dim"), hd);
  EXPECT_EQ(j.at("hidden_act"), "silu");
  EXPECT_EQ(j.at("rms_norm_eps"), c.layernorm_epsilon);
  EXPECT_EQ(j.at("rope_theta"), c.rotary_base);
  EXPECT_TRUE(j.at("rope_scaling").is_null());
  EXPECT_EQ(j.at("max_position_embeddings"), c.max_position_embeddings);
  EXPECT_EQ(j.at("tie_word_embeddings"), !c.untie_embeddings);
  EXPECT_EQ(j.at("attention_bias"), bias);
  EXPECT_EQ(j.at("mlp_bias"), bias);
  EXPECT_EQ(j.at("attention_dropout"), c.attention_dropout);
  EXPECT_EQ(j.at("bos_token_id"), V - 1);
  EXPECT_EQ(j.at("megazero").at("seq_length"), c.seq_length);
  EXPECT_EQ(j.at("megazero").at("make_vocab_size_divisible_by"), c.make_vocab_size_divisible_by);
  EXPECT_EQ(j.at("megazero").at("hidden_dropout"), c.hidden_dropout);
}

// Rank 0 alone: export, check, import, export again.
void convert_on_one_rank(const std::string& dir, Communicator& self, bool llama) {
  const auto ex = hf::export_checkpoint({dir + "/orig", dir + "/hf"});
  EXPECT_EQ(ex.iteration, 2);
  EXPECT_EQ(ex.format, llama ? hf::HfFormat::Llama : hf::HfFormat::Gpt2);
  EXPECT_EQ(ex.tensors, llama ? 21 : 28);  // Llama: embed, 9 per layer, norm, lm_head
  if (llama)
    check_llama_layout(dir + "/orig", dir + "/hf", zero_test_model(false, 32, true));
  else
    check_export_layout(dir + "/orig", dir + "/hf");

  hf::ImportOptions io;
  io.input = dir + "/hf";
  io.save = dir + "/imported";
  io.seed = 77;
  const auto im = hf::import_checkpoint(io, self);
  EXPECT_EQ(im.model.make_vocab_size_divisible_by, 4) << "restored from config.json's megazero block";
  EXPECT_EQ(im.model.seq_length, 8);
  checkpoint::CheckpointReader a(checkpoint::find_latest(dir + "/orig")), b(im.checkpoint);
  EXPECT_EQ(b.manifest().state.iteration, 0);
  EXPECT_EQ(b.manifest().tp, 1);
  EXPECT_EQ(train::config_values(b.manifest().state.config).at("num-attention-heads"), llama ? "8" : "4");
  for (const auto& p : a.manifest().parameters) {
    const auto va = a.global_tensor(p.name, "master"), vb = b.global_tensor(p.name, "master");
    // The padded vocabulary differs (TP 2 vs TP 1): the rows both have must be equal, padding zero.
    const std::size_t n = std::min(va.size(), vb.size());
    EXPECT_TRUE(std::equal(va.begin(), va.begin() + static_cast<std::ptrdiff_t>(n), vb.begin())) << p.name;
    EXPECT_TRUE(std::all_of(vb.begin() + static_cast<std::ptrdiff_t>(n), vb.end(), [](float v) { return v == 0; }));
    for (const char* s : {"exp_avg", "exp_avg_sq"}) {
      const auto m = b.global_tensor(p.name, s);
      EXPECT_TRUE(std::all_of(m.begin(), m.end(), [](float v) { return v == 0; })) << p.name << " " << s;
    }
  }
  // export(import(x)) == x, byte for byte.
  hf::export_checkpoint({dir + "/imported", dir + "/hf2"});
  EXPECT_TRUE(slurp(dir + "/hf/model.safetensors") == slurp(dir + "/hf2/model.safetensors"));
  EXPECT_EQ(slurp(dir + "/hf/config.json"), slurp(dir + "/hf2/config.json"));
}

}  // namespace

namespace {
void export_import_keeps_the_model(bool llama) {
  const std::string dir = shared_temp_dir();
  {
    ZeroRun a(world(), spec_of(2, 2, 2, llama));
    a.train(0, 2);
    save(a, dir + "/orig", 2);
  }
  auto self = world().split(world().rank(), 0, "self");
  if (world().rank() == 0) convert_on_one_rank(dir, *self, llama);
  barrier();
  // Both checkpoints into the same layout (another ZeRO stage): the same logits, bit for bit.
  ZeroRun orig(world(), spec_of(2, 2, 1, llama)), imported(world(), spec_of(2, 2, 1, llama));
  const auto lo = checkpoint::load_checkpoint(dir + "/orig", *orig.engine, place(orig));
  const auto li = checkpoint::load_checkpoint(dir + "/imported", *imported.engine, place(imported));
  EXPECT_TRUE(lo.loaded && li.loaded);
  EXPECT_EQ(li.state.iteration, 0);
  EXPECT_EQ(li.saved_tp, 1);
  const auto x = eval_logits(orig), y = eval_logits(imported);
  ASSERT_EQ(x.size(), y.size());
  EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << "logits differ";
  // At TP 1 x DP 4, ZeRO-3 (another TP, another vocab padding): equal up to reduction order.
  ZeroRun tp1(world(), spec_of(1, 4, 3, llama));
  EXPECT_TRUE(checkpoint::load_checkpoint(dir + "/imported", *tp1.engine, place(tp1)).loaded);
  const auto z = eval_logits(tp1);
  const I V = orig.model->config().vocab_size, rows = 2 * orig.model->config().seq_length;
  const I local = static_cast<I>(x.size()) / rows, full = static_cast<I>(z.size()) / rows,
          start = orig.model->vocab_start();
  double worst = 0;
  for (I r = 0; r < rows; ++r)
    for (I v = 0; v < local && start + v < V; ++v)
      worst = std::max(worst, std::abs(double(x[static_cast<std::size_t>(r * local + v)]) -
                                       z[static_cast<std::size_t>(r * full + start + v)]));
  EXPECT_LT(worst, 1e-5);
  barrier();
  if (world().rank() == 0) fs::remove_all(dir);
}
}  // namespace

TEST(ConvertCheckpoint, Tp2Dp2ExportImportKeepsTheModel) {
  if (world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  export_import_keeps_the_model(false);
}

TEST(ConvertCheckpoint, Tp2Dp2LlamaExportImportKeepsTheModel) {
  if (world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  export_import_keeps_the_model(true);
}

// ---------------------------------------------------------------- one rank
namespace {

// A TP 1 checkpoint trained one step and its fp32 export, in a fresh directory.
struct Exported {
  std::string dir;
  std::unique_ptr<ZeroRun> run;
  explicit Exported(bool llama = false) : dir(local_temp_dir()) {
    run = std::make_unique<ZeroRun>(world(), spec_of(1, 1, 0, llama));
    run->train(0, 1);
    save(*run, dir + "/ckpt", 1);
    hf::export_checkpoint({dir + "/ckpt", dir + "/hf"});
  }
  ~Exported() { fs::remove_all(dir); }
};

// Copies an HF export to `to`, letting `edit` drop (return false) or change tensors.
using Edit = std::function<bool(const std::string& name, DType& dtype, std::vector<I>& shape)>;
void rewrite(const std::string& from, const std::string& to, const Edit& edit, bool with_config = true,
             const std::string& prefix = "") {
  fs::create_directories(to);
  checkpoint::SafetensorsFile f(from + "/model.safetensors");
  checkpoint::SafetensorsWriter w;
  w.set_metadata("format", "pt");
  for (const auto& [name, e] : f.tensors()) {
    DType t = e.dtype;
    auto shape = e.shape;
    if (!edit(name, t, shape)) continue;
    w.add(prefix + name, t, shape, f.data(e));  // a smaller shape reads a prefix of the data
  }
  w.write(to + "/model.safetensors");
  if (with_config) fs::copy_file(from + "/config.json", to + "/config.json");
}

// The ConfigError message of `fn`, or "" if it did not throw one.
template <typename F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

std::string import_error(const std::string& input, const std::string& save, I heads = 0) {
  hf::ImportOptions o;
  o.input = input;
  o.save = save;
  o.num_attention_heads = heads;
  return error_of([&] { hf::import_checkpoint(o, world()); });
}

}  // namespace

TEST(ConvertCheckpoint, SixteenBitExportsRoundToNearestEven) {
  if (world().size() != 1) GTEST_SKIP() << "one rank";
  Exported e;
  checkpoint::SafetensorsFile f32(e.dir + "/hf/model.safetensors");
  for (const char* dt : {"bf16", "fp16"}) {
    hf::ExportOptions o{e.dir + "/ckpt", e.dir + "/" + dt, parse_dtype(dt)};
    hf::export_checkpoint(o);
    checkpoint::SafetensorsFile f16(o.output + "/model.safetensors");
    EXPECT_EQ(nlohmann::json::parse(slurp(o.output + "/config.json")).at("torch_dtype"),
              o.dtype == DType::BF16 ? "bfloat16" : "float16");
    ASSERT_EQ(f16.tensors().size(), f32.tensors().size());
    for (const auto& [name, e32] : f32.tensors()) {
      const auto& e16 = f16.entry(name);
      EXPECT_EQ(e16.dtype, o.dtype);
      EXPECT_EQ(e16.shape, e32.shape);
      const auto* src = reinterpret_cast<const float*>(f32.data(e32));
      const auto* got = reinterpret_cast<const std::uint16_t*>(f16.data(e16));
      I bad = 0;
      for (std::size_t i = 0; i < (e32.end - e32.begin) / 4; ++i)
        bad += got[i] != (o.dtype == DType::BF16 ? float_to_bf16(src[i]).bits : float_to_half(src[i]).bits);
      EXPECT_EQ(bad, 0) << dt << " " << name;
    }
  }
}

namespace {
void logits_tool_matches_the_training_model(bool llama) {
  Exported e(llama);
  const auto ours = eval_logits(*e.run);  // [2 S, V_padded], first sample's rows first
  const auto& c = e.run->model->config();
  std::vector<I> tokens;
  for (I i = 0; i < c.seq_length; ++i) tokens.push_back((i * 37 + 11) % c.vocab_size);
  const auto tool = hf::checkpoint_logits(e.dir + "/ckpt", tokens, world());
  ASSERT_EQ(static_cast<I>(tool.size()), c.seq_length * c.vocab_size);
  const I padded = static_cast<I>(ours.size()) / (2 * c.seq_length);
  double worst = 0;
  for (I s = 0; s < c.seq_length; ++s)
    for (I v = 0; v < c.vocab_size; ++v)
      worst = std::max(worst, std::abs(double(tool[static_cast<std::size_t>(s * c.vocab_size + v)]) -
                                       ours[static_cast<std::size_t>(s * padded + v)]));
  EXPECT_LT(worst, 1e-5);
}
}  // namespace

TEST(ConvertCheckpoint, LogitsToolMatchesTheTrainingModel) {
  if (world().size() != 1) GTEST_SKIP() << "one rank";
  logits_tool_matches_the_training_model(false);
}

TEST(ConvertCheckpoint, LogitsToolMatchesTheTrainingLlama) {
  if (world().size() != 1) GTEST_SKIP() << "one rank";
  logits_tool_matches_the_training_model(true);
}

TEST(ConvertCheckpoint, ImportRefusesBrokenInputsNamingTheProblem) {
  if (world().size() != 1) GTEST_SKIP() << "one rank";
  Exported e;
  const std::string d = e.dir;
  // A tensor missing.
  rewrite(d + "/hf", d + "/missing",
          [](const std::string& n, DType&, std::vector<I>&) { return n != "h.1.mlp.c_fc.bias"; });
  auto msg = import_error(d + "/missing", d + "/out1");
  EXPECT_NE(msg.find("has no tensor 'h.1.mlp.c_fc.bias'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(d + "/missing/model.safetensors"), std::string::npos) << msg;
  // A wrong shape.
  rewrite(d + "/hf", d + "/shape", [](const std::string& n, DType&, std::vector<I>& s) {
    if (n == "ln_f.weight") s = {31};
    return true;
  });
  msg = import_error(d + "/shape", d + "/out2");
  EXPECT_NE(msg.find("tensor 'ln_f.weight' is (31), expected (32)"), std::string::npos) << msg;
  // An integer dtype.
  rewrite(d + "/hf", d + "/dtype", [](const std::string& n, DType& t, std::vector<I>&) {
    if (n == "wte.weight") t = DType::I32;
    return true;
  });
  msg = import_error(d + "/dtype", d + "/out3");
  EXPECT_NE(msg.find("tensor 'wte.weight' has dtype I32"), std::string::npos) << msg;
  // An activation our MLP does not compute.
  rewrite(d + "/hf", d + "/relu", [](const std::string&, DType&, std::vector<I>&) { return true; });
  {
    auto j = nlohmann::json::parse(slurp(d + "/relu/config.json"));
    j["activation_function"] = "relu";
    std::ofstream(d + "/relu/config.json") << j.dump();
  }
  msg = import_error(d + "/relu", d + "/out4");
  EXPECT_NE(msg.find("activation_function 'relu' is not supported"), std::string::npos) << msg;
  // No config.json: the head count must be given; then it imports the same model.
  rewrite(
      d + "/hf", d + "/bare", [](const std::string&, DType&, std::vector<I>&) { return true; }, false);
  msg = import_error(d + "/bare/model.safetensors", d + "/out5");
  EXPECT_NE(msg.find("--num-attention-heads"), std::string::npos) << msg;
  EXPECT_EQ(import_error(d + "/bare/model.safetensors", d + "/out5", 4), "");
  // save_pretrained's layout: "transformer." prefix and a tied lm_head copy.
  {
    checkpoint::SafetensorsFile f(d + "/hf/model.safetensors");
    rewrite(
        d + "/hf", d + "/prefixed", [](const std::string&, DType&, std::vector<I>&) { return true; }, true,
        "transformer.");
    checkpoint::SafetensorsFile p(d + "/prefixed/model.safetensors");
    checkpoint::SafetensorsWriter w;
    w.set_metadata("format", "pt");
    for (const auto& [name, en] : p.tensors()) w.add(name, en.dtype, en.shape, p.data(en));
    const auto& wte = f.entry("wte.weight");
    w.add("lm_head.weight", wte.dtype, wte.shape, f.data(wte));
    w.write(d + "/prefixed/model2.safetensors");
    fs::rename(d + "/prefixed/model2.safetensors", d + "/prefixed/model.safetensors");
    hf::ImportOptions o;
    o.input = d + "/prefixed";
    o.save = d + "/out6";
    const auto r = hf::import_checkpoint(o, world());
    EXPECT_EQ(r.ignored, std::vector<std::string>{"lm_head.weight"});
    hf::export_checkpoint({d + "/out6", d + "/hf6"});
    EXPECT_TRUE(slurp(d + "/hf/model.safetensors") == slurp(d + "/hf6/model.safetensors"));
    // ... but an lm_head that differs cannot be tied.
    rewrite(d + "/prefixed", d + "/untied", [](const std::string&, DType&, std::vector<I>&) { return true; });
    checkpoint::SafetensorsFile u(d + "/untied/model.safetensors");
    checkpoint::SafetensorsWriter w2;
    w2.set_metadata("format", "pt");
    std::vector<float> other(static_cast<std::size_t>((wte.end - wte.begin) / 4), 0.5f);
    for (const auto& [name, en] : u.tensors())
      w2.add(name, en.dtype, en.shape, name == "lm_head.weight" ? static_cast<const void*>(other.data()) : u.data(en));
    w2.write(d + "/untied/m.safetensors");
    fs::rename(d + "/untied/m.safetensors", d + "/untied/model.safetensors");
    msg = import_error(d + "/untied", d + "/out7");
    EXPECT_NE(msg.find("lm_head.weight differs from wte.weight"), std::string::npos) << msg;
  }
  // A --save directory that already holds a checkpoint.
  msg = import_error(d + "/hf", d + "/ckpt");
  EXPECT_NE(msg.find("already holds checkpoint"), std::string::npos) << msg;
}

TEST(ConvertCheckpoint, ExportRefusesWhatIsNotACheckpoint) {
  if (world().size() != 1) GTEST_SKIP() << "one rank";
  const std::string d = local_temp_dir();
  auto msg = error_of([&] { hf::export_checkpoint({d, d + "/out"}); });
  EXPECT_NE(msg.find("--load " + d + ": no checkpoint there"), std::string::npos) << msg;
  // A checkpoint whose configuration does not give the head count (tests store "test").
  {
    ZeroRun r(world(), spec_of(1, 1, 0));
    checkpoint::TrainState s;
    s.config = "test";
    checkpoint::save_checkpoint(d + "/ckpt", s, *r.engine, place(r));
  }
  msg = error_of([&] { hf::export_checkpoint({d + "/ckpt", d + "/out"}); });
  EXPECT_NE(msg.find("pass --num-attention-heads N"), std::string::npos) << msg;
  hf::ExportOptions o{d + "/ckpt/" + checkpoint::iteration_dir_name(0), d + "/out", DType::F32, 4};
  EXPECT_EQ(hf::export_checkpoint(o).model.num_attention_heads, 4);  // an iter_* directory works too
  fs::remove_all(d);
}

// ---------------------------------------------------------------- Llama, one rank
namespace {

// A Llama-style model of the test's size (vocab 97, hidden 32, 2 layers, ffn 32).
layers::GPTConfig llama_model(I heads, I groups, bool bias, bool untied) {
  auto c = zero_test_model(false, 32, true);  // rope, RMSNorm, SwiGLU
  c.num_attention_heads = heads;
  c.num_query_groups = groups == heads ? 0 : groups;
  c.add_bias_linear = bias;
  c.untie_embeddings = untied;
  c.rotary_base = 500000;
  c.layernorm_epsilon = 1e-6;
  return c;
}

// The largest |x - y| over the largest |x|: logits of two models alike to rounding.
double relative_difference(const std::vector<float>& x, const std::vector<float>& y) {
  EXPECT_EQ(x.size(), y.size());
  double worst = 0, largest = 0;
  for (std::size_t i = 0; i < std::min(x.size(), y.size()); ++i)
    worst = std::max(worst, std::fabs(double(x[i]) - y[i])), largest = std::max(largest, std::fabs(double(x[i])));
  return largest > 0 ? worst / largest : worst;
}

// A TP 1 checkpoint of model `c` whose every master element is distinct: its
// 1-based position in the parameters' concatenation (exact in fp32), vocab
// padding rows zero. `config`: the stored configuration ("" = the model's).
// random_std > 0: normal values of that spread instead (a model whose
// attention is not saturated, where rope's pairing shows in the logits).
void save_numbered(const layers::GPTConfig& c, const std::string& dir, const std::string& config = "",
                   double random_std = 0) {
  auto tp = world().split(0, 0, "numbered-tp");
  auto dp = world().split(0, 0, "numbered-dp");
  const auto device = test_support::test_device();
  layers::ParameterSet params;
  layers::GPTModel model(c, layers::TpContext{tp.get(), device, DType::F32}, params);
  zero::ZeroEngine engine(params, *dp, *tp, device, zero::ZeroConfig{});
  float next = 1;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, static_cast<float>(random_std));
  for (std::size_t i = 0; i < engine.parameters().size(); ++i) {
    const auto& p = *engine.parameters()[i];
    const I n = p.local_numel(), row = n / p.global_shape[0];
    Tensor host = Tensor::zeros(make_device(DeviceKind::CPU), {n}, DType::F32, MemoryCategory::Workspace);
    for (I k = 0; k < n; ++k)
      host.host_data<float>()[k] = p.padding_from_row >= 0 && k / row >= p.padding_from_row ? 0.0f
                                   : random_std > 0                                         ? normal(rng)
                                                                                            : next++;
    engine.owned_state().master.narrow(0, engine.layout().param(i).begin - engine.owned().begin, n).copy_from(host);
  }
  engine.load_finished();
  checkpoint::TrainState s;
  s.iteration = 3;
  s.seed = 77;
  s.config = config.empty() ? hf::resolved_config(c, 77) : config;
  checkpoint::save_checkpoint(dir, s, engine, {&world(), 0, 1});
}

// Copies an HF export to `to` with its config.json changed by `edit`.
void edit_config(const std::string& from, const std::string& to, const std::function<void(nlohmann::json&)>& edit) {
  rewrite(from, to, [](const std::string&, DType&, std::vector<I>&) { return true; });
  auto j = nlohmann::json::parse(slurp(to + "/config.json"));
  edit(j);
  std::ofstream(to + "/config.json") << j.dump(2) << "\n";  // as the export writes it
}

// Adds to dir/model.safetensors copies of its tensors under new names: {new name, copied tensor}.
void add_copies(const std::string& dir, const std::vector<std::pair<std::string, std::string>>& copies) {
  const std::string path = dir + "/model.safetensors";
  {
    checkpoint::SafetensorsFile f(path);
    checkpoint::SafetensorsWriter w;
    w.set_metadata("format", "pt");
    for (const auto& [name, e] : f.tensors()) w.add(name, e.dtype, e.shape, f.data(e));
    for (const auto& [name, from] : copies) w.add(name, f.entry(from).dtype, f.entry(from).shape, f.data(from));
    w.write(path + ".new");
  }
  fs::rename(path + ".new", path);
}

hf::ImportResult import_to(const std::string& input, const std::string& save, I heads = 0) {
  hf::ImportOptions o;
  o.input = input;
  o.save = save;
  o.seed = 77;
  o.num_attention_heads = heads;
  return hf::import_checkpoint(o, world());
}

// The imported checkpoint holds the original's master values (rows both
// have; padding zero) and nothing else.
void expect_same_masters(const std::string& original, const std::string& imported) {
  checkpoint::CheckpointReader a(checkpoint::find_latest(original)), b(checkpoint::find_latest(imported));
  ASSERT_EQ(a.manifest().parameters.size(), b.manifest().parameters.size());
  for (const auto& p : a.manifest().parameters) {
    const auto va = a.global_tensor(p.name, "master"), vb = b.global_tensor(p.name, "master");
    const auto n = static_cast<std::ptrdiff_t>(std::min(va.size(), vb.size()));
    EXPECT_TRUE(std::equal(va.begin(), va.begin() + n, vb.begin())) << p.name;
    EXPECT_TRUE(std::all_of(va.begin() + n, va.end(), [](float v) { return v == 0; })) << p.name;
    EXPECT_TRUE(std::all_of(vb.begin() + n, vb.end(), [](float v) { return v == 0; })) << p.name;
  }
}

// Two exports hold the same model.safetensors and config.json, byte for byte.
::testing::AssertionResult same_files(const std::string& a, const std::string& b) {
  if (slurp(a + "/model.safetensors") != slurp(b + "/model.safetensors"))
    return ::testing::AssertionFailure() << a << "/model.safetensors differs from " << b << "'s";
  const std::string ca = slurp(a + "/config.json"), cb = slurp(b + "/config.json");
  if (ca != cb) return ::testing::AssertionFailure() << "config.json differs:\n" << ca << "\n" << cb;
  return ::testing::AssertionSuccess();
}

}  // namespace

TEST(ConvertCheckpoint, LlamaEveryTensorPlacedAndRoundTrips) {
  if (world().size() != 1) GTEST_SKIP() << "one rank";
  struct Variant {
    I heads, groups;
    bool bias, untied;
  };
  // GQA untied without biases (Llama 2 70B's shape), MHA tied with biases, MQA, MHA untied with biases.
  for (const Variant v : {Variant{8, 2, false, true}, Variant{8, 8, true, false}, Variant{4, 1, false, false},
                          Variant{4, 4, true, true}}) {
    SCOPED_TRACE(testing::Message() << v.heads << " heads, " << v.groups << " groups, bias " << v.bias << ", untied "
                                    << v.untied);
    const auto c = llama_model(v.heads, v.groups, v.bias, v.untied);
    const std::string d = local_temp_dir();
    save_numbered(c, d + "/ckpt");
    const auto ex = hf::export_checkpoint({d + "/ckpt", d + "/hf"});
    EXPECT_EQ(ex.format, hf::HfFormat::Llama);
    check_llama_layout(d + "/ckpt", d + "/hf", c);
    const auto im = import_to(d + "/hf", d + "/imported");
    EXPECT_EQ(im.format, hf::HfFormat::Llama);
    EXPECT_EQ(im.model.num_query_groups, c.num_query_groups);
    EXPECT_EQ(im.model.add_bias_linear, v.bias);
    EXPECT_EQ(im.model.untie_embeddings, v.untied);
    EXPECT_EQ(im.model.rotary_base, 500000);
    EXPECT_EQ(im.model.layernorm_epsilon, 1e-6);
    EXPECT_EQ(im.model.hidden_dropout, c.hidden_dropout) << "restored from the megazero block";
    EXPECT_EQ(im.model.attention_dropout, c.attention_dropout);
    const auto kv = train::config_values(checkpoint::CheckpointReader(im.checkpoint).manifest().state.config);
    EXPECT_EQ(kv.at("position-embedding-type"), "rope");
    EXPECT_EQ(kv.at("normalization"), "RMSNorm");
    EXPECT_EQ(kv.at("swiglu"), "true");
    EXPECT_EQ(kv.at("group-query-attention"), v.groups != v.heads ? "true" : "false");
    EXPECT_EQ(kv.at("disable-bias-linear"), v.bias ? "false" : "true");
    EXPECT_EQ(kv.at("untie-embeddings-and-output-weights"), v.untied ? "true" : "false");
    EXPECT_EQ(kv.at("rotary-base"), "500000");
    EXPECT_EQ(kv.at("norm-epsilon"), "1e-06");
    expect_same_masters(d + "/ckpt", d + "/imported");
    hf::export_checkpoint({d + "/imported", d + "/hf2"});
    EXPECT_TRUE(same_files(d + "/hf", d + "/hf2")) << "export(import(x)) differs from x";
    fs::remove_all(d);
  }
}

// --rotary-seq-len-interpolation-factor is Hugging Face's linear rope_scaling:
// exported as {"rope_type": "linear", "factor": f} and imported back, the
// round trip byte for byte; --use-rope-scaling is its llama3 kind (factor,
// low/high frequency factors 1 and 4, 8192 original positions), the same
// logits after the round trip; another kind of scaling, or llama3 with other
// frequency factors, or both at once on export, is refused by name.
TEST(ConvertCheckpoint, LinearRopeScalingRoundTrips) {
  if (world().size() != 1) GTEST_SKIP() << "one rank";
  auto c = llama_model(4, 2, false, true);
  c.rotary_interpolation_factor = 2.5;
  const std::string d = local_temp_dir();
  save_numbered(c, d + "/ckpt");
  hf::export_checkpoint({d + "/ckpt", d + "/hf"});
  const auto config = nlohmann::json::parse(slurp(d + "/hf/config.json"));
  EXPECT_EQ(config["rope_scaling"]["rope_type"], "linear");
  EXPECT_EQ(config["rope_scaling"]["factor"], 2.5);
  const auto im = import_to(d + "/hf", d + "/imported");
  EXPECT_EQ(im.model.rotary_interpolation_factor, 2.5);
  hf::export_checkpoint({d + "/imported", d + "/hf2"});
  EXPECT_TRUE(same_files(d + "/hf", d + "/hf2"));
  auto yarn = config;
  yarn["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  std::ofstream(d + "/hf/config.json") << yarn.dump(2);
  auto msg = error_of([&] { import_to(d + "/hf", d + "/yarn"); });
  EXPECT_NE(msg.find("takes linear position interpolation (--rotary-seq-len-interpolation-factor"), std::string::npos)
      << msg;
  // Llama 3's scaling.
  auto l3 = llama_model(4, 2, false, true);
  l3.max_position_embeddings = l3.seq_length = 64;
  l3.use_rope_scaling = true;
  l3.rope_scaling_factor = 32;
  l3.rotary_base = 500000;
  save_numbered(l3, d + "/l3", "", 0.5);
  hf::export_checkpoint({d + "/l3", d + "/l3hf"});
  const auto l3config = nlohmann::json::parse(slurp(d + "/l3hf/config.json"));
  EXPECT_EQ(l3config["rope_scaling"], nlohmann::json({{"rope_type", "llama3"},
                                                      {"factor", 32.0},
                                                      {"low_freq_factor", 1.0},
                                                      {"high_freq_factor", 4.0},
                                                      {"original_max_position_embeddings", 8192.0}}));
  const auto im3 = import_to(d + "/l3hf", d + "/l3imported");
  EXPECT_TRUE(im3.model.use_rope_scaling);
  EXPECT_EQ(im3.model.rope_scaling_factor, 32.0);
  auto self = world().split(world().rank(), 0, "self");
  std::vector<I> tokens;
  for (I t = 0; t < 40; ++t) tokens.push_back((t * 13 + 5) % l3.vocab_size);
  hf::CheckpointModel orig(d + "/l3", *self), imported(d + "/l3imported", *self);
  EXPECT_TRUE(orig.config().use_rope_scaling) << "read back from the stored configuration";
  EXPECT_LE(relative_difference(orig.logits(tokens), imported.logits(tokens)), 1e-6);
  hf::export_checkpoint({d + "/l3imported", d + "/l3hf2"});
  EXPECT_TRUE(same_files(d + "/l3hf", d + "/l3hf2"));
  auto other = l3config;
  other["rope_scaling"]["high_freq_factor"] = 2.0;
  std::ofstream(d + "/l3hf/config.json") << other.dump(2);
  msg = error_of([&] { import_to(d + "/l3hf", d + "/other"); });
  EXPECT_NE(msg.find("or Llama 3's scaling (--use-rope-scaling: rope_type llama3 with low_freq_factor 1, "
                     "high_freq_factor 4"),
            std::string::npos)
      << msg;
  l3.rotary_interpolation_factor = 2;
  save_numbered(l3, d + "/both");
  msg = error_of([&] { hf::export_checkpoint({d + "/both", d + "/bothhf"}); });
  EXPECT_NE(msg.find("scales rope both ways"), std::string::npos) << msg;
  fs::remove_all(d);
}

// --rotary-interleaved: the export permutes each query and key head's rows
// into Hugging Face's rotate-half order (Meta's original Llama weights
// differ from Hugging Face's by this permutation), so the import, a plain
// rotate-half model, computes the same logits; the stored option is read back.
TEST(ConvertCheckpoint, InterleavedRopeExportsAsRotateHalf) {
  if (world().size() != 1) GTEST_SKIP() << "one rank";
  for (const bool bias : {false, true}) {
    SCOPED_TRACE(bias ? "q/k biases" : "no biases");
    auto c = llama_model(4, 2, bias, true);
    c.rotary_interleaved = true;
    const std::string d = local_temp_dir();
    save_numbered(c, d + "/ckpt", "", 0.5);
    hf::export_checkpoint({d + "/ckpt", d + "/hf"});
    const auto im = import_to(d + "/hf", d + "/imported");
    EXPECT_FALSE(im.model.rotary_interleaved);
    auto self = world().split(world().rank(), 0, "self");
    const std::vector<I> tokens = {3, 17, 42, 5, 96, 0, 50, 7};
    hf::CheckpointModel orig(d + "/ckpt", *self), imported(d + "/imported", *self);
    EXPECT_TRUE(orig.config().rotary_interleaved) << "read back from the stored configuration";
    const auto x = orig.logits(tokens), y = imported.logits(tokens);
    EXPECT_LE(relative_difference(x, y), 1e-5) << "the imported rotate-half model computes the interleaved one";
    // Without the permutation (the same weights read as rotate-half) it would not.
    c.rotary_interleaved = false;
    save_numbered(c, d + "/halves", "", 0.5);
    hf::CheckpointModel halves(d + "/halves", *self);
    EXPECT_GT(relative_difference(x, halves.logits(tokens)), 1e-3);
    fs::remove_all(d);
  }
}

// --apply-layernorm-1p: our norms store gamma - 1; the export writes each
// norm's gamma = 1 + the stored weight (GPT-2's LayerNorms, Llama's RMSNorms,
// the final norm), so the import, a plain model, computes the same logits.
TEST(ConvertCheckpoint, ZeroCentredNormsExportAsTheirGamma) {
  if (world().size() != 1) GTEST_SKIP() << "one rank";
  for (const bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "Llama" : "GPT-2");
    auto c = llama ? llama_model(4, 2, false, true) : zero_test_model(false);
    c.layernorm_1p = true;
    const std::string d = local_temp_dir();
    save_numbered(c, d + "/ckpt", "", 0.5);
    hf::export_checkpoint({d + "/ckpt", d + "/hf"});
    // Each norm weight in the file is 1 + ours.
    checkpoint::CheckpointReader reader(checkpoint::find_latest(d + "/ckpt"));
    checkpoint::SafetensorsFile f(d + "/hf/model.safetensors");
    const std::vector<I> h = {c.hidden_size};
    const std::string ln1 = llama ? "model.layers.1.input_layernorm.weight" : "h.1.ln_1.weight";
    const std::string fin = llama ? "model.norm.weight" : "ln_f.weight";
    for (const auto& [ours, theirs] : {std::pair<std::string, std::string>{"layers.1.ln1.weight", ln1},
                                       std::pair<std::string, std::string>{"final_ln.weight", fin}}) {
      const auto w = reader.global_tensor(ours, "master");
      const auto g = tensor_of(f, theirs, h);
      ASSERT_EQ(w.size(), g.size());
      for (std::size_t i = 0; i < w.size(); ++i) ASSERT_EQ(g[i], 1.0f + w[i]) << theirs << " " << i;
    }
    const auto im = import_to(d + "/hf", d + "/imported");
    EXPECT_FALSE(im.model.layernorm_1p) << "Hugging Face's norms store gamma: the import is a plain model";
    auto self = world().split(world().rank(), 0, "self");
    const std::vector<I> tokens = {3, 17, 42, 5, 9, 0, 50, 7};
    hf::CheckpointModel orig(d + "/ckpt", *self), imported(d + "/imported", *self);
    EXPECT_TRUE(orig.config().layernorm_1p);
    const auto x = orig.logits(tokens), y = imported.logits(tokens);
    EXPECT_LE(relative_difference(x, y), 1e-6) << "the imported model computes the zero-centred one";
    fs::remove_all(d);
  }
}

// --qk-layernorm on a Llama-style model without biases: Qwen3ForCausalLM
// (model_type qwen3, self_attn.q_norm / k_norm of the head size, applied
// before rope), also with interleaved rope (the norms' weights permuted with
// the heads' rows) and zero-centred norms; the import is the same model
// (--qk-layernorm read from model_type) with the same logits, and exports the
// same file again; with biases (Qwen3's MLP has none) it is refused by name.
TEST(ConvertCheckpoint, QkLayerNormExportsAsQwen3) {
  if (world().size() != 1) GTEST_SKIP() << "one rank";
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant == 0 ? "plain" : variant == 1 ? "interleaved rope" : "zero-centred norms");
    auto c = llama_model(4, 2, false, variant != 1);
    c.qk_layernorm = true;
    c.rotary_interleaved = variant == 1;
    c.layernorm_1p = variant == 2;
    const std::string d = local_temp_dir();
    save_numbered(c, d + "/ckpt", "", 0.5);
    const auto ex = hf::export_checkpoint({d + "/ckpt", d + "/hf"});
    EXPECT_EQ(ex.format, hf::HfFormat::Llama);
    const auto cfg = nlohmann::json::parse(slurp(d + "/hf/config.json"));
    EXPECT_EQ(cfg.at("model_type"), "qwen3");
    EXPECT_EQ(cfg.at("architectures"), nlohmann::json({"Qwen3ForCausalLM"}));
    EXPECT_FALSE(cfg.contains("mlp_bias")) << "Qwen3Config has no MLP bias switch";
    EXPECT_EQ(cfg.at("use_sliding_window"), false);
    checkpoint::SafetensorsFile f(d + "/hf/model.safetensors");
    const std::vector<I> hd = {c.head_dim()};
    const auto qn = tensor_of(f, "model.layers.1.self_attn.q_norm.weight", hd);
    tensor_of(f, "model.layers.1.self_attn.k_norm.weight", hd);
    if (variant == 0) {  // in order, as stored
      checkpoint::CheckpointReader reader(checkpoint::find_latest(d + "/ckpt"));
      EXPECT_EQ(qn, reader.global_tensor("layers.1.attention.q_layernorm.weight", "master"));
    }
    const auto im = import_to(d + "/hf", d + "/imported");
    EXPECT_TRUE(im.model.qk_layernorm) << "model_type qwen3 is a Llama with q/k norms";
    EXPECT_FALSE(im.model.add_bias_linear);
    auto self = world().split(world().rank(), 0, "self");
    const std::vector<I> tokens = {3, 17, 42, 5, 9, 0, 50, 7};
    hf::CheckpointModel orig(d + "/ckpt", *self), imported(d + "/imported", *self);
    const auto x = orig.logits(tokens), y = imported.logits(tokens);
    EXPECT_LE(relative_difference(x, y), 1e-5) << "the imported Qwen3 computes the exported model";
    hf::export_checkpoint({d + "/imported", d + "/hf2"});
    EXPECT_EQ(slurp(d + "/hf2/model.safetensors"), slurp(d + "/hf/model.safetensors"));
    fs::remove_all(d);
  }
  const std::string d = local_temp_dir();
  auto biased = llama_model(4, 2, true, true);
  biased.qk_layernorm = true;
  save_numbered(biased, d + "/biased");
  const auto msg = error_of([&] { hf::export_checkpoint({d + "/biased", d + "/out"}); });
  EXPECT_NE(msg.find("Qwen3ForCausalLM"), std::string::npos) << msg;
  EXPECT_NE(msg.find("would need --disable-bias-linear, so it has no Hugging Face form here"), std::string::npos)
      << msg;
  EXPECT_FALSE(fs::exists(d + "/out/model.safetensors"));
  fs::remove_all(d);
}

// --disable-bias-linear --add-qkv-bias on a Llama-style model:
// Qwen2ForCausalLM (model_type qwen2, q/k/v projections with biases, o_proj
// and the MLP without; no bias switches in its config); the import is the
// same model with the same logits and exports the same file again; the
// biases are carved as the weights' rows are.
TEST(ConvertCheckpoint, QkvBiasesExportAsQwen2) {
  if (world().size() != 1) GTEST_SKIP() << "one rank";
  auto c = llama_model(4, 2, false, true);
  c.add_qkv_bias = true;
  const std::string d = local_temp_dir();
  save_numbered(c, d + "/ckpt", "", 0.5);
  hf::export_checkpoint({d + "/ckpt", d + "/hf"});
  const auto cfg = nlohmann::json::parse(slurp(d + "/hf/config.json"));
  EXPECT_EQ(cfg.at("model_type"), "qwen2");
  EXPECT_EQ(cfg.at("architectures"), nlohmann::json({"Qwen2ForCausalLM"}));
  EXPECT_FALSE(cfg.contains("attention_bias") || cfg.contains("mlp_bias")) << "Qwen2Config has no bias switches";
  checkpoint::SafetensorsFile f(d + "/hf/model.safetensors");
  EXPECT_TRUE(f.has("model.layers.1.self_attn.k_proj.bias"));
  EXPECT_FALSE(f.has("model.layers.1.self_attn.o_proj.bias") || f.has("model.layers.1.mlp.gate_proj.bias"));
  // k_proj's bias: the k rows of our grouped QKV bias, [group][P q heads, k, v][d] (P = 2 here).
  checkpoint::CheckpointReader reader(checkpoint::find_latest(d + "/ckpt"));
  const auto ours = reader.global_tensor("layers.1.attention.qkv.bias", "master");
  const I hd = c.head_dim(), per_group = c.num_attention_heads / c.query_groups();
  const auto k = tensor_of(f, "model.layers.1.self_attn.k_proj.bias", {c.query_groups() * hd});
  for (I r = 0; r < static_cast<I>(k.size()); ++r)
    ASSERT_EQ(k[static_cast<std::size_t>(r)],
              ours[static_cast<std::size_t>(((r / hd) * (per_group + 2) + per_group) * hd + r % hd)])
        << r;
  const auto im = import_to(d + "/hf", d + "/imported");
  EXPECT_TRUE(im.model.add_qkv_bias);
  EXPECT_FALSE(im.model.add_bias_linear);
  auto self = world().split(world().rank(), 0, "self");
  const std::vector<I> tokens = {3, 17, 42, 5, 9, 0, 50, 7};
  hf::CheckpointModel orig(d + "/ckpt", *self), imported(d + "/imported", *self);
  EXPECT_LE(relative_difference(orig.logits(tokens), imported.logits(tokens)), 1e-6);
  hf::export_checkpoint({d + "/imported", d + "/hf2"});
  EXPECT_EQ(slurp(d + "/hf2/model.safetensors"), slurp(d + "/hf/model.safetensors"));
  EXPECT_EQ(slurp(d + "/hf2/config.json"), slurp(d + "/hf/config.json"));
  // With --qk-layernorm too: Qwen3 has no such model (its attention_bias biases o_proj as well).
  c.qk_layernorm = true;
  save_numbered(c, d + "/qk");
  const auto msg = error_of([&] { hf::export_checkpoint({d + "/qk", d + "/out"}); });
  EXPECT_NE(msg.find("would need no --add-qkv-bias, so it has no Hugging Face form here"), std::string::npos) << msg;
  fs::remove_all(d);
}

TEST(ConvertCheckpoint, ExportRefusesWhatNoHuggingFaceModelComputes) {
  if (world().size() != 1) GTEST_SKIP() << "one rank";
  const std::string d = local_temp_dir();
  auto export_error = [&](const layers::GPTConfig& c, const std::string& name) {
    save_numbered(c, d + "/" + name);
    const auto msg = error_of([&] { hf::export_checkpoint({d + "/" + name, d + "/out"}); });
    EXPECT_NE(msg.find("is neither a GPT-2 nor a Llama"), std::string::npos) << msg;
    return msg;
  };
  auto rope_ln = llama_model(4, 4, true, false);
  rope_ln.normalization = "LayerNorm";
  auto msg = export_error(rope_ln, "rope_ln");
  EXPECT_NE(msg.find("LlamaForCausalLM would need --normalization RMSNorm ("), std::string::npos) << msg;
  EXPECT_NE(msg.find("GPT2LMHeadModel would need learned positions (not --position-embedding-type rope), a GeLU "
                     "MLP (not --swiglu);"),
            std::string::npos)
      << msg;
  auto learned_swiglu = llama_model(4, 4, true, false);
  learned_swiglu.position_embedding_type = "learned_absolute";
  msg = export_error(learned_swiglu, "learned_swiglu");
  EXPECT_NE(msg.find("LlamaForCausalLM would need --position-embedding-type rope ("), std::string::npos) << msg;
  auto gpt2_gqa = zero_test_model(false);
  gpt2_gqa.num_query_groups = 2;
  msg = export_error(gpt2_gqa, "gpt2_gqa");
  EXPECT_NE(msg.find("GPT2LMHeadModel would need one key/value head per query head (not --group-query-attention)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("LlamaForCausalLM would need --position-embedding-type rope, --normalization RMSNorm, --swiglu"),
            std::string::npos)
      << msg;
  EXPECT_FALSE(fs::exists(d + "/out/model.safetensors"));
  // Per-head q/k norms (--qk-layernorm): read back from the parameters, then refused by name.
  auto qk = llama_model(4, 4, true, false);
  qk.qk_layernorm = true;
  save_numbered(qk, d + "/qk");
  msg = error_of([&] { hf::export_checkpoint({d + "/qk", d + "/out"}); });
  EXPECT_NE(msg.find("normalises q and k per head (--qk-layernorm)"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(d + "/out/model.safetensors"));
  // A squared-ReLU MLP (--squared-relu): GPT-2's shapes, read back from the configuration, refused by name.
  auto relu2 = zero_test_model(false);
  relu2.squared_relu = true;
  save_numbered(relu2, d + "/relu2");
  msg = error_of([&] { hf::export_checkpoint({d + "/relu2", d + "/out"}); });
  EXPECT_NE(msg.find("has a squared-ReLU MLP (--squared-relu)"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(d + "/out/model.safetensors"));
  // Post-norm residuals (--apply-residual-connection-post-layernorm): read back from the configuration, refused.
  auto post = zero_test_model(false);
  post.residual_post_norm = true;
  save_numbered(post, d + "/post");
  msg = error_of([&] { hf::export_checkpoint({d + "/post", d + "/out"}); });
  EXPECT_NE(msg.find("(--apply-residual-connection-post-layernorm), which neither"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(d + "/out/model.safetensors"));
  // A configuration that contradicts the parameters.
  const auto c = llama_model(8, 2, false, true);
  std::string config = hf::resolved_config(c, 77);
  config.replace(config.find("swiglu = true"), 13, "swiglu = false");
  save_numbered(c, d + "/liar", config);
  msg = error_of([&] { hf::export_checkpoint({d + "/liar", d + "/out"}); });
  EXPECT_NE(msg.find("its configuration says swiglu = false but its parameters say swiglu = true"), std::string::npos)
      << msg;
  config = hf::resolved_config(c, 77);
  config.replace(config.find("num-query-groups = 2"), 20, "num-query-groups = 4");
  save_numbered(c, d + "/liar2", config);
  msg = error_of([&] { hf::export_checkpoint({d + "/liar2", d + "/out"}); });
  EXPECT_NE(msg.find("says 4 query groups (group-query-attention, num-query-groups) but "
                     "layers.0.attention.qkv.weight's rows say 2"),
            std::string::npos)
      << msg;
  fs::remove_all(d);
}

TEST(ConvertCheckpoint, LlamaImportRefusesWhatMegazeroCannotCompute) {
  if (world().size() != 1) GTEST_SKIP() << "one rank";
  const std::string d = local_temp_dir();
  save_numbered(llama_model(8, 2, false, true), d + "/ckpt");
  hf::export_checkpoint({d + "/ckpt", d + "/hf"});
  int n = 0;
  auto refused = [&](const std::function<void(nlohmann::json&)>& edit) {
    const std::string dir = d + "/edit" + std::to_string(++n);
    edit_config(d + "/hf", dir, edit);
    return import_error(dir, dir + "/out");
  };
  auto msg = refused([](nlohmann::json& j) { j["attention_bias"] = true; });
  EXPECT_NE(msg.find("attention_bias true with mlp_bias false cannot be imported: megazero has one switch"),
            std::string::npos)
      << msg;
  msg = refused([](nlohmann::json& j) { j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}}; });
  EXPECT_NE(msg.find("rope_scaling {\"factor\":2.0,\"rope_type\":\"dynamic\"} is not supported: megazero's rotary "
                     "embedding takes linear position interpolation"),
            std::string::npos)
      << msg;
  msg = refused([](nlohmann::json& j) { j["hidden_act"] = "gelu"; });
  EXPECT_NE(msg.find("hidden_act 'gelu' is not supported"), std::string::npos) << msg;
  msg = refused([](nlohmann::json& j) { j["head_dim"] = 8; });
  EXPECT_NE(msg.find("head_dim 8 is not hidden_size / num_attention_heads (32 / 8)"), std::string::npos) << msg;
  msg = refused([](nlohmann::json& j) { j["model_type"] = "mistral"; });
  EXPECT_NE(msg.find("describes a 'mistral' model; convert_checkpoint imports GPT-2 (model_type gpt2), Llama "
                     "(model_type llama), Qwen2 (model_type qwen2) and Qwen3 (model_type qwen3)"),
            std::string::npos)
      << msg;
  msg = refused([](nlohmann::json& j) {
    j["model_type"] = "qwen3";
    j["use_sliding_window"] = true;
  });
  EXPECT_NE(msg.find("use_sliding_window true is not supported"), std::string::npos) << msg;
  msg = refused([](nlohmann::json& j) { j["num_key_value_heads"] = 3; });
  EXPECT_NE(msg.find("is not divisible by --num-query-groups 3"), std::string::npos) << msg;
  // Tied by the config, but the file's lm_head is a weight of its own.
  msg = refused([](nlohmann::json& j) { j["tie_word_embeddings"] = true; });
  EXPECT_NE(msg.find("lm_head.weight differs from model.embed_tokens.weight but"), std::string::npos) << msg;
  // Untied by the config, and no lm_head.
  rewrite(d + "/hf", d + "/no_head",
          [](const std::string& name, DType&, std::vector<I>&) { return name != "lm_head.weight"; });
  msg = import_error(d + "/no_head", d + "/no_head/out");
  EXPECT_NE(msg.find("has no tensor 'lm_head.weight', which a Llama of num_hidden_layers 2 (attention_bias false, "
                     "mlp_bias false, tie_word_embeddings false) needs"),
            std::string::npos)
      << msg;
  // A tensor the config does not account for.
  rewrite(d + "/hf", d + "/extra", [](const std::string&, DType&, std::vector<I>&) { return true; });
  add_copies(d + "/extra", {{"model.layers.1.self_attn.o_proj.bias", "model.norm.weight"}});
  msg = import_error(d + "/extra", d + "/extra/out");
  EXPECT_NE(msg.find("tensor 'model.layers.1.self_attn.o_proj.bias' is not part of a Llama megazero knows "
                     "(attention_bias false, mlp_bias false)"),
            std::string::npos)
      << msg;
  fs::remove_all(d);
}

TEST(ConvertCheckpoint, LlamaImportsWithoutConfigAndFromSavePretrained) {
  if (world().size() != 1) GTEST_SKIP() << "one rank";
  const std::string d = local_temp_dir();
  save_numbered(llama_model(8, 2, true, false), d + "/ckpt");  // tied, with biases
  hf::export_checkpoint({d + "/ckpt", d + "/hf"});
  // No config.json: the shapes and --num-attention-heads give the model; LlamaConfig's defaults the rest.
  rewrite(
      d + "/hf", d + "/bare", [](const std::string&, DType&, std::vector<I>&) { return true; }, false);
  auto msg = import_error(d + "/bare/model.safetensors", d + "/bare/out");
  EXPECT_NE(msg.find("--num-attention-heads N"), std::string::npos) << msg;
  const auto bare = import_to(d + "/bare/model.safetensors", d + "/bare/out", 8);
  EXPECT_EQ(bare.format, hf::HfFormat::Llama);
  EXPECT_EQ(bare.model.num_query_groups, 2);
  EXPECT_TRUE(bare.model.add_bias_linear);
  EXPECT_FALSE(bare.model.untie_embeddings);
  ASSERT_EQ(bare.notes.size(), 1u);
  EXPECT_NE(bare.notes[0].find("LlamaConfig's defaults assumed: rms_norm_eps 1e-06, rope_theta 10000"),
            std::string::npos);
  hf::export_checkpoint({d + "/bare/out", d + "/bare/hf"});
  EXPECT_TRUE(slurp(d + "/hf/model.safetensors") == slurp(d + "/bare/hf/model.safetensors"));
  // save_pretrained of a tied model may keep lm_head (equal to the embedding); older transformers kept the
  // rotary inv_freq buffers. Both are skipped and listed.
  rewrite(d + "/hf", d + "/saved", [](const std::string&, DType&, std::vector<I>&) { return true; });
  add_copies(d + "/saved", {{"lm_head.weight", "model.embed_tokens.weight"},
                            {"model.layers.0.self_attn.rotary_emb.inv_freq", "model.norm.weight"}});
  const auto saved = import_to(d + "/saved", d + "/saved/out");
  EXPECT_EQ(saved.ignored,
            (std::vector<std::string>{"lm_head.weight", "model.layers.0.self_attn.rotary_emb.inv_freq"}));
  hf::export_checkpoint({d + "/saved/out", d + "/saved/hf"});
  EXPECT_TRUE(same_files(d + "/hf", d + "/saved/hf"));
  fs::remove_all(d);
}

TEST(ConvertCheckpoint, Gpt2KeepsWorkingWithTheNewOptions) {
  if (world().size() != 1) GTEST_SKIP() << "one rank";
  Exported e;
  const std::string d = e.dir;
  // layer_norm_epsilon other than 1e-5 is --norm-epsilon now.
  edit_config(d + "/hf", d + "/eps", [](nlohmann::json& j) { j["layer_norm_epsilon"] = 1e-6; });
  const auto im = import_to(d + "/eps", d + "/eps/out");
  EXPECT_EQ(im.format, hf::HfFormat::Gpt2);
  EXPECT_EQ(im.model.layernorm_epsilon, 1e-6);
  EXPECT_EQ(
      train::config_values(checkpoint::CheckpointReader(im.checkpoint).manifest().state.config).at("norm-epsilon"),
      "1e-06");
  hf::export_checkpoint({d + "/eps/out", d + "/eps/hf"});
  EXPECT_TRUE(slurp(d + "/hf/model.safetensors") == slurp(d + "/eps/hf/model.safetensors"));
  EXPECT_EQ(slurp(d + "/eps/config.json"), slurp(d + "/eps/hf/config.json"));  // layer_norm_epsilon 1e-06 kept
  // A checkpoint from before the options (its configuration lacks their keys) is the GPT-2 it always was.
  std::string config;
  for (const auto& [k, v] : train::config_values(hf::resolved_config(e.run->model->config(), 77)))
    if (!std::set<std::string>{"position-embedding-type", "rotary-base", "normalization", "swiglu",
                               "group-query-attention", "num-query-groups", "disable-bias-linear",
                               "untie-embeddings-and-output-weights", "norm-epsilon"}
             .count(k))
      config += k + " = " + v + "\n";
  checkpoint::TrainState s;
  s.iteration = 1;
  s.seed = 77;
  s.config = config;
  checkpoint::save_checkpoint(d + "/old", s, *e.run->engine, place(*e.run));
  const auto ex = hf::export_checkpoint({d + "/old", d + "/old_hf"});
  EXPECT_EQ(ex.format, hf::HfFormat::Gpt2);
  EXPECT_TRUE(same_files(d + "/hf", d + "/old_hf"));
}
