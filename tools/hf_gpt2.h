// Conversion between megazero checkpoints and Hugging Face GPT-2
// (docs/HF_EXPORT.md). Export consolidates a distributed checkpoint's fp32
// master weights into one model.safetensors with the hub's GPT-2 names and
// layout plus a GPT2Config config.json; import goes the other way through the
// real model and ZeRO engine (TP 1, DP 1, stage 0) and save_checkpoint, so the
// result loads at any TP/DP/ZeRO stage like any other checkpoint.
//
// Layout differences handled here:
//  - our Linear weights are [out, in]; HF's Conv1D weights are [in, out];
//  - our fused QKV outputs are [head][q|k|v][head_dim] (Megatron: a TP split
//    gives whole heads); HF's c_attn outputs are [q|k|v][head][head_dim];
//  - our word embedding has padded vocabulary rows (zero); HF's has none.
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

namespace megazero::hf {

enum class Transform {
  Copy,       // same shape and element order (LayerNorm, position table, row-parallel biases)
  Transpose,  // our Linear [out, in] <-> HF Conv1D [in, out]
  QkvWeight,  // transpose and reorder outputs [head][q|k|v][dim] <-> [q|k|v][head][dim]
  QkvBias,    // the same reorder of the QKV bias
  VocabRows,  // the word embedding without (export) / with zero (import) padding rows
};

struct TensorMap {
  std::string ours, hf;
  Transform how;
  std::vector<std::int64_t> our_shape, hf_shape;  // our_shape: global, vocab padded to `padded_vocab`
};

// Every tensor of a GPT-2, in the order of the hub's files; `padded_vocab` is
// the row count of our word embedding.
std::vector<TensorMap> gpt2_tensor_map(const layers::GPTConfig& cfg, std::int64_t padded_vocab);
// ours: row-major over m.our_shape; hf: row-major over m.hf_shape.
void to_hf(const TensorMap& m, const layers::GPTConfig& cfg, const float* ours, float* hf);
void from_hf(const TensorMap& m, const layers::GPTConfig& cfg, const float* hf, float* ours);

// The resolved pretrain_gpt configuration of a model (every flag, defaults
// elsewhere), as stored in checkpoints.
std::string resolved_config(const layers::GPTConfig& cfg, std::uint64_t seed);
// The model of a checkpoint: its manifest's configuration checked against the
// saved global shapes (which supply what the configuration lacks, except the
// head count: `heads` > 0 overrides it). ConfigError naming `where`.
layers::GPTConfig model_config_of(const checkpoint::Manifest& m, const std::string& where, std::int64_t heads = 0);
// GPT2Config JSON of a model (torch_dtype from `dtype`).
std::string gpt2_config_json(const layers::GPTConfig& cfg, DType dtype);

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
  bool tokenizer = false;  // vocab.json, merges.txt and tokenizer_config.json written
  layers::GPTConfig model;
  std::int64_t iteration = 0, tensors = 0;
  std::uint64_t bytes = 0;
  double seconds = 0;
};
// Single process; no communication.
ExportResult export_checkpoint(const ExportOptions& o);

struct ImportOptions {
  std::string input, save;                        // input: an HF model directory or its .safetensors file
  std::int64_t seq_length = 0;                    // 0: the config.json's megazero.seq_length, else n_positions
  std::int64_t num_attention_heads = 0;           // needed without config.json
  std::int64_t make_vocab_size_divisible_by = 0;  // 0: config.json's megazero value, else 128
  std::uint64_t seed = 1234;
  std::string device = "cpu";  // where the model is built: cpu, cpu-isolated, cuda[:N]
};
struct ImportResult {
  std::string checkpoint, safetensors, config;  // config: "" if none was found
  layers::GPTConfig model;
  std::vector<std::string> ignored;  // tensors of the file not used (buffers, tied lm_head)
  std::vector<std::string> notes;    // approximations worth telling the user about
  double seconds = 0;
};
// `self` must have one rank (the model is built at TP 1 on it).
ImportResult import_checkpoint(const ImportOptions& o, Communicator& self);

// Logits [tokens.size(), vocab] (the real vocabulary) of one sequence through
// a checkpoint's model at TP 1 on `self` (one rank), no dropout, on `device`.
std::vector<float> checkpoint_logits(const std::string& load, const std::vector<std::int64_t>& tokens,
                                     Communicator& self, std::int64_t heads = 0, const std::string& device = "cpu");

}  // namespace megazero::hf
