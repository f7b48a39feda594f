//! The mesh workload's actions: posting receives and operations, binding the memory window,
//! firing a connection's mishap.

use super::super::{Sim, SimRng};
use super::model::{ATOMIC_OFF, Conn, DATA_OFF, Kind, Mishap, Node, Op, Transport, draw_len};
use crate::transport::Instant;
use crate::verbs::{
    AccessFlags, MwType, Pd, QpAttr, QpAttrMask, QpState, RecvWr, SendFlags, SendWr, Wc, WcOpcode,
    WcStatus, WrOpcode,
};
use std::time::Duration;

pub(super) fn post_ring(c: &mut Conn, s: usize, violations: &mut Vec<String>) {
    if let Mishap::RnrStarve { budget } = c.mishap
        && c.recvs_posted >= budget
    {
        return;
    }
    let (Some(qb), Some(ring)) = (&c.qb, &c.ring) else {
        return;
    };
    // A responder in ERR gets no more receives (an application would stop too); one that
    // only may go there (a bad key on its way) keeps getting them.
    if qb.state() == QpState::Err {
        return;
    }
    c.recvs_posted += 1;
    let r = RecvWr {
        wr_id: s as u64,
        sg_list: vec![ring.sge(s * c.slot, c.slot as u32)],
    };
    if let Err(e) = qb.post_recv(&[r]) {
        violations.push(format!("{}: post_recv: {e}", c.name()));
    }
}

const BIND_WR_ID: u64 = u64::MAX;

/// Binds a type 2 window over all of the connection's remote MR through its responder QP;
/// the requester then uses the window's R_Key.
pub(super) fn bind_window(c: &mut Conn, pd: &Pd, violations: &mut Vec<String>) {
    let (Some(qb), Some(remote)) = (&c.qb, &c.remote) else {
        return;
    };
    let made = pd.alloc_mw(MwType::Type2).and_then(|mw| {
        let bind = mw.bind_wr(
            BIND_WR_ID,
            remote,
            remote.addr(),
            remote.len() as u64,
            AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC,
        );
        let rkey = bind.bind_mw.map_or(0, |b| b.rkey);
        qb.post_send(&[bind])?;
        Ok((mw, rkey))
    });
    match made {
        Ok((mw, rkey)) => {
            c.mw = Some(mw);
            c.rkey = rkey;
        }
        Err(e) => violations.push(format!("{}: bind a type 2 window: {e}", c.name())),
    }
}

/// The responder QP's one send completion: the window's bind.
pub(super) fn on_bind(c: &mut Conn, wc: &Wc, violations: &mut Vec<String>) {
    if c.mw.is_some()
        && !c.mw_bound
        && wc.wr_id == BIND_WR_ID
        && wc.status == WcStatus::Success
        && wc.opcode == WcOpcode::BindMw
    {
        c.mw_bound = true;
    } else {
        violations.push(format!("{}: responder send completion {wc:?}", c.name()));
    }
}

pub(super) fn fire_mishap(c: &mut Conn, violations: &mut Vec<String>) {
    let to_err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    match c.mishap {
        Mishap::RequesterErr { .. } => {
            if let Some(qa) = &c.qa
                && let Err(e) = qa.modify(&to_err, QpAttrMask::STATE)
            {
                violations.push(format!("{}: modify to ERR: {e}", c.name()));
            }
        }
        Mishap::ResponderErr { .. } => {
            c.responder_dead = true;
            if let Some(qb) = &c.qb
                && let Err(e) = qb.modify(&to_err, QpAttrMask::STATE)
            {
                violations.push(format!("{}: modify to ERR: {e}", c.name()));
            }
        }
        Mishap::DestroyResponder { .. } => {
            c.responder_dead = true;
            c.qb = None;
        }
        Mishap::DestroyRequester { .. } => {
            c.qa = None;
        }
        Mishap::DeregRemote { .. } => {
            c.responder_dead = true;
            c.remote = None;
        }
        _ => {}
    }
}

