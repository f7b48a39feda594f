//! Transport: work requests as the application posts them (`ibv_sge`, `ibv_send_wr`,
//! `ibv_recv_wr`), with libibverbs' names. The engine keeps its own queued copy of each (a
//! WQE) in [`super::QpEngine`].

use super::*;

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
    pub(super) fn is_rd_atomic(self) -> bool {
        matches!(
            self,
            WrOpcode::RdmaRead | WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
        )
    }
    pub(super) fn is_atomic(self) -> bool {
        matches!(
            self,
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
        )
    }
    pub(super) fn wc_opcode(self) -> WcOpcode {
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
    /// Traffic class and hop limit from the address handle.
    pub ip: IpFields,
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
