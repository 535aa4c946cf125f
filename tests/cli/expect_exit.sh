#!/usr/bin/env bash
# expect_exit.sh CODE REGEX [--count N] -- COMMAND...
# Runs COMMAND; passes if it exits with CODE and its combined output matches the
# extended REGEX (exactly N times with --count: an error must print once, not
# once per rank).
set -u
code=$1 regex=$2
shift 2
count=""
if [ "$1" = "--count" ]; then count=$2; shift 2; fi
[ "$1" = "--" ] && shift
out=$("$@" 2>&1)
rc=$?
echo "$out"
if [ "$rc" -ne "$code" ]; then echo "expect_exit: exit code $rc, expected $code" >&2; exit 1; fi
matches=$(printf '%s\n' "$out" | grep -cE -- "$regex" || true)
if [ "$matches" -eq 0 ]; then echo "expect_exit: output does not match /$regex/" >&2; exit 1; fi
if [ -n "$count" ] && [ "$matches" -ne "$count" ]; then
  echo "expect_exit: /$regex/ matched $matches lines, expected $count" >&2; exit 1
fi
exit 0
