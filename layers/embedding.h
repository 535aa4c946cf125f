// Word embeddings split by vocabulary rows across TP (each rank looks up the
// ids in its slice; others contribute zero rows; a TP all-reduce completes the
// lookup), plus learned position embeddings (replicated).
#pragma once

#include "layers/parameter.h"
#include "layers/tp_context.h"

namespace megazero::layers {

class VocabParallelEmbedding {
 public:
  // vocab: the real vocabulary; padded_vocab: rows allocated (a multiple of the
  // TP size); padding rows stay zero and are never looked up.
  VocabParallelEmbedding(ParameterSet& params, const std::string& name, std::int64_t vocab, std::int64_t padded_vocab,
                         std::int64_t hidden, const TpContext& ctx, double init_std);
  Tensor forward(const Tensor& ids);  // int64 [N] -> [N, hidden], identical on every TP rank
  void backward(const Tensor& dout);  // accumulates into the weight gradient
  Parameter& weight() { return *weight_; }
  std::int64_t vocab_start() const { return vocab_start_; }
  std::int64_t local_rows() const { return weight_->local_shape[0]; }
  // Rows of this rank's slice that are real vocabulary (the rest is padding).
  std::int64_t valid_rows() const { return valid_; }

 private:
  TpContext ctx_;
  Parameter* weight_;
  std::int64_t vocab_start_, valid_;
  Tensor ids_;
};

class PositionEmbedding {
 public:
  PositionEmbedding(ParameterSet& params, const std::string& name, std::int64_t max_positions, std::int64_t hidden,
                    const TpContext& ctx, double init_std);
  void forward(Tensor& x, std::int64_t seq);            // x [B*S, H] += table[s]
  void backward(const Tensor& dout, std::int64_t seq);  // accumulates

 private:
  Parameter* weight_;
};

}  // namespace megazero::layers
