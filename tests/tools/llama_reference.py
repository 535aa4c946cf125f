#!/usr/bin/python3
"""An independent Llama forward pass over an exported Hugging Face model.

Reads OUTDIR/model.safetensors (with its own parser, as gpt2_reference.py) and
OUTDIR/config.json, checks them the way transformers' LlamaForCausalLM would
need them (format metadata "pt", exactly the expected tensor names and shapes),
and computes the logits as Hugging Face's modeling_llama does, in float64:

  h = embed_tokens[ids]
  per layer:  a = RMSNorm(h) * input_layernorm.weight
              q = a @ q_proj.W^T (+ b), k, v likewise (nn.Linear: W is [out, in]),
              split into heads [head][head_dim]; num_key_value_heads k/v heads;
              rotary: inv_freq = 1 / rope_theta^(arange(0, d, 2) / d),
              cos/sin of position x inv_freq concatenated twice,
              x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1];
              k, v repeated num_heads / num_key_value_heads times (repeat_kv);
              scores = q k^T / sqrt(head_dim), causal mask, softmax;
              h += context @ o_proj.W^T (+ b)
              m = RMSNorm(h) * post_attention_layernorm.weight
              h += (silu(m @ gate_proj.W^T) * (m @ up_proj.W^T)) @ down_proj.W^T
  logits = RMSNorm(h) * norm.weight @ lm_head.W^T (embed_tokens when tied)

RMSNorm(x) = x / sqrt(mean(x^2) + rms_norm_eps).

rope_scaling {"rope_type": "llama3", ...} (Llama 3.x): inv_freq as
modeling_rope_utils' _compute_llama3_parameters makes it (wavelengths above
original_max_position_embeddings / low_freq_factor divided by factor, those
below / high_freq_factor kept, those between blended).

model_type qwen2 (Qwen2ForCausalLM, modeling_qwen2): the same, with biases on
the q, k and v projections only (o_proj and the MLP have none).
model_type qwen3 (Qwen3ForCausalLM, modeling_qwen3): the same, with each query
and key head RMS-normalised over its head_dim before the rotary embedding
(q = RMSNorm(q_head) * self_attn.q_norm.weight, k likewise with k_norm) and no
MLP biases.

Compares with logits written by `convert_checkpoint logits` (our model, fp32).
Exit 0: match; 1: mismatch or a malformed export; 77: numpy is missing (skip).

  llama_reference.py --model OUTDIR --tokens 1,2,3 --compare logits.txt [--tol 1e-4]
"""
import hf_reference_common as common
from hf_reference_common import fail, np

common.NAME = "llama_reference"


def expected_shapes(cfg):
    E, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    H, KV, F = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"]
    D = cfg.get("head_dim") or E // H
    shapes = {"model.embed_tokens.weight": [V, E], "model.norm.weight": [E]}
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = [V, E]
    qwen3, qwen2 = cfg.get("model_type") == "qwen3", cfg.get("model_type") == "qwen2"
    for i in range(L):
        p = f"model.layers.{i}."
        if qwen3:
            shapes.update({p + "self_attn.q_norm.weight": [D], p + "self_attn.k_norm.weight": [D]})
        shapes.update({p + "input_layernorm.weight": [E], p + "post_attention_layernorm.weight": [E],
                       p + "self_attn.q_proj.weight": [H * D, E], p + "self_attn.k_proj.weight": [KV * D, E],
                       p + "self_attn.v_proj.weight": [KV * D, E], p + "self_attn.o_proj.weight": [E, H * D],
                       p + "mlp.gate_proj.weight": [F, E], p + "mlp.up_proj.weight": [F, E],
                       p + "mlp.down_proj.weight": [E, F]})
        if cfg.get("attention_bias", False) or qwen2:
            shapes.update({p + "self_attn.q_proj.bias": [H * D], p + "self_attn.k_proj.bias": [KV * D],
                           p + "self_attn.v_proj.bias": [KV * D]})
        if cfg.get("attention_bias", False) and not qwen2:
            shapes[p + "self_attn.o_proj.bias"] = [E]
        if cfg.get("mlp_bias", False) and not qwen3 and not qwen2:
            shapes.update({p + "mlp.gate_proj.bias": [F], p + "mlp.up_proj.bias": [F], p + "mlp.down_proj.bias": [E]})
    return shapes


