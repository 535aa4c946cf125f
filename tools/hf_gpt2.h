// Conversion between megazero checkpoints and Hugging Face GPT-2 or Llama
// (docs/HF_EXPORT.md). Export consolidates a distributed checkpoint's fp32
// master weights into one model.safetensors with the hub's names and layout
// plus a config.json (GPT2Config or LlamaConfig, whichever the checkpoint's
// model is); import goes the other way through the real model and ZeRO engine
// (TP 1, DP 1, stage 0) and save_checkpoint, so the result loads at any
// TP/DP/ZeRO stage like any other checkpoint. The Llama half is hf_llama.cpp.
//
// Layout differences handled here:
//  - our Linear weights are [out, in]; HF's GPT-2 Conv1D weights are [in, out]
//    (Llama's nn.Linear weights are [out, in], as ours);
//  - our fused QKV outputs are [group][q heads of the group, k, v][head_dim]
//    (Megatron: a TP split gives whole groups; without GQA a group is a head);
//    HF's GPT-2 c_attn outputs are [q|k|v][head][head_dim], Llama has separate
//    q_proj [head][head_dim] and k_proj, v_proj [kv head][head_dim];
//  - our SwiGLU fc1 is [gate; up] stacked; Llama has gate_proj and up_proj;
//  - our word embedding (and untied output layer) has padded vocabulary rows
//    (zero); HF's has none.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "layers/gpt_config.h"
#include "megazero/checkpoint/checkpoint.h"
#include "megazero/comm/communicator.h"
#include "megazero/core/dtype.h"
#include "tools/checkpoint_model.h"  // CheckpointModel, checkpoint_logits

namespace megazero::hf {

enum class Transform {
  Copy,         // same shape and element order (LayerNorm, position table, row-parallel biases)
  Transpose,    // our Linear [out, in] <-> HF Conv1D [in, out]
  QkvWeight,    // transpose and reorder outputs [head][q|k|v][dim] <-> [q|k|v][head][dim]
  QkvBias,      // the same reorder of the QKV bias
  VocabRows,    // the word embedding without (export) / with zero (import) padding rows
  QkvPart,      // Llama: q (part 0), k (1) or v (2) rows carved out of our grouped QKV weight or bias
  StackedPart,  // Llama: gate (part 0) or up (1) = our SwiGLU fc1[part] (weight or bias)
  NormWeight,   // a norm's weight: copied; with --apply-layernorm-1p ours is gamma - 1, HF's gamma = 1 + ours
  HeadNorm,     // Qwen3's q_norm / k_norm [head size]: a NormWeight in the head's rotate-half order
};

// One HF tensor and where it comes from. Several HF tensors may come from one
// of ours (QkvPart, StackedPart): each covers its part of our tensor.
struct TensorMap {
  std::string ours, hf;
  Transform how;
  std::vector<std::int64_t> our_shape, hf_shape;  // our_shape: global, vocab padded to `padded_vocab`
  int part = 0;                                   // QkvPart, StackedPart
};

// Every tensor of a GPT-2, in the order of the hub's files; `padded_vocab` is
// the row count of our word embedding.
std::vector<TensorMap> gpt2_tensor_map(const layers::GPTConfig& cfg, std::int64_t padded_vocab);
// Every tensor of a Llama (LlamaForCausalLM; hf_llama.cpp).
std::vector<TensorMap> llama_tensor_map(const layers::GPTConfig& cfg, std::int64_t padded_vocab);
// ours: row-major over m.our_shape; hf: row-major over m.hf_shape. For a part
// (QkvPart, StackedPart) ours is the whole tensor: only the part's elements move.
void to_hf(const TensorMap& m, const layers::GPTConfig& cfg, const float* ours, float* hf);
void from_hf(const TensorMap& m, const layers::GPTConfig& cfg, const float* hf, float* ours);

// Which Hugging Face model a configuration is: GPT-2 (learned positions,
// LayerNorm, GeLU MLP, one K/V head per query head, biases, tied embeddings)
// or Llama (rope, RMSNorm, SwiGLU; grouped-query attention, biases and untied
// embeddings optional). ConfigError naming `where` and what each would need
// for anything else.
enum class HfFormat { Gpt2, Llama };
HfFormat hf_format_of(const layers::GPTConfig& cfg, const std::string& where);

// The resolved pretrain_gpt configuration of a model (every flag, defaults
// elsewhere), as stored in checkpoints.
std::string resolved_config(const layers::GPTConfig& cfg, std::uint64_t seed);
// The model of a checkpoint: its manifest's configuration checked against the
// saved global shapes (which supply what the configuration lacks, except the
// head count: `heads` > 0 overrides it). ConfigError naming `where`.
layers::GPTConfig model_config_of(const checkpoint::Manifest& m, const std::string& where, std::int64_t heads = 0);
// GPT2Config JSON of a model (torch_dtype from `dtype`).
std::string gpt2_config_json(const layers::GPTConfig& cfg, DType dtype);
// LlamaConfig JSON of a model (hf_llama.cpp).
std::string llama_config_json(const layers::GPTConfig& cfg, DType dtype);

// The checkpoint --load names, opened: DIR itself if it is one, else the
// newest usable checkpoint under DIR (damaged ones are skipped, each reported
// on stderr with its reason). ConfigError naming DIR and every reason if none.
std::unique_ptr<checkpoint::CheckpointReader> open_checkpoint(const std::string& load);

struct ExportOptions {
  std::string load, output;
  DType dtype = DType::F32;
  std::int64_t num_attention_heads = 0;  // only for checkpoints whose config lacks it
  // GPT-2's BPE files (what pretrain_gpt's --vocab-file / --merge-file name):
  // copied beside the model as Hugging Face's vocab.json and merges.txt (the
  // same formats), with a tokenizer_config.json, so the export loads with its
  // tokenizer. Both or neither.
  std::string vocab_file = {}, merge_file = {};
};
struct ExportResult {
  std::string checkpoint, safetensors;
  HfFormat format = HfFormat::Gpt2;
  bool tokenizer = false;  // vocab.json, merges.txt and tokenizer_config.json written
  layers::GPTConfig model;
  std::int64_t iteration = 0, tensors = 0;
  std::uint64_t bytes = 0;
  double seconds = 0;
};
// Single process; no communication.
ExportResult export_checkpoint(const ExportOptions& o);

struct ImportOptions {
  std::string input, save;  // input: an HF model directory or its .safetensors file
  // 0: the config.json's megazero.seq_length, else n_positions / max_position_embeddings
  // (Llama without config.json: also its max-position-embeddings, else LlamaConfig's 2048).
  std::int64_t seq_length = 0;
  std::int64_t num_attention_heads = 0;           // needed without config.json
  std::int64_t make_vocab_size_divisible_by = 0;  // 0: config.json's megazero value, else 128
  std::uint64_t seed = 1234;
  std::string device = "cpu";  // where the model is built: cpu, cpu-isolated, cuda[:N]
};
struct ImportResult {
  std::string checkpoint, safetensors, config;  // config: "" if none was found
  HfFormat format = HfFormat::Gpt2;
  layers::GPTConfig model;
  std::vector<std::string> ignored;  // tensors of the file not used (buffers, tied lm_head, rotary inv_freq)
  std::vector<std::string> notes;    // approximations worth telling the user about
  double seconds = 0;
};
// `self` must have one rank (the model is built at TP 1 on it).
ImportResult import_checkpoint(const ImportOptions& o, Communicator& self);

}  // namespace megazero::hf
