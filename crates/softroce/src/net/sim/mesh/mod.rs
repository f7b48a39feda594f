//! A mesh workload: several devices, many QPs each, RC, UC and UD connections between random
//! pairs of devices (loopback included), some receivers on a shared receive queue, and on
//! some connections a mishap (an error path), all checked against a reference model.
//!
//! The seed draws the devices (2–4), the connections (each: transport, requester and
//! responder device, SRQ or own receive queue, window depth, path MTU, starting PSNs), the
//! operations and the link faults. What the model checks, per transport:
//! - RC: every WR gets exactly one completion, in posting order; successful unless a mishap
//!   or the link's losses explain the status (below); READs return the model's bytes, atomics
//!   the model's original value; receive completions (SEND, SEND_WITH_IMM, WRITE_WITH_IMM)
//!   arrive in order, each with its length, immediate and bytes; at the end the responder's
//!   memory equals the model byte for byte (bytes an operation at or after the first failed
//!   one touched are left out) and no completion is left over.
//! - UC: every WR completes successfully, in order (UC has no ACKs). A lost packet loses its
//!   message only: every receive completion equals one message sent on that QP (length,
//!   immediate, bytes), no message completes more than twice (only a link duplicate can
//!   make a second one: UC starts a message at any FIRST/ONLY) and none twice on a link
//!   that does not duplicate; every WRITE's target region holds a prefix of its bytes and the
//!   fill pattern after it, all of it once its WRITE_WITH_IMM completed at the receiver.
//! - UD: every WR completes successfully, in order; every datagram received equals one sent
//!   on that QP (40-byte GRH, then its bytes; `src_qp` the sender's QPN; its immediate), none
//!   more than twice, none twice on a link that does not duplicate.
//! - SRQ: receives of several QPs of a device come from one queue; the completion's QPN
//!   names the connection, the `wr_id` the buffer.
//!
//! Mishaps (RC), with what kernel rxe gives and the model therefore demands:
//! - `BadRkey`: one READ/WRITE/atomic with a wrong R_Key or an address past the MR →
//!   `IBV_WC_REM_ACCESS_ERR` for it, every earlier WR successful, every later one
//!   `IBV_WC_WR_FLUSH_ERR`, the requester in ERR (and the responder: its posted receives
//!   flush).
//! - `RequesterErr`: the requester moved to ERR mid-transfer → completions successful up to
//!   some WR, `IBV_WC_WR_FLUSH_ERR` from there on.
//! - `DestroyRequester`: the requester destroyed mid-transfer → nothing more completes (no
//!   flush on destroy); what completed before it is in order and successful, the responder's
//!   memory equals the model up to the first operation not completed.
//! - `ResponderErr` / `DestroyResponder`: the responder moved to ERR or destroyed
//!   mid-transfer → the requester's retries run out: `IBV_WC_RETRY_EXC_ERR`, then flushes.
//! - `DeregRemote`: the responder's MR deregistered mid-transfer → the first READ/WRITE/atomic
//!   that reaches it ends `IBV_WC_REM_ACCESS_ERR`, the rest flushes.
//! - `RnrStarve`: the responder stops posting receives after a budget, `rnr_retry` 0–3 → the
//!   first message without a receive ends `IBV_WC_RNR_RETRY_EXC_ERR`, the rest flushes.
//! - `MwInvalidate`: the requester reaches the remote MR through a type 2 memory window the
//!   responder QP bound; one fenced SEND_WITH_INVALIDATE revokes it → its receive completes
//!   with `IBV_WC_WITH_INV` and the window's R_Key, every READ/WRITE/atomic before it
//!   succeeds, the first one after it ends `IBV_WC_REM_ACCESS_ERR`.
//! - `DeviceClose` (any transport; one run in four, on a connection without another
//!   mishap): the connection's requester or responder device closes mid-transfer, failing
//!   the way a device whose driver thread panicked does ([`Sim::fail_device`], i.e.
//!   [`crate::verbs::Device::fail`]; then nothing reaches it). Every connection with a QP
//!   on it is affected, whatever its own mishap: on the closed device every QP is in ERR
//!   and every outstanding WR ends `IBV_WC_WR_FLUSH_ERR` (its receives too; of an SRQ
//!   only the one a message in progress held); on the other devices an RC requester whose
//!   responder was there ends `IBV_WC_RETRY_EXC_ERR` for the first WR not acknowledged, no
//!   sooner than `retry_cnt` ACK timeouts after the close (on a link that neither loses nor
//!   reorders), UC/UD senders complete successfully (no ACK), and their other QPs stay in
//!   RTS. Whatever a requester completed successfully was delivered: its bytes are in the
//!   closed device's memory and its receive completed there. (rxe has no device-fatal
//!   flush: a removed rxe device has its objects destroyed by uverbs, and the CQ rings
//!   unmapped. The engine does what mlx5 does on an internal error, and what a QP in ERR
//!   does in the verbs spec.)
//!
//! On a link that loses (or corrupts, which the ICRC turns into loss) packets a failure may
//! also be `IBV_WC_RETRY_EXC_ERR` (the requester's retries ran out first, or the NAK that
//! would have told it was lost and the responder in ERR ignores the retries). Every failure
//! ends the connection: the requester QP must be in ERR, everything after it flushed. At
//! the end a requester that saw no failure (and was not moved to ERR) is in RTS, and so is
//! a responder no mishap reached.
//!
//! Replay: [`run`] of the same [`MeshConfig`] repeats the run exactly.
//!
//! Files: model.rs holds what a connection is and what is drawn for it, ops.rs the actions,
//! checks.rs the checks against the model; this file draws the run and drives it.

