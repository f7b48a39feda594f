//! Results as perftest prints them (`print_report_bw`, `print_report_lat`,
//! `print_report_lat_duration` in perftest's `src/perftest_parameters.c`), as JSON lines
//! (`--json`), and beside a baseline with the ratio.

use serde_json::json;
use std::fmt::Display;

/// perftest's `RESULT_LINE`.
pub const LINE: &str =
    "---------------------------------------------------------------------------------------";
/// perftest's `LAT_MEASURE_TAIL`: the slowest samples left out of the latency statistics.
const LAT_MEASURE_TAIL: usize = 2;

/// Where text goes. With `--json` the JSON lines alone go to stdout and every other line to
/// stderr; a `quiet` side (the server of `--loopback`) prints nothing.
#[derive(Debug, Clone, Copy)]
pub struct Out {
    /// `--json`.
    pub json: bool,
    /// Print nothing.
    pub quiet: bool,
    /// `--report_gbits`: bandwidth in Gb/s (10^9 bits) instead of MB/s (2^20 bytes).
    pub gbits: bool,
}

impl Out {
    /// A line of human-readable text.
    pub fn line(&self, s: impl Display) {
        if self.quiet {
        } else if self.json {
            eprintln!("{s}");
        } else {
            println!("{s}");
        }
    }

    fn json_line(&self, v: serde_json::Value) {
        if !self.quiet {
            println!("{v}");
        }
    }

    /// perftest's bandwidth header (`RESULT_FMT` / `RESULT_FMT_G`).
    pub fn bw_header(&self) {
        if !self.json {
            self.line(LINE);
            let unit = if self.gbits { "Gb/sec" } else { "MB/sec" };
            self.line(format!(
                " #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]"
            ));
        }
    }

    /// perftest's latency header (`RESULT_FMT_LAT`, or `RESULT_FMT_LAT_DUR` with `-D`).
    pub fn lat_header(&self, duration: bool) {
        if !self.json {
            self.line(LINE);
            self.line(if duration {
                " #bytes        #iterations       t_avg[usec]    tps average"
            } else {
                " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
            });
        }
    }

    /// One bandwidth row, or its JSON object.
    pub fn bw_row(&self, test: &str, r: &BwResult) {
        let (peak, avg) = (self.bw(r.bw_peak), self.bw(r.bw_avg));
        if self.json {
            let unit = if self.gbits { "gb_sec" } else { "mb_sec" };
            self.json_line(json!({
                "test": test,
                "bytes": r.size,
                "iterations": r.iters,
                format!("bw_peak_{unit}"): peak,
                format!("bw_average_{unit}"): avg,
                "msg_rate_mpps": r.msg_rate,
            }));
        } else if self.gbits {
            self.line(format!(
                " {:<7}    {}           {:<7.6}            {:<7.6}            {:<7.6}",
                r.size, r.iters, peak, avg, r.msg_rate
            ));
        } else {
            self.line(format!(
                " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
                r.size, r.iters, peak, avg, r.msg_rate
            ));
        }
    }

    /// One latency row, or its JSON object.
    pub fn lat_row(&self, test: &str, r: &LatResult) {
        match r {
            LatResult::Iters(s) if self.json => self.json_line(json!({
                "test": test,
                "bytes": s.size,
                "iterations": s.iters,
                "t_min_usec": s.t_min,
                "t_max_usec": s.t_max,
                "t_typical_usec": s.t_typical,
                "t_avg_usec": s.t_avg,
                "t_stdev_usec": s.t_stdev,
                "percentile_99_usec": s.p99,
                "percentile_99_9_usec": s.p99_9,
            })),
            LatResult::Iters(s) => self.line(format!(
                " {:<7} {:<10} {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
                s.size, s.iters, s.t_min, s.t_max, s.t_typical, s.t_avg, s.t_stdev, s.p99, s.p99_9
            )),
            LatResult::Duration(d) if self.json => self.json_line(json!({
                "test": test,
                "bytes": d.size,
                "iterations": d.iters,
                "t_avg_usec": d.t_avg,
                "tps_average": d.tps,
            })),
            LatResult::Duration(d) => self.line(format!(
                " {:<7}       {:<10}     {:<7.2}        {:<7.2}",
                d.size, d.iters, d.t_avg, d.tps
            )),
        }
    }

    /// A softroce result beside its baseline (`c`), with softroce / baseline.
    pub fn compare(&self, c: &Compared, baseline_name: &str) {
        let ratio = c.ratio();
        if self.json {
            self.json_line(json!({
                "compare": c.what,
                "unit": c.unit,
                "softroce": c.ours,
                "baseline": baseline_name,
                "baseline_value": c.theirs,
                "ratio": ratio,
            }));
        } else {
            self.line(compare_text(c, baseline_name, ratio));
        }
    }