def check_config(cfg):
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}.get(
        cfg.get("model_type"))
    if arch is None:
        fail(f"config.json: model_type is {cfg.get('model_type')!r}, expected 'llama', 'qwen2' or 'qwen3'")
    if arch not in cfg.get("architectures", []):
        fail(f"config.json: architectures lacks {arch}")
    if cfg.get("model_type") != "llama" and cfg.get("use_sliding_window", False):
        fail("config.json: use_sliding_window: the reference attends over the whole sequence")
    if cfg.get("hidden_act") != "silu":
        fail(f"config.json: hidden_act {cfg.get('hidden_act')!r}, expected 'silu'")
    rs = cfg.get("rope_scaling")
    if rs not in (None, {}) and (rs.get("rope_type", rs.get("type")) != "llama3"):
        fail(f"config.json: rope_scaling {rs!r}: the reference knows plain RoPE and llama3's scaling only")
    if cfg["num_attention_heads"] % cfg["num_key_value_heads"]:
        fail("config.json: num_attention_heads is not a multiple of num_key_value_heads")
    for k in ("tie_word_embeddings", "rms_norm_eps", "rope_theta", "max_position_embeddings"):
        if k not in cfg:
            fail(f"config.json: no {k}")


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


def linear(x, t, name):
    y = x @ t[name + ".weight"].T
    return y + t[name + ".bias"] if name + ".bias" in t else y


def llama3_inv_freq(inv_freq, rs):
    """modeling_rope_utils._compute_llama3_parameters: long wavelengths divided by factor, short kept,
    those between blended."""
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * np.pi / inv_freq
    out = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, out)


def rotary(x, theta, rope_scaling=None):  # x: [heads, S, D]
    D, S = x.shape[-1], x.shape[-2]
    inv_freq = 1.0 / (theta ** (np.arange(0, D, 2, dtype=np.float64) / D))
    if rope_scaling:
        inv_freq = llama3_inv_freq(inv_freq, rope_scaling)
    freqs = np.outer(np.arange(S, dtype=np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    half = D // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * np.cos(emb) + rotated * np.sin(emb)


def llama_logits(t, cfg, ids):
    E, H, KV, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["rms_norm_eps"]
    D, S = cfg.get("head_dim") or E // H, len(ids)
    h = t["model.embed_tokens.weight"][ids]
    causal = np.tril(np.ones((S, S), dtype=bool))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms_norm(h, t[p + "input_layernorm.weight"], eps)
        q = linear(a, t, p + "self_attn.q_proj").reshape(S, H, D).transpose(1, 0, 2)
        k = linear(a, t, p + "self_attn.k_proj").reshape(S, KV, D).transpose(1, 0, 2)
        v = linear(a, t, p + "self_attn.v_proj").reshape(S, KV, D).transpose(1, 0, 2)
        if cfg.get("model_type") == "qwen3":  # per-head q/k RMSNorms, before rope
            q = rms_norm(q, t[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, t[p + "self_attn.k_norm.weight"], eps)
        rs = cfg.get("rope_scaling") or None
        q, k = rotary(q, cfg["rope_theta"], rs), rotary(k, cfg["rope_theta"], rs)
        k, v = np.repeat(k, H // KV, axis=0), np.repeat(v, H // KV, axis=0)
        w = q @ k.transpose(0, 2, 1) / np.sqrt(float(D))
        w = np.where(causal, w, np.finfo(np.float64).min)
        w = np.exp(w - w.max(axis=-1, keepdims=True))
        w = w / w.sum(axis=-1, keepdims=True)
        ctx = (w @ v).transpose(1, 0, 2).reshape(S, H * D)
        h = h + linear(ctx, t, p + "self_attn.o_proj")
        m = rms_norm(h, t[p + "post_attention_layernorm.weight"], eps)
        g = linear(m, t, p + "mlp.gate_proj")
        h = h + linear(g / (1.0 + np.exp(-g)) * linear(m, t, p + "mlp.up_proj"), t, p + "mlp.down_proj")
    h = rms_norm(h, t["model.norm.weight"], eps)
    out = t["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else t["lm_head.weight"]
    return h @ out.T


if __name__ == "__main__":
    common.main("Llama", check_config, expected_shapes, llama_logits)