mod checks;
mod model;
mod ops;

use super::{Sim, SimFaults, SimRng, SimStats};
use crate::verbs::{
    AccessFlags, AhAttr, Gid, Mr, PathMtu, QpCap, QpInitAttr, QpType, RcConnect, RecvWr, Srq,
    SrqInitAttr, WcStatus,
};
use checks::{final_checks, on_recv, on_send};
use model::{
    Conn, ConnObjects, DATA_OFF, GRH, Mishap, Node, RC_RETRY_CNT, RC_TIMEOUT, SRQ_SLOTS, Transport,
    UC_MAX, UD_MAX,
};
use ops::{bind_window, close_device, fire_mishap, on_bind, post_op, post_ring};
use std::collections::{BTreeMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

/// Mesh workload parameters.
#[derive(Debug, Clone, Copy)]
pub struct MeshConfig {
    /// Seed for everything.
    pub seed: u64,
    /// Devices (2 or more).
    pub devices: usize,
    /// Connections (QP pairs).
    pub conns: usize,
    /// Operations per connection.
    pub ops: usize,
    /// Link faults.
    pub faults: SimFaults,
    /// Largest RC message in bytes (UC messages at most 16 KiB, UD at most 4096 B).
    pub max_size: usize,
    /// Whether some connections get a mishap (an error path).
    pub mishaps: bool,
    /// Virtual-time limit for the whole run.
    pub time_limit: Duration,
}

impl MeshConfig {
    /// Devices, connections and faults drawn from `seed`; `ops` operations per connection.
    pub fn from_seed(seed: u64, ops: usize) -> MeshConfig {
        let mut r = SimRng::new(seed.wrapping_mul(0x9e37_79b9).wrapping_add(3));
        MeshConfig {
            seed,
            devices: 2 + r.below(3) as usize,
            conns: 2 + r.below(7) as usize,
            ops,
            faults: SimFaults::from_seed(seed),
            max_size: 16 << 10,
            mishaps: true,
            // A run needs well under a second; a livelock shows within a minute.
            time_limit: Duration::from_secs(60),
        }
    }
}

/// What a mesh run did and whether the model agreed.
#[derive(Debug, Clone)]
pub struct MeshReport {
    /// Seed.
    pub seed: u64,
    /// Devices.
    pub devices: usize,
    /// One line per connection: transport, devices, SRQ, mishap and how it ended.
    pub conns: Vec<String>,
    /// Work completions checked (send and receive).
    pub completions: u64,
    /// Payload bytes of successful operations.
    pub bytes: u64,
    /// Link counters.
    pub link: SimStats,
    /// Virtual time at the end, ns.
    pub virtual_ns: u64,
    /// How each connection ended, for coverage.
    pub ends: Vec<ConnEnd>,
    /// Every disagreement with the model (empty = pass).
    pub violations: Vec<String>,
}

/// How one connection of a mesh run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnEnd {
    /// Transport.
    pub qp_type: QpType,
    /// The responder took its receives from an SRQ.
    pub srq: bool,
    /// Requester and responder on the same device.
    pub loopback: bool,
    /// The mishap drawn: `none`, `bad_rkey`, `requester_err`, `responder_err`,
    /// `destroy_responder`, `dereg_remote`, `rnr_starve`, `mw_invalidate`,
    /// `destroy_requester` or `device_close`.
    pub mishap: &'static str,
    /// The status of the first failed WR (the rest flushed), if one failed.
    pub failed: Option<WcStatus>,
    /// Send completions.
    pub ops_done: usize,
    /// Successful receive completions.
    pub recvs: usize,
}

