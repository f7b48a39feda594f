//! Completer: turns ACKs, NAKs, READ responses and ATOMIC ACKNOWLEDGEs into work
//! completions, in order; runs the retransmit and RNR timers and the retry counters.
//!
//! Source: IBTA Vol 1 ch. 9 (requester side of ACK/NAK processing; a NAK acknowledges all
//! earlier PSNs); rxe `rxe_comp.c` (`check_psn`, `check_ack`, `do_read`, `do_atomic`,
//! `rxe_completer`, `rnrnak_usec`).

use super::error::nak_wc_status;
use super::{
    DropReason, Instant, MemoryTable, QpAttrs, QpEngine, Timer, WcStatus, WrOpcode, ack_timeout,
};
use crate::wire::{AethSyndrome, NakCode, OpKind, Position, Psn, RNR_TIMER_TABLE_US, RocePacket};
use core::time::Duration;

/// Completer state.
#[derive(Debug, Clone, Default)]
pub(super) struct CompState {
    /// Oldest PSN not yet acknowledged.
    pub psn: Psn,
    retry_left: u8,
    rnr_left: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    /// A NAK-triggered retry is under way and nothing was acknowledged since: further
    /// sequence NAKs start no new retry (rxe `comp.started_retry`).
    started_retry: bool,
}

impl CompState {
    pub(super) fn new(sq_psn: Psn, a: &QpAttrs) -> CompState {
        CompState {
            psn: sq_psn,
            retry_left: a.retry_cnt,
            rnr_left: a.rnr_retry,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            started_retry: false,
        }
    }
}

impl QpEngine {
    pub(super) fn completer_handle(
        &mut self,
        now: Instant,
        pkt: &RocePacket<'_>,
        mem: &mut MemoryTable,
    ) {
        let psn = pkt.repr.bth.psn;
        // A response must answer a PSN we sent: older than the highest one sent so far.
        // Not the next one the requester will send: after a rewind for a retry that is
        // behind what the responder may have received and acknowledged, and refusing those
        // ACKs retransmitted until IBV_WC_RETRY_EXC_ERR while the peer answered every
        // retransmission with them (rxe `check_psn` compares with the WQE's last PSN).
        if psn.diff(self.req.high_psn) >= 0 {
            self.counters.drop_packet(DropReason::UnexpectedResponse);
            return;
        }
        match pkt.info.kind {
            OpKind::Acknowledge => {
                let Some(aeth) = pkt.repr.aeth else { return };
                let syndrome = AethSyndrome::from_byte(aeth.syndrome);
                if !matches!(syndrome, AethSyndrome::Ack { .. }) && !self.nak_applies(psn, syndrome)
                {
                    self.counters.drop_packet(DropReason::UnexpectedResponse);
                    return;
                }
                match syndrome {
                    // Any credit count is accepted (ConnectX may advertise real credits).
                    AethSyndrome::Ack { .. } => {
                        if !self.ack_through(psn, now) {
                            self.counters.drop_packet(DropReason::UnexpectedResponse);
                        }
                    }
                    AethSyndrome::RnrNak { timer } => self.rnr_nak(psn, timer, now),
                    AethSyndrome::Nak(NakCode::PsnSeqErr) => self.seq_nak(psn, now),
                    AethSyndrome::Nak(code) => self.fatal_nak(psn, code, now),
                    // A reserved syndrome type: rxe's completer goes to COMPST_ERROR; the
                    // WQE completes with IBV_WC_BAD_RESP_ERR (spec/deviations.toml).
                    AethSyndrome::Reserved(_) => {
                        self.ack_through(psn.sub(1), now);
                        self.pop_completed(WcStatus::BadRespErr);
                        self.enter_error();
                    }
                }
            }
            OpKind::ReadResponse => self.read_response(pkt, now, mem),
            OpKind::AtomicAcknowledge => self.atomic_ack(pkt, now, mem),
            _ => self.counters.drop_packet(DropReason::UnexpectedResponse),
        }
    }

