//! The `rdmacm_driver` fuzz check: librdmacm.so.1's own MAD path, its CM driver
//! (`crates/softroce-rdmacm/src/cma/driver.rs`: QP1's MADs and the timers fed to the engine,
//! then `pump` making rdma_cm events: a REQ's or SIDR_REQ's cma header made into a passive
//! id, the REP applied to the id's QP, REJ / DREQ / timeouts ending connections) and its
//! `rdma_*` calls, run unchanged on the in-memory bench (`softroce_rdmacm::testing::Bench`,
//! feature `testing`: one device L at 10.0.0.2 whose libibverbs.so.1 is memory) against a
//! peer CM engine P (10.0.0.1) and MADs built here. Shared by the cargo-fuzz target
//! `fuzz_targets/rdmacm_driver.rs` and the main crate's `tests/rdmacm_fuzz.rs` (both include
//! this file with `#[path]`), so every finding replays on stable.
//!
//! Input: a sequence of records, each a tag byte (bits 2-0: the kind) and a few argument bytes
//! ([`Op::decode`]; [`Op::encode`] writes them, for hand-made seeds); a missing byte reads
//! as 0. Records: a CM MAD built with the wire layer's emit API (REQ and SIDR_REQ with an
//! rdma_cm IP header that is right, names another address, has a bad version, mixes IPv4
//! and IPv6, is missing; the MAD cut short or with bytes flipped) to L from P, from a third
//! party C or from L itself; an `rdma_*` call on one of the ids L's application holds (or
//! one of two shortcuts: listen, connect with a QP); a CM call of P on one of its
//! connections; a clock move, or a move to the next timer, which lets the driver fire what
//! is due; a delivery of the MADs one side sent to the other (all, one, one twice, or lost);
//! a replay of a MAD either side sent, to L; an ICMP "unreachable" on L's QP1. After each
//! record the application takes its events, unless the record says to leave them queued
//! (tag bit 6, [`Op::Hold`]). Comm IDs, TIDs
//! and request IDs of built MADs come from a pool ([`Rig::comm`]): 0, 1, 0xffff_ffff,
//! 0x5eed, then the newest IDs the two sides sent or reported.
//!
//! After every record ([`Rig::check`]): nothing panicked (an `rdma_*` call's panic, caught at
//! its FFI boundary, counts); the record posted at most [`EVENTS_PER_INPUT`] events per
//! input it handed L plus two per id; every event, queued or taken (within
//! [`POLL_LIMIT`]), names a live id the application holds or a CONNECT_REQUEST hands over
//! (a CONNECT_REQUEST: a new id and a live listener); an event that ends a connection
//! (REJECTED, UNREACHABLE, TIMEWAIT_EXIT, CONNECT_ERROR), taken by the record that posted
//! it, leaves its id without one; the bench's invariants hold (`Bench::check_invariants`: the library's ids and the
//! engine's connections match both ways, no connection outside DREQ_SENT / TIMEWAIT without
//! an id, parked requests are requests of a lingering service, the engine listens exactly on
//! what is listened on, lingers or is steered, every id's QP is live and at RTR/RTS to its
//! peer's QPN, no bad libibverbs call); no timer of L is due after a round of its loop; every
//! MAD L sends parses and goes to a peer's address; P's engine keeps its own invariants. At
//! the end, destroying everything leaves nothing behind (`Bench::finish`).

// The fuzz target uses the decoder only; the stable test writes seeds with the encoder.
#![allow(dead_code)]

use softroce::cm::{AcceptParams, CmConfig, CmEngine, CmEvent, ConnectParams};
use softroce::transport::Instant;
use softroce::wire::cm::{
    CM_MSG_LEN, CmMadRepr, CmMsgRepr, CmPathRepr, CmaHdrRepr, DrepRepr, DreqRepr, MraRepr,
    RejReason, RejRepr, RepRepr, ReqRepr, RtuRepr, SidrRepRepr, SidrReqRepr, SidrStatus, attr,
    port_space, rdma_cm_service_id,
};
use softroce::wire::mad::{MAD_LEN, MadHdrRepr};
use softroce_rdmacm::abi::{RDMA_PS_IB, RDMA_PS_IPOIB, RDMA_PS_TCP, RDMA_PS_UDP, event};
use softroce_rdmacm::testing::{Bench, ConnParam, Id};
use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

