//! Interop with Linux's kernel Soft-RoCE driver (rdma_rxe, Debian's 6.1 kernel) and the
//! unmodified rdma-core tools, in a QEMU guest.
//!
//! `tests/interop/rig.sh` builds the guest (Debian packages only), creates a network namespace
//! with a tap for QEMU, boots the guest with kernel rxe on its NIC (10.66.0.2) and tears it all
//! down afterwards; softroce runs in the same namespace (10.66.0.1), so every packet of the
//! suite stays in it. This test drives the scenarios, each in both roles:
//!
//! - `ibv_rc_pingpong` and `ibv_uc_pingpong` (guest) against `softroce pingpong --rc` / `--uc`
//!   (host), 64 B and 4096 B, path MTU 1024, and `ibv_ud_pingpong` against `--ud`, 64 B and
//!   1024 B, all with `-c`; then RC at 4096 B while netem in the guest drops 10% of the RoCE
//!   requests each way (both stacks' retransmission paths run);
//! - perftest `ib_write_bw` and `ib_read_bw` (guest) against `softroce perf write_bw` /
//!   `read_bw` (host), 16 KiB × 200, path MTU 1024: perftest's TCP exchange, the data phase and
//!   the results exchange (each side prints the client's numbers);
//! - RDMA WRITE between softroce's `examples/rdma_write_{server,client}` and a pyverbs peer in
//!   the guest (`tests/interop/guest/pyverbs_peer.py`), with the right rkey and with a wrong one
//!   (NAK remote access error, AETH syndrome 0x62, `IBV_WC_REM_ACCESS_ERR`, nothing written);
//! - a control run of `ibv_rc_pingpong` between two rxe devices inside the guest, to show what
//!   rxe does on its own (see the note on spurious retries in docs/interop.md).
//!
//! Each scenario checks exit statuses, the tools' result lines and the data (softroce verifies
//! every message it receives; rc_pingpong -c checks its pages; the WRITE scenarios look at the
//! target buffer), and reads the guest's rxe hw_counters before and after: rxe's `rcvd_pkts`
//! (which counts a packet only after its ICRC and header checks passed) must grow by exactly
//! the number of packets softroce sent, so rxe accepted every one of them.
//!
//! The test is `#[ignore]`d: it needs root, /dev/net/tun, apt-get and about two minutes. Run it
//! with `tests/interop/run.sh` (which installs and builds what it needs), or by hand:
//! `tests/interop/rig.sh install && tests/interop/rig.sh build && cargo build --release
//! --examples && cargo test --release --test interop_rxe -- --ignored --nocapture` (release:
//! an unoptimised softroce cannot keep up with rxe's ib_write_bw pipeline). Environment:
//! `SOFTROCE_INTEROP_ONLY=text` runs the scenarios whose name contains `text`;
//! `SOFTROCE_INTEROP_UPDATE_DOCS=1` rewrites docs/interop.md with this run's table;
//! `SOFTROCE_INTEROP_CACHE` moves the cache (default /var/cache/softroce-interop), where each
//! run leaves its logs in `runs/<run>/logs/`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Longest any one tool may run.
const TOOL_TIMEOUT: Duration = Duration::from_secs(120);
/// Iterations of the lossless and the lossy pingpong runs.
const PINGPONG_ITERS: u32 = 500;
const LOSS_ITERS: u32 = 200;
/// Message size and count of the perftest scenarios (16 packets per message at MTU 1024).
const PERF_SIZE: u32 = 16384;
const PERF_ITERS: u32 = 200;
/// The message the pyverbs client writes (must match pyverbs_peer.py).
const RXE_MESSAGE: &str = "Hello RDMA from rxe! Data lands directly in softroce memory.";
/// Name of the rxe ↔ rxe control run.
const CONTROL: &str = "rc_pingpong 4096 B, rxe control";
/// The start of the message softroce's rdma_write_client writes.
const SOFTROCE_MESSAGE: &str = "Hello RDMA from client!";

type Res<T> = Result<T, String>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

// ------------------------------------------------------------------------------------ the rig

/// The booted guest and its network namespace. Dropping it powers the guest off and deletes
/// the namespace.
struct Rig {
    script: PathBuf,
    run: PathBuf,
    netns: String,
    host_ip: String,
    guest_ip: String,
    seq: AtomicU32,
}

impl Rig {
    fn up(run: &Path) -> Res<Rig> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/rig.sh");
        let st = Command::new(&script)
            .arg("up")
            .arg(run)
            .status()
            .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
        ensure!(st.success(), "rig.sh up failed ({st})");
        let env = std::fs::read_to_string(run.join("env")).map_err(|e| e.to_string())?;
        let get = |k: &str| -> Res<String> {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")))
                .map(str::to_string)
                .ok_or_else(|| format!("{k} missing from {}", run.join("env").display()))
        };
        let rig = Rig {
            script,
            run: run.to_path_buf(),
            netns: get("NETNS")?,
            host_ip: get("HOST_IP")?,
            guest_ip: get("GUEST_IP")?,
            seq: AtomicU32::new(1),
        };
        Ok(rig)
    }

    /// Starts `body` (bash, with lib.sh sourced) in the guest.
    fn guest(&self, name: &str, body: &str) -> Res<GuestJob> {
        let id = format!("{:03}-{name}", self.seq.fetch_add(1, Ordering::Relaxed));
        let dir = self.run.join("jobs");
        let tmp = dir.join(format!("{id}.tmp"));
        std::fs::write(&tmp, format!("source /share/lib.sh\n{body}\n"))
            .map_err(|e| format!("write {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, dir.join(format!("{id}.sh"))).map_err(|e| e.to_string())?;
        Ok(GuestJob { dir, id })
    }

    /// Runs `body` in the guest to its end.
    fn guest_run(&self, name: &str, body: &str, timeout: Duration) -> Res<(i32, String)> {
        let job = self.guest(name, body)?;
        job.wait(self, timeout)
    }

    /// Starts `program args` on the host, inside the namespace.
    fn host(&self, program: &Path, args: &[String]) -> Res<HostProc> {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.netns])
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
        let out = Arc::new(Mutex::new(String::new()));
        let err = Arc::new(Mutex::new(String::new()));
        let mut readers = Vec::new();
        if let Some(s) = child.stdout.take() {
            readers.push(pump(s, out.clone()));
        }
        if let Some(s) = child.stderr.take() {
            readers.push(pump(s, err.clone()));
        }
        Ok(HostProc {
            child,
            out,
            err,
            readers,
            cmd: format!("{} {}", program.display(), args.join(" ")),
        })
    }

    /// rxe's hw_counters of the guest's device.
    fn rxe_counters(&self) -> Res<BTreeMap<String, u64>> {
        let (rc, out) = self.guest_run("counters", "counters", Duration::from_secs(30))?;
        ensure!(rc == 0, "reading rxe counters failed: {out}");
        Ok(parse_pairs(out.split_whitespace()))
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = Command::new(&self.script)
            .arg("down")
            .arg(&self.run)
            .status();
    }
}

