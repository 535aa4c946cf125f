#!/usr/bin/env bash
# stop_during_startup.sh PRETRAIN_GPT: SIGTERM to one rank while the model is
# still being built (10,000 layers: seconds of start-up) ends the whole job
# within seconds with exit code 5 and says why, instead of waiting for a step
# boundary that is far away (there is no state to save yet).
set -u
exe=$1
work=$(mktemp -d /tmp/mz-stop-startup-XXXXXX)
trap 'rm -rf "$work"' EXIT
( timeout 120 mpiexec -n 2 "$exe" --num-layers 10000 --hidden-size 64 --num-attention-heads 1 --seq-length 8 \
    --max-position-embeddings 8 --mock-data --vocab-size 16 --train-iters 1 --eval-iters 0 --micro-batch-size 1 \
    --seed 4242 >"$work/run.log" 2>&1
  echo $? >"$work/rc" ) &
for _ in $(seq 1 600); do
  grep -q "^collectives:" "$work/run.log" 2>/dev/null && break
  sleep 0.01
done
grep -q "^collectives:" "$work/run.log" || { echo "stop_during_startup: FAIL: the run never started"; cat "$work/run.log"; exit 1; }
sent=$(date +%s%N)
pkill -TERM -n -f "^$exe --num-layers 10000 .*--seed 4242"
wait
took=$(( ($(date +%s%N) - sent) / 1000000 ))
rc=$(cat "$work/rc")
[ "$rc" = 5 ] || { echo "stop_during_startup: FAIL: exit code $rc, expected 5"; cat "$work/run.log"; exit 1; }
grep -q "stop signal during start-up (no training state to save yet)" "$work/run.log" ||
  { echo "stop_during_startup: FAIL: no message"; cat "$work/run.log"; exit 1; }
grep -q "^ iteration" "$work/run.log" && { echo "stop_during_startup: FAIL: it trained first"; exit 1; }
[ "$took" -lt 10000 ] || { echo "stop_during_startup: FAIL: took $took ms"; exit 1; }
echo "stop_during_startup: SIGTERM during model construction: the job ended in $took ms, exit 5"
