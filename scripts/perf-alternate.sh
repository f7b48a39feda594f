#!/usr/bin/env bash
# perf-alternate.sh — before/after figures of a change: `softroce perf` write_bw 64 KiB and
# write_lat 64 B (busy polling) with two release binaries, alternating trial by trial in one
# run, each trial with its own UDP baseline (the ratio `softroce perf` prints).
#
#   scripts/perf-alternate.sh BEFORE_BIN AFTER_BIN [TRIALS]
#
# Build the two binaries first (e.g. `git worktree add /tmp/before REV && cargo build --release`
# there). Runs in a private network namespace when root (unshare -n), pinned with --cpus 0,1.
# Prints one line per trial and test: which binary, the figure, the baseline's, the ratio.
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,11p' "$0"
  exit 2
fi
before=$1
after=$2
trials=${3:-5}
if [ "$(id -u)" = 0 ] && [ -z "${PERF_ALTERNATE_IN_NS:-}" ]; then
  exec env PERF_ALTERNATE_IN_NS=1 unshare -n "$0" "$@"
fi
ip link set lo up 2>/dev/null || true
for t in $(seq "$trials"); do
  for who in before after; do
    bin=$before
    [ "$who" = after ] && bin=$after
    bw=$(timeout 120 "$bin" perf write_bw -s 65536 -m 4096 -n 5000 --loopback --cpus 0,1 2>&1 | grep ratio | tail -1)
    lat=$(timeout 120 "$bin" perf write_lat -s 64 -n 20000 --loopback --busy-poll --cpus 0,1 2>&1 | grep ratio | tail -1)
    echo "trial $t $who write_bw: $(echo "$bw" | tr -s ' ')"
    echo "trial $t $who write_lat: $(echo "$lat" | tr -s ' ')"
  done
done