/// The address of L, the library's device.
pub const L_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
/// The address of P, the peer engine.
pub const P_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
/// A third party nobody runs: MADs to it are lost.
pub const C_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3));
/// Where a built MAD comes from: P, C, L itself.
pub const SOURCES: [IpAddr; 3] = [P_IP, C_IP, L_IP];
/// The ports L's application binds (0: an ephemeral one) and P's connects go to.
pub const PORTS: [u16; 3] = [7174, 7175, 0];
/// The port P listens on (rdma_cm TCP and UDP).
pub const P_PORT: u16 = 7000;
/// The port spaces of L's ids.
pub const PORT_SPACES: [i32; 4] = [RDMA_PS_TCP, RDMA_PS_UDP, RDMA_PS_IB, RDMA_PS_IPOIB];
/// The service IDs built MADs and P's connects choose from: L's ports in each port space,
/// one nobody uses, and 0.
pub const SERVICES: [u64; 8] = [
    rdma_cm_service_id(port_space::TCP, 7174),
    rdma_cm_service_id(port_space::TCP, 7175),
    rdma_cm_service_id(port_space::UDP, 7174),
    rdma_cm_service_id(port_space::UDP, 7175),
    rdma_cm_service_id(port_space::IB, 7174),
    rdma_cm_service_id(port_space::IPOIB, 7174),
    rdma_cm_service_id(port_space::TCP, 1),
    0,
];
/// Comm IDs every pool starts with, before the ones seen.
pub const FIXED_IDS: [u32; 4] = [0, 1, 0xffff_ffff, 0x5eed];
/// Private data lengths the application passes.
pub const PRIVATE_LENS: [usize; 5] = [0, 1, 56, 57, 200];
/// Most ids the application holds: beyond, it destroys its oldest (as a server that has
/// finished with a connection does).
pub const MAX_IDS: usize = 12;
/// Most rdma_cm events one input to L (a MAD, a round of its loop, a call) may cause,
/// besides two per id for the timers a round fires.
pub const EVENTS_PER_INPUT: usize = 3;
/// A poll loop that yields this many items is taken as one that never ends.
pub const POLL_LIMIT: usize = 10_000;
/// IDs and TIDs remembered for the pools (oldest forgotten first).
const POOL_LEN: usize = 32;
/// MADs in flight per sender (oldest lost first), and MADs kept for replay.
const WIRE_LEN: usize = 64;
/// The seed of L's library and of P's engine.
const SEED: u64 = 0x1d;

/// One record of the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Builds a CM MAD ([`Rig::build`]), cuts it, flips bytes of it, and hands it to L as
    /// coming from `SOURCES[src % 3]`.
    Mad {
        /// Index into [`SOURCES`].
        src: u8,
        /// % 10 = REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ, SIDR_REP, LAP.
        kind: u8,
        /// Pool index of the local comm ID (request ID for SIDR_REQ).
        local: u8,
        /// Pool index of the remote comm ID (request ID for SIDR_REP).
        remote: u8,
        /// Index into [`SERVICES`].
        service: u8,
        /// Pool index of the TID.
        tid: u8,
        /// REQ / SIDR_REQ: the cma header (% 8, [`cma_header`]); others: QPN low bits,
        /// the message MRAed or rejected.
        a: u8,
        /// Timeouts, retries, REJ reason, SIDR status, the user's private data bytes.
        b: u8,
        /// 0: the whole MAD; else its first `cut` bytes (QP1 zero-pads them).
        cut: u8,
        /// Bytes to XOR into the MAD: (offset, value).
        flips: Vec<(u8, u8)>,
    },
    /// An `rdma_*` call of L's application ([`Rig::lib`]).
    Lib {
        /// % 16 = create_id, bind, listen, resolve, connect, accept, reject, establish,
        /// disconnect, destroy, create_qp, destroy_qp, the QP to ERR, connect with a new id
        /// and QP (shortcut), listen with a new id (shortcut), rdma_connect again.
        call: u8,
        /// Which held id (modulo their number, oldest first).
        id: u8,
        /// The call's argument (port space, address, port, backlog, private data length).
        arg: u8,
    },
    /// A CM call of P ([`Rig::peer`]).
    Peer {
        /// % 8 = connect to L, accept, reject, establish, disconnect, sidr_request to L,
        /// sidr_reply, cancel.
        call: u8,
        /// Which of P's connections (modulo their number, by ID).
        conn: u8,
        /// The call's argument.
        arg: u8,
    },
    /// Moves the clock on by 4.096 µs × 2^(`exp` % 32) (0: by 1 ns); L's driver runs a round
    /// and P fires its timers.
    Advance {
        /// The exponent.
        exp: u8,
    },
    /// Moves the clock to the earliest timer of L (engine or linger) and P, then as
    /// [`Op::Advance`].
    NextTimer,
    /// Moves MADs one side sent to the other: `how` % 4 = all of them, the oldest, the
    /// oldest twice, or loses the oldest. L's to C are lost.
    Deliver {
        /// P's to L, else L's to P.
        to_l: bool,
        /// How.
        how: u8,
    },
    /// Feeds a MAD either side sent earlier (`index` into the kept ones) to L from
    /// `SOURCES[src % 3]`, with bytes flipped.
    Replay {
        /// Index into [`SOURCES`].
        src: u8,
        /// Which kept MAD (modulo their number).
        index: u8,
        /// Bytes to XOR into the MAD.
        flips: Vec<(u8, u8)>,
    },
    /// An ICMP "port unreachable" from `SOURCES[src % 3]` on L's QP1.
    Unreachable {
        /// Index into [`SOURCES`].
        src: u8,
    },
    /// The record, after which the application leaves the events on its channel (tag bit
    /// 6): they wait there, and the ids new CONNECT_REQUESTs carry are not its yet, until
    /// a record without this bit takes them.
    Hold(Box<Op>),
}

