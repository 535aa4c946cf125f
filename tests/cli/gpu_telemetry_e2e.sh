#!/usr/bin/env bash
# gpu_telemetry_e2e.sh: tools/gpu_telemetry.py, which a GPU session's peers
# phases run over nvidia-smi's samples, on a synthetic phase log and CSV in
# nvidia-smi's format. The run headers are stamped by gpu_session.sh's own
# stamp(), so a format change there that the tool cannot read fails here, not
# on a rare GPU lease. Checks: each run gets the samples of its window only
# (clock mean/min/max, power, temperature), the throttle bits are named, idle
# is not, and an older driver's CSV without the reasons column still reads.
set -euo pipefail
here="$(dirname "$0")/../.."
tool="$here/tools/gpu_telemetry.py"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "gpu_telemetry_e2e: FAIL: $*"; exit 1; }
eval "$(grep -E '^stamp\(\) ' "$here/tools/gpu_session.sh")"
t0=$(stamp)
base=$(date -d "${t0//\//-}" +%s)
at() { date -d "@$((base + $1))" +'%Y/%m/%d %H:%M:%S'; }  # seconds after t0, nvidia-smi's format

{
  echo "== @$t0 ours: bench_layer 100B layer"
  echo "median 20.1 ms"
  echo "== @$(at 10).000 theirs: bench/torch_layer.py sdpa bf16 --compile"
  echo "== @$(at 20).000 ours: nothing sampled"
} > "$work/phase.txt"
{
  echo "timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], temperature.gpu, clocks_event_reasons.active"
  echo "$(at 1).100, 1980, 3201, 650.50, 60, 0x0000000000000000"
  echo "$(at 2).100, 1700, 3201, 700.00, 64, 0x0000000000000004"
  echo "$(at 11).100, 1800, 3201, 600.00, 66, 0x0000000000000001"
  echo "$(at 12).100, [N/A], 3201, 600.00, 67, 0x0000000000000001"
  echo "$(at 30).100, 1000, 3201, 100.00, 40, 0x0000000000000000"
} > "$work/t.csv"
python3 "$tool" "$work/phase.txt" "$work/t.csv" > "$work/out.txt" || { cat "$work/out.txt"; fail "the tool failed"; }
cat "$work/out.txt"
grep -q "^== GPU telemetry (5 samples)" "$work/out.txt" || fail "sample count"
grep -E "^ours: bench_layer" "$work/out.txt" |
  grep -qE " 2 samples, SM +1840 MHz \(min 1700, max 1980\), power +675 W \(max 700\), up to 64 C, throttled by sw-power-cap$" ||
  fail "the first run's window"
grep -E "^theirs: " "$work/out.txt" |
  grep -qE " 2 samples, SM +1800 MHz \(min 1800, max 1800\), power +600 W \(max 600\), up to 67 C, throttled by none$" ||
  fail "the second run's window (idle is no throttle; an N/A clock is skipped)"
grep -E "^ours: nothing" "$work/out.txt" | grep -qE " 1 samples, SM +1000 MHz" || fail "the last run's open window"

# An older driver: no reasons column, so no "throttled by".
cut -d, -f1-5 "$work/t.csv" > "$work/old.csv"
python3 "$tool" "$work/phase.txt" "$work/old.csv" > "$work/old.txt" || fail "the tool failed on the older CSV"
grep -q "throttled" "$work/old.txt" && fail "reasons reported without a reasons column"
grep -E "^ours: bench_layer" "$work/old.txt" | grep -qE "SM +1840 MHz" || fail "the older CSV's clocks"
# No run headers: a clear error, non-zero.
echo "median 1 ms" > "$work/none.txt"
python3 "$tool" "$work/none.txt" "$work/t.csv" > "$work/none.out" 2>&1 && fail "no headers accepted"
grep -q "no '== @<time> ...' run headers" "$work/none.out" || fail "the no-headers message"
echo "gpu_telemetry_e2e: PASS"
