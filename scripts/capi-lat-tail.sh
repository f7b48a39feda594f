#!/bin/bash
# Issue 23's latency-tail target through the C library: perftest's `ib_write_lat -s 64`
# through softroce's libibverbs.so.1 (`softroce exec`), two processes on loopback (server
# 127.0.115.61, client 127.0.115.62), its t_typical against its 99 % and 99.9 % percentiles
# (target: 99.9 % <= 10x t_typical).
#
#   cargo build --release && scripts/capi-lat-tail.sh [TRIALS] [CONFIG...]
#
# A CONFIG is `BINARY` or `BINARY:VAR=VALUE,VAR=VALUE` (environment for both sides, e.g.
# `target/release/softroce:SOFTROCE_RT=1`); every trial runs each CONFIG in turn. Prints each
# run's row and, per CONFIG, the medians and the median of the per-trial ratios
# 99.9 % / t_typical.
set -u
cd "$(dirname "$0")/.."
TRIALS=${1:-5}
shift $(($# > 0 ? 1 : 0))
CONFIGS=("$@")
[ ${#CONFIGS[@]} -eq 0 ] && CONFIGS=(target/release/softroce)
A=127.0.115.61
B=127.0.115.62
PORT=18573
N=${N:-20000}

PAIR_SRV_LOG=/tmp/capi-lat-tail.srv
. scripts/pair-lib.sh

declare -A TYP P99 P999 RATIO
for t in $(seq "$TRIALS"); do
    for i in "${!CONFIGS[@]}"; do
        c=${CONFIGS[$i]}
        bin=${c%%:*}
        envs=()
        [ "$c" != "$bin" ] && IFS=, read -r -a envs <<< "${c#*:}"
        row=$(run_pair env "${envs[@]}" "$bin" exec --ip=$A -- ib_write_lat -s 64 -n "$N" -p $PORT)
        read -r _ _ _ _ typ _ _ p99 p999 <<< "$row"
        r=$(awk -v a="${p999:-0}" -v b="${typ:-0}" 'BEGIN {if (b > 0) printf "%.1f", a / b; else print "nan"}')
        echo "trial $t, $c: t_typical ${typ:-?} us, 99 % ${p99:-?} us, 99.9 % ${p999:-?} us, 99.9 % / t_typical $r"
        TYP[$i]+="${typ:-} "; P99[$i]+="${p99:-} "; P999[$i]+="${p999:-} "; RATIO[$i]+="$r "
    done
done
for i in "${!CONFIGS[@]}"; do
    m() { echo "$1" | tr ' ' '\n' | grep -E '^[0-9.]+$' | median; }
    echo "${CONFIGS[$i]}: medians: t_typical $(m "${TYP[$i]}") us, 99 % $(m "${P99[$i]}") us," \
        "99.9 % $(m "${P999[$i]}") us; 99.9 % / t_typical per trial $(m "${RATIO[$i]}") (target <= 10)"
done
