#include "layers/embedding.h"

#include <algorithm>

#include "layers/mappings.h"
#include "megazero/core/error.h"
#include "megazero/kernels/embedding.h"
#include "megazero/kernels/gelu_bias.h"

namespace megazero::layers {

VocabParallelEmbedding::VocabParallelEmbedding(ParameterSet& params, const std::string& name, std::int64_t vocab,
                                               std::int64_t padded_vocab, std::int64_t hidden, const TpContext& ctx,
                                               double init_std)
    : ctx_(ctx) {
  weight_ = &params.add(name + ".weight", {padded_vocab, hidden}, 0, ctx.rank(), ctx.size(), Init::Normal, init_std);
  weight_->padding_from_row = vocab;
  vocab_start_ = weight_->shard_start;
  valid_ = std::clamp<std::int64_t>(vocab - vocab_start_, 0, weight_->local_shape[0]);
}

Tensor VocabParallelEmbedding::forward(const Tensor& ids, const std::function<void(Tensor&)>& add_once) {
  ids_ = ids;
  Tensor out = ctx_.activation({ids.size(0), weight_->local_shape[1]});
  kernels::embedding_forward(ids, weight_->value, vocab_start_, out);
  if (ctx_.sequence_parallel) {
    if (add_once && ctx_.rank() == 0) add_once(out);
    return ReduceScatterToSequenceParallelRegion::forward(*ctx_.tp, out, MemoryCategory::Activations);
  }
  ReduceFromTpRegion::forward(*ctx_.tp, out);
  if (add_once) add_once(out);
  return out;
}

Tensor VocabParallelEmbedding::backward(const Tensor& dout) {
  MZ_CHECK(ids_.defined(), "VocabParallelEmbedding::backward before forward");
  Tensor full = dout;
  if (ctx_.sequence_parallel)
    full = ReduceScatterToSequenceParallelRegion::backward(*ctx_.tp, dout, MemoryCategory::Activations);
  else
    ReduceFromTpRegion::backward(*ctx_.tp, dout);
  kernels::embedding_backward(ids_, full, vocab_start_, weight_->grad);
  ids_ = Tensor();
  return full;
}

PositionEmbedding::PositionEmbedding(ParameterSet& params, const std::string& name, std::int64_t max_positions,
                                     std::int64_t hidden, const TpContext& ctx, double init_std)
    : ctx_(ctx) {
  weight_ = &params.add(name + ".weight", {max_positions, hidden}, -1, 0, 1, Init::Normal, init_std);
}

// Per-token positions are a lookup like the word embedding's (the same
// kernels, the table's rows as the "vocabulary"), added to x.
void PositionEmbedding::forward(Tensor& x, std::int64_t seq, std::int64_t first, const Tensor& positions) {
  if (positions.defined()) {
    MZ_CHECK(first == 0 && positions.numel() == x.size(0), "per-token positions ", positions.to_string(), " for ",
             x.to_string(), " from position ", first);
    Tensor rows = ctx_.activation(x.shape());
    kernels::embedding_forward(positions, weight_->value, 0, rows);
    kernels::add(x, rows, x);
    return;
  }
  kernels::add_position_embedding(x, first == 0 ? weight_->value : weight_->value.narrow(0, first, seq), seq);
}

void PositionEmbedding::backward(const Tensor& dout, std::int64_t seq, const Tensor& positions) {
  if (positions.defined())
    kernels::embedding_backward(positions, dout, 0, weight_->grad);
  else
    kernels::position_embedding_backward(dout, seq, weight_->grad);
}

}  // namespace megazero::layers
