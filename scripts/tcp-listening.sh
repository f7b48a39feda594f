# tcp-listening.sh — sourced by the measurement scripts (not run on its own):
# `listening PORT` waits (up to 10 s, polling /proc/net/tcp every 10 ms) until a socket of
# this network namespace listens on TCP port PORT, the out-of-band exchange a perftest-style
# server opens before it waits for its client; fails with a message naming the script.
listening() {
  local want
  want=$(printf ':%04X' "$1")
  for _ in $(seq 1000); do
    awk -v w="$want" '$2 ~ w"$" && $4 == "0A" {f=1} END {exit !f}' /proc/net/tcp && return 0
    sleep 0.01
  done
  echo "$(basename "$0"): nothing listens on TCP $1" >&2
  return 1
}
