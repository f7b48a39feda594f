//! The IB Communication Manager: a sans-IO engine that sets up and tears down connections by
//! exchanging CM MADs with a peer's QP1, as kernel `cm.c` does for rdma_cm, and the MAD agent
//! ([`MadAgent`]) that sits on QP1 and hands it the CM's MADs.
//!
//! # Shape
//! Like the QP engine, [`CmEngine`] never touches a socket or a clock. Its user (a frontend:
//! the Rust rdma_cm-shaped API, librdmacm.so.1, a test) calls, with a monotonic `now`:
//! - mutators: [`listen`](CmEngine::listen), [`connect`](CmEngine::connect),
//!   [`accept`](CmEngine::accept), [`establish`](CmEngine::establish),
//!   [`reject`](CmEngine::reject), [`cancel`](CmEngine::cancel),
//!   [`disconnect`](CmEngine::disconnect),
//!   [`sidr_request`](CmEngine::sidr_request), [`sidr_reply`](CmEngine::sidr_reply);
//! - inputs: [`handle_mad`](CmEngine::handle_mad) (a 256-byte MAD from QP1 and the peer's
//!   IP), [`handle_timeout`](CmEngine::handle_timeout);
//! - outputs, in this order after every input: [`poll_event`](CmEngine::poll_event) (what
//!   librdmacm reports), [`poll_mad`](CmEngine::poll_mad) (MADs to send from QP1 to the peer's
//!   QP1 with Q_Key 0x8001_0000), [`poll_timeout`](CmEngine::poll_timeout) (when to call
//!   `handle_timeout`).
//!
//! The engine creates and modifies no QP. A [`CmEvent::ConnectRequest`] carries the whole REQ
//! and a [`CmEvent::ConnectResponse`] the whole REP: the user applies them to its QP with
//! modify_qp (`dest_qp_num` = the peer's `local_qpn`, `rq_psn` = its `starting_psn`,
//! `path_mtu`, `max_dest_rd_atomic`/`max_rd_atomic` from responder resources and initiator
//! depth, `timeout`, `retry_cnt`, `rnr_retry`), exactly as librdmacm's `ucma_modify_qp_rtr`
//! and `_rts` do, then calls `accept` (passive) or `establish` (active, sends the RTU).
//!
//! # States (IBTA Vol 1 ch. 12 state diagrams, kernel `enum ib_cm_state`)
//! Active: IDLE → REQ_SENT (connect) → (MRA_REQ_RCVD) → REP_RCVD (REP; event
//! ConnectResponse) → ESTABLISHED (establish: RTU sent; event Established).
//! Passive: REQ_RCVD (REQ; event ConnectRequest) → (MRA_REQ_SENT) → REP_SENT (accept) →
//! (MRA_REP_RCVD) → ESTABLISHED (RTU; event Established).
//! States in parentheses are passed only when an MRA is exchanged.
//! Either side: ESTABLISHED → DREQ_SENT (disconnect) → TIMEWAIT (DREP or DREQ timeout; event
//! Disconnected); ESTABLISHED → DREQ_RCVD (DREQ; event Disconnected) → TIMEWAIT (disconnect:
//! DREP sent); TIMEWAIT → gone (timer; event TimewaitExit). SIDR: SIDR_REQ_SENT →
//! gone (SIDR_REP; event SidrResponse), SIDR_REQ_RCVD → gone (sidr_reply).
//! A connection that is rejected or unreachable is gone at once, after its event.
//!
//! # Timers (kernel `cm.c` `cm_convert_to_ms`, `cm_enter_timewait`; cma.c constants)
//! Response timeout = 2 × packet lifetime + 4.096 µs × 2^(the peer's CM response timeout):
//! REQ and DREQ wait for the peer's `remote_cm_response_timeout` we announce, REP for the
//! REQ's `local_cm_response_timeout`. Each message is retransmitted up to `max_cm_retries`
//! times (the REQ's for the REP); then the connection is UNREACHABLE (REQ, REP: a REJ with
//! reason Timeout is sent) or goes to TIMEWAIT (DREQ). An MRA stretches the wait to 2 ×
//! packet lifetime + its service timeout, without retries; a second MRA for the same message
//! is a counted duplicate and stretches nothing. TIMEWAIT lasts
//! 4.096 µs × 2^(packet lifetime + 1). Every exponent a peer chooses (REQ response timeouts,
//! MRA service timeout) counts as at most [`MAX_PEER_CM_RESPONSE_TIMEOUT`].
//!
//! # Bounded request state (kernel `ucma.c` backlog; spec/deviations.toml)
//! A listener holds at most its backlog ([`CmEngine::listen_with_backlog`], default and
//! maximum [`UCMA_MAX_BACKLOG`]) of requests the application has not answered; a REQ beyond
//! it is dropped without a REJ (the peer retries), a SIDR_REQ gets SIDR_REP reject. A request
//! nobody answers is aged out once its peer has given up (every try of the REQ's remote
//! response timeout, or of our MRA's after the last duplicate REQ): REJ(timeout), event
//! Unreachable, gone.
//!
//! # Duplicates and stale messages (kernel `cm_dup_req_handler`, `cm_dup_rep_handler`,
//! `cm_dreq_handler`, `cm_issue_rej`, `cm_issue_drep`)
//! A duplicate REQ gets an MRA while the user decides (REQ_RCVD, MRA_REQ_SENT), the REP again
//! in REP_SENT, a REJ(stale connection) in TIMEWAIT. A duplicate REP gets the RTU again in
//! ESTABLISHED. A DREQ in TIMEWAIT gets the DREP again; a DREQ for an unknown ID gets a DREP;
//! a REP for an unknown ID gets a REJ(invalid comm ID); a REQ for a service nobody listens
//! on gets a REJ(invalid service ID). Everything else that matches nothing is dropped and
//! counted by [`CmDropReason`].
//!
//! # Events and librdmacm
//! ConnectRequest = RDMA_CM_EVENT_CONNECT_REQUEST, ConnectResponse =
//! RDMA_CM_EVENT_CONNECT_RESPONSE (librdmacm with a QP attached applies it, sends the RTU and
//! reports ESTABLISHED), Established = ESTABLISHED, Rejected = REJECTED (status = the REJ
//! reason), Unreachable = UNREACHABLE (ETIMEDOUT), Disconnected = DISCONNECTED, TimewaitExit
//! = TIMEWAIT_EXIT, SidrRequest = CONNECT_REQUEST on a UDP id, SidrResponse = ESTABLISHED
//! (status 0, with the QPN and Q_Key) or UNREACHABLE (kernel `cma_sidr_rep_handler`).
//!
//! Source: IBTA Vol 1 ch. 12 (communication management); kernel `drivers/infiniband/core/
//! cm.c` and `cma.c`; rdma-core `librdmacm/cma.c`. See also docs/cm.md.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod agent;
mod counters;
mod error;
pub mod rdma_cm;
mod recv;
#[cfg(test)]
mod tests;
mod types;

