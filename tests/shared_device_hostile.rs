//! A shared device (issue 21) against bad input, as its acceptance asks: "a killed process,
//! a stale QPN, a CM message for a CM ID whose process is gone, a flood of packets for
//! unknown QPNs: no hang, no crash of another process, counted drops" (tests/shared_device.rs
//! has the killed process mid-transfer).
//!
//! In each test the test process itself opens the device of the address (so it holds a slot
//! and can read its own device's counters and ask the keeper for its drop count,
//! `UdpLink::keeper_drops`), and an `ibv_rc_pingpong` server and client, run through
//! `softroce exec` with buffer checks (`-c`), share the device with it. Meanwhile the test
//! sends well-formed RoCEv2 datagrams (built with the engine's `wire` emit, correct ICRC)
//! from a plain UDP socket on another loopback address. The pair must finish its run and
//! exit 0 (its checks passed), and the keeper must still answer afterwards. Skipped, saying
//! why, only when the programs are not installed (CI installs them).

mod exec_support;
use exec_support::*;
use softroce::cm::{CmConfig, CmEngine, ConnectParams};
use softroce::net::UdpDevice;
use softroce::transport::{DropReason, Instant as EngineInstant};
use softroce::wire::cm::{CmMadRepr, CmMsgRepr, DreqRepr, RejReason, RepRepr, port_space};
use softroce::wire::mad::{MAD_LEN, MadHdrRepr};
use softroce::wire::{BthRepr, DethRepr, IcrcIp, Opcode, PacketRepr, Psn, ROCE_V2_UDP_PORT};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

const GSI_QKEY: u32 = 0x8001_0000;

/// A program under `softroce exec` with its lines read as they come, waiting up to 60 s for
/// a line and 120 s for its exit (these runs share the CPU with the flood).
fn lines(ip: &str, args: &[&str]) -> Lines {
    Lines::spawn_with_limits(ip, args, Duration::from_secs(60), Duration::from_secs(120))
}

