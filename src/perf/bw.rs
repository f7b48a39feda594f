//! The bandwidth tests' traffic: the client keeps up to `-t` WRITEs, READs, SENDs or atomics
//! in flight per QP (`run_iter_bw` in perftest's `src/perftest_resources.c`); in send_bw the
//! server receives them, re-posting each receive as it completes (`run_iter_bw_server`).
//! As perftest does, only every `-Q` (CQ moderation, default 100)th WR of a QP and its last
//! are signaled: a completion stands for itself and every earlier WR of its QP (RC completes
//! in order). That changes nothing on the wire.

use super::oob::PerfDest;
use super::report::BwResult;
use super::session::Session;
use crate::BoxError;
use crate::stall::StallWatch;
use softroce::net::UdpDevice;
use softroce::verbs::{Cq, RecvWr, SendFlags, SendWr, Wc, WcStatus, WrOpcode};
use std::time::{Duration, Instant};

/// Longest either side waits for any completion before it gives up.
pub const STALL: Duration = Duration::from_secs(30);

/// How long a test runs: `-n` iterations per QP, or `-D` seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// Messages per QP.
    Iters(u64),
    /// Wall time.
    Duration(Duration),
}

/// The client's operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BwOp {
    /// RDMA WRITE of `size` bytes.
    Write,
    /// RDMA READ of `size` bytes.
    Read,
    /// SEND of `size` bytes.
    Send,
    /// 8-byte FETCH_AND_ADD (adds 1).
    FetchAdd,
    /// 8-byte CMP_AND_SWP (compare 0, swap 0).
    CmpSwap,
}

/// Bits of a WR ID that hold the WR's sequence number on its QP (the QP index is above).
const SEQ_BITS: u32 = 40;

/// The client's side: `limit` messages of `size` bytes on every QP towards `peers`, at most
/// `tx_depth` in flight per QP, every `cq_mod`th signaled (clamped to 1..=`tx_depth`).
pub fn client(
    s: &Session,
    peers: &[PerfDest],
    op: BwOp,
    size: u32,
    limit: Limit,
    tx_depth: u32,
    cq_mod: u32,
) -> Result<BwResult, BoxError> {
    let cq_mod = u64::from(cq_mod.clamp(1, tx_depth.max(1)));
    let watch = StallWatch::new(&s.dev);
    let nq = s.qps.len();
    let (opcode, len) = match op {
        BwOp::Write => (WrOpcode::RdmaWrite, size),
        BwOp::Read => (WrOpcode::RdmaRead, size),
        BwOp::Send => (WrOpcode::Send, size),
        BwOp::FetchAdd => (WrOpcode::AtomicFetchAndAdd, 8),
        BwOp::CmpSwap => (WrOpcode::AtomicCmpAndSwp, 8),
    };
    let mut posted = vec![0u64; nq];
    let mut completed = vec![0u64; nq];
    // Post times of the messages in flight per QP (RC completes them in order).
    let mut in_flight: Vec<std::collections::VecDeque<f64>> = vec![Default::default(); nq];
    let mut best = f64::INFINITY;
    let mut done_s = stamps_for(limit, nq);
    let mut wcs = vec![Wc::default(); 64];
    let mut batch = Vec::new();
    let start = Instant::now();
    let more = |posted: u64| match limit {
        Limit::Iters(n) => posted < n,
        Limit::Duration(d) => start.elapsed() < d && !crate::interrupt::interrupted(),
    };
    loop {
        for i in 0..nq {
            batch.clear();
            while more(posted[i] + batch.len() as u64)
                && posted[i] + (batch.len() as u64) - completed[i] < u64::from(tx_depth)
            {
                let seq = posted[i] + batch.len() as u64;
                let wr_id = ((i as u64) << SEQ_BITS) | seq;
                let mut wr = SendWr::new(wr_id, opcode, vec![s.mr.sge(s.local_offset(i), len)]);
                let last = matches!(limit, Limit::Iters(n) if seq + 1 == n);
                if (seq + 1).is_multiple_of(cq_mod) || last {
                    wr.send_flags = SendFlags::SIGNALED;
                }
                if op != BwOp::Send {
                    wr.remote_addr = peers[i].vaddr;
                    wr.rkey = peers[i].rkey;
                }
                if op == BwOp::FetchAdd {
                    wr.compare_add = 1;
                }
                batch.push(wr);
            }
            if !batch.is_empty() {
                posted[i] += batch.len() as u64;
                let t = start.elapsed().as_secs_f64();
                in_flight[i].extend(std::iter::repeat_n(t, batch.len()));
                s.qps[i]
                    .post_send(&batch)
                    .map_err(|e| format!("Couldn't post send: {e}"))?;
            }
        }
        // Only signaled WRs complete visibly: in duration mode the unsignaled tail after the
        // last signaled one is left to finish on its own.
        let owed = |i: usize| match limit {
            Limit::Iters(_) => posted[i] - completed[i],
            Limit::Duration(_) => (posted[i] / cq_mod * cq_mod).saturating_sub(completed[i]),
        };
        let outstanding: u64 = (0..nq).map(owed).sum();
        if outstanding == 0 && !posted.iter().any(|p| more(*p)) {
            break;
        }
        let n = wait_cq(s, &s.send_cq, &mut wcs, STALL);
        if n == 0 {
            return Err(format!(
                "no completion in {STALL:?} ({} of {} done). {}",
                completed.iter().sum::<u64>(),
                posted.iter().sum::<u64>(),
                watch.diagnosis()
            )
            .into());
        }
        let now = start.elapsed().as_secs_f64();
        for wc in &wcs[..n] {
            check(wc, "client")?;
            let i = usize::try_from(wc.wr_id >> SEQ_BITS).unwrap_or(usize::MAX);
            let through = (wc.wr_id & ((1 << SEQ_BITS) - 1)) + 1;
            let (Some(c), Some(q)) = (completed.get_mut(i), in_flight.get_mut(i)) else {
                continue;
            };
            // This completion stands for every WR of the QP up to its own.
            while *c < through {
                *c += 1;
                if let Some(t) = q.pop_front() {
                    best = best.min(now - t);
                }
                done_s.push(now);
            }
        }
    }
    // perftest's #iterations counts the messages of all QPs.
    let iters = posted.iter().sum();
    let mut r = BwResult::from_times(
        u64::from(len),
        iters,
        0.0,
        &done_s,
        best.is_finite().then_some(best),
    );
    if matches!(limit, Limit::Duration(_)) {
        // perftest's duration mode reports no peak (0.00).
        r.bw_peak = 0.0;
    }
    Ok(r)
}

