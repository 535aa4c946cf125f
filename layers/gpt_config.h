// The shape of a GPT model and its regularisation, with the checks that turn
// impossible combinations into messages naming the flag.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

namespace megazero::layers {

// Which passes next to a linear layer's GEMM run inside it (--gemm-epilogues):
// Forward: QKV's bias, and fc1's bias + GeLU (the GEMM writes pre = x W + b and
// gelu(pre)); the backward runs plain GEMMs and our one-pass GeLU backward with
// fc1's bias gradient. All: also the backward's — the GeLU backward with fc1's
// bias gradient in fc2's input-gradient GEMM (DGELU_BGRAD) and QKV's bias
// gradient in its weight-gradient GEMM (BGRADB). On the H200 (2026-11-26, 355M)
// the forward ones took 1.1 ms off the step's forward and the backward ones
// added 5.1 ms to its backward, so the bare flag means Forward.
enum class GemmEpilogues { None, Forward, All };
inline bool forward_epilogues(GemmEpilogues e) { return e != GemmEpilogues::None; }
inline bool backward_epilogues(GemmEpilogues e) { return e == GemmEpilogues::All; }
const char* gemm_epilogues_name(GemmEpilogues e);  // "none", "forward", "all"
// From the flag's value; anything else is a ConfigError naming the flag.
GemmEpilogues parse_gemm_epilogues(const std::string& value);

struct GPTConfig {
  std::int64_t num_layers = 2;                  // --num-layers
  std::int64_t hidden_size = 64;                // --hidden-size
  std::int64_t num_attention_heads = 4;         // --num-attention-heads
  std::int64_t ffn_hidden_size = 0;             // 0 = 4 x hidden
  std::int64_t vocab_size = 50257;              // from the tokenizer
  std::int64_t max_position_embeddings = 1024;  // --max-position-embeddings
  std::int64_t seq_length = 1024;               // --seq-length
  double hidden_dropout = 0.1;                  // --hidden-dropout
  double attention_dropout = 0.1;               // --attention-dropout
  double layernorm_epsilon = 1e-5;
  double init_method_std = 0.02;  // GPT-2: normal(0, 0.02)
  // --init-method-xavier-uniform: every weight U(-a, a) instead (parameter.h's Init).
  bool init_xavier_uniform = false;
  // Activation recompute (checkpointing), Megatron's two granularities:
  // full: a layer keeps only its input and re-runs its forward in backward
  // (--recompute-activations, --recompute-granularity full), in every layer
  // or, with --recompute-method block --recompute-num-layers N, in the first N
  // (recompute_num_layers; 0 = every layer), or with --recompute-method
  // uniform --recompute-num-layers N in chunks of N layers that keep one
  // input together (recompute_chunk); selective: only the unfused
  // attention's [S, S] probabilities are dropped after forward and recomputed
  // from the kept q and k in backward (--recompute-granularity selective;
  // the fused backends keep none to drop).
  bool recompute_activations = false;
  std::int64_t recompute_num_layers = 0;
  std::int64_t recompute_chunk = 1;
  bool recompute_core_attention = false;
  // --attention-backend: "unfused" materialises the [S, S] probabilities (as
  // the paper's Megatron did, and as its activation-memory formula counts);
  // "fused" never does (kernels/fused_attention.h); "cudnn" is cuDNN's fused
  // attention on CUDA (kernels/cudnn_attention.h: its own dropout mask).
  std::string attention_backend = "unfused";
  // --deterministic-mode (Megatron's flag): kernels that could differ in the
  // last bits from run to run take their deterministic variant. Every other
  // kernel already is; it selects cuDNN's deterministic attention backward.
  bool deterministic = false;
  // Megatron's bias-GeLU fusion in the MLP (on by default, as there;
  // --no-bias-gelu-fusion). On the CPU fp32 results are the same bits either
  // way (on a GPU the bias gradient's double sums may group differently: last
  // bit); with 16-bit storage the fused path rounds once fewer (y + bias stays fp32).
  bool bias_gelu_fusion = true;
  // --gemm-epilogues[=forward|all]: the linear layers' GEMMs take the pass that
  // follows them as cuBLASLt epilogues on CUDA (kernels/linear_epilogues.h);
  // the same math as separate passes elsewhere. It replaces the bias-GeLU
  // fusion in the MLP's forward (GemmEpilogues).
  GemmEpilogues gemm_epilogues = GemmEpilogues::None;
  std::int64_t make_vocab_size_divisible_by = 128;  // padded to a multiple of this x TP