pub use agent::{MadAgent, MadClassDrops};
pub use counters::{CmCounters, CmDropReason};
pub use error::{CmError, CmReject};
pub use types::{
    AcceptParams, CMA_CM_RESPONSE_TIMEOUT, CMA_IBOE_PACKET_LIFETIME, CMA_MAX_CM_RETRIES, CmConfig,
    CmEvent, CmState, CommId, ConnectParams, LOCAL_CA_ACK_DELAY, MadTransmit, cm_ack_timeout,
};

use crate::rand::SplitMix64;
use crate::transport::{Instant, PathMtu};
use crate::wire::cm::{
    CmMadRepr, CmMsgRepr, CmPathRepr, CmaHdr, CmaHdrRepr, DrepRepr, DreqRepr, MraRepr, RejReason,
    RejRepr, RepRepr, ReqRepr, RtuRepr, SidrRepRepr, SidrReqRepr, SidrStatus, gid_of_ip, msg_ref,
};
use crate::wire::mad::{
    CM_CLASS_VERSION, MAD_BASE_VERSION, MAD_LEN, MAD_METHOD_SEND, MGMT_CLASS_CM, MadHdrRepr,
};
use core::net::IpAddr;
use core::time::Duration;
use std::collections::{BTreeMap, VecDeque};

/// The most requests (REQ, SIDR_REQ) of one listener that the application has not answered
/// yet, and the backlog of [`CmEngine::listen`]; a larger backlog given to
/// [`CmEngine::listen_with_backlog`] counts as this one, and so does 0.
/// Source: kernel `ucma.c` (`max_backlog`, sysctl `net.rdma_ucm.max_backlog`, default 1024;
/// `ucma_listen` takes it for a backlog `<= 0` or above it).
pub const UCMA_MAX_BACKLOG: usize = 1024;