/// The vector of completion times for `limit` messages on each of `nq` QPs, allocated
/// before the clock starts as perftest allocates its time stamps: one that doubled inside
/// the timed loop, reallocated and copied, took 5 % of the client's time in a 64 B stream.
/// At most [`STAMPS_RESERVED`] are reserved (a larger `-n` grows the vector as it goes).
fn stamps_for(limit: Limit, nq: usize) -> Vec<f64> {
    match limit {
        Limit::Iters(n) => Vec::with_capacity(
            usize::try_from(n.saturating_mul(nq as u64))
                .map_or(STAMPS_RESERVED, |n| n.min(STAMPS_RESERVED)),
        ),
        Limit::Duration(_) => Vec::new(),
    }
}

/// The most completion times [`stamps_for`] reserves room for: 16 Mi (128 MiB of address
/// space, touched only as it fills).
const STAMPS_RESERVED: usize = 1 << 24;

/// Waits up to `timeout` for completions on `cq` (one of `s`'s CQs): with `--busy-poll`
/// by polling the device ([`poll_until`]), otherwise by sleeping on the CQ. Returns how
/// many it moved into `out`.
fn wait_cq(s: &Session, cq: &Cq, out: &mut [Wc], timeout: Duration) -> usize {
    if !s.dev.link().busy_poll() {
        return cq.wait(out, timeout);
    }
    poll_until(&s.dev, cq, out, Instant::now() + timeout)
}

