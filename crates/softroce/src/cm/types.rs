//! The CM engine's vocabulary: connection IDs and states, configuration (with rdma_cm's
//! `CMA_*` defaults), the parameters of `connect` and `accept`, the events it reports and the
//! MADs it sends.

use crate::wire::cm::{CmaHdrRepr, RejReason, RepRepr, ReqRepr, SidrRepRepr, SidrReqRepr};
use crate::wire::mad::MAD_LEN;
use core::net::IpAddr;

/// rdma_cm's CM response timeout exponent (4.096 µs × 2^20 ≈ 4.3 s): `cma.c`
/// `CMA_CM_RESPONSE_TIMEOUT`.
pub const CMA_CM_RESPONSE_TIMEOUT: u8 = 20;
/// rdma_cm's maximum CM retries: `cma.c` `CMA_MAX_CM_RETRIES`.
pub const CMA_MAX_CM_RETRIES: u8 = 15;
/// rdma_cm's packet lifetime exponent on RoCE: `cma.c` `CMA_IBOE_PACKET_LIFETIME`.
pub const CMA_IBOE_PACKET_LIFETIME: u8 = 16;
/// The CA ACK delay exponent of softroce's devices (`ibv_device_attr.local_ca_ack_delay`),
/// rxe's `RXE_LOCAL_CA_ACK_DELAY`: what a REP says as its target ACK delay and what the CM
/// adds to the packet lifetime for the REQ's local ACK timeout (kernel `cm.c`, the
/// `cm_dev->ack_delay` of the port).
pub const LOCAL_CA_ACK_DELAY: u8 = 15;

/// The kernel CM's local ACK timeout exponent for a path of `packet_life_time` to a CA whose
/// ACK delay is `ca_ack_delay` (kernel `cm.c` `cm_ack_timeout`: about twice the packet
/// lifetime plus the delay, as IBTA 12.7.34 asks): the REQ's local ACK timeout (with the
/// local CA's delay) and the active side's QP timeout (with the REP's target ACK delay).
/// At most 31.
pub const fn cm_ack_timeout(ca_ack_delay: u8, packet_life_time: u8) -> u8 {
    let mut ack_timeout = packet_life_time as u32 + 1;
    let delay = ca_ack_delay as u32;
    if ack_timeout >= delay {
        ack_timeout += (delay >= ack_timeout - 1) as u32;
    } else {
        ack_timeout = delay + (ack_timeout + 1 >= delay) as u32;
    }
    if ack_timeout > 31 {
        31
    } else {
        ack_timeout as u8
    }
}

/// A local communication ID: names one connection of this engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CommId(pub u32);

/// Configuration of a CM engine.
#[derive(Debug, Clone, PartialEq)]
pub struct CmConfig {
    /// This port's IP address (its GID on RoCE).
    pub local_ip: IpAddr,
    /// This CA's GUID (REQ/REP `local_ca_guid`).
    pub local_ca_guid: u64,
    /// Seed of the communication IDs and transaction IDs.
    pub seed: u64,
    /// CM response timeout we announce (REQ `remote_`/`local_cm_response_timeout`).
    pub cm_response_timeout: u8,
    /// Retransmissions of a REQ/REP/DREQ before giving up.
    pub max_cm_retries: u8,
    /// Packet lifetime exponent (response timeouts, TIMEWAIT).
    pub packet_life_time: u8,
    /// Service timeout exponent we put in an MRA.
    pub mra_service_timeout: u8,
    /// Most connections (all states, TIMEWAIT included) the engine holds.
    pub max_connections: usize,
    /// The slot of a shared device this engine serves (`net::steer`): the top 8 bits of
    /// every local comm ID, so that the device's steering brings the peer's answers here.
    /// `None`: random 32-bit comm IDs (the kernel's are random too, `cm_alloc_id`).
    pub comm_id_slot: Option<u8>,
}

impl CmConfig {
    /// rdma_cm's values: response timeout 20, 15 retries, packet lifetime 16, MRA 24.
    pub fn new(local_ip: IpAddr, local_ca_guid: u64, seed: u64) -> CmConfig {
        CmConfig {
            local_ip,
            local_ca_guid,
            seed,
            cm_response_timeout: CMA_CM_RESPONSE_TIMEOUT,
            max_cm_retries: CMA_MAX_CM_RETRIES,
            packet_life_time: CMA_IBOE_PACKET_LIFETIME,
            mra_service_timeout: 24,
            max_connections: 4096,
            comm_id_slot: None,
        }
    }
}

/// State of one connection. Source: kernel `include/rdma/ib_cm.h` `enum ib_cm_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum CmState {
    Idle,
    ReqSent,
    ReqRcvd,
    MraReqSent,
    MraReqRcvd,
    RepSent,
    RepRcvd,
    MraRepRcvd,
    Established,
    DreqSent,
    DreqRcvd,
    Timewait,
    SidrReqSent,
    SidrReqRcvd,
}