fn pump(
    mut s: impl Read + Send + 'static,
    into: Arc<Mutex<String>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                break;
            }
            if let Ok(mut o) = into.lock() {
                o.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        }
    })
}

/// A job running in the guest.
struct GuestJob {
    dir: PathBuf,
    id: String,
}

impl GuestJob {
    /// Waits for the job's exit status and output; on timeout kills it (its whole session)
    /// and fails.
    fn wait(&self, rig: &Rig, timeout: Duration) -> Res<(i32, String)> {
        let rc_path = self.dir.join(format!("{}.rc", self.id));
        let out_path = self.dir.join(format!("{}.out", self.id));
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(rc) = std::fs::read_to_string(&rc_path) {
                let out = std::fs::read_to_string(&out_path).unwrap_or_default();
                let rc = rc
                    .trim()
                    .parse()
                    .map_err(|_| format!("job {}: bad exit status {rc:?}", self.id))?;
                return Ok((rc, out));
            }
            if Instant::now() > deadline {
                let out = std::fs::read_to_string(&out_path).unwrap_or_default();
                let _ = rig.guest_run(
                    "kill",
                    &format!("kill -TERM -- -$(cat /share/jobs/{}.pid)", self.id),
                    Duration::from_secs(20),
                );
                return Err(format!(
                    "guest job {} still running after {timeout:?} (killed); output:\n{out}",
                    self.id
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A process running on the host inside the namespace.
struct HostProc {
    child: Child,
    out: Arc<Mutex<String>>,
    err: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
    cmd: String,
}

/// How a host process ended.
struct HostExit {
    /// Exit code; `None` when it was killed after the timeout or by a signal.
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl HostProc {
    fn stdout(&self) -> String {
        self.out.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Waits until stdout contains `needle`. Fails if the process exits first.
    fn wait_for(&mut self, needle: &str, timeout: Duration) -> Res<()> {
        let deadline = Instant::now() + timeout;
        while !self.stdout().contains(needle) {
            if let Ok(Some(st)) = self.child.try_wait() {
                std::thread::sleep(Duration::from_millis(50));
                return Err(format!(
                    "`{}` exited ({st}) before printing {needle:?}:\n{}{}",
                    self.cmd,
                    self.stdout(),
                    self.err.lock().map(|s| s.clone()).unwrap_or_default()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "`{}` did not print {needle:?} in {timeout:?}",
                    self.cmd
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Waits for the exit; kills the process after `timeout`.
    fn wait(mut self, timeout: Duration) -> HostExit {
        let deadline = Instant::now() + timeout;
        let code = loop {
            match self.child.try_wait() {
                Ok(Some(st)) => break st.code(),
                Ok(None) if Instant::now() > deadline => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break None;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => break None,
            }
        };
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        HostExit {
            code,
            stdout: self.stdout(),
            stderr: self.err.lock().map(|s| s.clone()).unwrap_or_default(),
        }
    }
}

// ------------------------------------------------------------------------------- scenarios

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// softroce listens / owns the buffer; the rxe tool connects.
    SoftroceServer,
    /// the rxe tool listens / owns the buffer; softroce connects.
    SoftroceClient,
    /// rxe against rxe inside the guest (no softroce).
    Control,
}

impl Role {
    fn column(self) -> &'static str {
        match self {
            Role::SoftroceServer => "softroce server, rxe client",
            Role::SoftroceClient => "softroce client, rxe server",
            Role::Control => "rxe ↔ rxe in the guest",
        }
    }
}

/// What both sides of one scenario did.
struct Pair {
    host: HostExit,
    guest_rc: i32,
    guest_out: String,
}

/// The choreography of one scenario: the server side starts and gets ready first, then the
/// client; both run to their end. For `SoftroceServer` the host program must print
/// `host_ready` once it listens; for `SoftroceClient` the guest job's server must listen on
/// TCP 18515.
fn run_pair(
    rig: &Rig,
    log: &mut String,
    role: Role,
    host_prog: &Path,
    host_args: &[String],
    host_ready: &str,
    guest_body: &str,
) -> Res<Pair> {
    let _ = writeln!(
        log,
        "## host: {} {}\n## guest:\n{guest_body}",
        host_prog.display(),
        host_args.join(" ")
    );
    let (host, job) = match role {
        Role::SoftroceServer => {
            let mut host = rig.host(host_prog, host_args)?;
            if let Err(e) = host.wait_for(host_ready, Duration::from_secs(30)) {
                let _ = host.wait(Duration::ZERO);
                return Err(e);
            }
            let job = rig.guest("tool", guest_body)?;
            (host, job)
        }
        _ => {
            let job = rig.guest("tool", guest_body)?;
            let (rc, out) = rig.guest_run("wait-listen", "wait_listen 18515", TOOL_TIMEOUT)?;
            if rc != 0 {
                let r = job.wait(rig, Duration::from_secs(5));
                return Err(format!("guest server did not listen: {out} {r:?}"));
            }
            (rig.host(host_prog, host_args)?, job)
        }
    };
    let guest = job.wait(rig, TOOL_TIMEOUT);
    let host = host.wait(if guest.is_ok() {
        Duration::from_secs(30)
    } else {
        Duration::ZERO
    });
    let _ = writeln!(
        log,
        "## host exit: {:?}\n## host stdout:\n{}\n## host stderr:\n{}",
        host.code, host.stdout, host.stderr
    );
    let (guest_rc, guest_out) = guest?;
    let _ = writeln!(
        log,
        "## guest exit: {guest_rc}\n## guest output:\n{guest_out}"
    );
    Ok(Pair {
        host,
        guest_rc,
        guest_out,
    })
}

fn softroce_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_softroce"))
}

/// softroce's examples, built by `cargo build [--release] --examples` (and by `cargo test`) in
/// the target directory of this test binary's profile.
fn example_bin(name: &str) -> Res<PathBuf> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let p = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("examples").join(name))
        .ok_or("cannot locate the target directory")?;
    ensure!(
        p.is_file(),
        "{} is missing: run `cargo build --examples` (with --release for a release run)",
        p.display()
    );
    Ok(p)
}

/// `ibv_{rc,uc,ud}_pingpong` against `softroce pingpong --rc/--uc/--ud`.
fn pingpong(
    rig: &Rig,
    log: &mut String,
    role: Role,
    qp: &str,
    size: u32,
    loss: bool,
) -> Res<String> {
    let iters = if loss { LOSS_ITERS } else { PINGPONG_ITERS };
    let before = rig.rxe_counters()?;
    let transport = format!("--{qp}");
    let mut args: Vec<String> = [
        "pingpong",
        &transport,
        "--ip",
        &rig.host_ip,
        "-s",
        &size.to_string(),
        "-n",
        &iters.to_string(),
        "-m",
        "1024",
        "-g",
        "1",
        "-c",
        "--counters",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // ibv_ud_pingpong has no -m: UD messages fit the port MTU (1024 on the guest's link).
    let mtu = if qp == "ud" { "" } else { " -m 1024" };
    let mut tool = format!("ibv_{qp}_pingpong -d $DEV -g $GIDX -s {size} -n {iters}{mtu} -c");
    if role == Role::SoftroceClient {
        args.push(rig.guest_ip.clone());
    } else {
        tool.push_str(" $HOST_IP");
    }
    let body = if loss {
        format!("loss 10 || exit 97\n{tool}\nrc=$?\nloss_report\nloss_off\nexit $rc")
    } else {
        tool
    };
    let p = run_pair(
        rig,
        log,
        role,
        &softroce_bin(),
        &args,
        "local address:",
        &body,
    )?;
    let after = rig.rxe_counters()?;
    let rxe = delta(&before, &after);
    let _ = writeln!(log, "## rxe counters (delta): {rxe:?}");

    ensure!(
        p.guest_rc == 0,
        "ibv_{qp}_pingpong exited {}:\n{}",
        p.guest_rc,
        p.guest_out
    );
    ensure!(
        p.host.code == Some(0),
        "softroce pingpong exited {:?}: {}",
        p.host.code,
        p.host.stderr
    );
    let (mbit, usec) =
        result_lines(&p.guest_out, size, iters).map_err(|e| format!("ibv_{qp}_pingpong: {e}"))?;
    result_lines(&p.host.stdout, size, iters).map_err(|e| format!("softroce: {e}"))?;
    ensure!(
        !p.guest_out.contains("invalid data"),
        "ibv_{qp}_pingpong -c found invalid data:\n{}",
        p.guest_out
    );
    ensure!(
        p.host.stdout.contains(&format!(
            "data: {iters} received messages of {size} bytes checked"
        )),
        "softroce did not verify {iters} messages:\n{}",
        p.host.stdout
    );
    let sr = p
        .host
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("counters: "))
        .map(|l| parse_pairs(l.split_whitespace()))
        .ok_or("softroce printed no counters")?;
    let g = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
    // Packets netem dropped: rxe's on the way out of the guest, softroce's on the way in.
    let (lost_by_rxe, lost_to_rxe) = if loss {
        let d = netem_dropped(&p.guest_out).ok_or("no netem statistics")?;
        ensure!(
            d.0 > 0 && d.1 > 0,
            "netem dropped {d:?}: the loss case did not happen in both directions"
        );
        d
    } else {
        (0, 0)
    };
    // rxe counts a packet in rcvd_pkts only once its headers and ICRC passed (rxe_recv.c).
    // softroce reads its counters once its link has been quiet for 200 ms (`--counters`); a
    // duplicate from rxe that came later still would be re-ACKed uncounted, so rxe may count
    // more than softroce did, but never more than one per rxe packet softroce did not count.
    // With loss, netem's drop count joins the sum, and in about one lossy run in fifteen the
    // guest's rxe and netem counters together account for one packet more than the tap carried
    // (a capture on the tap matched softroce's count exactly each time): that one is allowed.
    // A packet rxe rejected would make the sum smaller than what softroce sent, never larger.
    let accepted = g(&rxe, "rcvd_pkts") + lost_to_rxe;
    let late = (g(&rxe, "sent_pkts") - lost_by_rxe.min(g(&rxe, "sent_pkts")))
        .saturating_sub(g(&sr, "rx_datagrams"));
    let guest_slack = u64::from(loss);
    ensure!(
        accepted >= g(&sr, "sent_pkts") && accepted - g(&sr, "sent_pkts") <= late + guest_slack,
        "rxe accepted {} packets, netem dropped {lost_to_rxe} on the way, but softroce sent {} \
         (and at most {late} after reading its counters)",
        g(&rxe, "rcvd_pkts"),
        g(&sr, "sent_pkts")
    );
    for k in [
        "truncated",
        "bad_tver",
        "unknown_opcode",
        "bad_pad_count",
        "length_mismatch",
        "icrc_errors",
        "bad_framing",
        "wrong_qp_type",
        "bad_pkey",
        "wrong_source",
    ] {
        ensure!(
            g(&sr, k) == 0,
            "softroce dropped {} rxe packets as {k}",
            g(&sr, k)
        );
    }
    let mut extra = String::new();
    if loss {
        let _ = write!(
            extra,
            "; netem dropped {lost_by_rxe} rxe and {lost_to_rxe} softroce requests; \
             retransmit timeouts: softroce {}, rxe {}",
            g(&sr, "completer_retry_err"),
            g(&rxe, "completer_retry_err")
        );
    } else {
        // Nothing is lost on the tap: softroce received what rxe sent (except, at most, a
        // spurious rxe retransmission that arrives after softroce exited; see the note on
        // rxe's retransmit timer), and no side saw a PSN gap.
        let (rxe_sent, sr_rx) = (g(&rxe, "sent_pkts"), g(&sr, "rx_datagrams"));
        let per_msg = u64::from(size.div_ceil(1024).max(1));
        ensure!(
            sr_rx <= rxe_sent && rxe_sent - sr_rx <= per_msg * g(&rxe, "completer_retry_err"),
            "rxe sent {rxe_sent} packets, softroce received {sr_rx}"
        );
        for (side, m, k) in [
            ("rxe", &rxe, "out_of_seq_request"),
            ("rxe", &rxe, "rcvd_seq_err"),
            ("softroce", &sr, "out_of_seq_request"),
            ("softroce", &sr, "rcvd_seq_err"),
        ] {
            ensure!(g(m, k) == 0, "{side} {k} = {}", g(m, k));
        }
        // Retransmit timeouts are reported, not judged: a timer may fire when the emulated
        // guest stalls, and rxe 6.1 fires spuriously (see the note in docs/interop.md).
        let _ = write!(
            extra,
            "; retransmit timeouts: softroce {}, rxe {}",
            g(&sr, "completer_retry_err"),
            g(&rxe, "completer_retry_err")
        );
    }
    Ok(format!(
        "{iters} × {size} B, {mbit:.2} Mbit/s, {usec:.0} µs/iter; softroce sent {} packets, \
         rxe accepted {} (+{lost_to_rxe} lost to netem){extra}",
        g(&sr, "sent_pkts"),
        g(&rxe, "rcvd_pkts")
    ))
}

/// `ibv_srq_pingpong -q 4` (four RC QPs on one SRQ, 256 address messages each way) against
/// `softroce pingpong --srq -q 4`, optionally with `-e` on both sides (completion channels).
fn srq_pingpong(rig: &Rig, log: &mut String, role: Role, events: bool) -> Res<String> {
    let (size, iters, qps) = (4096u32, PINGPONG_ITERS, 4u32);
    let before = rig.rxe_counters()?;
    let mut args: Vec<String> = [
        "pingpong",
        "--srq",
        "--ip",
        &rig.host_ip,
        "-s",
        &size.to_string(),
        "-n",
        &iters.to_string(),
        "-m",
        "1024",
        "-q",
        &qps.to_string(),
        "-g",
        "1",
        "--counters",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let ev = if events { " -e" } else { "" };
    let mut tool =
        format!("ibv_srq_pingpong -d $DEV -g $GIDX -s {size} -n {iters} -m 1024 -q {qps}{ev}");
    if events {
        args.push("-e".into());
    }
    if role == Role::SoftroceClient {
        args.push(rig.guest_ip.clone());
    } else {
        tool.push_str(" $HOST_IP");
    }
    let p = run_pair(
        rig,
        log,
        role,
        &softroce_bin(),
        &args,
        "local address:",
        &tool,
    )?;
    let after = rig.rxe_counters()?;
    let rxe = delta(&before, &after);
    let _ = writeln!(log, "## rxe counters (delta): {rxe:?}");
    ensure!(
        p.guest_rc == 0,
        "ibv_srq_pingpong exited {}:\n{}",
        p.guest_rc,
        p.guest_out
    );
    ensure!(
        p.host.code == Some(0),
        "softroce pingpong --srq exited {:?}: {}",
        p.host.code,
        p.host.stderr
    );
    let (mbit, usec) =
        result_lines(&p.guest_out, size, iters).map_err(|e| format!("ibv_srq_pingpong: {e}"))?;
    result_lines(&p.host.stdout, size, iters).map_err(|e| format!("softroce: {e}"))?;
    ensure!(
        p.guest_out.matches("remote address:").count() == qps as usize,
        "ibv_srq_pingpong did not print {qps} remote addresses:\n{}",
        p.guest_out
    );
    ensure!(
        p.host.stdout.lines().any(|l| l.starts_with("data: ")
            && l.contains(&format!("of {size} bytes on {qps} QPs and one SRQ checked"))),
        "softroce did not verify the messages:\n{}",
        p.host.stdout
    );
    let sr = p
        .host
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("counters: "))
        .map(|l| parse_pairs(l.split_whitespace()))
        .ok_or("softroce printed no counters")?;
    let g = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
    for k in ["icrc_errors", "wrong_qp_type", "wrong_source", "bad_pkey"] {
        ensure!(
            g(&sr, k) == 0,
            "softroce dropped {} rxe packets as {k}",
            g(&sr, k)
        );
    }
    Ok(format!(
        "{iters} × {size} B on {qps} QPs, {mbit:.2} Mbit/s, {usec:.0} µs/iter; softroce \
         received {} SENDs on its SRQ, rxe {}; softroce sent {} packets, rxe accepted {}; \
         retransmit timeouts: softroce {}, rxe {}",
        g(&sr, "rdma_recvs"),
        g(&rxe, "rdma_recvs"),
        g(&sr, "sent_pkts"),
        g(&rxe, "rcvd_pkts"),
        g(&sr, "completer_retry_err"),
        g(&rxe, "completer_retry_err")
    ))
}

/// RDMA WRITE between softroce's examples and pyverbs on rxe, with a right or wrong rkey.
fn rdma_write(rig: &Rig, log: &mut String, role: Role, bad_rkey: bool) -> Res<String> {
    let before = rig.rxe_counters()?;
    let bad = if bad_rkey { " --bad-rkey" } else { "" };
    let (prog, args, peer) = match role {
        Role::SoftroceServer => (
            example_bin("rdma_write_server")?,
            vec![rig.host_ip.clone(), "18515".into()],
            format!("python3 /share/pyverbs_peer.py client $HOST_IP{bad}"),
        ),
        _ => (
            example_bin("rdma_write_client")?,
            vec![rig.host_ip.clone(), rig.guest_ip.clone(), "18515".into()],
            if bad_rkey {
                "python3 /share/pyverbs_peer.py server --bad-rkey".to_string()
            } else {
                format!("python3 /share/pyverbs_peer.py server --expect '{SOFTROCE_MESSAGE}'")
            },
        ),
    };
    let body = format!(
        "capture_start /tmp/w.pcap || exit 98\n{peer}\nrc=$?\ncapture_stop\n\
         echo '--- pcap:'; python3 /share/pyverbs_peer.py pcap-summary /tmp/w.pcap\nexit $rc"
    );
    let p = run_pair(rig, log, role, &prog, &args, "waiting on TCP", &body)?;
    let after = rig.rxe_counters()?;
    let rxe = delta(&before, &after);
    let _ = writeln!(log, "## rxe counters (delta): {rxe:?}");

    ensure!(
        p.guest_rc == 0,
        "pyverbs peer exited {}:\n{}",
        p.guest_rc,
        p.guest_out
    );
    let pcap: Vec<&str> = p
        .guest_out
        .split("--- pcap:")
        .nth(1)
        .unwrap_or("")
        .lines()
        .filter(|l| l.contains(" opcode="))
        .collect();
    let from_host = format!("{} > {} ", rig.host_ip, rig.guest_ip);
    let from_guest = format!("{} > {} ", rig.guest_ip, rig.host_ip);
    let sent_by_softroce = pcap.iter().filter(|l| l.starts_with(&from_host)).count() as u64;
    let rcvd = rxe.get("rcvd_pkts").copied().unwrap_or(0);
    ensure!(
        rcvd == sent_by_softroce,
        "rxe accepted {rcvd} packets, the guest saw {sent_by_softroce} from softroce"
    );
    let (nak_from, want_wc) = match role {
        Role::SoftroceServer => (&from_host, "IBV_WC_REM_ACCESS_ERR"),
        _ => (&from_guest, "remote access error"),
    };
    let nak = pcap.iter().any(|l| {
        l.starts_with(nak_from.as_str())
            && l.contains("opcode=0x11")
            && l.ends_with("syndrome=0x62")
    });
    match (role, bad_rkey) {
        (Role::SoftroceServer, false) => {
            ensure!(
                p.host.code == Some(0)
                    && p.host
                        .stdout
                        .contains(&format!("[server] received: '{RXE_MESSAGE}'")),
                "softroce's buffer does not hold the rxe message:\n{}",
                p.host.stdout
            );
        }
        (Role::SoftroceServer, true) => {
            ensure!(
                p.host.code == Some(0) && p.host.stdout.contains("[server] received: ''"),
                "softroce's buffer changed after a WRITE with a wrong rkey:\n{}",
                p.host.stdout
            );
        }
        (_, false) => {
            ensure!(
                p.host.code == Some(0) && p.host.stdout.contains(": success"),
                "softroce's RDMA WRITE did not succeed: {:?}\n{}{}",
                p.host.code,
                p.host.stdout,
                p.host.stderr
            );
        }
        (_, true) => {
            ensure!(
                p.host.code == Some(1) && p.host.stdout.contains(": remote access error"),
                "softroce's WRITE with a wrong rkey did not end in remote access error: {:?}\n{}{}",
                p.host.code,
                p.host.stdout,
                p.host.stderr
            );
        }
    }
    if bad_rkey {
        ensure!(
            nak,
            "no NAK with AETH syndrome 0x62 from {nak_from}in the capture"
        );
        Ok(format!(
            "NAK remote access error (AETH 0x62) on the wire, {want_wc} at the requester, \
             target buffer unchanged; rxe accepted {sent_by_softroce} of {sent_by_softroce} \
             softroce packets"
        ))
    } else {
        Ok(format!(
            "WRITE completed, target buffer holds the message; rxe accepted \
             {sent_by_softroce} of {sent_by_softroce} softroce packets"
        ))
    }
}

/// perftest `ib_write_bw` / `ib_read_bw` against `softroce perf write_bw` / `read_bw`.
fn perftest(rig: &Rig, log: &mut String, role: Role, read: bool) -> Res<String> {
    let (size, iters) = (PERF_SIZE, PERF_ITERS);
    let test = if read { "read_bw" } else { "write_bw" };
    let before = rig.rxe_counters()?;
    let mut args: Vec<String> = [
        "perf",
        test,
        "--ip",
        &rig.host_ip,
        "-s",
        &size.to_string(),
        "-n",
        &iters.to_string(),
        "-m",
        "1024",
        "--counters",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut tool = format!("ib_{test} -d $DEV -x $GIDX -F -s {size} -n {iters} -m 1024");
    if role == Role::SoftroceClient {
        args.push(rig.guest_ip.clone());
    } else {
        tool.push_str(" $HOST_IP");
    }
    let p = run_pair(
        rig,
        log,
        role,
        &softroce_bin(),
        &args,
        "Waiting for client to connect",
        &tool,
    )?;
    let after = rig.rxe_counters()?;
    let rxe = delta(&before, &after);
    let _ = writeln!(log, "## rxe counters (delta): {rxe:?}");
    ensure!(
        p.guest_rc == 0,
        "ib_{test} exited {}:\n{}",
        p.guest_rc,
        p.guest_out
    );
    ensure!(
        p.host.code == Some(0),
        "softroce perf exited {:?}: {}",
        p.host.code,
        p.host.stderr
    );
    let theirs = bw_row(&p.guest_out).map_err(|e| format!("ib_{test}: {e}"))?;
    let ours = bw_row(&p.host.stdout).map_err(|e| format!("softroce perf: {e}"))?;
    for row in [&theirs, &ours] {
        ensure!(
            row[0] == size.to_string() && row[1] == iters.to_string(),
            "result row {row:?}: expected {size} bytes × {iters}"
        );
        ensure!(
            row[3].parse::<f64>().is_ok_and(|bw| bw > 0.0),
            "result row {row:?}: no bandwidth"
        );
    }
    // The server prints the client's numbers, received in the results exchange.
    ensure!(
        theirs == ours,
        "the two sides print different results: rxe {theirs:?}, softroce {ours:?}"
    );
    let sr = p
        .host
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("counters: "))
        .map(|l| parse_pairs(l.split_whitespace()))
        .ok_or("softroce printed no counters")?;
    let g = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
    ensure!(
        g(&rxe, "rcvd_pkts") == g(&sr, "sent_pkts"),
        "rxe accepted {} packets but softroce sent {}",
        g(&rxe, "rcvd_pkts"),
        g(&sr, "sent_pkts")
    );
    ensure!(
        g(&sr, "rx_datagrams") <= g(&rxe, "sent_pkts") && g(&sr, "icrc_errors") == 0,
        "softroce received {} datagrams ({} ICRC errors), rxe sent {}",
        g(&sr, "rx_datagrams"),
        g(&sr, "icrc_errors"),
        g(&rxe, "sent_pkts")
    );
    Ok(format!(
        "{iters} × {size} B, {} MB/s average (the client's, printed by both); softroce sent {} \
         packets, rxe accepted {}",
        ours[3],
        g(&sr, "sent_pkts"),
        g(&rxe, "rcvd_pkts")
    ))
}

/// perftest's bandwidth result row: bytes, iterations, peak, average, message rate.
fn bw_row(out: &str) -> Res<Vec<String>> {
    let mut lines = out.lines();
    lines
        .find(|l| l.trim_start().starts_with("#bytes") && l.contains("BW average"))
        .ok_or("no result table")?;
    let row: Vec<String> = lines
        .next()
        .ok_or("no result row")?
        .split_whitespace()
        .map(str::to_string)
        .collect();
    ensure!(row.len() == 5, "result row {row:?}");
    Ok(row)
}

/// `ibv_rc_pingpong` between two rxe devices in the guest, 4096 B: rxe's own retry behaviour.
fn control(rig: &Rig, log: &mut String) -> Res<String> {
    let iters = PINGPONG_ITERS;
    let body = format!(
        "rxe_pair_up || exit 96\nGA=$(gid_index rxea 10.77.0.1) && GB=$(gid_index rxeb 10.77.0.2) || exit 95\n\
         echo before: $(counters rxea | grep -E 'completer_retry_err|duplicate_request')\n\
         ibv_rc_pingpong -d rxea -g $GA -s 4096 -n {iters} -c > /tmp/ctl-srv.out 2>&1 &\n\
         wait_listen 18515 || exit 94\n\
         ibv_rc_pingpong -d rxeb -g $GB -s 4096 -n {iters} -c 10.77.0.1; rc=$?\n\
         wait $! || rc=1\necho '--- server:'; cat /tmp/ctl-srv.out\n\
         echo after: $(counters rxea | grep -E 'completer_retry_err|duplicate_request') $(counters rxeb | grep -E 'completer_retry_err|duplicate_request')\n\
         exit $rc"
    );
    let _ = writeln!(log, "## guest:\n{body}");
    let (rc, out) = rig.guest_run("control", &body, TOOL_TIMEOUT)?;
    let _ = writeln!(log, "## guest exit {rc}:\n{out}");
    ensure!(rc == 0, "rxe ↔ rxe pingpong failed ({rc}):\n{out}");
    let (mbit, usec) = result_lines(&out, 4096, iters)?;
    let after = out
        .lines()
        .find_map(|l| l.strip_prefix("after: "))
        .ok_or("no counters")?;
    let retries: u64 = after
        .split_whitespace()
        .filter_map(|kv| kv.strip_prefix("completer_retry_err="))
        .filter_map(|v| v.parse::<u64>().ok())
        .sum();
    Ok(format!(
        "{iters} × 4096 B, {mbit:.2} Mbit/s, {usec:.0} µs/iter; rxe retransmit timeouts \
         (both devices, since boot) {retries}"
    ))
}

// ------------------------------------------------------------------------------- parsing

/// Checks rc_pingpong's two result lines and returns (Mbit/s, µs/iter).
fn result_lines(out: &str, size: u32, iters: u32) -> Res<(f64, f64)> {
    let want_bytes = u64::from(size) * u64::from(iters) * 2;
    let bytes_line = out
        .lines()
        .find(|l| l.contains(" bytes in ") && l.ends_with(" Mbit/sec"))
        .ok_or("no \"N bytes in S seconds = R Mbit/sec\" line")?;
    let w: Vec<&str> = bytes_line.split_whitespace().collect();
    ensure!(
        w.first().and_then(|s| s.parse::<u64>().ok()) == Some(want_bytes),
        "{bytes_line:?}: expected {want_bytes} bytes"
    );
    let mbit: f64 = w
        .get(w.len().wrapping_sub(2))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{bytes_line:?}: no rate"))?;
    let iters_line = out
        .lines()
        .find(|l| l.contains(" iters in ") && l.ends_with(" usec/iter"))
        .ok_or("no \"N iters in S seconds = U usec/iter\" line")?;
    let w: Vec<&str> = iters_line.split_whitespace().collect();
    ensure!(
        w.first().and_then(|s| s.parse::<u32>().ok()) == Some(iters),
        "{iters_line:?}: expected {iters} iters"
    );
    let usec: f64 = w
        .get(w.len().wrapping_sub(2))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{iters_line:?}: no time"))?;
    Ok((mbit, usec))
}

fn parse_pairs<'a>(it: impl Iterator<Item = &'a str>) -> BTreeMap<String, u64> {
    it.filter_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        Some((k.to_string(), v.parse().ok()?))
    })
    .collect()
}

fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.saturating_sub(before.get(k).copied().unwrap_or(0)),
            )
        })
        .collect()
}

