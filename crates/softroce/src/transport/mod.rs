//! Transport: one sans-IO engine per queue pair, split like kernel rxe into a requester
//! (WQE → packets), a responder (request packets → execution → ACK/NAK/READ responses) and a
//! completer (responses → work completions).
//!
//! Contract (after quinn-proto's `Connection`): the owner feeds input with
//! [`QpEngine::handle_packet`] and [`QpEngine::handle_timeout`], posts work with
//! [`QpEngine::post_send`] / [`QpEngine::post_recv`], and drains output with
//! [`QpEngine::poll_transmit`] (datagrams to send), [`QpEngine::poll_completion`] (work
//! completions) and [`QpEngine::poll_timeout`] (when to call `handle_timeout`). `now` must
//! not decrease between calls. Local operations (REG_MR, LOCAL_INV, BIND_MW) send nothing:
//! when `poll_transmit` has nothing left, [`QpEngine::run_local_ops`] executes those the
//! requester has reached (then poll again). Nothing here does I/O, reads a clock or uses a
//! global RNG.
//! Registered memory is passed in as a [`MemoryTable`] on every call that touches it.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod bufpool;
mod completer;
mod counters;
mod error;
mod local_ops;
mod memory;
mod mw;
mod requester;
mod responder;
mod srq;
mod timer;
mod transmit;
mod wc;
mod wr;

pub use counters::{Counters, DropReason};
pub use error::{Disposition, QpAction, RespError};
pub use local_ops::MAX_INLINE_DATA;
pub use memory::{
    AtomicOp, ForeignMem, MAX_MR, MAX_MW, MemError, MrBytes, MrEntry, MrKind, MrState,
    MrTable as MemoryTable, MwEntry, MwState, MwType, is_mw_key,
};
pub use mw::{BindMw, RegMr, inc_rkey};
pub use srq::{QpEvent, SrqQueue};
pub use timer::{Instant, Timer, TimerTable, ack_timeout};
use transmit::gathered;
pub use transmit::*;
pub use wc::*;
pub use wr::*;

use crate::wire::{
    ICRC_LEN, IcrcHasher, IcrcIp, PacketRepr, Psn, ROCE_V2_UDP_PORT, RocePacket, Transport,
    icrc_of_body_parts,
};
use core::net::IpAddr;
use core::ptr::NonNull;
use std::collections::VecDeque;

/// Queue pair transport type. Source: `enum ibv_qp_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpType {
    /// Reliable connected (`IBV_QPT_RC`).
    Rc,
    /// Unreliable connected (`IBV_QPT_UC`).
    Uc,
    /// Unreliable datagram (`IBV_QPT_UD`).
    Ud,
    /// The general services QP, QP1 (`IB_QPT_GSI`): UD on the wire, created by the device,
    /// Q_Key fixed at 0x8001_0000 for what it sends and receives (rxe `GSI_QKEY`).
    Gsi,
}

impl QpType {
    /// True for the datagram types (UD and GSI), which share the UD data path.
    pub const fn is_datagram(self) -> bool {
        matches!(self, QpType::Ud | QpType::Gsi)
    }
}

/// The Q_Key of QP1: every GSI packet carries it and QP1 accepts no other. Source: ib_core
/// `IB_QP1_QKEY`; rxe `GSI_QKEY` in `rxe_req.c` / `rxe_recv.c` `check_keys`.
pub const GSI_QKEY: u32 = 0x8001_0000;

/// The DestQP of every multicast packet. Source: IBTA Vol 1 ch. 10 (multicast: QP 0xFFFFFF);
/// ib_core `IB_MULTICAST_QPN`.
pub const MULTICAST_QPN: u32 = 0x00ff_ffff;

/// Queue pair state, in `enum ibv_qp_state` order. Source: IBTA Vol 1 ch. 10 (QP state machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum QpState {
    /// `IBV_QPS_RESET`.
    Reset,
    /// `IBV_QPS_INIT`.
    Init,
    /// `IBV_QPS_RTR`: ready to receive.
    Rtr,
    /// `IBV_QPS_RTS`: ready to send.
    Rts,
    /// `IBV_QPS_SQD`: send queue drained.
    Sqd,
    /// `IBV_QPS_SQE`: send queue error.
    Sqe,
    /// `IBV_QPS_ERR`.
    Err,
}

