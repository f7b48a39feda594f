#!/bin/bash
# Issue 23's small-message target through the C library: the 64 B RDMA WRITE message rate of
# perftest's ib_write_bw through softroce's libibverbs.so.1 (`softroce exec`) against
# `softroce perf write_bw` in the same run, each as two processes on loopback (server
# 127.0.115.61, client 127.0.115.62), alternating trial by trial.
#
#   cargo build --release && scripts/capi-msg-rate.sh [TRIALS] [SOFTROCE_BINARY...]
#
# With several binaries (release builds of two commits, for an A/B of a data-path change)
# every trial runs each of them in turn. Prints each trial's message rates (M messages/s,
# perftest's MsgRate column) and, per binary, the medians and the median of the per-trial
# ratios library / perf (target >= 0.9x). Every run is killed after 60 s.
set -u
cd "$(dirname "$0")/.."
TRIALS=${1:-5}
shift $(($# > 0 ? 1 : 0))
BINS=("$@")
[ ${#BINS[@]} -eq 0 ] && BINS=(target/release/softroce)
A=127.0.115.61
B=127.0.115.62
PORT=18571

PAIR_SRV_LOG=/tmp/capi-msg-rate.srv
. scripts/pair-lib.sh

declare -A LIB PERF RATIO
for t in $(seq "$TRIALS"); do
    for i in "${!BINS[@]}"; do
        S=${BINS[$i]}
        c=$(run_pair "$S" exec --ip=$A -- ib_write_bw -s 64 -n 200000 -p $PORT | awk '{print $5}')
        e=$(run_pair "$S" perf write_bw --ip=$A -s 64 -n 200000 -p $PORT | awk '{print $5}')
        r=$(awk -v c="$c" -v e="$e" 'BEGIN {if (e > 0) printf "%.3f", c / e; else print "nan"}')
        echo "trial $t, $S: ib_write_bw -s 64 $c M msg/s | perf write_bw -s 64 $e M msg/s | ratio $r"
        LIB[$i]+="$c "; PERF[$i]+="$e "; RATIO[$i]+="$r "
    done
done
for i in "${!BINS[@]}"; do
    m() { echo "$1" | tr ' ' '\n' | grep -E '^[0-9.]+$' | median; }
    echo "${BINS[$i]}: medians: library $(m "${LIB[$i]}") M msg/s, perf $(m "${PERF[$i]}") M msg/s," \
        "library / perf per trial $(m "${RATIO[$i]}") (target >= 0.9)"
done
