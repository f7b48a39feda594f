//! The `cm_engine` fuzz check: structured sequences of CM MADs, API calls and clock moves
//! against two [`CmEngine`]s, A (10.0.0.1) and B (10.0.0.2), that may also talk to each other.
//! Shared by the cargo-fuzz target `fuzz_targets/cm_engine.rs` and the main crate's
//! `tests/cm_fuzz.rs` (both include this file with `#[path]`), so every finding replays on
//! stable.
//!
//! Input: a sequence of records, each a tag byte (bit 7 clear: engine B, set: A; the other
//! bits % 6: the kind of record) and a few argument bytes ([`Op::decode`];
//! [`Op::encode`] writes the same bytes, for hand-made seeds). A missing byte reads as 0.
//! Comm IDs, request IDs and TIDs are drawn from small pools ([`Rig::id`], [`Rig::tid`]):
//! 0, 1, 0xffff_ffff, 0x5eed, then every ID the engines reported in an event or put in the
//! local comm ID of a MAD they sent, so the fuzzer reaches live connections without guessing
//! 32-bit numbers.
//!
//! After every step ([`Rig::check`]): nothing panicked; `check_invariants()` holds for both
//! engines; neither holds more than `max_connections`; each step's events and MADs are drained
//! (every poll terminates within [`POLL_LIMIT`]) and number at most [`STEP_OUTPUT`] per input
//! (a delivered MAD, an API call; a clock move counts one per connection, as each may fire);
//! every MAD sent parses; an event that says a connection is gone leaves no connection by that
//! ID, and after a single input a request event leaves its connection in REQ_RCVD
//! (SIDR_REQ_RCVD); every timer is after `now` (a due timer fired) and at most [`max_wait`]
//! away.

// The fuzz target uses the decoder only; the stable test writes seeds with the encoder.
#![allow(dead_code)]

use softroce::cm::{
    AcceptParams, CmConfig, CmEngine, CmEvent, CmState, CommId, ConnectParams,
    MAX_PEER_CM_RESPONSE_TIMEOUT, ib_time,
};
use softroce::transport::Instant;
use softroce::wire::cm::{
    CM_MSG_LEN, CmMadRepr, CmMsgRepr, CmPathRepr, DrepRepr, DreqRepr, MraRepr, RejReason, RejRepr,
    RepRepr, ReqRepr, RtuRepr, SidrRepRepr, SidrReqRepr, SidrStatus, attr, port_space,
    rdma_cm_service_id,
};
use softroce::wire::mad::{MAD_LEN, MadHdrRepr};
use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

/// Engine A's address.
pub const A_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
/// Engine B's address.
pub const B_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
/// A third party nobody runs: MADs to it are lost.
pub const C_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3));
/// The addresses a MAD may come from or go to.
pub const PEERS: [IpAddr; 3] = [A_IP, B_IP, C_IP];
/// B listens on this rdma_cm TCP service from the start.
pub const SERVICE: u64 = rdma_cm_service_id(port_space::TCP, 7174);
/// B listens on this rdma_cm UDP service (SIDR) from the start.
pub const SIDR_SERVICE: u64 = rdma_cm_service_id(port_space::UDP, 7174);
/// The service IDs records choose from.
pub const SERVICES: [u64; 4] = [
    SERVICE,
    SIDR_SERVICE,
    rdma_cm_service_id(port_space::TCP, 1),
    0,
];
/// Comm IDs every pool starts with, before the engines' own.
pub const FIXED_IDS: [u32; 4] = [0, 1, 0xffff_ffff, 0x5eed];
/// Connections each engine may hold: small, so the table fills.
pub const MAX_CONNECTIONS: usize = 6;
/// Most events or MADs one input (a MAD or an API call) may produce.
pub const STEP_OUTPUT: usize = 2;
/// A poll loop that yields this many items is taken as one that never ends.
pub const POLL_LIMIT: usize = 10_000;
/// IDs and TIDs remembered for the pools (oldest forgotten first).
const POOL_LEN: usize = 32;
/// MADs in flight per sender (oldest lost first), and MADs kept for replay.
const WIRE_LEN: usize = 64;