/// The largest CM response timeout exponent a peer can make this engine wait for: a REQ's
/// `local_cm_response_timeout` (our wait for the RTU), its `remote_cm_response_timeout`
/// (how long the peer waits for our REP, which ages a request) and an MRA's
/// `service_timeout` count as at most 24 (4.096 µs × 2^24 ≈ 68.7 s per try, so with 15
/// retries and rdma_cm's packet lifetime a connection waits at most about 18.5 min instead of
/// the 39 h that exponent 31 gives). Units: the IB time exponent. Source: 24 is the largest
/// any Linux rdma_cm sends (`cma.c` `CMA_CM_MRA_SETTING`; its REQs carry
/// `CMA_CM_RESPONSE_TIMEOUT` = 20); kernel `cm.c` honours all 31, see spec/deviations.toml.
pub const MAX_PEER_CM_RESPONSE_TIMEOUT: u8 = 24;

/// 4.096 µs × 2^`exp` (the IB time encoding), `exp` capped at 31.
pub fn ib_time(exp: u8) -> Duration {
    Duration::from_nanos(4096u64 << exp.min(31))
}

/// The flow label rdma_cm puts in a RoCE REQ: `(sport × 31 + dport) & 0xf_ffff`.
/// Source: `cma.c` `cma_get_roce_udp_flow_label`; docs/wire-facts.md §2.1.
pub const fn rdma_cm_flow_label(src_port: u16, dst_port: u16) -> u32 {
    ((src_port as u32)
        .wrapping_mul(31)
        .wrapping_add(dst_port as u32))
        & 0x000f_ffff
}

/// Bytes of RoCE headers rdma_cm subtracts from a link's MTU for a route's path MTU: GRH 40,
/// UDP 8, BTH 12, XRC ETH 4, AtomicETH 28, ICRC 4 (`ib_addr.h` `iboe_get_mtu`).
pub const IBOE_HEADER_BYTES: u32 = 96;

/// The path MTU rdma_cm gives a RoCE route over a link of `link_mtu_bytes` (the netdev MTU):
/// the largest IB MTU not above `link_mtu_bytes − 96`, as an IB enum (1 = 256 … 5 = 4096).
/// Units: bytes in, IB MTU enum out. Errors: None when not even 256 bytes fit (rdma_cm then
/// fails the route with EINVAL). Source: `cma.c` `cma_resolve_iboe_route` (the path record's
/// MTU is `iboe_get_mtu(ndev->mtu)`, whatever the device's active MTU); a 1500-byte link gives
/// 1024, which the kernel's REQ carries (docs/wire-facts.md §2.1).
pub const fn rdma_cm_route_mtu(link_mtu_bytes: u32) -> Option<u8> {
    match PathMtu::largest_fitting(link_mtu_bytes.saturating_sub(IBOE_HEADER_BYTES)) {
        Some(mtu) => Some(mtu as u8),
        None => None,
    }
}

/// The 256 bytes of a CM MAD: the MAD header for `msg` with transaction ID `tid`, then
/// `msg`.
fn mad_bytes(tid: u64, msg: CmMsgRepr) -> Box<[u8; MAD_LEN]> {
    Box::new(
        CmMadRepr {
            hdr: MadHdrRepr::cm(tid, msg.attr_id()),
            msg,
        }
        .to_bytes(),
    )
}

impl Conn {
    /// The DREQ that ends this connection (local comm ID `id`), no private data.
    fn dreq(&self, id: u32) -> DreqRepr {
        DreqRepr {
            local_comm_id: id,
            remote_comm_id: self.remote_comm_id,
            remote_qpn_eecn: self.remote_qpn,
            private_data: [0; 220],
        }
    }

    /// The DREP that answers the peer's DREQ on this connection (local comm ID `id`).
    fn drep(&self, id: u32) -> DrepRepr {
        DrepRepr {
            local_comm_id: id,
            remote_comm_id: self.remote_comm_id,
            private_data: [0; 224],
        }
    }
}