    /// A `--trials` summary row: the medians of both figures (`medians`) and of the ratio
    /// (`ratio`, not the ratio of the medians), with the ratio's range over `n` trials.
    pub fn summary(
        &self,
        medians: &Compared,
        baseline_name: &str,
        ratio: f64,
        (lo, hi): (f64, f64),
        n: usize,
    ) {
        if self.json {
            self.json_line(json!({
                "compare": medians.what,
                "unit": medians.unit,
                "trials": n,
                "softroce_median": medians.ours,
                "baseline": baseline_name,
                "baseline_median": medians.theirs,
                "ratio_median": ratio,
                "ratio_min": lo,
                "ratio_max": hi,
            }));
        } else {
            let row = compare_text(medians, baseline_name, ratio);
            self.line(format!("{row} [{lo:.3}-{hi:.3}]"));
        }
    }

    fn bw(&self, mb_per_sec: f64) -> f64 {
        if self.gbits {
            mb_per_sec * f64::from(1u32 << 20) * 8.0 / 1e9
        } else {
            mb_per_sec
        }
    }
}

/// One printed comparison: what was compared, its unit, softroce's figure, the baseline's.
#[derive(Debug, Clone, PartialEq)]
pub struct Compared {
    /// Row label, e.g. "BW average 65536 B".
    pub what: String,
    /// "MB/sec" or "usec".
    pub unit: &'static str,
    /// softroce's figure.
    pub ours: f64,
    /// The baseline's figure.
    pub theirs: f64,
}

impl Compared {
    /// softroce / baseline (0 when the baseline measured nothing).
    pub fn ratio(&self) -> f64 {
        if self.theirs > 0.0 {
            self.ours / self.theirs
        } else {
            0.0
        }
    }
}

/// The text of a comparison row ([`Out::compare`], [`Out::summary`]).
fn compare_text(c: &Compared, baseline_name: &str, ratio: f64) -> String {
    let Compared {
        what,
        unit,
        ours,
        theirs,
    } = c;
    format!(
        " {what:<28} softroce {ours:>12.2} {unit:<8} {baseline_name:<14} {theirs:>12.2} {unit:<8} ratio {ratio:.3}"
    )
}

/// One bandwidth row (MB/s, MB = 2^20 bytes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwResult {
    /// Message size in bytes.
    pub size: u64,
    /// Messages, all QPs together (perftest's `#iterations` with `-q`).
    pub iters: u64,
    /// Peak bandwidth, MB/s.
    pub bw_peak: f64,
    /// Average bandwidth, MB/s.
    pub bw_avg: f64,
    /// Millions of messages per second.
    pub msg_rate: f64,
}

impl BwResult {
    /// Bandwidth from completion times (seconds): `done_s[i]` is when message i completed,
    /// `start_s` when the first was posted. Average = bytes / (last completion − start).
    /// Peak follows perftest's `print_report_bw`: one message's size over the shortest
    /// post-to-completion time of any message (`best_s`), never below the average; without
    /// post times (a receiving server) it is the average. `done_s` and `iters` count all
    /// QPs' messages.
    pub fn from_times(
        size: u64,
        iters: u64,
        start_s: f64,
        done_s: &[f64],
        best_s: Option<f64>,
    ) -> BwResult {
        let mib = f64::from(1u32 << 20);
        let n = done_s.len();
        let total = done_s.last().map_or(0.0, |last| last - start_s).max(1e-9);
        let bytes = size as f64;
        let avg = bytes * n as f64 / total / mib;
        let peak = best_s
            .filter(|b| *b > 0.0)
            .map_or(avg, |b| (bytes / b / mib).max(avg));
        BwResult {
            size,
            iters,
            bw_peak: peak,
            bw_avg: avg,
            msg_rate: n as f64 / total / 1e6,
        }
    }
}

/// The statistics of `print_report_lat`, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatStats {
    /// Message size in bytes.
    pub size: u64,
    /// Iterations run.
    pub iters: u64,
    /// Smallest sample.
    pub t_min: f64,
    /// Largest sample kept (perftest drops the two slowest, then prints the next).
    pub t_max: f64,
    /// Median.
    pub t_typical: f64,
    /// Mean.
    pub t_avg: f64,
    /// Standard deviation (perftest's: each deviation truncated to whole microseconds).
    pub t_stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p99_9: f64,
}

/// `print_report_lat_duration`: mean latency and transactions per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatDuration {
    /// Message size in bytes.
    pub size: u64,
    /// Iterations done in the time.
    pub iters: u64,
    /// Mean latency, us.
    pub t_avg: f64,
    /// Iterations per second.
    pub tps: f64,
}