/// Closes device `dev` (a `DeviceClose`) through the engine's own path, what a driver thread
/// that panicked does ([`Sim::fail_device`], [`crate::verbs::Device::fail`]), and marks every
/// connection with a QP on it.
pub(super) fn close_device(
    sim: &mut Sim,
    node: &Node,
    dev: usize,
    now: Instant,
    conns: &mut [Conn],
) {
    for c in conns.iter_mut() {
        if c.req == dev || c.resp == dev {
            c.closed_at = Some(now);
        }
        if c.req == dev {
            c.req_closed = true;
        }
        if c.resp == dev {
            c.resp_closed = true;
            // Its receives flush (those of an SRQ: only the one a message in progress held).
            c.responder_dead = true;
        }
    }
    sim.fail_device(&node.dev, "closed by the mesh workload (DeviceClose)");
}

pub(super) fn post_op(c: &mut Conn, rng: &mut SimRng, now: Instant, violations: &mut Vec<String>) {
    let i = c.posted;
    let max = c.max;
    let slot = i % c.depth;
    let bad = c.mishap == Mishap::BadRkey { at: i };
    let mut kind = match c.transport {
        Transport::Rc => match rng.below(7) {
            0 => Kind::Send,
            1 => Kind::SendImm,
            2 => Kind::Write,
            3 => Kind::WriteImm,
            4 => Kind::Read,
            5 => Kind::Cas,
            _ => Kind::Faa,
        },
        Transport::Uc => match rng.below(4) {
            0 => Kind::Send,
            1 => Kind::SendImm,
            2 => Kind::Write,
            _ => Kind::WriteImm,
        },
        Transport::Ud => {
            if rng.chance(0.5) {
                Kind::Send
            } else {
                Kind::SendImm
            }
        }
    };
    if bad {
        kind = [Kind::Write, Kind::Read, Kind::Cas][rng.below(3) as usize];
    }
    let invalidates = c.mishap == Mishap::MwInvalidate { at: i };
    if invalidates {
        kind = Kind::SendInv;
    }
    let mut len = if matches!(kind, Kind::Cas | Kind::Faa) {
        8
    } else {
        draw_len(rng, max)
    };
    if bad && len == 0 {
        len = 1; // a zero-length operation checks no R_Key
    }
    let remote_off = match c.transport {
        Transport::Rc if matches!(kind, Kind::Cas | Kind::Faa) => ATOMIC_OFF,
        Transport::Rc => DATA_OFF + rng.below((max - len) as u64 + 1) as usize,
        Transport::Uc => i * max,
        Transport::Ud => 0,
    };
    let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
    let sg = if len == 0 {
        vec![]
    } else {
        vec![c.local.sge(slot * max.max(8), len as u32)]
    };
    if matches!(
        kind,
        Kind::Send | Kind::SendImm | Kind::SendInv | Kind::Write | Kind::WriteImm
    ) && len > 0
        && let Err(e) = c.local.write(slot * max.max(8), &data)
    {
        violations.push(format!("{}: op {i}: local write: {e}", c.name()));
    }
    let mut wr = SendWr::new(i as u64, WrOpcode::Send, sg);
    let mut op = Op {
        index: i,
        kind,
        len,
        remote_off,
        data: data.clone(),
        orig: 0,
        imm: rng.next_u64() as u32,
        bad,
        recv_index: None,
    };
    wr.imm_data = op.imm;
    let (raddr, rkey) = (c.raddr, c.rkey);
    wr.remote_addr = raddr + remote_off as u64;
    wr.rkey = rkey;
    match kind {
        Kind::Send => wr.opcode = WrOpcode::Send,
        Kind::SendImm => wr.opcode = WrOpcode::SendWithImm,
        Kind::SendInv => {
            // IBTA 10.6.7.2: SEND_WITH_INVALIDATE invalidates the window at the responder.
            // Fenced, so no earlier READ can be retried after it (a retried READ re-checks
            // its key).
            wr.opcode = WrOpcode::SendWithInv;
            wr.invalidate_rkey = rkey;
            wr.send_flags |= SendFlags::FENCE;
            c.responder_dead = true;
        }
        Kind::Write | Kind::WriteImm => {
            wr.opcode = if kind == Kind::Write {
                WrOpcode::RdmaWrite
            } else {
                WrOpcode::RdmaWriteWithImm
            };
            // A retried READ is answered from memory as it is then (IBTA allows it; rxe
            // does it), so a WRITE over a range an outstanding READ covers is fenced, as a
            // verbs application would.
            let overlaps = c.outstanding.iter().any(|o| {
                o.kind == Kind::Read
                    && o.remote_off < remote_off + len
                    && remote_off < o.remote_off + o.len
            });
            if overlaps {
                wr.send_flags |= SendFlags::FENCE;
            }
            if c.transport == Transport::Rc && !bad {
                c.model[remote_off..remote_off + len].copy_from_slice(&data);
            }
        }
        Kind::Read => {
            wr.opcode = WrOpcode::RdmaRead;
            if !bad {
                op.data = c.model[remote_off..remote_off + len].to_vec();
            }
        }
        Kind::Cas | Kind::Faa => {
            let mut cur = [0u8; 8];
            cur.copy_from_slice(&c.model[ATOMIC_OFF..ATOMIC_OFF + 8]);
            let cur = u64::from_ne_bytes(cur);
            op.orig = cur;
            let new = if kind == Kind::Faa {
                wr.opcode = WrOpcode::AtomicFetchAndAdd;
                wr.compare_add = rng.next_u64() >> rng.below(64);
                cur.wrapping_add(wr.compare_add)
            } else {
                wr.opcode = WrOpcode::AtomicCmpAndSwp;
                wr.compare_add = if rng.chance(0.5) { cur } else { rng.next_u64() };
                wr.swap = rng.next_u64();
                if wr.compare_add == cur { wr.swap } else { cur }
            };
            if !bad {
                c.model[ATOMIC_OFF..ATOMIC_OFF + 8].copy_from_slice(&new.to_ne_bytes());
            }
        }
    }
    if bad {
        // IBTA C9-...: a bad R_Key or an access past the MR is a remote access error. Fenced,
        // so no earlier READ is still waiting when the responder goes to ERR.
        wr.send_flags |= SendFlags::FENCE;
        if rng.chance(0.5) {
            wr.rkey ^= 1 + rng.below(0xff) as u32;
        } else {
            let mr_len = c.model.len() as u64;
            wr.remote_addr = if matches!(kind, Kind::Cas | Kind::Faa) {
                // Atomics stay 8-byte aligned (a misaligned one is refused at post time).
                raddr + mr_len.next_multiple_of(8) + 8 * rng.below(8)
            } else {
                raddr + mr_len - (len as u64).min(mr_len) + 1 + rng.below(64)
            };
        }
        c.responder_dead = true;
    }
    if c.transport == Transport::Ud {
        wr.ud =
            c.ah.as_ref()
                .zip(c.qb.as_ref())
                .map(|(ah, qb)| ah.dest(qb.qp_num(), c.qkey));
    }
    if kind.takes_recv() {
        op.recv_index = Some(c.recv_ops);
        c.recv_ops += 1;
        if c.transport == Transport::Rc {
            c.expect_recv.push_back(op.clone());
        } else {
            c.sent.push((op.clone(), 0));
        }
    }
    if matches!(kind, Kind::Write | Kind::WriteImm) && c.transport == Transport::Uc {
        c.sent.push((op.clone(), 0));
    }
    match kind {
        Kind::Write | Kind::WriteImm if !bad => c.touched.push((i, remote_off, len)),
        Kind::Cas | Kind::Faa if !bad => c.touched.push((i, ATOMIC_OFF, 8)),
        _ => {}
    }
    match c.mishap {
        Mishap::RequesterErr { at }
        | Mishap::DestroyRequester { at }
        | Mishap::ResponderErr { at }
        | Mishap::DestroyResponder { at }
        | Mishap::DeregRemote { at }
        | Mishap::DeviceClose { at, .. }
            if at == i =>
        {
            c.mishap_time = Some(now + Duration::from_nanos(rng.below(500_000)));
        }
        _ => {}
    }
    if let Some(qa) = &c.qa
        && let Err(e) = qa.post_send(&[wr])
    {
        violations.push(format!("{}: op {i}: post_send: {e}", c.name()));
    }
    c.outstanding.push_back(op);
    c.posted += 1;
}