/// The engines' configuration: rdma_cm's values but short timers (response timeout and
/// packet lifetime exponents 10, 3 retries), so clock moves reach every timer.
pub fn config(ip: IpAddr, seed: u64) -> CmConfig {
    let mut c = CmConfig::new(ip, seed, seed);
    c.cm_response_timeout = 10;
    c.packet_life_time = 10;
    c.max_cm_retries = 3;
    c.max_connections = MAX_CONNECTIONS;
    c
}

/// The longest a timer of an engine with configuration `c` may be armed for: the aging of a
/// request (16 tries, the most a 4-bit retry count gives), each try at most 2 × packet
/// lifetime + 4.096 µs × 2^(the largest of our own timeouts and the cap on the ones peers
/// choose, [`MAX_PEER_CM_RESPONSE_TIMEOUT`]), or TIMEWAIT. Units: a `Duration`.
pub fn max_wait(c: &CmConfig) -> Duration {
    let exp = MAX_PEER_CM_RESPONSE_TIMEOUT
        .max(c.cm_response_timeout)
        .max(c.mra_service_timeout);
    let per_try = ib_time(c.packet_life_time) * 2 + ib_time(exp);
    (per_try * 16).max(ib_time(c.packet_life_time.saturating_add(1)))
}

/// One record of the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Builds a CM MAD with the wire layer's emit API, flips bytes of it, and hands it to
    /// engine B (`to_b`) or A as coming from `PEERS[src % 3]`.
    Mad {
        /// To B, else to A.
        to_b: bool,
        /// Index into [`PEERS`].
        src: u8,
        /// Message: % 10 = REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ, SIDR_REP, LAP.
        kind: u8,
        /// Pool index of the local comm ID (request ID for SIDR_REQ).
        local: u8,
        /// Pool index of the remote comm ID (request ID for SIDR_REP).
        remote: u8,
        /// Index into [`SERVICES`].
        service: u8,
        /// Pool index of the TID.
        tid: u8,
        /// First argument: QPN low bits, MRAed / rejected message, timeouts (see `build`).
        a: u8,
        /// Second argument: retries, reason, service timeout, status.
        b: u8,
        /// Bytes to XOR into the MAD: (offset, value).
        flips: Vec<(u8, u8)>,
    },
    /// Calls engine B's (`on_b`) or A's API on a pooled ID.
    Api {
        /// B, else A.
        on_b: bool,
        /// % 12 = connect, accept, reject, establish, disconnect, cancel, listen, unlisten,
        /// sidr_request, sidr_reply, reject_no_listener, listen_with_backlog (`id` % 3).
        call: u8,
        /// Pool index of the ID (peer index for connect / sidr_request).
        id: u8,
        /// Argument: service index, SIDR status.
        arg: u8,
    },
    /// Moves the clock on by 4.096 µs × 2^(`exp` % 32) (0: by 1 ns) and fires both engines'
    /// timers.
    Advance {
        /// The exponent.
        exp: u8,
    },
    /// Moves the clock to the earlier engine's next timer and fires it.
    NextTimer,
    /// Moves MADs the engine sent to their destination: `how` % 4 = all of them, the oldest,
    /// the oldest twice, or loses the oldest.
    Deliver {
        /// B's outbox, else A's.
        from_b: bool,
        /// How.
        how: u8,
    },
    /// Feeds a MAD either engine sent earlier (`index` into the kept ones) back to B
    /// (`to_b`) or A, from `PEERS[src % 3]`, with bytes flipped.
    Replay {
        /// To B, else to A.
        to_b: bool,
        /// Index into [`PEERS`].
        src: u8,
        /// Which kept MAD (modulo their number).
        index: u8,
        /// Bytes to XOR into the MAD.
        flips: Vec<(u8, u8)>,
    },
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

