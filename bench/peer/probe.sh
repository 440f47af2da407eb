#!/usr/bin/env bash
# bench/peer/probe.sh MODE [peerload flags...]: one peerload scenario (io,
# sse or create) against a fresh all-in-one started as `make bench-peer`
# starts it, with what a ratio does not show: the server's own CPU and its
# reaped children's (the sessions' processes), its minor page faults and
# its peak RSS over the run. PROFILE=SECONDS also takes a CPU profile of
# the server from the scenario's start (bench/out/probe-MODE.pprof).
#
# Needs `make build` and the load driver that `make bench-peer` builds
# (bench/out/peer/load/peerload). Environment: PORT (18063), and any
# RUNNER_* or GO* variable for the all-in-one (an A/B of a setting).
set -euo pipefail

mode="${1:?usage: probe.sh io|sse|create [peerload flags...]}"
shift
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="$root/bench/out"
bin="$root/bin"
peerload="$out/peer/load/peerload"
port="${PORT:-18063}"
[[ -x "$peerload" ]] || { echo "probe: no $peerload (run make bench-peer once)" >&2; exit 1; }

# shellcheck source=bench/peer/allinone.sh
. "$root/bench/peer/allinone.sh"
trap 'kill "${allinone_pid:-}" 2>/dev/null || true; wait "${allinone_pid:-}" 2>/dev/null || true' EXIT
RUNNER_PPROF=true start_allinone "$port" "$out/probe-data" "$out/probe.log"
pid=$allinone_pid

# stat: utime stime cutime cstime (clock ticks) and minor faults.
stat() { awk '{print $14, $15, $16, $17, $10}' "/proc/$pid/stat"; }
read -r u0 s0 cu0 cs0 f0 < <(stat)
prof=""
if [[ -n "${PROFILE:-}" ]]; then
  curl -fsS -o "$out/probe-$mode.pprof" "http://127.0.0.1:$port/debug/pprof/profile?seconds=$PROFILE" &
  prof=$!
fi
"$peerload" "$mode" --base "http://127.0.0.1:$port" --pid "$pid" --image telorun/node:latest-slim --inspect "$@"
[[ -z "$prof" ]] || wait "$prof"
read -r u1 s1 cu1 cs1 f1 < <(stat)
hz="$(getconf CLK_TCK)"
awk -v hz="$hz" -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v c=$((cu1 - cu0 + cs1 - cs0)) \
  'BEGIN { printf "probe: server CPU %.2f s (user %.2f, system %.2f); its reaped children %.2f s\n", (u+s)/hz, u/hz, s/hz, c/hz }'
echo "probe: minor page faults $((f1 - f0)); peak RSS $(awk '/VmHWM/ {print $2, $3}' "/proc/$pid/status")"
[[ -z "${PROFILE:-}" ]] || echo "probe: CPU profile $out/probe-$mode.pprof (go tool pprof $bin/telorunner ...)"