/// Packets netem dropped, from lib.sh's `loss_report`: "netem dropped E guest→host and I
/// host→guest RoCE requests" gives `(E, I)`.
fn netem_dropped(out: &str) -> Option<(u64, u64)> {
    let l = out.lines().find_map(|l| l.strip_prefix("netem dropped "))?;
    let mut n = l.split_whitespace().filter_map(|w| w.parse::<u64>().ok());
    Some((n.next()?, n.next()?))
}

// ------------------------------------------------------------------------------- the suite

struct Outcome {
    scenario: &'static str,
    role: Role,
    result: Res<String>,
    secs: f64,
}

type ScenarioFn = fn(&Rig, &mut String, Role) -> Res<String>;

fn scenarios() -> Vec<(&'static str, &'static str, ScenarioFn)> {
    vec![
        (
            "rc_pingpong 64 B",
            "ibv_rc_pingpong -s 64 -m 1024 -c vs softroce pingpong --rc",
            |r, l, role| pingpong(r, l, role, "rc", 64, false),
        ),
        (
            "rc_pingpong 4096 B",
            "ibv_rc_pingpong -s 4096 -m 1024 -c (4 packets per message) vs softroce pingpong --rc",
            |r, l, role| pingpong(r, l, role, "rc", 4096, false),
        ),
        (
            "uc_pingpong 64 B",
            "ibv_uc_pingpong -s 64 -m 1024 -c vs softroce pingpong --uc (no ACKs)",
            |r, l, role| pingpong(r, l, role, "uc", 64, false),
        ),
        (
            "uc_pingpong 4096 B",
            "ibv_uc_pingpong -s 4096 -m 1024 -c (UC SEND FIRST/MIDDLE/LAST) vs softroce \
             pingpong --uc",
            |r, l, role| pingpong(r, l, role, "uc", 4096, false),
        ),
        (
            "ud_pingpong 64 B",
            "ibv_ud_pingpong -s 64 -c vs softroce pingpong --ud (Q_Key, DETH, 40-byte GRH)",
            |r, l, role| pingpong(r, l, role, "ud", 64, false),
        ),
        (
            "ud_pingpong 1024 B",
            "ibv_ud_pingpong -s 1024 -c (a full-MTU UD message) vs softroce pingpong --ud",
            |r, l, role| pingpong(r, l, role, "ud", 1024, false),
        ),
        (
            "rc_pingpong 4096 B, 10% loss",
            "as above while netem in the guest drops 10% of the RoCE requests in each \
             direction (ACKs are spared: rc_pingpong itself fails when the last ACK of a run is \
             lost, since its requester retransmits into a QP the peer has destroyed)",
            |r, l, role| pingpong(r, l, role, "rc", 4096, true),
        ),
        (
            "srq_pingpong 4096 B",
            "ibv_srq_pingpong -q 4 -s 4096 -m 1024 (4 RC QPs on one SRQ, 256 address \
             messages each way) vs softroce pingpong --srq -q 4",
            |r, l, role| srq_pingpong(r, l, role, false),
        ),
        (
            "srq_pingpong 4096 B, CQ events",
            "as above with -e on both sides: each sleeps on a completion channel",
            |r, l, role| srq_pingpong(r, l, role, true),
        ),
        (
            "RDMA WRITE",
            "softroce examples/rdma_write_{server,client} vs pyverbs on rxe",
            |r, l, role| rdma_write(r, l, role, false),
        ),
        (
            "RDMA WRITE, wrong rkey",
            "as above, the requester uses a wrong rkey: NAK 0x62, IBV_WC_REM_ACCESS_ERR",
            |r, l, role| rdma_write(r, l, role, true),
        ),
        (
            "perftest ib_write_bw",
            "ib_write_bw -s 16384 -n 200 -m 1024 vs softroce perf write_bw; both print the \
             client's results",
            |r, l, role| perftest(r, l, role, false),
        ),
        (
            "perftest ib_read_bw",
            "ib_read_bw -s 16384 -n 200 -m 1024 vs softroce perf read_bw (128 outstanding \
             READs); both print the client's results",
            |r, l, role| perftest(r, l, role, true),
        ),
    ]
}