/// One connection's state.
#[derive(Debug, Clone)]
struct Conn {
    state: CmState,
    peer: IpAddr,
    /// The peer's communication ID (0 until known).
    remote_comm_id: u32,
    /// The transaction ID of the exchange in progress.
    tid: u64,
    /// The peer's QPN (0 until known).
    remote_qpn: u32,
    /// The service ID of the REQ or SIDR_REQ.
    service_id: u64,
    /// The last message sent, for retransmission and for answering duplicates.
    last_sent: Option<Box<[u8; MAD_LEN]>>,
    /// When to retransmit or give up (or leave TIMEWAIT).
    deadline: Option<Instant>,
    retries_left: u8,
    /// How long to wait for a response to what we send.
    response_timeout: Duration,
    /// Retries granted to each message of this connection.
    max_cm_retries: u8,
    /// The key `(peer, comm ID)` under which this connection is in `by_remote` (passive
    /// side: the comm ID of the REQ or the request ID of the SIDR_REQ), kept apart from
    /// `remote_comm_id` so that the entry goes with the connection whatever later messages
    /// say.
    registered: Option<u32>,
}

/// The CM engine of one port. See the module documentation.
#[derive(Debug)]
pub struct CmEngine {
    config: CmConfig,
    rng: SplitMix64,
    tid_hi: u32,
    conns: BTreeMap<u32, Conn>,
    /// (peer, remote comm ID or SIDR request ID) → local ID, for duplicate REQs/SIDR_REQs.
    by_remote: BTreeMap<(IpAddr, u32), u32>,
    /// Listened service ID → its backlog (1..=[`UCMA_MAX_BACKLOG`]).
    listens: BTreeMap<u64, usize>,
    events: VecDeque<CmEvent>,
    mads: VecDeque<MadTransmit>,
    counters: CmCounters,
}

fn copy_pd<const N: usize>(data: &[u8]) -> Result<[u8; N], CmError> {
    if data.len() > N {
        return Err(CmError::PrivateDataTooLong {
            given: data.len(),
            max: N,
        });
    }
    let mut a = [0u8; N];
    a[..data.len()].copy_from_slice(data);
    Ok(a)
}

impl CmEngine {
    /// An engine with no connection and no listener.
    pub fn new(config: CmConfig) -> CmEngine {
        let mut e = CmEngine {
            rng: SplitMix64::new(config.seed ^ 0x00c0_ffee_0c0f_fee0),
            tid_hi: 0,
            config,
            conns: BTreeMap::new(),
            by_remote: BTreeMap::new(),
            listens: BTreeMap::new(),
            events: VecDeque::new(),
            mads: VecDeque::new(),
            counters: CmCounters::default(),
        };
        e.tid_hi = e.next_random() as u32;
        e
    }

    // ---- getters ----

    /// The configuration.
    pub fn config(&self) -> &CmConfig {
        &self.config
    }
    /// The counters.
    pub fn counters(&self) -> &CmCounters {
        &self.counters
    }
    /// The state of connection `id`, `None` once it is gone.
    pub fn state(&self, id: CommId) -> Option<CmState> {
        self.conns.get(&id.0).map(|c| c.state)
    }
    /// A transaction ID this side forms for connection `id`: the engine's random high half,
    /// the local comm ID low (kernel `cm_form_tid`).
    fn own_tid(&self, id: u32) -> u64 {
        (u64::from(self.tid_hi) << 32) | u64::from(id)
    }

    /// The MAD that ends connection `id` on this side's behalf once the process that owns
    /// it is gone, as the kernel's `cm_destroy_id` ends a dead process's connections: the
    /// DREQ that [`CmEngine::disconnect`] would send now (ESTABLISHED), or the DREP a
    /// received DREQ waits for (DREQ_RCVD). The engine's state does not change (the
    /// stand-in of `net::standin` sends it after the process died). `None` in any other
    /// state, or for an unknown ID.
    pub fn exit_mad(&self, id: CommId) -> Option<MadTransmit> {
        let c = self.conns.get(&id.0)?;
        let (tid, msg) = match c.state {
            CmState::Established => (self.own_tid(id.0), CmMsgRepr::Dreq(c.dreq(id.0))),
            CmState::DreqRcvd => (c.tid, CmMsgRepr::Drep(c.drep(id.0))),
            _ => return None,
        };
        Some(MadTransmit {
            dst: c.peer,
            mad: mad_bytes(tid, msg),
        })
    }

