#!/usr/bin/env bash
# soak-tests.sh — the flake hunt: runs the whole `cargo test` N times in a row, each run in a
# private network namespace (its own loopback, so nothing else on the host collides with the
# tests' addresses), and prints every failure with its test name.
#
#   scripts/soak-tests.sh [--load] [--interop] N
#
#   --load     run a CPU hog on every core (one busy shell loop per `nproc`) beside the tests
#              for the whole soak, as a loaded CI runner would be
#   --interop  soak tests/interop/run.sh (kernel rxe in the rig's QEMU guest) N times instead
#              of `cargo test`; it makes its own namespaces, so it runs in the host's
#
# Needs root (unshare -n). The tests are built once before the first run; each run's output is
# kept in $SOAK_DIR (default target/soak/<time>) as run-K.log. At the end it prints one line per
# failing test with the runs it failed in, then "N passed, M failed" counting runs, and exits 1
# if any run failed.
set -euo pipefail
cd "$(dirname "$0")/.."

load=0
interop=0
while [ $# -gt 0 ]; do
  case "$1" in
    --load) load=1; shift ;;
    --interop) interop=1; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
if [ $# -ne 1 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/soak-tests.sh [--load] [--interop] N" >&2
  exit 2
fi
runs=$1
dir=${SOAK_DIR:-target/soak/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$dir"

hogs=()
stop_hogs() {
  for p in "${hogs[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap stop_hogs EXIT

if [ "$interop" = 1 ]; then
  what="tests/interop/run.sh"
else
  what="cargo test"
  echo "== building the tests once"
  cargo test --no-run --quiet
fi
if [ "$load" = 1 ]; then
  for _ in $(seq "$(nproc)"); do
    ( while :; do :; done ) &
    hogs+=($!)
  done
  echo "== a CPU hog on each of $(nproc) cores"
fi

failed_runs=0
declare -A failures=()
for k in $(seq "$runs"); do
  log="$dir/run-$k.log"
  t0=$SECONDS
  rc=0
  if [ "$interop" = 1 ]; then
    tests/interop/run.sh >"$log" 2>&1 || rc=$?
  else
    unshare -n sh -c 'ip link set lo up && exec cargo test' >"$log" 2>&1 || rc=$?
  fi
  # Failing tests: libtest prints "test NAME ... FAILED"; the interop table prints FAIL rows.
  names=$(grep -E '^test .* \.\.\. FAILED$' "$log" | sed -E 's/^test (.*) \.\.\. FAILED$/\1/' || true)
  if [ "$interop" = 1 ]; then
    names+=$'\n'$(grep -E '\bFAIL(ED)?\b' "$log" | grep -vE '^test result|^error: test failed' | head -20 || true)
  fi
  if [ "$rc" -ne 0 ]; then
    failed_runs=$((failed_runs + 1))
    [ -n "${names//[$'\n ']/}" ] || names="(run exited $rc with no failing test named; see $log)"
    while IFS= read -r n; do
      [ -n "$n" ] && failures["$n"]+=" $k"
    done <<<"$names"
    echo "run $k/$runs: FAILED in $((SECONDS - t0)) s ($log)"
    while IFS= read -r n; do [ -n "$n" ] && echo "    $n"; done <<<"$names"
  else
    echo "run $k/$runs: passed in $((SECONDS - t0)) s"
  fi
done

echo "== $what x $runs$([ "$load" = 1 ] && echo ", loaded") (logs in $dir)"
for n in "${!failures[@]}"; do
  echo "FAILED in run(s)${failures[$n]}: $n"
done
echo "soak: $((runs - failed_runs)) passed, $failed_runs failed"
[ "$failed_runs" -eq 0 ]