#[test]
#[ignore = "boots a QEMU guest with kernel rxe: needs root, /dev/net/tun, apt-get; run tests/interop/run.sh"]
fn interop_rxe() {
    let t0 = Instant::now();
    let only = std::env::var("SOFTROCE_INTEROP_ONLY").unwrap_or_default();
    let cache = PathBuf::from(
        std::env::var("SOFTROCE_INTEROP_CACHE")
            .unwrap_or_else(|_| "/var/cache/softroce-interop".into()),
    );
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let run = cache
        .join("runs")
        .join(format!("{stamp}-{}", std::process::id()));
    std::fs::create_dir_all(run.join("logs")).expect("create the run directory");
    prune_runs(&cache.join("runs"), 5);

    let rig = Rig::up(&run).unwrap_or_else(|e| panic!("the rxe guest did not come up: {e}"));
    let boot_secs = t0.elapsed().as_secs_f64();
    let mut outcomes = Vec::new();
    let list = scenarios();
    for (name, _, f) in &list {
        for role in [Role::SoftroceServer, Role::SoftroceClient] {
            if !name.contains(only.as_str()) {
                continue;
            }
            outcomes.push(run_one(&rig, name, role, |r, l| f(r, l, role)));
        }
    }
    if CONTROL.contains(only.as_str()) {
        outcomes.push(run_one(&rig, CONTROL, Role::Control, control));
    }
    let manifest =
        std::fs::read_to_string(cache.join("guest").join("manifest.txt")).unwrap_or_default();
    drop(rig);
    let wall = t0.elapsed().as_secs_f64();
    let report = report(&list, &outcomes, &manifest, boot_secs, wall);
    println!("\n{report}");
    std::fs::write(run.join("interop.md"), &report).expect("write the report");
    if std::env::var("SOFTROCE_INTEROP_UPDATE_DOCS").is_ok_and(|v| v == "1") {
        let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/interop.md");
        std::fs::create_dir_all(doc.parent().expect("docs dir")).expect("create docs/");
        std::fs::write(&doc, &report).expect("write docs/interop.md");
        println!("wrote {}", doc.display());
    }
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| o.result.is_err())
        .map(|o| format!("{} [{}]", o.scenario, o.role.column()))
        .collect();
    assert!(
        !outcomes.is_empty(),
        "SOFTROCE_INTEROP_ONLY={only:?} selected no scenario"
    );
    assert!(
        failed.is_empty(),
        "{} interop scenario(s) failed: {}; logs in {}",
        failed.len(),
        failed.join(", "),
        run.join("logs").display()
    );
}

