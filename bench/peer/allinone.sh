# Sourced by bench-peer.sh and probe.sh: start_allinone PORT DATA LOG
# starts the all-in-one from bin/ as the peer comparison runs it (devkernel
# as the kernel, a fresh data dir, the peer's session limits; extra RUNNER_*
# or GO* variables come from the caller's environment), sets allinone_pid
# and waits for /v1/health. Needs $bin.
start_allinone() {
  local port="$1" data="$2" log="$3"
  rm -rf "$data"
  PORT="$port" RUNNER_DATA_DIR="$data" \
    RUNNER_KERNEL_COMMAND="$bin/devkernel" RUNNER_WORKSPACE_SERVER_COMMAND="$bin/workspace-server" \
    RUNNER_MAX_SESSIONS="${RUNNER_MAX_SESSIONS:-4096}" RUNNER_EXIT_TTL_MS="${RUNNER_EXIT_TTL_MS:-60000}" \
    "$bin/telorunner" >"$log" 2>&1 </dev/null &
  allinone_pid=$!
  for _ in $(seq 1 300); do
    if ! kill -0 "$allinone_pid" 2>/dev/null; then
      echo "telorunner exited during startup; see $log" >&2
      tail -n 20 "$log" >&2
      return 1
    fi
    curl -fsS -m 1 "http://127.0.0.1:$port/v1/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "telorunner not healthy on port $port after 30 s; see $log" >&2
  return 1
}
