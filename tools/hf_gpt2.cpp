#include "tools/hf_gpt2.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "layers/gpt_model.h"
#include "megazero/checkpoint/file_io.h"
#include "megazero/checkpoint/safetensors.h"
#include "megazero/core/error.h"
#include "megazero/train/arguments.h"
#include "megazero/zero/zero_engine.h"
#include "tools/checkpoint_model.h"
#include "tools/hf_llama.h"

namespace megazero::hf {

namespace fs = std::filesystem;
using json = nlohmann::json;
using layers::GPTConfig;
using I = std::int64_t;

namespace {

I numel(const std::vector<I>& s) {
  I n = 1;
  for (I d : s) n *= d;
  return n;
}

// Where our fused QKV output row r goes in HF's c_attn outputs:
// [head][q|k|v][d] (ours, attention.cpp split_heads) -> [q|k|v][head][d] (HF's split(n_embd)).
I qkv_hf_index(I r, const GPTConfig& c) {
  const I hd = c.head_dim();
  const I head = r / (3 * hd), which = (r / hd) % 3, d = r % hd;
  return which * c.hidden_size + head * hd + d;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

I parse_int(const std::string& v, const std::string& key, const std::string& where) {
  try {
    std::size_t used = 0;
    const I x = std::stoll(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw ConfigError("checkpoint '" + where + "': its configuration has " + key + " = '" + v + "', not an integer");
}
double parse_double(const std::string& v, const std::string& key, const std::string& where) {
  try {
    std::size_t used = 0;
    const double x = std::stod(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw ConfigError("checkpoint '" + where + "': its configuration has " + key + " = '" + v + "', not a number");
}

}  // namespace

// ------------------------------------------------------------ tensor map
std::vector<TensorMap> gpt2_tensor_map(const GPTConfig& c, I padded_vocab) {
  const I h = c.hidden_size, f = c.ffn(), V = c.vocab_size;
  std::vector<TensorMap> m;
  m.push_back({"embedding.word.weight", "wte.weight", Transform::VocabRows, {padded_vocab, h}, {V, h}});
  m.push_back({"embedding.position.weight",
               "wpe.weight",
               Transform::Copy,
               {c.max_position_embeddings, h},
               {c.max_position_embeddings, h}});
  for (I l = 0; l < c.num_layers; ++l) {
    const std::string o = "layers." + std::to_string(l) + ".", x = "h." + std::to_string(l) + ".";
    m.push_back({o + "ln1.weight", x + "ln_1.weight", Transform::NormWeight, {h}, {h}});
    m.push_back({o + "ln1.bias", x + "ln_1.bias", Transform::Copy, {h}, {h}});
    m.push_back({o + "attention.qkv.weight", x + "attn.c_attn.weight", Transform::QkvWeight, {3 * h, h}, {h, 3 * h}});
    m.push_back({o + "attention.qkv.bias", x + "attn.c_attn.bias", Transform::QkvBias, {3 * h}, {3 * h}});
    m.push_back({o + "attention.dense.weight", x + "attn.c_proj.weight", Transform::Transpose, {h, h}, {h, h}});
    m.push_back({o + "attention.dense.bias", x + "attn.c_proj.bias", Transform::Copy, {h}, {h}});
    m.push_back({o + "ln2.weight", x + "ln_2.weight", Transform::NormWeight, {h}, {h}});
    m.push_back({o + "ln2.bias", x + "ln_2.bias", Transform::Copy, {h}, {h}});
    m.push_back({o + "mlp.fc1.weight", x + "mlp.c_fc.weight", Transform::Transpose, {f, h}, {h, f}});
    m.push_back({o + "mlp.fc1.bias", x + "mlp.c_fc.bias", Transform::Copy, {f}, {f}});
    m.push_back({o + "mlp.fc2.weight", x + "mlp.c_proj.weight", Transform::Transpose, {h, f}, {f, h}});
    m.push_back({o + "mlp.fc2.bias", x + "mlp.c_proj.bias", Transform::Copy, {h}, {h}});
  }
  m.push_back({"final_ln.weight", "ln_f.weight", Transform::NormWeight, {h}, {h}});
  m.push_back({"final_ln.bias", "ln_f.bias", Transform::Copy, {h}, {h}});
  return m;
}

namespace {
// Calls fn(our_index, hf_index) for every element both layouts hold: the one
// mapping export and import share (import's padding rows are filled apart; a
// part covers only its rows of ours).
template <typename Fn>
void for_each_pair(const TensorMap& m, const GPTConfig& c, Fn&& fn) {
  switch (m.how) {
    case Transform::Copy:
    case Transform::NormWeight:
    case Transform::VocabRows:  // the first V rows; padding rows exist on our side only
      for (I i = 0; i < numel(m.hf_shape); ++i) fn(i, i);
      return;
    case Transform::HeadNorm:
      for (I d = 0; d < m.hf_shape[0]; ++d) fn(llama_head_row(c, d), d);
      return;
    case Transform::QkvBias:
      for (I r = 0; r < m.our_shape[0]; ++r) fn(r, qkv_hf_index(r, c));
      return;
    case Transform::QkvPart:  // HF rows [rows, cols] (cols 1 for a bias) from rows of ours
    case Transform::StackedPart: {
      const I rows = m.hf_shape[0], cols = numel(m.hf_shape) / rows;
      for (I r = 0; r < rows; ++r) {
        const I o = m.how == Transform::QkvPart ? llama_qkv_row(c, m.part, r) : m.part * rows + r;
        for (I i = 0; i < cols; ++i) fn(o * cols + i, r * cols + i);
      }
      return;
    }
    case Transform::Transpose:
    case Transform::QkvWeight: {
      const I out = m.our_shape[0], in = m.our_shape[1];
      for (I o = 0; o < out; ++o) {
        const I col = m.how == Transform::QkvWeight ? qkv_hf_index(o, c) : o;
        for (I i = 0; i < in; ++i) fn(o * in + i, i * out + col);
      }
      return;
    }
  }
}
}  // namespace

namespace {
// --apply-layernorm-1p: what the norm's kernels apply is 1 + the stored
// weight (NormGamma, in the model's fp32 arithmetic: the same rounding here).
// Imports are plain models (Hugging Face's norms store gamma), so only the
// export adds it.
float norm_offset(const TensorMap& m, const GPTConfig& c) {
  return (m.how == Transform::NormWeight || m.how == Transform::HeadNorm) && c.layernorm_1p ? 1.0f : 0.0f;
}
}  // namespace

void to_hf(const TensorMap& m, const GPTConfig& c, const float* ours, float* hf) {
  const float add = norm_offset(m, c);
  for_each_pair(m, c, [&](I o, I h) { hf[h] = ours[o] + add; });
}

void from_hf(const TensorMap& m, const GPTConfig& c, const float* hf, float* ours) {
  if (m.how == Transform::VocabRows)  // padding rows are zero, as at initialisation
    std::fill(ours + numel(m.hf_shape), ours + numel(m.our_shape), 0.0f);
  MZ_CHECK(norm_offset(m, c) == 0, "an import into a zero-centred (--apply-layernorm-1p) model");
  for_each_pair(m, c, [&](I o, I h) { ours[o] = hf[h]; });
}

// ------------------------------------------------------------ configurations
std::string resolved_config(const GPTConfig& cfg, std::uint64_t seed) {
  train::TrainArgs a;  // pretrain_gpt's own printer: the same keys and defaults as its runs store
  a.model = cfg;
  a.seed = seed;
  // Options whose flags are spelled apart from the model's fields (arguments.h).
  a.group_query_attention = cfg.num_query_groups > 0;
  a.num_query_groups = cfg.num_query_groups > 0 ? cfg.num_query_groups : 1;
  a.disable_bias_linear = !cfg.add_bias_linear;
  a.no_bias_gelu_fusion = !cfg.bias_gelu_fusion;
  return a.to_config();
}

namespace {
// A checkpoint's manifest as model_config_of reads it: the resolved
// configuration's values and the saved parameters, each refusal naming it.
class ManifestModel {
 public:
  ManifestModel(const checkpoint::Manifest& m, const std::string& where)
      : kv_(train::config_values(m.state.config)), where_(where) {
    for (const auto& p : m.parameters) by_name_[p.name] = &p;
  }
  bool has(const std::string& n) const { return by_name_.count(n) > 0; }
  // dims 0: any number of dimensions.
  const checkpoint::ParameterInfo& param(const std::string& n, std::size_t dims) const {
    const auto it = by_name_.find(n);
    MZ_REQUIRE(it != by_name_.end(), "checkpoint '", where_, "' has no parameter '", n,
               "': it is not a megazero GPT checkpoint");
    MZ_REQUIRE(dims == 0 || it->second->global_shape.size() == dims, "checkpoint '", where_, "': parameter '", n,
               "' is ", shape_str(it->second->global_shape), ", expected ", dims, " dimensions");
    return *it->second;
  }
  const std::string* value(const char* key) const {
    const auto it = kv_.find(key);
    return it == kv_.end() ? nullptr : &it->second;
  }
  I integer(const char* key) const { return parse_int(*value(key), key, where_); }
  double number(const char* key) const { return parse_double(*value(key), key, where_); }
  bool flag(const char* key) const {
    const std::string& v = *value(key);
    MZ_REQUIRE(v == "true" || v == "false", "checkpoint '", where_, "': its configuration has ", key, " = '", v,
               "', not true or false");
    return v == "true";
  }
  // The configuration must agree with the shapes where it speaks of them.
  void agree(const std::string& said, const std::string& shapes_say) const {
    MZ_REQUIRE(said == shapes_say, "checkpoint '", where_, "': its configuration says ", said,
               " but its parameters say ", shapes_say, "; the manifest does not belong to these shards");
  }
  void agree_int(const char* key, I from_shapes, I default_value = -1) const {
    if (!value(key)) return;
    const I v = integer(key);
    const std::string k = std::string(key) + " = ";
    agree(k + std::to_string(v == 0 && default_value >= 0 ? default_value : v), k + std::to_string(from_shapes));
  }
  const std::string& where() const { return where_; }

 private:
  std::map<std::string, std::string> kv_;
  std::map<std::string, const checkpoint::ParameterInfo*> by_name_;
  std::string where_;
};

// The options the parameters show (position table, LayerNorm bias, stacked
// SwiGLU fc1, linear biases, an output layer): the configuration's value,
// checked against them, or theirs for checkpoints older than the options.
void read_model_options(const ManifestModel& mm, GPTConfig& c) {
  auto option = [&](const char* key, const std::string& yes, const std::string& no, bool shapes_say_yes) {
    const std::string* said = mm.value(key);
    if (!said) return shapes_say_yes ? yes : no;
    mm.agree(std::string(key) + " = " + *said, std::string(key) + " = " + (shapes_say_yes ? yes : no));
    return *said;
  };
  c.position_embedding_type =
      option("position-embedding-type", "rope", "learned_absolute", !mm.has("embedding.position.weight"));
  c.normalization = option("normalization", "RMSNorm", "LayerNorm", !mm.has("layers.0.ln1.bias"));
  const auto& fc1 = mm.param("layers.0.mlp.fc1.weight", 0).global_shape;
  const bool stacked = fc1.size() == 3;
  MZ_REQUIRE(fc1.size() == 2 || (stacked && fc1[0] == 2), "checkpoint '", mm.where(),
             "': parameter 'layers.0.mlp.fc1.weight' is ", shape_str(fc1),
             ", expected [ffn, hidden] or, with --swiglu, [2, ffn, hidden]");
  c.swiglu = option("swiglu", "true", "false", stacked) == "true";
  c.qk_layernorm = option("qk-layernorm", "true", "false", mm.has("layers.0.attention.q_layernorm.weight")) == "true";
  if (const std::string* v = mm.value("apply-layernorm-1p")) c.layernorm_1p = *v == "true";  // not in the shapes
  if (const std::string* v = mm.value("squared-relu")) c.squared_relu = *v == "true";
  if (const std::string* v = mm.value("apply-residual-connection-post-layernorm")) c.residual_post_norm = *v == "true";
  if (const std::string* v = mm.value("rotary-interleaved")) c.rotary_interleaved = *v == "true";  // nor this
  c.add_bias_linear =
      option("disable-bias-linear", "false", "true", mm.has("layers.0.attention.dense.bias")) == "false";
  c.add_qkv_bias =
      option("add-qkv-bias", "true", "false", !c.add_bias_linear && mm.has("layers.0.attention.qkv.bias")) == "true";
  c.untie_embeddings =
      option("untie-embeddings-and-output-weights", "true", "false", mm.has("output_layer.weight")) == "true";
  if (c.untie_embeddings)
    MZ_REQUIRE(mm.param("output_layer.weight", 2).global_shape == mm.param("embedding.word.weight", 2).global_shape,
               "checkpoint '", mm.where(), "': output_layer.weight and embedding.word.weight differ in shape");
  GPTConfig dflt = c;  // the MLP width the flags give when --ffn-hidden-size is not set
  dflt.ffn_hidden_size = 0;
  const I ffn = fc1[stacked ? 1 : 0];
  c.ffn_hidden_size = ffn == dflt.ffn() ? 0 : ffn;
  mm.agree_int("ffn-hidden-size", c.ffn(), dflt.ffn());
}

// Query groups, from the QKV rows: (heads + 2 x groups) x head_dim (the head
// count known); the configuration's, if it has them, must agree.
void read_query_groups(const ManifestModel& mm, GPTConfig& c) {
  if (c.hidden_size % c.num_attention_heads != 0) return;  // validate() says so
  const I H = c.num_attention_heads, hd = c.head_dim();
  const I rows = mm.param("layers.0.attention.qkv.weight", 2).global_shape[0], units = rows / hd - H;
  MZ_REQUIRE(rows % hd == 0 && units > 0 && units % 2 == 0, "checkpoint '", mm.where(),
             "': layers.0.attention.qkv.weight has ", rows, " rows, not (heads + 2 x query groups) x head size ", hd,
             " for ", H, " heads; is the head count right?");
  const I groups = units / 2;
  if (mm.value("group-query-attention")) {
    const I said =
        mm.flag("group-query-attention") && mm.value("num-query-groups") ? mm.integer("num-query-groups") : H;
    MZ_REQUIRE(said == groups, "checkpoint '", mm.where(), "': its configuration says ", said,
               " query groups (group-query-attention, num-query-groups) but layers.0.attention.qkv.weight's rows say ",
               groups, "; the manifest does not belong to these shards");
  }
  c.num_query_groups = groups == H ? 0 : groups;
}
}  // namespace

GPTConfig model_config_of(const checkpoint::Manifest& m, const std::string& where, I heads) {
  const ManifestModel mm(m, where);
  const auto& word = mm.param("embedding.word.weight", 2);
  GPTConfig c;
  c.hidden_size = word.global_shape[1];
  c.vocab_size = word.padding_from_row >= 0 ? word.padding_from_row : word.global_shape[0];
  c.num_layers = 0;
  while (mm.has("layers." + std::to_string(c.num_layers) + ".ln1.weight")) ++c.num_layers;
  MZ_REQUIRE(c.num_layers > 0, "checkpoint '", where, "' has no transformer layers (layers.0.*)");
  read_model_options(mm, c);
  if (!c.rope()) {  // rotary embeddings have no table: the configuration's value stands
    c.max_position_embeddings = mm.param("embedding.position.weight", 2).global_shape[0];
    mm.agree_int("max-position-embeddings", c.max_position_embeddings);
  } else if (mm.value("max-position-embeddings")) {
    c.max_position_embeddings = mm.integer("max-position-embeddings");
  }
  mm.agree_int("num-layers", c.num_layers);
  mm.agree_int("hidden-size", c.hidden_size);
  mm.agree_int("vocab-size", c.vocab_size);

  // The head count is invisible in the shapes ([3h, h] for any head count).
  const bool said = mm.value("num-attention-heads") != nullptr;
  if (said) c.num_attention_heads = mm.integer("num-attention-heads");
  if (heads > 0) {
    MZ_REQUIRE(!said || c.num_attention_heads == heads, "--num-attention-heads ", heads, " contradicts checkpoint '",
               where, "', whose configuration says ", c.num_attention_heads, "; drop the flag");
    c.num_attention_heads = heads;
  }
  MZ_REQUIRE(said || heads > 0, "checkpoint '", where,
             "': its configuration does not say num-attention-heads, and the head count cannot be read from the "
             "weights; pass --num-attention-heads N (the value the run was trained with)");
  read_query_groups(mm, c);
  auto num = [&](const char* key, double& field) {
    if (mm.value(key)) field = mm.number(key);
  };
  auto integer = [&](const char* key, I& field) {
    if (mm.value(key)) field = mm.integer(key);
  };
  num("hidden-dropout", c.hidden_dropout);
  num("attention-dropout", c.attention_dropout);
  num("init-method-std", c.init_method_std);
  num("norm-epsilon", c.layernorm_epsilon);
  num("rotary-base", c.rotary_base);
  num("rotary-seq-len-interpolation-factor", c.rotary_interpolation_factor);
  if (const std::string* v = mm.value("use-rope-scaling")) c.use_rope_scaling = *v == "true";
  num("rope-scaling-factor", c.rope_scaling_factor);
  integer("make-vocab-size-divisible-by", c.make_vocab_size_divisible_by);
  integer("seq-length", c.seq_length);
  c.seq_length = std::min(c.seq_length, c.max_position_embeddings);
  try {
    c.validate(1);
  } catch (const ConfigError& e) {
    throw ConfigError("checkpoint '" + where + "': " + e.what());
  }
  return c;
}

HfFormat hf_format_of(const GPTConfig& c, const std::string& where) {
  MZ_REQUIRE(!c.squared_relu, "checkpoint '", where,
             "' has a squared-ReLU MLP (--squared-relu), which neither GPT2LMHeadModel nor LlamaForCausalLM computes: "
             "it has no Hugging Face form here");
  MZ_REQUIRE(!c.residual_post_norm, "checkpoint '", where,
             "' adds each sub-block's output to its norm's output (--apply-residual-connection-post-layernorm), "
             "which neither GPT2LMHeadModel nor LlamaForCausalLM computes: it has no Hugging Face form here");
  const bool rope = c.rope(), rms = c.rmsnorm(), gqa = c.query_groups() != c.num_attention_heads;
  // --qk-layernorm: Qwen3ForCausalLM (a Llama with q and k RMS-normalised per
  // head before rope), whose MLP has no biases.
  MZ_REQUIRE(!c.qk_layernorm || (rope && rms && c.swiglu && !c.qkv_bias()), "checkpoint '", where,
             "' normalises q and k per head (--qk-layernorm): its Hugging Face form is Qwen3ForCausalLM, a Llama "
             "with q/k RMSNorms and no linear biases, which would need ",
             detail::concat(rope ? "" : "--position-embedding-type rope, ", rms ? "" : "--normalization RMSNorm, ",
                            c.swiglu ? "" : "--swiglu, ", c.add_bias_linear ? "--disable-bias-linear, " : "",
                            !c.add_bias_linear && c.add_qkv_bias ? "no --add-qkv-bias, " : ""),
             "so it has no Hugging Face form here");
  MZ_REQUIRE(!c.use_rope_scaling || c.rotary_interpolation_factor == 1, "checkpoint '", where,
             "' scales rope both ways (--use-rope-scaling and --rotary-seq-len-interpolation-factor); Hugging "
             "Face's rope_scaling holds one kind: it has no Hugging Face form here");
  // --add-qkv-bias alone: Qwen2ForCausalLM (a Llama with q/k/v biases only); GPT-2 has every bias anyway.
  if (!rope && !rms && !c.swiglu && !gqa && c.add_bias_linear && !c.untie_embeddings) return HfFormat::Gpt2;
  if (rope && rms && c.swiglu) return HfFormat::Llama;
  std::string gpt2, llama;  // what each would need changed
  auto need = [](std::string& list, bool wrong, const char* what) {
    if (wrong) list += (list.empty() ? "" : ", ") + std::string(what);
  };
  need(gpt2, rope, "learned positions (not --position-embedding-type rope)");
  need(gpt2, rms, "LayerNorm (not --normalization RMSNorm)");
  need(gpt2, c.swiglu, "a GeLU MLP (not --swiglu)");
  need(gpt2, gqa, "one key/value head per query head (not --group-query-attention)");
  need(gpt2, !c.add_bias_linear, "linear biases (not --disable-bias-linear)");
  need(gpt2, c.untie_embeddings, "tied embeddings (not --untie-embeddings-and-output-weights)");
  need(llama, !rope, "--position-embedding-type rope");
  need(llama, !rms, "--normalization RMSNorm");
  need(llama, !c.swiglu, "--swiglu");
  throw ConfigError("checkpoint '" + where +
                    "' is neither a GPT-2 nor a Llama, so no Hugging Face model computes it: GPT2LMHeadModel would "
                    "need " +
                    gpt2 + "; LlamaForCausalLM would need " + llama +
                    " (grouped-query attention, biases and an untied output layer are optional there)");
}

std::string gpt2_config_json(const GPTConfig& c, DType dtype) {
  const I eod = c.vocab_size - 1;  // GPT-2 BPE: 50256; ByteLevel: 256 (megazero/data/gpt2_tokenizer.h)
  json j = {
      {"activation_function", "gelu_new"},  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as ours
      {"architectures", {"GPT2LMHeadModel"}},
      {"attn_pdrop", c.attention_dropout},
      {"bos_token_id", eod},
      {"embd_pdrop", c.hidden_dropout},  // one --hidden-dropout for embeddings and residuals
      {"eos_token_id", eod},
      {"initializer_range", c.init_method_std},
      {"layer_norm_epsilon", c.layernorm_epsilon},
      {"model_type", "gpt2"},
      {"n_ctx", c.max_position_embeddings},
      {"n_embd", c.hidden_size},
      {"n_head", c.num_attention_heads},
      {"n_inner", c.ffn()},
      {"n_layer", c.num_layers},
      {"n_positions", c.max_position_embeddings},
      {"reorder_and_upcast_attn", false},
      {"resid_pdrop", c.hidden_dropout},
      {"scale_attn_by_inverse_layer_idx", false},
      {"scale_attn_weights", true},
      {"tie_word_embeddings", true},
      {"torch_dtype", dtype == DType::F16    ? "float16"
                      : dtype == DType::BF16 ? "bfloat16"
                                             : "float32"},
      {"use_cache", true},
      {"vocab_size", c.vocab_size},
      // What HF has no field for, so that import restores the run's settings.
      {"megazero", {{"seq_length", c.seq_length}, {"make_vocab_size_divisible_by", c.make_vocab_size_divisible_by}}}};
  return j.dump(2) + "\n";
}

std::unique_ptr<checkpoint::CheckpointReader> open_checkpoint(const std::string& load) {
  MZ_REQUIRE(!load.empty(), "--load is required: a pretrain_gpt --save directory or one of its iter_* directories");
  std::vector<std::string> rejected;
  auto reader = checkpoint::open_newest_usable(load, &rejected);
  for (const auto& r : rejected)
    std::fprintf(stderr, "convert_checkpoint: WARNING: skipped unusable checkpoint %s\n", r.c_str());
  return reader;
}

// ------------------------------------------------------------ export
ExportResult export_checkpoint(const ExportOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  MZ_REQUIRE(!o.output.empty(), "--output is required: the directory to write model.safetensors and config.json");
  MZ_REQUIRE(o.dtype == DType::F32 || o.dtype == DType::F16 || o.dtype == DType::BF16,
             "--dtype must be fp32, fp16 or bf16, got ", dtype_name(o.dtype));
  MZ_REQUIRE(o.vocab_file.empty() == o.merge_file.empty(),
             "--vocab-file and --merge-file go together (GPT-2's "
             "encoder.json and vocab.bpe): pass both, or neither for an export without tokenizer files");
  std::string vocab, merges;
  if (!o.vocab_file.empty()) {
    vocab = checkpoint::read_small_file(o.vocab_file);
    merges = checkpoint::read_small_file(o.merge_file);
    try {
      const auto j = nlohmann::json::parse(vocab);
      MZ_REQUIRE(j.is_object() && !j.empty(), "--vocab-file ", o.vocab_file, ": not a JSON object of token -> id");
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError("--vocab-file " + o.vocab_file + ": not JSON (" + e.what() + "); pass GPT-2's encoder.json");
    }
    MZ_REQUIRE(merges.rfind("#version", 0) == 0 || merges.find(' ') != std::string::npos, "--merge-file ", o.merge_file,
               ": not a BPE merges file (lines \"a b\"); pass GPT-2's vocab.bpe");
  }
  ExportResult r;
  const auto opened = open_checkpoint(o.load);
  checkpoint::CheckpointReader& reader = *opened;
  r.checkpoint = reader.dir();
  const auto& m = reader.manifest();
  r.model = model_config_of(m, r.checkpoint, o.num_attention_heads);
  r.iteration = m.state.iteration;
  std::map<std::string, const checkpoint::ParameterInfo*> saved;
  for (const auto& p : m.parameters) saved[p.name] = &p;
  r.format = hf_format_of(r.model, r.checkpoint);
  const bool llama = r.format == HfFormat::Llama;
  const I padded = saved.at("embedding.word.weight")->global_shape[0];
  const auto maps = llama ? llama_tensor_map(r.model, padded) : gpt2_tensor_map(r.model, padded);
  std::set<std::string> covered;
  for (const auto& t : maps) covered.insert(t.ours);
  MZ_REQUIRE(covered.size() == m.parameters.size(), "checkpoint '", r.checkpoint, "' holds ", m.parameters.size(),
             " parameters but a ", llama ? "Llama" : "GPT-2", " of ", r.model.num_layers, " layers has ",
             covered.size(), "; it is not a megazero GPT checkpoint this tool knows");

  std::vector<std::vector<std::byte>> storage;  // the writer copies from these when it writes
  storage.reserve(maps.size());
  checkpoint::SafetensorsWriter w;
  w.set_metadata("format", "pt");  // transformers refuses safetensors without it
  std::string last;                // q, k and v (gate and up) come from one tensor of ours: read once
  std::vector<float> ours;
  for (const auto& t : maps) {
    const auto it = saved.find(t.ours);
    MZ_REQUIRE(it != saved.end(), "checkpoint '", r.checkpoint, "' has no parameter '", t.ours, "'");
    MZ_REQUIRE(it->second->global_shape == t.our_shape, "checkpoint '", r.checkpoint, "': parameter '", t.ours, "' is ",
               shape_str(it->second->global_shape), ", expected ", shape_str(t.our_shape));
    if (t.ours != last) ours = reader.global_tensor(t.ours, "master");
    last = t.ours;
    std::vector<float> hf(static_cast<std::size_t>(numel(t.hf_shape)));
    to_hf(t, r.model, ours.data(), hf.data());
    if (o.dtype == DType::F16) {
      const auto big = std::find_if(hf.begin(), hf.end(), [](float v) { return std::fabs(v) > 65504.0f; });
      MZ_REQUIRE(big == hf.end(), "parameter '", t.ours, "' holds ", *big,
                 ", beyond fp16's range (65504); export with --dtype bf16 or fp32");
    }
    storage.emplace_back(hf.size() * dtype_size(o.dtype));
    convert(hf.data(), DType::F32, storage.back().data(), o.dtype, hf.size());
    w.add(t.hf, o.dtype, t.hf_shape, storage.back().data());
  }
  std::error_code ec;
  fs::create_directories(o.output, ec);
  MZ_REQUIRE(!ec, "--output ", o.output, ": cannot create the directory: ", ec.message());
  // Written under a temporary name and renamed: never a half-written model.safetensors.
  const fs::path final_path = fs::path(o.output) / "model.safetensors",
                 tmp = fs::path(o.output) / ".model.safetensors.tmp";
  w.write(tmp.string());
  fs::rename(tmp, final_path, ec);
  MZ_REQUIRE(!ec, "--output ", o.output, ": cannot rename '", tmp.string(), "': ", ec.message());
  checkpoint::write_file_atomically((fs::path(o.output) / "config.json").string(),
                                    llama ? llama_config_json(r.model, o.dtype) : gpt2_config_json(r.model, o.dtype));
  if (!vocab.empty()) {
    checkpoint::write_file_atomically((fs::path(o.output) / "vocab.json").string(), vocab);
    checkpoint::write_file_atomically((fs::path(o.output) / "merges.txt").string(), merges);
    const nlohmann::json tc = {{"tokenizer_class", "GPT2Tokenizer"},
                               {"model_max_length", r.model.max_position_embeddings},
                               {"bos_token", "<|endoftext|>"},
                               {"eos_token", "<|endoftext|>"},
                               {"unk_token", "<|endoftext|>"}};
    checkpoint::write_file_atomically((fs::path(o.output) / "tokenizer_config.json").string(), tc.dump(2) + "\n");
    r.tokenizer = true;
  }
  r.safetensors = final_path.string();
  r.tensors = static_cast<I>(maps.size());
  r.bytes = fs::file_size(final_path);
  r.seconds = seconds_since(t0);
  return r;
}

// ------------------------------------------------------------ import
std::int64_t JsonFields::integer(const char* k, std::optional<std::int64_t> dflt) const {
  if (!has(k)) {
    MZ_REQUIRE(dflt.has_value(), "'", path_, "' lacks \"", k, "\"; ", kind_, " needs it");
    return *dflt;
  }
  MZ_REQUIRE(j_[k].is_number_integer(), "'", path_, "': \"", k, "\" must be an integer, got ", j_[k].dump());
  return j_[k].get<I>();
}
double JsonFields::number(const char* k, double dflt) const {
  if (!has(k)) return dflt;
  MZ_REQUIRE(j_[k].is_number(), "'", path_, "': \"", k, "\" must be a number, got ", j_[k].dump());
  return j_[k].get<double>();
}
bool JsonFields::flag(const char* k, bool dflt) const {
  if (!has(k)) return dflt;
  MZ_REQUIRE(j_[k].is_boolean(), "'", path_, "': \"", k, "\" must be true or false, got ", j_[k].dump());
  return j_[k].get<bool>();
}
std::string JsonFields::text(const char* k, const std::string& dflt) const {
  if (!has(k)) return dflt;
  MZ_REQUIRE(j_[k].is_string(), "'", path_, "': \"", k, "\" must be a string, got ", j_[k].dump());
  return j_[k].get<std::string>();
}
void JsonFields::megazero_block(GPTConfig& c) const {
  if (!has("megazero") || !j_["megazero"].is_object()) return;
  const auto& mz = j_["megazero"];
  if (mz.contains("seq_length") && mz["seq_length"].is_number_integer()) c.seq_length = mz["seq_length"].get<I>();
  if (mz.contains("make_vocab_size_divisible_by") && mz["make_vocab_size_divisible_by"].is_number_integer())
    c.make_vocab_size_divisible_by = mz["make_vocab_size_divisible_by"].get<I>();
  if (mz.contains("hidden_dropout") && mz["hidden_dropout"].is_number())
    c.hidden_dropout = mz["hidden_dropout"].get<double>();
}

std::vector<float> read_floats(const checkpoint::SafetensorsFile& f, const checkpoint::TensorEntry& e) {
  const auto n = static_cast<std::size_t>(numel(e.shape));
  std::vector<std::byte> raw(e.end - e.begin);  // aligned copy: offsets in foreign files need not be
  std::memcpy(raw.data(), f.data(e), raw.size());
  std::vector<float> out(n);
  convert(raw.data(), e.dtype, out.data(), DType::F32, n);
  return out;
}

I layer_of(const std::string& name, const std::string& stem) {
  if (name.rfind(stem, 0) != 0) return -1;
  const auto dot = name.find('.', stem.size());
  if (dot == std::string::npos || dot == stem.size()) return -1;
  const std::string digits = name.substr(stem.size(), dot - stem.size());
  if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) return -1;
  return std::stoll(digits);
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

namespace {

// GPT2Config fields (config.json) into a GPTConfig; refuses what our model
// cannot compute the same way. Returns tie_word_embeddings.
bool read_gpt2_config(const JsonFields& j, GPTConfig& c, ImportResult& r) {
  const std::string& path = j.path();
  const std::string act = j.text("activation_function", "gelu_new");
  MZ_REQUIRE(act == "gelu_new" || act == "gelu_pytorch_tanh", "'", path, "': activation_function '", act,
             "' is not supported: megazero's MLP computes the tanh GeLU (gelu_new)");
  MZ_REQUIRE(j.flag("scale_attn_weights", true), "'", path,
             "': scale_attn_weights false is not supported (megazero scales scores by 1/sqrt(head_dim))");
  MZ_REQUIRE(!j.flag("scale_attn_by_inverse_layer_idx", false), "'", path,
             "': scale_attn_by_inverse_layer_idx true is not supported");
  MZ_REQUIRE(!j.flag("add_cross_attention", false), "'", path, "': cross-attention GPT-2 models are not supported");
  c.layernorm_epsilon = j.number("layer_norm_epsilon", 1e-5);  // --norm-epsilon
  c.num_layers = j.integer("n_layer", std::nullopt);
  c.hidden_size = j.integer("n_embd", std::nullopt);
  c.num_attention_heads = j.integer("n_head", std::nullopt);
  c.vocab_size = j.integer("vocab_size", std::nullopt);
  c.max_position_embeddings =
      j.integer("n_positions", j.has("n_ctx") ? std::optional<I>(j.integer("n_ctx", 0)) : std::nullopt);
  c.ffn_hidden_size = j.integer("n_inner", 0);
  c.hidden_dropout = j.number("resid_pdrop", 0.1);
  c.attention_dropout = j.number("attn_pdrop", 0.1);
  c.init_method_std = j.number("initializer_range", 0.02);
  const double embd = j.number("embd_pdrop", 0.1);
  if (embd != c.hidden_dropout)
    r.notes.push_back("embd_pdrop " + std::to_string(embd) +
                      " differs from resid_pdrop; megazero's one --hidden-dropout (" +
                      std::to_string(c.hidden_dropout) + ") applies to both");
  c.seq_length = c.max_position_embeddings;
  j.megazero_block(c);
  return j.flag("tie_word_embeddings", true);  // false: accepted only if lm_head.weight equals wte.weight
}

// Without config.json the shapes give everything but the head count.
void read_gpt2_shapes(const checkpoint::SafetensorsFile& f, const std::string& prefix, const ImportOptions& o,
                      const ImportResult& r, GPTConfig& c) {
  auto entry = [&](const std::string& n) -> const checkpoint::TensorEntry& {
    MZ_REQUIRE(f.has(prefix + n), "'", r.safetensors, "' has no tensor '", prefix + n,
               "', which every GPT-2 has; is it a GPT-2 (GPT2LMHeadModel) model.safetensors?");
    return f.entry(prefix + n);
  };
  const auto& wte = entry("wte.weight");
  const auto& wpe = entry("wpe.weight");
  MZ_REQUIRE(wte.shape.size() == 2 && wpe.shape.size() == 2, "'", r.safetensors,
             "': wte.weight and wpe.weight must be 2-D");
  c.vocab_size = wte.shape[0];
  c.hidden_size = wte.shape[1];
  c.max_position_embeddings = c.seq_length = wpe.shape[0];
  c.num_layers = 0;
  for (const auto& [name, e] : f.tensors()) c.num_layers = std::max(c.num_layers, layer_of(name, prefix + "h.") + 1);
  MZ_REQUIRE(c.num_layers > 0, "'", r.safetensors, "' has no transformer blocks (h.0.*)");
  const auto& fc = entry("h.0.mlp.c_fc.weight");
  MZ_REQUIRE(fc.shape.size() == 2, "'", r.safetensors, "': h.0.mlp.c_fc.weight must be 2-D");
  c.ffn_hidden_size = fc.shape[1] == 4 * c.hidden_size ? 0 : fc.shape[1];
  MZ_REQUIRE(o.num_attention_heads > 0, "'", r.safetensors,
             "' comes without a config.json beside it and the head count cannot be read from the weights; pass "
             "--num-attention-heads N (GPT-2 small: 12, medium: 16, large: 20, xl: 25) or add the config.json");
}

ImportPlan plan_gpt2_import(const checkpoint::SafetensorsFile& f, const json* config, const ImportOptions& o,
                            ImportResult& r) {
  ImportPlan p;
  // save_pretrained of GPT2LMHeadModel prefixes "transformer."; the hub's files do not.
  p.prefix = !f.has("wte.weight") && f.has("transformer.wte.weight") ? "transformer." : "";
  if (config)
    p.tied = read_gpt2_config(JsonFields(*config, r.config, "a GPT2Config"), p.model, r);
  else
    read_gpt2_shapes(f, p.prefix, o, r, p.model);
  return p;
}

// A tensor of a GPT-2 file that no TensorMap uses: the causal-mask buffers of
// older transformers and a tied lm_head are skipped; other block tensors refused.
void check_gpt2_extra(const ImportPlan& p, const checkpoint::SafetensorsFile& f, const std::string& name,
                      const ImportResult& r) {
  const std::string n = name.rfind(p.prefix, 0) == 0 ? name.substr(p.prefix.size()) : name;
  const I block = layer_of(n, "h.");
  MZ_REQUIRE(block < p.model.num_layers, "'", r.safetensors, "' holds '", name, "' but the model has n_layer ",
             p.model.num_layers,
             (r.config.empty() ? std::string() : "; does '" + r.config + "' belong to these weights?"));
  if (block >= 0) {
    MZ_REQUIRE(ends_with(n, ".attn.bias") || ends_with(n, ".attn.masked_bias"), "'", r.safetensors, "': tensor '", name,
               "' is not part of a GPT-2 block megazero knows; it cannot be imported");
  } else if (name == "lm_head.weight") {
    const auto& wte = f.entry(p.prefix + "wte.weight");
    MZ_REQUIRE(f.entry(name).shape == wte.shape && read_floats(f, f.entry(name)) == read_floats(f, wte), "'",
               r.safetensors,
               "': lm_head.weight differs from wte.weight; megazero ties the output layer to the word embedding, "
               "so an untied model cannot be imported");
  }
}

// The model of an HF file: Llama for config.json's model_type llama or qwen3
// (without one: for the tensor model.embed_tokens.weight), else GPT-2.
ImportPlan plan_import(const checkpoint::SafetensorsFile& f, const json* config, const ImportOptions& o,
                       ImportResult& r) {
  bool llama = f.has("model.embed_tokens.weight");
  if (config) {
    const std::string type = JsonFields(*config, r.config, "a config.json").text("model_type", "gpt2");
    MZ_REQUIRE(type == "gpt2" || type == "llama" || type == "qwen2" || type == "qwen3", "'", r.config,
               "' describes a '", type,
               "' model; convert_checkpoint imports GPT-2 (model_type gpt2), Llama (model_type llama), Qwen2 "
               "(model_type qwen2) and Qwen3 (model_type qwen3)");
    llama = type != "gpt2";
  }
  ImportPlan p = llama ? plan_llama_import(f, config, o, r) : plan_gpt2_import(f, config, o, r);
  p.format = llama ? HfFormat::Llama : HfFormat::Gpt2;
  GPTConfig& c = p.model;
  if (o.num_attention_heads > 0) {
    MZ_REQUIRE(r.config.empty() || c.num_attention_heads == o.num_attention_heads, "--num-attention-heads ",
               o.num_attention_heads, " contradicts '", r.config, "' (", llama ? "num_attention_heads " : "n_head ",
               c.num_attention_heads, "); drop the flag");
    c.num_attention_heads = o.num_attention_heads;
  }
  if (o.seq_length > 0) c.seq_length = o.seq_length;
  if (o.make_vocab_size_divisible_by > 0) c.make_vocab_size_divisible_by = o.make_vocab_size_divisible_by;
  c.seq_length = o.seq_length > 0 ? c.seq_length : std::min(c.seq_length, c.max_position_embeddings);
  try {
    c.validate(1);
  } catch (const ConfigError& e) {
    throw ConfigError("importing '" + r.safetensors + "': " + e.what());
  }
  return p;
}

// The HF fields a tensor's expected shape follows from, for messages.
std::string shape_fields(const ImportPlan& p) {
  const GPTConfig& c = p.model;
  if (p.format == HfFormat::Gpt2)
    return detail::concat("n_embd ", c.hidden_size, ", n_inner ", c.ffn(), ", vocab_size ", c.vocab_size,
                          ", n_positions ", c.max_position_embeddings);
  return detail::concat("hidden_size ", c.hidden_size, ", intermediate_size ", c.ffn(), ", num_attention_heads ",
                        c.num_attention_heads, ", num_key_value_heads ", c.query_groups(), ", vocab_size ",
                        c.vocab_size);
}

// Every tensor the maps need is in the file, with its shape and a float
// dtype; everything else may be skipped (listed in r.ignored) or is refused.
void check_file(const ImportPlan& p, const std::vector<TensorMap>& maps, const checkpoint::SafetensorsFile& f,
                ImportResult& r) {
  const GPTConfig& c = p.model;
  const bool llama = p.format == HfFormat::Llama;
  const char* b = c.add_bias_linear ? "true" : "false";
  const std::string needs =
      llama ? detail::concat("a Llama of num_hidden_layers ", c.num_layers, " (attention_bias ", b, ", mlp_bias ", b,
                             ", tie_word_embeddings ", p.tied ? "true" : "false", ") needs")
            : detail::concat("a GPT-2 of n_layer ", c.num_layers, " needs");
  const std::string kind = llama ? "Llama (LlamaForCausalLM)" : "GPT-2 (GPT2LMHeadModel)";
  const std::string cfg = r.config.empty() ? std::string() : "; does '" + r.config + "' belong to these weights?";
  std::set<std::string> used;
  for (const auto& t : maps) {
    const std::string name = p.prefix + t.hf;
    MZ_REQUIRE(f.has(name), "'", r.safetensors, "' has no tensor '", name, "', which ", needs, "; is it a ", kind,
               " model.safetensors?");
    const auto& e = f.entry(name);
    MZ_REQUIRE(e.shape == t.hf_shape, "'", r.safetensors, "': tensor '", name, "' is ", shape_str(e.shape),
               ", expected ", shape_str(t.hf_shape), " for ", shape_fields(p), cfg);
    MZ_REQUIRE(e.dtype == DType::F32 || e.dtype == DType::F16 || e.dtype == DType::BF16 || e.dtype == DType::F64, "'",
               r.safetensors, "': tensor '", name, "' has dtype ", checkpoint::safetensors_dtype(e.dtype),
               "; only F32, F16, BF16 and F64 weights can be imported");
    used.insert(name);
  }
  for (const auto& [name, e] : f.tensors()) {
    if (used.count(name)) continue;
    if (llama)
      check_llama_extra(p, f, name, r);
    else
      check_gpt2_extra(p, f, name, r);
    r.ignored.push_back(name);
  }
  const bool lm_head = std::count(r.ignored.begin(), r.ignored.end(), "lm_head.weight") > 0;
  MZ_REQUIRE(llama || p.tied || lm_head, "'", r.config,
             "' says tie_word_embeddings false but the file has no lm_head.weight; megazero ties the output layer to "
             "the word embedding");
}

}  // namespace

ImportResult import_checkpoint(const ImportOptions& o, Communicator& self) {
  const auto t0 = std::chrono::steady_clock::now();
  MZ_REQUIRE(!o.input.empty(), "--input is required: a Hugging Face GPT-2 or Llama directory or its model.safetensors");
  MZ_REQUIRE(!o.save.empty(), "--save is required: the directory of the megazero checkpoint to write");
  ImportResult r;
  std::error_code ec;
  const fs::path in(o.input);
  fs::path file = in, cfg_path;
  if (fs::is_directory(in, ec)) {
    file = in / "model.safetensors";
    MZ_REQUIRE(!fs::exists(in / "model.safetensors.index.json", ec) || fs::exists(file, ec), "--input ", o.input,
               " holds a sharded model (model.safetensors.index.json), which is not supported; save it as one file "
               "(save_pretrained(..., max_shard_size=\"100GB\"))");
    MZ_REQUIRE(fs::exists(file, ec), "--input ", o.input, " holds no model.safetensors");
    cfg_path = in / "config.json";
  } else {
    MZ_REQUIRE(fs::exists(in, ec), "--input ", o.input, " does not exist");
    cfg_path = in.parent_path() / "config.json";
  }
  r.safetensors = file.string();
  const std::string existing = checkpoint::find_latest(o.save);
  MZ_REQUIRE(existing.empty(), "--save ", o.save, " already holds checkpoint ", existing,
             "; import into an empty directory (pretrain_gpt --load resumes from the newest one)");
  checkpoint::SafetensorsFile f(r.safetensors);
  std::optional<json> config;
  if (fs::exists(cfg_path, ec)) {
    r.config = cfg_path.string();
    try {
      config = json::parse(checkpoint::read_small_file(r.config));
    } catch (const json::exception& e) {
      throw ConfigError("'" + r.config + "' is not valid JSON: " + e.what());
    }
    MZ_REQUIRE(config->is_object(), "'", r.config, "' is not a JSON object");
  }
  const ImportPlan p = plan_import(f, config ? &*config : nullptr, o, r);
  const GPTConfig& c = p.model;
  r.format = p.format;
  r.model = c;
  const auto maps =
      p.format == HfFormat::Llama ? llama_tensor_map(c, c.padded_vocab(1)) : gpt2_tensor_map(c, c.padded_vocab(1));
  check_file(p, maps, f, r);  // everything checked before any work

  std::map<std::string, std::vector<const TensorMap*>> parts;  // our name -> the HF tensors it is made of
  for (const auto& t : maps) parts[t.ours].push_back(&t);
  Tp1Model m(c, self, o.device);
  const auto& params = m.engine->parameters();
  MZ_CHECK(params.size() == parts.size(), "tensor map and model disagree");
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto it = parts.find(params[i]->name);
    MZ_CHECK(it != parts.end(), "tensor map out of date: no HF tensor for ", params[i]->name);
    std::vector<float> ours(static_cast<std::size_t>(params[i]->local_numel()), 0.0f);  // padding rows stay 0
    for (const TensorMap* t : it->second) {
      MZ_CHECK(params[i]->global_shape == t->our_shape, "tensor map out of date: ", params[i]->name);
      const auto hf = read_floats(f, f.entry(p.prefix + t->hf));
      from_hf(*t, c, hf.data(), ours.data());
    }
    m.set_master(i, ours);
  }
  m.engine->load_finished();
  checkpoint::TrainState st;  // iteration 0, no data consumed, Adam moments zero: a fresh fine-tuning start
  st.seed = o.seed;
  st.config = resolved_config(c, o.seed);
  r.checkpoint = checkpoint::save_checkpoint(o.save, st, *m.engine, {&self, 0, 1}).path;
  r.seconds = seconds_since(t0);
  return r;
}

// ------------------------------------------------------------ logits
}  // namespace megazero::hf
