//! `net::sim`: the in-memory twin of the UDP driver. Devices send into a [`SimNet`] that
//! delivers datagrams after a virtual delay, with seeded faults — loss, duplication,
//! reordering, extra delay and single-bit corruption — and a [`ManualClock`] that jumps to
//! the next event. The same `verbs::Device` and transport engine run as on real UDP; only the
//! link and the clock differ. Everything is single-threaded and deterministic: a seed
//! replays a run exactly.
//!
//! Source of the shape: quinn-proto's test `Pair` (`step`, `drive`), TigerBeetle's packet
//! simulator (fault knobs from the seed), smoltcp's `FaultInjector` (single-bit corruption).

pub mod mesh;
mod recording;
pub mod workload;

pub use recording::RecordingLink;

use super::ManualClock;
use crate::rand::SplitMix64;
use crate::transport::{Instant, Transmit};
use crate::verbs::{Device, DeviceConfig, Link};
use parking_lot::Mutex;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// The simulator's seeded PRNG: the engine's [`SplitMix64`] from `seed ^ 0x5eed_5eed_5eed_5eed`.
#[derive(Debug, Clone)]
pub struct SimRng(SplitMix64);

impl SimRng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> SimRng {
        SimRng(SplitMix64::new(seed ^ 0x5eed_5eed_5eed_5eed))
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.below(n)
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.0.chance(p)
    }
}

/// Fault and delay parameters of a simulated link. Probabilities are per datagram.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimFaults {
    /// Probability a datagram is lost.
    pub loss: f64,
    /// Probability a datagram is delivered twice.
    pub dup: f64,
    /// Probability a datagram is held back (delivered after later ones).
    pub reorder: f64,
    /// Probability one random bit of a datagram is flipped.
    pub corrupt: f64,
    /// One-way delay, ns.
    pub delay_ns: u64,
    /// Extra random delay up to this many ns.
    pub jitter_ns: u64,
}

impl SimFaults {
    /// A perfect link with 5 µs delay.
    pub const NONE: SimFaults = SimFaults {
        loss: 0.0,
        dup: 0.0,
        reorder: 0.0,
        corrupt: 0.0,
        delay_ns: 5_000,
        jitter_ns: 0,
    };

    /// Swarm testing: every parameter drawn from `seed` (loss ≤ 15%, dup ≤ 10%, reorder ≤
    /// 15%, corrupt ≤ 2%, delay 1–50 µs, jitter ≤ 20 µs), some of them zero.
    pub fn from_seed(seed: u64) -> SimFaults {
        let mut r = SimRng::new(seed.wrapping_mul(31).wrapping_add(7));
        let mut p = |max: f64| {
            if r.chance(0.3) {
                0.0
            } else {
                (r.below(1000) as f64 / 1000.0) * max
            }
        };
        let (loss, dup, reorder, corrupt) = (p(0.15), p(0.10), p(0.15), p(0.02));
        SimFaults {
            loss,
            dup,
            reorder,
            corrupt,
            delay_ns: 1_000 + r.below(49_000),
            jitter_ns: r.below(20_000),
        }
    }
}

/// What the link did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Datagrams handed to the link.
    pub sent: u64,
    /// Datagrams delivered (duplicates included).
    pub delivered: u64,
    /// Datagrams lost.
    pub lost: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Datagrams held back.
    pub reordered: u64,
    /// Datagrams with a flipped bit.
    pub corrupted: u64,
}

#[derive(Debug)]
struct InFlight {
    src: SocketAddr,
    dst: IpAddr,
    payload: Vec<u8>,
}

struct NetState {
    now: Instant,
    seq: u64,
    queue: BinaryHeap<Reverse<(Instant, u64)>>,
    flights: BTreeMap<u64, InFlight>,
    rng: SimRng,
    faults: SimFaults,
    stats: SimStats,
    trace: bool,
    /// Latest delivery time per (source, destination): datagrams that are not explicitly
    /// reordered keep their order, as on a real path.
    last_at: BTreeMap<(SocketAddr, IpAddr), Instant>,
    filter: Option<Filter>,
}

/// Decides, before the random faults, whether a datagram goes on the wire: called with the
/// virtual time, source, destination and UDP payload; false drops it (counted as lost).
pub type Filter = Box<dyn FnMut(Instant, SocketAddr, IpAddr, &[u8]) -> bool + Send>;