/// Reads input bytes; past the end every byte is 0.
struct Cursor<'a> {
    data: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }
    fn flips(&mut self) -> Vec<(u8, u8)> {
        (0..self.byte() % 4)
            .map(|_| (self.byte(), self.byte()))
            .collect()
    }
}

fn put_flips(out: &mut Vec<u8>, f: &[(u8, u8)]) {
    out.push(f.len() as u8);
    for &(p, x) in f {
        out.extend([p, x]);
    }
}

impl Op {
    /// Splits an input into records (at most 256; the rest is ignored).
    pub fn decode(data: &[u8]) -> Vec<Op> {
        let mut c = Cursor { data, at: 0 };
        let mut ops = Vec::new();
        while c.at < data.len() && ops.len() < 256 {
            let tag = c.byte();
            let op = match tag & 7 {
                0 => Op::Mad {
                    src: c.byte(),
                    kind: c.byte(),
                    local: c.byte(),
                    remote: c.byte(),
                    service: c.byte(),
                    tid: c.byte(),
                    a: c.byte(),
                    b: c.byte(),
                    cut: c.byte(),
                    flips: c.flips(),
                },
                1 => Op::Lib {
                    call: c.byte(),
                    id: c.byte(),
                    arg: c.byte(),
                },
                2 => Op::Peer {
                    call: c.byte(),
                    conn: c.byte(),
                    arg: c.byte(),
                },
                3 => Op::Advance { exp: c.byte() },
                4 => Op::NextTimer,
                5 => Op::Deliver {
                    to_l: tag & 0x80 == 0,
                    how: c.byte(),
                },
                6 => Op::Replay {
                    src: c.byte(),
                    index: c.byte(),
                    flips: c.flips(),
                },
                _ => Op::Unreachable { src: c.byte() },
            };
            ops.push(if tag & 0x40 == 0 {
                op
            } else {
                Op::Hold(Box::new(op))
            });
        }
        ops
    }

    /// The bytes [`Op::decode`] reads back as `self`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Op::Hold(op) => {
                let at = out.len();
                op.encode(out);
                out[at] |= 0x40;
            }
            Op::Mad {
                src,
                kind,
                local,
                remote,
                service,
                tid,
                a,
                b,
                cut,
                flips,
            } => {
                out.extend([
                    0, *src, *kind, *local, *remote, *service, *tid, *a, *b, *cut,
                ]);
                put_flips(out, flips);
            }
            Op::Lib { call, id, arg } => out.extend([1, *call, *id, *arg]),
            Op::Peer { call, conn, arg } => out.extend([2, *call, *conn, *arg]),
            Op::Advance { exp } => out.extend([3, *exp]),
            Op::NextTimer => out.push(4),
            Op::Deliver { to_l, how } => out.extend([if *to_l { 5 } else { 0x85 }, *how]),
            Op::Replay { src, index, flips } => {
                out.extend([6, *src, *index]);
                put_flips(out, flips);
            }
            Op::Unreachable { src } => out.extend([7, *src]),
        }
    }
}

/// The bytes of a whole sequence of records.
pub fn encode(ops: &[Op]) -> Vec<u8> {
    let mut out = Vec::new();
    for op in ops {
        op.encode(&mut out);
    }
    out
}

/// The rdma_cm IP header variant `v % 8` of a REQ or SIDR_REQ from `src` port `port` to L:
/// right (IPv4), to another address, CMA version 1, IPv4 addresses under IP version 6,
/// IPv6 addresses, IP version 5, all zero, or none (the user's bytes from the start).
pub fn cma_header(v: u8, src: IpAddr, port: u16) -> Option<[u8; 36]> {
    let mut h = [0u8; 36];
    let repr = match v % 8 {
        0 => CmaHdrRepr::new(src, port, L_IP),
        1 => CmaHdrRepr::new(src, port, C_IP),
        2 => CmaHdrRepr {
            cma_version: 1,
            ..CmaHdrRepr::new(src, port, L_IP)
        },
        3 => CmaHdrRepr {
            ip_version: 6,
            ..CmaHdrRepr::new(src, port, L_IP)
        },
        4 => {
            let v6 = |ip: IpAddr| match ip {
                IpAddr::V4(a) => IpAddr::V6(a.to_ipv6_mapped()),
                v6 => v6,
            };
            CmaHdrRepr::new(v6(src), port, IpAddr::V6(Ipv6Addr::LOCALHOST))
        }
        5 => CmaHdrRepr {
            ip_version: 5,
            ..CmaHdrRepr::new(src, port, L_IP)
        },
        6 => return Some(h),
        _ => return None,
    };
    repr.emit(&mut h);
    Some(h)
}