/// The QPN in an ibv_rc_pingpong "local address: ... QPN 0x010000, ..." line.
fn qpn_of(line: &str) -> u32 {
    let q = line
        .split("QPN ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .unwrap_or_else(|| panic!("no QPN in {line:?}"));
    u32::from_str_radix(q.trim().trim_start_matches("0x"), 16).unwrap()
}

/// An ibv_rc_pingpong server and client on `ip` (TCP port `port`), `iters` exchanges with
/// buffer checks, both connected (each printed its peer's address): the pair and the slots
/// of its two processes.
fn live_pair(ip: &str, port: u16, iters: u32) -> (Lines, Lines, [u32; 2]) {
    let (port, iters) = (port.to_string(), iters.to_string());
    let mut args = vec![
        "ibv_rc_pingpong",
        "-g",
        "1",
        "-c",
        "-n",
        &iters,
        "-p",
        &port,
    ];
    let mut s = lines(ip, &args);
    wait_tcp_listen(port.parse().unwrap(), &mut None);
    args.push(ip);
    let mut c = lines(ip, &args);
    let slots = [
        qpn_of(&s.wait_for("local address")) >> 16,
        qpn_of(&c.wait_for("local address")) >> 16,
    ];
    s.wait_for("remote address");
    c.wait_for("remote address");
    (s, c, slots)
}

/// Both processes of the pair exit 0 having done all `iters` exchanges.
///
/// The pair is waited for while it makes progress, not for a fixed time: under load (a CPU
/// hog per core beside the two busy-polling processes, `scripts/soak-tests.sh --load`) each
/// message waits for a scheduler time slice and 20,000 exchanges took 119-128 s, past
/// `lines`' 120 s exit limit, where an idle machine takes seconds. Progress is the device's
/// `rdma_recvs` (every process's receive completions: the pair's messages; retransmissions
/// and drops do not move it). Once it stands still for [`PAIR_STALL`] the pair is stuck:
/// the device's counters are printed, and `finish` reports the processes' stacks.
fn pair_finishes(dev: &UdpDevice, mut s: Lines, mut c: Lines, iters: u32) {
    let mut last = dev.counters().rdma_recvs;
    let mut moved = Instant::now();
    while c.running() || s.running() {
        let now = dev.counters().rdma_recvs;
        if now != last {
            (last, moved) = (now, Instant::now());
        } else if moved.elapsed() > PAIR_STALL {
            eprintln!(
                "the pair made no progress for {PAIR_STALL:?} (client running {}, server \
                 running {}); the device's counters:\n{:?}",
                c.running(),
                s.running(),
                dev.counters()
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (cs, ct) = c.finish("ibv_rc_pingpong client");
    let (ss, st) = s.finish("ibv_rc_pingpong server");
    let done = format!("{iters} iters in");
    assert!(
        cs.success() && ss.success() && ct.contains(&done) && st.contains(&done),
        "client ({cs}):\n{ct}\nserver ({ss}):\n{st}"
    );
}

/// How long the pair may go without a receive completion before [`pair_finishes`] calls it
/// stuck (a message of rc_pingpong's takes milliseconds even under load).
const PAIR_STALL: Duration = Duration::from_secs(30);

/// Waits (up to 20 s) until `f` holds; panics naming `what` and the last value otherwise.
fn eventually<T: std::fmt::Debug>(what: &str, mut f: impl FnMut() -> (bool, T)) {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let (ok, v) = f();
        if ok {
            return;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}: {v:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The keeper's count of dropped datagrams, asked by the test's own share of the device.
fn keeper_drops(dev: &UdpDevice) -> u64 {
    dev.link()
        .keeper_drops()
        .expect("the test's device is shared")
        .expect("the keeper answers")
}

/// A peer on loopback address `ip` speaking RoCEv2 from a plain UDP socket: bound to
/// port 4791 so that CM answers (sent to the requester's port 4791) come back to it.
struct Peer {
    sock: UdpSocket,
    ip: Ipv4Addr,
    cm: CmEngine,
    t0: Instant,
}

impl Peer {
    fn new(ip: &str) -> Peer {
        let ip: Ipv4Addr = ip.parse().unwrap();
        let sock = UdpSocket::bind((ip, ROCE_V2_UDP_PORT)).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        Peer {
            sock,
            ip,
            cm: CmEngine::new(CmConfig::new(IpAddr::V4(ip), 0x5eed_0001, 11)),
            t0: Instant::now(),
        }
    }

    /// A datagram of `opcode` to `dest_qpn` on `dst` with `payload` (and `deth` for UD),
    /// emitted by the engine's `wire` with its ICRC.
    fn datagram(
        &self,
        dst: Ipv4Addr,
        opcode: Opcode,
        dest_qpn: u32,
        deth: Option<DethRepr>,
        payload: &[u8],
    ) -> Vec<u8> {
        let mut r = PacketRepr::new(BthRepr::new(opcode, dest_qpn, Psn::new(0x42)));
        r.deth = deth;
        r.payload_len = payload.len();
        let mut buf = vec![0u8; r.buffer_len()];
        let ip = IcrcIp::V4 {
            src: self.ip,
            dst,
            ident: 0,
            src_port: ROCE_V2_UDP_PORT,
            dst_port: ROCE_V2_UDP_PORT,
        };
        let n = r.emit(&mut buf, payload, &ip);
        buf.truncate(n);
        buf
    }

    fn send(&self, dst: Ipv4Addr, bytes: &[u8]) {
        self.sock.send_to(bytes, (dst, ROCE_V2_UDP_PORT)).unwrap();
    }

    fn send_mad(&self, dst: Ipv4Addr, mad: &[u8; MAD_LEN]) {
        let deth = DethRepr {
            qkey: GSI_QKEY,
            src_qpn: 1,
        };
        let d = self.datagram(dst, Opcode::UD_SEND_ONLY, 1, Some(deth), mad);
        self.send(dst, &d);
    }

    /// The CM MADs that come to this peer within `wait`, up to `n` of them.
    fn recv_mads(&self, wait: Duration, n: usize) -> Vec<CmMadRepr> {
        let end = Instant::now() + wait;
        let mut got = Vec::new();
        let mut buf = [0u8; 2048];
        while Instant::now() < end && got.len() < n {
            let Ok(len) = self.sock.recv(&mut buf) else {
                continue;
            };
            // BTH (12) + DETH (8) + MAD + ICRC (4).
            if len == 12 + 8 + MAD_LEN + 4
                && let Ok(m) = CmMadRepr::parse(&buf[20..20 + MAD_LEN])
            {
                got.push(m);
            }
        }
        got
    }

    /// A REQ (rdma_cm format) from this peer's engine to `dst:port`.
    fn req(&mut self, dst: Ipv4Addr, port: u16) -> [u8; MAD_LEN] {
        let p = ConnectParams::rdma_cm(
            SocketAddr::new(IpAddr::V4(self.ip), 40000),
            SocketAddr::new(IpAddr::V4(dst), port),
            port_space::TCP,
            0x77,
            0x1234,
            3,
            b"hostile",
        )
        .unwrap();
        let now = EngineInstant::from_nanos(self.t0.elapsed().as_nanos() as u64 + 1);
        self.cm.connect(now, &p).unwrap();
        *self
            .cm
            .poll_mad()
            .expect("the peer's engine queued a REQ")
            .mad
    }
}

fn mad(msg: CmMsgRepr) -> [u8; MAD_LEN] {
    CmMadRepr {
        hdr: MadHdrRepr::cm(0x4242, 0),
        msg,
    }
    .to_bytes()
}

/// A REP answering a REQ of comm ID `remote_comm_id` (which nobody sent).
fn stray_rep(remote_comm_id: u32) -> [u8; MAD_LEN] {
    mad(CmMsgRepr::Rep(RepRepr {
        local_comm_id: 0x0bad_0001,
        remote_comm_id,
        local_qkey: 0,
        local_qpn: 0x99,
        local_eecn: 0,
        starting_psn: 0,
        responder_resources: 0,
        initiator_depth: 0,
        target_ack_delay: 0,
        failover_accepted: 0,
        end_to_end_flow_control: false,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: 1,
        private_data: [0; 196],
    }))
}

/// A DREQ for the connection of comm ID `remote_comm_id` (which does not exist).
fn stray_dreq(remote_comm_id: u32) -> [u8; MAD_LEN] {
    mad(CmMsgRepr::Dreq(DreqRepr {
        local_comm_id: 0x0bad_0002,
        remote_comm_id,
        remote_qpn_eecn: 0x99,
        private_data: [0; 220],
    }))
}

fn rejs(mads: &[CmMadRepr]) -> Vec<RejReason> {
    mads.iter()
        .filter_map(|m| match &m.msg {
            CmMsgRepr::Rej(r) => Some(r.reason),
            _ => None,
        })
        .collect()
}

fn dreps(mads: &[CmMadRepr]) -> usize {
    mads.iter()
        .filter(|m| matches!(m.msg, CmMsgRepr::Drep(_)))
        .count()
}

/// The keeper answers a REQ for a port nobody listens on with REJ 8 (invalid service ID),
/// as the kernel CM does.
fn keeper_answers(p: &mut Peer, dst: Ipv4Addr, port: u16) {
    let req = p.req(dst, port);
    p.send_mad(dst, &req);
    let got = p.recv_mads(Duration::from_secs(5), 1);
    assert_eq!(rejs(&got), vec![RejReason::INVALID_SERVICE_ID], "{got:?}");
}

fn installed() -> bool {
    let ok = have("ibv_rc_pingpong") && have("stdbuf");
    if !ok {
        println!(
            "SKIPPED: ibv_rc_pingpong or stdbuf not installed (apt-get install ibverbs-utils)"
        );
    }
    ok
}

/// A flood of 40,000 RC SEND_ONLY datagrams while a pingpong pair shares the device with
/// the test: 20,000 for QPN 0x7f0011 (slot 0x7f, which no process holds: the keeper's, as
/// every slot without a socket is) and 20,000 for QPN `<test's slot>`ffff, a stale QPN of a
/// live slot (the test process never made it), with 1,000 more for a stale QPN of each of
/// the pair's slots. Sent in batches of 100 per target, each counted before the next (so
/// that no datagram is lost to a full socket buffer and the counts can be exact). Proves:
/// every datagram for the slot nobody holds is one drop in the keeper's count, every one for
/// the stale QPN one `UnknownQp` drop in the test's process's part of the device counters,
/// nothing else is counted there; the device's counters (every process's, the keeper's
/// included) count every datagram of the flood as one `UnknownQp` drop; the pair finishes its
/// checked run, and the keeper still answers a REQ afterwards.
#[test]
fn a_flood_for_unowned_and_stale_qpns_is_counted_and_harms_no_one() {
    if !installed() {
        return;
    }
    let (ip, dst) = ("127.0.79.21", Ipv4Addr::new(127, 0, 79, 21));
    let dev = UdpDevice::open("softroce_hostile", IpAddr::V4(dst)).unwrap();
    let me = u32::from(dev.link().slot().expect("the device is shared"));
    let iters = 20_000;
    let (mut s, mut c, pair) = live_pair(ip, 18811, iters);
    assert!(
        !pair.contains(&me) && !pair.contains(&0x7f),
        "{me} {pair:?}"
    );
    let mut p = Peer::new("127.0.79.22");
    let unowned = p.datagram(dst, Opcode::RC_SEND_ONLY, 0x7f_0011, None, b"nobody's");
    let stale = p.datagram(dst, Opcode::RC_SEND_ONLY, me << 16 | 0xffff, None, b"stale");
    let pair_stale: Vec<Vec<u8>> = pair
        .iter()
        .map(|s| p.datagram(dst, Opcode::RC_SEND_ONLY, s << 16 | 0xfff0, None, b"stale"))
        .collect();
    let (k0, d0, all0) = (keeper_drops(&dev), dev.process_counters(), dev.counters());
    let mut sent = 0u64;
    let mut to_pair = 0u64;
    for batch in 0..200 {
        for _ in 0..100 {
            p.send(dst, &unowned);
            p.send(dst, &stale);
        }
        if batch % 20 == 0 {
            for d in &pair_stale {
                for _ in 0..100 {
                    p.send(dst, d);
                }
                to_pair += 100;
            }
        }
        sent += 100;
        eventually("the batch counted", || {
            let (k, d) = (keeper_drops(&dev), dev.process_counters());
            let got = (
                k - k0,
                d.dropped(DropReason::UnknownQp) - d0.dropped(DropReason::UnknownQp),
            );
            (got == (sent, sent), (sent, got))
        });
    }
    // The device's counters hold every process's drops: the test's, the keeper's (the
    // unowned slot) and the pair's (their stale QPNs), while the pair still runs (so no drop
    // of its end is among them).
    eventually("the device's drops", || {
        let all = dev.counters();
        let n = all.dropped(DropReason::UnknownQp) - all0.dropped(DropReason::UnknownQp);
        (n == 2 * sent + to_pair, (2 * sent + to_pair, n))
    });
    assert!(
        s.running() && c.running(),
        "the pair ended before the flood did: give it more iterations"
    );
    // Nothing but the stale QPN was dropped by the test's device.
    let d = dev.process_counters();
    assert_eq!(
        d.dropped_total() - d0.dropped_total(),
        sent,
        "other drops: {d:?}"
    );
    pair_finishes(&dev, s, c, iters);
    keeper_answers(&mut p, dst, 7311);
    assert_eq!(
        keeper_drops(&dev) - k0,
        sent,
        "the REQ is an answer, not a drop"
    );
}

/// CM messages for a process that was killed and for a slot no process holds, while a
/// pingpong pair shares the device with the test: an `ibv_rc_pingpong` server is started on
/// the address and killed (SIGKILL: it runs nothing on its way out), which gives its slot
/// back to the keeper. Then, from a peer: a DREQ and a REP naming a comm ID of the killed
/// process's slot and of slot 0x7f (never given out), a REQ for a port nobody listens on,
/// and 1,000 RC SEND_ONLY datagrams for the killed process's own QPN. Proves: the keeper
/// answers each CM message as the kernel CM answers one for a connection or listener that
/// does not exist (DREQ: DREP; REP: REJ 5, invalid comm ID; REQ: REJ 8, invalid service ID),
/// for the killed process's slot as for the never-used one; the datagrams for the killed
/// process's QP are each one drop in the keeper's count and one `UnknownQp` drop in the
/// device's counters; the pair finishes its checked run.
#[test]
fn cm_messages_for_a_killed_process_get_the_kernel_answers() {
    if !installed() {
        return;
    }
    let (ip, dst) = ("127.0.79.23", Ipv4Addr::new(127, 0, 79, 23));
    let dev = UdpDevice::open("softroce_hostile", IpAddr::V4(dst)).unwrap();
    let mut victim = lines(ip, &["ibv_rc_pingpong", "-g", "1", "-p", "18821"]);
    let victim_qpn = qpn_of(&victim.wait_for("local address"));
    victim.kill_now();
    let gone = victim_qpn >> 16;
    let iters = 20_000;
    let (mut s, mut c, pair) = live_pair(ip, 18822, iters);
    assert!(!pair.contains(&gone), "{gone} {pair:?}");
    let mut p = Peer::new("127.0.79.24");
    let (k0, all0) = (keeper_drops(&dev), dev.counters());
    for slot in [gone, 0x7f] {
        let comm_id = slot << 24 | 0x00c0_ffee;
        p.send_mad(dst, &stray_dreq(comm_id));
        let got = p.recv_mads(Duration::from_secs(5), 1);
        assert_eq!(dreps(&got), 1, "DREQ for slot {slot:#x}: {got:?}");
        p.send_mad(dst, &stray_rep(comm_id));
        let got = p.recv_mads(Duration::from_secs(5), 1);
        assert_eq!(
            rejs(&got),
            vec![RejReason::INVALID_COMM_ID],
            "REP for slot {slot:#x}: {got:?}"
        );
    }
    keeper_answers(&mut p, dst, 7321);
    let to_gone = p.datagram(dst, Opcode::RC_SEND_ONLY, victim_qpn, None, b"late");
    for _ in 0..1000 {
        p.send(dst, &to_gone);
    }
    eventually("the late datagrams counted", || {
        let k = keeper_drops(&dev) - k0;
        (k == 1000, k)
    });
    // And in the device's counters, which every process reads.
    let all = dev.counters();
    assert_eq!(
        all.dropped(DropReason::UnknownQp) - all0.dropped(DropReason::UnknownQp),
        1000,
        "{all:?}"
    );
    assert!(
        s.running() && c.running(),
        "the pair ended before the test did: give it more iterations"
    );
    pair_finishes(&dev, s, c, iters);
}