  // Modern decoder options (Megatron's flag names; all off = GPT-2).
  std::string position_embedding_type = "learned_absolute";  // --position-embedding-type: or "rope"
  double rotary_base = 10000;                                // --rotary-base (rope only)
  // --rotary-seq-len-interpolation-factor (Megatron's; Hugging Face's linear
  // rope_scaling): positions divided by it before the angles (rope only).
  double rotary_interpolation_factor = 1;
  // --use-rope-scaling --rope-scaling-factor (Megatron's; Llama 3.x's
  // rope_type llama3): the low frequencies divided by the factor, the
  // medium ones blended (kernels/rope_frequencies.h); rope only.
  bool use_rope_scaling = false;
  double rope_scaling_factor = 8;
  std::string normalization = "LayerNorm";  // --normalization: or "RMSNorm"
  bool swiglu = false;                      // --swiglu: MLP = fc2(silu(x Wg) * (x Wu))
  bool squared_relu = false;                // --squared-relu: MLP = fc2(relu(x W1 + b1)^2) (Nemotron's)
  bool rotary_interleaved = false;          // --rotary-interleaved: rope pairs (2i, 2i + 1), kernels/rope.h
  // --num-query-groups with --group-query-attention: K/V heads shared by
  // groups of query heads (GQA); 0 = one K/V head per query head (MHA).
  std::int64_t num_query_groups = 0;
  bool add_bias_linear = true;  // --disable-bias-linear clears it: no bias in any linear layer
  // --add-qkv-bias (Megatron's; Qwen2's): the QKV projection keeps its bias
  // under --disable-bias-linear (without it, every linear has one anyway).
  bool add_qkv_bias = false;
  bool qkv_bias() const { return add_bias_linear || add_qkv_bias; }
  bool untie_embeddings = false;  // --untie-embeddings-and-output-weights: own output-layer weight
  // --qk-layernorm (Megatron's): q and k normalised per head (--normalization's
  // kind, a [head size] weight each shared by all heads) before the rotary
  // embedding and the scores.
  bool qk_layernorm = false;
  // --apply-layernorm-1p (Megatron's; Transformer Engine's zero-centred
  // gamma): every norm's weight w is stored as gamma - 1 (initialised to 0)
  // and applied as 1 + w, so the stored values stay near 0 where 16-bit
  // numbers are finest.
  bool layernorm_1p = false;
  // --apply-residual-connection-post-layernorm (Megatron's legacy layer):
  // each sub-block's residual is its norm's output instead of its input,
  // x1 = ln1(x) + attn(ln1(x)), out = ln2(x1) + mlp(ln2(x1)).
  bool residual_post_norm = false;
  // --sequence-parallel (Megatron's; Korthikanti et al. 2022): at TP > 1 the
  // norms, dropouts and residual stream hold 1/TP of the tokens per rank.
  bool sequence_parallel = false;

  // The MLP width: --ffn-hidden-size, else 4 x hidden, or with SwiGLU
  // Megatron's 2/3 of that rounded down to a multiple of 64 (two input
  // projections keep the parameter count near the 4h MLP's).
  std::int64_t ffn() const;
  std::int64_t head_dim() const { return hidden_size / num_attention_heads; }
  std::int64_t query_groups() const { return num_query_groups > 0 ? num_query_groups : num_attention_heads; }
  bool rope() const { return position_embedding_type == "rope"; }
  double rope_position_scale() const { return 1.0 / rotary_interpolation_factor; }
  double rope_llama3_factor() const { return use_rope_scaling ? rope_scaling_factor : 0.0; }
  bool rmsnorm() const { return normalization == "RMSNorm"; }
  // Whether layer `layer` (0-based) keeps only its input and recomputes the
  // rest (full recompute), and how many layers do.
  bool recomputes_layer(std::int64_t layer) const {
    return recompute_activations && (recompute_num_layers == 0 || layer < recompute_num_layers);
  }
  std::int64_t recomputed_layers() const {
    return !recompute_activations ? 0 : recompute_num_layers == 0 ? num_layers : recompute_num_layers;
  }
  // Full recompute keeps one input per chunk of recompute_chunk layers (one
  // layer each but with --recompute-method uniform --recompute-num-layers N):
  // the chunk's first layer keeps it, in checkpoint slot layer / chunk, and
  // the backward remakes the chunk's activations from it once it reaches the
  // chunk's last layer.
  std::int64_t checkpoint_slot(std::int64_t layer) const { return layer / recompute_chunk; }
  std::int64_t checkpoint_slots() const { return (recomputed_layers() + recompute_chunk - 1) / recompute_chunk; }
  bool keeps_checkpoint(std::int64_t layer) const { return recomputes_layer(layer) && layer % recompute_chunk == 0; }
  std::int64_t chunk_last_layer(std::int64_t layer) const {
    return std::min((layer / recompute_chunk + 1) * recompute_chunk, recomputed_layers()) - 1;
  }
  // For the start-up log: "off", "full, every layer", "full, the first 4 of
  // 24 layers (--recompute-method block)", "selective (...)".
  std::string recompute_summary() const;
  // Parameters of the whole model (global, unpadded vocabulary): the paper's Psi.
  std::int64_t parameter_count() const;
  bool fused_attention() const { return attention_backend == "fused"; }
  bool cudnn_attention() const { return attention_backend == "cudnn"; }
  // Padded vocabulary for a TP degree (Megatron's rule); padding is masked out
  // of the softmax, so results do not depend on it.
  std::int64_t padded_vocab(int tp) const;
  // Throws ConfigError naming the flag for anything impossible at this TP size.
  void validate(int tp) const;
};

}  // namespace megazero::layers
