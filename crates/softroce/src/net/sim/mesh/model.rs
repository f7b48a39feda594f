//! The mesh workload's model: what a connection is (its QPs, memory and reference state),
//! the operations and mishaps drawn for it, and the workload's sizes. The driver (mod.rs),
//! the actions (ops.rs) and the checks (checks.rs) share it; it imports none of them.

use super::super::SimRng;
use crate::transport::Instant;
use crate::verbs::{Ah, Cq, Device, Mr, Mw, Pd, Qp, Srq, WcStatus};
use std::collections::VecDeque;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Transport {
    Rc,
    Uc,
    Ud,
}

/// A connection's error path (mod.rs lists what each gives). `DeviceClose` closes `dev`,
/// this connection's requester or responder device, which affects every connection with a QP
/// on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mishap {
    None,
    BadRkey { at: usize },
    RequesterErr { at: usize },
    ResponderErr { at: usize },
    DestroyResponder { at: usize },
    DeregRemote { at: usize },
    RnrStarve { budget: usize },
    MwInvalidate { at: usize },
    DestroyRequester { at: usize },
    DeviceClose { at: usize, dev: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    Cas,
    Faa,
    SendInv,
}

impl Kind {
    pub(super) fn takes_recv(self) -> bool {
        matches!(
            self,
            Kind::Send | Kind::SendImm | Kind::WriteImm | Kind::SendInv
        )
    }
    pub(super) fn uses_rkey(self) -> bool {
        matches!(
            self,
            Kind::Write | Kind::WriteImm | Kind::Read | Kind::Cas | Kind::Faa
        )
    }
}

#[derive(Debug, Clone)]
pub(super) struct Op {
    pub(super) index: usize,
    pub(super) kind: Kind,
    pub(super) len: usize,
    pub(super) remote_off: usize,
    /// SEND/WRITE: the bytes sent. READ: the bytes expected back.
    pub(super) data: Vec<u8>,
    /// Atomics: the original value expected back.
    pub(super) orig: u64,
    pub(super) imm: u32,
    /// The bad-R_Key operation of a `BadRkey` mishap.
    pub(super) bad: bool,
    /// Index among the operations that take a receive.
    pub(super) recv_index: Option<usize>,
}

pub(super) const ATOMIC_OFF: usize = 0;
pub(super) const DATA_OFF: usize = 64;
pub(super) const GRH: usize = 40;
pub(super) const SRQ_SLOTS: usize = 32;
pub(super) const UD_MAX: usize = 4096;
pub(super) const UC_MAX: usize = 16 << 10;
/// RC `timeout` (4.096 µs × 2^8 ≈ 1 ms of virtual time) and `retry_cnt`.
pub(super) const RC_TIMEOUT: u8 = 8;
pub(super) const RC_RETRY_CNT: u8 = 7;

pub(super) struct Node {
    /// Held for the run; a `DeviceClose` fails it.
    pub(super) dev: Device,
    pub(super) pd: Pd,
    pub(super) send_cq: Cq,
    pub(super) recv_cq: Cq,
    pub(super) srq: Option<(Srq, Mr)>,
    /// Largest receive a buffer of the SRQ must hold.
    pub(super) srq_slot: usize,
}

/// A connection's QPs (requester, responder), local MR, remote MR and receive ring.
pub(super) type ConnObjects = (Qp, Qp, Mr, Option<Mr>, Option<Mr>);

