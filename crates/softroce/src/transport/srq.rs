//! Shared receive queues and the QP's asynchronous events, on the engine side.
//!
//! A shared receive queue (SRQ) is a plain queue of receive WRs ([`SrqQueue`]) that the
//! owner (the verbs device) keeps outside every QP. It is an input of the engine's packet
//! handling, as the memory table is: [`QpEngine::handle_packet_srq`] takes the SRQ, and the
//! responder takes its receive WQEs from it directly, as rxe's does (`rxe_resp.c`
//! `get_srq_wqe`), with no lock in the transport. A QP attached to an SRQ has no receive
//! queue of its own: it refuses `post_recv` and never flushes the SRQ's WQEs when it enters
//! ERR, since they belong to the SRQ, not to the QP.
//!
//! The engine also records the affiliated asynchronous events it raises ([`QpEvent`]):
//! QP fatal (ERR entered because of an error), last WQE reached (a QP on an SRQ entered ERR)
//! and SQ drained (SQD entered and every started send WR completed).
//!
//! Contract: no I/O, no clock, no allocation beyond the queues. Nothing here panics.

use super::{Instant, MemoryTable, PostError, QpEngine, QpState, QpType, RecvWqe};
use crate::transport::RecvWr;
use crate::wire::RocePacket;
use std::collections::VecDeque;
use std::net::IpAddr;

/// An asynchronous event affiliated with one QP, named as `enum ibv_event_type`.
/// Source: IBTA Vol 1 ch. 11 (asynchronous events); rxe `rxe_qp.c` `rxe_qp_error`,
/// `rxe_comp.c` `comp_check_sq_drain_done`, `rxe_resp.c` (last WQE reached).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpEvent {
    /// `IBV_EVENT_QP_FATAL`: the QP entered ERR because of an error (not by `modify_qp`).
    Fatal,
    /// `IBV_EVENT_SQ_DRAINED`: the QP is in SQD and every send WR started before it entered
    /// SQD has completed. Raised once per RTS→SQD transition.
    SqDrained,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: a QP attached to an SRQ entered ERR (by
    /// `modify_qp` or by an error); no further receive WQE of the SRQ will complete on it.
    LastWqeReached,
}

/// The engine's SRQ attachment and event state. One field of [`QpEngine`].
#[derive(Debug, Clone, Default)]
pub(super) struct SrqExt {
    /// The QP takes its receive WQEs from an SRQ.
    attached: bool,
    /// RTS→SQD happened and `SqDrained` has not been raised yet (rxe `attr.sq_draining`).
    sq_draining: bool,
    events: VecDeque<QpEvent>,
}

impl SrqExt {
    pub(super) fn attached(&self) -> bool {
        self.attached
    }
}

/// Most events an engine keeps before the owner polls them; older ones are dropped.
const MAX_PENDING_EVENTS: usize = 64;

impl QpEngine {
    /// Marks this QP as taking its receive WQEs from a shared receive queue (set once, at
    /// creation, by the owner of the SRQ).
    pub fn attach_srq(&mut self) {
        self.srq.attached = true;
    }

    /// True when the QP takes its receive WQEs from an SRQ.
    pub fn uses_srq(&self) -> bool {
        self.srq.attached
    }

    /// [`QpEngine::handle_packet`] (or, with `dst`, [`QpEngine::handle_packet_to`]) for a
    /// QP attached to `srq`: the responder takes the receive WQEs of the packet from `srq`,
    /// and a message it drops without consuming one puts it back at the head. When the
    /// packet consumed a WQE and the armed limit is then undercut, the limit event is raised
    /// ([`SrqQueue::poll_limit_reached`]). A QP not attached to an SRQ ignores `srq`.
    ///
    /// The SRQ's queue is the responder's receive queue for the length of the call (the
    /// two are swapped, no WR is copied): the responder's WQE fetch is the same for both.
    /// Source: rxe `rxe_resp.c` `get_srq_wqe` (fetch, then the limit check).
    pub fn handle_packet_srq(
        &mut self,
        now: Instant,
        pkt: &RocePacket<'_>,
        src: IpAddr,
        dst: Option<IpAddr>,
        mem: &mut MemoryTable,
        srq: &mut SrqQueue,
    ) {
        let attached = self.srq.attached;
        if attached {
            // An attached QP never holds receive WQEs of its own (`post_recv` refuses).
            debug_assert!(self.rq.is_empty());
            core::mem::swap(&mut self.rq, &mut srq.wqes);
        }
        let before = self.rq.len();
        match dst {
            Some(d) => self.handle_packet_to(now, pkt, src, d, mem),
            None => self.handle_packet(now, pkt, src, mem),
        }
        let after = self.rq.len();
        if attached {
            core::mem::swap(&mut self.rq, &mut srq.wqes);
            if after < before && srq.consumed() {
                srq.limit_reached = true;
            }
        }
    }

