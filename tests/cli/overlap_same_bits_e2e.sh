#!/usr/bin/env bash
# overlap_same_bits_e2e.sh PRETRAIN_GPT CONFIG DEVICE: what the overlaps move
# (the stage 0 update beside the next forward, --overlap-optimizer; the stage
# 1-2 parameter all-gather during it, --overlap-param-gather) changes no bit a
# user sees. For each, two runs of 2 ranks (20 iterations, validation and a
# save every 10) with and without must log the same losses and write
# byte-identical checkpoint shards, and a resume from iteration 10 with the
# overlap must end with the uninterrupted run's shards.
#
# On cpu-isolated the update's queued work runs only when something orders
# after it, so a read without that ordering would change the bits here; on
# cuda (tools/gpu_session.sh paths) it runs on a real side stream.
set -u
exe=$1 cfg=$2 device=$3
# shellcheck source=e2e_common.sh
source "$(dirname "$0")/e2e_common.sh"
tmp=$(mktemp -d)
trap '[ -n "${MZ_KEEP:-}" ] || rm -rf "$tmp"' EXIT
fail() {
  echo "overlap_same_bits_e2e: $*" >&2
  exit 1
}

train() {  # train NAME ITERS FLAG...: a run saving into $tmp/NAME
  local name=$1 iters=$2
  shift 2
  timeout "$run_timeout" mpiexec -n 2 "$exe" --config "$cfg" --mock-data --vocab-size 256 --device "$device" \
    --train-iters "$iters" --log-interval 1 --eval-interval 10 --eval-iters 1 --save "$tmp/$name" \
    --save-interval 10 "${watchdog[@]}" "$@" >"$tmp/$name.log" 2>&1 || {
    cat "$tmp/$name.log" >&2
    fail "$name: exit $?"
  }
}
losses() { grep -oE "(lm loss|validation loss at iteration [0-9]+:) [0-9.E+-]+" "$tmp/$1.log"; }
shards() {  # the checkpoint's shards of iteration $2, in a fixed order, as one byte stream
  (cd "$tmp/$1/$(printf 'iter_%07d' "$2")" && find . -name '*.safetensors' | sort | xargs cat)
}
same_run() {  # same_run A B: same losses and the same shards at both saves
  [ "$(losses "$1")" = "$(losses "$2")" ] || fail "$1 and $2 logged different losses"
  [ -n "$(losses "$1")" ] || fail "$1 logged no loss"
  for it in 10 20; do
    cmp -s <(shards "$1" $it) <(shards "$2" $it) || fail "$1 and $2 saved different shards at iteration $it"
  done
}

for case in "stage0 --overlap-optimizer --zero-stage 0" "stage2 --overlap-param-gather=true --zero-stage 2"; do
  read -r name flag stage <<<"$case"
  off=$flag
  [ "$name" = stage0 ] && { flag="$flag true"; off="--overlap-optimizer false"; }
  [ "$name" = stage2 ] && off="--overlap-param-gather=false"
  # shellcheck disable=SC2086
  train "$name-off" 20 $stage $off
  # shellcheck disable=SC2086
  train "$name-on" 20 $stage $flag
  same_run "$name-off" "$name-on"
  # Resumed from iteration 10 with the overlap: the uninterrupted run's shards at 20.
  mkdir -p "$tmp/$name-resumed" && cp -r "$tmp/$name-on/$(printf 'iter_%07d' 10)" "$tmp/$name-resumed/"
  printf 'iter_%07d\n' 10 >"$tmp/$name-resumed/latest"
  # shellcheck disable=SC2086
  train "$name-resumed" 20 $stage $flag --load "$tmp/$name-resumed"
  grep -qE "loaded checkpoint .*iter_0000010: iteration 10" "$tmp/$name-resumed.log" || fail "$name: did not resume at 10"
  cmp -s <(shards "$name-on" 20) <(shards "$name-resumed" 20) || fail "$name: the resumed run's shards differ"
  echo "overlap_same_bits_e2e: $name on $device: same losses and shards with and without ($flag), and resumed"
done