fn run_one(
    rig: &Rig,
    scenario: &'static str,
    role: Role,
    f: impl FnOnce(&Rig, &mut String) -> Res<String>,
) -> Outcome {
    println!("=== {scenario} [{}]", role.column());
    let t = Instant::now();
    let mut log = String::new();
    let result = f(rig, &mut log);
    let secs = t.elapsed().as_secs_f64();
    let file = rig.run.join("logs").join(format!(
        "{}-{:?}.log",
        scenario
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect::<String>(),
        role
    ));
    let _ = writeln!(log, "## result: {result:?}");
    let _ = std::fs::write(&file, &log);
    match &result {
        Ok(s) => println!("    pass ({secs:.1} s): {s}"),
        Err(e) => println!("    FAIL ({secs:.1} s): {e}\n    log: {}", file.display()),
    }
    Outcome {
        scenario,
        role,
        result,
        secs,
    }
}

fn prune_runs(dir: &Path, keep: usize) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut runs: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    runs.sort();
    let n = runs.len().saturating_sub(keep);
    for old in &runs[..n] {
        let _ = std::fs::remove_dir_all(old);
    }
}

fn report(
    list: &[(&'static str, &'static str, ScenarioFn)],
    outcomes: &[Outcome],
    manifest: &str,
    boot_secs: f64,
    wall: f64,
) -> String {
    let cell = |o: Option<&Outcome>| match o {
        None => "not run".to_string(),
        Some(o) if o.result.is_ok() => format!("pass ({:.1} s)", o.secs),
        Some(o) => format!("**FAIL** ({:.1} s)", o.secs),
    };
    let find = |s: &str, r: Role| outcomes.iter().find(|o| o.scenario == s && o.role == r);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Interop with kernel rxe\n\n\
         Generated by `tests/interop_rxe.rs` (run `tests/interop/run.sh` as root; \
         `SOFTROCE_INTEROP_UPDATE_DOCS=1` rewrites this file). softroce on the host, in a network \
         namespace with a tap, against Linux's rdma_rxe and the unmodified rdma-core, perftest \
         and pyverbs tools in a QEMU guest on the other end of the tap. Path MTU 1024.\n"
    );
    let _ = writeln!(
        md,
        "| scenario | {} | {} |\n|---|---|---|",
        Role::SoftroceServer.column(),
        Role::SoftroceClient.column()
    );
    for (name, _, _) in list {
        let _ = writeln!(
            md,
            "| {name} | {} | {} |",
            cell(find(name, Role::SoftroceServer)),
            cell(find(name, Role::SoftroceClient))
        );
    }
    let (name, why) = (
        "perftest ib_send_bw, ib_write_lat, ib_send_lat, ib_read_lat",
        "not implemented: `softroce perf` runs write_bw and read_bw",
    );
    let _ = writeln!(md, "| {name} | {why} | {why} |");
    let _ = writeln!(
        md,
        "\nSuite wall time: {wall:.0} s (guest boot and rxe set-up {boot_secs:.0} s).\n\n## Results\n"
    );
    for o in outcomes {
        let _ = writeln!(
            md,
            "- **{}** [{}]: {}",
            o.scenario,
            o.role.column(),
            match &o.result {
                Ok(s) => s.clone(),
                Err(e) => format!("FAILED: {}", e.lines().next().unwrap_or("")),
            }
        );
    }
    let _ = writeln!(md, "\n## What each scenario checks\n");
    for (name, what, _) in list {
        let _ = writeln!(md, "- **{name}**: {what}.");
    }
    let _ = writeln!(
        md,
        "\nEvery scenario checks both sides' exit statuses and reads the guest's rxe \
         hw_counters before and after. rxe counts a packet in `rcvd_pkts` only after its header \
         and ICRC checks passed (rxe_recv.c), so `rcvd_pkts` growing by exactly the number of \
         packets softroce sent shows that rxe accepted every one. The pingpong scenarios also \
         check both result lines (`N bytes in S seconds = R Mbit/sec`, `I iters in S seconds = \
         U usec/iter`), rc_pingpong's `-c` page check, softroce's check that every received \
         message equals the session's first, that softroce dropped no rxe packet as malformed, \
         and, without loss, that neither side saw a PSN gap. With loss, rxe's count plus \
         netem's drops must cover every packet softroce sent (one over is tolerated: in about \
         one lossy run in fifteen the guest's counters add up to one more packet than a \
         capture on the tap shows). \
         The WRITE scenarios capture the guest NIC with tcpdump and decode the AETH syndromes.\n\n\
         Note on rxe's own retransmissions: rxe 6.1 now and then \
         retransmits a message that was already acknowledged on time (`completer_retry_err`, \
         and duplicates at the responder). Its retransmit timer is armed only when not already \
         pending (rxe_req.c `update_state`) and is not restarted when an ACK completes the \
         message, so a timer left over from an earlier message fires about 67 ms later while \
         the next one is in flight. The control row, two rxe devices in the guest with no \
         softroce involved, shows the same.\n"
    );
    let _ = writeln!(md, "\n## The guest\n\n```\n{}```", manifest);
    md
}