impl QpState {
    /// Upper-case verbs name (`RESET`, `INIT`, `RTR`, …).
    pub const fn name(self) -> &'static str {
        match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        }
    }
}

/// Path MTU: the largest payload of one packet. Source: `enum ibv_mtu` (1 = 256 … 5 = 4096).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PathMtu {
    /// 256 bytes (`IBV_MTU_256` = 1).
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl PathMtu {
    /// Payload bytes per packet.
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }
    /// From a byte count (256, 512, 1024, 2048, 4096).
    pub const fn from_bytes(b: u32) -> Option<PathMtu> {
        match b {
            256 => Some(PathMtu::Mtu256),
            512 => Some(PathMtu::Mtu512),
            1024 => Some(PathMtu::Mtu1024),
            2048 => Some(PathMtu::Mtu2048),
            4096 => Some(PathMtu::Mtu4096),
            _ => None,
        }
    }
    /// From the `enum ibv_mtu` value (1..=5).
    pub const fn from_ibv(v: u8) -> Option<PathMtu> {
        match v {
            1 => Some(PathMtu::Mtu256),
            2 => Some(PathMtu::Mtu512),
            3 => Some(PathMtu::Mtu1024),
            4 => Some(PathMtu::Mtu2048),
            5 => Some(PathMtu::Mtu4096),
            _ => None,
        }
    }
}

macro_rules! bitflags_u32 {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $f:ident = $v:expr,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
        pub struct $name(pub u32);
        impl $name {
            $($(#[$fm])* pub const $f: $name = $name($v);)*
            /// No flag.
            pub const fn empty() -> $name { $name(0) }
            /// True when every flag of `o` is set.
            pub const fn contains(self, o: $name) -> bool { self.0 & o.0 == o.0 }
            /// True when any flag of `o` is set.
            pub const fn intersects(self, o: $name) -> bool { self.0 & o.0 != 0 }
        }
        impl core::ops::BitOr for $name {
            type Output = $name;
            fn bitor(self, o: $name) -> $name { $name(self.0 | o.0) }
        }
        impl core::ops::BitOrAssign for $name {
            fn bitor_assign(&mut self, o: $name) { self.0 |= o.0; }
        }
    };
}

bitflags_u32!(
    /// Memory and QP access flags. Source: `enum ibv_access_flags`.
    AccessFlags {
        /// `IBV_ACCESS_LOCAL_WRITE`.
        LOCAL_WRITE = 1,
        /// `IBV_ACCESS_REMOTE_WRITE`.
        REMOTE_WRITE = 2,
        /// `IBV_ACCESS_REMOTE_READ`.
        REMOTE_READ = 4,
        /// `IBV_ACCESS_REMOTE_ATOMIC`.
        REMOTE_ATOMIC = 8,
        /// `IBV_ACCESS_MW_BIND`.
        MW_BIND = 16,
        /// `IBV_ACCESS_ZERO_BASED`: a memory window addressed from 0 (type 2 windows only):
        /// a peer's va is an offset from the bound address. Source: IBTA Vol 1 ch. 10
        /// (zero based virtual address, o10-36.2.2); rxe `rxe_mw.c`, `rxe_resp.c`.
        ZERO_BASED = 32,
    }
);

bitflags_u32!(
    /// Send work request flags. Source: `enum ibv_send_flags`.
    SendFlags {
        /// `IBV_SEND_FENCE`: wait for earlier READ/atomics to complete.
        FENCE = 1,
        /// `IBV_SEND_SIGNALED`: generate a work completion on success.
        SIGNALED = 2,
        /// `IBV_SEND_SOLICITED`: set SE on the last packet.
        SOLICITED = 4,
        /// `IBV_SEND_INLINE`: copy the data at post time.
        INLINE = 8,
    }
);

bitflags_u32!(
    /// Work completion flags. Source: `enum ibv_wc_flags`.
    WcFlags {
        /// `IBV_WC_GRH`: the message came with a network header, as every RoCE receive does
        /// (rxe sets it on every successful receive completion); for UD it also occupies
        /// the first 40 bytes of the buffer.
        GRH = 1,
        /// `IBV_WC_WITH_IMM`: `imm_data` is valid.
        WITH_IMM = 2,
        /// `IBV_WC_WITH_INV`: a SEND_WITH_INVALIDATE invalidated the R_Key in `imm_data`
        /// (libibverbs' `invalidated_rkey`, which shares the union with `imm_data`).
        WITH_INV = 8,
    }
);

/// The IP header fields an address vector chooses for the packets sent with it: IPv4 TOS /
/// IPv6 traffic class, and the TTL / hop limit. Both are masked in the ICRC, so they never
/// change a packet's bytes above IP; the link applies them per datagram.
///
/// Units: `traffic_class` is the whole byte (DSCP << 2 | ECN; 0xB8 is DSCP 46);
/// `hop_limit` is a count of hops, `None` for the route's default (what ib_core gives a
/// unicast RoCE address vector, whatever `hop_limit` the application asked for).
/// Source: rxe `rxe_net.c` `prepare_ipv4_hdr` / `prepare_ipv6_hdr` (TOS = `av->grh.traffic_class`,
/// TTL = `av->grh.hop_limit`); ib_core `ib_resolve_eth_dmac` (a unicast RoCE address vector's
/// hop limit comes from the route); docs/wire-facts.md §2.1.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct IpFields {
    /// IPv4 TOS / IPv6 traffic class byte.
    pub traffic_class: u8,
    /// IPv4 TTL / IPv6 hop limit; `None`: the sending socket's default for the route.
    pub hop_limit: Option<u8>,
}

