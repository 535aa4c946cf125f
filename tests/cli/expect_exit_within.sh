#!/usr/bin/env bash
# expect_exit_within.sh SECONDS CODE REGEX [--after-fault SECONDS] -- COMMAND...
# Like expect_exit.sh, for jobs that must END: passes if COMMAND exits within
# SECONDS of its start with CODE ("nonzero" accepts any failure) and its
# combined output matches the extended REGEX. With --after-fault, the job must
# also end within that many seconds of the wall-clock time printed by
# megazero-fault-inject's "injecting ... (time T)" line. A job still running
# at SECONDS + 15 is killed and fails the test (instead of CTest's timeout).
set -u
sub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a - b }'; }
greater() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a > b) }'; }
limit=$1 code=$2 regex=$3
shift 3
after=""
if [ "$1" = "--after-fault" ]; then after=$2; shift 2; fi
[ "$1" = "--" ] && shift
start=$(date +%s.%N)
out=$(timeout --kill-after=5 "$((${limit%.*} + 15))" "$@" 2>&1)
rc=$?
end=$(date +%s.%N)
echo "$out"
elapsed=$(sub "$end" "$start")
echo "expect_exit_within: exit code $rc after $elapsed s (limit $limit s)"
fail=0
if [ "$code" = nonzero ]; then
  [ "$rc" -ne 0 ] || { echo "expect_exit_within: exit code 0, expected a failure" >&2; fail=1; }
elif [ "$rc" -ne "$code" ]; then
  echo "expect_exit_within: exit code $rc, expected $code" >&2; fail=1
fi
if greater "$elapsed" "$limit"; then
  echo "expect_exit_within: took $elapsed s, limit $limit s" >&2; fail=1
fi
if [ -n "$after" ]; then
  t=$(printf '%s\n' "$out" | sed -nE 's/.*injecting .*\(time ([0-9.]+)\).*/\1/p' | head -1)
  if [ -z "$t" ]; then
    echo "expect_exit_within: no 'injecting ... (time T)' line in the output" >&2; fail=1
  else
    since=$(sub "$end" "$t")
    echo "expect_exit_within: the job ended $since s after the fault (limit $after s)"
    if greater "$since" "$after"; then
      echo "expect_exit_within: ended $since s after the fault, limit $after s" >&2; fail=1
    fi
  fi
fi
if ! printf '%s\n' "$out" | grep -qE -- "$regex"; then
  echo "expect_exit_within: output does not match /$regex/" >&2; fail=1
fi
exit $fail