impl MeshReport {
    /// True when the model agreed on everything.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

fn fill_byte(conn: usize, off: usize) -> u8 {
    (off.wrapping_mul(7) ^ conn.wrapping_mul(0x3b) ^ 0xa5) as u8
}

fn ip_of(n: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1 + n as u8))
}

/// Runs the mesh workload. Never panics on a transport misbehaviour: every disagreement is a
/// violation in the report.
pub fn run(cfg: &MeshConfig) -> MeshReport {
    let mut rng = SimRng::new(cfg.seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x6d65_7368);
    let mut sim = Sim::new(cfg.seed, cfg.faults);
    let mut violations = Vec::new();
    // A link that loses packets (bit flips are losses after the ICRC) can use up retry_cnt;
    // so can one that reorders or duplicates them when a responder went to ERR over a bad
    // key, and then answers no retry: its NAK may arrive before the response to an earlier
    // READ/atomic and is then ignored (rxe `check_psn` → COMPST_ERROR_RETRY), or it answers
    // a duplicate READ the requester has already completed (a stale NAK, dropped).
    let lossy = cfg.faults.loss > 0.0 || cfg.faults.corrupt > 0.0;
    let reorders = cfg.faults.reorder > 0.0 || cfg.faults.dup > 0.0;
    let dup_copies = if cfg.faults.dup > 0.0 { 2 } else { 1 };
    let mut report = MeshReport {
        seed: cfg.seed,
        devices: cfg.devices.max(2),
        conns: Vec::new(),
        completions: 0,
        bytes: 0,
        link: SimStats::default(),
        virtual_ns: 0,
        ends: Vec::new(),
        violations: Vec::new(),
    };
    let ndev = cfg.devices.max(2);
    let max_rc = cfg.max_size.max(8);
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;

    // Devices, each with a PD, a send CQ and a receive CQ every QP of the device shares.
    let mut nodes = Vec::new();
    for n in 0..ndev {
        let dev = sim.add_device(&format!("sim{n}"), ip_of(n));
        let made = (|| -> crate::verbs::Result<Node> {
            let pd = dev.alloc_pd()?;
            Ok(Node {
                send_cq: dev.create_cq(8192)?,
                recv_cq: dev.create_cq(8192)?,
                pd,
                dev: dev.clone(),
                srq: None,
                srq_slot: 0,
            })
        })();
        match made {
            Ok(node) => nodes.push(node),
            Err(e) => {
                report.violations.push(format!("setup device {n}: {e}"));
                return report;
            }
        }
    }

    // Connections.
    let mut conns: Vec<Conn> = Vec::new();
    let mut plans = Vec::new();
    for id in 0..cfg.conns.max(1) {
        let transport = match rng.below(10) {
            0..=5 => Transport::Rc,
            6..=7 => Transport::Uc,
            _ => Transport::Ud,
        };
        let req = rng.below(ndev as u64) as usize;
        let resp = if rng.chance(0.1) {
            req // loopback through the link
        } else {
            (req + 1 + rng.below(ndev as u64 - 1) as usize) % ndev
        };
        let on_srq = rng.chance(0.35);
        let max = match transport {
            Transport::Rc => max_rc,
            Transport::Uc => max_rc.min(UC_MAX),
            Transport::Ud => max_rc.min(UD_MAX),
        };
        let at = rng.below(cfg.ops.max(1) as u64) as usize;
        let mishap = if !cfg.mishaps || !rng.chance(0.4) {
            Mishap::None
        } else if transport != Transport::Rc {
            Mishap::RequesterErr { at }
        } else {
            match rng.below(7) {
                0 => Mishap::BadRkey { at },
                1 => Mishap::RequesterErr { at },
                2 => Mishap::ResponderErr { at },
                3 => Mishap::DestroyResponder { at },
                4 => Mishap::DeregRemote { at },
                5 => Mishap::MwInvalidate { at },
                _ => Mishap::RnrStarve {
                    // About 3 in 7 RC operations take a receive: a budget below that runs out.
                    budget: rng.below(cfg.ops as u64 / 3 + 1) as usize,
                },
            }
        };
        // Half the RC requesters moved to ERR are destroyed instead (drawn apart from the main
        // stream, which other seeds' regressions depend on).
        let mishap = match mishap {
            Mishap::RequesterErr { at }
                if transport == Transport::Rc
                    && SimRng::new(cfg.seed ^ (id as u64) << 32 ^ 0xde57).chance(0.5) =>
            {
                Mishap::DestroyRequester { at }
            }
            m => m,
        };
        // A starved responder has its own receive queue (an SRQ is shared with others).
        let on_srq = on_srq && !matches!(mishap, Mishap::RnrStarve { .. });
        plans.push((id, transport, req, resp, on_srq, max, mishap));
    }
    // In one run in four, one device closes mid-transfer: the mishap of a connection that
    // has none, closing its requester's or its responder's device (drawn apart from the main
    // stream, as above, with a salt under which no seed of tests/sim_mesh.rs's
    // `soak_regressions` draws one: they keep replaying the runs they were kept for).
    let mut closer = SimRng::new(cfg.seed ^ 0xc105_ed00_002a);
    if cfg.mishaps && closer.chance(0.25) {
        let free: Vec<usize> = (0..plans.len())
            .filter(|&k| plans[k].6 == Mishap::None)
            .collect();
        if !free.is_empty() {
            let p = &mut plans[free[closer.below(free.len() as u64) as usize]];
            let dev = if closer.chance(0.5) { p.2 } else { p.3 };
            let at = closer.below(cfg.ops.max(1) as u64) as usize;
            p.6 = Mishap::DeviceClose { at, dev };
        }
    }
    for (n, node) in nodes.iter_mut().enumerate() {
        let slot = plans
            .iter()
            .filter(|p| p.3 == n && p.4)
            .map(|p| p.5 + GRH)
            .max();
        if let Some(slot) = slot {
            let made = (|| -> crate::verbs::Result<(Srq, Mr)> {
                let srq = node.pd.create_srq(&SrqInitAttr {
                    max_wr: 1024,
                    max_sge: 1,
                    srq_limit: 0,
                })?;
                let area = node.pd.reg_mr(SRQ_SLOTS * slot, AccessFlags::LOCAL_WRITE)?;
                for s in 0..SRQ_SLOTS {
                    srq.post_recv(&[RecvWr {
                        wr_id: s as u64,
                        sg_list: vec![area.sge(s * slot, slot as u32)],
                    }])?;
                }
                Ok((srq, area))
            })();
            match made {
                Ok(x) => {
                    node.srq = Some(x);
                    node.srq_slot = slot;
                }
                Err(e) => {
                    report
                        .violations
                        .push(format!("setup SRQ on device {n}: {e}"));
                    return report;
                }
            }
        }
    }
    let mut by_qpn: BTreeMap<(usize, u32), (usize, bool)> = BTreeMap::new();
    for (id, transport, req, resp, on_srq, max, mishap) in plans {
        let depth = 1 + rng.below(8) as usize;
        let ring_slots = if matches!(mishap, Mishap::RnrStarve { .. }) {
            depth + 1
        } else {
            depth.max(2 + rng.below(6) as usize)
        };
        let slot = max + GRH;
        let qp_type = match transport {
            Transport::Rc => QpType::Rc,
            Transport::Uc => QpType::Uc,
            Transport::Ud => QpType::Ud,
        };
        let remote_len = match transport {
            Transport::Rc => DATA_OFF + max,
            Transport::Uc => cfg.ops.max(1) * max,
            Transport::Ud => 0,
        };
        let made = (|| -> crate::verbs::Result<ConnObjects> {
            let cap = QpCap {
                max_send_wr: depth as u32 * 2,
                max_recv_wr: 256,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            };
            let qa = nodes[req].pd.create_qp(&QpInitAttr {
                qp_type,
                send_cq: &nodes[req].send_cq,
                recv_cq: &nodes[req].recv_cq,
                cap,
                sq_sig_all: true,
                srq: None,
            })?;
            let srq = if on_srq {
                nodes[resp].srq.as_ref().map(|(s, _)| s)
            } else {
                None
            };
            let qb = nodes[resp].pd.create_qp(&QpInitAttr {
                qp_type,
                send_cq: &nodes[resp].send_cq,
                recv_cq: &nodes[resp].recv_cq,
                cap,
                sq_sig_all: true,
                srq,
            })?;
            let local = nodes[req].pd.reg_mr(depth * max.max(8), all)?;
            let remote = if remote_len > 0 {
                Some(
                    nodes[resp]
                        .pd
                        .reg_mr(remote_len, all | AccessFlags::MW_BIND)?,
                )
            } else {
                None
            };
            let ring = if on_srq {
                None
            } else {
                Some(
                    nodes[resp]
                        .pd
                        .reg_mr(ring_slots * slot, AccessFlags::LOCAL_WRITE)?,
                )
            };
            Ok((qa, qb, local, remote, ring))
        })();
        let (qa, qb, local, remote, ring) = match made {
            Ok(x) => x,
            Err(e) => {
                report.violations.push(format!("setup conn {id}: {e}"));
                return report;
            }
        };
        let mut model = vec![0u8; remote_len];
        if transport == Transport::Uc {
            for (off, b) in model.iter_mut().enumerate() {
                *b = fill_byte(id, off);
            }
            if let Some(r) = &remote
                && let Err(e) = r.write(0, &model)
            {
                violations.push(format!("conn {id}: fill: {e}"));
            }
        }
        let near_wrap = |r: &mut SimRng| {
            if r.chance(0.4) {
                0x00ff_ffff - r.below(16) as u32
            } else {
                r.below(1 << 24) as u32
            }
        };
        let (psn_a, psn_b) = (near_wrap(&mut rng), near_wrap(&mut rng));
        let mtu = [
            PathMtu::Mtu256,
            PathMtu::Mtu512,
            PathMtu::Mtu1024,
            PathMtu::Mtu2048,
            PathMtu::Mtu4096,
        ][rng.below(5) as usize];
        let qkey = (rng.next_u64() as u32) & 0x7fff_ffff;
        let mut ah = None;
        let connected = match transport {
            Transport::Ud => qa.ready_ud(qkey, psn_a).and_then(|_| {
                qb.ready_ud(qkey, psn_b)?;
                ah = Some(
                    nodes[req]
                        .pd
                        .create_ah(&AhAttr::roce_v2(Gid::from_ip(ip_of(resp))))?,
                );
                Ok(())
            }),
            _ => {
                let mut to_b = RcConnect::new(qb.qp_num(), Gid::from_ip(ip_of(resp)), psn_b, psn_a);
                let mut to_a = RcConnect::new(qa.qp_num(), Gid::from_ip(ip_of(req)), psn_a, psn_b);
                let rnr_retry = match mishap {
                    Mishap::RnrStarve { .. } => rng.below(4) as u8,
                    _ => 7,
                };
                for c in [&mut to_b, &mut to_a] {
                    c.path_mtu = mtu;
                    c.timeout = RC_TIMEOUT;
                    c.retry_cnt = RC_RETRY_CNT;
                    c.min_rnr_timer = 1 + rng.below(4) as u8;
                    c.max_rd_atomic = 4;
                    c.max_dest_rd_atomic = 4;
                    c.rnr_retry = rnr_retry;
                }
                qa.connect_rc(&to_b).and_then(|_| qb.connect_rc(&to_a))
            }
        };
        if let Err(e) = connected {
            report.violations.push(format!("connect conn {id}: {e}"));
            return report;
        }
        by_qpn.insert((req, qa.qp_num()), (id, false));
        by_qpn.insert((resp, qb.qp_num()), (id, true));
        let mut c = Conn {
            id,
            transport,
            req,
            resp,
            on_srq,
            mishap,
            qa: Some(qa),
            qb: Some(qb),
            local,
            raddr: remote.as_ref().map_or(0, Mr::addr),
            rkey: remote.as_ref().map_or(0, Mr::rkey),
            mw: None,
            mw_bound: false,
            remote,
            ring,
            slot,
            max,
            depth,
            ah,
            qkey,
            model,
            outstanding: VecDeque::new(),
            posted: 0,
            done: 0,
            recv_ops: 0,
            recvs_posted: 0,
            expect_recv: VecDeque::new(),
            sent: Vec::new(),
            touched: Vec::new(),
            pending_recvs: VecDeque::new(),
            failed: None,
            mishap_time: None,
            mishap_fired: None,
            responder_dead: false,
            flushed_recvs: 0,
            recvs_ok: 0,
            recv_failed: None,
            ok_count: 0,
            req_closed: false,
            resp_closed: false,
            closed_at: None,
        };
        if !on_srq {
            for s in 0..ring_slots {
                post_ring(&mut c, s, &mut violations);
            }
        }
        if matches!(mishap, Mishap::MwInvalidate { .. }) {
            bind_window(&mut c, &nodes[resp].pd, &mut violations);
        }
        conns.push(c);
    }

    let end = sim.now() + cfg.time_limit;
    let ops = cfg.ops;
    loop {
        if !violations.is_empty() || conns.iter().all(|c| c.finished(ops)) {
            break;
        }
        let now = sim.now();
        // Timed mishaps.
        let mut closing = None;
        for c in conns.iter_mut() {
            if c.mishap_time.is_some_and(|t| t <= now) && c.mishap_fired.is_none() {
                c.mishap_time = None;
                c.mishap_fired = Some(now);
                fire_mishap(c, &mut violations);
                if let Mishap::DeviceClose { dev, .. } = c.mishap {
                    closing = Some(dev);
                }
            }
        }
        if let Some(dev) = closing {
            close_device(&mut sim, &nodes[dev], dev, now, &mut conns);
        }
        // New operations, while each window allows.
        for c in conns.iter_mut() {
            while !c.stopped()
                && (c.mw.is_none() || c.mw_bound)
                && c.posted < ops
                && c.posted - c.done < c.depth
            {
                post_op(c, &mut rng, now, &mut violations);
            }
        }
        // Receives due.
        for c in conns.iter_mut() {
            while c.pending_recvs.front().is_some_and(|(t, _)| *t <= now) {
                if let Some((_, s)) = c.pending_recvs.pop_front() {
                    post_ring(c, s, &mut violations);
                }
            }
        }
        // Completions: receives first (they precede the ACK that completes the send).
        let mut progressed = false;
        for (n, node) in nodes.iter().enumerate() {
            while let Some(wc) = node.recv_cq.poll_one() {
                progressed = true;
                report.completions += 1;
                match by_qpn.get(&(n, wc.qp_num)) {
                    Some(&(ci, true)) => {
                        on_recv(
                            &mut conns[ci],
                            node,
                            &wc,
                            dup_copies,
                            &mut rng,
                            now,
                            &mut violations,
                        );
                    }
                    _ => violations.push(format!(
                        "device {n}: receive completion {wc:?} of no responder QP"
                    )),
                }
            }
            while let Some(wc) = node.send_cq.poll_one() {
                progressed = true;
                report.completions += 1;
                match by_qpn.get(&(n, wc.qp_num)) {
                    Some(&(ci, true)) => on_bind(&mut conns[ci], &wc, &mut violations),
                    Some(&(ci, false)) => on_send(
                        &mut conns[ci],
                        &wc,
                        now,
                        (lossy, reorders),
                        &mut report.bytes,
                        &mut violations,
                    ),
                    _ => violations.push(format!(
                        "device {n}: send completion {wc:?} of no requester QP"
                    )),
                }
            }
        }
        if !violations.is_empty() {
            break;
        }
        if !progressed && !sim.step() {
            let next = conns
                .iter()
                .flat_map(|c| {
                    c.pending_recvs
                        .front()
                        .map(|(t, _)| *t)
                        .into_iter()
                        .chain(c.mishap_time)
                })
                .min();
            match next {
                Some(t) => {
                    let d = t.since(sim.now());
                    sim.advance(d);
                }
                None => {
                    let stuck: Vec<String> = conns
                        .iter()
                        .filter(|c| !c.finished(ops))
                        .map(|c| {
                            format!(
                                "{} {:?}: {} of {} posted done",
                                c.name(),
                                c.mishap,
                                c.done,
                                c.posted
                            )
                        })
                        .collect();
                    if stuck.is_empty() {
                        break; // finished in this round (a requester destroyed just now)
                    }
                    violations.push(format!("stalled: {stuck:?}"));
                }
            }
        }
        if sim.now() > end {
            let busy: Vec<String> = conns
                .iter()
                .filter(|c| !c.finished(ops))
                .map(|c| {
                    format!(
                        "{} {:?}: {} of {} posted done",
                        c.name(),
                        c.mishap,
                        c.done,
                        c.posted
                    )
                })
                .collect();
            violations.push(format!("virtual time limit reached: {busy:?}"));
        }
    }

    if violations.is_empty() {
        // Let stray retransmissions and late datagrams settle, then check what arrived.
        sim.run_until(Duration::from_millis(50), || false);
        let now = sim.now();
        for (n, node) in nodes.iter().enumerate() {
            while let Some(wc) = node.recv_cq.poll_one() {
                report.completions += 1;
                match by_qpn.get(&(n, wc.qp_num)) {
                    Some(&(ci, true)) => on_recv(
                        &mut conns[ci],
                        node,
                        &wc,
                        dup_copies,
                        &mut rng,
                        now,
                        &mut violations,
                    ),
                    _ => violations.push(format!("device {n}: late receive completion {wc:?}")),
                }
            }
            if let Some(wc) = node.send_cq.poll_one() {
                violations.push(format!("device {n}: leftover send completion {wc:?}"));
            }
        }
        for c in &conns {
            final_checks(c, &mut violations);
        }
    }
    report.conns = conns
        .iter()
        .map(|c| {
            format!(
                "{} depth {} {:?}: {} ops done{}",
                c.name(),
                c.depth,
                c.mishap,
                c.done,
                match c.failed {
                    Some((i, s)) => format!(", op {i} ended {s}, the rest flushed"),
                    None => String::new(),
                }
            )
        })
        .collect();
    report.ends = conns
        .iter()
        .map(|c| ConnEnd {
            qp_type: match c.transport {
                Transport::Rc => QpType::Rc,
                Transport::Uc => QpType::Uc,
                Transport::Ud => QpType::Ud,
            },
            srq: c.on_srq,
            loopback: c.req == c.resp,
            mishap: c.mishap.name(),
            failed: c.failed.map(|(_, s)| s),
            ops_done: c.done,
            recvs: c.recvs_ok,
        })
        .collect();
    report.link = sim.stats();
    report.virtual_ns = sim.now().as_nanos();
    report.violations.extend(violations);
    // Objects go in order: QPs before the SRQs and CQs they use.
    drop(conns);
    drop(nodes);
    report
}
