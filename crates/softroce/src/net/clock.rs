//! Clocks for devices.

use crate::transport::Instant;
use crate::verbs::Clock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The real monotonic clock: ns since this clock was made, plus 1, so that no reading is
/// [`Instant::ZERO`] (the start of a simulation's clock). The one adapter of the real clock:
/// devices, the CM driver and librdmacm.so.1 all read time through it.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    origin: std::time::Instant,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> SystemClock {
        SystemClock {
            origin: std::time::Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> SystemClock {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        let ns = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        Instant::from_nanos(ns.saturating_add(1))
    }
}

/// A seed that differs between runs and between processes: the wall clock's nanoseconds
/// since the Unix epoch XOR the process ID shifted to bits 32..64 (1 if the clock is before
/// the epoch). The one such seed of the workspace: the CM driver, librdmacm.so.1 and the
/// random starting PSN of the examples all take theirs here, and feed it to
/// [`crate::rand::SplitMix64`] or a config's `seed`.
pub fn seed_from_clock_and_pid() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        ^ (u64::from(std::process::id()) << 32)
}

/// A clock that moves only when told to (tests, simulations).
#[derive(Debug, Default)]
pub struct ManualClock {
    ns: AtomicU64,
}

impl ManualClock {
    /// A clock at time 0.
    pub fn new() -> ManualClock {
        ManualClock::default()
    }
    /// Sets the time; it must not go backwards (a smaller value is ignored).
    pub fn set(&self, t: Instant) {
        self.ns.fetch_max(t.as_nanos(), Ordering::SeqCst);
    }
    /// Advances the time by `d`.
    pub fn advance(&self, d: core::time::Duration) {
        let add = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.ns.fetch_add(add, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        Instant::from_nanos(self.ns.load(Ordering::SeqCst))
    }
}
