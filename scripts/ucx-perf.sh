#!/usr/bin/env bash
# ucx-perf.sh — UCX over softroce against `softroce perf` (issue 21's number), and one build
# of softroce against another (before/after a data-path change): ucx_perftest tag_lat 8 B and
# tag_bw 64 KiB over rc_verbs between two processes, each under `softroce exec`, then
# `softroce perf write_bw -s 65536 -m 4096` (the engine's own bandwidth, the baseline),
# alternating build by build and trial by trial.
#
#   scripts/ucx-perf.sh [TRIALS] [SOFTROCE_BIN...]
#
# Default: 3 trials of target/release/softroce. Each further binary (for example a
# worktree's target/release/softroce) runs in turn within each trial; its libraries are the
# ones `softroce exec` finds beside it. Server on 127.0.0.1 pinned to CPU 1, client on
# 127.0.0.2 on CPU 0, `UCX_TLS=rc_verbs,ud_verbs:aux` (as tests/middleware.rs), in a private
# network namespace when root. Prints one line per run: the build, the test, ucx_perftest's
# typical latency (µs), its overall bandwidth and the perf baseline's average, both in MB/s of
# 2^20 bytes (the unit of ucx_perftest and perftest alike).
set -euo pipefail
cd "$(dirname "$0")/.."
trials=${1:-3}
shift || true
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(target/release/softroce)
if [ "$(id -u)" = 0 ] && [ -z "${UCX_PERF_IN_NS:-}" ]; then
  exec env UCX_PERF_IN_NS=1 unshare -n "$0" "$trials" "${bins[@]}"
fi
ip link set lo up 2>/dev/null || true
command -v ucx_perftest > /dev/null || {
  echo "ucx-perf.sh: ucx_perftest not found (apt-get install ucx-utils)" >&2
  exit 1
}

# listening PORT: waits for the server's TCP exchange socket.
. scripts/tcp-listening.sh

# ucx BIN TEST SIZE N: one ucx_perftest pair; prints the client's "Final:" line.
ucx() {
  local bin=$1 test=$2 size=$3 n=$4 port=13337
  UCX_TLS=rc_verbs,ud_verbs:aux taskset -c 1 "$bin" exec --ip 127.0.0.1 -- \
    ucx_perftest -p "$port" > /dev/null 2>&1 &
  listening "$port"
  UCX_TLS=rc_verbs,ud_verbs:aux taskset -c 0 "$bin" exec --ip 127.0.0.2 -- \
    ucx_perftest -p "$port" -t "$test" -s "$size" -n "$n" 127.0.0.1 2>&1 | grep '^Final:'
  wait
}

# perf_bw BIN: `softroce perf write_bw` 64 KiB, the client's average MB/s.
perf_bw() {
  "$1" perf write_bw -s 65536 -m 4096 -n 20000 --loopback --cpus 0,1 2>&1 \
    | awk '$1 == 65536 && $2 ~ /^[0-9]+$/ {print $4}' | tail -1
}

# "Final: iters typical average overall bw_avg bw_overall rate_avg rate_overall".
for t in $(seq "$trials"); do
  for bin in "${bins[@]}"; do
    lat=$(ucx "$bin" tag_lat 8 20000 | awk '{print $3}')
    bw=$(ucx "$bin" tag_bw 65536 20000 | awk '{print $7}')
    base=$(perf_bw "$bin")
    echo "trial $t $bin: tag_lat 8 B typical ${lat} us; tag_bw 64 KiB ${bw} MB/s; perf write_bw ${base} MB/s"
  done
done
