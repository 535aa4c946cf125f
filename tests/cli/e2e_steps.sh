# Sourced by end-to-end scripts that run tools step by step (sentencepiece_e2e.sh,
# hf_tokenizer_e2e.sh); expects $work (a scratch folder whose *.log files are
# shown on a failure) and $script (the script's name, for its messages).

# fail MESSAGE: the message and each log's tail, exit 1.
fail() {
  echo "$script: FAIL: $*" >&2
  for f in "$work"/*.log; do echo "---- $f"; tail -n 15 "$f"; done >&2
  exit 1
}
# step NAME COMMAND...: output in $work/NAME.log; fails the test on a nonzero exit.
step() {
  local name=$1; shift
  timeout 300 "$@" >"$work/$name.log" 2>&1 || fail "$name exited with $?"
}
# refused NAME PATTERN COMMAND...: exit 2 and the message.
refused() {
  local name=$1 pattern=$2; shift 2
  timeout 120 "$@" >"$work/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 2 ] || fail "$name: exit $rc, not 2"
  grep -q -- "$pattern" "$work/$name.log" || fail "$name: no '$pattern' in its message"
}