/// A latency result: `-n` iterations or `-D` seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LatResult {
    /// Iteration mode.
    Iters(LatStats),
    /// Duration mode.
    Duration(LatDuration),
}

impl LatResult {
    /// The typical (median) latency, or the mean in duration mode, us.
    pub fn typical(&self) -> f64 {
        match self {
            LatResult::Iters(s) => s.t_typical,
            LatResult::Duration(d) => d.t_avg,
        }
    }

    /// perftest's latency statistics from post timestamps (us): the samples are the gaps
    /// between consecutive posts divided by `rtt_factor` (2 for the ping-pongs, where a gap
    /// is a round trip; 1 for READ). The samples are sorted and the two slowest dropped
    /// (`LAT_MEASURE_TAIL`); t_max, the 99% and the 99.9% percentiles index the sorted
    /// samples at the kept count, `ceil(kept * 0.99)` and `ceil(kept * 0.999)` as perftest's
    /// `print_report_lat` does.
    pub fn from_posts(size: u64, posted_us: &[f64], rtt_factor: f64) -> LatResult {
        let mut d: Vec<f64> = posted_us
            .windows(2)
            .map(|w| (w[1] - w[0]) / rtt_factor)
            .collect();
        d.sort_by(f64::total_cmp);
        let at = |i: usize| {
            d.get(i.min(d.len().saturating_sub(1)))
                .copied()
                .unwrap_or(0.0)
        };
        let kept = d.len().saturating_sub(LAT_MEASURE_TAIL).max(1).min(d.len());
        let median = if kept == 0 {
            0.0
        } else if kept.is_multiple_of(2) {
            (at(kept / 2) + at(kept / 2 - 1)) / 2.0
        } else {
            at(kept / 2)
        };
        let avg = if kept == 0 {
            0.0
        } else {
            d[..kept].iter().sum::<f64>() / kept as f64
        };
        let var = if kept == 0 {
            0.0
        } else {
            d[..kept]
                .iter()
                .map(|x| (avg - x).trunc().powi(2))
                .sum::<f64>()
                / kept as f64
        };
        let p99 = (kept as f64 * 0.99).ceil() as usize;
        let p99_9 = (kept as f64 * 0.999).ceil() as usize;
        LatResult::Iters(LatStats {
            size,
            iters: posted_us.len() as u64,
            t_min: at(0),
            t_max: at(kept),
            t_typical: median,
            t_avg: avg,
            t_stdev: var.sqrt(),
            p99: at(p99),
            p99_9: at(p99_9),
        })
    }

    /// Duration mode: `iters` iterations in `secs` seconds.
    pub fn from_duration(size: u64, iters: u64, secs: f64, rtt_factor: f64) -> LatResult {
        let secs = secs.max(1e-9);
        let n = iters.max(1) as f64;
        LatResult::Duration(LatDuration {
            size,
            iters,
            t_avg: secs * 1e6 / n / rtt_factor,
            tps: iters as f64 / secs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_statistics_follow_print_report_lat() {
        // Five posts, four round trips of 100, 200, 300 and 1000 us: halved, sorted, two
        // dropped from the tail, so two are kept (50 and 100).
        let posts = [0.0, 100.0, 300.0, 600.0, 1600.0];
        let LatResult::Iters(s) = LatResult::from_posts(64, &posts, 2.0) else {
            panic!("iteration mode");
        };
        assert_eq!(s.iters, 5);
        assert_eq!((s.t_min, s.t_typical, s.t_avg), (50.0, 75.0, 75.0));
        assert_eq!(
            s.t_max, 150.0,
            "the first dropped sample, as perftest prints it"
        );
        assert_eq!((s.p99, s.p99_9), (150.0, 150.0));
        assert_eq!(s.t_stdev, 25.0);
        // One post: no samples, and no panic.
        assert!(matches!(
            LatResult::from_posts(2, &[5.0], 1.0),
            LatResult::Iters(LatStats { t_min: 0.0, .. })
        ));
    }

    #[test]
    fn bandwidth_average_and_peak() {
        let done: Vec<f64> = (1..=10).map(|i| f64::from(i) * 0.001).collect();
        let r = BwResult::from_times(1 << 20, 10, 0.0, &done, Some(0.0005));
        assert!((r.bw_avg - 1000.0).abs() < 1e-6, "{r:?}");
        assert!((r.bw_peak - 2000.0).abs() < 1e-6, "{r:?}");
        let r = BwResult::from_times(1 << 20, 10, 0.0, &done, None);
        assert_eq!(r.bw_peak, r.bw_avg);
        assert!((r.msg_rate - 0.001).abs() < 1e-9);
    }
}