/// Private data of `N` bytes: the cma header variant `v` (if any), then `fill`.
fn private<const N: usize>(v: u8, src: IpAddr, port: u16, fill: u8) -> [u8; N] {
    let mut pd = [fill; N];
    if let Some(h) = cma_header(v, src, port) {
        pd[..36].copy_from_slice(&h);
    }
    pd
}

fn push_bounded<T: PartialEq>(q: &mut VecDeque<T>, v: T, len: usize) {
    if q.contains(&v) {
        return;
    }
    if q.len() == len {
        q.pop_front();
    }
    q.push_back(v);
}

fn push_wire<T>(q: &mut VecDeque<T>, v: T) {
    if q.len() == WIRE_LEN {
        q.pop_front();
    }
    q.push_back(v);
}

/// The comm ID a MAD carries in its local comm ID field (request ID for SIDR).
fn local_id_of(m: &CmMsgRepr) -> Option<u32> {
    Some(match m {
        CmMsgRepr::Req(r) => r.local_comm_id,
        CmMsgRepr::Mra(r) => r.local_comm_id,
        CmMsgRepr::Rej(r) => r.local_comm_id,
        CmMsgRepr::Rep(r) => r.local_comm_id,
        CmMsgRepr::Rtu(r) => r.local_comm_id,
        CmMsgRepr::Dreq(r) => r.local_comm_id,
        CmMsgRepr::Drep(r) => r.local_comm_id,
        CmMsgRepr::SidrReq(r) => r.request_id,
        CmMsgRepr::SidrRep(r) => r.request_id,
        CmMsgRepr::Other(..) => return None,
    })
}

/// L (the library on the bench), P, the MADs between them and the pools.
pub struct Rig {
    /// L: librdmacm.so.1 on its in-memory device.
    pub bench: Bench,
    /// P: a CM engine listening on rdma_cm TCP and UDP port [`P_PORT`].
    pub peer: CmEngine,
    /// Comm IDs seen, newest last.
    ids: VecDeque<u32>,
    /// TIDs seen, newest last.
    tids: VecDeque<u64>,
    /// MADs in flight from L (destination, bytes) and from P (to L).
    out_l: VecDeque<(IpAddr, Box<[u8; MAD_LEN]>)>,
    out_p: VecDeque<Box<[u8; MAD_LEN]>>,
    /// MADs either side sent, for replay.
    sent: VecDeque<Box<[u8; MAD_LEN]>>,
    /// Ports P connected from (each connect its own).
    next_port: u16,
}

impl Rig {
    /// L with no id, P listening, at time 1 ns.
    pub fn new() -> Rig {
        let bench = Bench::new(L_IP, SEED);
        let mut peer = CmEngine::new(CmConfig::new(P_IP, 0x9999, SEED));
        for ps in [port_space::TCP, port_space::UDP] {
            let listened = peer.listen(rdma_cm_service_id(ps, P_PORT));
            assert!(listened.is_ok(), "a fresh engine listens");
        }
        Rig {
            bench,
            peer,
            ids: VecDeque::new(),
            tids: VecDeque::new(),
            out_l: VecDeque::new(),
            out_p: VecDeque::new(),
            sent: VecDeque::new(),
            next_port: 40000,
        }
    }

    /// The comm ID at pool index `i`: [`FIXED_IDS`], then the IDs seen, newest first.
    pub fn comm(&self, i: u8) -> u32 {
        let i = usize::from(i) % (FIXED_IDS.len() + self.ids.len());
        match FIXED_IDS.get(i) {
            Some(&id) => id,
            None => self.ids[self.ids.len() - 1 - (i - FIXED_IDS.len())],
        }
    }

    /// The TID at pool index `i`: 1, then the TIDs seen, newest first.
    pub fn tid(&self, i: u8) -> u64 {
        let i = usize::from(i) % (1 + self.tids.len());
        if i == 0 {
            1
        } else {
            self.tids[self.tids.len() - i]
        }
    }

    /// Runs every record of `data`, checking after each, then finishes the bench.
    pub fn run(data: &[u8]) {
        let mut rig = Rig::new();
        for op in Op::decode(data) {
            rig.step(&op);
        }
        let Rig { bench, .. } = rig;
        if let Err(e) = bench.finish() {
            panic!("at the end: {e}");
        }
    }