    /// Whether a NAK (of any kind) at `psn` is about an outstanding WQE. It must not be
    /// older than the oldest unacknowledged PSN: a duplicated or late NAK must not break a
    /// healthy QP (rxe `get_wqe`, `check_psn`). One exception: an error NAK in the midst of
    /// a READ's responses, at any PSN of that READ from its request on. A responder that
    /// fails while producing them NAKs at the READ request's PSN (rxe since "Handle remote
    /// errors in the midst of a Read reply sequence", `check_psn` → COMPST_CHECK_ACK), which
    /// is older than the next response expected; dropping it would retransmit the READ until
    /// IBV_WC_RETRY_EXC_ERR against a QP in ERR.
    fn nak_applies(&self, psn: Psn, syndrome: AethSyndrome) -> bool {
        let Some(w) = self.sq.front().filter(|w| w.assigned) else {
            return false;
        };
        if psn.diff(self.comp.psn) >= 0 {
            return true;
        }
        let error_nak = matches!(syndrome, AethSyndrome::Nak(code) if code != NakCode::PsnSeqErr);
        let mid_read = w.wr.opcode == WrOpcode::RdmaRead && w.read_done > 0;
        error_nak && mid_read && psn.diff(w.first_psn) >= 0
    }

    /// Cumulative ACK through `q`: completes, in order, every SEND/WRITE WQE whose last PSN
    /// is ≤ q. A READ/atomic WQE whose last PSN is ≤ q but which has not completed means its
    /// response was lost (an implied NAK): go back to it. Returns false if the ACK is stale.
    fn ack_through(&mut self, q: Psn, now: Instant) -> bool {
        let before = self.comp.psn;
        let mut acked = q.add(1);
        let mut implied_nak = None;
        while let Some(w) = self.sq.front() {
            if w.local_done {
                // An executed local operation holds no PSN: it completes in order here.
                self.pop_completed(WcStatus::Success);
                continue;
            }
            if !w.assigned {
                break;
            }
            let last = w.first_psn.add(w.npsn - 1);
            if last.diff(q) > 0 {
                break;
            }
            if w.wr.opcode.is_rd_atomic() {
                // Implied NAK: a later PSN was acknowledged, so this response was lost. The
                // PSNs from the first missing response on stay unacknowledged.
                let resume = w.first_psn.add((w.read_done / self.pmtu()) as u32);
                if acked.diff(resume) > 0 {
                    acked = resume;
                }
                implied_nak = Some(resume);
                break;
            }
            self.pop_completed(WcStatus::Success);
        }
        if acked.diff(self.comp.psn) > 0 {
            self.comp.psn = acked;
        }
        // An ACK of packets sent before a rewind, past where the retry has got to: the
        // requester goes on from the first PSN not acknowledged, not from what it was
        // resending (which the peer has).
        self.advance_to(self.comp.psn);
        let progressed = self.comp.psn != before;
        if progressed {
            self.progress(now);
        }
        // An implied NAK is a retry like a sequence NAK: counted, and not restarted while a
        // retry is under way (rxe `check_psn` → COMPST_ERROR_RETRY).
        if let Some(resume) = implied_nak
            && !self.comp.started_retry
            && self.use_retry()
        {
            self.comp.started_retry = true;
            self.rewind_to(resume);
        }
        progressed || q.add(1) == self.comp.psn
    }

    fn pop_completed(&mut self, status: WcStatus) {
        if let Some(w) = self.sq.pop_front() {
            self.req.wqe = self.req.wqe.saturating_sub(1);
            self.complete_send(&w, status);
        }
    }

    /// Forward progress: retry counters are reset and the retransmit timer restarted while
    /// PSNs are outstanding (rxe `reset_retry_timer`: only while req.psn > comp.psn).
    fn progress(&mut self, now: Instant) {
        self.comp.retry_left = self.comp.retry_cnt;
        self.comp.rnr_left = self.comp.rnr_retry;
        self.comp.started_retry = false;
        if self.req.psn.diff(self.comp.psn) > 0 {
            if let Some(d) = ack_timeout(self.attrs.timeout) {
                self.timers.set(Timer::Retransmit, now + d);
            }
        } else {
            self.timers.stop(Timer::Retransmit);
        }
    }