impl Op {
    /// Splits an input into records (at most 512; the rest is ignored).
    pub fn decode(data: &[u8]) -> Vec<Op> {
        let mut c = Cursor { data, at: 0 };
        let mut ops = Vec::new();
        while c.at < data.len() && ops.len() < 512 {
            let tag = c.byte();
            let op = match (tag & 0x7f) % 6 {
                0 => Op::Mad {
                    to_b: tag & 0x80 == 0,
                    src: c.byte(),
                    kind: c.byte(),
                    local: c.byte(),
                    remote: c.byte(),
                    service: c.byte(),
                    tid: c.byte(),
                    a: c.byte(),
                    b: c.byte(),
                    flips: c.flips(),
                },
                1 => Op::Api {
                    on_b: tag & 0x80 == 0,
                    call: c.byte(),
                    id: c.byte(),
                    arg: c.byte(),
                },
                2 => Op::Advance { exp: c.byte() },
                3 => Op::NextTimer,
                4 => Op::Deliver {
                    from_b: tag & 0x80 == 0,
                    how: c.byte(),
                },
                _ => Op::Replay {
                    to_b: tag & 0x80 == 0,
                    src: c.byte(),
                    index: c.byte(),
                    flips: c.flips(),
                },
            };
            ops.push(op);
        }
        ops
    }

    /// The bytes [`Op::decode`] reads back as `self`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let side = |b: bool| if b { 0 } else { 0x80 };
        let flips = |out: &mut Vec<u8>, f: &[(u8, u8)]| {
            out.push(f.len() as u8);
            for &(p, x) in f {
                out.extend([p, x]);
            }
        };
        match self {
            Op::Mad {
                to_b,
                src,
                kind,
                local,
                remote,
                service,
                tid,
                a,
                b,
                flips: f,
            } => {
                out.extend([
                    side(*to_b),
                    *src,
                    *kind,
                    *local,
                    *remote,
                    *service,
                    *tid,
                    *a,
                    *b,
                ]);
                flips(out, f);
            }
            Op::Api {
                on_b,
                call,
                id,
                arg,
            } => out.extend([1 | side(*on_b), *call, *id, *arg]),
            Op::Advance { exp } => out.extend([2, *exp]),
            Op::NextTimer => out.push(3),
            Op::Deliver { from_b, how } => out.extend([4 | side(*from_b), *how]),
            Op::Replay {
                to_b,
                src,
                index,
                flips: f,
            } => {
                out.extend([5 | side(*to_b), *src, *index]);
                flips(out, f);
            }
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

/// Two engines, the MADs between them, and the pools records draw from.
pub struct Rig {
    /// Engine A (10.0.0.1): listens on nothing at first.
    pub a: CmEngine,
    /// Engine B (10.0.0.2): listens on [`SERVICE`] and [`SIDR_SERVICE`].
    pub b: CmEngine,
    /// The clock.
    pub now: Instant,
    /// Comm IDs the engines reported or sent, newest last.
    ids: VecDeque<u32>,
    /// TIDs of MADs the engines sent, newest last.
    tids: VecDeque<u64>,
    /// MADs in flight from A and from B: (destination, bytes).
    out_a: VecDeque<(IpAddr, Box<[u8; MAD_LEN]>)>,
    out_b: VecDeque<(IpAddr, Box<[u8; MAD_LEN]>)>,
    /// MADs either engine sent, for replay.
    sent: VecDeque<Box<[u8; MAD_LEN]>>,
}

impl Default for Rig {
    fn default() -> Self {
        Rig::new()
    }
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

fn flip(mad: &mut [u8; MAD_LEN], flips: &[(u8, u8)]) {
    for &(p, x) in flips {
        mad[usize::from(p)] ^= x;
    }
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
        CmMsgRepr::SidrRep(_) | CmMsgRepr::Other(..) => return None,
    })
}

impl Rig {
    /// A fresh pair at time zero.
    pub fn new() -> Rig {
        let mut b = CmEngine::new(config(B_IP, 0xbbbb));
        let listened = b.listen(SERVICE).and_then(|()| b.listen(SIDR_SERVICE));
        assert!(listened.is_ok(), "a fresh engine listens");
        Rig {
            a: CmEngine::new(config(A_IP, 0xaaaa)),
            b,
            now: Instant::ZERO,
            ids: VecDeque::new(),
            tids: VecDeque::new(),
            out_a: VecDeque::new(),
            out_b: VecDeque::new(),
            sent: VecDeque::new(),
        }
    }