    /// Runs one record, then [`Rig::check`].
    pub fn step(&mut self, op: &Op) {
        let (mut op, mut take) = (op, true);
        while let Op::Hold(inner) = op {
            (op, take) = (&**inner, false);
        }
        let waiting = self.bench.queued_events();
        let ids_before = self.bench.ids().len();
        // Inputs this record hands L (a MAD, a round of its loop, a call).
        let mut inputs = 1;
        match op {
            Op::Mad {
                src,
                kind,
                local,
                remote,
                service,
                tid,
                a,
                b,
                cut,
                flips,
            } => {
                let src = SOURCES[usize::from(*src) % SOURCES.len()];
                let msg = self.build(src, *kind, (*local, *remote), *service, *a, *b);
                let mut mad = CmMadRepr {
                    hdr: MadHdrRepr::cm(self.tid(*tid), msg.attr_id()),
                    msg,
                }
                .to_bytes();
                for &(p, x) in flips {
                    mad[usize::from(p)] ^= x;
                }
                let n = if *cut == 0 {
                    MAD_LEN
                } else {
                    usize::from(*cut)
                };
                self.feed_l(src, &mad[..n]);
            }
            Op::Lib { call, id, arg } => inputs = self.lib(*call, *id, *arg),
            Op::Peer { call, conn, arg } => self.peer(*call, *conn, *arg),
            Op::Advance { exp } => {
                let d = match exp % 32 {
                    0 => Duration::from_nanos(1),
                    e => softroce::cm::ib_time(e),
                };
                let t = self.bench.now() + d;
                self.move_clock(t);
            }
            Op::NextTimer => {
                let next = match (self.bench.next_timer(), self.peer.poll_timeout()) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                match next {
                    Some(t) => self.move_clock(t),
                    None => inputs = 0,
                }
            }
            Op::Deliver { to_l, how } => inputs = self.deliver(*to_l, *how),
            Op::Replay { src, index, flips } => {
                if self.sent.is_empty() {
                    inputs = 0;
                } else {
                    let mut mad = self.sent[usize::from(*index) % self.sent.len()].clone();
                    for &(p, x) in flips {
                        mad[usize::from(p)] ^= x;
                    }
                    self.feed_l(SOURCES[usize::from(*src) % SOURCES.len()], &mad[..]);
                }
            }
            Op::Unreachable { src } => {
                let from = SOURCES[usize::from(*src) % SOURCES.len()];
                if let Err(e) = self.bench.unreachable(from) {
                    panic!("{e}");
                }
            }
            Op::Hold(_) => {} // (unwrapped above)
        }
        let posted = self.bench.queued_events().saturating_sub(waiting);
        let ids = ids_before.max(self.bench.ids().len()).max(waiting);
        let bound = EVENTS_PER_INPUT * inputs + 2 * ids;
        assert!(
            posted <= bound,
            "{posted} events from one record (at most {bound})"
        );
        self.check(take, waiting);
    }

    /// Hands `mad` to L from `src` (one round of its loop).
    fn feed_l(&mut self, src: IpAddr, mad: &[u8]) {
        if let Err(e) = self.bench.deliver(src, mad) {
            panic!("{e}");
        }
    }

    /// Moves the clock to `t`: L's driver runs a round, P fires what is due.
    fn move_clock(&mut self, t: Instant) {
        self.bench.advance_to(t);
        if let Err(e) = self.bench.turn() {
            panic!("{e}");
        }
        if self.peer.poll_timeout().is_some_and(|d| d <= t) {
            self.peer.handle_timeout(t);
        }
    }

