//! The mesh workload's checks against its reference model: each send and receive completion
//! as it comes, and each connection's final state.

use super::super::SimRng;
use super::model::{Conn, GRH, Kind, Mishap, Node, Op, RC_RETRY_CNT, RC_TIMEOUT, Transport};
use crate::transport::{Instant, ack_timeout};
use crate::verbs::{Qp, QpState, RecvWr, Wc, WcFlags, WcOpcode, WcStatus};
use std::time::Duration;

/// Whether `op` uses an R_Key a SEND_WITH_INVALIDATE before it invalidated.
pub(super) fn invalidated(c: &Conn, op: &Op) -> bool {
    matches!(c.mishap, Mishap::MwInvalidate { at } if op.index > at)
        && op.kind.uses_rkey()
        && op.len > 0
}

/// Whether `op` may meet an R_Key that no longer (or never) validates.
pub(super) fn key_may_fail(c: &Conn, op: &Op) -> bool {
    op.bad
        || invalidated(c, op)
        || (matches!(c.mishap, Mishap::DeregRemote { .. })
            && c.mishap_fired.is_some()
            && op.kind.uses_rkey()
            && op.len > 0)
}

/// Whether a first failure with `status` on `op` is what the transport and the connection's
/// mishap allow.
pub(super) fn failure_allowed(
    c: &Conn,
    op: &Op,
    status: WcStatus,
    (lossy, reorders): (bool, bool),
) -> bool {
    match status {
        WcStatus::RetryExcErr => {
            lossy
                || (reorders && c.responder_dead)
                || (matches!(
                    c.mishap,
                    Mishap::ResponderErr { .. } | Mishap::DestroyResponder { .. }
                ) && c.mishap_fired.is_some())
                // The responder's device closed: nothing ACKs any more (rxe: the retries run
                // out, `rxe_comp.c` COMPST_ERROR_RETRY).
                || (c.resp_closed && !c.req_closed && c.transport == Transport::Rc)
        }
        WcStatus::RemAccessErr => key_may_fail(c, op),
        WcStatus::RnrRetryExcErr => match c.mishap {
            Mishap::RnrStarve { budget } => op.recv_index.is_some_and(|r| r >= budget),
            _ => false,
        },
        WcStatus::WrFlushErr => {
            (matches!(c.mishap, Mishap::RequesterErr { .. }) && c.mishap_fired.is_some())
                // The requester's device closed: its QPs went to ERR, which flushes.
                || c.req_closed
        }
        _ => false,
    }
}

pub(super) fn on_send(
    c: &mut Conn,
    wc: &Wc,
    now: Instant,
    lossy: (bool, bool),
    bytes: &mut u64,
    violations: &mut Vec<String>,
) {
    let name = c.name();
    let Some(op) = c.outstanding.pop_front() else {
        violations.push(format!("{name}: extra completion {wc:?}"));
        return;
    };
    let i = op.index;
    c.done += 1;
    if wc.wr_id != i as u64 {
        violations.push(format!(
            "{name}: completion for wr_id {} where op {i} was due: {wc:?}",
            wc.wr_id
        ));
        return;
    }
    if let Some((first, _)) = c.failed {
        if wc.status != WcStatus::WrFlushErr {
            violations.push(format!(
                "{name}: op {i} ended {} after op {first} failed (IBV_WC_WR_FLUSH_ERR due)",
                wc.status
            ));
        }
        return;
    }
    if wc.status != WcStatus::Success {
        if failure_allowed(c, &op, wc.status, lossy) {
            c.failed = Some((i, wc.status));
            retries_ran_out(c, i, wc.status, now, lossy, violations);
            if let Some(qa) = &c.qa
                && qa.state() != QpState::Err
            {
                violations.push(format!(
                    "{name}: op {i} ended {} but the requester QP is in {:?}, not ERR",
                    wc.status,
                    qa.state()
                ));
            }
        } else {
            violations.push(format!(
                "{name} {:?}: op {i} ({:?}, {} B) ended {} ({wc:?})",
                c.mishap, op.kind, op.len, wc.status
            ));
        }
        return;
    }
    // Success.
    if c.recv_failed == Some(i) {
        violations.push(format!(
            "{name}: op {i} ({:?}) succeeded though its receive completed in error",
            op.kind
        ));
        return;
    }
    if op.bad || invalidated(c, &op) {
        violations.push(format!(
            "{name}: op {i} ({:?}) with a bad or invalidated R_Key or a bad address succeeded",
            op.kind
        ));
        return;
    }
    if let Mishap::RnrStarve { budget } = c.mishap
        && op.recv_index.is_some_and(|r| r >= budget)
    {
        violations.push(format!(
            "{name}: op {i} succeeded though the responder posted only {budget} receives"
        ));
        return;
    }
    *bytes += op.len as u64;
    c.ok_count += 1;
    let slot = i % c.depth;
    let at = slot * c.max.max(8);
    match op.kind {
        Kind::Read => {
            let mut got = vec![0u8; op.len];
            let _ = c.local.read(at, &mut got);
            if got != op.data {
                violations.push(format!(
                    "{name}: op {i}: READ of {} B at {} returned other bytes than the model",
                    op.len, op.remote_off
                ));
            }
        }
        Kind::Cas | Kind::Faa => {
            let mut got = [0u8; 8];
            let _ = c.local.read(at, &mut got);
            let got = u64::from_ne_bytes(got);
            if got != op.orig {
                violations.push(format!(
                    "{name}: op {i}: {:?} returned {got:#x}, the model {:#x}",
                    op.kind, op.orig
                ));
            }
        }
        _ => {}
    }
}

