// A checkpoint's model at TP 1 on one rank, built through the real model and
// a stage-0 ZeRO engine, on any device: Hugging Face import fills and saves it
// (tools/hf_gpt2.cpp); CheckpointModel loads a checkpoint into it once and
// runs it (convert_checkpoint logits, generate_text).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "layers/gpt_config.h"
#include "layers/gpt_model.h"
#include "layers/kv_cache.h"
#include "megazero/comm/communicator.h"
#include "megazero/zero/zero_engine.h"

namespace megazero::hf {

// The model and its engine; master weights move between the host and the
// device only through copies.
struct Tp1Model {
  std::shared_ptr<Device> device;
  std::unique_ptr<Communicator> tp, dp;
  layers::ParameterSet params;
  std::unique_ptr<layers::GPTModel> model;
  std::unique_ptr<zero::ZeroEngine> engine;  // declared last: destroyed first

  // `self` must have one rank; device_spec: cpu, cpu-isolated, cuda[:N].
  Tp1Model(const layers::GPTConfig& cfg, Communicator& self, const std::string& device_spec);
  // Sets parameter i's fp32 master weights (stage 0, DP 1: the whole flat
  // buffer is owned) from host values; missing trailing elements become 0.
  void set_master(std::size_t i, const std::vector<float>& values);
};

// A checkpoint's model, its fp32 master weights loaded once (any saved TP x
// DP x ZeRO layout), no dropout, on `device`; the attention is the unfused
// one, which runs any sequence length in fp32. One model over the ranks of
// `group` at TP = group.size() (DP 1: each rank its tensor-parallel shard,
// as the saved checkpoint is resharded for a resume), so a model too large
// for one device runs on several; collective over the group, every call
// alike on every rank, every rank returned the same whole-vocabulary logits.
class CheckpointModel {
 public:
  CheckpointModel(const std::string& load, Communicator& group, std::int64_t heads = 0,
                  const std::string& device = "cpu");
  ~CheckpointModel();
  const layers::GPTConfig& config() const;
  const std::string& checkpoint() const;  // the iter_* directory loaded
  std::int64_t iteration() const;
  int tensor_parallel_size() const;
  // Checkpoints skipped as unusable ("<dir>: <why>"), newest first.
  const std::vector<std::string>& rejected() const;
  // Logits [tokens.size(), vocab] (the real vocabulary) of one sequence of 1
  // to max-position-embeddings ids inside the vocabulary (ConfigError
  // naming --tokens otherwise). last_only: only the last position's row
  // [vocab], the one a generation step reads (one row copied to the host).
  std::vector<float> logits(const std::vector<std::int64_t>& tokens, bool last_only = false);
  // Generation with a key/value cache (layers/kv_cache.h): start_cache empties
  // it for `capacity` positions (at most max-position-embeddings); extend runs
  // only `tokens`, after the positions already cached, and returns the last
  // one's logits [vocab] (what logits(all tokens so far, true) gives, to
  // rounding); all_rows: each of the tokens' rows [tokens.size(), vocab].
  // Beam search keeps `slots` caches, one a sequence (extend's `slot`);
  // reorder_caches makes slot i a copy of what slot parents[i] held (one
  // entry a slot, any parent any number of times).
  void start_cache(std::int64_t capacity, std::int64_t slots = 1);
  std::vector<float> extend(const std::vector<std::int64_t>& tokens, bool all_rows = false, std::int64_t slot = 0);
  void reorder_caches(const std::vector<std::int64_t>& parents);
  // Rank 0's token (or values) on every rank of the group. Every rank draws
  // from the same gathered logits with the same seed, so they agree already;
  // this makes it so by construction (a host whose libm rounds differently).
  std::int64_t rank0_token(std::int64_t token);
  std::vector<std::int64_t> rank0_values(std::vector<std::int64_t> values);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "464,3290,318" as ids; ConfigError naming `flag` and the piece that is not an id.
std::vector<std::int64_t> parse_token_ids(const std::string& list, const std::string& flag);

// CheckpointModel(load, group, heads, device).logits(tokens).
std::vector<float> checkpoint_logits(const std::string& load, const std::vector<std::int64_t>& tokens,
                                     Communicator& group, std::int64_t heads = 0, const std::string& device = "cpu");

}  // namespace megazero::hf
