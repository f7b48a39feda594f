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
        /// `IBV_WC_GRH`: a GRH occupies the first 40 bytes of the buffer (UD).
        GRH = 1,
        /// `IBV_WC_WITH_IMM`: `imm_data` is valid.
        WITH_IMM = 2,
        /// `IBV_WC_WITH_INV`: a SEND_WITH_INVALIDATE invalidated the R_Key in `imm_data`
        /// (libibverbs' `invalidated_rkey`, which shares the union with `imm_data`).
        WITH_INV = 8,
    }
);

/// A scatter/gather element. Source: `struct ibv_sge`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Start address inside the MR named by `lkey`.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the MR.
    pub lkey: u32,
}

/// Send work request opcode, in `enum ibv_wr_opcode` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrOpcode {
    /// `IBV_WR_RDMA_WRITE`.
    RdmaWrite,
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`.
    RdmaWriteWithImm,
    /// `IBV_WR_SEND`.
    Send,
    /// `IBV_WR_SEND_WITH_IMM`.
    SendWithImm,
    /// `IBV_WR_RDMA_READ`.
    RdmaRead,
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
    AtomicCmpAndSwp,
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    AtomicFetchAndAdd,
    /// `IBV_WR_LOCAL_INV`: invalidate the MR or type 2 MW named by `invalidate_rkey`; it
    /// waits until every earlier WR on the send queue has completed.
    LocalInv,
    /// `IBV_WR_BIND_MW`: bind the window described by `bind_mw`.
    BindMw,
    /// `IBV_WR_SEND_WITH_INV`: a SEND whose last packet carries `invalidate_rkey` in an IETH.
    SendWithInv,
    /// `IB_WR_REG_MR` (kernel verbs): register the fast-register MR described by `reg_mr`.
    RegMr,
}

impl WrOpcode {
    fn is_rd_atomic(self) -> bool {
        matches!(
            self,
            WrOpcode::RdmaRead | WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
        )
    }
    fn is_atomic(self) -> bool {
        matches!(
            self,
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
        )
    }
    fn wc_opcode(self) -> WcOpcode {
        match self {
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
            WrOpcode::Send | WrOpcode::SendWithImm => WcOpcode::Send,
            WrOpcode::RdmaRead => WcOpcode::RdmaRead,
            WrOpcode::AtomicCmpAndSwp => WcOpcode::CompSwap,
            WrOpcode::AtomicFetchAndAdd => WcOpcode::FetchAdd,
            WrOpcode::LocalInv => WcOpcode::LocalInv,
            WrOpcode::BindMw => WcOpcode::BindMw,
            WrOpcode::SendWithInv => WcOpcode::Send,
            WrOpcode::RegMr => WcOpcode::RegMr,
        }
    }
}

/// A send work request. Source: `struct ibv_send_wr` (the `wr.rdma` and `wr.atomic` unions
/// are flattened into `remote_addr`, `rkey`, `compare_add`, `swap`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// Caller's identifier, returned in the work completion.
    pub wr_id: u64,
    /// Local buffers to send from (or, for READ/atomics, to receive into).
    pub sg_list: Vec<Sge>,
    /// Operation.
    pub opcode: WrOpcode,
    /// Flags.
    pub send_flags: SendFlags,
    /// Immediate data (network order, passed through unchanged) for `…WithImm`.
    pub imm_data: u32,
    /// Remote virtual address (RDMA and atomics).
    pub remote_addr: u64,
    /// Remote key (RDMA and atomics).
    pub rkey: u32,
    /// Compare value (CMP_AND_SWP) or addend (FETCH_AND_ADD).
    pub compare_add: u64,
    /// Swap value (CMP_AND_SWP).
    pub swap: u64,
    /// UD only: where the datagram goes (`wr.ud` of `ibv_send_wr`).
    pub ud: Option<UdDest>,
    /// The R_Key to invalidate: SEND_WITH_INV (carried in the IETH) and LOCAL_INV.
    pub invalidate_rkey: u32,
    /// BIND_MW: the window, MR, range and rights (`wr.bind_mw`).
    pub bind_mw: Option<BindMw>,
    /// REG_MR: the fast-register MR and its new key, address, length and rights.
    pub reg_mr: Option<RegMr>,
}

/// The destination of a UD send: what `wr.ud` carries (the address handle's address, the
/// remote QPN and Q_Key). A `remote_qkey` with bit 31 set means "use the QP's own Q_Key".
/// Source: `struct ibv_send_wr` `wr.ud`; IBTA Vol 1 ch. 10 (Q_Key, "high-order bit set").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    /// The destination's IP (its GID's address).
    pub remote_ip: IpAddr,
    /// Destination QPN.
    pub remote_qpn: u32,
    /// Q_Key to send with.
    pub remote_qkey: u32,
}

impl SendWr {
    /// A signaled work request with no remote fields set.
    pub fn new(wr_id: u64, opcode: WrOpcode, sg_list: Vec<Sge>) -> SendWr {
        SendWr {
            wr_id,
            sg_list,
            opcode,
            send_flags: SendFlags::SIGNALED,
            imm_data: 0,
            remote_addr: 0,
            rkey: 0,
            compare_add: 0,
            swap: 0,
            ud: None,
            invalidate_rkey: 0,
            bind_mw: None,
            reg_mr: None,
        }
    }
}

/// A receive work request. Source: `struct ibv_recv_wr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// Caller's identifier.
    pub wr_id: u64,
    /// Buffers that receive the data.
    pub sg_list: Vec<Sge>,
}

