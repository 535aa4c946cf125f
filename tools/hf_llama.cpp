#include "tools/hf_llama.h"

#include <algorithm>

#include "megazero/core/error.h"
#include "megazero/kernels/rope_frequencies.h"

namespace megazero::hf {

using json = nlohmann::json;
using layers::GPTConfig;
using I = std::int64_t;

// ------------------------------------------------------------ tensor map
I llama_head_row(const GPTConfig& c, I d) {
  const I hd = c.head_dim();
  return c.rotary_interleaved ? (d < hd / 2 ? 2 * d : 2 * (d - hd / 2) + 1) : d;
}

I llama_qkv_row(const GPTConfig& c, int part, I row) {
  const I hd = c.head_dim(), per_group = c.num_attention_heads / c.query_groups();
  I d = row % hd;
  // --rotary-interleaved: Hugging Face's rotate-half row d of a query or key
  // head is our interleaved row 2d (first half) or 2(d - hd/2) + 1 (second):
  // the same permutation of q and k leaves every score, and rope, as they were.
  if (part < 2) d = llama_head_row(c, d);
  if (part == 0) {  // query head n is head n % per_group of group n / per_group
    const I head = row / hd;
    return ((head / per_group) * (per_group + 2) + head % per_group) * hd + d;
  }
  return ((row / hd) * (per_group + 2) + per_group + part - 1) * hd + d;  // k, v of group row / hd
}

std::vector<TensorMap> llama_tensor_map(const GPTConfig& c, I padded_vocab) {
  const I h = c.hidden_size, f = c.ffn(), V = c.vocab_size, hd = c.head_dim();
  const I H = c.num_attention_heads, G = c.query_groups(), qkv = (H + 2 * G) * hd;
  const I part_rows[3] = {H * hd, G * hd, G * hd};
  const char* qkv_names[3] = {"q_proj", "k_proj", "v_proj"};
  const char* mlp_names[2] = {"gate_proj", "up_proj"};
  std::vector<TensorMap> m;
  m.push_back({"embedding.word.weight", "model.embed_tokens.weight", Transform::VocabRows, {padded_vocab, h}, {V, h}});
  for (I l = 0; l < c.num_layers; ++l) {
    const std::string o = "layers." + std::to_string(l) + ".", x = "model.layers." + std::to_string(l) + ".";
    m.push_back({o + "ln1.weight", x + "input_layernorm.weight", Transform::NormWeight, {h}, {h}});
    // The parts of one tensor of ours stay together: export reads it once.
    for (const char* w : {"weight", "bias"}) {
      if (std::string(w) == "bias" && !c.qkv_bias()) continue;
      const bool weight = std::string(w) == "weight";
      for (int p = 0; p < 3; ++p) {
        std::vector<I> ours = {qkv}, hf = {part_rows[p]};
        if (weight) ours.push_back(h), hf.push_back(h);
        m.push_back(
            {o + "attention.qkv." + w, x + "self_attn." + qkv_names[p] + "." + w, Transform::QkvPart, ours, hf, p});
      }
    }
    if (c.qk_layernorm)  // Qwen3: q and k RMS-normalised per head, before rope
      for (const char* qk : {"q", "k"})
        m.push_back({o + "attention." + qk + "_layernorm.weight",
                     x + "self_attn." + qk + "_norm.weight",
                     Transform::HeadNorm,
                     {hd},
                     {hd}});
    m.push_back({o + "attention.dense.weight", x + "self_attn.o_proj.weight", Transform::Copy, {h, h}, {h, h}});
    if (c.add_bias_linear)
      m.push_back({o + "attention.dense.bias", x + "self_attn.o_proj.bias", Transform::Copy, {h}, {h}});
    m.push_back({o + "ln2.weight", x + "post_attention_layernorm.weight", Transform::NormWeight, {h}, {h}});
    for (int p = 0; p < 2; ++p)
      m.push_back(
          {o + "mlp.fc1.weight", x + "mlp." + mlp_names[p] + ".weight", Transform::StackedPart, {2, f, h}, {f, h}, p});
    if (c.add_bias_linear)
      for (int p = 0; p < 2; ++p)
        m.push_back({o + "mlp.fc1.bias", x + "mlp." + mlp_names[p] + ".bias", Transform::StackedPart, {2, f}, {f}, p});
    m.push_back({o + "mlp.fc2.weight", x + "mlp.down_proj.weight", Transform::Copy, {h, f}, {h, f}});
    if (c.add_bias_linear) m.push_back({o + "mlp.fc2.bias", x + "mlp.down_proj.bias", Transform::Copy, {h}, {h}});
  }
  m.push_back({"final_ln.weight", "model.norm.weight", Transform::NormWeight, {h}, {h}});
  if (c.untie_embeddings)
    m.push_back({"output_layer.weight", "lm_head.weight", Transform::VocabRows, {padded_vocab, h}, {V, h}});
  return m;
}

// ------------------------------------------------------------ config.json
std::string llama_config_json(const GPTConfig& c, DType dtype) {
  const I eod = c.vocab_size - 1;  // as the GPT-2 export: the tokenizers megazero trains with end on <|endoftext|>
  json j = {{"architectures", {"LlamaForCausalLM"}},
            {"attention_bias", c.add_bias_linear},  // one switch for every linear layer's bias (--disable-bias-linear)
            {"attention_dropout", c.attention_dropout},
            {"bos_token_id", eod},
            {"eos_token_id", eod},
            {"head_dim", c.head_dim()},
            {"hidden_act", "silu"},
            {"hidden_size", c.hidden_size},
            {"initializer_range", c.init_method_std},
            {"intermediate_size", c.ffn()},
            {"max_position_embeddings", c.max_position_embeddings},
            {"mlp_bias", c.add_bias_linear},
            {"model_type", "llama"},
            {"num_attention_heads", c.num_attention_heads},
            {"num_hidden_layers", c.num_layers},
            {"num_key_value_heads", c.query_groups()},
            {"pretraining_tp", 1},
            {"rms_norm_eps", c.layernorm_epsilon},
            // --rotary-seq-len-interpolation-factor is Hugging Face's linear scaling (positions / factor),
            // --use-rope-scaling its llama3 kind (hf_format_of refuses both at once).
            {"rope_scaling", c.use_rope_scaling
                                 ? json{{"rope_type", "llama3"},
                                        {"factor", c.rope_scaling_factor},
                                        {"low_freq_factor", kernels::kLlama3LowFreqFactor},
                                        {"high_freq_factor", kernels::kLlama3HighFreqFactor},
                                        {"original_max_position_embeddings", kernels::kLlama3OriginalPositions}}
                             : c.rotary_interpolation_factor == 1
                                 ? json(nullptr)
                                 : json{{"rope_type", "linear"}, {"factor", c.rotary_interpolation_factor}}},
            {"rope_theta", c.rotary_base},
            {"tie_word_embeddings", !c.untie_embeddings},
            {"torch_dtype", dtype == DType::F16    ? "float16"
                            : dtype == DType::BF16 ? "bfloat16"
                                                   : "float32"},
            {"use_cache", true},
            {"vocab_size", c.vocab_size},
            // What HF has no field for (Llama has no residual dropout), so that import restores the run's settings.
            {"megazero",
             {{"seq_length", c.seq_length},
              {"make_vocab_size_divisible_by", c.make_vocab_size_divisible_by},
              {"hidden_dropout", c.hidden_dropout}}}};
  if (!c.add_bias_linear && c.add_qkv_bias) {
    // Qwen2Config: LlamaConfig's fields less the bias switches (Qwen2's
    // q/k/v projections always have biases, the others never) and
    // pretraining_tp, plus its sliding window, off.
    j["architectures"] = {"Qwen2ForCausalLM"};
    j["model_type"] = "qwen2";
    j.erase("attention_bias");
    j.erase("mlp_bias");
    j.erase("pretraining_tp");
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_layers;
  }
  if (c.qk_layernorm) {
    // Qwen3Config: LlamaConfig's fields less the MLP's bias switch (Qwen3's
    // MLP has none) and pretraining_tp, plus its sliding window, off.
    j["architectures"] = {"Qwen3ForCausalLM"};
    j["model_type"] = "qwen3";
    j.erase("mlp_bias");
    j.erase("pretraining_tp");
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_layers;
  }
  return j.dump(2) + "\n";
}

// ------------------------------------------------------------ import
namespace {

void one_bias_switch(bool attention_bias, bool mlp_bias, const std::string& where) {
  MZ_REQUIRE(attention_bias == mlp_bias, where, ": attention_bias ", attention_bias ? "true" : "false",
             " with mlp_bias ", mlp_bias ? "true" : "false",
             " cannot be imported: megazero has one switch for the biases of every linear layer "
             "(--disable-bias-linear), so both must be true or both false");
}

// rope_scaling: null, the linear kind (positions divided by its factor:
// --rotary-seq-len-interpolation-factor), or Llama 3's (--use-rope-scaling
// --rope-scaling-factor, with Megatron's fixed low/high frequency factors 1
// and 4 and 8192 original positions); the others (dynamic, yarn, ...)
// change the angles otherwise and are refused.
void read_rope_scaling(const JsonFields& j, GPTConfig& c) {
  if (!j.has("rope_scaling")) return;
  const std::string what = j.dump("rope_scaling");
  const json& r = j.raw("rope_scaling");
  const json* kind = r.is_object() ? (r.contains("rope_type") ? &r["rope_type"]
                                      : r.contains("type")    ? &r["type"]
                                                              : nullptr)
                                   : nullptr;
  const std::string type = kind && kind->is_string() ? kind->get<std::string>() : "";
  auto equals = [&](const char* k, double v) { return r.contains(k) && r[k].is_number() && r[k].get<double>() == v; };
  const bool factor =
      r.is_object() && r.contains("factor") && r["factor"].is_number() && r["factor"].get<double>() >= 1;
  const bool llama3 = type == "llama3" && factor && equals("low_freq_factor", kernels::kLlama3LowFreqFactor) &&
                      equals("high_freq_factor", kernels::kLlama3HighFreqFactor) &&
                      equals("original_max_position_embeddings", kernels::kLlama3OriginalPositions);
  MZ_REQUIRE((type == "linear" && factor) || llama3, "'", j.path(), "': rope_scaling ", what,
             " is not supported: megazero's rotary embedding takes linear position interpolation "
             "(--rotary-seq-len-interpolation-factor: rope_type linear with a factor of at least 1) or Llama 3's "
             "scaling (--use-rope-scaling: rope_type llama3 with low_freq_factor 1, high_freq_factor 4 and "
             "original_max_position_embeddings 8192)");
  if (type == "linear") {
    c.rotary_interpolation_factor = r["factor"].get<double>();
  } else {
    c.use_rope_scaling = true;
    c.rope_scaling_factor = r["factor"].get<double>();
  }
}

// LlamaConfig fields into a GPTConfig (LlamaConfig's defaults for what is
// absent); refuses what our model cannot compute the same way.
void read_llama_config(const JsonFields& j, GPTConfig& c, bool& tied) {
  const std::string& path = j.path();
  const std::string act = j.text("hidden_act", "silu");
  MZ_REQUIRE(act == "silu", "'", path, "': hidden_act '", act,
             "' is not supported: megazero's SwiGLU gates with silu (Llama's)");
  read_rope_scaling(j, c);
  c.num_layers = j.integer("num_hidden_layers", std::nullopt);
  c.hidden_size = j.integer("hidden_size", std::nullopt);
  c.num_attention_heads = j.integer("num_attention_heads", std::nullopt);
  c.vocab_size = j.integer("vocab_size", std::nullopt);
  c.ffn_hidden_size = j.integer("intermediate_size", std::nullopt);
  const I kv = j.integer("num_key_value_heads", c.num_attention_heads);
  c.num_query_groups = kv == c.num_attention_heads ? 0 : kv;
  if (c.num_attention_heads > 0 && j.has("head_dim")) {
    const I hd = j.integer("head_dim", std::nullopt);
    MZ_REQUIRE(hd * c.num_attention_heads == c.hidden_size, "'", path, "': head_dim ", hd,
               " is not hidden_size / num_attention_heads (", c.hidden_size, " / ", c.num_attention_heads,
               "); megazero's heads split the hidden size, so such a model cannot be imported");
  }
  c.max_position_embeddings = j.integer("max_position_embeddings", 2048);
  c.layernorm_epsilon = j.number("rms_norm_eps", 1e-6);
  c.rotary_base = j.number("rope_theta", 10000.0);
  // Qwen3: q and k RMS-normalised per head before rope (--qk-layernorm); its
  // MLP has no biases (no mlp_bias field); a sliding window we do not compute.
  // Qwen2: biases on q, k and v only (--add-qkv-bias), no bias switch fields.
  const std::string type = j.text("model_type", "llama");
  c.qk_layernorm = type == "qwen3";
  if (type != "llama")
    MZ_REQUIRE(!j.flag("use_sliding_window", false), "'", path,
               "': use_sliding_window true is not supported: megazero's attention is causal over the whole "
               "sequence");
  if (type == "qwen2") {
    c.add_bias_linear = false;
    c.add_qkv_bias = true;
  } else {
    const bool attention_bias = j.flag("attention_bias", false);
    one_bias_switch(attention_bias, !c.qk_layernorm && j.flag("mlp_bias", false), "'" + path + "'");
    c.add_bias_linear = attention_bias;
  }
  tied = j.flag("tie_word_embeddings", false);
  c.untie_embeddings = !tied;
  c.attention_dropout = j.number("attention_dropout", 0.0);
  c.init_method_std = j.number("initializer_range", 0.02);
  c.seq_length = c.max_position_embeddings;
  j.megazero_block(c);
}

// Without config.json: the shapes give all but the head count (--num-attention-heads);
// LlamaConfig's defaults stand for the rest, with a note.
void read_llama_shapes(const checkpoint::SafetensorsFile& f, const ImportOptions& o, ImportResult& r, GPTConfig& c,
                       bool& tied) {
  auto shape = [&](const std::string& n) {
    MZ_REQUIRE(f.has(n), "'", r.safetensors, "' has no tensor '", n,
               "', which every Llama has; is it a Llama (LlamaForCausalLM) model.safetensors?");
    const auto& s = f.entry(n).shape;
    MZ_REQUIRE(s.size() == 2, "'", r.safetensors, "': ", n, " must be 2-D, is ", shape_str(s));
    return s;
  };
  const auto embed = shape("model.embed_tokens.weight");
  c.vocab_size = embed[0];
  c.hidden_size = embed[1];
  c.num_layers = 0;
  for (const auto& [name, e] : f.tensors()) c.num_layers = std::max(c.num_layers, layer_of(name, "model.layers.") + 1);
  MZ_REQUIRE(c.num_layers > 0, "'", r.safetensors, "' has no decoder layers (model.layers.0.*)");
  c.ffn_hidden_size = shape("model.layers.0.mlp.gate_proj.weight")[0];
  MZ_REQUIRE(o.num_attention_heads > 0, "'", r.safetensors,
             "' comes without a config.json beside it and the head count cannot be read from the weights; pass "
             "--num-attention-heads N (Llama 2 7B: 32, 13B: 40) or add the config.json");
  c.num_attention_heads = o.num_attention_heads;
  if (c.hidden_size % c.num_attention_heads == 0) {  // else validate() says so
    const I kv = shape("model.layers.0.self_attn.k_proj.weight")[0] / c.head_dim();
    c.num_query_groups = kv == c.num_attention_heads ? 0 : kv;
  }
  tied = !f.has("lm_head.weight");
  c.untie_embeddings = !tied;
  c.qk_layernorm = f.has("model.layers.0.self_attn.q_norm.weight");  // Qwen3's
  const bool qkv_biases = f.has("model.layers.0.self_attn.q_proj.bias");
  c.add_bias_linear = qkv_biases && f.has("model.layers.0.self_attn.o_proj.bias");
  c.add_qkv_bias = qkv_biases && !c.add_bias_linear;  // Qwen2's
  if (c.add_bias_linear || !c.add_qkv_bias)
    one_bias_switch(c.add_bias_linear, f.has("model.layers.0.mlp.gate_proj.bias"), "'" + r.safetensors + "'");
  c.max_position_embeddings = c.seq_length = o.seq_length > 0 ? o.seq_length : 2048;
  c.layernorm_epsilon = 1e-6;
  c.rotary_base = 10000;
  r.notes.push_back(
      "no config.json: LlamaConfig's defaults assumed: rms_norm_eps 1e-06, rope_theta 10000, "
      "max_position_embeddings " +
      std::to_string(c.max_position_embeddings) +
      " (--seq-length, else 2048); put the model's config.json beside it if they differ");
}

}  // namespace

ImportPlan plan_llama_import(const checkpoint::SafetensorsFile& f, const json* config, const ImportOptions& o,
                             ImportResult& r) {
  ImportPlan p;
  p.format = HfFormat::Llama;
  GPTConfig& c = p.model;
  c.position_embedding_type = "rope";
  c.normalization = "RMSNorm";
  c.swiglu = true;
  c.hidden_dropout = c.attention_dropout = 0;  // Llama has none
  if (config)
    read_llama_config(JsonFields(*config, r.config, "a LlamaConfig"), c, p.tied);
  else
    read_llama_shapes(f, o, r, c, p.tied);
  return p;
}

void check_llama_extra(const ImportPlan& p, const checkpoint::SafetensorsFile& f, const std::string& name,
                       const ImportResult& r) {
  const I layer = layer_of(name, "model.layers.");
  const std::string cfg = r.config.empty() ? std::string() : "; does '" + r.config + "' belong to these weights?";
  MZ_REQUIRE(layer < p.model.num_layers, "'", r.safetensors, "' holds '", name,
             "' but the model has num_hidden_layers ", p.model.num_layers, cfg);
  if (layer >= 0 && ends_with(name, ".self_attn.rotary_emb.inv_freq")) return;  // a buffer older transformers saved
  if (name == "lm_head.weight") {  // in the maps when untied: here the config ties it
    const auto& embed = f.entry("model.embed_tokens.weight");
    MZ_REQUIRE(f.entry(name).shape == embed.shape && read_floats(f, f.entry(name)) == read_floats(f, embed), "'",
               r.safetensors, "': lm_head.weight differs from model.embed_tokens.weight but '", r.config,
               "' says tie_word_embeddings true; set it false to import the output layer as its own weight");
    return;
  }
  const char* b = p.model.add_bias_linear ? "true" : "false";
  throw ConfigError("'" + r.safetensors + "': tensor '" + name + "' is not part of a Llama megazero knows (" +
                    "attention_bias " + b + ", mlp_bias " + b + ")" + cfg + "; it cannot be imported");
}

}  // namespace megazero::hf
