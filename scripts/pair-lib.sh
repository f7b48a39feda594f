# Sourced by scripts/capi-vs-engine.sh and scripts/capi-msg-rate.sh: one perftest-shaped pair
# on loopback, and the median of numbers. Needs A and B (server and client addresses).

# run_pair CMD... : starts CMD as the server (its output in $PAIR_SRV_LOG), then CMD with
# --ip=$A changed to --ip=$B and the server's address appended as the client; prints the
# client's result row (the line after perftest's "#bytes" header). Each side is killed
# after 60 s.
run_pair() {
    timeout 60 "$@" > "${PAIR_SRV_LOG:-/tmp/pair-server.log}" 2>&1 &
    local srv=$!
    sleep 0.7
    local out
    out=$(timeout 60 "${@/--ip=$A/--ip=$B}" 127.0.0.1 2>&1)
    wait $srv
    echo "$out" | awk '/#bytes/ {getline; print; exit}'
}

# median: the median of the numbers on standard input, one a line.
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
