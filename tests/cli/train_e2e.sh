#!/usr/bin/env bash
# train_e2e.sh PRETRAIN_GPT DATA_PREFIX CONFIG [FLAGS...]: trains a tiny GPT through the
# real executable on 4 ranks (TP 2 x DP 2, ZeRO stage 2) on the bundled corpus
# and passes if the loss ends well below where it started (by at least 1 nat)
# and a validation loss is reported. FLAGS go to pretrain_gpt as well.
set -u
exe=$1 data=$2 cfg=$3
shift 3
if [ ! -f "$data.idx" ]; then
  echo "train_e2e: $data.idx is missing; run tools/setup_data.sh (tools/run_tests.sh does)" >&2
  exit 1
fi
out=$(mpiexec -n 4 "$exe" --config "$cfg" --data-path "$data" --tensor-model-parallel-size 2 --zero-stage 2 \
  --hidden-size 64 --seq-length 32 --max-position-embeddings 32 --global-batch-size 8 --micro-batch-size 4 \
  --train-iters 30 --lr-warmup-iters 3 --log-interval 10 --eval-iters 1 "$@" 2>&1)
rc=$?
echo "$out" | grep -E "iteration|validation|done|error"
[ $rc -eq 0 ] || { echo "train_e2e: exit code $rc" >&2; exit 1; }
line=$(echo "$out" | grep -E "^training done")
first=$(echo "$line" | sed -E 's/.*loss ([0-9.]+) -> ([0-9.]+).*/\1/')
last=$(echo "$line" | sed -E 's/.*loss ([0-9.]+) -> ([0-9.]+).*/\2/')
echo "$line" | grep -q "validation loss [0-9.]" || { echo "train_e2e: no validation loss" >&2; exit 1; }
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }' || { echo "train_e2e: loss $first -> $last did not fall by 1" >&2; exit 1; }
echo "train_e2e: loss $first -> $last"
