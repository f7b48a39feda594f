#!/usr/bin/env bash
# pyverbs-rdmacm.sh — pyverbs' rdma_cm tests (tests/test_rdmacm.py of Debian's
# python3-pyverbs) on softroce, in a private network and mount namespace this script makes.
#
#   scripts/pyverbs-rdmacm.sh [--check] [run_tests.py args...]   (root: unshare, mount)
#
# What the tests need, and how they get it here (docs/pyverbs.md, "rdma_cm"):
# - a net interface for the device: tests/base.py lists /sys/class/infiniband/DEV/device/net/
#   and takes the first address `ip -j addr show IFACE` reports. softroce devices are not in
#   sysfs, so a tmpfs over /sys/class (with /sys/class/net bound back) presents
#   softroce0/device/net/lo, and lo's first address, 127.0.0.1, is softroce0's address;
# - both sides on that one address: each test forks a passive and an active process that
#   bind the same IP. A softroce device belongs to one process (it owns UDP 4791 of its
#   address), so one line of tests/base_rdmacm.py is changed: the active side binds
#   127.0.0.2 (softroce1) instead, or the address a new `softroce_src` argument gives; and
#   two lines of tests/base.py give the multicast flow's players (both non-listening ids,
#   while the test runner holds softroce0) 127.0.0.3 (softroce2) for the passive one and
#   127.0.0.2 for the active one. Everything else runs unmodified.
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
  [[ $(id -u) == 0 ]] || { echo "pyverbs-rdmacm.sh: needs root (unshare -n -m, mount)"; exit 77; }
  command -v unshare >/dev/null || { echo "pyverbs-rdmacm.sh: unshare is missing"; exit 77; }
  [[ -x $SOFTROCE ]] || { echo "pyverbs-rdmacm.sh: $SOFTROCE is not built (cargo build)"; exit 77; }
  [[ -f $TESTS/run_tests.py || -f $TESTS/run_tests.py.gz ]] \
    || { echo "pyverbs-rdmacm.sh: $TESTS is missing (apt-get install python3-pyverbs)"; exit 77; }
  "$PY" -c 'import pyverbs' 2>/dev/null || { echo "pyverbs-rdmacm.sh: $PY cannot import pyverbs"; exit 77; }
  export SOFTROCE SOFTROCE_RDMACM_NS=1
  exec unshare -n -m --propagation private bash "${BASH_SOURCE[0]}" "$@"
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
# The bind mount first: rm must not walk into sysfs (the namespace's mounts go with it).
trap 'umount -l "$WORK/net" 2>/dev/null; rm -rf "$WORK"' EXIT
ip link set lo up
mkdir "$WORK/net"
mount --bind /sys/class/net "$WORK/net"
mount -t tmpfs softroce-sysfs /sys/class
mkdir -p /sys/class/net /sys/class/infiniband/softroce0/device/net/lo
mount --bind "$WORK/net" /sys/class/net

cp -r "$TESTS" "$WORK/tests"
gunzip -f "$WORK"/tests/*.gz
# Where the players bind (see above). A non-listening id binds kwargs['softroce_src'] when
# given, else 127.0.0.2 (softroce1): the active side of the connected tests. The multicast
# flow (tests/base.py, rdmacm_multicast_traffic) makes both players non-listening ids, while
# the test runner itself holds softroce0 (tests/utils.py, requires_mcast_support, keeps a
# Context open across the test): its passive player joins from 127.0.0.3 (softroce2), its
# active one from 127.0.0.2.
sed -i "s/self.ai = AddrInfo(src=addr, dst=addr, dst_service=self.port,/self.ai = AddrInfo(src=kwargs.get('softroce_src', '127.0.0.2'), dst=addr, dst_service=self.port,/" \
  "$WORK/tests/base_rdmacm.py"
sed -i -e "s/notifier=self.notifier, passive=False,/notifier=self.notifier, passive=False, softroce_src=('127.0.0.3' if passive else '127.0.0.2'),/" \
  -e "s/player.join_to_multicast(src_addr=self.ip_addr, mc_addr=mc_addr,/player.join_to_multicast(src_addr=('127.0.0.3' if passive else '127.0.0.2'), mc_addr=mc_addr,/" \
  "$WORK/tests/base.py"
grep -q "softroce_src', '127.0.0.2'" "$WORK/tests/base_rdmacm.py" \
  && [[ $(grep -c "('127.0.0.3' if passive else '127.0.0.2')" "$WORK/tests/base.py") == 2 ]] \
  || { echo "pyverbs-rdmacm.sh: tests/base_rdmacm.py or base.py changed: cannot move the players"; exit 1; }
cd "$WORK"
set +e
timeout 600 "$SOFTROCE" exec --ip 127.0.0.1,127.0.0.2,127.0.0.3 -- "$PY" tests/run_tests.py --dev softroce0 --gid 1 "${ARGS[@]}" \
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
