// Megatron's --eod-mask-loss: the loss is not taken where the input token is
// the end-of-document token (the prediction of the next document's first
// token from the previous one's end). The masked tokens weigh 0; the kept ones
// weigh tokens / kept, so that the weighted mean over all tokens is the mean
// over the kept ones:
//  - by default (Megatron's sum(loss * mask) / mask.sum() per micro-batch,
//    then the mean over micro-batches and DP ranks), over each micro-batch:
//    N / the micro-batch's kept tokens;
//  - with --calculate-per-token-loss, over the whole global batch: (N x
//    micro-batches x DP) / the global batch's kept tokens (one all-reduce of
//    the count over DP), so every kept token of the batch weighs alike.
// A micro-batch without an end-of-document token trains exactly as without
// the flag in the first case (every weight 1). The cross-entropy applies the
// weights to the loss and its gradient (layers/cross_entropy.h).
#pragma once

#include <cstdint>
#include <vector>

#include "megazero/comm/communicator.h"
#include "megazero/train/train_step.h"

namespace megazero::train {

struct LossMask {
  std::int64_t eod_token = -1;
  bool per_token = false;  // --calculate-per-token-loss: normalised over the global batch
};

// The tokens of int64 [N] host ids that are not `eod_token`.
std::int64_t kept_tokens(const Tensor& ids, std::int64_t eod_token);
// [N] of `dtype` on the ids' device: 0 where ids[i] == eod_token, else `weight`.
Tensor loss_mask_weights(const Tensor& ids, std::int64_t eod_token, double weight, DType dtype);
// Sets every micro-batch's loss_weights (ids still on the host) in `dtype`
// (kernels::row_stat_dtype of the model's). `dp` (this rank's DP group) sums
// the kept count with per_token: every rank of it calls this alike. Where
// nothing is kept, the weights are 0 (a loss of 0, not 0/0).
void weigh_micro_batches(std::vector<MicroBatch>& mbs, const LossMask& mask, Communicator& dp, DType dtype);

}  // namespace megazero::train
