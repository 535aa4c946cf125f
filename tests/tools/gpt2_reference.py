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
import argparse
import json
import os
import struct
import sys

try:
    import numpy as np
except ImportError:
    print("SKIP: numpy is not installed (apt-get install python3-numpy; tools/install_deps.sh does)")
    sys.exit(77)


def fail(msg):
    print("gpt2_reference: FAIL: " + msg)
    sys.exit(1)


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        fail(f"{path}: shorter than a safetensors header")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        fail(f"{path}: header length {n} beyond the file")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    if meta.get("format") != "pt":
        fail(f"{path}: __metadata__ lacks format 'pt' (transformers refuses such files): {meta}")
    kinds = {"F32": ("<f4", 4), "F64": ("<f8", 8), "F16": ("<f2", 2), "BF16": ("<u2", 2)}
    tensors, spans = {}, []
    for name, e in header.items():
        if e["dtype"] not in kinds:
            fail(f"{path}: tensor {name} has dtype {e['dtype']}")
        fmt, size = kinds[e["dtype"]]
        begin, end = e["data_offsets"]
        count = int(np.prod(e["shape"], dtype=np.int64))
        if end - begin != count * size or end > len(data):
            fail(f"{path}: tensor {name}: offsets {begin}..{end} do not hold shape {e['shape']} x {size} bytes")
        raw = np.frombuffer(data[begin:end], dtype=fmt)
        if e["dtype"] == "BF16":  # the top half of an fp32
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = raw.astype(np.float64).reshape(e["shape"])
        spans.append((begin, end))
    spans.sort()
    for (_, e0), (b1, _) in zip(spans, spans[1:]):
        if b1 < e0:
            fail(f"{path}: overlapping tensors")
    return tensors


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="directory with model.safetensors and config.json")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--compare", required=True, help="logits from `convert_checkpoint logits`")
    ap.add_argument("--tol", type=float, default=1e-4, help="max |diff| / max |logit|")
    a = ap.parse_args()
    with open(os.path.join(a.model, "config.json")) as f:
        cfg = json.load(f)
    check_config(cfg)
    t = read_safetensors(os.path.join(a.model, "model.safetensors"))
    shapes = expected_shapes(cfg)
    if set(t) != set(shapes):
        fail(f"tensor names differ from GPT-2's: missing {sorted(set(shapes) - set(t))}, "
             f"unexpected {sorted(set(t) - set(shapes))}")
    for name, shape in shapes.items():
        if list(t[name].shape) != shape:
            fail(f"{name} is {list(t[name].shape)}, GPT-2 of this config needs {shape}")
    ids = [int(x) for x in a.tokens.split(",")]
    ref = gpt2_logits(t, cfg, ids)
    with open(a.compare) as f:
        S, V = (int(x) for x in f.readline().split())
        ours = np.loadtxt(f, dtype=np.float64, ndmin=2)
    if (S, V) != ref.shape or ours.shape != ref.shape:
        fail(f"logits shapes differ: ours {ours.shape} (header {S}x{V}), reference {ref.shape}")
    scale = np.abs(ref).max()
    diff = np.abs(ours - ref).max()
    rel = diff / max(scale, 1e-30)
    verdict = "match" if rel <= a.tol else "DIFFER"
    print(f"gpt2_reference: logits [{S}, {V}] {verdict}: max |ours - reference| = {diff:.3e}, "
          f"{rel:.3e} of max |logit| {scale:.4f} (tolerance {a.tol:g}); "
          f"argmax agrees on {int((ours.argmax(1) == ref.argmax(1)).sum())}/{S} positions")
    sys.exit(0 if rel <= a.tol else 1)


if __name__ == "__main__":
    main()
