//! Transport: one sans-IO engine per queue pair, split like kernel rxe into a requester
//! (WQE → packets), a responder (request packets → execution → ACK/NAK/READ responses) and a
//! completer (responses → work completions).
//!
//! Contract (after quinn-proto's `Connection`): the owner feeds input with
//! [`QpEngine::handle_packet`] and [`QpEngine::handle_timeout`], posts work with
//! [`QpEngine::post_send`] / [`QpEngine::post_recv`], and drains output with
//! [`QpEngine::poll_transmit`] (datagrams to send), [`QpEngine::poll_completion`] (work
//! completions) and [`QpEngine::poll_timeout`] (when to call `handle_timeout`). The engine
//! owns its QP state: [`QpEngine::modify`] checks each `modify_qp` against the transition
//! table (modify.rs) before it changes anything; the vocabulary is in types.rs. `now` must
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
mod modify;
mod mw;
mod requester;
mod responder;
mod srq;
mod timer;
mod transmit;
mod types;
mod wc;
mod wr;

pub use counters::{Counters, DropReason};
pub use error::{Disposition, QpAction, RespError};
pub use local_ops::MAX_INLINE_DATA;
pub use memory::{
    AtomicOp, ForeignMem, MAX_MR, MAX_MW, MemError, MrBytes, MrEntry, MrKind, MrState,
    MrTable as MemoryTable, MwEntry, MwState, MwType, is_mw_key,
};
pub use modify::{
    ModifyError, ModifyErrorKind, Params, QpAttrMask, QpModify, TRANSITIONS, Transition,
    check_modify,
};
pub use mw::{BindMw, RegMr, inc_rkey};
pub use srq::{QpEvent, SrqQueue};
pub use timer::{Instant, Timer, TimerTable, ack_timeout};
use transmit::gathered;
pub use transmit::*;
pub use types::{
    AccessFlags, GSI_QKEY, IpFields, MULTICAST_QPN, Path, PathMtu, PostError, QpAttrs, QpCap,
    QpState, QpType, SendFlags, WcFlags,
};
pub use wc::*;
pub use wr::*;

use crate::wire::{
    Gid, ICRC_LEN, IcrcHasher, PacketRepr, Psn, RocePacket, Transport, icrc_of_body_parts,
};
use core::net::IpAddr;
use core::ptr::NonNull;
use std::collections::VecDeque;

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
    /// Attributes, for unit tests that change one behind the transition table's back
    /// (everything else goes through [`QpEngine::modify`]).
    #[cfg(test)]
    fn attrs_mut(&mut self) -> &mut QpAttrs {
        &mut self.attrs
    }
    /// The path set at RTR.
    pub fn path(&self) -> Option<Path> {
        self.path
    }
    /// Sets the path of a datagram QP (UD, GSI), fixed at creation: the local address and
    /// UDP source port it sends from. A connected QP's path comes with AV in
    /// [`QpEngine::modify`].
    pub fn set_path(&mut self, p: Path) {
        self.path = Some(p);
    }
    /// Sets the path MTU of a datagram QP (UD, GSI), fixed at creation from the port's
    /// active MTU as rxe does (`modify_qp` takes no PATH_MTU for them). A connected QP's
    /// comes with PATH_MTU in [`QpEngine::modify`].
    pub fn set_datagram_path_mtu(&mut self, mtu: PathMtu) {
        debug_assert!(
            self.qp_type.is_datagram(),
            "a connected QP's MTU is modify_qp's"
        );
        self.attrs.path_mtu = mtu;
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
    /// Unchecked: [`QpEngine::modify`] checks the transition and its attributes first.
    fn set_state(&mut self, new: QpState) {
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
            Gid::from_ip(p.remote) != Gid::from_ip(src)
                || self
                    .rx_dst
                    .is_some_and(|d| Gid::from_ip(d) != Gid::from_ip(p.local))
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
