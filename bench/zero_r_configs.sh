#!/usr/bin/env bash
# The paper's ZeRO-R configurations C1..C5 (plus stage 2 with plain recompute
# as the reference) on one layout: activation memory per rank and step time.
#   bash bench/zero_r_configs.sh [RANKS=8] [TP=2] -- extra pretrain_gpt flags
# Prints one markdown row per configuration (docs/PERFORMANCE.md).
set -euo pipefail
ranks=${1:-8} tp=${2:-2}
shift $(( $# >= 2 ? 2 : $# )) || true
[ "${1:-}" = "--" ] && shift
exe=${PRETRAIN_GPT:-build/examples/pretrain_gpt}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
model=(--config configs/gpt_tiny.cfg --mock-data --vocab-size 256 --num-layers 4 --hidden-size 256
       --num-attention-heads 8 --seq-length 256 --max-position-embeddings 256 --micro-batch-size 2
       --global-batch-size 16 --train-iters 4 --log-interval 1 --eval-iters 0)
echo "| config | flags | activations peak MiB | checkpoints on device MiB | checkpoints in host MiB | peak total MiB | first-fit heap peak MiB (lost to fragmentation) | ms/iteration (iterations 2-4) |"
echo "|---|---|---|---|---|---|---|---|"
for c in base C1 C2 C3 C4 C5; do
  flags=(--zero-stage 2 --recompute-activations)
  [ "$c" != base ] && flags=(--zero-config "$c")
  OMP_NUM_THREADS=1 mpiexec -n "$ranks" "$exe" "${model[@]}" --tensor-model-parallel-size "$tp" "${flags[@]}" \
    --metrics-file "$out/$c.jsonl" "$@" >"$out/$c.log" 2>&1 || { echo "| $c | failed: see below |"; tail "$out/$c.log"; continue; }
  /usr/bin/python3 - "$out/$c.jsonl" "$c" "${flags[*]}" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
mib = lambda b: b / 1048576.0
last = recs[-1]
ms = sum(r["ms_per_iteration"] for r in recs[1:]) / max(1, len(recs) - 1)
print(f"| {sys.argv[2]} | `{sys.argv[3]}` | {mib(last['activations_peak_bytes']):.2f} | {mib(last['checkpoints_peak_bytes']):.2f} | "
      f"{mib(last['host_checkpoints_peak_bytes']):.2f} | {mib(last['peak_memory_bytes']):.2f} | "
      f"{mib(last['first_fit_heap_peak_bytes']):.2f} ({mib(last['first_fit_heap_peak_bytes'] - last['peak_memory_bytes']):.2f}) | {ms:.0f} |")
PY
done
