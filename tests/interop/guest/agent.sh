#!/bin/bash
# agent.sh — runs INSIDE the rxe guest as /share/cmd.sh (started by the guest's init).
# 1. Puts kernel rxe on the guest's virtio NIC: address $GUEST_IP/$PREFIX (from /share/env),
#    IPv6 off (keeps the GID table to the link-local and IPv4 entries), `rdma link add rxe0`,
#    finds the GID index of the RoCE v2 GID ::ffff:$GUEST_IP and writes "rxe0 INDEX" to
#    /share/ready.
# 2. Runs the host's jobs: each /share/jobs/N.sh runs once, in the background, with bash;
#    output -> N.out, then exit status -> N.rc (written by rename, so a reader never sees half);
#    N.pid holds the job's session id, for killing it.
#    Jobs see DEV, GIDX, HOST_IP, GUEST_IP, IF in their environment.
# 3. Exits when /share/jobs/stop appears; init then powers the guest off.
set -uo pipefail
source /share/env
now() { cut -d' ' -f1 /proc/uptime; }
echo "agent: start at $(now)s"

IF=
for n in /sys/class/net/*; do
  n=${n##*/}
  [[ $n == lo ]] || { IF=$n; break; }
done
[[ -n $IF ]] || { echo "agent: no network interface"; exit 1; }
sysctl -qw "net.ipv6.conf.$IF.disable_ipv6=1"
ip addr add "$GUEST_IP/$PREFIX" dev "$IF"
ip link set "$IF" up
rdma link add rxe0 type rxe netdev "$IF" || { echo "agent: rdma link add failed"; dmesg | tail -5; exit 1; }

# GID index of ::ffff:GUEST_IP (RoCE v2); read with builtins: forks are slow under TCG
want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' ${GUEST_IP//./ })
GIDX=
p=/sys/class/infiniband/rxe0/ports/1
for _ in $(seq 1 100); do
  for i in $(seq 0 15); do
    read -r g < "$p/gids/$i" 2>/dev/null || continue
    [[ $g == "$want" ]] || continue
    read -r ty < "$p/gid_attrs/types/$i" 2>/dev/null || continue
    [[ $ty == "RoCE v2" ]] && { GIDX=$i; break 2; }
  done
  sleep 0.1
done
[[ -n $GIDX ]] || { echo "agent: no RoCE v2 GID for $GUEST_IP on rxe0"; exit 1; }
export DEV=rxe0 GIDX HOST_IP GUEST_IP IF
echo "agent: rxe0 on $IF ($GUEST_IP), RoCE v2 GID index $GIDX, ready at $(now)s"
echo "rxe0 $GIDX" > /share/ready.tmp && mv /share/ready.tmp /share/ready

# A fifo nobody writes: `read -t` on it is a sleep without a fork.
mkfifo /tmp/tick
exec 9<>/tmp/tick
declare -A started=()
while [[ ! -e /share/jobs/stop ]]; do
  for f in /share/jobs/*.sh; do
    [[ -e $f ]] || continue
    id=${f##*/}; id=${id%.sh}
    [[ -n ${started[$id]:-} ]] && continue
    started[$id]=1
    (
      # its own session, so that `kill -- -$(cat N.pid)` ends the job and all it started
      setsid bash "$f" > "/share/jobs/$id.out" 2>&1 < /dev/null &
      echo $! > "/share/jobs/$id.pid"
      wait $!
      echo $? > "/share/jobs/$id.rc.tmp"
      mv "/share/jobs/$id.rc.tmp" "/share/jobs/$id.rc"
    ) &
  done
  read -r -t 0.05 -u 9 _ || true
done
echo "agent: stop at $(now)s"
kill $(jobs -p) 2>/dev/null
exit 0
