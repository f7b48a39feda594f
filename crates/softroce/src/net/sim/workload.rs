//! A random RC workload checked against a reference model, on the simulated network.
//!
//! Two devices run `ops` random operations (SEND, WRITE, WRITE_WITH_IMM, READ,
//! COMPARE_AND_SWAP, FETCH_AND_ADD; 0 B to `max_size` bytes; starting PSNs drawn from the
//! seed, often just below 2^24) with at most `depth` outstanding. The model applies each
//! operation to a copy of the remote memory in posting order, which RC's in-order execution
//! makes the truth. Checked: every WR gets exactly one completion, in order, successful; every
//! receive completion (SEND, WRITE_WITH_IMM) has the right length, immediate and bytes; READs
//! return the model's bytes; atomics return the model's original values; at the end remote
//! memory equals the model and no completion is left over. Some receives are posted late to
//! draw RNR NAKs.

use super::{Sim, SimFaults, SimRng, SimStats};
use crate::transport::Counters;
use crate::verbs::{
    AccessFlags, Cq, Gid, Mr, PathMtu, QpCap, QpInitAttr, QpType, RcConnect, RecvWr, SendWr, Wc,
    WcFlags, WcOpcode, WcStatus, WrOpcode,
};
use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

/// Workload parameters.
#[derive(Debug, Clone, Copy)]
pub struct WorkloadConfig {
    /// Seed for everything (faults too, when `faults` came from it).
    pub seed: u64,
    /// Operations to run.
    pub ops: usize,
    /// Link faults.
    pub faults: SimFaults,
    /// Path MTU; `None` draws one from the seed.
    pub mtu: Option<PathMtu>,
    /// Largest message in bytes.
    pub max_size: usize,
    /// Most operations outstanding.
    pub depth: usize,
    /// Virtual-time limit for the whole run.
    pub time_limit: Duration,
}

impl WorkloadConfig {
    /// `ops` operations with every fault parameter drawn from `seed`.
    pub fn from_seed(seed: u64, ops: usize) -> WorkloadConfig {
        WorkloadConfig {
            seed,
            ops,
            faults: SimFaults::from_seed(seed),
            mtu: None,
            max_size: 1 << 20,
            depth: 8,
            time_limit: Duration::from_secs(600),
        }
    }
}

/// What a run did and whether the model agreed.
#[derive(Debug, Clone)]
pub struct Report {
    /// Seed.
    pub seed: u64,
    /// Operations completed.
    pub ops_done: usize,
    /// Path MTU used.
    pub mtu: PathMtu,
    /// Link counters.
    pub link: SimStats,
    /// Requester device counters.
    pub requester: Counters,
    /// Responder device counters.
    pub responder: Counters,
    /// Virtual time at the end, ns.
    pub virtual_ns: u64,
    /// Payload bytes moved by completed operations.
    pub bytes: u64,
    /// Every disagreement with the model (empty = pass).
    pub violations: Vec<String>,
    /// The operation that ended with `IBV_WC_RETRY_EXC_ERR`, if the link's losses used up
    /// `retry_cnt` (legitimate under heavy loss; the run then checks that every later WR was
    /// flushed and that memory no later operation touched still equals the model).
    pub retry_exhausted: Option<usize>,
}

impl Report {
    /// True when the model agreed on everything.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send,
    Write,
    WriteImm,
    Read,
    Cas,
    Faa,
}

#[derive(Debug)]
struct Op {
    kind: Kind,
    len: usize,
    remote_off: usize,
    /// READ: expected bytes. SEND/WRITE_IMM: the bytes the receiver must see.
    expect: Vec<u8>,
    /// Atomics: the original value expected back.
    orig: u64,
    imm: u32,
}

const ATOMIC_OFF: usize = 0;
const DATA_OFF: usize = 64;

fn draw_len(r: &mut SimRng, max: usize) -> usize {
    let len = match r.below(100) {
        0..=9 => 0,
        10..=49 => 1 + r.below(64) as usize,
        50..=79 => 65 + r.below(8128) as usize,
        80..=94 => 8193 + r.below(57_344) as usize,
        _ => r.below(max as u64 + 1) as usize,
    };
    len.min(max)
}

fn wait_wc(cq: &Cq) -> Option<Wc> {
    cq.poll_one()
}

