// Activation memory against its formula (plan/activation_formula.h, after
// Korthikanti et al. 2022): what one transformer layer keeps for its backward,
// measured as the live activation bytes after forward of a 2-layer model
// minus those of a 1-layer model (embedding, logits and loss cancel), equals
// the formula to the byte — for GPT-2 (unfused and fused attention) and
// Llama-style layers, fp32 and bf16, at the world's TP degree, with and
// without sequence parallelism. So the memory sequence parallelism saves is
// exactly the predicted (1 - 1/TP) of the residual-stream part.
#include <gtest/gtest.h>

#include <string>

#include "layers/gpt_model.h"
#include "megazero/comm/mpi_communicator.h"
#include "megazero/plan/activation_formula.h"
#include "test_device.h"

using namespace megazero;
using namespace megazero::layers;

namespace {

struct Case {
  const char* name;
  bool llama;
  const char* backend;
};

GPTConfig config(const Case& c, int layers, bool sp) {
  GPTConfig g;
  g.num_layers = layers;
  g.hidden_size = 64;
  g.num_attention_heads = 8;
  g.vocab_size = 211;
  g.max_position_embeddings = 16;
  g.seq_length = 16;
  g.hidden_dropout = 0.1;
  g.attention_dropout = 0.1;
  g.make_vocab_size_divisible_by = 8;
  g.attention_backend = c.backend;
  g.sequence_parallel = sp;
  if (c.llama) {
    g.num_query_groups = 4;
    g.position_embedding_type = "rope";
    g.normalization = "RMSNorm";
    g.swiglu = true;
    g.ffn_hidden_size = 96;
    g.add_bias_linear = false;
    g.untie_embeddings = true;
  }
  return g;
}

// Live activation bytes on this rank after a training forward.
std::int64_t activations_after_forward(Communicator& tp, const GPTConfig& cfg, DType dtype) {
  auto device = test_support::test_device();
  TpContext ctx{&tp, device, dtype};
  ParameterSet params;
  GPTModel model(cfg, ctx, params);
  params.allocate(device, dtype);
  params.initialize(5);
  StepInfo step;
  step.micro_batch = 2;
  step.seq = cfg.seq_length;
  step.iteration = 1;
  const std::int64_t n = step.micro_batch * step.seq;
  Tensor ids = test_support::int64_tensor(device, n, [](std::int64_t i) { return (i * 31 + 7) % 211; });
  Tensor targets = test_support::int64_tensor(device, n, [](std::int64_t i) { return (i * 17 + 3) % 211; });
  const auto act = static_cast<std::size_t>(MemoryCategory::Activations);
  const std::int64_t before = device->memory().snapshot().by_category[act].live_bytes;
  const Tensor losses = model.forward_losses(ids, targets, step);
  const std::int64_t after = device->memory().snapshot().by_category[act].live_bytes;
  model.backward(1.0);  // and everything kept is released again
  return after - before;
}

}  // namespace

TEST(ActivationMemory, OneLayerKeepsWhatTheFormulaSaysWithAndWithoutSequenceParallelism) {
  auto world = MpiCommunicator::world();
  const int tp = world->size();
  for (const Case& c : {Case{"gpt2 unfused", false, "unfused"}, Case{"gpt2 fused", false, "fused"},
                        Case{"gpt2 cudnn", false, "cudnn"}, Case{"llama unfused", true, "unfused"},
                        Case{"llama fused", true, "fused"}, Case{"llama cudnn", true, "cudnn"}}) {
    for (DType dtype : {DType::F32, DType::BF16}) {
      std::int64_t per_layer[2] = {0, 0};
      for (bool sp : {false, true}) {
        SCOPED_TRACE(testing::Message() << c.name << " " << dtype_name(dtype) << " TP " << tp
                                        << (sp ? " sequence parallel" : ""));
        const std::int64_t one = activations_after_forward(*world, config(c, 1, sp), dtype);
        const std::int64_t two = activations_after_forward(*world, config(c, 2, sp), dtype);
        const GPTConfig cfg = config(c, 2, sp);
        const auto predicted = plan::layer_activation_bytes(cfg, tp, dtype, 2 * cfg.seq_length, cfg.seq_length);
        per_layer[sp] = two - one;
        EXPECT_EQ(per_layer[sp], predicted.total())
            << "residual stream " << predicted.residual_stream << " + TP-split " << predicted.tp_split;
      }
      // What sequence parallelism saves per layer: (1 - 1/TP) of the residual stream.
      const auto whole = plan::layer_activation_bytes(config(c, 2, false), tp, dtype, 32, 16);
      EXPECT_EQ(per_layer[0] - per_layer[1], whole.residual_stream - whole.residual_stream / tp)
          << c.name << " " << dtype_name(dtype);
      if (world->rank() == 0 && dtype == DType::F32)
        std::printf("[activations] %-14s TP %d: %lld B per layer, %lld B with sequence parallelism\n", c.name, tp,
                    static_cast<long long>(per_layer[0]), static_cast<long long>(per_layer[1]));
    }
  }
}

// Selective recompute (--recompute-granularity selective) keeps the formula's
// bytes less the unfused attention's probabilities (twice heads x seq per
// token with attention dropout); the fused backends keep none to drop.
TEST(ActivationMemory, SelectiveRecomputeKeepsAllButTheProbabilities) {
  auto world = MpiCommunicator::world();
  const int tp = world->size();
  for (const Case& c : {Case{"gpt2 unfused", false, "unfused"}, Case{"gpt2 fused", false, "fused"},
                        Case{"llama unfused", true, "unfused"}}) {
    for (DType dtype : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(testing::Message() << c.name << " " << dtype_name(dtype) << " TP " << tp);
      std::int64_t per_layer[2] = {0, 0};
      for (bool selective : {false, true}) {
        GPTConfig one = config(c, 1, false), two = config(c, 2, false);
        one.recompute_core_attention = two.recompute_core_attention = selective;
        per_layer[selective] =
            activations_after_forward(*world, two, dtype) - activations_after_forward(*world, one, dtype);
        const auto predicted = plan::layer_activation_bytes(two, tp, dtype, 2 * two.seq_length, two.seq_length);
        EXPECT_EQ(per_layer[selective], predicted.total()) << (selective ? "selective" : "none");
      }
      const GPTConfig cfg = config(c, 2, false);
      const std::int64_t tokens = 2 * cfg.seq_length, e = static_cast<std::int64_t>(dtype_size(dtype));
      const std::int64_t probs =
          std::string(c.backend) == "unfused" ? 2 * cfg.num_attention_heads * cfg.seq_length * e * tokens / tp : 0;
      EXPECT_EQ(per_layer[0] - per_layer[1], probs);
    }
  }
}
