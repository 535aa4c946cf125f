#include "layers/normalization.h"

#include "layers/layernorm.h"
#include "layers/rmsnorm.h"

namespace megazero::layers {

std::unique_ptr<Normalization> make_normalization(ParameterSet& params, const std::string& name, const GPTConfig& cfg,
                                                  const TpContext& ctx) {
  if (cfg.rmsnorm()) return std::make_unique<RMSNorm>(params, name, cfg.hidden_size, cfg.layernorm_epsilon, ctx);
  return std::make_unique<LayerNorm>(params, name, cfg.hidden_size, cfg.layernorm_epsilon, ctx);
}

}  // namespace megazero::layers
