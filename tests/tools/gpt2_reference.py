#!/usr/bin/python3
"""An independent GPT-2 forward pass over an exported Hugging Face model.

Reads OUTDIR/model.safetensors (with its own parser: the 8-byte header length,
the JSON header, the raw little-endian data) and OUTDIR/config.json, checks them
the way transformers' GPT2LMHeadModel.from_pretrained would need them (format
metadata "pt", exactly the expected tensor names and shapes), and computes the
logits as Hugging Face's modeling_gpt2 does, in float64:

  h = wte[ids] + wpe[0..S)
  per block:  a = LN_1(h); qkv = a @ c_attn.W + c_attn.b (Conv1D: W is [in, out]);
              q, k, v = the three n_embd-wide column blocks, each split into heads
              [head][head_dim]; scores = q k^T / sqrt(head_dim); causal mask;
              softmax; context merged back to [S, n_embd]; h += ctx @ c_proj.W + b
              m = LN_2(h); h += gelu_new(m @ c_fc.W + b) @ mlp.c_proj.W + b
  logits = LN_f(h) @ wte^T  (lm_head tied to wte)

LayerNorm uses the biased variance and config.layer_norm_epsilon; gelu_new is
0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).

Compares with logits written by `convert_checkpoint logits` (our model, fp32).
Exit 0: match; 1: mismatch or a malformed export; 77: numpy is missing (skip).

  gpt2_reference.py --model OUTDIR --tokens 1,2,3 --compare logits.txt [--tol 1e-4]
"""
import hf_reference_common as common
from hf_reference_common import fail, np

common.NAME = "gpt2_reference"


def expected_shapes(cfg):
    E, V, P, L = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"], cfg["n_layer"]
    F = cfg.get("n_inner") or 4 * E
    shapes = {"wte.weight": [V, E], "wpe.weight": [P, E], "ln_f.weight": [E], "ln_f.bias": [E]}
    for i in range(L):
        p = f"h.{i}."
        shapes.update({p + "ln_1.weight": [E], p + "ln_1.bias": [E], p + "ln_2.weight": [E], p + "ln_2.bias": [E],
                       p + "attn.c_attn.weight": [E, 3 * E], p + "attn.c_attn.bias": [3 * E],
                       p + "attn.c_proj.weight": [E, E], p + "attn.c_proj.bias": [E],
                       p + "mlp.c_fc.weight": [E, F], p + "mlp.c_fc.bias": [F],
                       p + "mlp.c_proj.weight": [F, E], p + "mlp.c_proj.bias": [E]})
    return shapes


def check_config(cfg):
    want = {"model_type": "gpt2", "tie_word_embeddings": True, "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False}
    for k, v in want.items():
        if cfg.get(k, v) != v:
            fail(f"config.json: {k} is {cfg.get(k)!r}, expected {v!r}")
    if "GPT2LMHeadModel" not in cfg.get("architectures", []):
        fail("config.json: architectures lacks GPT2LMHeadModel")
    if cfg.get("activation_function") not in ("gelu_new", "gelu_pytorch_tanh"):
        fail(f"config.json: activation_function {cfg.get('activation_function')!r}")
    if cfg["n_embd"] % cfg["n_head"]:
        fail("config.json: n_embd is not a multiple of n_head")


def layer_norm(x, w, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * np.power(x, 3.0))))


def gpt2_logits(t, cfg, ids):
    E, H, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    hd, S = E // H, len(ids)
    h = t["wte.weight"][ids] + t["wpe.weight"][:S]
    causal = np.tril(np.ones((S, S), dtype=bool))
    for i in range(cfg["n_layer"]):
        p = f"h.{i}."
        a = layer_norm(h, t[p + "ln_1.weight"], t[p + "ln_1.bias"], eps)
        qkv = a @ t[p + "attn.c_attn.weight"] + t[p + "attn.c_attn.bias"]
        q, k, v = (qkv[:, j * E:(j + 1) * E].reshape(S, H, hd).transpose(1, 0, 2) for j in range(3))
        w = q @ k.transpose(0, 2, 1) / np.sqrt(float(hd))
        w = np.where(causal, w, np.finfo(np.float64).min)
        w = np.exp(w - w.max(axis=-1, keepdims=True))
        w = w / w.sum(axis=-1, keepdims=True)
        ctx = (w @ v).transpose(1, 0, 2).reshape(S, E)
        h = h + ctx @ t[p + "attn.c_proj.weight"] + t[p + "attn.c_proj.bias"]
        m = layer_norm(h, t[p + "ln_2.weight"], t[p + "ln_2.bias"], eps)
        m = gelu_new(m @ t[p + "mlp.c_fc.weight"] + t[p + "mlp.c_fc.bias"])
        h = h + m @ t[p + "mlp.c_proj.weight"] + t[p + "mlp.c_proj.bias"]
    h = layer_norm(h, t["ln_f.weight"], t["ln_f.bias"], eps)
    return h @ t["wte.weight"].T


if __name__ == "__main__":
    common.main("GPT-2", check_config, expected_shapes, gpt2_logits)
