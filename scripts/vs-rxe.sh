#!/usr/bin/env bash
# vs-rxe.sh — softroce against kernel rxe side by side (issue 23 item 1): the interop rig's
# QEMU guest (Debian 12, kernel 6.1, TCG) runs Debian's unmodified perftest between two
# addresses of one veth pair inside the guest, first over kernel rxe (rxea on va, rxeb on vb,
# as the interop suite's control runs), then over softroce (`softroce exec --ip` on the same
# two addresses, after `modprobe -r rdma_rxe`: rxe's UDP socket owns port 4791 while the module
# is loaded), alternating the two stacks round by round. Both stacks see the same wire, the
# same guest, the same tools and flags.
#
#   sudo scripts/vs-rxe.sh [--rounds N] [--tests "write_bw read_bw ..."] [--sizes "64 4096"]
#
#   --rounds N   rounds per stack (default 3); round k runs rxe then softroce for odd k and
#                softroce then rxe for even k
#   --tests T    perftest tools without "ib_" (default: write_bw read_bw send_bw write_lat
#                read_lat send_lat)
#   --sizes S    message sizes in bytes (default: 64 4096 65536)
#   --build DIR  the softroce build to run: DIR/softroce and DIR/softroce-libs (default:
#                target/release, built here), for a before/after of two builds
#
# Prints one row per tool and size: each stack's median over the rounds with its [min-max],
# and the ratio softroce / rxe (median of the per-round ratios, with their range). Bandwidth
# rows compare BW average (MB/s) and the message rate (M msg/s, the same ratio); latency rows
# compare t_typical and the 99 % percentile. A ratio above 1 is better for softroce on a
# bandwidth row and worse on a latency row. Raw perftest output: RUNDIR/vs-rxe-*.out.
#
# softroce's environment variables (SOFTROCE_RT=1, SOFTROCE_BUSY_POLL=0, ...) set for this script
# are set for the softroce runs in the guest.
#
# Needs what tests/interop/run.sh needs (root, /dev/net/tun, qemu: it installs and builds the
# same way) and a release build of softroce (built here). Takes about 5 min per round on an
# idle 2-core host. Pause anything else that uses the CPU: under TCG the guest's two vCPUs
# are the measurement.
set -euo pipefail
cd "$(dirname "$0")/.."
RIG=tests/interop/rig.sh
CACHE=${SOFTROCE_INTEROP_CACHE:-/var/cache/softroce-interop}

rounds=3
tests="write_bw read_bw send_bw write_lat read_lat send_lat"
sizes="64 4096 65536"
build=
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=${2:?}; shift 2 ;;
    --tests) tests=${2:?}; shift 2 ;;
    --sizes) sizes=${2:?}; shift 2 ;;
    --build) build=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "usage: scripts/vs-rxe.sh [--rounds N] [--tests T] [--sizes S] [--build DIR]" >&2; exit 2 ;;
  esac
done
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "vs-rxe: --rounds wants a positive number" >&2; exit 2; }

set +e
$RIG prereqs
rc=$?
set -e
[[ $rc == 0 ]] || exit "$rc"
$RIG install
$RIG build
if [[ -z $build ]]; then
  cargo build --release --quiet
  build=target/release
fi

run=$CACHE/runs/vs-rxe-$(date +%s)-$$
mkdir -p "$run/sr"
cp "$build/softroce" "$run/sr/"
cp -rL "$build/softroce-libs" "$run/sr/"
trap '$RIG down "$run" >/dev/null || true' EXIT
$RIG up "$run"

# Iterations per run: enough for a stable median under TCG, few enough for a round in minutes.
iters() {
  case "$1:$2" in
    *_lat:*) echo 1000 ;;
    *_bw:64) echo 5000 ;;
    *_bw:4096) echo 2000 ;;
    *) echo 300 ;;
  esac
}