/// Work completion status, in `enum ibv_wc_status` order; `Display` is
/// `ibv_wc_status_str`'s text. Source: rdma-core `libibverbs/verbs.h`, `enum.c`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`.
    Success,
    /// `IBV_WC_LOC_LEN_ERR`.
    LocLenErr,
    /// `IBV_WC_LOC_QP_OP_ERR`.
    LocQpOpErr,
    /// `IBV_WC_LOC_EEC_OP_ERR`.
    LocEecOpErr,
    /// `IBV_WC_LOC_PROT_ERR`.
    LocProtErr,
    /// `IBV_WC_WR_FLUSH_ERR`.
    WrFlushErr,
    /// `IBV_WC_MW_BIND_ERR`.
    MwBindErr,
    /// `IBV_WC_BAD_RESP_ERR`.
    BadRespErr,
    /// `IBV_WC_LOC_ACCESS_ERR`.
    LocAccessErr,
    /// `IBV_WC_REM_INV_REQ_ERR`.
    RemInvReqErr,
    /// `IBV_WC_REM_ACCESS_ERR`.
    RemAccessErr,
    /// `IBV_WC_REM_OP_ERR`.
    RemOpErr,
    /// `IBV_WC_RETRY_EXC_ERR`.
    RetryExcErr,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`.
    RnrRetryExcErr,
    /// `IBV_WC_LOC_RDD_VIOL_ERR`.
    LocRddViolErr,
    /// `IBV_WC_REM_INV_RD_REQ_ERR`.
    RemInvRdReqErr,
    /// `IBV_WC_REM_ABORT_ERR`.
    RemAbortErr,
    /// `IBV_WC_INV_EECN_ERR`.
    InvEecnErr,
    /// `IBV_WC_INV_EEC_STATE_ERR`.
    InvEecStateErr,
    /// `IBV_WC_FATAL_ERR`.
    FatalErr,
    /// `IBV_WC_RESP_TIMEOUT_ERR`.
    RespTimeoutErr,
    /// `IBV_WC_GENERAL_ERR`.
    GeneralErr,
}

impl WcStatus {
    /// The `IBV_WC_*` constant name.
    pub const fn ibv_name(self) -> &'static str {
        match self {
            WcStatus::Success => "IBV_WC_SUCCESS",
            WcStatus::LocLenErr => "IBV_WC_LOC_LEN_ERR",
            WcStatus::LocQpOpErr => "IBV_WC_LOC_QP_OP_ERR",
            WcStatus::LocEecOpErr => "IBV_WC_LOC_EEC_OP_ERR",
            WcStatus::LocProtErr => "IBV_WC_LOC_PROT_ERR",
            WcStatus::WrFlushErr => "IBV_WC_WR_FLUSH_ERR",
            WcStatus::MwBindErr => "IBV_WC_MW_BIND_ERR",
            WcStatus::BadRespErr => "IBV_WC_BAD_RESP_ERR",
            WcStatus::LocAccessErr => "IBV_WC_LOC_ACCESS_ERR",
            WcStatus::RemInvReqErr => "IBV_WC_REM_INV_REQ_ERR",
            WcStatus::RemAccessErr => "IBV_WC_REM_ACCESS_ERR",
            WcStatus::RemOpErr => "IBV_WC_REM_OP_ERR",
            WcStatus::RetryExcErr => "IBV_WC_RETRY_EXC_ERR",
            WcStatus::RnrRetryExcErr => "IBV_WC_RNR_RETRY_EXC_ERR",
            WcStatus::LocRddViolErr => "IBV_WC_LOC_RDD_VIOL_ERR",
            WcStatus::RemInvRdReqErr => "IBV_WC_REM_INV_RD_REQ_ERR",
            WcStatus::RemAbortErr => "IBV_WC_REM_ABORT_ERR",
            WcStatus::InvEecnErr => "IBV_WC_INV_EECN_ERR",
            WcStatus::InvEecStateErr => "IBV_WC_INV_EEC_STATE_ERR",
            WcStatus::FatalErr => "IBV_WC_FATAL_ERR",
            WcStatus::RespTimeoutErr => "IBV_WC_RESP_TIMEOUT_ERR",
            WcStatus::GeneralErr => "IBV_WC_GENERAL_ERR",
        }
    }
}

impl core::fmt::Display for WcStatus {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "operation aborted",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
        })
    }
}

/// Work completion opcode. Source: `enum ibv_wc_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    /// `IBV_WC_SEND`.
    Send,
    /// `IBV_WC_RDMA_WRITE`.
    RdmaWrite,
    /// `IBV_WC_RDMA_READ`.
    RdmaRead,
    /// `IBV_WC_COMP_SWAP`.
    CompSwap,
    /// `IBV_WC_FETCH_ADD`.
    FetchAdd,
    /// `IBV_WC_BIND_MW`.
    BindMw,
    /// `IBV_WC_LOCAL_INV`.
    LocalInv,
    /// `IB_WC_REG_MR` (kernel verbs).
    RegMr,
    /// `IBV_WC_RECV`.
    Recv,
    /// `IBV_WC_RECV_RDMA_WITH_IMM`.
    RecvRdmaWithImm,
}

