#!/usr/bin/env bash
# mpi-netns.sh — an MPI job across N hosts, each host a network namespace with its own
# address and its own softroce device shared by that host's ranks, the hosts joined by a
# bridge whose links drop and delay packets (netem). Open MPI 4.1 over UCX (pml ucx,
# UCX_TLS=rc_verbs,ud_verbs:aux,self: every byte between ranks, on one host or two, goes
# over softroce), mpirun starting its daemons through `ip netns exec` where a cluster uses
# ssh. The program is tests/c/mpi_ring.c unless one is given: every rank checks its data.
#
#   scripts/mpi-netns.sh [--hosts N] [--ranks R] [--loss PCT] [--delay MS] [--keep]
#                        [--drop-first N:LEN] [--softroce PATH] [-- PROGRAM ARGS...]
#
#   --hosts N      namespaces srmpi-<pid>-h1..hN (default 4), addresses 10.77.0.1..N/24
#   --ranks R      ranks per host (default 2)
#   --loss PCT     netem loss on every host's link, each way (default 1)
#   --delay MS     netem delay on every host's link, each way (default 1)
#   --keep         leave the namespaces up at the end (--down removes every srmpi-* one)
#   --drop-first N:LEN  also drop exactly the first N RoCEv2 datagrams of IP length LEN that
#                  leave host h2 (nftables), e.g. 2:100 for UCX 1.13's ud_verbs wireup reply
#                  to h1 and its first resend; prints how many it dropped
#   --softroce P   the softroce binary (default target/release/softroce, built if missing)
#
# Needs root (ip netns, tc), mpicc/mpirun (libopenmpi-dev, openmpi-bin) and ucx-utils. Prints
# mpirun's output; exits with mpirun's status (0: every rank's checks passed). Real hosts: see
# README.md, "Open MPI across hosts".
set -euo pipefail
cd "$(dirname "$0")/.."

hosts=4
ranks=2
loss=1
delay=1
keep=0
drop_first=
softroce=
prog=()
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --loss) loss=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --drop-first) drop_first=$2; shift 2 ;;
    --softroce) softroce=$2; shift 2 ;;
    --down) for ns in $(ip netns list | awk '/^srmpi-/ {print $1}'); do ip netns del "$ns"; done; exit 0 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    --) shift; prog=("$@"); break ;;
    *) echo "mpi-netns.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if ! [[ $hosts =~ ^[1-9][0-9]?$ && $hosts -le 60 && $ranks =~ ^[1-9][0-9]?$ ]]; then
  echo "mpi-netns.sh: --hosts 1..60 and --ranks 1..99" >&2
  exit 2
fi
for tool in ip tc mpicc mpirun; do
  command -v "$tool" >/dev/null || { echo "mpi-netns.sh: $tool is missing" >&2; exit 2; }
done
if [ -z "$softroce" ]; then
  softroce=target/release/softroce
  [ -x "$softroce" ] || cargo build --release --quiet
fi
softroce=$(cd "$(dirname "$softroce")" && pwd)/$(basename "$softroce")

work=$(mktemp -d /tmp/srmpi.XXXXXX)
# This run's namespaces: <p>-sw (the bridge) and <p>-h1..hN, so that runs side by side
# do not meet.
p=srmpi-$$
down() {
  if [ "$keep" = 0 ]; then
    # What still runs in a namespace (mpirun's daemons and ranks when the job was cut
    # short) would outlive its deletion.
    for ns in $(seq -f "$p-h%g" "$hosts") "$p-sw"; do
      pids=$(ip netns pids "$ns" 2>/dev/null) && [ -n "$pids" ] && kill -9 $pids 2>/dev/null
      ip netns del "$ns" 2>/dev/null || true
    done
  fi
  rm -rf "$work"
}
trap down EXIT
# A SIGTERM or Ctrl-C ends the script through its EXIT trap.
trap 'exit 143' TERM
trap 'exit 130' INT