/// One line describing a datagram, for `SOFTROCE_SIM_TRACE=1`.
fn describe(p: &[u8]) -> String {
    match crate::wire::RocePacket::parse(p) {
        Ok(pkt) => {
            let b = pkt.repr.bth;
            let aeth = pkt
                .repr
                .aeth
                .map(|a| format!(" aeth={:#04x}", a.syndrome))
                .unwrap_or_default();
            format!(
                "{} qp={:#x} psn={:#08x}{}{} len={}",
                b.opcode,
                b.dest_qpn,
                b.psn.value(),
                if b.ack_req { " A" } else { "" },
                aeth,
                pkt.payload.len()
            )
        }
        Err(e) => format!("undecodable ({e})"),
    }
}

impl core::fmt::Debug for NetState {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("NetState")
            .field("now", &self.now)
            .field("stats", &self.stats)
            .finish()
    }
}

/// The simulated network: a delivery queue ordered by virtual time.
#[derive(Debug)]
pub struct SimNet {
    state: Mutex<NetState>,
}

impl SimNet {
    fn new(seed: u64, faults: SimFaults) -> SimNet {
        SimNet {
            state: Mutex::new(NetState {
                now: Instant::ZERO,
                seq: 0,
                queue: BinaryHeap::new(),
                flights: BTreeMap::new(),
                rng: SimRng::new(seed),
                faults,
                stats: SimStats::default(),
                trace: std::env::var_os("SOFTROCE_SIM_TRACE").is_some(),
                last_at: BTreeMap::new(),
                filter: None,
            }),
        }
    }

    fn submit(&self, src: SocketAddr, dst: IpAddr, mut payload: Vec<u8>) {
        let mut st = self.state.lock();
        st.stats.sent += 1;
        let f = st.faults;
        let now = st.now;
        let pass = st
            .filter
            .as_mut()
            .is_none_or(|keep| keep(now, src, dst, &payload));
        if !pass || st.rng.chance(f.loss) {
            st.stats.lost += 1;
            if st.trace {
                eprintln!(
                    "{:>12} {src} LOST {}",
                    st.now.as_nanos(),
                    describe(&payload)
                );
            }
            return;
        }
        if !payload.is_empty() && st.rng.chance(f.corrupt) {
            let bit = st.rng.below(payload.len() as u64 * 8) as usize;
            payload[bit / 8] ^= 1 << (bit % 8);
            st.stats.corrupted += 1;
        }
        let copies = if st.rng.chance(f.dup) {
            st.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut delay = f.delay_ns + st.rng.below(f.jitter_ns + 1);
            let mut at;
            if st.rng.chance(f.reorder) {
                // Held back: later datagrams overtake it.
                st.stats.reordered += 1;
                delay += f.delay_ns * (1 + st.rng.below(8)) + 1;
                at = st.now + Duration::from_nanos(delay);
            } else {
                at = st.now + Duration::from_nanos(delay);
                if let Some(last) = st.last_at.get(&(src, dst)) {
                    at = at.max(*last);
                }
                st.last_at.insert((src, dst), at);
            }
            let seq = st.seq;
            st.seq += 1;
            st.queue.push(Reverse((at, seq)));
            st.flights.insert(
                seq,
                InFlight {
                    src,
                    dst,
                    payload: payload.clone(),
                },
            );
        }
    }

    fn next_time(&self) -> Option<Instant> {
        self.state.lock().queue.peek().map(|Reverse((t, _))| *t)
    }

    fn pop_due(&self, now: Instant) -> Option<InFlight> {
        let mut st = self.state.lock();
        st.now = now;
        match st.queue.peek() {
            Some(Reverse((t, _))) if *t <= now => {}
            _ => return None,
        }
        let Reverse((_, seq)) = st.queue.pop()?;
        st.stats.delivered += 1;
        let f = st.flights.remove(&seq)?;
        if st.trace {
            eprintln!(
                "{:>12} {} -> {} {}",
                now.as_nanos(),
                f.src,
                f.dst,
                describe(&f.payload)
            );
        }
        Some(f)
    }

    fn set_now(&self, now: Instant) {
        self.state.lock().now = now;
    }

    /// Counters so far.
    pub fn stats(&self) -> SimStats {
        self.state.lock().stats
    }
}

/// One device's side of the simulated network.
#[derive(Debug)]
pub struct SimLink {
    net: Arc<SimNet>,
    ip: IpAddr,
}

impl Link for SimLink {
    fn send(&self, t: &Transmit) -> std::io::Result<()> {
        self.net.submit(
            SocketAddr::new(self.ip, t.src_port),
            t.dst,
            t.payload.clone(),
        );
        Ok(())
    }
}

