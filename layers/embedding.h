// Word embeddings split by vocabulary rows across TP (each rank looks up the
// ids in its slice; others contribute zero rows; a TP all-reduce completes the
// lookup — under sequence parallelism a reduce-scatter, leaving each rank its
// token rows), plus learned position embeddings (replicated).
#pragma once

#include <functional>

#include "layers/parameter.h"
#include "layers/tp_context.h"

namespace megazero::layers {

class VocabParallelEmbedding {
 public:
  // vocab: the real vocabulary; padded_vocab: rows allocated (a multiple of the
  // TP size); padding rows stay zero and are never looked up.
  VocabParallelEmbedding(ParameterSet& params, const std::string& name, std::int64_t vocab, std::int64_t padded_vocab,
                         std::int64_t hidden, const TpContext& ctx, double init_std);
  // int64 [N] -> [N, hidden], identical on every TP rank (under sequence
  // parallelism [N / TP, hidden], this rank's token rows). `add_once` (the
  // position embeddings) is added to the sum exactly once: after the
  // all-reduce, or by TP rank 0 to its partial sum before the reduce-scatter.
  Tensor forward(const Tensor& ids, const std::function<void(Tensor&)>& add_once = nullptr);
  // dout like forward's output. Accumulates into the weight gradient and
  // returns the gradient of the whole [N, hidden] sum (for add_once's owner).
  Tensor backward(const Tensor& dout);
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
  // x [B*S, H] += table[first + s], or with `positions` (int64 [B*S],
  // StepInfo::positions) table[positions[b*S + s]].
  void forward(Tensor& x, std::int64_t seq, std::int64_t first = 0, const Tensor& positions = Tensor());
  void backward(const Tensor& dout, std::int64_t seq, const Tensor& positions = Tensor());  // accumulates

 private:
  TpContext ctx_;
  Parameter* weight_;
};

}  // namespace megazero::layers
