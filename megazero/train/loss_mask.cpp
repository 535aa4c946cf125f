#include "megazero/train/loss_mask.h"

#include "megazero/comm/consensus.h"
#include "megazero/core/error.h"

namespace megazero::train {

namespace {
double weight_of(std::int64_t tokens, std::int64_t kept) {
  return kept > 0 ? static_cast<double>(tokens) / static_cast<double>(kept) : 0.0;
}
const std::int64_t* host_ids(const Tensor& ids) {
  MZ_CHECK(ids.dtype() == DType::I64 && ids.dim() == 1 && ids.device().host_accessible(),
           "the loss mask takes int64 [N] ids on the host, got ", ids.to_string());
  return ids.host_data<std::int64_t>();
}
}  // namespace

std::int64_t kept_tokens(const Tensor& ids, std::int64_t eod_token) {
  const std::int64_t* p = host_ids(ids);
  std::int64_t kept = 0;
  for (std::int64_t i = 0; i < ids.numel(); ++i) kept += p[i] != eod_token;
  return kept;
}

Tensor loss_mask_weights(const Tensor& ids, std::int64_t eod_token, double weight, DType dtype) {
  const std::int64_t* p = host_ids(ids);
  std::vector<double> w(static_cast<std::size_t>(ids.numel()));
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = p[i] != eod_token ? weight : 0.0;
  Tensor out = Tensor::empty(ids.device_ptr(), {ids.numel()}, dtype, MemoryCategory::Activations, "loss weights");
  out.copy_from_doubles(w);
  return out;
}

void weigh_micro_batches(std::vector<MicroBatch>& mbs, const LossMask& mask, Communicator& dp, DType dtype) {
  if (!mask.per_token) {
    for (auto& mb : mbs)
      mb.loss_weights = loss_mask_weights(mb.ids, mask.eod_token,
                                          weight_of(mb.ids.numel(), kept_tokens(mb.ids, mask.eod_token)), dtype);
    return;
  }
  std::int64_t kept = 0, tokens = 0;
  for (const auto& mb : mbs) kept += kept_tokens(mb.ids, mask.eod_token), tokens += mb.ids.numel();
  // Counts far below 2^53: exact in the double the all-reduce sums.
  const auto global_kept = static_cast<std::int64_t>(all_reduce_value(dp, static_cast<double>(kept), ReduceOp::Sum));
  const double w = weight_of(tokens * dp.size(), global_kept);
  for (auto& mb : mbs) mb.loss_weights = loss_mask_weights(mb.ids, mask.eod_token, w, dtype);
}

}  // namespace megazero::train
