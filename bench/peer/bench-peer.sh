#!/usr/bin/env bash
# make bench-peer: telorunner and the reference runner (runner-core + fake
# backend, ../shared/peer) measured side by side by the same load driver,
# peerload, in one run on this machine. Prints each measure and its ratio
# (ours ÷ reference); the JSON of every run is left under bench/out/.
#
# Environment: PEER_DIR (default <repo>/../shared/peer), REF_PORT (18061),
# OUR_PORT (18062), PEERLOAD_FLAGS (default: the issue's SSE shape, 1,000
# subscribers × 100 events; io 64 MiB; 200 creates).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
peer_src="${PEER_DIR:-$root/../shared/peer}"
out="$root/bench/out"
bin="$root/bin"
ref_port="${REF_PORT:-18061}"
our_port="${OUR_PORT:-18062}"
read -r -a flags <<<"${PEERLOAD_FLAGS:---subscribers 1000 --events 100 --timeout 300s}"
image="telorun/node:latest-slim"

if [[ ! -f "$peer_src/package-lock.json" ]]; then
  echo "bench-peer: no reference peer at $peer_src (set PEER_DIR)" >&2
  exit 1
fi
mkdir -p "$out"

# The reference, installed into bench/out/peer (the shared folder is left as
# it is): its pinned dependencies (npm ci) and the load driver.
echo "== reference: npm ci, peerload"
rm -rf "$out/peer"
mkdir -p "$out/peer"
(cd "$peer_src" && tar --exclude=./node_modules --exclude=./load/peerload -cf - .) | (cd "$out/peer" && tar -xf -)
(cd "$out/peer" && npm ci --no-audit --no-fund --loglevel=error)
(cd "$out/peer/load" && GOWORK=off go build -o peerload .)
peerload="$out/peer/load/peerload"

ref_pid=""
allinone_pid="" # set by start_allinone
cleanup() {
  [[ -n "$ref_pid" ]] && kill "$ref_pid" 2>/dev/null || true
  if [[ -n "$allinone_pid" ]]; then
    kill "$allinone_pid" 2>/dev/null || true
    wait "$allinone_pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT

# runs LABEL PID PORT [peerload flags...]: the three scenarios of
# `peerload all`, in its order, each into its own JSON (a failed scenario
# is reported and the others still run).
runs() {
  local label="$1" pid="$2" port="$3"
  shift 3
  for mode in io sse create; do
    echo "== $label: peerload $mode"
    rm -f "$out/$label-$mode.json"
    if ! "$peerload" "$mode" --base "http://127.0.0.1:$port" --pid "$pid" --label "$label" \
      --json "$out/$label-$mode.json" "${flags[@]}" "$@"; then
      echo "bench-peer: $label $mode failed" >&2
    fi
  done
}

echo "== reference: start on $ref_port"
ref_pid="$("$out/peer/run-peer.sh" "$ref_port" "$out/reference.log")"
runs reference "$ref_pid" "$ref_port"
kill "$ref_pid" 2>/dev/null || true
ref_pid=""

echo "== telorunner: start the all-in-one on $our_port"
# shellcheck source=bench/peer/allinone.sh
. "$root/bench/peer/allinone.sh"
start_allinone "$our_port" "$out/telorunner-data" "$out/telorunner.log"
# devkernel reports the peer's progress events as debug frames: --inspect.
runs telorunner "$allinone_pid" "$our_port" --image "$image" --inspect

echo
echo "== ratios (ours ÷ reference; JSON under $out)"
(cd "$root/bench" && GOWORK=off go run ./cmd/peercompare "$out/telorunner" "$out/reference") | tee "$out/ratios.txt"