/// The addressing of a connected QP, fixed at RTR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Path {
    /// This device's address (the source GID's IP).
    pub local: IpAddr,
    /// The peer's address (the destination GID's IP).
    pub remote: IpAddr,
    /// UDP source port for this QP's packets.
    pub src_port: u16,
    /// Traffic class and hop limit of this QP's packets (its address vector's GRH).
    pub ip: IpFields,
}

impl Path {
    pub(crate) fn icrc_ip(&self) -> IcrcIp {
        match (self.local, self.remote) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => IcrcIp::V4 {
                src,
                dst,
                ident: 0,
                src_port: self.src_port,
                dst_port: ROCE_V2_UDP_PORT,
            },
            (src, dst) => IcrcIp::V6 {
                src: to_v6(src),
                dst: to_v6(dst),
                src_port: self.src_port,
                dst_port: ROCE_V2_UDP_PORT,
            },
        }
    }
}

/// The IPv6 form of an address (IPv4 becomes `::ffff:a.b.c.d`), as GIDs and the IPv6 ICRC
/// pseudo-header use it.
pub(crate) fn to_v6(a: IpAddr) -> core::net::Ipv6Addr {
    match a {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

/// The QP attributes the engine runs on (the `ibv_qp_attr` fields, as last set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttrs {
    /// Path MTU.
    pub path_mtu: PathMtu,
    /// Remote QP number.
    pub dest_qp_num: u32,
    /// First PSN the responder expects.
    pub rq_psn: Psn,
    /// First PSN the requester sends.
    pub sq_psn: Psn,
    /// ACK timeout exponent (4.096 µs × 2^timeout; 0 = none).
    pub timeout: u8,
    /// Retries on timeout / sequence NAK (0..=7).
    pub retry_cnt: u8,
    /// Retries on RNR NAK (0..=7; 7 = forever).
    pub rnr_retry: u8,
    /// RNR timer code this responder sends in RNR NAKs.
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomic requests this requester may have.
    pub max_rd_atomic: u8,
    /// Outstanding READ/atomic requests this responder accepts.
    pub max_dest_rd_atomic: u8,
    /// Remote operations this QP allows.
    pub qp_access_flags: AccessFlags,
    /// Q_Key (UD).
    pub qkey: u32,
}

impl Default for QpAttrs {
    fn default() -> QpAttrs {
        QpAttrs {
            path_mtu: PathMtu::Mtu1024,
            dest_qp_num: 0,
            rq_psn: Psn::new(0),
            sq_psn: Psn::new(0),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            qp_access_flags: AccessFlags::empty(),
            qkey: 0,
        }
    }
}

/// Sizes fixed at QP creation. Source: `struct ibv_qp_cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCap {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Most bytes an IBV_SEND_INLINE WR may carry (at most [`MAX_INLINE_DATA`], 512, as rxe).
    pub max_inline_data: u32,
}