/// A simulation: devices on one [`SimNet`] sharing one [`ManualClock`].
pub struct Sim {
    net: Arc<SimNet>,
    clock: Arc<ManualClock>,
    devices: Vec<Device>,
}

impl core::fmt::Debug for Sim {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sim")
            .field("devices", &self.devices.len())
            .finish()
    }
}

impl Sim {
    /// A network with faults `faults`, all randomness from `seed`.
    pub fn new(seed: u64, faults: SimFaults) -> Sim {
        Sim {
            net: Arc::new(SimNet::new(seed, faults)),
            clock: Arc::new(ManualClock::new()),
            devices: Vec::new(),
        }
    }

    /// Adds a device with address `ip` (any address: nothing leaves the process).
    pub fn add_device(&mut self, name: &str, ip: IpAddr) -> Device {
        let link = Arc::new(SimLink {
            net: self.net.clone(),
            ip,
        });
        let dev = Device::new(DeviceConfig::new(name, ip), link, self.clock.clone());
        self.devices.push(dev.clone());
        dev
    }

    /// Fails `dev` the way a device whose driver thread panicked fails (`net::udp`):
    /// [`Device::fail`] moves its QPs to ERR, which flushes their WRs, and raises
    /// `IBV_EVENT_DEVICE_FATAL`; then, as the thread is gone, nothing more is delivered to the
    /// device (datagrams to its address are dropped) and its timers no longer run. Its
    /// objects stay usable (polling CQs, destroying). A device not on this simulation's
    /// network is left alone.
    pub fn fail_device(&mut self, dev: &Device, reason: &str) {
        let Some(i) = self.devices.iter().position(|d| d.ip() == dev.ip()) else {
            return;
        };
        let dev = self.devices.remove(i);
        dev.fail(reason);
    }

    /// Virtual time now.
    pub fn now(&self) -> Instant {
        use crate::verbs::Clock;
        self.clock.now()
    }

    /// The simulation's clock, which [`step`](Sim::step) and [`advance`](Sim::advance) move:
    /// a driver loop that reads a [`Clock`](crate::verbs::Clock) (the CM loop,
    /// [`super::cm_loop::run`]) runs on virtual time through it.
    pub fn clock(&self) -> Arc<ManualClock> {
        self.clock.clone()
    }

    /// Link counters.
    pub fn stats(&self) -> SimStats {
        self.net.stats()
    }

    /// Installs a filter that sees every datagram before the random faults (scenario tests
    /// drop chosen packets with it); `None` removes it.
    pub fn set_filter(&mut self, f: Option<Filter>) {
        self.net.state.lock().filter = f;
    }

    /// When the next event (a delivery or a device timer) is due, if any: a caller that has
    /// timers of its own (a CM port, an application) steps up to the earliest of both.
    #[must_use]
    pub fn next_event(&self) -> Option<Instant> {
        let next_pkt = self.net.next_time();
        let next_timer = self.devices.iter().filter_map(Device::next_deadline).min();
        [next_pkt, next_timer].into_iter().flatten().min()
    }

    /// Advances to the next event (a delivery or a timer), handles it, and returns true; false
    /// when nothing is pending.
    pub fn step(&mut self) -> bool {
        let now = self.now();
        let next_pkt = self.net.next_time();
        let next_timer = self.devices.iter().filter_map(Device::next_deadline).min();
        let Some(t) = [next_pkt, next_timer].into_iter().flatten().min() else {
            return false;
        };
        let t = t.max(now);
        self.clock.set(t);
        self.net.set_now(t);
        if next_pkt.is_some_and(|p| p <= t)
            && let Some(f) = self.net.pop_due(t)
            && let Some(dev) = self.devices.iter().find(|d| d.ip() == f.dst)
        {
            dev.handle_datagram(f.src, &f.payload);
        }
        for d in &self.devices {
            d.handle_timeouts();
        }
        true
    }

    /// Steps until `done()` holds, nothing is pending, or `limit` virtual time passes.
    /// Returns whether `done()` held.
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut() -> bool) -> bool {
        let end = self.now() + limit;
        loop {
            if done() {
                return true;
            }
            if self.now() > end || !self.step() {
                return done();
            }
        }
    }

    /// Advances virtual time by `d`, handling everything due on the way.
    pub fn advance(&mut self, d: Duration) {
        let end = self.now() + d;
        while self.net.next_time().is_some_and(|t| t <= end)
            || self
                .devices
                .iter()
                .filter_map(Device::next_deadline)
                .min()
                .is_some_and(|t| t <= end)
        {
            if !self.step() {
                break;
            }
        }
        self.clock.set(end);
        self.net.set_now(end);
    }
}
