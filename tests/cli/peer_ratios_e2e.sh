#!/usr/bin/env bash
# peer_ratios_e2e.sh PRETRAIN_GPT CONFIG: the ratio tool a GPU session's peers
# phase relies on (tools/peer_ratios.py), against what our trainer really
# writes. A short CPU run's --metrics-file becomes the "ours" line; synthetic
# PyTorch lines (the format bench/torch_gpt.py and torch_layer.py print) are
# the peers. Checks: the line's fields, the speed ratio (tokens/s), the #21
# goal verdicts (met / not met / n/a for a missing run), and bench_layer-style
# lines. A rename in the metrics file or in the tool fails here, not on a
# rare GPU lease.
set -euo pipefail
train=$1 cfg=$2
tool="$(dirname "$0")/../../tools/peer_ratios.py"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "peer_ratios_e2e: FAIL: $*"; exit 1; }

OMP_NUM_THREADS=1 "$train" --config "$cfg" --mock-data --vocab-size 256 --train-iters 4 --log-interval 2 \
  --metrics-file "$work/m.jsonl" > "$work/train.log" 2>&1 || { cat "$work/train.log"; fail "training run"; }
python3 "$tool" --from-metrics "$work/m.jsonl" --impl megazero-cudnn > "$work/ours.jsonl"
python3 - "$work/ours.jsonl" "$work/m.jsonl" <<'PY' || fail "the from-metrics line"
import json, sys
ours = json.loads(open(sys.argv[1]).read())
last = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")][-1]
assert ours["bench"] == "gpt" and ours["impl"] == "megazero-cudnn", ours
assert abs(ours["ms"] - last["ms_per_iteration"]) < 1e-3, (ours, last)
assert abs(ours["tokens_per_s"] - last["tokens_per_s"]) < 0.1, (ours, last)
assert abs(ours["mfu"] - last["mfu"]) < 1e-4 and ours["iteration"] == 4, (ours, last)
assert abs(ours["peak_mib"] - last["peak_memory_bytes"] / 2**20) < 0.1, (ours, last)
PY

# The goal verdict must not hang on this machine's speed: a tiny CPU run's MFU (against the CPU's
# default peak) can come out either side of 40%, so ours is set to 30% from here on.
python3 - "$work/ours.jsonl" <<'PY'
import json, sys
o = json.loads(open(sys.argv[1]).read())
o["mfu"] = 0.30
open(sys.argv[1], "w").write(json.dumps(o) + "\n")
PY

# The peers, scaled from ours: torch.compile's median step 1.25x ours and its mean step 1.3x
# (the mean is compared: ours is a mean too), eager 1.1x faster (a line from before torch_gpt.py
# printed the mean: its median is taken).
python3 - "$work/ours.jsonl" > "$work/peers.log" <<'PY'
import json, sys
o = json.loads(open(sys.argv[1]).read())
def peer(impl, f, peak, mean_f=None):
    r = {"bench": "gpt", "impl": impl, "ms": o["ms"] * f, "tokens_per_s": o["tokens_per_s"] / f,
         "mfu": o["mfu"] / f, "peak_mib": peak, "dtype": "bf16"}
    if mean_f:
        r.update(mean_ms=o["ms"] * mean_f, mean_tokens_per_s=o["tokens_per_s"] / mean_f, mean_mfu=o["mfu"] / mean_f)
    return json.dumps(r)
print("== theirs: some log text around the lines")
print(peer("torch-compile", 1.25, o["peak_mib"] * 2, 1.3))
print(peer("torch-eager", 1 / 1.1, o["peak_mib"] * 2))
print(json.dumps({"bench": "layer", "impl": "megazero", "attention": "fused", "ms": 20.0, "mfu": 0.55, "dtype": "bf16"}))
print(json.dumps({"bench": "layer", "impl": "torch-sdpa-compile", "ms": 22.0, "mfu": 0.5, "dtype": "bf16"}))
PY
cat "$work/ours.jsonl" >> "$work/peers.log"
python3 "$tool" "$work/peers.log" > "$work/table.txt"
cat "$work/table.txt"
grep -Eq "megazero-cudnn +torch-compile .* 1\.300x" "$work/table.txt" || fail "speed ratio vs torch-compile (the mean)"
grep -Eq "megazero-cudnn +torch-eager .* 0\.909x" "$work/table.txt" || fail "speed ratio vs torch-eager"
# Ours at 30% MFU: the speed part is met, the goal as a whole is not.
grep -Eq "goal #21, megazero-cudnn: speed vs torch-compile 1\.3000x .* -> not met" "$work/table.txt" ||
  fail "the 355M goal verdict"
grep -Eq "goal #21, megazero-unfused: .* -> n/a" "$work/table.txt" || fail "a missing run's verdict"
grep -Eq "megazero-fused +torch-sdpa-compile .* 1\.100x" "$work/table.txt" || fail "layer ratio"
grep -Eq "goal #21, megazero-fused: speed vs torch-sdpa-compile 1\.1000x .* -> MET" "$work/table.txt" ||
  fail "the layer goal verdict"
echo "peer_ratios_e2e: the metrics line, ratios and goal verdicts are right"