    /// The next asynchronous event this QP raised, if any. Call after each input; an SQ
    /// drain is detected here (rxe detects it in the completer after each ACK).
    #[must_use]
    pub fn poll_event(&mut self) -> Option<QpEvent> {
        self.check_sq_drained();
        self.srq.events.pop_front()
    }

    pub(super) fn raise(&mut self, ev: QpEvent) {
        if self.srq.events.len() >= MAX_PENDING_EVENTS {
            self.srq.events.pop_front();
        }
        self.srq.events.push_back(ev);
    }

    /// Hook of [`QpEngine::modify`]: the events of a state change made by `modify_qp`.
    pub(super) fn on_modify_state(&mut self, old: QpState, new: QpState) {
        match new {
            QpState::Sqd if old == QpState::Rts => self.srq.sq_draining = true,
            QpState::Err if old != QpState::Err && self.srq.attached => {
                self.raise(QpEvent::LastWqeReached);
            }
            _ => {}
        }
        if new != QpState::Sqd {
            self.srq.sq_draining = false;
        }
    }

    /// Hook of the engine's own error path: ERR entered because of an error.
    pub(super) fn on_fatal(&mut self, old: QpState) {
        if old == QpState::Err {
            return;
        }
        self.raise(QpEvent::Fatal);
        if self.srq.attached {
            self.raise(QpEvent::LastWqeReached);
        }
    }

    /// Raises `SqDrained` once, when the QP is draining in SQD and no started send WQE is
    /// left (on RC, every PSN sent was acknowledged, rxe's `comp.psn == req.psn`; UC and UD
    /// WQEs complete when sent). WQEs not yet started stay queued.
    fn check_sq_drained(&mut self) {
        if self.srq.sq_draining
            && self.state == QpState::Sqd
            && !self.sq.iter().any(|w| w.assigned)
            && (self.qp_type != QpType::Rc || self.req.psn.diff(self.comp.psn) <= 0)
        {
            self.srq.sq_draining = false;
            self.raise(QpEvent::SqDrained);
        }
    }
}

/// A shared receive queue's WRs and attributes (`struct ibv_srq_attr`), without the lock
/// and the bookkeeping of which QPs use it (the verbs layer keeps those).
///
/// Units: `max_wr` and `srq_limit` count WRs; `max_sge` counts SGEs per WR.
/// Source: rxe `rxe_srq.c` (`rxe_srq_chk_init`, `rxe_srq_chk_attr`, `rxe_srq_from_attr`),
/// `rxe_resp.c` `get_srq_wqe` (the limit event).
#[derive(Debug, Clone)]
pub struct SrqQueue {
    wqes: VecDeque<RecvWqe>,
    max_wr: u32,
    max_sge: u32,
    limit: u32,
    /// The limit event was raised and not yet polled.
    limit_reached: bool,
}

impl SrqQueue {
    /// An empty queue of at most `max_wr` WRs of at most `max_sge` SGEs each, with the limit
    /// event armed at `srq_limit` (0 = not armed). The caller checks the values against the
    /// device caps.
    pub fn new(max_wr: u32, max_sge: u32, srq_limit: u32) -> SrqQueue {
        SrqQueue {
            wqes: VecDeque::new(),
            max_wr,
            max_sge,
            limit: srq_limit,
            limit_reached: false,
        }
    }

