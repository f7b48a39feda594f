//! Deterministic simulation: random RC workloads on a seeded lossy link, checked against the
//! reference model (crates/softroce/src/net/sim/workload.rs). A failure prints `SOFTROCE_SEED=<n>`; set that
//! variable to replay exactly that seed. `SOFTROCE_SIM_SEEDS=<n>` runs more seeds (soak).

use softroce::net::sim::SimFaults;
use softroce::net::sim::workload::{WorkloadConfig, run};

fn check(cfg: &WorkloadConfig) {
    let r = run(cfg);
    assert!(
        r.ok(),
        "SOFTROCE_SEED={} failed ({} ops done, MTU {:?}, faults {:?}): {:?}",
        cfg.seed,
        r.ops_done,
        r.mtu,
        cfg.faults,
        r.violations
    );
    // Under heavy loss go-back-N can legitimately use up retry_cnt; the workload then checks
    // the flush and the memory no later operation touched.
    if r.retry_exhausted.is_none() {
        assert_eq!(r.ops_done, cfg.ops);
    }
}

fn seeds(default: u64) -> Vec<u64> {
    if let Ok(s) = std::env::var("SOFTROCE_SEED") {
        return vec![s.parse().expect("SOFTROCE_SEED is a number")];
    }
    let n = std::env::var("SOFTROCE_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    (0..n).collect()
}

#[test]
fn loss_free_link() {
    for seed in seeds(20) {
        let mut cfg = WorkloadConfig::from_seed(seed, 40);
        cfg.faults = SimFaults::NONE;
        check(&cfg);
    }
}

#[test]
fn swarm_faults_from_the_seed() {
    for seed in seeds(200) {
        let mut cfg = WorkloadConfig::from_seed(seed, 30);
        cfg.max_size = 64 << 10;
        check(&cfg);
    }
}

/// Seeds the 10 000-seed soak (10% loss, 5% dup, 10% reorder, 1% corrupt) once failed on,
/// kept as regressions: 1812 stalled — a fenced WRITE waited for an atomic whose ACK was
/// lost while an RNR wait had stopped the retransmit timer, and nothing re-armed it.
#[test]
fn soak_regressions() {
    for seed in [1812u64, 619, 933] {
        let mut cfg = WorkloadConfig::from_seed(seed, 30);
        cfg.faults.loss = 0.1;
        cfg.faults.dup = 0.05;
        cfg.faults.reorder = 0.1;
        cfg.faults.corrupt = 0.01;
        check(&cfg);
    }
}
