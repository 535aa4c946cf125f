#!/usr/bin/env bash
# sweep_local_e2e.sh PRETRAIN_GPT SOURCE_DIR: launch/sweep/sweep.sh --backend local
# (mpiexec through launch/local/pretrain_gpt.sh) end to end. Each step checked:
#  1. weak scaling over 1 and 2 ranks (global batch 8 -> 16): 2 ok points;
#  2. the same results directory, one more point: a model too big for this
#     machine, recorded as oom (the program's memory pre-flight refusal, exit 2),
#     not a crash of the sweep;
#  3. results.csv has the 3 rows with the documented columns; the 3 PNG charts
#     exist and are not empty; env.json/env.txt record host, CPU, MPI, commit;
#  4. the first command again: both points skipped (resume), the CSV unchanged;
#  5. a point over its --timeout is recorded as timeout (exit 124).
set -u
exe=$1 src=$2
work=$(mktemp -d /tmp/mz-sweep-local-XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
fail() { echo "sweep_local_e2e: FAIL: $*" >&2; for f in "$work"/*.log; do echo "---- $f"; tail -n 30 "$f"; done >&2; exit 1; }
sweep=("$src/launch/sweep/sweep.sh" --backend local --out "$work/sweep" --exe "$exe" --tp 1 --zero 1
       --seq 32 --micro-batch 4 --global-batch 8 --iters 3 --timeout 120)

"${sweep[@]}" --ranks 1,2 --model 2:64:4 --scaling weak >"$work/run1.log" 2>&1 || fail "the weak-scaling sweep failed"
"${sweep[@]}" --ranks 1 --model 64:16384:128 --scaling weak >"$work/run2.log" 2>&1 || fail "the sweep with an OOM point failed"
grep -q "oom (exit code 2): .*memory pre-flight: rank 0's plan needs" "$work/run2.log" || fail "the OOM point was not reported as oom"
csv="$work/sweep/results.csv"
/usr/bin/python3 - "$csv" <<'EOF' || fail "results.csv content"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
need = ["point_id", "backend", "scaling", "status", "exit_code", "ranks", "nodes", "tp", "dp", "zero_stage",
        "num_layers", "hidden_size", "num_attention_heads", "micro_batch", "global_batch", "seq_length",
        "tokens_per_s", "tokens_per_s_per_rank", "tflops_per_rank", "mfu", "peak_memory_mib_per_rank",
        "exposed_dp_comm_ms", "ms_per_iteration", "error"]
missing = [c for c in need if c not in rows[0]]
assert not missing, "missing columns %s" % missing
assert len(rows) == 3, "%d rows" % len(rows)
ok = {int(r["ranks"]): r for r in rows if r["status"] == "ok"}
assert sorted(ok) == [1, 2], rows
assert ok[1]["global_batch"] == "8" and ok[2]["global_batch"] == "16", "weak scaling batch"
assert ok[2]["dp"] == "2" and ok[2]["backend"] == "local" and ok[2]["scaling"] == "weak"
for r in ok.values():
    for c in ("tokens_per_s", "tflops_per_rank", "mfu", "peak_memory_mib_per_rank", "ms_per_iteration"):
        assert float(r[c]) > 0, (c, r)
    assert float(r["exposed_dp_comm_ms"]) >= 0
oom = [r for r in rows if r["status"] == "oom"]
assert len(oom) == 1 and oom[0]["num_layers"] == "64" and oom[0]["exit_code"] == "2", rows
assert "memory pre-flight" in oom[0]["error"] and oom[0]["tokens_per_s"] == ""
print("sweep_local_e2e: results.csv: 2 ok (weak scaling, batch 8 -> 16), 1 oom")
EOF
for png in throughput_per_rank memory_per_rank scaling_efficiency; do
  [ "$(stat -c %s "$work/sweep/$png.png" 2>/dev/null || echo 0)" -gt 2000 ] || fail "$png.png is missing or empty"
  head -c 8 "$work/sweep/$png.png" | grep -q PNG || fail "$png.png is not a PNG"
done
for k in host cpu mpi git_commit date_utc sweep_argv; do
  grep -q "\"$k\": \"..*\"" "$work/sweep/env.json" || fail "env.json has no $k"
done
grep -q "^mpi: MPICH\|^mpi: .\+" "$work/sweep/env.txt" || fail "env.txt has no MPI version"
echo "sweep_local_e2e: 3 PNG charts, env.json and env.txt written"

cp "$csv" "$work/before.csv"
"${sweep[@]}" --ranks 1,2 --model 2:64:4 --scaling weak >"$work/run3.log" 2>&1 || fail "the re-run failed"
grep -q "0 points run, 2 done earlier" "$work/run3.log" || fail "the re-run did not skip the finished points"
cmp -s "$csv" "$work/before.csv" || fail "the re-run changed results.csv"
echo "sweep_local_e2e: re-run: both points skipped, CSV unchanged"

"$src/launch/sweep/sweep.sh" --backend local --out "$work/slow" --exe "$exe" --ranks 2 --model 2:64:4 --seq 32 \
  --iters 1000000 --timeout 2 >"$work/timeout.log" 2>&1 || fail "the sweep with a timeout failed"
grep -q "timeout (exit code 124)" "$work/timeout.log" || fail "the point over its limit was not recorded as timeout"
grep -q ",timeout,124," "$work/slow/results.csv" || fail "results.csv has no timeout row"
echo "sweep_local_e2e: a point over --timeout: recorded as timeout"
echo "sweep_local_e2e: all passed"