# The guest job of one stack and round: brings the stack up on va/vb, runs every tool and
# size (server on 10.77.0.2, client on 10.77.0.1), and prints each run's output between
# "### <tool> <size>" and "### rc <client status> <server status>".
job() {
  local stack=$1 f=$run/vs-rxe-job.sh t s
  {
    echo 'source /share/lib.sh'
    # softroce's own settings (SOFTROCE_RT, SOFTROCE_BUSY_POLL, ...) reach the guest's runs.
    local v
    for v in $(compgen -e | grep '^SOFTROCE_' | grep -v '^SOFTROCE_INTEROP'); do
      printf 'export %s=%q\n' "$v" "${!v}"
    done
    if [[ $stack == rxe ]]; then
      cat <<'EOF'
modprobe rdma_rxe
if ip link show va >/dev/null 2>&1; then
  # the veth pair of an earlier round; the devices too if rxe ran last
  [[ -e /sys/class/infiniband/rxea ]] || rdma link add rxea type rxe netdev va || exit 96
  [[ -e /sys/class/infiniband/rxeb ]] || rdma link add rxeb type rxe netdev vb || exit 96
else
  rxe_pair_up || exit 96
fi
GA=$(gid_index rxea 10.77.0.1) && GB=$(gid_index rxeb 10.77.0.2) || exit 95
S=(); SA=(-d rxeb -x "$GB"); C=(); CA=(-d rxea -x "$GA" 10.77.0.2)
EOF
    else
      cat <<'EOF'
if ! ip link show va >/dev/null 2>&1; then
  modprobe rdma_rxe; rxe_pair_up || exit 96
fi
for d in rxea rxeb rxe0; do rdma link delete "$d" 2>/dev/null; done
modprobe -r rdma_rxe || exit 94
S=(/share/sr/softroce exec --ip 10.77.0.2 --); SA=(-x 1)
C=(/share/sr/softroce exec --ip 10.77.0.1 --); CA=(-x 1 10.77.0.2)
EOF
    fi
    # -F: no CPU-frequency check (the guest has no cpufreq). The timeouts only end a run
    # that hangs (the row then fails the script); they are far above any run's length.
    cat <<'EOF'
one() {
  local tool=ib_$1 size=$2 n=$3 crc src sp
  echo "### $1 $2"
  timeout 300 "${S[@]}" "$tool" -F -s "$size" -n "$n" "${SA[@]}" > /tmp/srv.out 2>&1 &
  sp=$!
  if wait_listen 18515; then
    timeout 240 "${C[@]}" "$tool" -F -s "$size" -n "$n" "${CA[@]}" 2>&1
    crc=$?
  else
    crc=listen
  fi
  wait "$sp"
  src=$?
  sed 's/^/server: /' /tmp/srv.out
  echo "### rc $crc $src"
}
EOF
    for t in $tests; do
      for s in $sizes; do
        echo "one $t $s $(iters "$t" "$s")"
      done
    done
  } > "$f"
  $RIG guest "$run" "$f" 3600
}

results=$run/results.txt
: > "$results"
for k in $(seq "$rounds"); do
  order="rxe softroce"
  (( k % 2 == 0 )) && order="softroce rxe"
  for stack in $order; do
    out=$run/vs-rxe-$stack-$k.out
    echo "== round $k: $stack"
    job "$stack" > "$out" 2>&1 || { echo "vs-rxe: the $stack job of round $k failed:"; tail -20 "$out"; exit 1; }
    # One line per run: stack round tool size col... (perftest's result row; bw: #bytes
    # #iterations peak avg msgrate; lat: #bytes #iterations t_min t_max t_typical t_avg
    # t_stdev 99% 99.9%).
    awk -v stack="$stack" -v k="$k" '
      /^### rc / { if ($3 != 0 || row == "") { printf "vs-rxe: %s round %s %s %s failed (client %s, server %s)\n", stack, k, tool, size, $3, $4 > "/dev/stderr"; bad = 1 } else print stack, k, tool, size, row; row = ""; next }
      /^### / { tool = $2; size = $3; row = ""; next }
      /^server:/ { next }
      $1 == size && NF >= 5 && $2 ~ /^[0-9]+$/ { row = $0 }
      END { exit bad }' "$out" >> "$results" || { echo "vs-rxe: see $out"; exit 1; }
  done
done

echo
echo "softroce / rxe in the rig's guest, $rounds rounds each, alternating (medians [min-max])"
printf '%-10s %6s  %-9s %-24s %-24s %s\n' test size metric rxe softroce "softroce/rxe"
for t in $tests; do
  for s in $sizes; do
    if [[ $t == *_lat ]]; then metrics="t_typical:5 99%:8"; else metrics="MB/s:4 Mmsg/s:5"; fi
    for m in $metrics; do
      name=${m%%:*} col=${m##*:}
      awk -v t="$t" -v s="$s" -v col="$col" -v name="$name" '
        function sort(a, n,   i, j, x) { for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x } }
        function med(a, n) { sort(a, n); return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
        function cell(a, n,   m) { m = med(a, n); return sprintf("%.4g [%.4g-%.4g]", m, a[1], a[n]) }
        $3 == t && $4 == s { v = $(4 + col); if ($1 == "rxe") r[$2] = v; else q[$2] = v }
        END {
          n = 0; for (k in r) if (k in q && r[k] > 0) { n++; ra[n] = q[k] / r[k]; x[n] = r[k]; y[n] = q[k] }
          if (n == 0) { printf "%-10s %6s  %-9s (no pair of results)\n", t, s, name; exit }
          cx = cell(x, n); cy = cell(y, n); cr = cell(ra, n)
          printf "%-10s %6s  %-9s %-24s %-24s %s\n", t, s, name, cx, cy, cr
        }' "$results"
    done
  done
done
echo "(raw output and results.txt: $run)"
