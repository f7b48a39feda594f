#!/usr/bin/env bash
# pyverbs.sh — rdma-core's own Python test suite (Debian's python3-pyverbs, tests under
# /usr/share/doc/rdma-core/tests) on one softroce device, through `softroce exec`.
#
#   scripts/pyverbs.sh [--ip ADDR] [--check] [run_tests.py args...]
#
#   --ip ADDR   the device's address (default 127.0.121.1); the suite uses softroce0, GID 1
#   --check     (the whole suite only) exit 1 unless the run has 0 errors, 0 failures and at least the 86 passes
#               docs/pyverbs.md lists (kernel rxe 6.1's passes)
#   other args  go to run_tests.py (e.g. -v, or a module name: test_mr)
#
# Exits 77 when the suite is not installed (apt-get install python3-pyverbs rdma-core) or
# target/debug/softroce is not built (cargo build). Takes about a second.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SOFTROCE=${SOFTROCE:-$ROOT/target/debug/softroce}
TESTS=/usr/share/doc/rdma-core/tests
IP=127.0.121.1
CHECK=0
ARGS=()
while (($#)); do
  case $1 in
    --ip) IP=${2:?--ip needs an address}; shift 2 ;;
    --check) CHECK=1; shift ;;
    *) ARGS+=("$1"); shift ;;
  esac
done

[[ -x $SOFTROCE ]] || { echo "pyverbs.sh: $SOFTROCE is not built (cargo build)"; exit 77; }
[[ -f $TESTS/run_tests.py ]] || { echo "pyverbs.sh: $TESTS is missing (apt-get install python3-pyverbs)"; exit 77; }
# Debian's python3 (pyverbs is a module of its dist-packages), not a pyenv shim.
PY=/usr/bin/python3
"$PY" -c 'import pyverbs' 2>/dev/null || { echo "pyverbs.sh: $PY cannot import pyverbs"; exit 77; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cp -r "$TESTS" "$WORK/tests"
gunzip -f "$WORK"/tests/*.gz
cd "$WORK"
set +e
# --no-view: the rdma_cm tests (test_rdmacm) take their address from the device's netdev in
# /sys/class/infiniband (lo, whose first address is 127.0.0.1, not $IP); without the view they
# skip, and scripts/pyverbs-rdmacm.sh runs them where softroce0 is 127.0.0.1.
"$SOFTROCE" exec --no-view --ip "$IP" -- "$PY" tests/run_tests.py --dev softroce0 --gid 1 "${ARGS[@]}" \
  > "$WORK/out" 2>&1
rc=$?
set -e
cat "$WORK/out"
((CHECK)) || exit $rc

# unittest's summary: "Ran N tests", then "OK (skipped=S)" or "FAILED (errors=E, ...)".
ran=$(sed -n 's/^Ran \([0-9]*\) tests.*/\1/p' "$WORK/out" | tail -1)
last=$(grep -E '^(OK|FAILED)' "$WORK/out" | tail -1)
num() { sed -n "s/.*$1=\([0-9]*\).*/\1/p" <<< "$last"; }
skipped=$(num skipped); errors=$(num errors); failures=$(num failures)
skipped=${skipped:-0}; errors=${errors:-0}; failures=${failures:-0}
passed=$(( ${ran:-0} - skipped - errors - failures ))
echo "pyverbs.sh: ran ${ran:-0}: $passed passed, $skipped skipped, $errors errors, $failures failures"
if [[ -z $ran || $errors != 0 || $failures != 0 || $passed -lt 86 ]]; then
  echo "pyverbs.sh: FAIL (want 0 errors, 0 failures, at least 86 passed)"
  exit 1
fi
