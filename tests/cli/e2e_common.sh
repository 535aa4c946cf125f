# Sourced by the end-to-end scripts that train on a DEVICE (device_paths_e2e.sh,
# checkpoint_e2e.sh); expects $device.
#
# Each run is bounded (MZ_E2E_RUN_TIMEOUT seconds; a GPU session's short lease
# sets it lower), and on a GPU a stuck collective ends a run through the
# watchdog in 30 s, with a report, rather than through that bound.
run_timeout=${MZ_E2E_RUN_TIMEOUT:-300}
watchdog=()
[ "$device" = cuda ] && watchdog=(--collective-timeout 30)

# wait_for_line LOG PATTERN PID: until the log has a line matching PATTERN;
# fails at once if the run (PID) ended, or after a minute.
wait_for_line() {
  for _ in $(seq 1 600); do
    grep -qE "$2" "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
