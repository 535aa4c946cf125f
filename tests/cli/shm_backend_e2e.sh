#!/usr/bin/env bash
# shm_backend_e2e.sh PRETRAIN_GPT CONFIG DEVICE: --distributed-backend shm (the
# shared-memory transport, megazero/comm/shm_collectives.h) trains as MPI's
# messages do, on DEVICE (cpu-isolated in CI: host code never touches device
# memory; cuda in tools/gpu_session.sh zero3: four ranks sharing the GPU):
#  1. ZeRO stages 0-3 at TP 2 x DP 2, fp32, and stage 3 in bf16: the losses of
#     MPI's run bit for bit (every sum is of two ranks, which both transports
#     round once);
#  2. stage 3 without its prefetch, and with --check-collectives (each transport): the same bits;
#  3. DP 4: within 1e-5 of MPI's (four-rank sums in another order);
#  4. a checkpoint saved over shm resumes over MPI exactly;
#  5. a slot size the transport cannot use (MEGAZERO_SHM_SLOT_BYTES) is refused
#     on every rank alike, exit 2, the variable named once; so is a bad
#     MEGAZERO_SHM_DEVICE_SLOTS.
# On a device (not host memory) the shm runs move device tensors through
# device slots (CUDA IPC; the isolated device's emulation of it), and stage 3
# with MEGAZERO_SHM_DEVICE_SLOTS=0 through the host segment: both with MPI's bits.
set -u
train=$1 cfg=$2 device=$3
work=$(mktemp -d /tmp/mz-shm-e2e-XXXXXX)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/e2e_common.sh"  # run_timeout, watchdog
tiny=(--config "$cfg" --mock-data --vocab-size 256 --log-interval 1 --eval-iters 0 --train-iters 6 --device "$device")
run() {  # run NAME ARGS...: output in $work/NAME.log, exit code in $work/NAME.rc
  local name=$1; shift
  timeout "$run_timeout" mpiexec -n 4 "$train" "${tiny[@]}" "${watchdog[@]}" "$@" >"$work/$name.log" 2>&1
  echo $? >"$work/$name.rc"
}
rc() { cat "$work/$1.rc"; }
losses() { grep -E "^ iteration" "$work/$1.log" | sed -E 's/^ iteration +([0-9]+)\/.*lm loss ([0-9.E+-]+) .*/\1 \2/'; }
fail() { echo "shm_backend_e2e ($device): FAIL: $*" >&2; for f in "$work"/*.log; do echo "---- $f"; tail -n 12 "$f"; done >&2; exit 1; }
ok() { [ "$(rc "$1")" = 0 ] || fail "$1 exited with $(rc "$1")"; }
on_shm() {  # on_shm NAME [device|host]: the transport, and on a device the slots it used
  grep -q "collectives: tp shm, dp shm" "$work/$1.log" || fail "$1 did not run on the shm transport"
  [ "$device" = cpu ] && return
  grep -q "device tensors through shared ${2:-device} memory" "$work/$1.log" ||
    fail "$1 did not move $device tensors through ${2:-device} slots: $(grep "collectives:" "$work/$1.log")"
}
same() {  # same A B: identical losses, at least one
  [ -n "$(losses "$1")" ] || fail "$1 logged no iterations"
  diff <(losses "$1") <(losses "$2") >/dev/null || fail "$2 differs from $1: $(paste -d'|' <(losses "$1") <(losses "$2") | tr '\n' ' ')"
}
close() {  # close A B TOL
  [ -n "$(losses "$1")" ] || fail "$1 logged no iterations"
  paste -d' ' <(losses "$1") <(losses "$2") |
    awk -v tol="$3" '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > tol * $2) bad = 1 } END { exit bad }' ||
    fail "$2 is not within $3 of $1: $(paste -d'|' <(losses "$1") <(losses "$2") | tr '\n' ' ')"
}

# 1-2. Every stage, both transports, TP 2 x DP 2.
for st in 0 1 2 3; do
  for be in mpi shm; do run "z$st-$be" --tensor-model-parallel-size 2 --zero-stage "$st" --distributed-backend "$be"; ok "z$st-$be"; done
  on_shm "z$st-shm"
  same "z$st-mpi" "z$st-shm"
done
for be in mpi shm; do run "bf16-$be" --tensor-model-parallel-size 2 --zero-stage 3 --bf16 --distributed-backend "$be"; ok "bf16-$be"; done
same bf16-mpi bf16-shm
# --check-collectives (every collective's fingerprint exchanged first) on both transports: no
# divergence on a correct run, and the same bits.
for be in mpi shm; do
  run "z3-check-$be" --tensor-model-parallel-size 2 --zero-stage 3 --distributed-backend "$be" --check-collectives
  ok "z3-check-$be"
  same z3-mpi "z3-check-$be"
done
run z3-shm-noprefetch --tensor-model-parallel-size 2 --zero-stage 3 --stage3-prefetch false --distributed-backend shm
ok z3-shm-noprefetch
same z3-shm z3-shm-noprefetch
if [ "$device" != cpu ]; then
  MEGAZERO_SHM_DEVICE_SLOTS=0 run z3-shm-hostslots --tensor-model-parallel-size 2 --zero-stage 3 --distributed-backend shm
  ok z3-shm-hostslots
  on_shm z3-shm-hostslots host
  same z3-mpi z3-shm-hostslots
fi

# 3. Four-rank sums.
for be in mpi shm; do run "dp4-$be" --zero-stage 2 --distributed-backend "$be"; ok "dp4-$be"; done
close dp4-mpi dp4-shm 1e-5

# 4. Saved over shm at iteration 3, resumed over MPI: the straight run's last three.
run save-shm --tensor-model-parallel-size 2 --zero-stage 3 --distributed-backend shm --exit-interval 3 --save "$work/ckpt"
ok save-shm
run resume-mpi --tensor-model-parallel-size 2 --zero-stage 3 --distributed-backend mpi --load "$work/ckpt"
ok resume-mpi
n=$(losses resume-mpi | wc -l)
[ "$n" = 3 ] || fail "the resumed run logged $n iterations, expected 3"
diff <(losses z3-shm | tail -n 3) <(losses resume-mpi) >/dev/null ||
  fail "resumed over MPI differs: $(paste -d'|' <(losses z3-shm | tail -n 3) <(losses resume-mpi) | tr '\n' ' ')"

# 5. A slot size that cannot be used.
MEGAZERO_SHM_SLOT_BYTES=1000 run bad-slot --tensor-model-parallel-size 2 --distributed-backend shm
[ "$(rc bad-slot)" = 2 ] || fail "a bad MEGAZERO_SHM_SLOT_BYTES exited $(rc bad-slot), expected 2"
[ "$(grep -c "MEGAZERO_SHM_SLOT_BYTES='1000' is not a byte count" "$work/bad-slot.log")" = 1 ] ||
  fail "the refusal should name MEGAZERO_SHM_SLOT_BYTES once"
MEGAZERO_SHM_DEVICE_SLOTS=yes run bad-device-slots --tensor-model-parallel-size 2 --distributed-backend shm
[ "$(rc bad-device-slots)" = 2 ] || fail "a bad MEGAZERO_SHM_DEVICE_SLOTS exited $(rc bad-device-slots), expected 2"
[ "$(grep -c "MEGAZERO_SHM_DEVICE_SLOTS='yes' is neither" "$work/bad-device-slots.log")" = 1 ] ||
  fail "the refusal should name MEGAZERO_SHM_DEVICE_SLOTS once"
echo "shm_backend_e2e ($device): every check passed"