impl WcOpcode {
    /// The `IBV_WC_*` constant name (`IB_WC_REG_MR` for [`WcOpcode::RegMr`], which only
    /// kernel verbs have).
    pub const fn ibv_name(self) -> &'static str {
        match self {
            WcOpcode::Send => "IBV_WC_SEND",
            WcOpcode::RdmaWrite => "IBV_WC_RDMA_WRITE",
            WcOpcode::RdmaRead => "IBV_WC_RDMA_READ",
            WcOpcode::CompSwap => "IBV_WC_COMP_SWAP",
            WcOpcode::FetchAdd => "IBV_WC_FETCH_ADD",
            WcOpcode::BindMw => "IBV_WC_BIND_MW",
            WcOpcode::LocalInv => "IBV_WC_LOCAL_INV",
            WcOpcode::RegMr => "IB_WC_REG_MR",
            WcOpcode::Recv => "IBV_WC_RECV",
            WcOpcode::RecvRdmaWithImm => "IBV_WC_RECV_RDMA_WITH_IMM",
        }
    }
}

/// A work completion. Source: `struct ibv_wc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    /// The work request's `wr_id`.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// What completed (valid on success; filled on errors too).
    pub opcode: WcOpcode,
    /// Vendor error (0).
    pub vendor_err: u32,
    /// Bytes received (receive completions and READ).
    pub byte_len: u32,
    /// Immediate data when `wc_flags` has WITH_IMM (network order, as sent).
    pub imm_data: u32,
    /// Local QP number.
    pub qp_num: u32,
    /// Remote QP number (receive completions).
    pub src_qp: u32,
    /// Flags.
    pub wc_flags: WcFlags,
}

/// Which CQ of the QP a completion goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqSel {
    /// The send CQ.
    Send,
    /// The receive CQ.
    Recv,
}

/// A work completion and its destination CQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// Destination.
    pub cq: CqSel,
    /// The completion.
    pub wc: Wc,
    /// The receive completion of a message whose last packet had BTH.SE set (a SEND or
    /// WRITE with immediate posted with `IBV_SEND_SOLICITED`): it triggers a solicited-only
    /// CQ notification. Source: IBTA Vol 1 ch. 9 (solicited event); rxe `rxe_cq_post`'s
    /// `solicited` argument.
    pub solicited: bool,
}

/// A datagram to send: UDP payload (BTH … ICRC) from `src_port` to `dst`:4791.
///
/// Normally `payload` holds the whole datagram. A requester whose link gathers
/// ([`QpEngine::set_gather`], from `Link::gathers`) may instead leave a packet's payload in
/// the registered memory it comes from: then `payload` holds the headers only and `tail`
/// the rest (payload bytes in the MR, pad, ICRC), to be sent with `sendmsg` iovecs, with no
/// copy (issue 7). Such a datagram is only valid while the device lock under which it was
/// built is held, that is within the `Link::send_batch` call that receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// What the datagram is, as the part of the engine that built it knows.
    pub kind: TxKind,
    /// Destination IP.
    pub dst: IpAddr,
    /// UDP source port (the QP's).
    pub src_port: u16,
    /// UDP payload, or its headers when `tail` is set.
    pub payload: Vec<u8>,
    /// The rest of the datagram, left in registered memory.
    pub tail: Option<PayloadRef>,
}

