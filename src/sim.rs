//! `softroce sim`: random workloads on simulated devices over a seeded lossy link, checked
//! against a reference model: `--workload rc` (two devices, one RC QP pair; see
//! `softroce::net::sim::workload`) or `--workload mesh` (2-4 devices, RC/UC/UD QPs between
//! random pairs, SRQs and error paths; see `softroce::net::sim::mesh`).

use super::BoxError;
use softroce::net::sim::SimFaults;
use softroce::net::sim::mesh::{MeshConfig, MeshReport};
use softroce::net::sim::workload::{Report, WorkloadConfig, run};
use softroce::verbs::PathMtu;
use std::time::Instant;

/// Which workload `softroce sim` runs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Two devices, one RC QP pair, every RC operation.
    Rc,
    /// 2-4 devices, RC/UC/UD QPs between random pairs, SRQs, and error paths (bad R_Key, QP
    /// to ERR, QP destroyed, MR deregistered, RNR exhaustion, memory window invalidated,
    /// device closed); `--ops` per connection.
    Mesh,
}

/// Options of `softroce sim`.
#[derive(clap::Args, Debug)]
pub struct SimArgs {
    /// The workload.
    #[arg(long, value_enum, default_value_t = Workload::Rc)]
    workload: Workload,
    /// Mesh: no error paths, only traffic.
    #[arg(long)]
    no_mishaps: bool,
    /// First seed (every random choice of a run comes from its seed); default: the
    /// `SOFTROCE_SEED` environment variable, else 1.
    #[arg(long)]
    seed: Option<u64>,
    /// How many consecutive seeds to run (a soak).
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    /// Operations per run (mesh: per connection).
    #[arg(long, default_value_t = 100)]
    ops: usize,
    /// Probability a datagram is lost (0..1). Unset: drawn from the seed, like the other
    /// fault parameters.
    #[arg(long)]
    loss: Option<f64>,
    /// Probability a datagram is duplicated.
    #[arg(long)]
    dup: Option<f64>,
    /// Probability a datagram is held back behind later ones.
    #[arg(long)]
    reorder: Option<f64>,
    /// Probability one bit of a datagram is flipped.
    #[arg(long)]
    corrupt: Option<f64>,
    /// Path MTU in bytes (256..4096); unset: drawn from the seed.
    #[arg(long)]
    mtu: Option<u32>,
    /// Largest message in bytes (default: 1 MiB for rc, 16 KiB for mesh).
    #[arg(long)]
    max_size: Option<usize>,
    /// One JSON object per run instead of text.
    #[arg(long)]
    json: bool,
}

