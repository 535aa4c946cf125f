#include "megazero/plan/activation_formula.h"

#include "megazero/core/error.h"

namespace megazero::plan {

LayerActivationBytes layer_activation_bytes(const layers::GPTConfig& cfg, int tp, DType dtype, std::int64_t tokens,
                                            std::int64_t seq) {
  MZ_CHECK(tp > 0 && tokens % tp == 0, "tokens ", tokens, " over TP ", tp);
  const std::int64_t e = static_cast<std::int64_t>(dtype_size(dtype));
  const DType stat_type = dtype == DType::BF16 || dtype == DType::F16 ? DType::F32 : dtype;
  const std::int64_t stat = static_cast<std::int64_t>(dtype_size(stat_type));
  const std::int64_t h = cfg.hidden_size, hn = cfg.head_dim(), heads = cfg.num_attention_heads;
  const std::int64_t f = cfg.ffn(), kv = cfg.query_groups() * hn;

  // Per token, all TP ranks together.
  const std::int64_t norm_stats = cfg.rmsnorm() ? 1 : 2;
  const std::int64_t residual = 4 * h * e + 2 * norm_stats * stat;
  std::int64_t split = (h + 2 * kv + h) * e + ((cfg.swiglu ? 2 : 1) * f + f) * e;
  if (cfg.fused_attention())
    split += h * e + heads * stat;
  else if (cfg.cudnn_attention())  // q, k, v views of the QKV output; the context is the dense input
    split += heads * stat;
  else if (!cfg.recompute_core_attention)  // selective recompute makes them again in backward
    split += heads * seq * e * (cfg.attention_dropout > 0 ? 2 : 1);

  LayerActivationBytes b;
  const bool sp = cfg.sequence_parallel && tp > 1;
  b.residual_stream = sp ? residual * tokens / tp : residual * tokens;
  b.tp_split = split * tokens / tp;
  return b;
}

}  // namespace megazero::plan