    fn rnr_nak(&mut self, q: Psn, timer: u8, now: Instant) {
        self.counters.rcvd_rnr_err += 1;
        tracing::debug!(
            target: "softroce::nak",
            qpn = %format_args!("{:#x}", self.qpn),
            psn = %q,
            wait_us = RNR_TIMER_TABLE_US[usize::from(timer & 0x1f)],
            rnr_retries_left = self.comp.rnr_left,
            "requester received RNR NAK timer={timer}: waits, then resends from the PSN"
        );
        self.ack_through(q.sub(1), now);
        if !self.front_holds(q) {
            return;
        }
        // rnr_retry 7 means retry forever.
        if self.comp.rnr_retry != 7 {
            if self.comp.rnr_left == 0 {
                self.counters.retry_rnr_exceeded_err += 1;
                self.pop_completed(WcStatus::RnrRetryExcErr);
                self.enter_error();
                return;
            }
            self.comp.rnr_left -= 1;
        }
        let wait_us = RNR_TIMER_TABLE_US[usize::from(timer & 0x1f)];
        // The requester waits at least the RNR time; the retransmit timer must not cut it
        // short, so it is stopped until sending resumes.
        self.timers.stop(Timer::Retransmit);
        self.timers
            .set(Timer::Rnr, now + Duration::from_micros(u64::from(wait_us)));
        self.rewind_to(q);
    }

    fn seq_nak(&mut self, q: Psn, now: Instant) {
        self.counters.rcvd_seq_err += 1;
        tracing::debug!(
            target: "softroce::nak",
            qpn = %format_args!("{:#x}", self.qpn),
            psn = %q,
            "requester received NAK PSN sequence error: goes back to the PSN"
        );
        // A NAK acknowledges every earlier PSN.
        self.ack_through(q.sub(1), now);
        // rxe: while a retry is under way with no progress since, another sequence NAK (from
        // the same burst of out-of-order packets) starts no new retry and uses no count.
        // Likewise while an RNR wait is pending: the packets sent after the RNR-NAKed one draw
        // this NAK, and the RNR retry resends from that PSN anyway.
        if self.comp.started_retry || self.timers.is_armed(Timer::Rnr) {
            return;
        }
        if !self.use_retry() {
            return;
        }
        self.comp.started_retry = true;
        self.rewind_to(q);
    }

    fn fatal_nak(&mut self, q: Psn, code: NakCode, now: Instant) {
        tracing::debug!(
            target: "softroce::nak",
            qpn = %format_args!("{:#x}", self.qpn),
            psn = %q,
            status = nak_wc_status(code).ibv_name(),
            "requester received NAK {code}: the WR completes in error, the QP enters ERR"
        );
        self.ack_through(q.sub(1), now);
        if !self.front_holds(q) {
            return;
        }
        self.pop_completed(nak_wc_status(code));
        self.enter_error();
    }

    /// Whether the oldest WQE holds PSN `q`, after a NAK at `q` acknowledged what precedes
    /// it. When it does not, that WQE is a READ or atomic whose response was lost (the NAK
    /// implies it: `ack_through` has gone back to it) and the NAK is about a later WQE: it
    /// must not complete this one. rxe `check_psn`: a PSN past a pending READ/atomic WQE is
    /// COMPST_ERROR_RETRY, never that WQE's status; the responder NAKs again after the retry.
    fn front_holds(&self, q: Psn) -> bool {
        self.sq
            .front()
            .filter(|w| w.assigned)
            .is_some_and(|w| q.diff(w.first_psn) >= 0 && q.diff(w.first_psn.add(w.npsn)) < 0)
    }

    /// Uses one retry; when none is left completes the oldest WQE with
    /// `IBV_WC_RETRY_EXC_ERR`, moves to ERR and returns false.
    fn use_retry(&mut self) -> bool {
        if self.comp.retry_left == 0 {
            tracing::debug!(
                target: "softroce::retransmit",
                qpn = %format_args!("{:#x}", self.qpn),
                psn = %self.comp.psn,
                "retry count exceeded: IBV_WC_RETRY_EXC_ERR, the QP enters ERR"
            );
            self.counters.retry_exceeded_err += 1;
            self.pop_completed(WcStatus::RetryExcErr);
            self.enter_error();
            return false;
        }
        self.comp.retry_left -= 1;
        tracing::debug!(
            target: "softroce::retransmit",
            qpn = %format_args!("{:#x}", self.qpn),
            from_psn = %self.comp.psn,
            retries_left = self.comp.retry_left,
            "requester retransmits"
        );
        // rxe RXE_CNT_COMP_RETRY: every retry started, by timeout or by NAK.
        self.counters.completer_retry_err += 1;
        true
    }