    /// The comm ID at pool index `i`: [`FIXED_IDS`], then the IDs seen.
    pub fn id(&self, i: u8) -> u32 {
        let i = usize::from(i) % (FIXED_IDS.len() + self.ids.len());
        FIXED_IDS
            .get(i)
            .copied()
            .unwrap_or_else(|| self.ids[i - FIXED_IDS.len()])
    }

    /// The TID at pool index `i`: 1, then the TIDs of MADs sent.
    pub fn tid(&self, i: u8) -> u64 {
        let i = usize::from(i) % (1 + self.tids.len());
        if i == 0 { 1 } else { self.tids[i - 1] }
    }

    /// Runs every record of `data`, checking after each.
    pub fn run(data: &[u8]) -> Rig {
        let mut rig = Rig::new();
        for op in Op::decode(data) {
            rig.step(&op);
        }
        rig
    }

    /// Runs one record, then [`Rig::check`].
    pub fn step(&mut self, op: &Op) {
        let conns = self.a.connection_count() + self.b.connection_count();
        // Inputs this step hands the engines (a clock move: one per connection).
        let mut inputs = 1;
        match op {
            Op::Mad {
                to_b,
                src,
                kind,
                local,
                remote,
                service,
                tid,
                a,
                b,
                flips,
            } => {
                let msg = self.build(*kind, *local, *remote, *service, *a, *b);
                let mut mad = CmMadRepr {
                    hdr: MadHdrRepr::cm(self.tid(*tid), msg.attr_id()),
                    msg,
                }
                .to_bytes();
                flip(&mut mad, flips);
                let src = PEERS[usize::from(*src) % PEERS.len()];
                let now = self.now;
                self.engine(*to_b).handle_mad(now, src, &mad);
            }
            Op::Api {
                on_b,
                call,
                id,
                arg,
            } => self.api(*on_b, *call, *id, *arg),
            Op::Advance { exp } => {
                let d = if exp % 32 == 0 {
                    Duration::from_nanos(1)
                } else {
                    ib_time(exp % 32)
                };
                self.now = self.now + d;
                self.fire();
                inputs = conns + 1;
            }
            Op::NextTimer => {
                let next = [self.a.poll_timeout(), self.b.poll_timeout()]
                    .into_iter()
                    .flatten()
                    .min();
                if let Some(t) = next {
                    self.now = t;
                }
                self.fire();
                inputs = conns + 1;
            }
            Op::Deliver { from_b, how } => inputs = self.deliver(*from_b, *how).max(1),
            Op::Replay {
                to_b,
                src,
                index,
                flips,
            } => {
                if !self.sent.is_empty() {
                    let i = usize::from(*index) % self.sent.len();
                    let mut mad = *self.sent[i];
                    flip(&mut mad, flips);
                    let src = PEERS[usize::from(*src) % PEERS.len()];
                    let now = self.now;
                    self.engine(*to_b).handle_mad(now, src, &mad);
                }
            }
        }
        self.check(STEP_OUTPUT * inputs);
    }

    fn engine(&mut self, b: bool) -> &mut CmEngine {
        if b { &mut self.b } else { &mut self.a }
    }

    fn fire(&mut self) {
        self.a.handle_timeout(self.now);
        self.b.handle_timeout(self.now);
    }