# The program: mpi_ring unless given.
if [ ${#prog[@]} -eq 0 ]; then
  mpicc -Wall -o "$work/mpi_ring" tests/c/mpi_ring.c
  prog=("$work/mpi_ring")
fi

# Loss and delay on link end DEV of namespace NS: netem where the kernel has it; else
# (kernels without sch_netem, as this project's CI machines) loss alone, by an nftables rule
# that drops each packet leaving DEV with probability PCT %, and no delay.
how=
impair() {
  local ns=$1 dev=$2
  if [ "$delay" = 0 ] && [ "$loss" = 0 ]; then
    how="no loss, no delay"
    return
  fi
  local netem=(netem delay "${delay}ms")
  [ "$loss" != 0 ] && netem+=(loss "${loss}%")
  if ip netns exec "$ns" tc qdisc add dev "$dev" root "${netem[@]}" 2>/dev/null; then
    how="netem delay ${delay}ms loss ${loss}% each way"
    return
  fi
  command -v nft >/dev/null || { echo "mpi-netns.sh: no netem in this kernel and no nft (apt-get install nftables)" >&2; exit 2; }
  # numgen random mod 10000 < loss*100: the loss in hundredths of a percent.
  local per10k
  per10k=$(awk -v l="$loss" 'BEGIN { printf "%d", l * 100 }')
  ip netns exec "$ns" nft -f - <<NFT
table netdev srmpi {
  chain egress_$dev {
    type filter hook egress device "$dev" priority 0;
    counter
    numgen random mod 10000 < $per10k counter drop
  }
}
NFT
  how="nftables: loss ${loss}% each way; no delay (this kernel has no netem)"
}

# The network: a bridge in <p>-sw, a veth from each host to it, loss (and delay) on both ends.
ip netns add "$p-sw"
ip -n "$p-sw" link add br0 type bridge
ip -n "$p-sw" link set br0 up
for i in $(seq "$hosts"); do
  ns=$p-h$i
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip -n "$ns" link add eth0 type veth peer name "h$i" netns "$p-sw"
  ip -n "$ns" addr add "10.77.0.$i/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$p-sw" link set "h$i" master br0
  ip -n "$p-sw" link set "h$i" up
  impair "$ns" eth0
  impair "$p-sw" "h$i"
  echo "h$i slots=$ranks" >> "$work/hostfile"
done
echo "== links: $how"
if [ -n "$drop_first" ]; then
  if ! [[ $drop_first =~ ^([0-9]+):([0-9]+)$ ]] || [ "$hosts" -lt 2 ]; then
    echo "mpi-netns.sh: --drop-first takes N:LEN and needs two hosts or more" >&2
    exit 2
  fi
  command -v nft >/dev/null || { echo "mpi-netns.sh: --drop-first needs nft (apt-get install nftables)" >&2; exit 2; }
  # numgen inc counts the rule's matches from 0: the first N are dropped.
  ip netns exec "$p-h2" nft -f - <<NFT
table netdev srmpi_first {
  chain egress_eth0 {
    type filter hook egress device "eth0" priority -1;
    udp dport 4791 ip length ${BASH_REMATCH[2]} numgen inc mod 1000000000 < ${BASH_REMATCH[1]} counter drop
  }
}
NFT
fi

# mpirun's "ssh": runs the daemon's command line on host h<i> in its namespace, under
# `softroce exec` with that host's address, so that its ranks find softroce0 there.
# Each host gets its own session directory (orte_tmpdir_base), as a real host has its own
# /tmp: the namespaces share one file system and one host name, and Open MPI 4.1's daemons
# of one job on one node name race in it. In 1 launch in 15-30 one daemon's mkdir of the
# job's directory lost (EEXIST: orte_init fails, the daemon exits 213 with its output on
# /dev/null) or one daemon crashed in hwloc_shmem_topology_write (the topology file the
# rtc_hwloc component writes there), and mpirun waited for it forever.
cat > "$work/netns-rsh" <<EOF
#!/bin/sh
# netns-rsh HOST COMMAND...: plm_rsh_agent of scripts/mpi-netns.sh.
host=\$1; shift
i=\${host#h}
mkdir -p "$work/tmp-\$host"
export OMPI_MCA_orte_tmpdir_base="$work/tmp-\$host"
exec ip netns exec "$p-\$host" "$softroce" exec --ip "10.77.0.\$i" -- sh -c "\$*"
EOF
chmod +x "$work/netns-rsh"

root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
echo "== mpirun: $hosts hosts x $ranks ranks"
set +e
UCX_TLS=rc_verbs,ud_verbs:aux,self UCX_NET_DEVICES=softroce0:1 \
  ip netns exec "$p-h1" mpirun "${root[@]}" --hostfile "$work/hostfile" \
  -np $((hosts * ranks)) --map-by slot \
  --mca plm_rsh_agent "$work/netns-rsh" --mca plm_rsh_no_tree_spawn 1 \
  --mca oob_tcp_if_include eth0 --mca pml ucx --mca btl self \
  -x UCX_TLS -x UCX_NET_DEVICES -x UCX_UD_VERBS_ETH_DGID_CHECK=n -x UCX_ADAPTIVE_PROGRESS=n \
  "${prog[@]}"
rc=$?
set -e
# The packet count of every nftables counter in table TABLE of namespace NS, in rule order.
counter_packets() {
  ip netns exec "$1" nft list table netdev "$2" 2>/dev/null \
    | awk '/counter packets/ { for (i = 1; i <= NF; i++) if ($i == "packets") print $(i + 1) }'
}
# What the nftables rules saw: every packet that left a link end, and those dropped.
if [[ $how == nftables* ]]; then
  sent=0
  dropped=0
  for ns in $(ip netns list | awk -v p="$p-" 'index($1, p) == 1 {print $1}'); do
    while read -r all drop; do
      sent=$((sent + all))
      dropped=$((dropped + drop))
    done < <(counter_packets "$ns" srmpi | paste - -)
  done
  echo "== links: $sent packets sent, $dropped dropped"
fi
if [ -n "$drop_first" ]; then
  echo "== drop-first: $(counter_packets "$p-h2" srmpi_first) dropped"
fi
echo "== mpirun exit $rc"
exit $rc
