//! Deterministic simulation of a mesh: several devices, many RC/UC/UD QPs each between
//! random pairs, some on a shared receive queue, some with a mishap (bad R_Key, QP to ERR,
//! QP destroyed, MR deregistered, RNR exhaustion, a memory window invalidated by
//! SEND_WITH_INVALIDATE, a device closed), all checked against the reference model in
//! crates/softroce/src/net/sim/mesh/.
//!
//! A failure prints `SOFTROCE_SEED=<n>`; set that variable to replay exactly that seed.
//! `SOFTROCE_SIM_SEEDS=<n>` runs more seeds; the `#[ignore]`d `mesh_soak` runs
//! `SOFTROCE_SIM_SEEDS` seeds (default 1000) from `SOFTROCE_SIM_FIRST` (default 0):
//! `SOFTROCE_SIM_SEEDS=100000 cargo test --release --test sim_mesh -- --ignored`.

use softroce::net::sim::SimFaults;
use softroce::net::sim::mesh::{ConnEnd, MeshConfig, MeshReport, run};
use softroce::verbs::{QpType, WcStatus};
use std::collections::BTreeMap;

/// Runs one seed and panics, naming the seed, if the model disagreed.
fn check(cfg: &MeshConfig) -> MeshReport {
    let r = run(cfg);
    assert!(
        r.ok(),
        "SOFTROCE_SEED={} failed ({} devices, faults {:?}):\n  {}\nconnections:\n  {}",
        cfg.seed,
        r.devices,
        cfg.faults,
        r.violations.join("\n  "),
        r.conns.join("\n  ")
    );
    r
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
fn mesh_on_a_loss_free_link() {
    for seed in seeds(30) {
        let mut cfg = MeshConfig::from_seed(seed, 20);
        cfg.faults = SimFaults::NONE;
        check(&cfg);
    }
}

#[test]
fn mesh_with_swarm_faults_from_the_seed() {
    let seeds = seeds(120);
    let mut ends: Vec<ConnEnd> = Vec::new();
    for &seed in &seeds {
        ends.extend(check(&MeshConfig::from_seed(seed, 16)).ends);
    }
    if seeds.len() < 120 {
        return;
    }
    // Not vacuous: every transport carries receives, SRQs and loopback are used, and every
    // mishap ends at least once with the status kernel rxe gives for it.
    let mut seen: BTreeMap<(&str, String), usize> = BTreeMap::new();
    for e in &ends {
        let how = e.failed.map_or("ok".to_string(), |s| format!("{s:?}"));
        *seen.entry((e.mishap, how)).or_default() += 1;
    }
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let recvs: usize = ends
            .iter()
            .filter(|e| e.qp_type == t)
            .map(|e| e.recvs)
            .sum();
        assert!(recvs > 0, "no {t:?} receive completed: {seen:?}");
        assert!(
            ends.iter().any(|e| e.qp_type == t && e.srq && e.recvs > 0),
            "no {t:?} receive through an SRQ"
        );
    }
    assert!(
        ends.iter().any(|e| e.loopback && e.recvs > 0),
        "no loopback"
    );
    for want in [
        ("bad_rkey", WcStatus::RemAccessErr),
        ("requester_err", WcStatus::WrFlushErr),
        ("responder_err", WcStatus::RetryExcErr),
        ("destroy_responder", WcStatus::RetryExcErr),
        ("dereg_remote", WcStatus::RemAccessErr),
        ("rnr_starve", WcStatus::RnrRetryExcErr),
        ("mw_invalidate", WcStatus::RemAccessErr),
        // The requester's device closed: its QPs flush. The responder's: retries run out.
        ("device_close", WcStatus::WrFlushErr),
        ("device_close", WcStatus::RetryExcErr),
    ] {
        assert!(
            seen.contains_key(&(want.0, format!("{:?}", want.1))),
            "{} never ended {}: {seen:?}",
            want.0,
            want.1
        );
    }
    assert!(
        ends.iter()
            .any(|e| e.mishap == "destroy_requester" && e.ops_done < 16),
        "no requester destroyed mid-transfer: {seen:?}"
    );
    eprintln!("{seen:?}");
}

/// Seeds the soaks failed on, kept as regressions. With 16 ops: 422, 896, 2274, 3851 (a
/// receive completed IBV_WC_REM_ACCESS_ERR when a retried READ met a deregistered MR while a
/// SEND was in progress); 2118, 2223, 2682, 3576, 3713 (a livelock of the model: it stopped
/// posting receives before the responder was in ERR); 3616, 4533 (a NAK overtaken by an
/// earlier READ's response). With 40 ops of up to 64 KiB: 7477 (a duplicated READ NAKed after
/// its completion). The engine bugs the first soaks found have unit tests of their own
/// (transport/tests.rs: `rts_duplicate_read_whose_mr_went_away_…`,
/// `rts_nak_past_an_unanswered_atomic_…`).
#[test]
fn soak_regressions() {
    for seed in [
        422u64, 896, 2118, 2223, 2274, 2682, 3576, 3616, 3713, 3851, 4533,
    ] {
        check(&MeshConfig::from_seed(seed, 16));
    }
    let mut cfg = MeshConfig::from_seed(7477, 40);
    cfg.max_size = 64 << 10;
    check(&cfg);
}

#[test]
#[ignore = "soak: SOFTROCE_SIM_SEEDS seeds from SOFTROCE_SIM_FIRST"]
fn mesh_soak() {
    let n: u64 = std::env::var("SOFTROCE_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let first: u64 = std::env::var("SOFTROCE_SIM_FIRST")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut failed = Vec::new();
    for seed in first..first + n {
        let cfg = MeshConfig::from_seed(seed, 16);
        let r = run(&cfg);
        if !r.ok() {
            eprintln!("SOFTROCE_SEED={seed} failed: {:?}", r.violations);
            failed.push(seed);
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {n} seeds failed: {failed:?}",
        failed.len()
    );
}