/// A requester whose responder's device closed ends `IBV_WC_RETRY_EXC_ERR` only after
/// `retry_cnt` retransmissions, each an ACK timeout after the one before: on a link that
/// neither loses nor reorders (where no retry was spent before the close), no sooner than
/// `retry_cnt` ACK timeouts after the close.
fn retries_ran_out(
    c: &Conn,
    i: usize,
    status: WcStatus,
    now: Instant,
    (lossy, reorders): (bool, bool),
    violations: &mut Vec<String>,
) {
    let Some(closed) = c.closed_at else { return };
    if status != WcStatus::RetryExcErr || !c.resp_closed || lossy || reorders {
        return;
    }
    // A connection with a mishap of its own (its responder destroyed, an RNR starve...) may
    // have spent retries before the close (seed 71306: DestroyResponder at op 1, then the
    // responder's device closed): only the close's own retries are bounded here.
    if !matches!(c.mishap, Mishap::None | Mishap::DeviceClose { .. }) {
        return;
    }
    let timeout = ack_timeout(RC_TIMEOUT).unwrap_or_default();
    let soonest = closed + timeout * u32::from(RC_RETRY_CNT);
    if now < soonest {
        violations.push(format!(
            "{}: op {i} ended IBV_WC_RETRY_EXC_ERR {} ns after its responder's device closed, \
             before {RC_RETRY_CNT} retransmissions {} ns apart",
            c.name(),
            now.since(closed).as_nanos(),
            timeout.as_nanos()
        ));
    }
}