    /// A CM message as `kind` says (see [`Op::Mad`]), built with the wire layer's reprs;
    /// REQ and SIDR_REQ from `src` carry the cma header variant `a`.
    pub fn build(
        &self,
        src: IpAddr,
        kind: u8,
        (local, remote): (u8, u8),
        service: u8,
        a: u8,
        b: u8,
    ) -> CmMsgRepr {
        let (local, remote) = (self.comm(local), self.comm(remote));
        let service_id = SERVICES[usize::from(service) % SERVICES.len()];
        let qpn = 0x100 | u32::from(a);
        match kind % 10 {
            0 => CmMsgRepr::Req(ReqRepr {
                local_comm_id: local,
                service_id,
                local_ca_guid: 0xcccc,
                local_qkey: 0,
                local_qpn: qpn,
                responder_resources: b & 3,
                local_eecn: 0,
                initiator_depth: b >> 6,
                remote_eecn: 0,
                remote_cm_response_timeout: 20,
                transport_service_type: 0,
                end_to_end_flow_control: false,
                starting_psn: 0x12_3456,
                local_cm_response_timeout: 20,
                retry_count: 7,
                pkey: 0xffff,
                path_mtu: (b >> 2) & 7,
                rdc_exists: false,
                rnr_retry_count: 7,
                max_cm_retries: 15,
                srq: false,
                extended_transport_type: 0,
                primary_path: CmPathRepr::default(),
                alternate_path: CmPathRepr::default(),
                sap_supported: false,
                private_data: private(a, src, 40000 + u16::from(b), b),
            }),
            1 => CmMsgRepr::Mra(MraRepr {
                local_comm_id: local,
                remote_comm_id: remote,
                message_mraed: a % 3,
                service_timeout: b & 0x1f,
                private_data: [0; 222],
            }),
            2 => {
                let reasons = [
                    RejReason::TIMEOUT,
                    RejReason::CONSUMER_DEFINED,
                    RejReason::INVALID_COMM_ID,
                    RejReason::STALE_CONN,
                    RejReason::NO_RESOURCES,
                    RejReason::INVALID_SERVICE_ID,
                    RejReason::INVALID_COMM_INSTANCE,
                    RejReason(u16::from(b)),
                ];
                CmMsgRepr::Rej(RejRepr {
                    local_comm_id: local,
                    remote_comm_id: remote,
                    message_rejected: a % 3,
                    rejected_info_length: 0,
                    reason: reasons[usize::from(b) % reasons.len()],
                    ari: [0; 72],
                    private_data: [b; 148],
                })
            }
            3 => CmMsgRepr::Rep(RepRepr {
                local_comm_id: local,
                remote_comm_id: remote,
                local_qkey: 0,
                local_qpn: qpn,
                local_eecn: 0,
                starting_psn: 0x65_4321,
                responder_resources: b & 3,
                initiator_depth: b >> 6,
                target_ack_delay: 15,
                failover_accepted: 0,
                end_to_end_flow_control: false,
                rnr_retry_count: b & 7,
                srq: false,
                local_ca_guid: 0xcccc,
                private_data: [b; 196],
            }),
            4 => CmMsgRepr::Rtu(RtuRepr {
                local_comm_id: local,
                remote_comm_id: remote,
                private_data: [0; 224],
            }),
            5 => CmMsgRepr::Dreq(DreqRepr {
                local_comm_id: local,
                remote_comm_id: remote,
                remote_qpn_eecn: qpn,
                private_data: [0; 220],
            }),
            6 => CmMsgRepr::Drep(DrepRepr {
                local_comm_id: local,
                remote_comm_id: remote,
                private_data: [0; 224],
            }),
            7 => CmMsgRepr::SidrReq(SidrReqRepr {
                request_id: local,
                pkey: 0xffff,
                service_id,
                private_data: private(a, src, 40000 + u16::from(b), b),
            }),
            8 => CmMsgRepr::SidrRep(SidrRepRepr {
                request_id: remote,
                status: SidrStatus(b % 6),
                additional_info_length: 0,
                qpn,
                service_id,
                qkey: if a & 1 == 0 { 0x0123_4567 } else { 0x1111_1111 },
                additional_info: [0; 72],
                private_data: [b; 136],
            }),
            _ => CmMsgRepr::Other(attr::LAP, [a; CM_MSG_LEN]),
        }
    }

    /// The id at index `i` of those L's application holds (oldest first), if any.
    fn id(&self, i: u8) -> Option<Id> {
        let ids = self.bench.ids();
        (!ids.is_empty()).then(|| ids[usize::from(i) % ids.len()])
    }

    /// Connection parameters from `arg`: NULL (bit 0 clear) or private data of
    /// `PRIVATE_LENS[arg >> 1 % 5]` bytes, resources from the high bits, `qp_num` 0x77.
    fn conn_param(arg: u8) -> Option<ConnParam> {
        (arg & 1 == 1).then(|| ConnParam {
            private_data: vec![arg; PRIVATE_LENS[usize::from(arg >> 1) % PRIVATE_LENS.len()]],
            responder_resources: arg >> 6,
            initiator_depth: (arg >> 4) & 3,
            retry_count: 7,
            rnr_retry_count: arg >> 5,
            qp_num: 0x77,
        })
    }

    /// An `rdma_*` call of L's application (see [`Op::Lib`]); returns how many inputs it
    /// handed L. Errors are answers too: only a panic or a broken invariant is a finding.
    fn lib(&mut self, call: u8, id: u8, arg: u8) -> usize {
        let held = self.id(id);
        let ps = PORT_SPACES[usize::from(arg) % PORT_SPACES.len()];
        let port = PORTS[usize::from(arg >> 2) % PORTS.len()];
        let dst = SocketAddr::new(
            [P_IP, C_IP, L_IP][usize::from(arg) % 3],
            [P_PORT, 7174, 1][usize::from(arg >> 4) % 3],
        );
        let (call, Some(id)) = (call % 16, held) else {
            // Without an id only the calls that make one run.
            match call % 16 {
                0 => drop(self.bench.create_id(ps)),
                13 => self.connect_flow(arg),
                14 => self.listen_flow(arg),
                _ => return 0,
            }
            return 3;
        };
        let b = &mut self.bench;
        let _ = match call {
            0 => b.create_id(ps).map(drop),
            1 => {
                let ip = if arg & 0x80 == 0 {
                    L_IP
                } else {
                    IpAddr::V4(Ipv4Addr::UNSPECIFIED)
                };
                b.bind(id, SocketAddr::new(ip, port))
            }
            2 => b.listen(id, i32::from(arg % 3)),
            3 => b.resolve(id, dst),
            4 | 15 => b.connect(id, Self::conn_param(arg).as_ref()),
            5 => b.accept(id, Self::conn_param(arg).as_ref()),
            6 => b.reject(
                id,
                &vec![arg; PRIVATE_LENS[usize::from(arg) % PRIVATE_LENS.len()]],
            ),
            7 => b.establish(id),
            8 => b.disconnect(id),
            9 => b.destroy(id),
            10 => b.create_qp(id),
            11 => b.destroy_qp(id),
            12 => b.qp_to_err(id),
            13 => {
                self.connect_flow(arg);
                return 3;
            }
            _ => {
                self.listen_flow(arg);
                return 3;
            }
        };
        1
    }