/// What a [`Transmit`] carries, set where the packet is built: a request of the requester,
/// or one of the responder's answers. A link uses it to choose *when* to send (an ACK may
/// wait for the end of a receive batch; a response must not overtake ACKs held before it),
/// never to look inside the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxKind {
    /// An ACKNOWLEDGE: a positive ACK, a NAK or an RNR NAK (BTH and AETH only).
    Acknowledge,
    /// An ATOMIC ACKNOWLEDGE (AETH and AtomicAckETH).
    AtomicAcknowledge,
    /// One packet of an RDMA READ response.
    ReadResponse,
    /// A request packet (RC, UC or UD), new or retransmitted.
    Request,
}

impl TxKind {
    /// True for the responder's stream (ACKs, NAKs, READ responses, ATOMIC ACKNOWLEDGEs),
    /// whose packets the peer's completer takes in PSN order.
    pub const fn is_response(self) -> bool {
        !matches!(self, TxKind::Request)
    }
}

/// The part of a gathered [`Transmit`] after its headers: `len` payload bytes at `ptr` in a
/// registered MR, `pad` zero bytes, then the ICRC (computed over all of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadRef {
    ptr: NonNull<u8>,
    len: usize,
    pad: u8,
    icrc: [u8; 4],
}

// SAFETY: a `PayloadRef`'s bytes are only read (`TxPart::copy_into`, or by the kernel from
// an iovec) by the link that receives it in `send_batch`, in the thread that built it, under
// the device lock that keeps the MR registered; moving the value between threads moves no
// access with it.
unsafe impl Send for PayloadRef {}
// SAFETY: as for `Send`: shared references give no access to the memory.
unsafe impl Sync for PayloadRef {}

/// Zero bytes for the pad of a gathered datagram (at most 3).
static PAD_ZEROS: [u8; 3] = [0; 3];

/// A datagram whose headers are built into a cached buffer and whose payload `data` stays
/// where it is, in a registered MR ([`Transmit::tail`]), with the ICRC computed over headers,
/// payload and pad (the payload read in place when the engine owns it, in short copies when
/// the application does), for the flow `path`. Valid only under the device lock, as
/// [`Transmit::parts`] says.
fn gathered(kind: TxKind, repr: &PacketRepr, data: MrBytes<'_>, path: &Path) -> Transmit {
    let h = repr.header_len();
    let mut buf = bufpool::take(h);
    repr.emit_headers(&mut buf);
    let pad = repr.buffer_len() - h - data.len() - ICRC_LEN;
    let pad_bytes = &PAD_ZEROS[..pad];
    let ip = path.icrc_ip();
    let icrc = if data.chunks() == 1 {
        // The payload as one slice (owned memory, or one short copy of application memory):
        // the headers and a small payload then hash in one pass.
        let mut icrc = [0u8; 4];
        data.for_each_chunk(|d| icrc = icrc_of_body_parts(&ip, &[&buf, d, pad_bytes]));
        icrc
    } else {
        let mut hasher = IcrcHasher::new(&ip, &buf, h + data.len() + pad);
        data.for_each_chunk(|c| hasher.update(c));
        hasher.update(pad_bytes);
        hasher.finish()
    };
    let (ptr, len) = data.raw();
    Transmit {
        kind,
        dst: path.remote,
        src_port: path.src_port,
        payload: buf,
        tail: Some(PayloadRef {
            ptr,
            len,
            pad: pad as u8,
            icrc,
        }),
    }
}

/// One piece of a datagram for the socket: bytes the engine holds, or `len` bytes at an
/// address in registered memory, which may be the application's and so is never lent as a
/// slice ([`TxPart::copy_into`] copies it, a link hands [`TxPart::raw`] to the kernel as an
/// iovec). Only [`Transmit::parts`] makes the second kind, under its safety contract.
#[derive(Debug, Clone, Copy)]
pub struct TxPart<'a>(Part<'a>);

#[derive(Debug, Clone, Copy)]
enum Part<'a> {
    Bytes(&'a [u8]),
    /// Valid for reads while the device lock is held ([`Transmit::parts`]).
    Mr {
        ptr: NonNull<u8>,
        len: usize,
        _transmit: core::marker::PhantomData<&'a Transmit>,
    },
}