    /// A CM message of kind `kind` with pooled IDs; see [`Op::Mad`].
    fn build(&self, kind: u8, local: u8, remote: u8, service: u8, a: u8, b: u8) -> CmMsgRepr {
        let (local, remote) = (self.id(local), self.id(remote));
        let service_id = SERVICES[usize::from(service) % SERVICES.len()];
        let qpn = 0x100 + u32::from(a & 7);
        match kind % 10 {
            0 => CmMsgRepr::Req(ReqRepr {
                local_comm_id: local,
                service_id,
                local_ca_guid: 0xcccc,
                local_qkey: 0,
                local_qpn: qpn,
                responder_resources: 1,
                local_eecn: 0,
                initiator_depth: 1,
                remote_eecn: 0,
                remote_cm_response_timeout: b & 0x1f,
                transport_service_type: 0,
                end_to_end_flow_control: false,
                starting_psn: 0x12_3456,
                local_cm_response_timeout: a >> 3,
                retry_count: 7,
                pkey: 0xffff,
                path_mtu: 3,
                rdc_exists: false,
                rnr_retry_count: 7,
                max_cm_retries: b >> 4,
                srq: false,
                extended_transport_type: 0,
                primary_path: CmPathRepr::default(),
                alternate_path: CmPathRepr::default(),
                sap_supported: false,
                private_data: [0; 92],
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
                    private_data: [0; 148],
                })
            }
            3 => CmMsgRepr::Rep(RepRepr {
                local_comm_id: local,
                remote_comm_id: remote,
                local_qkey: 0,
                local_qpn: qpn,
                local_eecn: 0,
                starting_psn: 0x65_4321,
                responder_resources: 1,
                initiator_depth: 1,
                target_ack_delay: 15,
                failover_accepted: 0,
                end_to_end_flow_control: false,
                rnr_retry_count: 7,
                srq: false,
                local_ca_guid: 0xcccc,
                private_data: [0; 196],
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
                private_data: [0; 216],
            }),
            8 => CmMsgRepr::SidrRep(SidrRepRepr {
                request_id: remote,
                status: SidrStatus(b % 6),
                additional_info_length: 0,
                qpn,
                service_id,
                qkey: 0x1111_1111,
                additional_info: [0; 72],
                private_data: [0; 136],
            }),
            _ => CmMsgRepr::Other(attr::LAP, [a; CM_MSG_LEN]),
        }
    }

    fn api(&mut self, on_b: bool, call: u8, id: u8, arg: u8) {
        let now = self.now;
        let comm = CommId(self.id(id));
        let peer = PEERS[usize::from(id) % PEERS.len()];
        let service_id = SERVICES[usize::from(arg) % SERVICES.len()];
        let e = self.engine(on_b);
        // Errors are answers too; only a panic or a broken invariant is a finding.
        let _ = match call % 12 {
            0 => e
                .connect(
                    now,
                    &ConnectParams {
                        peer,
                        service_id,
                        local_qpn: 0x11 + u32::from(arg & 3),
                        starting_psn: 0x12_3456,
                        responder_resources: 1,
                        initiator_depth: 1,
                        path_mtu: 3,
                        retry_count: 7,
                        rnr_retry_count: 7,
                        local_ack_timeout: 19,
                        flow_label: 0,
                        traffic_class: 0,
                        hop_limit: 64,
                        srq: false,
                        private_data: vec![arg; usize::from(arg % 4)],
                    },
                )
                .map(|_| ()),
            1 => e.accept(
                now,
                comm,
                &AcceptParams {
                    local_qpn: 0x22 + u32::from(arg & 3),
                    starting_psn: 0x65_4321,
                    responder_resources: 1,
                    initiator_depth: 1,
                    target_ack_delay: 15,
                    rnr_retry_count: 7,
                    srq: false,
                    private_data: vec![],
                },
            ),
            2 => e.reject(now, comm, &[arg]),
            3 => e.establish(now, comm),
            4 => e.disconnect(now, comm),
            5 => e.cancel(now, comm),
            6 => e.listen(service_id),
            11 => e.listen_with_backlog(service_id, usize::from(id % 3)),
            7 => {
                e.unlisten(service_id);
                Ok(())
            }
            8 => e.sidr_request(now, peer, service_id, &[arg]).map(|_| ()),
            9 => e.sidr_reply(now, comm, SidrStatus(arg % 6), 0x28, 0x1111_1111, &[]),
            _ => e.reject_no_listener(now, comm),
        };
    }

    /// Returns how many MADs it handed over.
    fn deliver(&mut self, from_b: bool, how: u8) -> usize {
        let out = if from_b {
            &mut self.out_b
        } else {
            &mut self.out_a
        };
        let batch: Vec<_> = match how % 4 {
            0 => out.drain(..).collect(),
            1 => out.pop_front().into_iter().collect(),
            2 => out
                .pop_front()
                .map(|m| vec![m.clone(), m])
                .unwrap_or_default(),
            _ => {
                out.pop_front();
                Vec::new()
            }
        };
        let src = if from_b { B_IP } else { A_IP };
        let n = batch.len();
        for (dst, mad) in batch {
            if dst == A_IP {
                self.a.handle_mad(self.now, src, &mad[..]);
            } else if dst == B_IP {
                self.b.handle_mad(self.now, src, &mad[..]);
            }
        }
        n
    }

