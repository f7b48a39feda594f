//! The latency tests' traffic (`run_iter_lat_write`, `run_iter_lat_send` and `run_iter_lat`
//! in perftest's `src/perftest_resources.c`), one QP, one message in flight:
//! - write_lat: a ping-pong of RDMA WRITEs. Each side stamps the last byte of its message
//!   with its send count (1, 2, ... as a byte) and waits until the peer's WRITE has put the
//!   next expected count in the last byte of its own buffer; the SERVER sends first
//!   (`!(scnt < 1 && machine == SERVER)` guards the wait; checked against kernel rxe).
//! - send_lat: the same ping-pong with SENDs, each side waiting for a receive completion;
//!   both keep receives posted; the CLIENT sends first.
//! - read_lat: the client alone READs, one at a time; the server only waits.
//!
//! Every post is timestamped; the samples are the gaps between posts (a round trip, halved
//! for the ping-pongs), as perftest's `tposted` array. Each send is signaled and its
//! completion awaited before the next step, as perftest's latency tests do with their CQ
//! moderation of 1.

use super::bw::{Limit, STALL, check, pause, poll_until, post_recvs};
use super::oob::PerfDest;
use super::report::LatResult;
use super::session::Session;
use crate::BoxError;
use crate::stall::StallWatch;
use softroce::net::UdpDevice;
use softroce::verbs::{Cq, SendWr, Wc, WrOpcode};
use std::time::{Duration, Instant};

/// The latency test's operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatOp {
    /// WRITE ping-pong, polling memory.
    Write,
    /// SEND ping-pong, polling the receive CQ.
    Send,
    /// Client-only READs.
    Read,
}

/// Polls `cq` (a CQ of `dev`) for one completion ([`poll_until`]); `None` when `deadline`
/// passes first.
fn poll_one(dev: &UdpDevice, cq: &Cq, deadline: Instant) -> Option<Wc> {
    let mut one = [Wc::default()];
    (poll_until(dev, cq, &mut one, deadline) == 1).then_some(one[0])
}

/// One latency run's settings.
#[derive(Debug, Clone, Copy)]
pub struct LatRun {
    /// The operation.
    pub op: LatOp,
    /// Message size, bytes.
    pub size: u32,
    /// `-n` or `-D`.
    pub limit: Limit,
    /// This side is the client (names errors; decides who sends first).
    pub client: bool,
    /// send_lat: receives to keep posted (`-r`).
    pub rx_depth: u64,
    /// send_lat: receives the caller posted before the handshake that precedes the run.
    pub recvs_posted: u64,
}

