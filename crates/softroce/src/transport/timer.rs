//! Time for the sans-IO engine: an [`Instant`] in ns from an arbitrary origin, passed in by the
//! caller, and one table of optional deadlines per QP.
//!
//! Source: quinn-proto's `TimerTable` shape; rxe's retransmit and RNR timers (`rxe_qp.c`,
//! `rxe_comp.c`).

use core::time::Duration;

/// A point in time: nanoseconds since an origin chosen by the driver (the real clock in
/// `net`, a virtual one in simulations). Callers must pass non-decreasing values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    /// The origin.
    pub const ZERO: Instant = Instant(0);

    /// From nanoseconds since the origin.
    pub const fn from_nanos(ns: u64) -> Instant {
        Instant(ns)
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl core::ops::Add<Duration> for Instant {
    type Output = Instant;
    /// `self + d`, saturating at the end of time.
    fn add(self, d: Duration) -> Instant {
        Instant(
            self.0
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }
}

/// The timers of one QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    /// Requester retransmit (ACK timeout): 4.096 µs × 2^`timeout`.
    Retransmit = 0,
    /// Requester wait after an RNR NAK before retrying.
    Rnr = 1,
}

const TIMER_COUNT: usize = 2;

/// One optional deadline per [`Timer`].
#[derive(Debug, Clone, Default)]
pub struct TimerTable {
    deadlines: [Option<Instant>; TIMER_COUNT],
}

impl TimerTable {
    /// Arms (or re-arms) `t` to fire at `at`.
    pub fn set(&mut self, t: Timer, at: Instant) {
        self.deadlines[t as usize] = Some(at);
    }
    /// Disarms `t`.
    pub fn stop(&mut self, t: Timer) {
        self.deadlines[t as usize] = None;
    }
    /// True when `t` is armed.
    pub fn is_armed(&self, t: Timer) -> bool {
        self.deadlines[t as usize].is_some()
    }
    /// The earliest armed deadline.
    pub fn next_timeout(&self) -> Option<Instant> {
        self.deadlines.iter().flatten().min().copied()
    }
    /// If `t` is armed and due at `now`, disarms it and returns true.
    pub fn fire(&mut self, t: Timer, now: Instant) -> bool {
        match self.deadlines[t as usize] {
            Some(at) if at <= now => {
                self.deadlines[t as usize] = None;
                true
            }
            _ => false,
        }
    }
    /// Disarms every timer.
    pub fn clear(&mut self) {
        self.deadlines = [None; TIMER_COUNT];
    }
}

/// The ACK timeout that the 5-bit `timeout` attribute encodes: 4.096 µs × 2^timeout, or
/// `None` for 0 (no retransmit timer). Source: IBTA Vol 1 ch. 9 (local ACK timeout), rxe
/// `rxe_qp.c` `qp->qp_timeout_jiffies`.
pub fn ack_timeout(timeout: u8) -> Option<Duration> {
    if timeout == 0 {
        return None;
    }
    let exp = u32::from(timeout.min(31));
    Some(Duration::from_nanos(4096u64 << exp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_once_and_disarms() {
        let mut t = TimerTable::default();
        t.set(Timer::Retransmit, Instant::from_nanos(100));
        t.set(Timer::Rnr, Instant::from_nanos(50));
        assert_eq!(t.next_timeout(), Some(Instant::from_nanos(50)));
        assert!(!t.fire(Timer::Retransmit, Instant::from_nanos(99)));
        assert!(t.fire(Timer::Retransmit, Instant::from_nanos(100)));
        assert!(!t.fire(Timer::Retransmit, Instant::from_nanos(200)));
        assert!(!t.is_armed(Timer::Retransmit));
    }

    #[test]
    fn ack_timeout_encoding() {
        assert_eq!(ack_timeout(0), None);
        assert_eq!(ack_timeout(1), Some(Duration::from_nanos(8192)));
        assert_eq!(ack_timeout(14), Some(Duration::from_nanos(4096 << 14)));
    }
}