    /// Queue depth in WRs.
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }
    /// SGEs per WR.
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }
    /// The armed limit (0 when not armed).
    pub fn limit(&self) -> u32 {
        self.limit
    }
    /// WRs queued.
    pub fn len(&self) -> usize {
        self.wqes.len()
    }
    /// True when no WR is queued.
    pub fn is_empty(&self) -> bool {
        self.wqes.is_empty()
    }

    /// Queues a receive WR at the tail.
    ///
    /// Errors: [`PostError::QueueFull`] when `max_wr` WRs are queued;
    /// [`PostError::Invalid`] for more SGEs than `max_sge`.
    pub fn post(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.wqes.len() >= self.max_wr as usize {
            return Err(PostError::QueueFull);
        }
        if wr.sg_list.len() > self.max_sge as usize {
            return Err(PostError::Invalid("too many SGEs"));
        }
        self.wqes.push_back(RecvWqe { wr });
        Ok(())
    }

    /// Resizes to `max_wr` WRs. Errors: [`PostError::Invalid`] when more WRs than that are
    /// queued (rxe `rxe_queue_resize` refuses to drop WRs) or when `max_wr` is below the armed
    /// limit (rxe `rxe_srq_chk_attr`).
    pub fn resize(&mut self, max_wr: u32) -> Result<(), PostError> {
        if self.limit != 0 && max_wr < self.limit {
            return Err(PostError::Invalid("max_wr below the armed srq_limit"));
        }
        if (max_wr as usize) < self.wqes.len() {
            return Err(PostError::Invalid("max_wr below the WRs queued"));
        }
        self.max_wr = max_wr;
        Ok(())
    }

    /// Arms the limit event at `srq_limit` WRs (0 disarms). Errors: [`PostError::Invalid`]
    /// when `srq_limit` exceeds `max_wr`.
    pub fn arm(&mut self, srq_limit: u32) -> Result<(), PostError> {
        if srq_limit > self.max_wr {
            return Err(PostError::Invalid("srq_limit above max_wr"));
        }
        self.limit = srq_limit;
        Ok(())
    }

    /// True once after a packet consumed a WR of this SRQ and left fewer than the armed
    /// `srq_limit` ([`QpEngine::handle_packet_srq`]): the owner raises
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`. The limit is disarmed (0) when this is set, as rxe
    /// `get_srq_wqe` does.
    #[must_use]
    pub fn poll_limit_reached(&mut self) -> bool {
        core::mem::take(&mut self.limit_reached)
    }

    /// Records that a WR was consumed. Returns true when this raises the limit event: the
    /// limit was armed and fewer than `srq_limit` WRs are left; the limit is then disarmed.
    fn consumed(&mut self) -> bool {
        if self.limit != 0 && self.wqes.len() < self.limit as usize {
            self.limit = 0;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{QpAttrMask, QpAttrs, QpModify};

    fn wr(id: u64, sges: usize) -> RecvWr {
        RecvWr {
            wr_id: id,
            sg_list: vec![crate::transport::Sge::default(); sges],
        }
    }

    fn to_err(e: &mut QpEngine) {
        let m = QpModify {
            qp_state: QpState::Err,
            ..QpModify::default()
        };
        e.modify(&m, QpAttrMask::STATE).unwrap();
    }

    fn srq_qp() -> QpEngine {
        let mut e = QpEngine::new(
            0x11,
            crate::transport::QpType::Rc,
            1,
            Default::default(),
            false,
        );
        e.attach_srq();
        e.modify_to(QpState::Init, &QpAttrs::default(), None)
            .unwrap();
        e
    }

    #[test]
    fn err_flushes_no_srq_wqe_and_raises_last_wqe_reached_only() {
        let mut e = srq_qp();
        assert_eq!(
            e.post_recv(wr(9, 1)),
            Err(PostError::Invalid("the QP takes its receives from an SRQ"))
        );
        to_err(&mut e);
        assert!(e.poll_completion().is_none(), "nothing flushed");
        assert_eq!(e.poll_event(), Some(QpEvent::LastWqeReached));
        assert_eq!(e.poll_event(), None);
        // ERR -> ERR raises nothing more.
        to_err(&mut e);
        assert_eq!(e.poll_event(), None);
    }

    const ME: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    /// An RC QP on an SRQ in RTR expecting PSN 0, from PEER.
    fn srq_qp_rtr() -> QpEngine {
        let mut e = srq_qp();
        let path = crate::transport::Path {
            local: ME,
            remote: PEER,
            src_port: 0xc000,
            ip: Default::default(),
        };
        e.modify_to(QpState::Rtr, &QpAttrs::default(), Some(path))
            .unwrap();
        e
    }

    /// Feeds an RC SEND ONLY with PSN `psn` and 8 bytes of payload through the SRQ.
    fn send_only(e: &mut QpEngine, mem: &mut MemoryTable, srq: &mut SrqQueue, psn: u32) {
        use crate::wire::{BthRepr, Opcode, PacketRepr, Psn};
        let mut repr = PacketRepr::new(BthRepr::new(Opcode::RC_SEND_ONLY, 0x11, Psn::new(psn)));
        repr.payload_len = 8;
        let mut buf = vec![0u8; repr.buffer_len()];
        let ip = crate::transport::Path {
            local: PEER,
            remote: ME,
            src_port: 0xc000,
            ip: Default::default(),
        }
        .icrc_ip();
        repr.emit(&mut buf, &[7; 8], &ip);
        let pkt = RocePacket::parse(&buf).unwrap();
        e.handle_packet_srq(Instant::ZERO, &pkt, PEER, None, mem, srq);
    }

    // rxe get_srq_wqe: the responder takes the SRQ's head; the limit event fires once the
    // WRs left fall below the armed limit, then the limit is disarmed.
    #[test]
    fn rtr_send_takes_the_srq_head_and_raises_the_limit_once() {
        let mut e = srq_qp_rtr();
        let mut mem = MemoryTable::new(1);
        let key = mem
            .register(1, 64, crate::transport::AccessFlags::LOCAL_WRITE)
            .unwrap();
        let va = mem.get(key).unwrap().iova;
        let mut srq = SrqQueue::new(8, 1, 3);
        for i in 0..4 {
            let sge = crate::transport::Sge {
                addr: va,
                length: 64,
                lkey: key,
            };
            srq.post(RecvWr {
                wr_id: i,
                sg_list: vec![sge],
            })
            .unwrap();
        }
        send_only(&mut e, &mut mem, &mut srq, 0);
        assert_eq!(e.poll_completion().map(|c| c.wc.wr_id), Some(0));
        assert_eq!((srq.len(), srq.poll_limit_reached()), (3, false));
        send_only(&mut e, &mut mem, &mut srq, 1);
        assert_eq!(e.poll_completion().map(|c| c.wc.wr_id), Some(1));
        assert_eq!((srq.len(), srq.poll_limit_reached()), (2, true));
        assert_eq!((srq.limit(), srq.poll_limit_reached()), (0, false));
        send_only(&mut e, &mut mem, &mut srq, 2);
        assert_eq!((srq.len(), srq.poll_limit_reached()), (1, false));
        assert_eq!(e.rq_outstanding(), 0, "the QP keeps no SRQ WQE");
    }

    #[test]
    fn rtr_send_with_an_empty_srq_is_rnr_naked_and_fires_nothing() {
        let mut e = srq_qp_rtr();
        let mut mem = MemoryTable::new(1);
        let mut srq = SrqQueue::new(8, 1, 1);
        send_only(&mut e, &mut mem, &mut srq, 0);
        assert!(e.poll_completion().is_none());
        assert!(!srq.poll_limit_reached());
        let nak = e.poll_transmit(Instant::ZERO, &mem).map(|t| {
            let p = RocePacket::parse(&t.payload).unwrap();
            p.repr.aeth.map(|a| a.syndrome >> 5)
        });
        assert_eq!(nak, Some(Some(1)), "an RNR NAK");
    }

    #[test]
    fn an_error_is_fatal_then_last_wqe_reached() {
        let mut e = srq_qp();
        e.enter_error();
        assert_eq!(e.poll_event(), Some(QpEvent::Fatal));
        assert_eq!(e.poll_event(), Some(QpEvent::LastWqeReached));
        let mut plain = QpEngine::new(
            0x12,
            crate::transport::QpType::Rc,
            1,
            Default::default(),
            false,
        );
        plain
            .modify_to(QpState::Init, &QpAttrs::default(), None)
            .unwrap();
        plain.enter_error();
        assert_eq!(plain.poll_event(), Some(QpEvent::Fatal));
        assert_eq!(plain.poll_event(), None);
    }

    #[test]
    fn post_full_and_too_many_sges_are_refused() {
        let mut q = SrqQueue::new(2, 1, 0);
        assert_eq!(q.post(wr(1, 2)), Err(PostError::Invalid("too many SGEs")));
        q.post(wr(1, 1)).unwrap();
        q.post(wr(2, 0)).unwrap();
        assert_eq!(q.post(wr(3, 1)), Err(PostError::QueueFull));
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn limit_fires_once_below_the_mark_then_disarms() {
        let mut q = SrqQueue::new(8, 1, 3);
        for i in 0..5 {
            q.post(wr(i, 1)).unwrap();
        }
        let mut fired = Vec::new();
        while let Some(w) = q.wqes.pop_front() {
            fired.push((w.wr.wr_id, q.consumed()));
        }
        // 4, 3 left: not below 3; 2 left: fires; then disarmed.
        assert_eq!(
            fired,
            vec![(0, false), (1, false), (2, true), (3, false), (4, false)]
        );
        assert_eq!(q.limit(), 0);
    }

    #[test]
    fn resize_and_arm_checks() {
        let mut q = SrqQueue::new(4, 1, 0);
        for i in 0..3 {
            q.post(wr(i, 1)).unwrap();
        }
        assert!(q.resize(2).is_err());
        q.resize(3).unwrap();
        assert!(q.arm(4).is_err());
        q.arm(3).unwrap();
        assert!(q.resize(16).is_ok());
        q.arm(2).unwrap();
        assert!(q.resize(1).is_err());
    }
}
