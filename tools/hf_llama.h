// The Llama half of the Hugging Face conversion (the interface is
// tools/hf_gpt2.h; docs/HF_EXPORT.md): LlamaForCausalLM's tensor names and
// LlamaConfig, and the pieces of import both halves share. Internal to the
// megazero_hf_gpt2 library.
//
// Our Llama-style model (rope, RMSNorm, SwiGLU) keeps its Megatron layouts:
//  - attention.qkv.weight rows [group][q heads of the group, k, v][head_dim];
//    HF's q_proj rows are [head][head_dim], k_proj and v_proj [kv head][head_dim],
//    query head n using kv head n / (heads / kv heads) (repeat_kv);
//  - mlp.fc1.weight [2, ffn, hidden] = [gate; up] -> gate_proj, up_proj;
//  - every other weight is an nn.Linear [out, in] as ours: copied.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "megazero/checkpoint/safetensors.h"
#include "tools/hf_gpt2.h"

namespace megazero::hf {

// Our QKV row holding row `row` of HF's q_proj (part 0), k_proj (1) or v_proj (2).
std::int64_t llama_qkv_row(const layers::GPTConfig& c, int part, std::int64_t row);
// Our dimension of a query or key head holding HF's (rotate-half) dimension d:
// d itself, or with --rotary-interleaved the pair member it was rotated with.
std::int64_t llama_head_row(const layers::GPTConfig& c, std::int64_t d);

// Typed fields of a config.json: a field absent or null takes the default
// (nullopt: required); each refusal names the file and the field.
class JsonFields {
 public:
  // kind: what a config of this model is called in messages ("a GPT2Config").
  JsonFields(const nlohmann::json& j, std::string path, std::string kind)
      : j_(j), path_(std::move(path)), kind_(std::move(kind)) {}
  bool has(const char* k) const { return j_.contains(k) && !j_[k].is_null(); }
  std::int64_t integer(const char* k, std::optional<std::int64_t> dflt) const;
  double number(const char* k, double dflt) const;
  bool flag(const char* k, bool dflt) const;
  std::string text(const char* k, const std::string& dflt) const;
  std::string dump(const char* k) const { return j_[k].dump(); }
  const nlohmann::json& raw(const char* k) const { return j_[k]; }  // a nested value (has(k) first)
  // The "megazero" object our exports write (seq_length,
  // make_vocab_size_divisible_by, hidden_dropout): what HF has no field for.
  void megazero_block(layers::GPTConfig& c) const;
  const std::string& path() const { return path_; }

 private:
  const nlohmann::json& j_;
  std::string path_, kind_;
};

// What import learns of an HF model before building ours.
struct ImportPlan {
  HfFormat format = HfFormat::Gpt2;
  layers::GPTConfig model;
  std::string prefix;  // before every HF name in the file ("transformer." from GPT-2's save_pretrained)
  bool tied = true;    // the config's tie_word_embeddings (without one: no lm_head.weight)
};

// The Llama model of a file and its config.json (nullptr: none beside it;
// then the shapes give the model, with --num-attention-heads).
ImportPlan plan_llama_import(const checkpoint::SafetensorsFile& f, const nlohmann::json* config, const ImportOptions& o,
                             ImportResult& r);
// A tensor of a Llama file that no TensorMap uses: returns if it may be skipped
// (a rotary buffer, a tied lm_head equal to the embedding), else ConfigError.
void check_llama_extra(const ImportPlan& p, const checkpoint::SafetensorsFile& f, const std::string& name,
                       const ImportResult& r);

// A tensor's values as fp32 (any float dtype).
std::vector<float> read_floats(const checkpoint::SafetensorsFile& f, const checkpoint::TensorEntry& e);
// "<stem><n>.<rest>" -> n, or -1 (not a layer's tensor).
std::int64_t layer_of(const std::string& name, const std::string& stem);
bool ends_with(const std::string& s, const std::string& tail);

}  // namespace megazero::hf
