#!/usr/bin/env bash
# run.sh — softroce's interop suite against kernel rxe, from a clean machine to the result table.
#
#   tests/interop/run.sh [--update-docs]
#
# 1. rig.sh prereqs: can this machine run it (root, /dev/net/tun, network namespaces, qemu
#    installed or installable)?  If not, prints "SKIP: <why>" and exits 77.
# 2. rig.sh install: apt-get installs the missing host tools.
# 3. rig.sh build: builds the guest image into $SOFTROCE_INTEROP_CACHE (default
#    /var/cache/softroce-interop), or reuses it (about 2 min from nothing, seconds after).
# 4. cargo build --release --examples (the WRITE scenarios use examples/rdma_write_*), then
#    cargo test --release --test interop_rxe -- --ignored: boots the guest, runs each scenario in both
#    roles, prints the scenario × role table, powers the guest off and deletes the namespace.
#    --update-docs rewrites docs/interop.md with the table.
# Exit status: 0 all passed, 77 skipped (reason printed), anything else failed.  A suite that
# runs longer than $SOFTROCE_INTEROP_TIMEOUT seconds (default 600) is stopped and fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
RIG=tests/interop/rig.sh
CACHE=${SOFTROCE_INTEROP_CACHE:-/var/cache/softroce-interop}
T0=$SECONDS
[[ ${1:-} == --update-docs ]] && export SOFTROCE_INTEROP_UPDATE_DOCS=1

step() { printf '[interop %3d s] %s\n' $(( SECONDS - T0 )) "$*"; }

set +e
$RIG prereqs
rc=$?
set -e
[[ $rc == 0 ]] || exit "$rc"

# If the test process dies (timeout, signal) its guest and namespace must not outlive it.
cleanup() {
  local run
  run=$(cat "$CACHE/active-run" 2>/dev/null || true)
  if [[ -n $run ]]; then
    echo "interop: cleaning up after an interrupted run ($run)" >&2
    $RIG down "$run" || true
  fi
}
trap cleanup EXIT

step "host tools"
$RIG install
step "guest image"
$RIG build
# Release build: an unoptimised softroce keeps up with rxe's pingpong but not with a bulk
# ib_write_bw pipeline, whose go-back-N retransmissions then pile up (see README.md).
step "build softroce (release), its examples and the suite"
cargo build --release --examples --quiet
cargo test --release --test interop_rxe --no-run --quiet
step "suite"
timeout --signal=TERM "${SOFTROCE_INTEROP_TIMEOUT:-600}" \
  cargo test --release --test interop_rxe -- --ignored --nocapture --test-threads=1
step "done: interop suite passed"