    /// Shortcut: a new id (TCP, or UDP when `arg` bit 6 is set), resolved to P's port (or
    /// C's), with a QP unless bit 5 is set, connecting with `conn_param(arg)`.
    fn connect_flow(&mut self, arg: u8) {
        let ps = if arg & 0x40 == 0 {
            RDMA_PS_TCP
        } else {
            RDMA_PS_UDP
        };
        let b = &mut self.bench;
        let Ok(id) = b.create_id(ps) else { return };
        let to = if arg & 0x80 == 0 { P_IP } else { C_IP };
        let _ = b.resolve(id, SocketAddr::new(to, P_PORT));
        if arg & 0x20 == 0 {
            let _ = b.create_qp(id);
        }
        let _ = b.connect(id, Self::conn_param(arg).as_ref());
    }

    /// Shortcut: a new id in port space `PORT_SPACES[arg % 4]` bound to L's address (the
    /// wildcard when bit 7 is set) and `PORTS[arg >> 2 % 3]`, listening with backlog
    /// `arg >> 4 % 3`.
    fn listen_flow(&mut self, arg: u8) {
        let ps = PORT_SPACES[usize::from(arg) % PORT_SPACES.len()];
        let b = &mut self.bench;
        let Ok(id) = b.create_id(ps) else { return };
        let ip = if arg & 0x80 == 0 {
            L_IP
        } else {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        };
        let port = PORTS[usize::from(arg >> 2) % PORTS.len()];
        let _ = b.bind(id, SocketAddr::new(ip, port));
        let _ = b.listen(id, i32::from((arg >> 4) % 3));
    }

    /// A CM call of P (see [`Op::Peer`]).
    fn peer(&mut self, call: u8, conn: u8, arg: u8) {
        let now = self.bench.now();
        let conns: Vec<_> = self.peer.connections().map(|(c, _)| c).collect();
        let comm = if conns.is_empty() {
            softroce::cm::CommId(self.comm(conn))
        } else {
            conns[usize::from(conn) % conns.len()]
        };
        let port = self.next_port;
        let to = SocketAddr::new(L_IP, PORTS[usize::from(arg) % 2]);
        let from = SocketAddr::new(P_IP, port);
        let p = &mut self.peer;
        let _ = match call % 8 {
            0 => {
                self.next_port = self.next_port.wrapping_add(1).max(40000);
                let user = vec![arg; usize::from(arg % 4)];
                ConnectParams::rdma_cm(from, to, port_space::TCP, 0x200, 0x3_0000, 3, &user)
                    .map_err(drop)
                    .and_then(|c| p.connect(now, &c).map(drop).map_err(drop))
            }
            1 => p
                .accept(
                    now,
                    comm,
                    &AcceptParams {
                        local_qpn: 0x200 + u32::from(arg & 3),
                        starting_psn: 0x65_4321,
                        responder_resources: arg & 3,
                        initiator_depth: arg >> 6,
                        target_ack_delay: 15,
                        rnr_retry_count: 7,
                        srq: false,
                        private_data: vec![arg; usize::from(arg % 4)],
                    },
                )
                .map_err(drop),
            2 => p.reject(now, comm, &[arg]).map_err(drop),
            3 => p.establish(now, comm).map_err(drop),
            4 => p.disconnect(now, comm).map_err(drop),
            5 => {
                self.next_port = self.next_port.wrapping_add(1).max(40000);
                let mut pd = vec![0u8; 36];
                CmaHdrRepr::new(from.ip(), port, L_IP).emit(&mut pd);
                let sid = rdma_cm_service_id(port_space::UDP, to.port());
                p.sidr_request(now, L_IP, sid, &pd).map(drop).map_err(drop)
            }
            6 => {
                let qkey = if arg & 0x80 == 0 {
                    0x0123_4567
                } else {
                    0x1111_1111
                };
                let status = SidrStatus(arg % 6);
                p.sidr_reply(now, comm, status, 0x300, qkey, &[arg])
                    .map_err(drop)
            }
            _ => p.cancel(now, comm).map_err(drop),
        };
    }