impl<'a> From<&'a [u8]> for TxPart<'a> {
    fn from(b: &'a [u8]) -> TxPart<'a> {
        TxPart(Part::Bytes(b))
    }
}

impl TxPart<'_> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self.0 {
            Part::Bytes(b) => b.len(),
            Part::Mr { len, .. } => len,
        }
    }

    /// True for no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Address and length, for an iovec (the kernel only reads them).
    pub fn raw(&self) -> (*const u8, usize) {
        match self.0 {
            Part::Bytes(b) => (b.as_ptr(), b.len()),
            Part::Mr { ptr, len, .. } => (ptr.as_ptr().cast_const(), len),
        }
    }

    /// Appends the bytes to `out`.
    pub fn copy_into(&self, out: &mut Vec<u8>) {
        match self.0 {
            Part::Bytes(b) => out.extend_from_slice(b),
            Part::Mr { ptr, len, .. } => {
                out.reserve(len);
                let at = out.len();
                // SAFETY: `ptr` is valid for `len` bytes of reads while the device lock that
                // `Transmit::parts`' caller holds keeps the MR registered (the engine checked
                // the range against the MR when it built the datagram; only `parts` makes a
                // `Part::Mr`); `out` has room for `len` more bytes after `at` and is ours, so
                // the two do not overlap; once copied the bytes are initialized, so the new
                // length covers them.
                unsafe {
                    core::ptr::copy_nonoverlapping(ptr.as_ptr(), out.as_mut_ptr().add(at), len);
                    out.set_len(at + len);
                }
            }
        }
    }
}

impl Transmit {
    /// A datagram of `kind` held whole in `payload`.
    pub fn new(kind: TxKind, dst: IpAddr, src_port: u16, payload: Vec<u8>) -> Transmit {
        Transmit {
            kind,
            dst,
            src_port,
            payload,
            tail: None,
        }
    }

    /// The datagram's length in bytes (headers, payload, pad and ICRC).
    pub fn len(&self) -> usize {
        self.payload.len()
            + self
                .tail
                .map_or(0, |t| t.len + usize::from(t.pad) + t.icrc.len())
    }

    /// True for an empty datagram (never built by the engine).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ICRC of a gathered datagram (the last of its [`Transmit::parts`]); `None` for one
    /// held whole, whose ICRC is the last 4 bytes of `payload`.
    pub fn tail_icrc(&self) -> Option<[u8; 4]> {
        self.tail.map(|t| t.icrc)
    }

    /// The datagram as four consecutive parts: `[payload, MR bytes, pad, ICRC]` for a
    /// gathered one, `[payload, [], [], []]` otherwise (no allocation, no copy). The MR
    /// bytes are an address and a length ([`TxPart::raw`]), never a slice: the application
    /// may be using them.
    ///
    /// # Safety
    /// For a gathered datagram, the MR part may be read (copied, or sent by the
    /// kernel) only while the device lock under which the engine built it is still held
    /// (inside the `Link::send_batch` or `Link::send` call that received it): the MR may be
    /// deregistered after that.
    pub unsafe fn parts(&self) -> [TxPart<'_>; 4] {
        match &self.tail {
            None => [
                TxPart::from(&self.payload[..]),
                TxPart::from(&[][..]),
                TxPart::from(&[][..]),
                TxPart::from(&[][..]),
            ],
            Some(t) => [
                TxPart::from(&self.payload[..]),
                TxPart(Part::Mr {
                    ptr: t.ptr,
                    len: t.len,
                    _transmit: core::marker::PhantomData,
                }),
                TxPart::from(&PAD_ZEROS[..usize::from(t.pad)]),
                TxPart::from(&t.icrc[..]),
            ],
        }
    }

    /// The whole datagram in one buffer (a copy for a gathered one).
    ///
    /// # Safety
    /// As [`Transmit::parts`].
    pub unsafe fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        // SAFETY: forwarded to the caller.
        for p in unsafe { self.parts() } {
            p.copy_into(&mut v);
        }
        v
    }
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
            self.complete_send(&wqe, WcStatus::WrFlushErr, 0);
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
        self.counters.rcvd_pkts += 1;
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

    fn complete_send(&mut self, wqe: &SendWqe, status: WcStatus, byte_len: u32) {
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
            let wc = Wc {
                wr_id: wqe.wr.wr_id,
                status,
                opcode: wqe.wr.opcode.wc_opcode(),
                vendor_err: 0,
                byte_len,
                imm_data: 0,
                qp_num: self.qpn,
                src_qp: 0,
                wc_flags: WcFlags::empty(),
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
            self.complete_send(&w, WcStatus::WrFlushErr, 0);
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
