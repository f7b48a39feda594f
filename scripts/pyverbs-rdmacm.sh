#!/usr/bin/env bash
# pyverbs-rdmacm.sh — pyverbs' rdma_cm tests (tests/test_rdmacm.py of Debian's
# python3-pyverbs) on softroce, in a private network and mount namespace this script makes.
#
#   scripts/pyverbs-rdmacm.sh [--check] [run_tests.py args...]   (root: unshare)
#
# What the tests need, and how they get it here (docs/pyverbs.md, "rdma_cm"):
# - a net interface for the device: tests/base.py lists /sys/class/infiniband/DEV/device/net/
#   and takes the first address `ip -j addr show IFACE` reports. `softroce exec` shows
#   softroce0 there with the netdev lo, whose first address is 127.0.0.1: so softroce0 is
#   127.0.0.1, in a private network namespace (nothing else of the host is on it);
# - both sides on that one address: each test forks a passive and an active process that
#   bind the same IP, and the test runner holds softroce0 meanwhile. softroce's devices are
#   shared by the processes of the host, as rxe0 is: the suite runs unmodified.
#
#   --check   exit 1 unless all 10 tests pass
#
# Exits 77 when not root, when unshare is missing, or when the suite, pyverbs or
# target/debug/softroce is missing.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SOFTROCE=${SOFTROCE:-$ROOT/target/debug/softroce}
TESTS=/usr/share/doc/rdma-core/tests
PY=/usr/bin/python3

if [[ ${SOFTROCE_RDMACM_NS:-} != 1 ]]; then
  [[ $(id -u) == 0 ]] || { echo "pyverbs-rdmacm.sh: needs root (unshare -n)"; exit 77; }
  command -v unshare >/dev/null || { echo "pyverbs-rdmacm.sh: unshare is missing"; exit 77; }
  [[ -x $SOFTROCE ]] || { echo "pyverbs-rdmacm.sh: $SOFTROCE is not built (cargo build)"; exit 77; }
  [[ -f $TESTS/run_tests.py || -f $TESTS/run_tests.py.gz ]] \
    || { echo "pyverbs-rdmacm.sh: $TESTS is missing (apt-get install python3-pyverbs)"; exit 77; }
  "$PY" -c 'import pyverbs' 2>/dev/null || { echo "pyverbs-rdmacm.sh: $PY cannot import pyverbs"; exit 77; }
  export SOFTROCE SOFTROCE_RDMACM_NS=1
  exec unshare -n bash "${BASH_SOURCE[0]}" "$@"
fi

# Inside the namespaces.
CHECK=0
ARGS=()
while (($#)); do
  case $1 in
    --check) CHECK=1; shift ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
((${#ARGS[@]})) || ARGS=(-v test_rdmacm)

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
ip link set lo up
cp -r "$TESTS" "$WORK/tests"
gunzip -f "$WORK"/tests/*.gz
cd "$WORK"
set +e
timeout 600 "$SOFTROCE" exec --ip 127.0.0.1 -- "$PY" tests/run_tests.py --dev softroce0 --gid 1 "${ARGS[@]}" \
  > "$WORK/out" 2>&1
rc=$?
set -e
cat "$WORK/out"
((CHECK)) || exit $rc

# unittest -v: "name (module.Class.name) ... ok", then "ERROR"/"FAIL"/"skipped ..." (on the
# same line, or on a later one when a player printed in between).
ok=$(grep -c ' \.\.\. ok$' "$WORK/out" || true)
bad=$(grep -E '^(ERROR|FAIL): ' "$WORK/out" | sed 's/^[A-Z]*: \([a-z_0-9]*\).*/\1/' | sort -u || true)
echo "pyverbs-rdmacm.sh: $ok passed; not passed: ${bad//$'\n'/ }"
if [[ -n $bad || $ok -lt 10 ]]; then
  echo "pyverbs-rdmacm.sh: FAIL (want all 10 tests to pass)"
  exit 1
fi