pub(super) struct Conn {
    pub(super) id: usize,
    pub(super) transport: Transport,
    pub(super) req: usize,
    pub(super) resp: usize,
    pub(super) on_srq: bool,
    pub(super) mishap: Mishap,
    pub(super) qa: Option<Qp>,
    pub(super) qb: Option<Qp>,
    pub(super) local: Mr,
    pub(super) remote: Option<Mr>,
    /// Address and R_Key of `remote` (kept after it is deregistered; the window's R_Key
    /// when there is one).
    pub(super) raddr: u64,
    pub(super) rkey: u32,
    /// `MwInvalidate`: a type 2 window over all of `remote`, bound by the responder QP, and
    /// whether its bind completed.
    pub(super) mw: Option<Mw>,
    pub(super) mw_bound: bool,
    /// The responder's own receive buffers (None on an SRQ).
    pub(super) ring: Option<Mr>,
    pub(super) slot: usize,
    pub(super) max: usize,
    pub(super) depth: usize,
    pub(super) ah: Option<Ah>,
    pub(super) qkey: u32,
    /// RC: the responder's memory as it must be. UC: the fill pattern.
    pub(super) model: Vec<u8>,
    pub(super) outstanding: VecDeque<Op>,
    pub(super) posted: usize,
    pub(super) done: usize,
    pub(super) recv_ops: usize,
    pub(super) recvs_posted: usize,
    /// RC: receives due, in order. UC/UD: every message sent that takes a receive, with the
    /// number of times it completed.
    pub(super) expect_recv: VecDeque<Op>,
    pub(super) sent: Vec<(Op, u32)>,
    /// (op, offset, length) of everything written to remote memory.
    pub(super) touched: Vec<(usize, usize, usize)>,
    pub(super) pending_recvs: VecDeque<(Instant, usize)>,
    /// First failed WR and its status.
    pub(super) failed: Option<(usize, WcStatus)>,
    /// When a timed mishap fires, and whether it has.
    pub(super) mishap_time: Option<Instant>,
    pub(super) mishap_fired: Option<Instant>,
    /// The responder may have gone to ERR (its receives may flush, its R_Key checks fail).
    pub(super) responder_dead: bool,
    pub(super) flushed_recvs: usize,
    pub(super) recvs_ok: usize,
    /// The operation whose receive completed in error.
    pub(super) recv_failed: Option<usize>,
    /// Successful send completions (in order: the operations before this index).
    pub(super) ok_count: usize,
    /// The requester's / the responder's device was closed (a `DeviceClose`, this
    /// connection's or another's).
    pub(super) req_closed: bool,
    pub(super) resp_closed: bool,
    /// When that device closed.
    pub(super) closed_at: Option<Instant>,
}

impl Mishap {
    pub(super) fn name(self) -> &'static str {
        match self {
            Mishap::None => "none",
            Mishap::BadRkey { .. } => "bad_rkey",
            Mishap::RequesterErr { .. } => "requester_err",
            Mishap::ResponderErr { .. } => "responder_err",
            Mishap::DestroyResponder { .. } => "destroy_responder",
            Mishap::DeregRemote { .. } => "dereg_remote",
            Mishap::RnrStarve { .. } => "rnr_starve",
            Mishap::MwInvalidate { .. } => "mw_invalidate",
            Mishap::DestroyRequester { .. } => "destroy_requester",
            Mishap::DeviceClose { .. } => "device_close",
        }
    }
}

impl Conn {
    /// No more operations are posted: one failed, or the requester was moved to ERR or
    /// destroyed.
    pub(super) fn stopped(&self) -> bool {
        self.failed.is_some()
            || (matches!(
                self.mishap,
                Mishap::RequesterErr { .. } | Mishap::DestroyRequester { .. }
            ) && self.mishap_fired.is_some())
    }
    pub(super) fn finished(&self, ops: usize) -> bool {
        // A destroyed QP completes nothing more (rxe: no flush on destroy); what it completed
        // before is checked when the CQ is drained at the end.
        (self.qa.is_none() && self.stopped())
            || (self.outstanding.is_empty() && (self.posted == ops || self.stopped()))
    }
    pub(super) fn name(&self) -> String {
        format!(
            "conn {} {:?} dev{}->dev{}{}",
            self.id,
            self.transport,
            self.req,
            self.resp,
            if self.on_srq { " srq" } else { "" }
        )
    }
}

pub(super) fn draw_len(r: &mut SimRng, max: usize) -> usize {
    let len = match r.below(100) {
        0..=9 => 0,
        10..=49 => 1 + r.below(64) as usize,
        50..=84 => 65 + r.below(4096) as usize,
        _ => r.below(max as u64 + 1) as usize,
    };
    len.min(max)
}
