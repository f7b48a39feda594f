#!/usr/bin/env bash
# rig.sh — the kernel-rxe peer for softroce's interop suite: a QEMU guest running Linux's
# Soft-RoCE driver (rdma_rxe) and the stock rdma-core / perftest / pyverbs tools, wired to a tap
# inside a network namespace that this script creates and deletes.  softroce runs in that
# namespace too, so every RoCE packet of the suite stays inside it.
#
#   rig.sh prereqs        exit 0 if this machine can run the suite; otherwise print why and exit 77
#   rig.sh install        apt-get install the host tools that are missing (qemu, debootstrap, ...)
#   rig.sh build          build (or reuse) the guest image in $SOFTROCE_INTEROP_CACHE
#   rig.sh up RUNDIR      create the netns + tap, boot the guest with RUNDIR as its share, wait
#                         until its rxe device is up; RUNDIR/ready then holds "DEV GID_INDEX"
#   rig.sh guest RUNDIR SCRIPT [TIMEOUT_S]
#                         run SCRIPT (a bash script file) in the guest; print its output; exit
#                         with its status (124 on timeout)
#   rig.sh down RUNDIR    power the guest off (kill QEMU if it does not stop), delete the netns
#   rig.sh shell          boot the guest with a root shell on this terminal (Ctrl-a x quits)
#
# Layout: netns $SOFTROCE_INTEROP_NETNS (default softroce-interop) holds tap srtap0 with the
# host (softroce) address 10.66.0.1/24; QEMU runs inside the netns, so the guest's virtio NIC is
# the other end of the tap; the guest gives its NIC 10.66.0.2/24 and puts rxe0 on it.  The guest
# has no other network.
#
# Job channel (how the host runs commands in the guest): the host writes RUNDIR/jobs/N.sh
# (atomically, by rename); the guest's agent (guest/agent.sh) runs it with bash, writes its
# output to RUNDIR/jobs/N.out and then its exit status to RUNDIR/jobs/N.rc.  RUNDIR/jobs/stop
# makes the agent exit, which powers the guest off.
set -euo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${SOFTROCE_INTEROP_CACHE:-/var/cache/softroce-interop}
NS=${SOFTROCE_INTEROP_NETNS:-softroce-interop}
TAP=srtap0
HOST_IP=10.66.0.1
GUEST_IP=10.66.0.2
PREFIX=24
# tcpdump captures the tap for the C-library scenarios; ibverbs-utils, perftest and
# rdmacm-utils are the tools those run through softroce's libibverbs.so.1 and librdmacm.so.1
# on the host; gcc and librdmacm-dev build the rdma_cm scenarios' C programs; ucx-utils and
# openmpi-bin run the UCX and MPI scenarios' host side, libopenmpi-dev (mpicc) builds the
# MPI program.
HOST_TOOLS=(qemu-system-x86 debootstrap busybox-static cpio kmod e2fsprogs zstd iproute2 tcpdump
  ibverbs-utils perftest rdmacm-utils gcc libc6-dev librdmacm-dev ucx-utils openmpi-bin
  libopenmpi-dev)
G=$CACHE/guest

die() { echo "rig.sh: $*" >&2; exit 1; }