impl Default for QpCap {
    fn default() -> QpCap {
        QpCap {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 0,
        }
    }
}

/// Why a post was refused (the verbs layer maps these to errno kinds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostError {
    /// The queue is full (ENOMEM).
    QueueFull,
    /// The QP state does not allow posting (EINVAL).
    WrongState,
    /// The WR itself is invalid (EINVAL), with what is wrong.
    Invalid(&'static str),
    /// The operation is not supported on this QP type (EOPNOTSUPP).
    NotSupported,
}

/// Most PSNs the requester leaves unacknowledged. Source: rxe `RXE_MAX_UNACKED_PSNS` (128).
pub const MAX_UNACKED_PSNS: u32 = 128;
/// Packets sent without AckReq before one asks for an ACK. Source: rxe `RXE_MAX_PKT_PER_ACK`.
pub const MAX_PKT_PER_ACK: u32 = 64;
/// PSNs a single message may use: fewer than half the 24-bit space.
pub const MAX_PSNS_PER_MESSAGE: u32 = 1 << 23;
/// Largest message, in bytes (2 GiB, rxe R6.12 `max_msg_sz`).
pub const MAX_MSG_BYTES: u64 = 1 << 31;

#[derive(Debug, Clone)]
struct SendWqe {
    wr: SendWr,
    length: u64,
    first_psn: Psn,
    npsn: u32,
    assigned: bool,
    /// For READ: bytes of the response received so far.
    read_done: u64,
    /// For READ: PSN of the last READ request sent for this WQE; its first response is a
    /// FIRST or ONLY (a re-issued READ restarts the response sequence, rxe `req_retry`).
    read_req_psn: Psn,
    /// IBV_SEND_INLINE: the message, copied at post time.
    inline_data: Option<Vec<u8>>,
    /// A local operation (REG_MR, LOCAL_INV, BIND_MW) already executed, waiting to complete
    /// in order.
    local_done: bool,
}

#[derive(Debug, Clone)]
struct RecvWqe {
    wr: RecvWr,
}

/// One queue pair's transport engine.
#[derive(Debug)]
pub struct QpEngine {
    qpn: u32,
    qp_type: QpType,
    pd: u32,
    state: QpState,
    attrs: QpAttrs,
    path: Option<Path>,
    cap: QpCap,
    sq_sig_all: bool,
    sq: VecDeque<SendWqe>,
    rq: VecDeque<RecvWqe>,
    req: requester::ReqState,
    comp: completer::CompState,
    resp: responder::RespState,
    timers: TimerTable,
    completions: VecDeque<Completion>,
    counters: Counters,
    /// Source address of the packet being handled (for the UD GRH).
    last_src: IpAddr,
    /// Destination of the packet being handled when it is not this QP's own address (a
    /// multicast group), for the GRH of a UD receive.
    rx_dst: Option<IpAddr>,
    /// SRQ attachment and asynchronous events (srq.rs).
    srq: srq::SrqExt,
    /// Request payloads may stay in the MR ([`Transmit::tail`]).
    gather: bool,
}

impl QpEngine {
    /// A new QP in RESET.
    pub fn new(qpn: u32, qp_type: QpType, pd: u32, cap: QpCap, sq_sig_all: bool) -> QpEngine {
        QpEngine {
            qpn,
            qp_type,
            pd,
            state: QpState::Reset,
            attrs: QpAttrs::default(),
            path: None,
            cap,
            sq_sig_all,
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            req: requester::ReqState::default(),
            comp: completer::CompState::default(),
            resp: responder::RespState::default(),
            timers: TimerTable::default(),
            completions: VecDeque::new(),
            counters: Counters::default(),
            gather: false,
            last_src: IpAddr::V4(core::net::Ipv4Addr::UNSPECIFIED),
            rx_dst: None,
            srq: srq::SrqExt::default(),
        }
    }