fn json_report(r: &Report, faults: &SimFaults, wall_ms: u128) -> String {
    let counters = |c: &softroce::verbs::Counters| {
        c.entries()
            .iter()
            .filter(|(_, v)| *v > 0)
            .map(|(k, v)| format!("\"{k}\":{v}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let violations = r
        .violations
        .iter()
        .map(|v| format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect::<Vec<_>>()
        .join(",");
    format!(
        concat!(
            "{{\"seed\":{},\"result\":\"{}\",\"retry_exhausted_at_op\":{},\"ops\":{},\"bytes\":{},\"mtu\":{},",
            "\"faults\":{{\"loss\":{},\"dup\":{},\"reorder\":{},\"corrupt\":{},\"delay_ns\":{}}},",
            "\"packets\":{{\"sent\":{},\"delivered\":{},\"lost\":{},\"duplicated\":{},\"reordered\":{},\"corrupted\":{}}},",
            "\"retransmit_timeouts\":{},\"naks\":{{\"psn_seq\":{},\"rnr\":{}}},",
            "\"requester\":{{{}}},\"responder\":{{{}}},\"virtual_ns\":{},\"wall_ms\":{},\"violations\":[{}]}}"
        ),
        r.seed,
        if r.ok() { "pass" } else { "FAIL" },
        r.retry_exhausted
            .map_or("null".to_string(), |i| i.to_string()),
        r.ops_done,
        r.bytes,
        r.mtu.bytes(),
        faults.loss,
        faults.dup,
        faults.reorder,
        faults.corrupt,
        faults.delay_ns,
        r.link.sent,
        r.link.delivered,
        r.link.lost,
        r.link.duplicated,
        r.link.reordered,
        r.link.corrupted,
        r.requester.completer_retry_err,
        r.requester.rcvd_seq_err,
        r.requester.rcvd_rnr_err,
        counters(&r.requester),
        counters(&r.responder),
        r.virtual_ns,
        wall_ms,
        violations
    )
}

/// Runs the seeds; fails (non-zero exit) if any run disagreed with the model.
pub fn run_sim(a: SimArgs) -> Result<(), BoxError> {
    let mtu = match a.mtu {
        None => None,
        Some(b) => {
            Some(PathMtu::from_bytes(b).ok_or("--mtu must be 256, 512, 1024, 2048 or 4096")?)
        }
    };
    for p in [a.loss, a.dup, a.reorder, a.corrupt].into_iter().flatten() {
        if !(0.0..=1.0).contains(&p) {
            return Err("fault probabilities are between 0 and 1".into());
        }
    }
    let first = match a.seed {
        Some(s) => s,
        None => match std::env::var("SOFTROCE_SEED") {
            Ok(v) => v.parse().map_err(|_| "SOFTROCE_SEED must be a number")?,
            Err(_) => 1,
        },
    };
    if a.workload == Workload::Mesh {
        return run_mesh(&a, first);
    }
    let started = Instant::now();
    let (mut failed, mut ops, mut packets, mut retries) = (0u64, 0u64, 0u64, 0u64);
    let mut exhausted = 0u64;
    // Ctrl-C stops between seeds; the summary says how many ran.
    crate::interrupt::handle_in_command();
    let mut ran = 0u64;
    for seed in first..first.saturating_add(a.seeds) {
        if crate::interrupt::interrupted() {
            break;
        }
        ran += 1;
        let mut cfg = WorkloadConfig::from_seed(seed, a.ops);
        cfg.mtu = mtu;
        cfg.max_size = a.max_size.unwrap_or(1 << 20).max(8);
        let f = &mut cfg.faults;
        if let Some(v) = a.loss {
            f.loss = v;
        }
        if let Some(v) = a.dup {
            f.dup = v;
        }
        if let Some(v) = a.reorder {
            f.reorder = v;
        }
        if let Some(v) = a.corrupt {
            f.corrupt = v;
        }
        let t = Instant::now();
        let r = run(&cfg);
        let wall_ms = t.elapsed().as_millis();
        ops += r.ops_done as u64;
        packets += r.link.sent;
        retries +=
            r.requester.completer_retry_err + r.requester.rcvd_seq_err + r.requester.rcvd_rnr_err;
        if a.json {
            println!("{}", json_report(&r, &cfg.faults, wall_ms));
        } else {
            println!(
                "seed {seed}: {} — {} ops, {} B, MTU {}, {} datagrams ({} lost, {} dup, {} reordered, {} corrupted), \
                 {} timeouts, {} NAK-seq, {} RNR NAKs, {:.3} ms virtual, {wall_ms} ms wall",
                if r.ok() { "pass" } else { "FAIL" },
                r.ops_done,
                r.bytes,
                r.mtu.bytes(),
                r.link.sent,
                r.link.lost,
                r.link.duplicated,
                r.link.reordered,
                r.link.corrupted,
                r.requester.completer_retry_err,
                r.requester.rcvd_seq_err,
                r.requester.rcvd_rnr_err,
                r.virtual_ns as f64 / 1e6
            );
            if let Some(i) = r.retry_exhausted {
                println!(
                    "  op {i} used up retry_cnt (IBV_WC_RETRY_EXC_ERR); later WRs flushed; state checked"
                );
                exhausted += 1;
            }
            for v in &r.violations {
                println!("  violation: {v}");
            }
        }
        if !r.ok() {
            failed += 1;
            eprintln!("replay with: {}", replay(&a, seed));
        }
    }
    let stopped = ran < a.seeds;
    if !a.json && (a.seeds > 1 || stopped) {
        let of = if stopped {
            format!(" (interrupted: {ran} of {} seeds ran)", a.seeds)
        } else {
            String::new()
        };
        println!(
            "{ran} seeds{of}, {failed} failed, {exhausted} ended in legitimate retry exhaustion: {ops} ops, {packets} datagrams, {retries} retries, {:.1} s wall",
            started.elapsed().as_secs_f64()
        );
    }
    if failed > 0 {
        return Err(format!("{failed} of {ran} seeds disagreed with the model").into());
    }
    if stopped {
        return Err(format!("interrupted after {ran} of {} seeds", a.seeds).into());
    }
    Ok(())
}

/// The command that replays `seed` with the options of this run.
fn replay(a: &SimArgs, seed: u64) -> String {
    let mut c = format!("softroce sim --seed {seed} --ops {}", a.ops);
    if a.workload == Workload::Mesh {
        c.insert_str("softroce sim".len(), " --workload mesh");
    }
    if a.no_mishaps {
        c.push_str(" --no-mishaps");
    }
    for (name, v) in [
        ("loss", a.loss),
        ("dup", a.dup),
        ("reorder", a.reorder),
        ("corrupt", a.corrupt),
    ] {
        if let Some(v) = v {
            c.push_str(&format!(" --{name} {v}"));
        }
    }
    if let Some(m) = a.mtu {
        c.push_str(&format!(" --mtu {m}"));
    }
    if let Some(m) = a.max_size {
        c.push_str(&format!(" --max-size {m}"));
    }
    c
}

fn mesh_json(r: &MeshReport, faults: &SimFaults, wall_ms: u128) -> String {
    let esc = |v: &str| format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""));
    let conns = r.conns.iter().map(|c| esc(c)).collect::<Vec<_>>().join(",");
    let violations = r
        .violations
        .iter()
        .map(|v| esc(v))
        .collect::<Vec<_>>()
        .join(",");
    format!(
        concat!(
            "{{\"seed\":{},\"workload\":\"mesh\",\"result\":\"{}\",\"devices\":{},\"completions\":{},\"bytes\":{},",
            "\"faults\":{{\"loss\":{},\"dup\":{},\"reorder\":{},\"corrupt\":{},\"delay_ns\":{}}},",
            "\"packets\":{{\"sent\":{},\"lost\":{},\"duplicated\":{},\"reordered\":{},\"corrupted\":{}}},",
            "\"virtual_ns\":{},\"wall_ms\":{},\"conns\":[{}],\"violations\":[{}]}}"
        ),
        r.seed,
        if r.ok() { "pass" } else { "FAIL" },
        r.devices,
        r.completions,
        r.bytes,
        faults.loss,
        faults.dup,
        faults.reorder,
        faults.corrupt,
        faults.delay_ns,
        r.link.sent,
        r.link.lost,
        r.link.duplicated,
        r.link.reordered,
        r.link.corrupted,
        r.virtual_ns,
        wall_ms,
        conns,
        violations
    )
}

/// `--workload mesh`: one mesh run per seed; fails if any disagreed with the model.
fn run_mesh(a: &SimArgs, first: u64) -> Result<(), BoxError> {
    if a.mtu.is_some() {
        return Err("--mtu applies to the rc workload (mesh draws one per connection)".into());
    }
    let started = Instant::now();
    let (mut failed, mut completions, mut packets) = (0u64, 0u64, 0u64);
    let mut ran = 0u64;
    crate::interrupt::handle_in_command();
    for seed in first..first.saturating_add(a.seeds) {
        if crate::interrupt::interrupted() {
            break;
        }
        ran += 1;
        let mut cfg = MeshConfig::from_seed(seed, a.ops);
        cfg.max_size = a.max_size.unwrap_or(16 << 10).max(8);
        cfg.mishaps = !a.no_mishaps;
        let f = &mut cfg.faults;
        for (v, field) in [
            (a.loss, &mut f.loss),
            (a.dup, &mut f.dup),
            (a.reorder, &mut f.reorder),
            (a.corrupt, &mut f.corrupt),
        ] {
            if let Some(v) = v {
                *field = v;
            }
        }
        let t = Instant::now();
        let r = softroce::net::sim::mesh::run(&cfg);
        let wall_ms = t.elapsed().as_millis();
        completions += r.completions;
        packets += r.link.sent;
        if a.json {
            println!("{}", mesh_json(&r, &cfg.faults, wall_ms));
        } else {
            println!(
                "seed {seed}: {} — {} devices, {} connections, {} completions, {} B, {} datagrams \
                 ({} lost, {} dup, {} reordered, {} corrupted), {:.3} ms virtual, {wall_ms} ms wall",
                if r.ok() { "pass" } else { "FAIL" },
                r.devices,
                r.conns.len(),
                r.completions,
                r.bytes,
                r.link.sent,
                r.link.lost,
                r.link.duplicated,
                r.link.reordered,
                r.link.corrupted,
                r.virtual_ns as f64 / 1e6
            );
            if a.seeds == 1 {
                for c in &r.conns {
                    println!("  {c}");
                }
            }
            for v in &r.violations {
                println!("  violation: {v}");
            }
        }
        if !r.ok() {
            failed += 1;
            eprintln!("replay with: {}", replay(a, seed));
        }
    }
    let stopped = ran < a.seeds;
    if !a.json && (a.seeds > 1 || stopped) {
        let of = if stopped {
            format!(" (interrupted: {ran} of {} seeds ran)", a.seeds)
        } else {
            String::new()
        };
        println!(
            "{ran} mesh seeds{of}, {failed} failed: {completions} completions, {packets} datagrams, {:.1} s wall",
            started.elapsed().as_secs_f64()
        );
    }
    if failed > 0 {
        return Err(format!("{failed} of {ran} seeds disagreed with the model").into());
    }
    if stopped {
        return Err(format!("interrupted after {ran} of {} seeds", a.seeds).into());
    }
    Ok(())
}
