//! When completions stop coming: a watch that the pingpong and perf loops feed, which says
//! after [`WARN_AFTER`] without a completion which device counters moved since the run began
//! (and what that usually means), and gives up after [`GIVE_UP_AFTER`].
//!
//! Two sides that do not match (`--rc` against `--ud`, `-n 20` against `-n 30`, a client
//! whose server quit) otherwise wait forever and print nothing (issue 17).

use crate::BoxError;
use softroce::net::UdpDevice;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Time without a completion after which the watch prints what it sees, once.
pub const WARN_AFTER: Duration = Duration::from_secs(5);
/// Time without a completion after which the run fails.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(30);

/// The device's counters and datagram totals at one moment.
struct Snapshot {
    tx_datagrams: u64,
    rx_datagrams: u64,
    counters: Vec<(&'static str, u64)>,
}

impl Snapshot {
    fn of(dev: &UdpDevice) -> Snapshot {
        Snapshot {
            tx_datagrams: dev.link().tx_datagrams.load(Ordering::Relaxed),
            rx_datagrams: dev.link().rx_datagrams.load(Ordering::Relaxed),
            counters: dev.counters().entries(),
        }
    }
}

/// Watches one run for completions that stop coming.
pub struct StallWatch<'a> {
    dev: &'a UdpDevice,
    start: Snapshot,
    last_progress: Instant,
    warned: bool,
}

impl<'a> StallWatch<'a> {
    /// Starts watching `dev`: its counters from now on; the time without completions from
    /// now or from the last [`StallWatch::progress`] (call it when the run starts).
    pub fn new(dev: &'a UdpDevice) -> StallWatch<'a> {
        StallWatch {
            dev,
            start: Snapshot::of(dev),
            last_progress: Instant::now(),
            warned: false,
        }
    }

    /// A completion arrived.
    pub fn progress(&mut self) {
        self.last_progress = Instant::now();
    }

    /// A wait ended without a completion. `what` names the tool (`"pingpong"`) and `done`
    /// says how far the run got (`"3 of 20 messages received"`). Prints the diagnosis to
    /// stderr once after [`WARN_AFTER`]; errors with it after [`GIVE_UP_AFTER`].
    pub fn idle(&mut self, what: &str, done: &str) -> Result<(), BoxError> {
        let quiet = self.last_progress.elapsed();
        if quiet >= GIVE_UP_AFTER {
            return Err(format!(
                "no completion for {} s ({done}); giving up. {}",
                quiet.as_secs(),
                self.diagnosis()
            )
            .into());
        }
        if quiet >= WARN_AFTER && !self.warned {
            self.warned = true;
            eprintln!(
                "{what}: no completion for {} s ({done}). {} Still waiting (gives up after {} s).",
                quiet.as_secs(),
                self.diagnosis(),
                GIVE_UP_AFTER.as_secs()
            );
        }
        Ok(())
    }

    /// The counters that moved since the run began, and what they suggest.
    pub fn diagnosis(&self) -> String {
        let now = Snapshot::of(self.dev);
        let mut moved = Vec::new();
        let rx = now.rx_datagrams.saturating_sub(self.start.rx_datagrams);
        let tx = now.tx_datagrams.saturating_sub(self.start.tx_datagrams);
        moved.push(format!("rx_datagrams +{rx}"));
        moved.push(format!("tx_datagrams +{tx}"));
        let mut drops = Vec::new();
        for ((name, v), (_, v0)) in now.counters.iter().zip(&self.start.counters) {
            if v > v0 {
                moved.push(format!("{name} +{}", v - v0));
                drops.push(*name);
            }
        }
        let hint = hint(rx, &drops);
        format!(
            "Device counters since the device opened: {}. {hint}",
            moved.join(", ")
        )
    }
}

/// The likely cause, from what moved.
fn hint(rx: u64, moved: &[&str]) -> &'static str {
    let has = |n: &str| moved.contains(&n);
    if has("wrong_qp_type") {
        "Packets of another transport reached the QP: do both sides run the same mode (--rc, --uc, --ud, --srq) or the same test?"
    } else if has("rcvd_rnr_err") || has("send_rnr_err") || has("ud_no_receive") {
        "Messages found no receive posted: do both sides use the same size (-s), depth and test?"
    } else if has("bad_qkey") {
        "UD packets carried another Q_Key: is the peer the same kind of program?"
    } else if has("unknown_qp") {
        "Packets reached a QP number that does not exist here: did the peer restart, or connect to another run?"
    } else if has("wrong_qp_state") || has("uc_message_dropped") || has("out_of_sequence_dropped") {
        "Packets arrive but are dropped (see the counters): did the peer restart or run with other options?"
    } else if rx == 0 {
        "Nothing arrived: has the peer finished or quit (a different -n?), or is it sending to another address?"
    } else {
        "Packets arrive but complete nothing here: do both sides run the same test with the same options (-n, -s, mode)?"
    }
}
