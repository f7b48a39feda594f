//! `--cpus`: where the two ends of a test, and of its baselines, run.
//!
//! On these 2-core machines the placement of threads decides a result more than most code
//! changes do (docs/performance.md#measured-costs-on-this-machine-class: a TCP loopback stream runs at ≈ 1.5 GB/s with one core per end and
//! ≈ 2.8 GB/s with both ends on one core; a blocked thread woken from the other core costs
//! ≈ 50 µs). Left to the scheduler, consecutive runs land on different placements, so a
//! ratio can move 2× between trials. Pinning both the softroce test and its baselines the
//! same way makes them comparable, and states the placement with the result.

use crate::BoxError;
use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};
use std::str::FromStr;

/// The CPUs of the two ends: the client side (the requester, its driver thread, and the
/// sending or pinging end of each baseline) and the server side (the responder, its driver
/// thread, and the receiving or echoing end of each baseline). Both may be one CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// CPU of the client side's threads.
    pub client: usize,
    /// CPU of the server side's threads.
    pub server: usize,
}

/// An end of a test or baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The side that starts: perftest's client, the baselines' sender or pinger.
    Client,
    /// The side that answers: perftest's server, the baselines' receiver or echoer.
    Server,
}

impl Placement {
    /// Pins the calling thread to `end`'s CPU. Threads it creates afterwards (a device's
    /// driver thread) inherit the pinning. Errors: the kernel's `sched_setaffinity` error
    /// (`EINVAL` for a CPU this process may not use).
    pub fn pin(&self, end: End) -> Result<(), BoxError> {
        let cpu = match end {
            End::Client => self.client,
            End::Server => self.server,
        };
        let mut set = CpuSet::new();
        set.set(cpu);
        sched_setaffinity(None, &set)
            .map_err(|e| format!("--cpus: cannot run on CPU {cpu}: {e}"))?;
        Ok(())
    }

    /// Checks that this process may run on both CPUs (they are in its affinity mask), so
    /// that a bad `--cpus` is refused before anything starts. Errors: the CPU that is not.
    pub fn check(&self) -> Result<(), BoxError> {
        let allowed = sched_getaffinity(None).map_err(|e| format!("--cpus: {e}"))?;
        for cpu in [self.client, self.server] {
            if !allowed.is_set(cpu) {
                return Err(format!("--cpus: this process may not run on CPU {cpu}").into());
            }
        }
        Ok(())
    }

    /// Pins the calling thread to `end`'s CPU when a placement is given.
    pub fn pin_opt(p: Option<Placement>, end: End) -> Result<(), BoxError> {
        p.map_or(Ok(()), |p| p.pin(end))
    }

    /// How the placement is printed beside results: `client CPU 0, server CPU 1`.
    pub fn describe(p: Option<Placement>) -> String {
        match p {
            Some(p) if p.client == p.server => format!("both ends on CPU {}", p.client),
            Some(p) => format!("client CPU {}, server CPU {}", p.client, p.server),
            None => "threads placed by the scheduler (no --cpus)".into(),
        }
    }
}

impl FromStr for Placement {
    type Err = String;

    /// `A,B` (client on CPU A, server on CPU B) or `A` (both on CPU A).
    fn from_str(s: &str) -> Result<Placement, String> {
        let cpu = |t: &str| {
            t.trim()
                .parse::<usize>()
                .ok()
                .filter(|c| *c < CpuSet::MAX_CPU)
                .ok_or_else(|| format!("'{t}' is not a CPU number"))
        };
        match s.split_once(',') {
            Some((a, b)) => Ok(Placement {
                client: cpu(a)?,
                server: cpu(b)?,
            }),
            None => {
                let c = cpu(s)?;
                Ok(Placement {
                    client: c,
                    server: c,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_one_or_two_cpus() {
        assert_eq!(
            "0,1".parse(),
            Ok(Placement {
                client: 0,
                server: 1
            })
        );
        assert_eq!(
            "1".parse(),
            Ok(Placement {
                client: 1,
                server: 1
            })
        );
        assert!("x,1".parse::<Placement>().is_err());
        assert!("0,".parse::<Placement>().is_err());
        assert!("99999".parse::<Placement>().is_err());
    }

    #[test]
    fn pins_this_thread() {
        // The last CPU this process may use (not necessarily 0 under a restricting taskset).
        let allowed = sched_getaffinity(None).unwrap_or_else(|e| panic!("{e}"));
        let cpu = (0..CpuSet::MAX_CPU)
            .rev()
            .find(|c| allowed.is_set(*c))
            .unwrap_or_else(|| panic!("no CPU allowed"));
        let p: Placement = cpu.to_string().parse().unwrap_or_else(|e| panic!("{e}"));
        p.check().unwrap_or_else(|e| panic!("{e}"));
        std::thread::spawn(move || {
            p.pin(End::Client).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(rustix::thread::sched_getcpu(), cpu);
        })
        .join()
        .unwrap_or_else(|_| panic!("pinned thread panicked"));
    }
}
