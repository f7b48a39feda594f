#!/bin/bash
# Acceptance 7 of issue 15: perftest through softroce's libibverbs.so.1 (`softroce exec`)
# against softroce's own `softroce perf`, in the same run on this host, alternating, each
# pair as two processes on loopback (server 127.0.115.61, client 127.0.115.62).
#
#   cargo build --release && scripts/capi-vs-engine.sh [TRIALS]
#
# Prints, per trial, the typical WRITE latency of 64 B (perftest's t_typical, µs) and the
# average WRITE bandwidth of 64 KiB (MB/s) of each, then the ratios of the medians.
# `softroce perf` runs twice: as is (its driver thread receives) and with --busy-poll (the
# polling thread always receives). ib_write_bw runs three times: with the library's default
# (busy polling), with SOFTROCE_BUSY_POLL=adaptive (a device that mostly sends leaves
# receiving to its driver thread) and with SOFTROCE_BUSY_POLL=0 (never busy polling). Every
# run is killed after 60 s.
set -u
cd "$(dirname "$0")/.."
S=${SOFTROCE:-target/release/softroce}
TRIALS=${1:-5}
A=127.0.115.61
B=127.0.115.62
PORT=18561

PAIR_SRV_LOG=/tmp/capi-vs-engine.srv
. scripts/pair-lib.sh
lat() { echo "$1" | awk '{print $5}'; }
bw() { echo "$1" | awk '{print $4}'; }

declare -A R
for t in $(seq "$TRIALS"); do
    l1=$(lat "$(run_pair $S exec --ip=$A -- ib_write_lat -x 1 -s 64 -n 20000 -p $PORT)")
    l2=$(lat "$(run_pair $S perf write_lat --ip=$A -s 64 -n 20000 -p $PORT --busy-poll)")
    l3=$(lat "$(run_pair $S perf write_lat --ip=$A -s 64 -n 20000 -p $PORT)")
    b1=$(bw "$(run_pair $S exec --ip=$A -- ib_write_bw -x 1 -s 65536 -n 5000 -p $PORT)")
    b2=$(bw "$(run_pair $S perf write_bw --ip=$A -s 65536 -n 5000 -p $PORT --busy-poll)")
    b3=$(bw "$(run_pair $S perf write_bw --ip=$A -s 65536 -n 5000 -p $PORT)")
    b4=$(bw "$(run_pair env SOFTROCE_BUSY_POLL=0 $S exec --ip=$A -- ib_write_bw -x 1 -s 65536 -n 5000 -p $PORT)")
    b5=$(bw "$(run_pair env SOFTROCE_BUSY_POLL=adaptive $S exec --ip=$A -- ib_write_bw -x 1 -s 65536 -n 5000 -p $PORT)")
    echo "trial $t: write_lat 64 B t_typical µs: ib_write_lat $l1 | perf --busy-poll $l2 | perf $l3;" \
        "write_bw 64 KiB MB/s: ib_write_bw $b1 | perf --busy-poll $b2 | perf $b3 | ib_write_bw SOFTROCE_BUSY_POLL=0 $b4 | =adaptive $b5"
    R[l1]+="$l1 "; R[l2]+="$l2 "; R[l3]+="$l3 "; R[b1]+="$b1 "; R[b2]+="$b2 "; R[b3]+="$b3 "; R[b4]+="$b4 "; R[b5]+="$b5 "
done
m() { echo "${R[$1]}" | tr ' ' '\n' | grep . | median; }
ml1=$(m l1); ml2=$(m l2); ml3=$(m l3); mb1=$(m b1); mb2=$(m b2); mb3=$(m b3); mb4=$(m b4); mb5=$(m b5)
echo "medians: ib_write_lat $ml1 µs, perf write_lat --busy-poll $ml2 µs, perf write_lat $ml3 µs"
echo "         ib_write_bw $mb1 MB/s, perf write_bw --busy-poll $mb2 MB/s, perf write_bw $mb3 MB/s, ib_write_bw SOFTROCE_BUSY_POLL=0 $mb4 MB/s, =adaptive $mb5 MB/s"
awk -v a="$ml1" -v b="$ml2" -v c="$ml3" 'BEGIN {printf "latency ratio ib/perf: %.2fx (vs --busy-poll), %.2fx (vs plain); target <= 1.15x\n", a/b, a/c}'
awk -v a="$mb1" -v b="$mb2" -v c="$mb3" -v d="$mb4" -v e="$mb5" 'BEGIN {printf "bandwidth ratio ib/perf: %.2fx (library default vs plain perf; target >= 0.9x), %.2fx (vs perf --busy-poll), %.2fx (neither busy-polling), %.2fx (library adaptive vs plain perf)\n", a/c, a/b, d/c, e/c}'