    // ---- getters ----

    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }
    /// Transport type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }
    /// Protection domain handle.
    pub fn pd(&self) -> u32 {
        self.pd
    }
    /// Current state.
    pub fn state(&self) -> QpState {
        self.state
    }
    /// Current attributes.
    pub fn attrs(&self) -> &QpAttrs {
        &self.attrs
    }
    /// Attributes, for the verbs layer to update after it validated a `modify_qp`.
    pub fn attrs_mut(&mut self) -> &mut QpAttrs {
        &mut self.attrs
    }
    /// The path set at RTR.
    pub fn path(&self) -> Option<Path> {
        self.path
    }
    /// Sets the path (verbs `modify_qp` with an address vector).
    pub fn set_path(&mut self, p: Path) {
        self.path = Some(p);
    }
    /// Lets RC and UC request packets leave their payload in the MR it comes from when it
    /// lies in one SGE ([`Transmit::tail`]), for a link that sends every datagram before
    /// `send_batch` returns. Off by default.
    pub fn set_gather(&mut self, on: bool) {
        self.gather = on;
    }
    /// Capacities.
    pub fn cap(&self) -> QpCap {
        self.cap
    }
    /// Counters of this QP.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
    /// Work requests posted and not yet completed on the send queue.
    pub fn sq_outstanding(&self) -> usize {
        self.sq.len()
    }
    /// Receive WQEs posted and not yet consumed.
    pub fn rq_outstanding(&self) -> usize {
        self.rq.len() + usize::from(self.resp.has_recv())
    }
    /// Next PSN the responder expects.
    pub fn expected_psn(&self) -> Psn {
        self.resp.epsn
    }
    /// Next PSN the requester will use.
    pub fn next_psn(&self) -> Psn {
        self.req.psn
    }

    // ---- mutators ----

    /// Moves the QP to `new`, with the side effects of entering that state: RESET clears
    /// everything; RTR loads `rq_psn` into the responder; RTS loads `sq_psn` into the
    /// requester and completer; ERR flushes both queues with `IBV_WC_WR_FLUSH_ERR`.
    /// The verbs layer checks that the transition and its attributes are allowed.
    pub fn set_state(&mut self, new: QpState) {
        let old = self.state;
        tracing::debug!(
            target: "softroce::qp",
            qpn = %format_args!("{:#x}", self.qpn),
            "QP state {old:?} -> {new:?} (modify_qp)"
        );
        self.state = new;
        self.on_modify_state(old, new);
        match new {
            QpState::Reset => {
                self.sq.clear();
                self.rq.clear();
                self.req = requester::ReqState::default();
                self.comp = completer::CompState::default();
                self.resp = responder::RespState::default();
                self.timers.clear();
                self.completions.clear();
            }
            QpState::Rtr if old != QpState::Rtr => {
                self.resp = responder::RespState::default();
                self.resp.epsn = self.attrs.rq_psn;
            }
            QpState::Rts if old == QpState::Rtr => {
                self.req = requester::ReqState::default();
                self.req.psn = self.attrs.sq_psn;
                self.req.high_psn = self.attrs.sq_psn;
                self.comp = completer::CompState::new(self.attrs.sq_psn, &self.attrs);
            }
            QpState::Err => self.flush(),
            _ => {}
        }
    }

    /// Queues a send work request. In ERR it is accepted and flushed at once.
    ///
    /// Errors: [`PostError::WrongState`] before RTS (RESET, INIT, RTR);
    /// [`PostError::QueueFull`] when `max_send_wr` WRs are outstanding;
    /// [`PostError::Invalid`] for too many SGEs, a message over 2 GiB, or an atomic whose
    /// SGE is not 8 bytes or whose remote address is not 8-byte aligned;
    /// [`PostError::NotSupported`] for an opcode this QP type cannot carry. A WR with
    /// IBV_SEND_INLINE and data needs [`QpEngine::post_send_mem`], which copies the data.
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        self.post_send_inner(wr, None)
    }

    fn post_send_inner(
        &mut self,
        wr: SendWr,
        inline_data: Option<Vec<u8>>,
    ) -> Result<(), PostError> {
        if self.state < QpState::Rts {
            return Err(PostError::WrongState);
        }
        if self.sq.len() >= self.cap.max_send_wr as usize {
            return Err(PostError::QueueFull);
        }
        if wr.sg_list.len() > self.cap.max_send_sge as usize {
            return Err(PostError::Invalid("too many SGEs"));
        }
        if self.qp_type != QpType::Rc && (wr.opcode.is_rd_atomic()) {
            return Err(PostError::NotSupported);
        }
        if self.qp_type.is_datagram() {
            if !matches!(wr.opcode, WrOpcode::Send | WrOpcode::SendWithImm) {
                return Err(PostError::NotSupported);
            }
            if wr.ud.is_none() {
                return Err(PostError::Invalid(
                    "UD send needs an address handle (wr.ud)",
                ));
            }
        }
        let length: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
        self.check_post_extensions(&wr, length, inline_data.is_some())?;
        if length > MAX_MSG_BYTES {
            return Err(PostError::Invalid("message longer than 2 GiB"));
        }
        // 24-bit PSNs are ordered only within half the space: a message needing 2^23 PSNs or
        // more (2 GiB at path MTU 256) could never be told apart from one already done.
        if psns_for(length, self.pmtu()) >= MAX_PSNS_PER_MESSAGE {
            return Err(PostError::Invalid(
                "message needs 2^23 PSNs or more at this path MTU",
            ));
        }
        if wr.opcode.is_atomic() {
            if length != 8 || wr.sg_list.len() != 1 {
                return Err(PostError::Invalid("atomic needs one 8-byte SGE"));
            }
            if !wr.remote_addr.is_multiple_of(8) {
                return Err(PostError::Invalid("atomic remote_addr not 8-byte aligned"));
            }
        }
        let wqe = SendWqe {
            wr,
            length,
            first_psn: Psn::new(0),
            npsn: 0,
            assigned: false,
            read_done: 0,
            read_req_psn: Psn::new(0),
            inline_data,
            local_done: false,
        };
        if self.state == QpState::Err {
            self.complete_send(&wqe, WcStatus::WrFlushErr);
            return Ok(());
        }
        self.sq.push_back(wqe);
        Ok(())
    }

    /// Queues a receive work request. In ERR it is accepted and flushed at once.
    ///
    /// Errors: [`PostError::WrongState`] in RESET; [`PostError::QueueFull`] when
    /// `max_recv_wr` are queued; [`PostError::Invalid`] for too many SGEs.
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.srq.attached() {
            return Err(PostError::Invalid("the QP takes its receives from an SRQ"));
        }
        if self.state == QpState::Reset {
            return Err(PostError::WrongState);
        }
        if self.rq.len() >= self.cap.max_recv_wr as usize {
            return Err(PostError::QueueFull);
        }
        if wr.sg_list.len() > self.cap.max_recv_sge as usize {
            return Err(PostError::Invalid("too many SGEs"));
        }
        if self.state == QpState::Err {
            self.push_wc(CqSel::Recv, recv_wc(&wr, WcStatus::WrFlushErr, self.qpn));
            return Ok(());
        }
        self.rq.push_back(RecvWqe { wr });
        Ok(())
    }

    /// Handles a received packet already parsed and ICRC-checked by the device, whose BTH
    /// names this QP. `src` is the sender's IP.
    /// Drops (counted) packets of the wrong transport, P_Key, source or state.
    /// Source: rxe `rxe_recv.c` `check_type_state`, `check_addr`, `check_keys`.
    pub fn handle_packet(
        &mut self,
        now: Instant,
        pkt: &RocePacket<'_>,
        src: IpAddr,
        mem: &mut MemoryTable,
    ) {
        let want = match self.qp_type {
            QpType::Rc => Transport::Rc,
            QpType::Uc => Transport::Uc,
            QpType::Ud | QpType::Gsi => Transport::Ud,
        };
        if pkt.info.transport != want {
            self.counters.drop_packet(DropReason::WrongQpType);
            return;
        }
        let pkey = pkt.repr.bth.pkey;
        if pkey & 0x7fff != 0x7fff {
            self.counters.drop_packet(DropReason::BadPkey);
            return;
        }
        let request = pkt.info.is_request();
        let state_ok = if request {
            matches!(
                self.state,
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            )
        } else {
            matches!(self.state, QpState::Rts | QpState::Sqd | QpState::Sqe)
        };
        if !state_ok {
            self.counters.drop_packet(DropReason::WrongQpState);
            return;
        }
        // rxe `check_addr`: a connected QP takes packets only from its peer's address and
        // only to its own (not, say, to a multicast group it cannot be attached to).
        let wrong_addr = |p: &Path| {
            to_v6(p.remote) != to_v6(src) || self.rx_dst.is_some_and(|d| to_v6(d) != to_v6(p.local))
        };
        if !self.qp_type.is_datagram() && self.path.is_none_or(|p| wrong_addr(&p)) {
            self.counters.drop_packet(DropReason::WrongSource);
            return;
        }
        // rxe `check_keys`: QP1 takes only GSI_QKEY, other UD QPs only their own Q_Key. A
        // header check, so the packet is not counted in `rcvd_pkts` (rxe `hdr_check`).
        if self.qp_type.is_datagram() {
            let want = if self.qp_type == QpType::Gsi {
                GSI_QKEY
            } else {
                self.attrs.qkey
            };
            if pkt.repr.deth.is_none_or(|d| d.qkey != want) {
                self.counters.drop_packet(DropReason::BadQkey);
                return;
            }
        }
        // rxe `rxe_rcv` counts `rcvd_pkts` once a packet has passed the header checks and
        // the ICRC; a packet to the multicast QPN is counted there once, before it is
        // handed to each attached QP, so the device counts it and its members do not.
        if pkt.repr.bth.dest_qpn != MULTICAST_QPN {
            self.counters.rcvd_pkts += 1;
        }
        self.last_src = src;
        if request {
            let before = self.completions.len();
            self.responder_handle(now, pkt, mem);
            if pkt.repr.bth.se {
                // IBTA ch. 9: SE on the last packet of a message makes its receive completion
                // a solicited one (earlier completions are never the new ones).
                for c in self.completions.iter_mut().skip(before) {
                    if c.cq == CqSel::Recv && c.wc.status == WcStatus::Success {
                        c.solicited = true;
                    }
                }
            }
        } else {
            self.completer_handle(now, pkt, mem);
        }
        self.pop_done_local_ops();
        self.keep_retransmit_timer(now);
    }

    /// [`QpEngine::handle_packet`] for a datagram sent to `dst`, an address other than this
    /// QP's own: a multicast group, which the GRH of a UD receive then names as its
    /// destination (rxe copies the IP header as received).
    pub fn handle_packet_to(
        &mut self,
        now: Instant,
        pkt: &RocePacket<'_>,
        src: IpAddr,
        dst: IpAddr,
        mem: &mut MemoryTable,
    ) {
        self.rx_dst = Some(dst);
        self.handle_packet(now, pkt, src, mem);
        self.rx_dst = None;
    }

    /// Runs the timers due at `now` (retransmit, RNR wait).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.completer_timeout(now);
        self.keep_retransmit_timer(now);
    }

    /// Invariant: an RC requester with unacknowledged PSNs has its retransmit timer armed,
    /// except during an RNR wait. (Without it, a response lost while nothing new may be sent
    /// — a fence, the READ/atomic limit, the window — would stall the QP forever.)
    fn keep_retransmit_timer(&mut self, now: Instant) {
        if self.qp_type == QpType::Rc
            && matches!(self.state, QpState::Rts | QpState::Sqd)
            && !self.timers.is_armed(Timer::Rnr)
            && !self.timers.is_armed(Timer::Retransmit)
            && self.req.psn.diff(self.comp.psn) > 0
            && let Some(d) = ack_timeout(self.attrs.timeout)
        {
            self.timers.set(Timer::Retransmit, now + d);
        }
    }

    // ---- polls ----

    /// The next datagram to send, if any: responder output (ACKs, NAKs, READ responses,
    /// ATOMIC ACKNOWLEDGEs) first, then new or retransmitted requests. Reads payload from
    /// `mem`.
    #[must_use]
    pub fn poll_transmit(&mut self, now: Instant, mem: &MemoryTable) -> Option<Transmit> {
        let path = self.path?;
        if let Some(t) = self.responder_transmit(&path, mem, self.gather) {
            self.counters.sent_pkts += 1;
            return Some(t);
        }
        let t = self.requester_transmit(now, &path, mem)?;
        self.counters.sent_pkts += 1;
        Some(t)
    }

    /// The next work completion, if any.
    #[must_use]
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }

    /// When [`QpEngine::handle_timeout`] must next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next_timeout()
    }

    // ---- internals shared by the three parts ----

    fn push_wc(&mut self, cq: CqSel, wc: Wc) {
        self.completions.push_back(Completion {
            cq,
            wc,
            solicited: false,
        });
    }

    fn complete_send(&mut self, wqe: &SendWqe, status: WcStatus) {
        let signaled = self.sq_sig_all || wqe.wr.send_flags.contains(SendFlags::SIGNALED);
        if status == WcStatus::Success
            && matches!(
                wqe.wr.opcode,
                WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv
            )
        {
            self.counters.rdma_sends += 1;
        }
        // IBTA: an error completion is generated even for an unsignaled WR.
        if signaled || status != WcStatus::Success {
            // rxe `make_send_cqe`: a successful completion carries the message length (the
            // WR's SGEs) as `byte_len` and IBV_WC_WITH_IMM for the two opcodes with
            // immediate data (`imm_data` itself stays 0); an error completion carries
            // neither. Local operations (REG_MR, LOCAL_INV, BIND_MW) move no data: 0.
            let ok = status == WcStatus::Success;
            let local = matches!(
                wqe.wr.opcode,
                WrOpcode::LocalInv | WrOpcode::BindMw | WrOpcode::RegMr
            );
            let with_imm = matches!(
                wqe.wr.opcode,
                WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm
            );
            let wc = Wc {
                wr_id: wqe.wr.wr_id,
                status,
                opcode: wqe.wr.opcode.wc_opcode(),
                vendor_err: 0,
                byte_len: if ok && !local {
                    u32::try_from(wqe.length).unwrap_or(u32::MAX)
                } else {
                    0
                },
                imm_data: 0,
                qp_num: self.qpn,
                src_qp: 0,
                wc_flags: if ok && with_imm {
                    WcFlags::WITH_IMM
                } else {
                    WcFlags::empty()
                },
            };
            self.push_wc(CqSel::Send, wc);
        }
    }

    /// Enters ERR: completes the failing WQE (if any was given) with `status`, then flushes.
    fn enter_error(&mut self) {
        let old = self.state;
        tracing::debug!(
            target: "softroce::qp",
            qpn = %format_args!("{:#x}", self.qpn),
            "QP state {old:?} -> Err (transport error)"
        );
        self.state = QpState::Err;
        self.on_fatal(old);
        self.flush();
    }

    fn flush(&mut self) {
        self.timers.clear();
        while let Some(w) = self.sq.pop_front() {
            self.complete_send(&w, WcStatus::WrFlushErr);
        }
        self.req.wqe = 0;
        if let Some(r) = self.resp.take_recv() {
            self.push_wc(CqSel::Recv, recv_wc(&r.wr, WcStatus::WrFlushErr, self.qpn));
        }
        // WQEs lent by an SRQ belong to the SRQ: the owner takes them back unflushed.
        while !self.srq.attached()
            && let Some(r) = self.rq.pop_front()
        {
            self.push_wc(CqSel::Recv, recv_wc(&r.wr, WcStatus::WrFlushErr, self.qpn));
        }
    }

    fn pmtu(&self) -> u64 {
        u64::from(self.attrs.path_mtu.bytes())
    }
}

fn recv_wc(wr: &RecvWr, status: WcStatus, qpn: u32) -> Wc {
    Wc {
        wr_id: wr.wr_id,
        status,
        opcode: WcOpcode::Recv,
        vendor_err: 0,
        byte_len: 0,
        imm_data: 0,
        qp_num: qpn,
        src_qp: 0,
        wc_flags: WcFlags::empty(),
    }
}

/// PSNs a message of `length` bytes uses at path MTU `pmtu`: max(1, ⌈length / pmtu⌉).
/// Source: rxe `rxe_req.c` `update_wqe_psn`; docs/wire-facts.md §0.6.
pub fn psns_for(length: u64, pmtu: u64) -> u32 {
    length.div_ceil(pmtu).max(1) as u32
}

#[cfg(test)]
mod tests;