/// One latency run towards `peer`.
pub fn run(s: &Session, peer: &PerfDest, r: LatRun) -> Result<LatResult, BoxError> {
    let LatRun {
        op,
        size,
        limit,
        client,
        rx_depth,
        recvs_posted,
    } = r;
    let watch = StallWatch::new(&s.dev);
    let size_us = size as usize;
    let (target, local) = (s.target_offset(0), s.local_offset(0));
    let opcode = match op {
        LatOp::Write => WrOpcode::RdmaWrite,
        LatOp::Send => WrOpcode::Send,
        LatOp::Read => WrOpcode::RdmaRead,
    };
    let iters = match limit {
        Limit::Iters(n) => n,
        Limit::Duration(_) => u64::MAX,
    };
    let mut posted_us: Vec<f64> = Vec::new();
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let mut recvs = recvs_posted;
    let start = Instant::now();
    let time_up = || matches!(limit, Limit::Duration(d) if start.elapsed() >= d || crate::interrupt::interrupted());
    // In duration mode, a wait that outlasts the duration by this much ends the run (the
    // peer has stopped).
    let grace = Duration::from_millis(200);
    let deadline = |now: Instant| match limit {
        Limit::Duration(d) => (start + d + grace).max(now),
        Limit::Iters(_) => now + STALL,
    };
    // perftest: the write_lat server and the send_lat client post first; READ never waits.
    let sends_first = match op {
        LatOp::Write => !client,
        LatOp::Send | LatOp::Read => client,
    };
    let mut byte = [0u8; 1];
    let mut replenish = false;
    let unfinished = |scnt: u64, rcnt: u64| {
        if op == LatOp::Read {
            scnt < iters
        } else {
            scnt < iters || rcnt < iters
        }
    };
    'run: while unfinished(scnt, rcnt) {
        if time_up() && scnt == rcnt {
            break;
        }
        // Wait for the peer's message (not before the first sender's first send; never in
        // READ).
        if op != LatOp::Read && rcnt < iters && !(sends_first && scnt == 0) {
            rcnt += 1;
            let until = deadline(Instant::now());
            match op {
                LatOp::Write => {
                    let want = rcnt as u8;
                    let mut spins = 0u32;
                    loop {
                        s.mr.read(target + size_us - 1, &mut byte)?;
                        if byte[0] == want {
                            break;
                        }
                        // With --busy-poll this thread receives the peer's WRITE itself.
                        s.dev.poll_cq(&s.send_cq, &mut []);
                        spins = spins.wrapping_add(1);
                        if spins.is_multiple_of(64) && Instant::now() > until {
                            if time_up() {
                                break 'run;
                            }
                            return Err(format!(
                                "no WRITE from the peer in {STALL:?} (iteration {rcnt}). {}",
                                watch.diagnosis()
                            )
                            .into());
                        }
                        pause(&s.dev);
                    }
                }
                _ => {
                    let Some(wc) = poll_one(&s.dev, &s.recv_cq, until) else {
                        if time_up() {
                            break 'run;
                        }
                        return Err(format!(
                            "no SEND from the peer in {STALL:?} (iteration {rcnt}). {}",
                            watch.diagnosis()
                        )
                        .into());
                    };
                    check(&wc, if client { "client" } else { "server" })?;
                    recvs -= 1;
                    if rcnt + recvs < iters && recvs < rx_depth {
                        if recvs == 0 {
                            post_recvs(s, 0, size, 1)?;
                            recvs += 1;
                        } else {
                            // Re-posted after this side's SEND is out (below), off the round
                            // trip: the peer's next SEND comes only after that SEND, and a
                            // receive is still posted for it meanwhile.
                            replenish = true;
                        }
                    }
                }
            }
        }
        if scnt < iters {
            if time_up() && sends_first {
                break;
            }
            scnt += 1;
            if op == LatOp::Write {
                s.mr.write(local + size_us - 1, &[scnt as u8])?;
            }
            let mut wr = SendWr::new(0, opcode, vec![s.mr.sge(local, size)]);
            if op != LatOp::Send {
                wr.remote_addr = peer.vaddr;
                wr.rkey = peer.rkey;
            }
            posted_us.push(start.elapsed().as_secs_f64() * 1e6);
            s.qps[0]
                .post_send(&[wr])
                .map_err(|e| format!("Couldn't post send: {e}"))?;
            if core::mem::take(&mut replenish) {
                post_recvs(s, 0, size, 1)?;
                recvs += 1;
            }
            let Some(wc) = poll_one(&s.dev, &s.send_cq, Instant::now() + STALL) else {
                return Err(format!(
                    "no send completion in {STALL:?} (iteration {scnt}). {}",
                    watch.diagnosis()
                )
                .into());
            };
            check(&wc, if client { "client" } else { "server" })?;
        }
    }
    let rtt_factor = if op == LatOp::Read { 1.0 } else { 2.0 };
    Ok(match limit {
        Limit::Iters(_) => LatResult::from_posts(u64::from(size), &posted_us, rtt_factor),
        Limit::Duration(_) => LatResult::from_duration(
            u64::from(size),
            scnt,
            start.elapsed().as_secs_f64(),
            rtt_factor,
        ),
    })
}
