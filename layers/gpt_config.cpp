#include "layers/gpt_config.h"

#include <algorithm>
#include <cmath>

#include "megazero/core/error.h"

namespace megazero::layers {

const char* gemm_epilogues_name(GemmEpilogues e) {
  switch (e) {
    case GemmEpilogues::None:
      return "none";
    case GemmEpilogues::Forward:
      return "forward";
    case GemmEpilogues::All:
      return "all";
  }
  return "?";
}

GemmEpilogues parse_gemm_epilogues(const std::string& value) {
  if (value == "none") return GemmEpilogues::None;
  if (value == "forward") return GemmEpilogues::Forward;
  if (value == "all") return GemmEpilogues::All;
  throw ConfigError(
      detail::concat("--gemm-epilogues must be none, forward (the bare flag: the forward's bias and "
                     "bias + GeLU in their GEMMs) or all (also the backward's bias gradients), got '",
                     value, "'"));
}

std::int64_t GPTConfig::ffn() const {
  if (ffn_hidden_size > 0) return ffn_hidden_size;
  if (swiglu) return std::max<std::int64_t>(64, (4 * hidden_size * 2 / 3) / 64 * 64);
  return 4 * hidden_size;
}

std::int64_t GPTConfig::parameter_count() const {
  const std::int64_t h = hidden_size, hn = head_dim(), f = ffn(), b = add_bias_linear ? 1 : 0,
                     qkv_b = qkv_bias() ? 1 : 0;
  const std::int64_t qkv_out = (num_attention_heads + 2 * query_groups()) * hn;
  const std::int64_t norm = rmsnorm() ? h : 2 * h;
  const std::int64_t mlp_in = (swiglu ? 2 : 1) * f;
  const std::int64_t qk_norms = qk_layernorm ? 2 * (rmsnorm() ? hn : 2 * hn) : 0;
  const std::int64_t layer =
      norm + qkv_out * (h + qkv_b) + h * (h + b) + norm + mlp_in * (h + b) + h * (f + b) + qk_norms;
  const std::int64_t embeddings =
      vocab_size * h * (untie_embeddings ? 2 : 1) + (rope() ? 0 : max_position_embeddings * h);
  return num_layers * layer + embeddings + norm;
}

std::int64_t GPTConfig::padded_vocab(int tp) const {
  const std::int64_t multiple = make_vocab_size_divisible_by * tp;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

namespace {
// Upper bounds far above any model trained (GPT-3: 96 layers, hidden 12288;
// the paper's 1T: 128 layers, hidden 25600): a typo's extra digits are refused
// here, not found as an overflow or an hour-long start-up later.
constexpr std::int64_t kMaxLayers = 10000, kMaxHidden = 1 << 20, kMaxSeq = 1 << 20, kMaxFfn = 1 << 24,
                       kMaxVocab = (std::int64_t{1} << 31) - 1;

void require_at_most(const char* flag, std::int64_t v, std::int64_t most) {
  MZ_REQUIRE(v <= most, flag, " ", v, " is beyond megazero's bound of ", most,
             " (far above any model trained); check the value for extra digits");
}
}  // namespace

std::string GPTConfig::recompute_summary() const {
  if (recompute_core_attention)
    return fused_attention() || cudnn_attention()
               ? "selective (nothing to drop: the " + attention_backend + " attention keeps no probabilities)"
               : std::string("selective (the attention probabilities, made again in backward)");
  if (!recompute_activations) return "off";
  if (recompute_chunk > 1)
    return "full, every layer, in chunks of " + std::to_string(recompute_chunk) +
           " layers from one kept input (--recompute-method uniform)";
  if (recomputed_layers() == num_layers) return "full, every layer";
  return "full, the first " + std::to_string(recomputed_layers()) + " of " + std::to_string(num_layers) +
         " layers (--recompute-method block)";
}

void GPTConfig::validate(int tp) const {
  MZ_REQUIRE(num_layers > 0, "--num-layers must be positive, got ", num_layers);
  MZ_REQUIRE(hidden_size > 0, "--hidden-size must be positive, got ", hidden_size);
  MZ_REQUIRE(num_attention_heads > 0, "--num-attention-heads must be positive, got ", num_attention_heads);
  MZ_REQUIRE(ffn_hidden_size >= 0, "--ffn-hidden-size must not be negative (0 means 4 x --hidden-size), got ",
             ffn_hidden_size);
  require_at_most("--num-layers", num_layers, kMaxLayers);
  require_at_most("--hidden-size", hidden_size, kMaxHidden);
  require_at_most("--ffn-hidden-size", ffn_hidden_size, kMaxFfn);
  require_at_most("--seq-length", seq_length, kMaxSeq);
  require_at_most("--max-position-embeddings", max_position_embeddings, kMaxSeq);
  require_at_most("the vocabulary size (--vocab-size or the tokenizer's)", vocab_size, kMaxVocab);
  require_at_most("--make-vocab-size-divisible-by", make_vocab_size_divisible_by, 1 << 20);
  MZ_REQUIRE(std::isfinite(init_method_std) && init_method_std > 0, "--init-method-std must be a positive number, got ",
             init_method_std);
  MZ_REQUIRE(hidden_size % num_attention_heads == 0, "--hidden-size ", hidden_size,
             " is not divisible by --num-attention-heads ", num_attention_heads,
             "; choose a head count that divides the hidden size");
  MZ_REQUIRE(num_attention_heads % tp == 0, "--num-attention-heads ", num_attention_heads,
             " is not divisible by --tensor-model-parallel-size ", tp,
             "; each TP rank holds whole heads: choose a TP size that divides the head count");
  MZ_REQUIRE(position_embedding_type == "learned_absolute" || position_embedding_type == "rope",
             "--position-embedding-type must be learned_absolute or rope, got '", position_embedding_type, "'");
  MZ_REQUIRE(normalization == "LayerNorm" || normalization == "RMSNorm",
             "--normalization must be LayerNorm or RMSNorm, got '", normalization, "'");
  MZ_REQUIRE(rope() || !rotary_interleaved,
             "--rotary-interleaved pairs rope's dimensions: it needs --position-embedding-type rope");
  MZ_REQUIRE(!(squared_relu && swiglu),
             "--squared-relu and --swiglu each choose the MLP's activation (Megatron refuses both too): keep one");
  MZ_REQUIRE(std::isfinite(rotary_interpolation_factor) && rotary_interpolation_factor >= 1,
             "--rotary-seq-len-interpolation-factor must be a number of at least 1 (positions are divided by it), got ",
             rotary_interpolation_factor);
  MZ_REQUIRE(rope() || rotary_interpolation_factor == 1, "--rotary-seq-len-interpolation-factor ",
             rotary_interpolation_factor,
             " scales rotary positions: it needs --position-embedding-type rope (learned positions have no angles)");
  MZ_REQUIRE(std::isfinite(rope_scaling_factor) && rope_scaling_factor >= 1,
             "--rope-scaling-factor must be a number of at least 1 (low frequencies are divided by it), got ",
             rope_scaling_factor);
  MZ_REQUIRE(rope() || !use_rope_scaling,
             "--use-rope-scaling scales rope's frequencies: it needs --position-embedding-type rope");
  if (rope()) {
    MZ_REQUIRE(std::isfinite(rotary_base) && rotary_base > 1, "--rotary-base must be a number above 1, got ",
               rotary_base);
    MZ_REQUIRE(head_dim() % 2 == 0, "--position-embedding-type rope needs an even head size; --hidden-size ",
               hidden_size, " / --num-attention-heads ", num_attention_heads, " = ", head_dim());
  }
  MZ_REQUIRE(num_query_groups >= 0, "--num-query-groups must be positive, got ", num_query_groups);
  MZ_REQUIRE(num_attention_heads % query_groups() == 0, "--num-attention-heads ", num_attention_heads,
             " is not divisible by --num-query-groups ", query_groups(),
             "; each key/value head serves an equal number of query heads");
  MZ_REQUIRE(query_groups() % tp == 0, "--num-query-groups ", query_groups(),
             " is not divisible by --tensor-model-parallel-size ", tp,
             "; each TP rank holds whole query groups (their query, key and value heads): choose a TP size that "
             "divides the group count");
  MZ_REQUIRE(!sequence_parallel || tp == 1 || seq_length % tp == 0, "--sequence-parallel splits the sequence over ",
             "the TP group, but --seq-length ", seq_length, " is not divisible by --tensor-model-parallel-size ", tp,
             "; choose a sequence length that is");
  MZ_REQUIRE(ffn() % tp == 0, "the MLP width ", ffn(), " is not divisible by --tensor-model-parallel-size ", tp);
  MZ_REQUIRE(vocab_size > 0, "the vocabulary size must be positive, got ", vocab_size);
  MZ_REQUIRE(make_vocab_size_divisible_by > 0, "--make-vocab-size-divisible-by must be positive");
  MZ_REQUIRE(seq_length > 0, "--seq-length must be positive, got ", seq_length);
  MZ_REQUIRE(max_position_embeddings > 0, "--max-position-embeddings must be positive");
  MZ_REQUIRE(seq_length <= max_position_embeddings, "--seq-length ", seq_length,
             " is longer than --max-position-embeddings ", max_position_embeddings,
             "; raise --max-position-embeddings or shorten --seq-length");
  MZ_REQUIRE(hidden_dropout >= 0 && hidden_dropout < 1, "--hidden-dropout must be in [0, 1), got ", hidden_dropout);
  MZ_REQUIRE(attention_dropout >= 0 && attention_dropout < 1, "--attention-dropout must be in [0, 1), got ",
             attention_dropout);
  MZ_REQUIRE(!forward_epilogues(gemm_epilogues) || add_bias_linear,
             "--gemm-epilogues fuses the linear layers' biases into their GEMMs, and --disable-bias-linear leaves "
             "them none: drop one of the two");
  MZ_REQUIRE(!forward_epilogues(gemm_epilogues) || bias_gelu_fusion,
             "--gemm-epilogues fuses fc1's bias and the GeLU into the GEMM, --no-bias-gelu-fusion asks for them in "
             "separate passes: drop one of the two");
  MZ_REQUIRE(attention_backend == "unfused" || attention_backend == "fused" || attention_backend == "cudnn",
             "--attention-backend must be unfused, fused or cudnn (or Megatron's auto, flash or local), got '",
             attention_backend, "'");
  MZ_REQUIRE(recompute_num_layers >= 0 && recompute_num_layers <= num_layers,
             "--recompute-num-layers with --recompute-method block is how many of the first layers recompute: 1 to "
             "--num-layers ",
             num_layers, ", got ", recompute_num_layers);
  MZ_REQUIRE(recompute_num_layers == 0 || recompute_activations,
             "--recompute-method block --recompute-num-layers chooses the layers of full recompute: add "
             "--recompute-activations (or --recompute-granularity full)");
  MZ_REQUIRE(recompute_chunk >= 1 && recompute_chunk <= num_layers,
             "--recompute-num-layers with --recompute-method uniform is how many layers recompute together from one "
             "kept input: 1 to --num-layers ",
             num_layers, ", got ", recompute_chunk);
  MZ_REQUIRE(recompute_chunk == 1 || (recompute_activations && recompute_num_layers == 0),
             "--recompute-method uniform --recompute-num-layers N chunks the layers of full recompute: add "
             "--recompute-activations (or --recompute-granularity full); it does not combine with block");
  MZ_REQUIRE(!(recompute_activations && recompute_core_attention),
             "--recompute-granularity selective (the attention probabilities only) and full recompute "
             "(--recompute-activations) are two granularities: choose one");
  MZ_REQUIRE(std::isfinite(layernorm_epsilon) && layernorm_epsilon > 0 && layernorm_epsilon < 1,
             "--norm-epsilon must be a small positive number (GPT-2, Llama 2: 1e-5), got ", layernorm_epsilon);
}

}  // namespace megazero::layers
