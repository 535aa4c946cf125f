// Hugging Face GPT-2 export/import (tools/hf_gpt2.h, docs/HF_EXPORT.md):
//  - a model trained at TP 2 x DP 2 (ZeRO-2) exports to HF names whose every
//    element is the checkpoint's global master value under the expected
//    transpose / QKV reorder (checked here with index arithmetic of its own);
//  - importing that export gives a checkpoint that loads at TP 2 x DP 2 with
//    logits identical bit for bit to the original's, and at TP 1 x DP 4 ZeRO-3
//    equal up to reduction order; exporting the import gives the same bytes;
//  - fp16/bf16 exports are the fp32 values rounded to nearest even;
//  - broken inputs fail with ConfigErrors naming the file, the tensor and the fix.
// The numerical check against an independent GPT-2 forward (numpy, HF's
// formulas) is tests/cli/hf_export_e2e.sh.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "megazero/checkpoint/checkpoint.h"
#include "megazero/checkpoint/safetensors.h"
#include "megazero/comm/consensus.h"
#include "megazero/core/error.h"
#include "test_device.h"
#include "megazero/train/arguments.h"
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

ZeroRunSpec spec_of(int tp, int dp, int stage) {
  ZeroRunSpec s;
  s.tp = tp;
  s.dp = dp;
  s.stage = stage;
  s.steps = 2;
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

// Rank 0 alone: export, check, import, export again.
void convert_on_one_rank(const std::string& dir, Communicator& self) {
  const auto ex = hf::export_checkpoint({dir + "/orig", dir + "/hf"});
  EXPECT_EQ(ex.iteration, 2);
  EXPECT_EQ(ex.tensors, 28);
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
  EXPECT_EQ(train::config_values(b.manifest().state.config).at("num-attention-heads"), "4");
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

TEST(ConvertCheckpoint, Tp2Dp2ExportImportKeepsTheModel) {
  if (world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const std::string dir = shared_temp_dir();
  {
    ZeroRun a(world(), spec_of(2, 2, 2));
    a.train(0, 2);
    save(a, dir + "/orig", 2);
  }
  auto self = world().split(world().rank(), 0, "self");
  if (world().rank() == 0) convert_on_one_rank(dir, *self);
  barrier();
  // Both checkpoints into the same layout (another ZeRO stage): the same logits, bit for bit.
  ZeroRun orig(world(), spec_of(2, 2, 1)), imported(world(), spec_of(2, 2, 1));
  const auto lo = checkpoint::load_checkpoint(dir + "/orig", *orig.engine, place(orig));
  const auto li = checkpoint::load_checkpoint(dir + "/imported", *imported.engine, place(imported));
  EXPECT_TRUE(lo.loaded && li.loaded);
  EXPECT_EQ(li.state.iteration, 0);
  EXPECT_EQ(li.saved_tp, 1);
  const auto x = eval_logits(orig), y = eval_logits(imported);
  ASSERT_EQ(x.size(), y.size());
  EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << "logits differ";
  // At TP 1 x DP 4, ZeRO-3 (another TP, another vocab padding): equal up to reduction order.
  ZeroRun tp1(world(), spec_of(1, 4, 3));
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

// ---------------------------------------------------------------- one rank
namespace {

// A TP 1 checkpoint trained one step and its fp32 export, in a fresh directory.
struct Exported {
  std::string dir;
  std::unique_ptr<ZeroRun> run;
  Exported() : dir(local_temp_dir()) {
    run = std::make_unique<ZeroRun>(world(), spec_of(1, 1, 0));
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

TEST(ConvertCheckpoint, LogitsToolMatchesTheTrainingModel) {
  if (world().size() != 1) GTEST_SKIP() << "one rank";
  Exported e;
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