# ---------------------------------------------------------------------------- prereqs
prereqs() {
  local why=()
  [[ $(id -u) == 0 ]] || why+=("not root (network namespaces, tap devices and debootstrap need root)")
  [[ -c /dev/net/tun ]] || why+=("/dev/net/tun is missing (no tap devices)")
  command -v ip >/dev/null || why+=("iproute2 'ip' is missing")
  if ! command -v qemu-system-x86_64 >/dev/null && ! command -v apt-get >/dev/null; then
    why+=("qemu-system-x86_64 is not installed and there is no apt-get to install it")
  fi
  [[ $(uname -m) == x86_64 ]] || why+=("host is $(uname -m); the guest is amd64 and runs under TCG only on x86_64 here")
  if ((${#why[@]} == 0)); then
    # a namespace we can create and delete proves the kernel allows it (containers may not)
    local probe=softroce-interop-probe-$$
    if ip netns add "$probe" 2>/dev/null; then
      ip netns del "$probe"
    else
      why+=("cannot create a network namespace ('ip netns add' failed)")
    fi
  fi
  if ((${#why[@]})); then
    printf 'SKIP: %s\n' "${why[@]}"
    exit 77
  fi
  echo "prereqs: ok (root, /dev/net/tun, netns, $(command -v qemu-system-x86_64 >/dev/null && echo qemu installed || echo 'qemu installable with apt-get'))"
}

# ---------------------------------------------------------------------------- install
pkg_installed() { dpkg-query -W -f '${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
install_tools() {
  local missing=() p
  for p in "${HOST_TOOLS[@]}"; do pkg_installed "$p" || missing+=("$p"); done
  if ((${#missing[@]} == 0)); then echo "install: host tools present"; return 0; fi
  echo "install: apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# ---------------------------------------------------------------------------- up / down
qemu_cmd() {  # the QEMU command line; $1 = share dir; rest: extra options
  local share=$1; shift
  local accel=${SOFTROCE_INTEROP_ACCEL:-tcg}
  local aopt=$accel cpu=max
  [[ $accel == tcg ]] && aopt=tcg,thread=multi
  [[ $accel == kvm ]] && cpu=host
  QEMU=(qemu-system-x86_64 -accel "$aopt" -cpu "$cpu" -smp "${SOFTROCE_INTEROP_SMP:-2}" -m 1024
    -nodefaults -no-user-config -display none -no-reboot
    -kernel "$G/vmlinuz" -initrd "$G/initrd.img"
    -append "console=ttyS0 quiet panic=-1 mitigations=off tsc=reliable 8250.nr_uarts=1 random.trust_cpu=on"
    -drive "file=$G/rootfs.img,if=virtio,format=raw,snapshot=on"
    -virtfs "local,path=$share,mount_tag=share,security_model=none,id=share"
    "$@")
}

netns_up() {
  if ip netns list | grep -qw "^$NS"; then
    local owner
    owner=$(cat "$CACHE/active-run" 2>/dev/null || true)
    if [[ -n $owner && -f $owner/qemu.pid ]] && kill -0 "$(cat "$owner/qemu.pid")" 2>/dev/null; then
      die "netns $NS is in use by a running suite ($owner); run 'rig.sh down $owner' if it is stale"
    fi
    echo "up: removing stale netns $NS" >&2
    ip netns del "$NS"
  fi
  ip netns add "$NS"
  ip -n "$NS" link set lo up
  ip netns exec "$NS" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
  ip -n "$NS" tuntap add dev "$TAP" mode tap
  ip -n "$NS" addr add "$HOST_IP/$PREFIX" dev "$TAP"
  ip -n "$NS" link set "$TAP" up
}

up() {
  local run=${1:?usage: rig.sh up RUNDIR}
  for f in vmlinuz initrd.img rootfs.img; do
    [[ -f $G/$f ]] || die "missing $G/$f: run 'rig.sh build' first"
  done
  mkdir -p "$run/jobs"
  run=$(cd "$run" && pwd)
  rm -f "$run"/{ready,cmd.log,cmd.rc,console.log,qemu.pid,qemu.log,dmesg.txt,boot_uptime} "$run"/jobs/*
  cp "$HERE/guest/agent.sh" "$run/cmd.sh"
  cp "$HERE/guest/pyverbs_peer.py" "$HERE/guest/lib.sh" "$run/"
  printf 'HOST_IP=%s\nGUEST_IP=%s\nPREFIX=%s\nNETNS=%s\n' "$HOST_IP" "$GUEST_IP" "$PREFIX" "$NS" > "$run/env"
  netns_up
  echo "$run" > "$CACHE/active-run"
  qemu_cmd "$run" -netdev "tap,id=n0,ifname=$TAP,script=no,downscript=no" \
    -device "virtio-net-pci,netdev=n0,mac=52:54:00:66:00:02" \
    -serial "file:$run/console.log" -monitor none -daemonize -pidfile "$run/qemu.pid"
  local t0=$SECONDS
  ip netns exec "$NS" "${QEMU[@]}" > "$run/qemu.log" 2>&1 || { cat "$run/qemu.log" >&2; down "$run"; die "QEMU failed to start"; }
  local limit=${SOFTROCE_INTEROP_BOOT_TIMEOUT:-180}
  while [[ ! -s $run/ready ]]; do
    if [[ -f $run/cmd.rc ]] || ! kill -0 "$(cat "$run/qemu.pid" 2>/dev/null || echo 0)" 2>/dev/null; then
      echo "--- guest agent log:" >&2; cat "$run/cmd.log" >&2 2>/dev/null || true
      echo "--- console tail:" >&2; tail -20 "$run/console.log" >&2 || true
      down "$run"; die "the guest stopped before its rxe device was ready"
    fi
    if (( SECONDS - t0 > limit )); then
      echo "--- console tail:" >&2; tail -20 "$run/console.log" >&2 || true
      down "$run"; die "the guest was not ready within ${limit}s"
    fi
    sleep 0.1
  done
  echo "up: guest ready in $(( SECONDS - t0 )) s: $(cat "$run/ready") (netns $NS, host $HOST_IP, guest $GUEST_IP)"
}

down() {
  local run=${1:?usage: rig.sh down RUNDIR}
  local pid
  pid=$(cat "$run/qemu.pid" 2>/dev/null || true)
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
    touch "$run/jobs/stop" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "down: QEMU (pid $pid) did not power off; killing it" >&2
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  if ip netns list | grep -qw "^$NS"; then ip netns del "$NS"; fi
  if [[ "$(cat "$CACHE/active-run" 2>/dev/null)" == "$(cd "$run" 2>/dev/null && pwd)" ]]; then rm -f "$CACHE/active-run"; fi
  echo "down: guest stopped, netns $NS deleted"
}

# ---------------------------------------------------------------------------- guest job
guest_job() {
  local run=${1:?usage: rig.sh guest RUNDIR SCRIPT [TIMEOUT_S]} script=${2:?script} limit=${3:-120}
  local id
  id=manual-$(date +%s%N)
  cp "$script" "$run/jobs/$id.tmp"
  mv "$run/jobs/$id.tmp" "$run/jobs/$id.sh"
  local t0=$SECONDS
  while [[ ! -f $run/jobs/$id.rc ]]; do
    (( SECONDS - t0 > limit )) && { cat "$run/jobs/$id.out" 2>/dev/null; echo "rig.sh: guest job timed out" >&2; return 124; }
    sleep 0.05
  done
  cat "$run/jobs/$id.out"
  return "$(cat "$run/jobs/$id.rc")"
}

shell() {
  local share
  share=$(mktemp -d)
  qemu_cmd "$share" -serial mon:stdio
  exec "${QEMU[@]}"
}

case ${1:-} in
  prereqs) prereqs ;;
  install) install_tools ;;
  build) "$HERE/build-guest.sh" "${@:2}" ;;
  up) up "${@:2}" ;;
  down) down "${@:2}" ;;
  guest) guest_job "${@:2}" ;;
  shell) shell ;;
  *) sed -n '2,27p' "$0"; exit 2 ;;
esac