pub(super) fn on_recv(
    c: &mut Conn,
    node: &Node,
    wc: &Wc,
    dup_copies: u32,
    rng: &mut SimRng,
    now: Instant,
    violations: &mut Vec<String>,
) {
    let name = c.name();
    let s = wc.wr_id as usize;
    if wc.status == WcStatus::WrFlushErr {
        // Flushed receives: only once the QP may be in ERR; all of its own queue, but of an
        // SRQ only the one WQE the QP had taken for a message in progress (IBTA ch. 10: WQEs
        // dequeued from an SRQ and not completed are flushed; those still in it stay).
        c.flushed_recvs += 1;
        if !c.responder_dead || (c.on_srq && c.flushed_recvs > 1) {
            violations.push(format!("{name}: receive flushed unexpectedly: {wc:?}"));
        }
        if c.on_srq
            && let Some((srq, m)) = &node.srq
            && let Err(e) = srq.post_recv(&[RecvWr {
                wr_id: s as u64,
                sg_list: vec![m.sge(s * node.srq_slot, node.srq_slot as u32)],
            }])
        {
            violations.push(format!("{name}: SRQ post_recv: {e}"));
        }
        return;
    }
    // An R_Key violation completes the receive WQE the responder holds with
    // IBV_WC_REM_ACCESS_ERR (rxe `do_complete` after `do_class_ac_error`): a WRITE_WITH_IMM's
    // own (rxe takes it in `check_resource`, before `check_rkey`), or that of a SEND in
    // progress when a retried READ meets a key gone meanwhile. The requester's WR for it
    // must then not succeed.
    let key_failed = wc.status == WcStatus::RemAccessErr
        && c.transport == Transport::Rc
        && c.responder_dead
        && matches!(
            c.mishap,
            Mishap::BadRkey { .. } | Mishap::DeregRemote { .. } | Mishap::MwInvalidate { .. }
        )
        && !c.expect_recv.is_empty();
    if key_failed {
        c.recv_failed = c.expect_recv.pop_front().map(|op| op.index);
    } else if wc.status != WcStatus::Success {
        violations.push(format!("{name}: receive completion {wc:?}"));
        return;
    }
    let (area, slot_bytes) = if c.on_srq {
        match &node.srq {
            Some((_, m)) => (m, node.srq_slot),
            None => return,
        }
    } else {
        match &c.ring {
            Some(m) => (m, c.slot),
            None => return,
        }
    };
    let base = s * slot_bytes;
    let read = |off: usize, len: usize| {
        let mut v = vec![0u8; len];
        let _ = area.read(base + off, &mut v);
        v
    };
    let imm = wc
        .wc_flags
        .contains(WcFlags::WITH_IMM)
        .then_some(wc.imm_data);
    let matches = |op: &Op, wc: &Wc| -> bool {
        let want_opcode = if op.kind == Kind::WriteImm {
            WcOpcode::RecvRdmaWithImm
        } else {
            WcOpcode::Recv
        };
        let want_imm = matches!(op.kind, Kind::SendImm | Kind::WriteImm).then_some(op.imm);
        let want_inv = (op.kind == Kind::SendInv).then_some(c.rkey);
        if wc.invalidated_rkey() != want_inv {
            return false;
        }
        let grh = if c.transport == Transport::Ud { GRH } else { 0 };
        if wc.opcode != want_opcode || imm != want_imm || wc.byte_len as usize != op.len + grh {
            return false;
        }
        if c.transport == Transport::Ud && wc.src_qp != c.qa.as_ref().map_or(0, Qp::qp_num) {
            return false;
        }
        match op.kind {
            Kind::Send | Kind::SendImm | Kind::SendInv => read(grh, op.len) == op.data,
            _ => true,
        }
    };
    match c.transport {
        _ if key_failed => {}
        Transport::Rc => {
            // RC: in order, exactly once.
            match c.expect_recv.pop_front() {
                Some(op) if matches(&op, wc) => {}
                Some(op) => violations.push(format!(
                    "{name}: receive completion {wc:?} does not match op {} ({:?}, {} B, imm {:#x})",
                    op.index, op.kind, op.len, op.imm
                )),
                None => violations.push(format!("{name}: receive completion {wc:?} with none due")),
            }
        }
        Transport::Uc | Transport::Ud => {
            // At most `dup_copies` receipts of a message; prefer the one received fewest times.
            let found = c
                .sent
                .iter_mut()
                .filter(|(op, _)| op.kind.takes_recv() && matches(op, wc))
                .min_by_key(|(_, n)| *n);
            match found {
                Some((op, n)) => {
                    *n += 1;
                    if *n > dup_copies {
                        violations.push(format!(
                            "{name}: op {} ({:?}, {} B) received {n} times",
                            op.index, op.kind, op.len
                        ));
                    }
                    if op.kind == Kind::WriteImm
                        && let Some(r) = &c.remote
                    {
                        let mut got = vec![0u8; op.len];
                        let _ = r.read(op.remote_off, &mut got);
                        if got != op.data {
                            violations.push(format!(
                                "{name}: op {}: WRITE_WITH_IMM completed, region differs",
                                op.index
                            ));
                        }
                    }
                }
                None => violations.push(format!(
                    "{name}: receive completion {wc:?} matches no message sent"
                )),
            }
        }
    }
    if !key_failed {
        c.recvs_ok += 1;
    }
    // Give the buffer back.
    if c.on_srq {
        if let Some((srq, m)) = &node.srq
            && let Err(e) = srq.post_recv(&[RecvWr {
                wr_id: s as u64,
                sg_list: vec![m.sge(base, slot_bytes as u32)],
            }])
        {
            violations.push(format!("{name}: SRQ post_recv: {e}"));
        }
    } else {
        // One receive in ten comes back late on RC, to draw RNR NAKs (not on a starved
        // connection, whose RNR NAKs must come from the budget alone).
        let late = c.transport == Transport::Rc
            && !matches!(c.mishap, Mishap::RnrStarve { .. })
            && rng.chance(0.1);
        let delay = if late {
            Duration::from_micros(rng.below(3000))
        } else {
            Duration::ZERO
        };
        c.pending_recvs.push_back((now + delay, s));
        c.pending_recvs.make_contiguous().sort_by_key(|(t, _)| *t);
    }
}