    /// How many connections the engine holds (all states, TIMEWAIT included).
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }
    /// Every connection and its state, by ID.
    pub fn connections(&self) -> impl Iterator<Item = (CommId, CmState)> + '_ {
        self.conns.iter().map(|(&id, c)| (CommId(id), c.state))
    }
    /// The peer's QPN of connection `id`, once known.
    pub fn remote_qpn(&self, id: CommId) -> Option<u32> {
        self.conns
            .get(&id.0)
            .map(|c| c.remote_qpn)
            .filter(|&q| q != 0)
    }

    /// Checks the engine's tables against each other: every `by_remote` entry names a live
    /// connection registered under that very key, and every registered connection has its
    /// entry; and that no connection waits without a timer, except in the states that wait
    /// for this engine's own application (ESTABLISHED, REP_RCVD, DREQ_RCVD), so that no peer
    /// can make the engine hold a connection forever. For tests and fuzz targets, which call
    /// it after each step.
    /// Errors: a description of the first inconsistency.
    pub fn check_invariants(&self) -> Result<(), String> {
        for (&(peer, remote), &id) in &self.by_remote {
            match self.conns.get(&id) {
                None => {
                    return Err(format!(
                        "by_remote ({peer}, {remote:#x}) names connection {id:#x}, which is gone"
                    ));
                }
                Some(c) if c.peer != peer || c.registered != Some(remote) => {
                    return Err(format!(
                        "by_remote ({peer}, {remote:#x}) names connection {id:#x}, registered \
                         as ({}, {:?})",
                        c.peer, c.registered
                    ));
                }
                Some(_) => {}
            }
        }
        for (&id, c) in &self.conns {
            if let Some(key) = c.registered
                && self.by_remote.get(&(c.peer, key)) != Some(&id)
            {
                return Err(format!(
                    "connection {id:#x} registered as ({}, {key:#x}) has no by_remote entry",
                    c.peer
                ));
            }
            let app_owned = matches!(
                c.state,
                CmState::Established | CmState::RepRcvd | CmState::DreqRcvd
            );
            if !app_owned && c.deadline.is_none() {
                return Err(format!(
                    "connection {id:#x} in {:?} waits for its peer without a timer",
                    c.state
                ));
            }
        }
        Ok(())
    }

    /// The network said `peer` has no CM to answer (an ICMP port unreachable for a MAD sent
    /// there: no RoCE device at that address) or cannot be reached: every connection of ours
    /// still waiting for that peer's first answer (REQ_SENT, MRA_REQ_RCVD, SIDR_REQ_SENT)
    /// ends with [`CmEvent::Unreachable`] now instead of after all its retries, as the kernel
    /// CM ends a REQ whose send failed (`cm_process_send_error` -> IB_CM_REQ_ERROR, which
    /// rdma_cm reports as RDMA_CM_EVENT_UNREACHABLE). Connections the peer has answered are
    /// left to their timers: a peer that answered has a CM. Returns how many ended.
    pub fn handle_unreachable(&mut self, _now: Instant, peer: IpAddr) -> usize {
        let ended: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                c.peer == peer
                    && matches!(
                        c.state,
                        CmState::ReqSent | CmState::MraReqRcvd | CmState::SidrReqSent
                    )
            })
            .map(|(&id, _)| id)
            .collect();
        for &id in &ended {
            tracing::info!(
                target: "softroce::cm",
                comm_id = %format_args!("{id:#x}"),
                %peer,
                "connect to {peer}: unreachable (ICMP: no RoCE device there); giving up"
            );
            self.counters.unreachable += 1;
            self.events
                .push_back(CmEvent::Unreachable { id: CommId(id) });
            self.remove(id);
        }
        ended.len()
    }

    // ---- mutators ----

    /// Accepts REQs and SIDR_REQs for `service_id`, with the largest backlog
    /// ([`UCMA_MAX_BACKLOG`]), as rdma_listen with backlog 0 does.
    /// Errors: [`CmError::AddrInUse`] if someone already listens on it.
    pub fn listen(&mut self, service_id: u64) -> Result<(), CmError> {
        self.listen_with_backlog(service_id, 0)
    }

    /// Accepts REQs and SIDR_REQs for `service_id`, holding at most `backlog` of them that
    /// the application has not answered yet (ConnectRequests not accepted or rejected,
    /// SidrRequests without a reply). A REQ beyond the backlog is dropped without a REJ and
    /// counted ([`CmDropReason::BacklogFull`]), so that the peer's next retry may find room;
    /// a SIDR_REQ beyond it gets a SIDR_REP with status reject. Units: requests; 0 or more
    /// than [`UCMA_MAX_BACKLOG`] means [`UCMA_MAX_BACKLOG`].
    /// Errors: [`CmError::AddrInUse`] if someone already listens on it.
    /// Source: kernel `ucma.c` (`ucma_listen` clamps the backlog; `ucma_event_handler`
    /// refuses a connect request beyond it with -ENOMEM), `cm.c` `cm_destroy_id` (a REQ_RCVD
    /// destroyed with -ENOMEM is not rejected, "to allow future retries"; a SIDR_REQ_RCVD is
    /// answered with IB_SIDR_REJECT). Unlike ucma, whose slot is freed when the event is read,
    /// a request holds its slot until the application answers it (spec/deviations.toml).
    pub fn listen_with_backlog(&mut self, service_id: u64, backlog: usize) -> Result<(), CmError> {
        if self.listens.contains_key(&service_id) {
            return Err(CmError::AddrInUse);
        }
        let backlog = if backlog == 0 {
            UCMA_MAX_BACKLOG
        } else {
            backlog.min(UCMA_MAX_BACKLOG)
        };
        self.listens.insert(service_id, backlog);
        Ok(())
    }

    /// Stops listening on `service_id`; connections already requested stay.
    pub fn unlisten(&mut self, service_id: u64) -> bool {
        self.listens.remove(&service_id).is_some()
    }

    /// The backlog of the listener on `service_id`, `None` if nobody listens on it.
    /// Units: requests.
    pub fn backlog(&self, service_id: u64) -> Option<usize> {
        self.listens.get(&service_id).copied()
    }

    /// Every service ID listened on, in order, with its backlog.
    pub fn listened(&self) -> impl Iterator<Item = (u64, usize)> + '_ {
        self.listens.iter().map(|(&sid, &backlog)| (sid, backlog))
    }

    /// Requests for `service_id` the application has not answered yet: connections in
    /// REQ_RCVD, MRA_REQ_SENT or SIDR_REQ_RCVD. They count against the listener's backlog.
    pub fn pending_requests(&self, service_id: u64) -> usize {
        self.conns
            .values()
            .filter(|c| {
                c.service_id == service_id
                    && matches!(
                        c.state,
                        CmState::ReqRcvd | CmState::MraReqSent | CmState::SidrReqRcvd
                    )
            })
            .count()
    }

    /// Sends a REQ and returns the new connection's ID (state REQ_SENT).
    /// Errors: [`CmError::NoMem`], [`CmError::PrivateDataTooLong`] (over 92 bytes).
    pub fn connect(&mut self, now: Instant, p: &ConnectParams) -> Result<CommId, CmError> {
        let private_data = copy_pd::<92>(&p.private_data)?;
        let id = self.new_conn(p.peer, CmState::ReqSent)?;
        let tid = self.own_tid(id);
        let c = &self.config;
        let req = ReqRepr {
            local_comm_id: id,
            service_id: p.service_id,
            local_ca_guid: c.local_ca_guid,
            local_qkey: 0,
            local_qpn: p.local_qpn & 0x00ff_ffff,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: c.cm_response_timeout,
            transport_service_type: 0,
            end_to_end_flow_control: false,
            starting_psn: p.starting_psn & 0x00ff_ffff,
            local_cm_response_timeout: c.cm_response_timeout,
            retry_count: p.retry_count & 7,
            pkey: crate::wire::DEFAULT_PKEY,
            path_mtu: p.path_mtu & 0xf,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count & 7,
            max_cm_retries: c.max_cm_retries & 0xf,
            srq: p.srq,
            extended_transport_type: 0,
            primary_path: CmPathRepr {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: gid_of_ip(c.local_ip),
                remote_gid: gid_of_ip(p.peer),
                flow_label: p.flow_label & 0x000f_ffff,
                packet_rate: 0,
                traffic_class: p.traffic_class,
                hop_limit: p.hop_limit,
                sl: 0,
                subnet_local: false,
                local_ack_timeout: p.local_ack_timeout & 0x1f,
            },
            alternate_path: CmPathRepr::default(),
            sap_supported: false,
            private_data,
        };
        let timeout = self.response_timeout(c.cm_response_timeout);
        let retries = c.max_cm_retries;
        let conn = self.conn_api(CommId(id))?;
        conn.tid = tid;
        conn.service_id = p.service_id;
        conn.response_timeout = timeout;
        conn.max_cm_retries = retries;
        self.send_and_arm(now, id, CmMsgRepr::Req(req));
        Ok(CommId(id))
    }

    /// Answers a ConnectRequest with a REP (state REP_SENT).
    /// Errors: [`CmError::NoSuchId`], [`CmError::InvalidState`] unless REQ_RCVD or
    /// MRA_REQ_SENT, [`CmError::PrivateDataTooLong`] (over 196 bytes).
    pub fn accept(&mut self, now: Instant, id: CommId, p: &AcceptParams) -> Result<(), CmError> {
        self.expect_state(id, "accept", &[CmState::ReqRcvd, CmState::MraReqSent])?;
        let private_data = copy_pd::<196>(&p.private_data)?;
        let conn = self.conn_api(id)?;
        conn.state = CmState::RepSent;
        let rep = RepRepr {
            local_comm_id: id.0,
            remote_comm_id: conn.remote_comm_id,
            local_qkey: 0,
            local_qpn: p.local_qpn & 0x00ff_ffff,
            local_eecn: 0,
            starting_psn: p.starting_psn & 0x00ff_ffff,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: p.target_ack_delay & 0x1f,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: p.rnr_retry_count & 7,
            srq: p.srq,
            local_ca_guid: self.config.local_ca_guid,
            private_data,
        };
        self.send_and_arm(now, id.0, CmMsgRepr::Rep(rep));
        Ok(())
    }

    /// Sends the RTU after a ConnectResponse (state ESTABLISHED, event Established).
    /// Errors: [`CmError::NoSuchId`], [`CmError::InvalidState`] unless REP_RCVD.
    pub fn establish(&mut self, _now: Instant, id: CommId) -> Result<(), CmError> {
        self.expect_state(id, "establish", &[CmState::RepRcvd])?;
        let conn = self.conn_api(id)?;
        conn.state = CmState::Established;
        let rtu = RtuRepr {
            local_comm_id: id.0,
            remote_comm_id: conn.remote_comm_id,
            private_data: [0; 224],
        };
        self.send(id.0, CmMsgRepr::Rtu(rtu), true);
        self.events.push_back(CmEvent::Established { id });
        Ok(())
    }

    /// Refuses a ConnectRequest (REJ, reason consumer-defined) or a ConnectResponse; the
    /// connection is gone.
    /// Errors: [`CmError::NoSuchId`], [`CmError::InvalidState`] unless REQ_RCVD,
    /// MRA_REQ_SENT or REP_RCVD, [`CmError::PrivateDataTooLong`] (over 148 bytes).
    pub fn reject(
        &mut self,
        _now: Instant,
        id: CommId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let state = self.expect_state(
            id,
            "reject",
            &[CmState::ReqRcvd, CmState::MraReqSent, CmState::RepRcvd],
        )?;
        let pd = copy_pd::<148>(private_data)?;
        let which = if state == CmState::RepRcvd {
            msg_ref::REP
        } else {
            msg_ref::REQ
        };
        let c = self.conn_api(id)?;
        let (peer, tid, remote) = (c.peer, c.tid, c.remote_comm_id);
        self.send_rej_pd(peer, tid, id.0, remote, which, CmReject::Consumer, pd);
        self.remove(id.0);
        Ok(())
    }

    /// Abandons a connect that has no answer yet (REQ_SENT, MRA_REQ_RCVD): sends a REJ
    /// (reason Timeout, as when the REQ's retries run out) and the connection is gone,
    /// without an event. This is what the kernel's `cm_destroy_id` does when rdma_cm
    /// destroys an id whose connect is pending; the Rust API's connect calls it when its
    /// caller's timeout is over first. A SIDR request with no answer yet (SIDR_REQ_SENT) is
    /// forgotten without a message (SIDR has no REJ; `cm_destroy_id` cancels its MAD), so
    /// it is not retried and a late SIDR_REP finds nothing.
    /// Errors: [`CmError::NoSuchId`], [`CmError::InvalidState`] in any other state.
    pub fn cancel(&mut self, _now: Instant, id: CommId) -> Result<(), CmError> {
        let state = self.expect_state(
            id,
            "cancel",
            &[CmState::ReqSent, CmState::MraReqRcvd, CmState::SidrReqSent],
        )?;
        if state == CmState::SidrReqSent {
            self.remove(id.0);
            return Ok(());
        }
        let c = self.conn_api(id)?;
        let (peer, tid, remote) = (c.peer, c.tid, c.remote_comm_id);
        self.send_rej(peer, tid, id.0, remote, msg_ref::REQ, CmReject::Timeout);
        self.remove(id.0);
        Ok(())
    }

    /// Answers the REQ of connection `id` (REQ_RCVD or MRA_REQ_SENT) as a REQ that finds no
    /// listener is answered: REJ reason 8 (invalid service ID) with local comm ID 0 (IBTA
    /// C12; kernel `cm_req_handler` -> `cm_issue_rej`), and forgets the connection. For a
    /// frontend that held a request while nobody listened on its service ID and gives up.
    /// Errors: [`CmError::InvalidState`] in any other state, [`CmError::NoSuchId`].
    pub fn reject_no_listener(&mut self, _now: Instant, id: CommId) -> Result<(), CmError> {
        self.expect_state(
            id,
            "reject_no_listener",
            &[CmState::ReqRcvd, CmState::MraReqSent],
        )?;
        let c = self.conn_api(id)?;
        let (peer, tid, remote) = (c.peer, c.tid, c.remote_comm_id);
        self.send_rej(peer, tid, 0, remote, msg_ref::REQ, CmReject::NoListener);
        self.remove(id.0);
        Ok(())
    }

    /// ESTABLISHED (or REP_SENT, MRA_REP_RCVD): sends a DREQ (state DREQ_SENT). DREQ_RCVD:
    /// sends the DREP (state TIMEWAIT). As librdmacm's `rdma_disconnect`.
    /// Errors: [`CmError::NoSuchId`], [`CmError::InvalidState`] in any other state.
    pub fn disconnect(&mut self, now: Instant, id: CommId) -> Result<(), CmError> {
        let state = self.expect_state(
            id,
            "disconnect",
            &[
                CmState::Established,
                CmState::RepSent,
                CmState::MraRepRcvd,
                CmState::DreqRcvd,
            ],
        )?;
        let own_tid = self.own_tid(id.0);
        let conn = self.conn_api(id)?;
        if state == CmState::DreqRcvd {
            let drep = conn.drep(id.0);
            self.send(id.0, CmMsgRepr::Drep(drep), true);
            self.enter_timewait(now, id.0);
            return Ok(());
        }
        conn.state = CmState::DreqSent;
        // The active side keeps its connection's TID (as in 30-rping); the passive side
        // forms one from its own ID (kernel `cm_form_tid`).
        conn.tid = own_tid;
        let dreq = conn.dreq(id.0);
        self.send_and_arm(now, id.0, CmMsgRepr::Dreq(dreq));
        Ok(())
    }

    /// Sends a SIDR_REQ (state SIDR_REQ_SENT); the answer is a SidrResponse or Unreachable.
    /// Errors: [`CmError::NoMem`], [`CmError::PrivateDataTooLong`] (over 216 bytes).
    pub fn sidr_request(
        &mut self,
        now: Instant,
        peer: IpAddr,
        service_id: u64,
        private_data: &[u8],
    ) -> Result<CommId, CmError> {
        let private_data = copy_pd::<216>(private_data)?;
        let id = self.new_conn(peer, CmState::SidrReqSent)?;
        let timeout = self.response_timeout(self.config.cm_response_timeout);
        let retries = self.config.max_cm_retries;
        let tid = self.own_tid(id);
        let conn = self.conn_api(CommId(id))?;
        conn.tid = tid;
        conn.service_id = service_id;
        conn.response_timeout = timeout;
        conn.max_cm_retries = retries;
        let req = SidrReqRepr {
            request_id: id,
            pkey: crate::wire::DEFAULT_PKEY,
            service_id,
            private_data,
        };
        self.send_and_arm(now, id, CmMsgRepr::SidrReq(req));
        Ok(CommId(id))
    }

    /// Answers a SidrRequest with a SIDR_REP; the request is gone.
    /// Errors: [`CmError::NoSuchId`], [`CmError::InvalidState`] unless SIDR_REQ_RCVD,
    /// [`CmError::PrivateDataTooLong`] (over 136 bytes).
    pub fn sidr_reply(
        &mut self,
        _now: Instant,
        id: CommId,
        status: SidrStatus,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        self.expect_state(id, "sidr_reply", &[CmState::SidrReqRcvd])?;
        let private_data = copy_pd::<136>(private_data)?;
        let c = self.conn_api(id)?;
        let (peer, tid, request_id, service_id) = (c.peer, c.tid, c.remote_comm_id, c.service_id);
        let rep = SidrRepRepr {
            request_id,
            status,
            additional_info_length: 0,
            qpn: qpn & 0x00ff_ffff,
            service_id,
            qkey,
            additional_info: [0; 72],
            private_data,
        };
        self.push_mad(peer, tid, CmMsgRepr::SidrRep(rep));
        self.remove(id.0);
        Ok(())
    }
}