    fn read_response(&mut self, pkt: &RocePacket<'_>, now: Instant, mem: &mut MemoryTable) {
        let r = pkt.repr.bth.psn;
        // Responses arrive in PSN order, so this one acknowledges every earlier request.
        self.ack_through(r.sub(1), now);
        let pmtu = self.pmtu();
        let pd = self.pd;
        let Some(w) = self.sq.front() else {
            self.counters.drop_packet(DropReason::UnexpectedResponse);
            return;
        };
        let expected = w.first_psn.add((w.read_done / pmtu) as u32);
        if w.wr.opcode != WrOpcode::RdmaRead || !w.assigned || r != expected {
            // Out of order or not ours: ignored; the retransmit timer recovers.
            self.counters.drop_packet(DropReason::UnexpectedResponse);
            return;
        }
        let pos = pkt.info.position;
        let remaining = w.length - w.read_done;
        let len = pkt.payload.len() as u64;
        // The response to a READ request starts with FIRST or ONLY. A READ re-issued from
        // the middle is answered by rxe as a replay (MIDDLE/LAST, rxe `duplicate_request`)
        // and by others as a new READ (FIRST/ONLY): at the re-issued PSN both are accepted.
        let seq_ok = if r == w.read_req_psn {
            pos.starts_message() || w.read_done > 0
        } else {
            !pos.starts_message()
        };
        let len_ok = match pos {
            Position::First | Position::Middle => len == pmtu && len < remaining,
            Position::Last | Position::Only => len == remaining,
        };
        if !seq_ok || !len_ok {
            self.counters.drop_packet(DropReason::BadResponseLength);
            return;
        }
        if len > 0 {
            let off = w.read_done;
            if mem.scatter(&w.wr.sg_list, pd, off, pkt.payload).is_err() {
                self.pop_completed(WcStatus::LocProtErr);
                self.enter_error();
                return;
            }
        }
        if let Some(w) = self.sq.front_mut() {
            w.read_done += len;
        }
        self.comp.psn = r.add(1);
        self.progress(now);
        if pos.ends_message() {
            self.pop_completed(WcStatus::Success);
        }
    }

    fn atomic_ack(&mut self, pkt: &RocePacket<'_>, now: Instant, mem: &mut MemoryTable) {
        let r = pkt.repr.bth.psn;
        self.ack_through(r.sub(1), now);
        let pd = self.pd;
        let Some(w) = self.sq.front() else {
            self.counters.drop_packet(DropReason::UnexpectedResponse);
            return;
        };
        let Some(ack) = pkt.repr.atomic_ack_eth else {
            return;
        };
        if !w.wr.opcode.is_atomic() || !w.assigned || w.first_psn != r {
            self.counters.drop_packet(DropReason::UnexpectedResponse);
            return;
        }
        // The original value lands in the local buffer in host order (rxe `do_atomic`).
        let bytes = ack.orig_remote_data.to_ne_bytes();
        if mem.scatter(&w.wr.sg_list, pd, 0, &bytes).is_err() {
            self.pop_completed(WcStatus::LocProtErr);
            self.enter_error();
            return;
        }
        self.comp.psn = r.add(1);
        self.progress(now);
        self.pop_completed(WcStatus::Success);
    }

    pub(super) fn completer_timeout(&mut self, now: Instant) {
        self.timers.fire(Timer::Rnr, now);
        if !self.timers.fire(Timer::Retransmit, now) {
            return;
        }
        let Some(front) = self.sq.front() else { return };
        if self.req.psn.diff(self.comp.psn) <= 0 || !front.assigned {
            return;
        }
        let resume = if front.wr.opcode == WrOpcode::RdmaRead {
            front.first_psn.add((front.read_done / self.pmtu()) as u32)
        } else if self.comp.psn.diff(front.first_psn) > 0 {
            self.comp.psn
        } else {
            front.first_psn
        };
        // A timeout always retries (rxe `timeout_retry`), and marks the retry as under way
        // so that NAKs drawn by the same lost packet start no second one.
        if self.use_retry() {
            self.comp.started_retry = true;
            self.rewind_to(resume);
        }
    }
}