/// Between two polls: with `--busy-poll` a spin hint (the poller owns a core, as the spinning
/// UDP baseline does); otherwise the CPU is yielded to the device's receive thread.
pub fn pause(dev: &UdpDevice) {
    if dev.link().busy_poll() {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// Polls `cq` (a CQ of `dev`) until it returns completions into `out` (perftest spins on
/// `ibv_poll_cq`), pausing between polls ([`pause`]); with `--busy-poll` each poll also
/// receives from the device's socket ([`UdpDevice::poll_cq`]). Returns how many, or 0 once
/// `deadline` has passed.
pub fn poll_until(dev: &UdpDevice, cq: &Cq, out: &mut [Wc], deadline: Instant) -> usize {
    let mut spins = 0u32;
    loop {
        let n = dev.poll_cq(cq, out);
        if n > 0 {
            return n;
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(64) && Instant::now() > deadline {
            return 0;
        }
        pause(dev);
    }
}

/// Posts up to `count` receives of `size` bytes on QP `i` (perftest's `ctx_set_recv_wqes`).
pub fn post_recvs(s: &Session, i: usize, size: u32, count: u64) -> Result<(), BoxError> {
    let wrs: Vec<RecvWr> = (0..count)
        .map(|_| RecvWr {
            wr_id: i as u64,
            sg_list: vec![s.mr.sge(s.target_offset(i), size)],
        })
        .collect();
    if !wrs.is_empty() {
        s.qps[i]
            .post_recv(&wrs)
            .map_err(|e| format!("Couldn't post recv: {e}"))?;
    }
    Ok(())
}

/// The send_bw server's side, once `initial[i]` receives are posted on each QP: waits for
/// the messages, re-posting receives until `limit` is met. In duration mode it receives for
/// the duration and then until the link has been quiet for 200 ms, so that the client's last
/// SENDs find receives. Its bandwidth runs from the first receive to the last; its peak is
/// 0, as perftest's server prints it.
pub fn server(
    s: &Session,
    size: u32,
    limit: Limit,
    rx_depth: u32,
    initial: &[u64],
) -> Result<BwResult, BoxError> {
    let watch = StallWatch::new(&s.dev);
    let nq = s.qps.len();
    let mut posted = initial.to_vec();
    let mut received = vec![0u64; nq];
    let mut done_s = stamps_for(limit, nq);
    let mut wcs = vec![Wc::default(); 64];
    let start = Instant::now();
    let mut first: Option<f64> = None;
    loop {
        let finished = match limit {
            Limit::Iters(n) => received.iter().all(|r| *r >= n),
            Limit::Duration(_) => false,
        };
        if finished {
            break;
        }
        let wait = match limit {
            Limit::Duration(d) if start.elapsed() >= d || crate::interrupt::interrupted() => {
                Duration::from_millis(200)
            }
            Limit::Duration(_) => Duration::from_millis(50),
            Limit::Iters(_) => STALL,
        };
        let n = wait_cq(s, &s.recv_cq, &mut wcs, wait);
        if n == 0 {
            match limit {
                Limit::Duration(d) if start.elapsed() >= d || crate::interrupt::interrupted() => {
                    break;
                }
                Limit::Duration(_) => continue,
                Limit::Iters(_) => {
                    return Err(format!(
                        "no receive in {STALL:?} ({} received). {}",
                        received.iter().sum::<u64>(),
                        watch.diagnosis()
                    )
                    .into());
                }
            }
        }
        let now = start.elapsed().as_secs_f64();
        for wc in &wcs[..n] {
            check(wc, "server")?;
            first.get_or_insert(now);
            done_s.push(now);
            let i = usize::try_from(wc.wr_id).unwrap_or(usize::MAX);
            if i >= nq {
                continue;
            }
            received[i] += 1;
            let want = match limit {
                Limit::Iters(n) => posted[i] < n,
                Limit::Duration(_) => true,
            };
            if want && posted[i] - received[i] < u64::from(rx_depth) {
                post_recvs(s, i, size, 1)?;
                posted[i] += 1;
            }
        }
    }
    let iters = received.iter().sum();
    let mut r = BwResult::from_times(u64::from(size), iters, first.unwrap_or(0.0), &done_s, None);
    // perftest's receiving server has no post times and prints a peak of 0.00.
    r.bw_peak = 0.0;
    Ok(r)
}

/// Errors on a failed completion, in perftest's words.
pub fn check(wc: &Wc, side: &str) -> Result<(), BoxError> {
    if wc.status == WcStatus::Success {
        Ok(())
    } else {
        Err(format!(
            "Completion with error at {side}: {} ({}) for wr_id {}",
            wc.status, wc.status as u32, wc.wr_id
        )
        .into())
    }
}