/// What the active side asks for in its REQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectParams {
    /// The passive side's IP address.
    pub peer: IpAddr,
    /// Service ID (rdma_cm: port space << 16 | port).
    pub service_id: u64,
    /// Our RC QP.
    pub local_qpn: u32,
    /// The REQ's starting PSN (24 bits): the PSN the passive side sends from, so our QP's
    /// `rq_psn`; our `sq_psn` is the REP's starting PSN. Source: kernel cm.c (`ib_send_cm_req`
    /// keeps it as the active side's `rq_psn`, `cm_req_handler` as the passive side's
    /// `sq_psn`); capture 30-rping (the server's first RDMA READ carries the REQ's PSN, the
    /// client's first SEND the REP's). rxe NAKs (PSN sequence error) the first SEND of a frontend that reads it
    /// the other way round.
    pub starting_psn: u32,
    /// RDMA READs/atomics we accept (`max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// RDMA READs/atomics we issue (`max_rd_atomic`).
    pub initiator_depth: u8,
    /// Path MTU (IB enum, 1 = 256 … 5 = 4096).
    pub path_mtu: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Local ACK timeout exponent (5 bits).
    pub local_ack_timeout: u8,
    /// Flow label (rdma_cm: [`rdma_cm_flow_label`](super::rdma_cm_flow_label)).
    pub flow_label: u32,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Our QP uses an SRQ.
    pub srq: bool,
    /// Private data (rdma_cm: its IP header, then the user's), at most 92 bytes.
    pub private_data: Vec<u8>,
}

/// What the passive side answers in its REP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptParams {
    /// Our RC QP.
    pub local_qpn: u32,
    /// The REP's starting PSN: the PSN the active side sends from, so our QP's `rq_psn`; our
    /// `sq_psn` is the REQ's starting PSN (kernel cm.c `ib_send_cm_rep`, `cm_rep_handler`;
    /// see [`ConnectParams::starting_psn`]).
    pub starting_psn: u32,
    /// RDMA READs/atomics we accept.
    pub responder_resources: u8,
    /// RDMA READs/atomics we issue.
    pub initiator_depth: u8,
    /// Target ACK delay exponent.
    pub target_ack_delay: u8,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// Our QP uses an SRQ.
    pub srq: bool,
    /// Private data, at most 196 bytes.
    pub private_data: Vec<u8>,
}

/// What the engine reports (the librdmacm event each maps to is in the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for a service we listen on. Answer with `accept` or `reject`.
    ConnectRequest {
        /// The new connection.
        id: CommId,
        /// The peer's IP address.
        peer: IpAddr,
        /// The REQ: QP parameters, path and private data.
        req: Box<ReqRepr>,
        /// The rdma_cm IP header at the start of the private data, if it parses.
        cma: Option<CmaHdrRepr>,
    },
    /// The REP to our REQ. Apply it to the QP (RTR, RTS), then `establish`.
    ConnectResponse {
        /// The connection.
        id: CommId,
        /// The REP.
        rep: Box<RepRepr>,
    },
    /// The connection is established.
    Established {
        /// The connection.
        id: CommId,
    },
    /// The peer rejected the connection.
    Rejected {
        /// The connection (gone).
        id: CommId,
        /// The REJ reason.
        reason: RejReason,
        /// The REJ private data.
        private_data: Box<[u8; 148]>,
    },
    /// No response after all retries.
    Unreachable {
        /// The connection (gone).
        id: CommId,
    },
    /// The connection is disconnected (DREQ received, DREP received, or DREQ timed out).
    Disconnected {
        /// The connection.
        id: CommId,
    },
    /// TIMEWAIT is over; the connection is gone and its QP may be reused.
    TimewaitExit {
        /// The connection (gone).
        id: CommId,
    },
    /// A SIDR_REQ for a service we listen on. Answer with `sidr_reply`.
    SidrRequest {
        /// The request.
        id: CommId,
        /// The peer's IP address.
        peer: IpAddr,
        /// The SIDR_REQ.
        req: Box<SidrReqRepr>,
    },
    /// The SIDR_REP to our SIDR_REQ (status 0: `qpn`, `qkey` valid).
    SidrResponse {
        /// The request (gone).
        id: CommId,
        /// The SIDR_REP.
        rep: Box<SidrRepRepr>,
    },
}

impl CmEvent {
    /// The connection the event is about.
    pub fn id(&self) -> CommId {
        match self {
            CmEvent::ConnectRequest { id, .. }
            | CmEvent::ConnectResponse { id, .. }
            | CmEvent::Established { id }
            | CmEvent::Rejected { id, .. }
            | CmEvent::Unreachable { id }
            | CmEvent::Disconnected { id }
            | CmEvent::TimewaitExit { id }
            | CmEvent::SidrRequest { id, .. }
            | CmEvent::SidrResponse { id, .. } => *id,
        }
    }
}

/// A MAD to send: from QP1 to QP1 of `dst`, Q_Key 0x8001_0000.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MadTransmit {
    /// The peer's IP address.
    pub dst: IpAddr,
    /// The 256-byte MAD.
    pub mad: Box<[u8; MAD_LEN]>,
}
