"""What the independent Hugging Face references (gpt2_reference.py,
llama_reference.py) share: their own safetensors parser (the 8-byte header
length, the JSON header, the raw little-endian data; no library of ours or
Hugging Face's), the checks of a model's tensor names and shapes, and the
comparison with the logits `convert_checkpoint logits` wrote.
Exit codes of the scripts: 0 match; 1 mismatch or a malformed export; 77
numpy missing (skip).
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

NAME = "reference"  # the script's name, for messages


def fail(msg):
    print(f"{NAME}: FAIL: " + msg)
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


def check_tensors(t, shapes, family):
    if set(t) != set(shapes):
        fail(f"tensor names differ from {family}'s: missing {sorted(set(shapes) - set(t))}, "
             f"unexpected {sorted(set(t) - set(shapes))}")
    for name, shape in shapes.items():
        if list(t[name].shape) != shape:
            fail(f"{name} is {list(t[name].shape)}, a {family} of this config needs {shape}")


def compare_logits(ref, path, tol):
    """Exits 0 when the logits in `path` are within tol x max |logit| of ref, else 1."""
    with open(path) as f:
        S, V = (int(x) for x in f.readline().split())
        ours = np.loadtxt(f, dtype=np.float64, ndmin=2)
    if (S, V) != ref.shape or ours.shape != ref.shape:
        fail(f"logits shapes differ: ours {ours.shape} (header {S}x{V}), reference {ref.shape}")
    scale = np.abs(ref).max()
    diff = np.abs(ours - ref).max()
    rel = diff / max(scale, 1e-30)
    verdict = "match" if rel <= tol else "DIFFER"
    print(f"{NAME}: logits [{S}, {V}] {verdict}: max |ours - reference| = {diff:.3e}, "
          f"{rel:.3e} of max |logit| {scale:.4f} (tolerance {tol:g}); "
          f"argmax agrees on {int((ours.argmax(1) == ref.argmax(1)).sum())}/{S} positions")
    sys.exit(0 if rel <= tol else 1)


def check_greedy(logits_of, prompt, generated, tol):
    """Exits 0 when every generated token (greedy, `generate_text --greedy`) is
    the reference's most likely next token within tol x max |logit| of its
    prefix (ours ran in fp32: a near tie may fall either way), else 1. Each
    prefix is the prompt and the tokens ours drew before it."""
    seq = list(prompt)
    for k, t in enumerate(generated):
        row = logits_of(seq)[-1]
        gap = row.max() - row[t]
        if gap > tol * max(np.abs(row).max(), 1e-30):
            fail(f"generated token {k} is {t} (reference logit {row[t]:.6f}), but the reference's most likely "
                 f"after {len(seq)} tokens is {int(row.argmax())} ({row.max():.6f})")
        seq.append(t)
    print(f"{NAME}: greedy generation of {len(generated)} tokens: each the reference's most likely next token")
    sys.exit(0)


def main(family, check_config, expected_shapes, logits):
    """The command line both references share: read OUTDIR's config.json and
    model.safetensors, check them as `family` needs, compute the logits of
    --tokens with logits(tensors, config, ids) and compare with --compare."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="directory with model.safetensors and config.json")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--compare", help="logits from `convert_checkpoint logits`")
    ap.add_argument("--generated", help="instead of --compare: the tokens `generate_text --greedy` drew after "
                    "--tokens, comma-separated")
    ap.add_argument("--tol", type=float, default=1e-4, help="max |diff| / max |logit|")
    a = ap.parse_args()
    with open(os.path.join(a.model, "config.json")) as f:
        cfg = json.load(f)
    check_config(cfg)
    t = read_safetensors(os.path.join(a.model, "model.safetensors"))
    check_tensors(t, expected_shapes(cfg), family)
    ids = [int(x) for x in a.tokens.split(",")]
    if (a.compare is None) == (a.generated is None):
        fail("give --compare LOGITS_FILE or --generated IDS")
    if a.generated is not None:
        check_greedy(lambda seq: logits(t, cfg, seq), ids, [int(x) for x in a.generated.split(",")], a.tol)
    compare_logits(logits(t, cfg, ids), a.compare, a.tol)
