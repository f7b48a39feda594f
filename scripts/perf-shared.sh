#!/usr/bin/env bash
# perf-shared.sh — the shared device's cost on the data path (issue 21's numbers): a
# `softroce perf` client on 127.0.0.2 against a server on 127.0.0.1, alone on its address
# or sharing the address's device with a second process (an idle `softroce perf` server on
# 127.0.0.2, so that every datagram of the client goes through the device's steering),
# alternating trial by trial: write_lat 64 B (busy polling; t_typical) and write_bw 64 KiB.
#
#   scripts/perf-shared.sh [SOFTROCE_BIN] [TRIALS]
#
# Release build (default target/release/softroce); client pinned on CPU 0, server on CPU 1;
# in a private network namespace when root. Prints perftest's result row of each run.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/softroce}
trials=${2:-5}
if [ "$(id -u)" = 0 ] && [ -z "${PERF_SHARED_IN_NS:-}" ]; then
  exec env PERF_SHARED_IN_NS=1 unshare -n "$0" "$@"
fi
ip link set lo up 2>/dev/null || true

# listening PORT: waits for the server's TCP exchange socket.
. scripts/tcp-listening.sh

run() { # TEST ARGS...: one server/client pair, the client's result row
  local test=$1
  shift
  taskset -c 1 "$bin" perf "$test" --ip 127.0.0.1 -p 18600 "$@" > /dev/null 2>&1 &
  listening 18600
  taskset -c 0 "$bin" perf "$test" --ip 127.0.0.2 -p 18600 "$@" 127.0.0.1 2>&1 \
    | grep -E '^ +[0-9]+ +[0-9]+ ' | tr -s ' \t' ' '
  wait
}

for t in $(seq "$trials"); do
  for mode in alone shared; do
    idle=
    if [ "$mode" = shared ]; then
      "$bin" perf write_lat --ip 127.0.0.2 -p 18699 > /dev/null 2>&1 &
      idle=$!
      listening 18699
    fi
    echo "trial $t $mode write_lat:$(run write_lat -s 64 -n 20000 --busy-poll)"
    echo "trial $t $mode write_bw:$(run write_bw -s 65536 -m 4096 -n 5000)"
    if [ -n "$idle" ]; then
      kill "$idle" 2>/dev/null || true
      wait "$idle" 2>/dev/null || true
    fi
  done
done