pub(super) fn final_checks(c: &Conn, violations: &mut Vec<String>) {
    let name = c.name();
    // Operations from this index on may or may not have executed: the first failed one, or
    // the first a destroyed requester never completed.
    let first_failed = c.failed.map(|(i, _)| i).or_else(|| {
        matches!(c.mishap, Mishap::DestroyRequester { .. })
            .then_some(c.ok_count)
            .filter(|_| c.qa.is_none())
    });
    if first_failed.is_some()
        && let Some(qa) = &c.qa
        && qa.state() != QpState::Err
    {
        violations.push(format!(
            "{name}: requester in {:?} after a failure",
            qa.state()
        ));
    }
    qp_states(c, first_failed, violations);
    match c.transport {
        Transport::Rc => {
            // Every receive of an operation before the first failure completed.
            if let Some(op) = c.expect_recv.front()
                && first_failed.is_none_or(|f| op.index < f)
            {
                violations.push(format!(
                    "{name}: op {} ({:?}) acknowledged but its receive never completed",
                    op.index, op.kind
                ));
            }
            let Some(remote) = &c.remote else { return };
            let got = remote.to_vec();
            let mut mask = vec![true; got.len()];
            if let Some(f) = first_failed {
                for &(op, off, len) in &c.touched {
                    if op >= f {
                        mask[off..off + len].iter_mut().for_each(|m| *m = false);
                    }
                }
            }
            if let Some(b) = (0..got.len()).find(|&b| mask[b] && got[b] != c.model[b]) {
                violations.push(format!(
                    "{name}: remote byte {b} is {:#04x}, the model {:#04x}",
                    got[b], c.model[b]
                ));
            }
        }
        Transport::Uc => {
            let Some(remote) = &c.remote else { return };
            let got = remote.to_vec();
            for (op, n) in &c.sent {
                if !matches!(op.kind, Kind::Write | Kind::WriteImm) {
                    continue;
                }
                let region = &got[op.remote_off..op.remote_off + op.len];
                let fill = &c.model[op.remote_off..op.remote_off + op.len];
                let k = region
                    .iter()
                    .zip(&op.data)
                    .take_while(|(a, b)| a == b)
                    .count();
                if region[k..] != fill[k..] {
                    violations.push(format!(
                        "{name}: op {} UC WRITE region is neither a prefix of its bytes nor the fill after it",
                        op.index
                    ));
                }
                if op.kind == Kind::WriteImm && *n > 0 && k != op.len {
                    violations.push(format!(
                        "{name}: op {} WRITE_WITH_IMM completed at the receiver, region incomplete",
                        op.index
                    ));
                }
            }
            // Memory outside every WRITE's region keeps the fill.
            let mut mask = vec![true; got.len()];
            for (op, _) in &c.sent {
                if matches!(op.kind, Kind::Write | Kind::WriteImm) {
                    mask[op.remote_off..op.remote_off + op.len]
                        .iter_mut()
                        .for_each(|m| *m = false);
                }
            }
            if let Some(b) = (0..got.len()).find(|&b| mask[b] && got[b] != c.model[b]) {
                violations.push(format!("{name}: UC remote byte {b} written by nobody"));
            }
        }
        Transport::Ud => {}
    }
}

/// The QPs' states at the end: those on a closed device in ERR (it moved them there, as a
/// device that fails does); the others where their own connection left them: a requester
/// that saw no failure and was not moved to ERR, and a responder no mishap reached, in RTS
/// (a device closing leaves the QPs of the other devices alone).
fn qp_states(c: &Conn, first_failed: Option<usize>, violations: &mut Vec<String>) {
    let name = c.name();
    let requester_moved =
        matches!(c.mishap, Mishap::RequesterErr { .. }) && c.mishap_fired.is_some();
    if let Some(qa) = &c.qa {
        let want = if c.req_closed {
            Some(QpState::Err)
        } else if first_failed.is_none() && !requester_moved {
            Some(QpState::Rts)
        } else {
            None
        };
        if want.is_some_and(|w| qa.state() != w) {
            violations.push(format!(
                "{name}: requester in {:?} at the end, {:?} due (device {} {})",
                qa.state(),
                want,
                c.req,
                if c.req_closed { "closed" } else { "open" }
            ));
        }
    }
    if let Some(qb) = &c.qb {
        let want = if c.resp_closed {
            Some(QpState::Err)
        } else if !c.responder_dead {
            Some(QpState::Rts)
        } else {
            None
        };
        if want.is_some_and(|w| qb.state() != w) {
            violations.push(format!(
                "{name}: responder in {:?} at the end, {:?} due (device {} {})",
                qb.state(),
                want,
                c.resp,
                if c.resp_closed { "closed" } else { "open" }
            ));
        }
    }
}
