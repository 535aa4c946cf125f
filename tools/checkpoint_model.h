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

// A checkpoint's model on `self` (one rank), its fp32 master weights loaded
// once (any TP x DP x ZeRO layout), no dropout, on `device`; the attention
// is the unfused one, which runs any sequence length in fp32.
class CheckpointModel {
 public:
  CheckpointModel(const std::string& load, Communicator& self, std::int64_t heads = 0,
                  const std::string& device = "cpu");
  ~CheckpointModel();
  const layers::GPTConfig& config() const;
  const std::string& checkpoint() const;  // the iter_* directory loaded
  std::int64_t iteration() const;
  // Logits [tokens.size(), vocab] (the real vocabulary) of one sequence of 1
  // to max-position-embeddings ids inside the vocabulary (ConfigError
  // naming --tokens otherwise). last_only: only the last position's row
  // [vocab], the one a generation step reads (one row copied to the host).
  std::vector<float> logits(const std::vector<std::int64_t>& tokens, bool last_only = false);
  // Generation with a key/value cache (layers/kv_cache.h): start_cache empties
  // it for `capacity` positions (at most max-position-embeddings); extend runs
  // only `tokens`, after the positions already cached, and returns the last
  // one's logits [vocab] (what logits(all tokens so far, true) gives, to rounding).
  void start_cache(std::int64_t capacity);
  std::vector<float> extend(const std::vector<std::int64_t>& tokens);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "464,3290,318" as ids; ConfigError naming `flag` and the piece that is not an id.
std::vector<std::int64_t> parse_token_ids(const std::string& list, const std::string& flag);

// CheckpointModel(load, self, heads, device).logits(tokens).
std::vector<float> checkpoint_logits(const std::string& load, const std::vector<std::int64_t>& tokens,
                                     Communicator& self, std::int64_t heads = 0, const std::string& device = "cpu");

}  // namespace megazero::hf