/// Runs the workload. Never panics on a transport misbehaviour: every disagreement is a
/// violation in the report.
pub fn run(cfg: &WorkloadConfig) -> Report {
    let mut rng = SimRng::new(cfg.seed.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let mtu = cfg.mtu.unwrap_or_else(|| {
        [
            PathMtu::Mtu256,
            PathMtu::Mtu512,
            PathMtu::Mtu1024,
            PathMtu::Mtu2048,
            PathMtu::Mtu4096,
        ][rng.below(5) as usize]
    });
    let mut sim = Sim::new(cfg.seed, cfg.faults);
    let ip_a = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
    let ip_b = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2));
    let a = sim.add_device("simA", ip_a);
    let b = sim.add_device("simB", ip_b);
    let mut violations = Vec::new();
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let depth = cfg.depth.max(1);
    let max = cfg.max_size.max(8);
    let setup = || -> crate::verbs::Result<_> {
        let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
        let (ca, cb) = (a.create_cq(4096)?, b.create_cq(4096)?);
        let cap = QpCap {
            max_send_wr: depth as u32 * 2,
            max_recv_wr: 1024,
            ..QpCap::default()
        };
        let qa = pa.create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &ca,
            recv_cq: &ca,
            cap,
            sq_sig_all: true,
            srq: None,
        })?;
        let qb = pb.create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cb,
            recv_cq: &cb,
            cap,
            sq_sig_all: true,
            srq: None,
        })?;
        let local = pa.reg_mr(depth * max, all)?;
        let remote = pb.reg_mr(DATA_OFF + max, all)?;
        let recv_area = pb.reg_mr(depth * max, all)?;
        Ok((pa, pb, ca, cb, qa, qb, local, remote, recv_area))
    };
    let (_pa, _pb, ca, cb, qa, qb, local, remote, recv_area) = match setup() {
        Ok(x) => x,
        Err(e) => {
            violations.push(format!("setup: {e}"));
            return Report {
                seed: cfg.seed,
                ops_done: 0,
                mtu,
                link: sim.stats(),
                requester: a.counters(),
                responder: b.counters(),
                virtual_ns: 0,
                bytes: 0,
                violations,
                retry_exhausted: None,
            };
        }
    };
    let near_wrap = |r: &mut SimRng| {
        if r.chance(0.4) {
            0x00ff_ffff - r.below(16) as u32
        } else {
            r.below(1 << 24) as u32
        }
    };
    let (psn_a, psn_b) = (near_wrap(&mut rng), near_wrap(&mut rng));
    let mut to_b = RcConnect::new(qb.qp_num(), Gid::from_ip(ip_b), psn_b, psn_a);
    let mut to_a = RcConnect::new(qa.qp_num(), Gid::from_ip(ip_a), psn_a, psn_b);
    for c in [&mut to_b, &mut to_a] {
        c.path_mtu = mtu;
        c.timeout = 8; // ≈ 1 ms of virtual time
        c.min_rnr_timer = 1 + rng.below(4) as u8;
        c.max_rd_atomic = 4;
        c.max_dest_rd_atomic = 4;
    }
    if let Err(e) = qa.connect_rc(&to_b).and_then(|_| qb.connect_rc(&to_a)) {
        violations.push(format!("connect: {e}"));
    }

    let mut model = vec![0u8; DATA_OFF + max];
    let mut ops: VecDeque<Op> = VecDeque::new();
    let mut pending_recvs: VecDeque<(crate::transport::Instant, RecvWr)> = VecDeque::new();
    let (mut posted, mut done, mut bytes) = (0usize, 0usize, 0u64);
    let mut exhausted: Option<usize> = None;
    // Byte ranges of the remote MR written by each operation (for the exhaustion case).
    let mut touched: Vec<(usize, usize, usize)> = Vec::new();
    let end = sim.now() + cfg.time_limit;

    while done < cfg.ops && violations.is_empty() && exhausted.is_none() {
        // Post new operations while the window allows.
        while posted < cfg.ops && posted - done < depth {
            let slot = posted % depth;
            let kind = match rng.below(6) {
                0 => Kind::Send,
                1 => Kind::Write,
                2 => Kind::WriteImm,
                3 => Kind::Read,
                4 => Kind::Cas,
                _ => Kind::Faa,
            };
            let len = if matches!(kind, Kind::Cas | Kind::Faa) {
                8
            } else {
                draw_len(&mut rng, max)
            };
            let remote_off = DATA_OFF + rng.below((max - len) as u64 + 1) as usize;
            let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            let lsge = local.sge(slot * max, len as u32);
            let sg = if len == 0 { vec![] } else { vec![lsge] };
            let mut wr = SendWr::new(posted as u64, WrOpcode::Send, sg);
            let mut op = Op {
                kind,
                len,
                remote_off,
                expect: Vec::new(),
                orig: 0,
                imm: 0,
            };
            if matches!(kind, Kind::Send | Kind::Write | Kind::WriteImm)
                && len > 0
                && let Err(e) = local.write(slot * max, &data)
            {
                violations.push(format!("op {posted}: local write: {e}"));
            }
            let recv_needed = match kind {
                Kind::Send => {
                    wr.opcode = WrOpcode::Send;
                    op.expect = data.clone();
                    true
                }
                Kind::Write | Kind::WriteImm => {
                    wr.opcode = if kind == Kind::Write {
                        WrOpcode::RdmaWrite
                    } else {
                        WrOpcode::RdmaWriteWithImm
                    };
                    // A retried READ is answered from memory as it is then (IBTA allows it;
                    // rxe does it), so a WRITE over a range an outstanding READ covers must
                    // be fenced, as a verbs application would.
                    let overlaps = ops.iter().any(|o| {
                        o.kind == Kind::Read
                            && o.remote_off < remote_off + len
                            && remote_off < o.remote_off + o.len
                    });
                    if overlaps {
                        wr.send_flags |= crate::verbs::SendFlags::FENCE;
                    }
                    wr.remote_addr = remote.addr() + remote_off as u64;
                    wr.rkey = remote.rkey();
                    op.imm = rng.next_u64() as u32;
                    wr.imm_data = op.imm;
                    model[remote_off..remote_off + len].copy_from_slice(&data);
                    op.expect = data.clone();
                    kind == Kind::WriteImm
                }
                Kind::Read => {
                    wr.opcode = WrOpcode::RdmaRead;
                    wr.remote_addr = remote.addr() + remote_off as u64;
                    wr.rkey = remote.rkey();
                    op.expect = model[remote_off..remote_off + len].to_vec();
                    false
                }
                Kind::Cas | Kind::Faa => {
                    let mut cur = [0u8; 8];
                    cur.copy_from_slice(&model[ATOMIC_OFF..ATOMIC_OFF + 8]);
                    let cur = u64::from_ne_bytes(cur);
                    op.orig = cur;
                    wr.remote_addr = remote.addr() + ATOMIC_OFF as u64;
                    wr.rkey = remote.rkey();
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
                    model[ATOMIC_OFF..ATOMIC_OFF + 8].copy_from_slice(&new.to_ne_bytes());
                    false
                }
            };
            if recv_needed {
                let sg = if kind == Kind::Send && len > 0 {
                    vec![recv_area.sge(slot * max, len as u32)]
                } else {
                    vec![]
                };
                let rwr = RecvWr {
                    wr_id: posted as u64,
                    sg_list: sg,
                };
                // One receive in ten comes late, to draw RNR NAKs.
                let delay = if rng.chance(0.1) {
                    Duration::from_micros(rng.below(3000))
                } else {
                    Duration::ZERO
                };
                pending_recvs.push_back((sim.now() + delay, rwr));
            }
            if let Err(e) = qa.post_send(&[wr]) {
                violations.push(format!("op {posted}: post_send: {e}"));
            }
            match op.kind {
                Kind::Write | Kind::WriteImm => touched.push((posted, op.remote_off, op.len)),
                Kind::Cas | Kind::Faa => touched.push((posted, ATOMIC_OFF, 8)),
                _ => {}
            }
            ops.push_back(op);
            posted += 1;
        }
        // Post receives that are due, in order.
        while pending_recvs.front().is_some_and(|(t, _)| *t <= sim.now()) {
            if let Some((_, r)) = pending_recvs.pop_front()
                && let Err(e) = qb.post_recv(&[r])
            {
                violations.push(format!("post_recv: {e}"));
            }
        }
        // Check completions.
        let mut progressed = false;
        while let Some(wc) = wait_wc(&ca) {
            progressed = true;
            let Some(op) = ops.pop_front() else {
                violations.push(format!("extra completion {wc:?}"));
                break;
            };
            let i = done;
            done += 1;
            if wc.wr_id == i as u64 && wc.status == WcStatus::RetryExcErr {
                exhausted = Some(i);
                break;
            }
            if wc.wr_id != i as u64 || wc.status != WcStatus::Success {
                violations.push(format!(
                    "op {i} ({:?}, {} B): completion {:?} status {}",
                    op.kind, op.len, wc.wr_id, wc.status
                ));
                break;
            }
            bytes += op.len as u64;
            let slot = i % depth;
            match op.kind {
                Kind::Read => {
                    let mut got = vec![0u8; op.len];
                    let _ = local.read(slot * max, &mut got);
                    if got != op.expect {
                        violations.push(format!(
                            "op {i}: READ of {} B at {} returned other bytes",
                            op.len, op.remote_off
                        ));
                    }
                }
                Kind::Cas | Kind::Faa => {
                    let mut got = [0u8; 8];
                    let _ = local.read(slot * max, &mut got);
                    let got = u64::from_ne_bytes(got);
                    if got != op.orig {
                        violations.push(format!(
                            "op {i}: {:?} returned {got:#x}, model {:#x}",
                            op.kind, op.orig
                        ));
                    }
                }
                Kind::Send | Kind::WriteImm => match wait_wc(&cb) {
                    None => {
                        violations.push(format!("op {i}: no receive completion at the responder"))
                    }
                    Some(r) => {
                        let want_op = if op.kind == Kind::Send {
                            WcOpcode::Recv
                        } else {
                            WcOpcode::RecvRdmaWithImm
                        };
                        if r.wr_id != i as u64
                            || r.status != WcStatus::Success
                            || r.opcode != want_op
                            || r.byte_len as usize != op.len
                        {
                            violations.push(format!("op {i}: receive completion {r:?}"));
                        }
                        if op.kind == Kind::WriteImm
                            && (!r.wc_flags.contains(WcFlags::WITH_IMM) || r.imm_data != op.imm)
                        {
                            violations.push(format!(
                                "op {i}: immediate {:#x}, sent {:#x}",
                                r.imm_data, op.imm
                            ));
                        }
                        if op.kind == Kind::Send {
                            let mut got = vec![0u8; op.len];
                            let _ = recv_area.read(slot * max, &mut got);
                            if got != op.expect {
                                violations.push(format!(
                                    "op {i}: SEND of {} B delivered other bytes",
                                    op.len
                                ));
                            }
                        }
                    }
                },
                Kind::Write => {}
            }
        }
        if !progressed && !sim.step() {
            match pending_recvs.front() {
                Some((t, _)) => {
                    let d = t.since(sim.now());
                    sim.advance(d);
                }
                None => violations.push(format!("stalled after {done} of {} operations", cfg.ops)),
            }
        }
        if sim.now() > end {
            violations.push(format!(
                "virtual time limit reached after {done} of {} operations",
                cfg.ops
            ));
        }
    }
    if let (Some(i), true) = (exhausted, violations.is_empty()) {
        // Every WR after the failed one is flushed, in order, and the QP is in ERR.
        for j in i + 1..posted {
            let wc = loop {
                if let Some(wc) = ca.poll_one() {
                    break Some(wc);
                }
                if !sim.step() {
                    break None;
                }
            };
            match wc {
                Some(wc) if wc.wr_id == j as u64 && wc.status == WcStatus::WrFlushErr => {}
                other => violations.push(format!("after retry exhaustion, op {j}: {other:?}")),
            }
        }
        if qa.state() != crate::verbs::QpState::Err {
            violations.push("QP not in ERR after IBV_WC_RETRY_EXC_ERR".to_string());
        }
        // Bytes no operation from `i` on touched must equal the model.
        let got = remote.to_vec();
        let mut mask = vec![true; got.len()];
        for &(op, off, len) in &touched {
            if op >= i {
                mask[off..off + len].iter_mut().for_each(|m| *m = false);
            }
        }
        if let Some(b) = (0..got.len()).find(|&b| mask[b] && got[b] != model[b]) {
            violations.push(format!(
                "after retry exhaustion, remote byte {b} differs from the model"
            ));
        }
    } else if violations.is_empty() {
        let got = remote.to_vec();
        if got != model {
            let first = got
                .iter()
                .zip(model.iter())
                .position(|(x, y)| x != y)
                .unwrap_or(0);
            violations.push(format!(
                "remote memory differs from the model first at byte {first}"
            ));
        }
        // Let stray retransmissions settle, then nothing may be left over.
        sim.run_until(Duration::from_millis(50), || false);
        if let Some(wc) = ca.poll_one().or_else(|| cb.poll_one()) {
            violations.push(format!("leftover completion {wc:?}"));
        }
    }
    let _: &Mr = &recv_area;
    Report {
        seed: cfg.seed,
        ops_done: done,
        mtu,
        link: sim.stats(),
        requester: a.counters(),
        responder: b.counters(),
        virtual_ns: sim.now().as_nanos(),
        bytes,
        violations,
        retry_exhausted: exhausted,
    }
}
