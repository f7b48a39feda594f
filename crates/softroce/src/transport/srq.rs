//! Shared receive queues and the QP's asynchronous events, on the engine side.
//!
//! A shared receive queue (SRQ) is a plain queue of receive WRs ([`SrqQueue`]) that the
//! owner (the verbs device) keeps outside every QP. When a request that needs a receive WQE
//! reaches a QP attached to an SRQ, the owner lends the head of the SRQ to the QP
//! ([`QpEngine::lend_srq_recv`]), runs the engine, and takes it back if the engine did not
//! consume it ([`QpEngine::reclaim_srq_recv`]). Under the owner's lock this is the same as
//! the responder reading the SRQ directly (rxe `rxe_resp.c` `get_srq_wqe`), with no lock in
//! the transport. A QP attached to an SRQ refuses `post_recv` and never flushes the SRQ's
//! WQEs when it enters ERR: they belong to the SRQ, not to the QP.
//!
//! The engine also records the affiliated asynchronous events it raises ([`QpEvent`]):
//! QP fatal (ERR entered because of an error), last WQE reached (a QP on an SRQ entered ERR)
//! and SQ drained (SQD entered and every started send WR completed).
//!
//! Contract: no I/O, no clock, no allocation beyond the queues. Nothing here panics.

use super::{PostError, QpEngine, QpState, QpType, RecvWqe};
use crate::transport::RecvWr;
use std::collections::VecDeque;

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

    /// Lends the head receive WR of the SRQ to this QP for the next packet. It becomes the
    /// head of the QP's receive queue; a QP without an SRQ ignores the call.
    pub fn lend_srq_recv(&mut self, wr: RecvWr) {
        if self.srq.attached {
            self.rq.push_front(RecvWqe { wr });
        }
    }

    /// Takes back a lent receive WR the QP did not consume (or one it put back, e.g. a UC
    /// message that was dropped), to return it to the head of the SRQ. `None` when nothing
    /// is left, i.e. the lent WR was consumed.
    pub fn reclaim_srq_recv(&mut self) -> Option<RecvWr> {
        if !self.srq.attached {
            return None;
        }
        self.rq.pop_front().map(|r| r.wr)
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

    /// Hook of [`QpEngine::set_state`]: the events of a state change made by `modify_qp`.
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
    wqes: VecDeque<RecvWr>,
    max_wr: u32,
    max_sge: u32,
    limit: u32,
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
        self.wqes.push_back(wr);
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

    /// Removes the head WR to lend it to a QP; the limit is not checked until
    /// [`SrqQueue::consumed`].
    pub fn lend(&mut self) -> Option<RecvWr> {
        self.wqes.pop_front()
    }

    /// Puts a lent WR back at the head.
    pub fn give_back(&mut self, wr: RecvWr) {
        self.wqes.push_front(wr);
    }

    /// Records that a lent WR was consumed. Returns true when this raises
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: the limit was armed and fewer than `srq_limit` WRs are
    /// left; the limit is then disarmed (set to 0), as rxe `get_srq_wqe` does.
    pub fn consumed(&mut self) -> bool {
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

    fn wr(id: u64, sges: usize) -> RecvWr {
        RecvWr {
            wr_id: id,
            sg_list: vec![crate::transport::Sge::default(); sges],
        }
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
        e.set_state(QpState::Init);
        e
    }

    #[test]
    fn err_keeps_a_lent_wr_for_the_srq_and_raises_last_wqe_reached_only() {
        let mut e = srq_qp();
        assert_eq!(
            e.post_recv(wr(9, 1)),
            Err(PostError::Invalid("the QP takes its receives from an SRQ"))
        );
        e.lend_srq_recv(wr(1, 1));
        e.set_state(QpState::Err);
        assert!(e.poll_completion().is_none(), "nothing flushed");
        assert_eq!(e.reclaim_srq_recv().map(|w| w.wr_id), Some(1));
        assert_eq!(e.poll_event(), Some(QpEvent::LastWqeReached));
        assert_eq!(e.poll_event(), None);
        // ERR -> ERR raises nothing more.
        e.set_state(QpState::Err);
        assert_eq!(e.poll_event(), None);
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
        plain.set_state(QpState::Init);
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
        while let Some(w) = q.lend() {
            fired.push((w.wr_id, q.consumed()));
        }
        // 4, 3 left: not below 3; 2 left: fires; then disarmed.
        assert_eq!(
            fired,
            vec![(0, false), (1, false), (2, true), (3, false), (4, false)]
        );
        assert_eq!(q.limit(), 0);
    }

    #[test]
    fn lent_then_given_back_keeps_order_and_does_not_fire() {
        let mut q = SrqQueue::new(4, 1, 2);
        q.post(wr(1, 1)).unwrap();
        q.post(wr(2, 1)).unwrap();
        let w = q.lend().unwrap();
        q.give_back(w);
        assert_eq!(q.limit(), 2);
        assert_eq!(q.lend().map(|w| w.wr_id), Some(1));
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