    /// The checks after each step; `bound` is the most events and the most MADs each engine
    /// may have produced ([`STEP_OUTPUT`] per input; a clock move is one input per
    /// connection, as each may fire once).
    pub fn check(&mut self, bound: usize) {
        for on_b in [false, true] {
            let name = if on_b { "B" } else { "A" };
            let now = self.now;
            let e = self.engine(on_b);
            if let Err(why) = e.check_invariants() {
                panic!("engine {name}: {why}");
            }
            let max = e.config().max_connections;
            assert!(
                e.connection_count() <= max,
                "engine {name} holds {} connections, max {max}",
                e.connection_count()
            );
            let wait = max_wait(e.config());
            if let Some(t) = e.poll_timeout() {
                assert!(t > now, "engine {name}: a timer due at {t:?} did not fire");
                assert!(
                    t.since(now) <= wait,
                    "engine {name}: a timer {:?} away (at most {wait:?})",
                    t.since(now)
                );
            }
            let mut events = Vec::new();
            while let Some(ev) = e.poll_event() {
                events.push(ev);
                assert!(
                    events.len() < POLL_LIMIT,
                    "engine {name}: poll_event never ends"
                );
            }
            let mut mads = Vec::new();
            while let Some(m) = e.poll_mad() {
                mads.push(m);
                assert!(
                    mads.len() < POLL_LIMIT,
                    "engine {name}: poll_mad never ends"
                );
            }
            assert!(
                events.len() <= bound,
                "engine {name}: {} events from one step (at most {bound}): {events:?}",
                events.len()
            );
            assert!(
                mads.len() <= bound,
                "engine {name}: {} MADs from one step (at most {bound})",
                mads.len()
            );
            for ev in &events {
                let id = ev.id();
                let state = e.state(id);
                match ev {
                    CmEvent::Rejected { .. }
                    | CmEvent::Unreachable { .. }
                    | CmEvent::TimewaitExit { .. }
                    | CmEvent::SidrResponse { .. } => {
                        assert_eq!(state, None, "engine {name}: {ev:?} leaves {id:?} behind")
                    }
                    // (Later inputs of the same step may have moved it on.)
                    CmEvent::ConnectRequest { .. } if bound == STEP_OUTPUT => {
                        assert_eq!(state, Some(CmState::ReqRcvd), "engine {name}: {ev:?}")
                    }
                    CmEvent::SidrRequest { .. } if bound == STEP_OUTPUT => {
                        assert_eq!(state, Some(CmState::SidrReqRcvd), "engine {name}: {ev:?}")
                    }
                    _ => {}
                }
            }
            let mut sent = Vec::new();
            for m in mads {
                let parsed = match CmMadRepr::parse(&m.mad[..]) {
                    Ok(p) => p,
                    Err(why) => panic!("engine {name} sent a MAD that does not parse: {why}"),
                };
                sent.push((m.dst, m.mad, parsed));
            }
            for ev in events {
                push_bounded(&mut self.ids, ev.id().0, POOL_LEN);
            }
            for (dst, mad, parsed) in sent {
                if let Some(id) = local_id_of(&parsed.msg) {
                    push_bounded(&mut self.ids, id, POOL_LEN);
                }
                push_bounded(&mut self.tids, parsed.hdr.tid, POOL_LEN);
                if self.sent.len() == WIRE_LEN {
                    self.sent.pop_front();
                }
                self.sent.push_back(mad.clone());
                let out = if on_b {
                    &mut self.out_b
                } else {
                    &mut self.out_a
                };
                if out.len() == WIRE_LEN {
                    out.pop_front();
                }
                out.push_back((dst, mad));
            }
        }
    }
}

/// `cm_engine` target: runs the records of `data` against a fresh [`Rig`].
pub fn check_cm(data: &[u8]) {
    Rig::run(data);
}
