# lib.sh — helpers for the host's guest jobs (source /share/lib.sh).  Runs INSIDE the guest;
# the agent exports DEV, GIDX, HOST_IP, GUEST_IP and IF.

# rxe's hw_counters of device $1 (default $DEV), one "name=value" per line; then, for the
# diagnosis of packets rxe never saw, the guest's UDP error counters (udp_InErrors,
# udp_InCsumErrors, udp_RcvbufErrors from /proc/net/snmp) and its NIC's rx_dropped /
# rx_missed_errors / rx_crc_errors (if_*).
counters() {
  local d=/sys/class/infiniband/${1:-$DEV}/ports/1/hw_counters f v
  for f in "$d"/*; do read -r v < "$f"; echo "${f##*/}=$v"; done
  local names vals i
  { read -ra names && read -ra vals; } < <(grep '^Udp:' /proc/net/snmp)
  for i in "${!names[@]}"; do
    case ${names[$i]} in InErrors|InCsumErrors|RcvbufErrors) echo "udp_${names[$i]}=${vals[$i]}" ;; esac
  done
  for f in rx_dropped rx_missed_errors rx_crc_errors; do
    read -r v < "/sys/class/net/$IF/statistics/$f" 2>/dev/null && echo "if_$f=$v"
  done
  # Packets the kernel dropped from a CPU's input backlog (the second column, hex, per CPU).
  local dropped=0 row
  while read -ra row; do dropped=$((dropped + 16#${row[1]})); done < /proc/net/softnet_stat
  echo "if_softnet_dropped=$dropped"
  # rxe drops a packet whose ICRC is wrong, or whose destination GID it lacks, before it
  # counts it; kernels of rxe_recv.c's 2021-2022 shape say so in the log ("bad ICRC from
  # ADDR", "failed matching dgid", rate limited): the count of those lines so far.
  echo "dmesg_rxe_drops=$(dmesg 2>/dev/null | grep -cE 'bad ICRC|failed matching dgid')"
}

# Wait until something listens on TCP port $1 (default 18515); fail after ~20 s.
wait_listen() {
  local port=${1:-18515} i
  for i in $(seq 1 400); do
    [[ -n $(ss -Hltn "sport = :$port") ]] && return 0
    sleep 0.05
  done
  echo "nothing listens on TCP $port after 20 s" >&2
  return 1
}

# capture_start FILE: tcpdump the RoCE traffic of the NIC into FILE (tmpfs: writing pcaps to
# the 9p share under TCG loses packets); capture_stop: flush and stop it.
capture_start() {
  tcpdump -i "$IF" -n --immediate-mode -B 4096 -s 256 -w "$1" udp port 4791 2> "$1.log" &
  CAPTURE_PID=$!
  local i
  for i in $(seq 1 200); do grep -q listening "$1.log" && return 0; sleep 0.05; done
  echo "tcpdump did not start" >&2
  return 1
}
capture_stop() {
  sleep 0.3
  kill -INT "$CAPTURE_PID" 2>/dev/null
  wait "$CAPTURE_PID" 2>/dev/null
}

# Two more rxe devices, rxea (10.77.0.1 on veth va) and rxeb (10.77.0.2 on vb), for the
# rxe <-> rxe control runs.  Both addresses are local, so policy routing sends the traffic
# between them through the veth wire (the kernel would short-cut it over lo, which rxe drops;
# and 6.1 rxe works in init_net only, so two namespaces are no option).  Idempotent.
rxe_pair_up() {
  [[ -e /sys/class/infiniband/rxeb ]] && return 0
  local A=10.77.0.1 B=10.77.0.2 i
  ip link add va type veth peer name vb || return 1
  for i in va vb; do
    sysctl -qw net.ipv6.conf.$i.disable_ipv6=1 net.ipv4.conf.$i.rp_filter=0 net.ipv4.conf.$i.accept_local=1
  done
  sysctl -qw net.ipv4.conf.all.rp_filter=0
  ip addr add $A/24 dev va; ip addr add $B/24 dev vb
  ip link set va up; ip link set vb up
  ip rule add pref 100 lookup local; ip rule del pref 0 lookup local
  ip rule add pref 10 iif lo to $B lookup 101; ip rule add pref 11 iif lo to $A lookup 102
  ip route add $B dev va src $A table 101; ip route add $A dev vb src $B table 102
  rdma link add rxea type rxe netdev va && rdma link add rxeb type rxe netdev vb
}

# GID index of the RoCE v2 GID ::ffff:IP on device $1.
gid_index() {
  local want i g ty
  want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' ${2//./ })
  for _ in $(seq 1 50); do
    for i in $(seq 0 15); do
      read -r g < "/sys/class/infiniband/$1/ports/1/gids/$i" 2>/dev/null || continue
      [[ $g == "$want" ]] || continue
      read -r ty < "/sys/class/infiniband/$1/ports/1/gid_attrs/types/$i" 2>/dev/null || continue
      [[ $ty == "RoCE v2" ]] && { echo "$i"; return 0; }
    done
    sleep 0.1
  done
  return 1
}

# loss PCT: netem drops PCT % of the RoCE requests (UDP port 4791, BTH opcode other than 0x11
# ACKNOWLEDGE) in each direction: those the guest sends (a prio qdisc steers them to a netem
# band) and those it receives (redirected through ifb0, whose root qdisc is netem).  ACKs and
# other traffic (the TCP exchanges, ARP) pass untouched: rc_pingpong cannot survive losing
# the last ACK of a run, whose requester then retransmits into a QP the peer has destroyed.
# loss_report prints "netem dropped E guest→host and I host→guest RoCE requests";
# loss_off removes it all.
loss() {
  local pct=$1
  local roce=(match ip protocol 17 0xff match ip dport 4791 0xffff)
  local ack=(match u8 0x11 0xff at 28)   # BTH opcode: IPv4 (20 bytes, no options) + UDP (8)
  tc qdisc add dev "$IF" root handle 1: prio || return 1
  tc qdisc add dev "$IF" parent 1:3 handle 30: netem loss "$pct%" || return 1
  tc filter add dev "$IF" parent 1: prio 1 protocol ip u32 "${roce[@]}" "${ack[@]}" flowid 1:1 || return 1
  tc filter add dev "$IF" parent 1: prio 2 protocol ip u32 "${roce[@]}" flowid 1:3 || return 1
  modprobe ifb numifbs=1 && ip link set ifb0 up || return 1
  tc qdisc add dev "$IF" handle ffff: ingress || return 1
  tc filter add dev "$IF" parent ffff: prio 1 protocol ip u32 "${roce[@]}" "${ack[@]}" action ok || return 1
  tc filter add dev "$IF" parent ffff: prio 2 protocol ip u32 "${roce[@]}" \
    action mirred egress redirect dev ifb0 || return 1
  tc qdisc add dev ifb0 root netem loss "$pct%" || return 1
}
netem_dropped() {  # DEV -> packets its netem qdisc dropped
  tc -s qdisc show dev "$1" | awk '/^qdisc netem/{n=1} n && /dropped/{sub(",", "", $7); print $7; exit}'
}
loss_report() {
  echo "netem dropped $(netem_dropped "$IF") guest→host and $(netem_dropped ifb0) host→guest RoCE requests"
}
loss_off() {
  tc qdisc del dev "$IF" root 2>/dev/null
  tc qdisc del dev "$IF" ingress 2>/dev/null
  tc qdisc del dev ifb0 root 2>/dev/null
  return 0
}

# mad_delay MS: netem delays by MS ms the CM MADs the guest receives (RoCE packets to QP1: UDP
# port 4791, BTH destination QP 1), through ifb0 as `loss` does; mad_delay_off removes it.
# perftest 4.5's rdma_cm client sends its data connection's REQ right after the handshake that
# ends with the server's SEND; the server calls rdma_listen only after that SEND completed, so a
# fast client's REQ can reach rxe before the listen (REJ 8), and this perftest's retry then
# double-frees (fixed upstream in perftest 3d9d8d0).  A longer path for MADs only lets the
# server in the guest listen first.  mad_delay_off first stops the redirect, then lets netem's
# queue drain (a MAD still in it when its qdisc goes is lost, and rxe's counters then miss a
# packet the tap carried), then removes the qdisc; the suite calls it once the host's program
# and its stand-ins have exited.
mad_delay() {
  local ms=$1
  modprobe ifb numifbs=1 && ip link set ifb0 up || return 1
  tc qdisc add dev "$IF" handle ffff: ingress || return 1
  tc filter add dev "$IF" parent ffff: prio 1 protocol ip u32 match ip protocol 17 0xff \
    match ip dport 4791 0xffff match u32 0x00000001 0x00ffffff at 32 \
    action mirred egress redirect dev ifb0 || return 1
  tc qdisc add dev ifb0 root netem delay "${ms}ms" || return 1
}
mad_delay_off() {
  local i
  tc qdisc del dev "$IF" ingress 2>/dev/null
  for i in $(seq 1 100); do
    tc -s qdisc show dev ifb0 2>/dev/null | grep -q 'backlog 0b 0p' && break
    tc -s qdisc show dev ifb0 2>/dev/null | grep -q backlog || break
    sleep 0.05
  done
  tc qdisc del dev ifb0 root 2>/dev/null
  return 0
}

# wait_cm_listen PORT: wait until an rdma_cm id listens on PORT (any port space) on this
# host's kernel (`rdma res show cm_id`); fail after ~20 s.
wait_cm_listen() {
  local port=$1 i
  for i in $(seq 1 200); do
    rdma res show cm_id 2>/dev/null | grep -Eq "state LISTEN .*:${port}( |$)" && return 0
    sleep 0.1
  done
  echo "no rdma_cm id listens on port $port after 20 s" >&2
  return 1
}