    /// Moves MADs between the two sides; returns how many L got.
    fn deliver(&mut self, to_l: bool, how: u8) -> usize {
        if to_l {
            let batch: Vec<_> = match how % 4 {
                0 => self.out_p.drain(..).collect(),
                1 => self.out_p.pop_front().into_iter().collect(),
                2 => self
                    .out_p
                    .pop_front()
                    .map(|m| vec![m.clone(), m])
                    .unwrap_or_default(),
                _ => {
                    self.out_p.pop_front();
                    Vec::new()
                }
            };
            for m in &batch {
                self.feed_l(P_IP, &m[..]);
            }
            return batch.len();
        }
        let batch: Vec<_> = match how % 4 {
            0 => self.out_l.drain(..).collect(),
            1 => self.out_l.pop_front().into_iter().collect(),
            2 => self
                .out_l
                .pop_front()
                .map(|m| vec![m.clone(), m])
                .unwrap_or_default(),
            _ => {
                self.out_l.pop_front();
                Vec::new()
            }
        };
        let now = self.bench.now();
        for (dst, m) in batch {
            if dst == P_IP {
                self.peer.handle_mad(now, L_IP, &m[..]);
            }
        }
        0
    }

    /// The checks after each record (module doc). With `take`, the application takes every
    /// event (the first `waiting` of them were there before the record); beyond
    /// [`MAX_IDS`] it then destroys its oldest ids.
    pub fn check(&mut self, take: bool, waiting: usize) {
        let mut events = Vec::new();
        if take {
            loop {
                match self.bench.poll_event() {
                    Ok(Some(ev)) => events.push(ev),
                    Ok(None) => break,
                    Err(e) => panic!("{e}"),
                }
                assert!(events.len() < POLL_LIMIT, "rdma_get_cm_event never ends");
            }
        }
        // Those the record posted: nothing came between their posting and now.
        for ev in events.iter().skip(waiting) {
            let ends = matches!(
                ev.event,
                event::REJECTED | event::UNREACHABLE | event::TIMEWAIT_EXIT | event::CONNECT_ERROR
            );
            let state = self.bench.conn_state(ev.id);
            assert!(
                !ends || state.is_none(),
                "{ev:?} leaves its id in {state:?}"
            );
        }
        if let Err(e) = self.bench.check_invariants() {
            panic!("{e}");
        }
        let now = self.bench.now();
        if let Some(t) = self.bench.next_timer() {
            assert!(
                t > now,
                "a timer of L due at {t:?} did not fire (now {now:?})"
            );
        }
        if let Err(e) = self.peer.check_invariants() {
            panic!("peer engine: {e}");
        }
        // What both sides sent.
        for (dst, mad) in self.bench.take_sent() {
            let parsed = match CmMadRepr::parse(&mad[..]) {
                Ok(p) => p,
                Err(why) => panic!("L sent a MAD that does not parse: {why}"),
            };
            assert!(
                SOURCES.contains(&dst),
                "L sent a MAD to {dst}, not a peer's address"
            );
            self.remember(&parsed, &mad);
            push_wire(&mut self.out_l, (dst, mad));
        }
        let mut n = 0;
        while let Some(m) = self.peer.poll_mad() {
            n += 1;
            assert!(n < POLL_LIMIT, "P's poll_mad never ends");
            if let Ok(parsed) = CmMadRepr::parse(&m.mad[..]) {
                self.remember(&parsed, &m.mad);
            }
            if m.dst == L_IP {
                push_wire(&mut self.out_p, m.mad);
            }
        }
        let mut n = 0;
        while let Some(ev) = self.peer.poll_event() {
            n += 1;
            assert!(n < POLL_LIMIT, "P's poll_event never ends");
            if let CmEvent::ConnectRequest { id, .. } | CmEvent::SidrRequest { id, .. } = ev {
                push_bounded(&mut self.ids, id.0, POOL_LEN);
            }
        }
        // Beyond MAX_IDS the application lets its oldest id go (events for it are then
        // gone with it: checked on the next record).
        while take && self.bench.ids().len() > MAX_IDS {
            let oldest = self.bench.ids()[0];
            let _ = self.bench.destroy(oldest);
        }
    }

    /// Puts the IDs and TID of a MAD someone sent into the pools, and the MAD among those
    /// kept for replay.
    fn remember(&mut self, parsed: &CmMadRepr, mad: &[u8; MAD_LEN]) {
        if let Some(id) = local_id_of(&parsed.msg) {
            push_bounded(&mut self.ids, id, POOL_LEN);
        }
        push_bounded(&mut self.tids, parsed.hdr.tid, POOL_LEN);
        push_wire(&mut self.sent, Box::new(*mad));
    }
}

impl Default for Rig {
    fn default() -> Self {
        Rig::new()
    }
}

/// `rdmacm_driver` target: runs the records of `data` against a fresh [`Rig`].
pub fn check_rdmacm(data: &[u8]) {
    Rig::run(data);
}
