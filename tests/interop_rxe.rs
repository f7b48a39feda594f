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
//! - `ibv_srq_pingpong` against `softroce pingpong --srq`, 64 B and 4096 B;
//! - perftest `ib_write_bw` and `ib_read_bw` (guest) against `softroce perf write_bw` /
//!   `read_bw` (host), 16 KiB × 200, path MTU 1024: perftest's TCP exchange, the data phase and
//!   the results exchange (each side prints the client's numbers); likewise `ib_send_bw`,
//!   `ib_atomic_bw`, and `ib_write_lat`, `ib_read_lat`, `ib_send_lat` (64 B × 200), and
//!   `ib_write_lat -a` (every size from 2 B to 8 MiB, 5 each);
//! - RDMA WRITE between softroce's `examples/rdma_write_{server,client}` and a pyverbs peer in
//!   the guest (`tests/interop/guest/pyverbs_peer.py`), with the right rkey and with a wrong one
//!   (NAK remote access error, AETH syndrome 0x62, `IBV_WC_REM_ACCESS_ERR`, nothing written);
//! - negative cases between `softroce target` (the host's test drives it through its JSON
//!   lines) and a pyverbs peer: an RDMA READ past the end of the MR (NAK remote access error,
//!   `IBV_WC_REM_ACCESS_ERR`), and a SEND with no receive posted (RNR NAKs, then success once
//!   a receive is posted with rnr_retry 7; one RNR NAK and `IBV_WC_RNR_RETRY_EXC_ERR` with
//!   rnr_retry 0), each checked in a capture, in both sides' counters and completions;
//! - the C libraries: Debian's ibverbs-utils and perftest through softroce's libibverbs.so.1
//!   (`softroce exec`), and rdmacm-utils' rping, ucmatose, udaddy, perftest's `ib_send_bw -R`
//!   and the seed's rdma_server/rdma_client through its librdmacm.so.1, against the same
//!   programs on rxe; and an rdma_cm REQ/SIDR_REQ to a port nobody listens on, both ways;
//! - UCX: Debian's ucx_perftest (tag_lat and a 64 KiB tag_bw over rc_verbs, tag_lat over
//!   ud_verbs) through `softroce exec` against ucx_perftest on rxe;
//! - MPI: Open MPI 4.1 over UCX (pml ucx), tests/c/mpi_pingpong.c with one rank through
//!   `softroce exec` on the host and one on rxe, mpirun on the host starting the guest's orted
//!   through the rig's job channel;
//! - a control run of `ibv_rc_pingpong` between two rxe devices inside the guest, to show what
//!   rxe does on its own (see the note on spurious retries in docs/interop.md).
//!
//! Each scenario checks exit statuses, the tools' result lines and the data (softroce verifies
//! every message it receives; rc_pingpong -c checks its pages; the WRITE scenarios look at the
//! target buffer), and reads the guest's rxe hw_counters before and after: rxe's `rcvd_pkts`
//! (which counts a packet only after its ICRC and header checks passed) must grow by exactly
//! the number of packets softroce sent, so rxe accepted every one of them.
//!
//! A scenario whose softroce side does not exist yet (softroce says "not implemented", or its
//! command line does not know the test) is reported as "not implemented: <why>", in the table
//! and on stdout, and fails the run only with `SOFTROCE_INTEROP_REQUIRE_ALL=1`.
//!
//! The test is `#[ignore]`d: it needs root, /dev/net/tun, apt-get and 6 to 9 minutes. Run it
//! with `tests/interop/run.sh` (which installs and builds what it needs), or by hand:
//! `tests/interop/rig.sh install && tests/interop/rig.sh build && cargo build --release
//! --examples && cargo test --release --test interop_rxe -- --ignored --nocapture` (release:
//! an unoptimised softroce cannot keep up with rxe's ib_write_bw pipeline). Environment:
//! `SOFTROCE_INTEROP_ONLY=text` runs the scenarios whose name contains `text` (several texts:
//! `a|b`);
//! `SOFTROCE_INTEROP_UPDATE_DOCS=1` rewrites docs/interop.md with this run's table (full runs
//! only);
//! `SOFTROCE_INTEROP_CACHE` moves the cache (default /var/cache/softroce-interop), where each
//! run leaves its logs in `runs/<run>/logs/`.

use std::collections::{BTreeMap, BTreeSet};
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
/// Message size and count of the perftest bandwidth scenarios (16 packets per message at MTU
/// 1024), and of the latency scenarios.
const PERF_SIZE: u32 = 16384;
const PERF_ITERS: u32 = 200;
const LAT_SIZE: u32 = 64;
const LAT_ITERS: u32 = 200;
/// The message the pyverbs client writes (must match pyverbs_peer.py).
const RXE_MESSAGE: &str = "Hello RDMA from rxe! Data lands directly in softroce memory.";
/// Name of the rxe ↔ rxe control run.
const CONTROL: &str = "rc_pingpong 4096 B, rxe control";
/// Name of the rxe ↔ rxe control run of ibv_srq_pingpong.
const CONTROL_SRQ: &str = "srq_pingpong 4096 B, rxe control";
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

/// softroce's counters of packets dropped as malformed or misaddressed: all must stay 0
/// against rxe, which sends nothing of the kind.
const MALFORMED_DROPS: [&str; 10] = [
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
];

/// The counters of drops before rxe counts a packet (the guest's UDP layer, NIC and input
/// backlog, the host's tap, and rxe's own silent drops where its kernel logs them), for
/// failure messages: "name=delta" of each that is not zero, or "none".
fn path_drops(rxe: &BTreeMap<String, u64>) -> String {
    let v: Vec<String> = rxe
        .iter()
        .filter(|(k, v)| {
            **v > 0
                && ["udp_", "if_", "tap_", "dmesg_"]
                    .iter()
                    .any(|p| k.starts_with(p))
        })
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(" ")
    }
}

/// Errs naming the first of [`MALFORMED_DROPS`] that softroce counted (`sr`: its counters).
fn no_malformed_drops(sr: &BTreeMap<String, u64>) -> Result<(), String> {
    for k in MALFORMED_DROPS {
        let n = sr.get(k).copied().unwrap_or(0);
        ensure!(n == 0, "softroce dropped {n} rxe packets as {k}");
    }
    Ok(())
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
    /// The tap subnet's prefix length.
    prefix: u8,
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
            prefix: get("PREFIX")?
                .parse()
                .map_err(|e| format!("PREFIX in {}: {e}", run.join("env").display()))?,
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

    /// The tap's subnet (`10.66.0.0/24`), which holds both the host's and the guest's address.
    fn subnet(&self) -> Res<String> {
        let ip: std::net::Ipv4Addr = self.host_ip.parse().map_err(|e| format!("{e}"))?;
        let mask = u32::MAX
            .checked_shl(32u32.saturating_sub(u32::from(self.prefix)))
            .unwrap_or(0);
        let net = std::net::Ipv4Addr::from(u32::from(ip) & mask);
        Ok(format!("{net}/{}", self.prefix))
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

    /// The processes in the host's namespace (by PID), read from `/proc/PID/ns/net`.
    fn netns_pids(&self) -> Res<BTreeSet<u32>> {
        use std::os::unix::fs::MetadataExt;
        let ns = Path::new("/run/netns").join(&self.netns);
        let ino = std::fs::metadata(&ns)
            .map_err(|e| format!("{}: {e}", ns.display()))?
            .ino();
        let want = format!("net:[{ino}]");
        let procs = std::fs::read_dir("/proc").map_err(|e| format!("/proc: {e}"))?;
        Ok(procs
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read_link(format!("/proc/{pid}/ns/net"))
                    .is_ok_and(|l| l.as_os_str() == want.as_str())
            })
            .collect())
    }

    /// Waits until every process of the namespace that is not in `before` has exited: after
    /// a librdmacm.so.1 program, its stand-ins (crates/softroce/src/net/standin.rs: children
    /// that outlive it to send the DREQ or DREP of each connection it left), whose packets
    /// the tap's count and rxe's counters must both include.
    fn wait_netns_done(&self, before: &BTreeSet<u32>, timeout: Duration) -> Res<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let left: Vec<u32> = self.netns_pids()?.difference(before).copied().collect();
            if left.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let names: Vec<String> = left
                    .iter()
                    .map(|p| {
                        let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                        format!("{p} {}", String::from_utf8_lossy(&cmd).replace('\0', " "))
                    })
                    .collect();
                return Err(format!(
                    "processes still in the namespace {timeout:?} after the host program: {names:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// rxe's hw_counters of the guest's device, the guest's UDP, NIC and input-backlog drop
    /// counters and rxe's logged silent drops (`udp_*`, `if_*`, `dmesg_*`: lib.sh
    /// `counters`) and the packets the tap could not hand to the guest (`tap_tx_dropped`).
    fn rxe_counters(&self) -> Res<BTreeMap<String, u64>> {
        let (rc, out) = self.guest_run("counters", "counters", Duration::from_secs(30))?;
        ensure!(rc == 0, "reading rxe counters failed: {out}");
        let mut m = parse_pairs(out.split_whitespace());
        let tap = Command::new("ip")
            .args(["netns", "exec", &self.netns, "cat"])
            .arg("/sys/class/net/srtap0/statistics/tx_dropped")
            .output()
            .map_err(|e| format!("tap statistics: {e}"))?;
        if let Ok(v) = String::from_utf8_lossy(&tap.stdout).trim().parse() {
            m.insert("tap_tx_dropped".into(), v);
        }
        Ok(m)
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

    fn stderr(&self) -> String {
        self.err.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Waits until something listens on TCP `port` in the namespace (for programs that print
    /// nothing before their exchange: stdout into a pipe is block-buffered). Fails if the
    /// process exits first.
    fn wait_listen(&mut self, rig: &Rig, port: u16, timeout: Duration) -> Res<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let ss = Command::new("ip")
                .args(["netns", "exec", &rig.netns, "ss", "-Hltn"])
                .arg(format!("sport = :{port}"))
                .output()
                .map_err(|e| format!("ss: {e}"))?;
            if !String::from_utf8_lossy(&ss.stdout).trim().is_empty() {
                return Ok(());
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                std::thread::sleep(Duration::from_millis(50));
                return Err(format!(
                    "`{}` exited ({st}) before listening on TCP {port}:\n{}{}",
                    self.cmd,
                    self.stdout(),
                    self.stderr()
                ));
            }
            ensure!(
                Instant::now() < deadline,
                "`{}` did not listen on TCP {port} in {timeout:?}",
                self.cmd
            );
            std::thread::sleep(Duration::from_millis(50));
        }
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

    /// As [`HostProc::wait`] for a launcher (mpirun): after `timeout` it gets SIGTERM, on which
    /// it stops what it started (its ranks, its daemons), and SIGKILL only if it is still there
    /// `grace` later. The exit code is `None` when it had to be stopped.
    fn wait_launcher(mut self, timeout: Duration, grace: Duration) -> HostExit {
        let deadline = Instant::now() + timeout;
        while let Ok(None) = self.child.try_wait() {
            if Instant::now() > deadline {
                let _ = Command::new("kill")
                    .args(["-TERM", &self.child.id().to_string()])
                    .status();
                let mut exit = self.wait(grace);
                exit.code = None;
                return exit;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.wait(Duration::ZERO)
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
    run_pair_within(
        rig,
        log,
        role,
        (host_prog, host_args, host_ready),
        guest_body,
        TOOL_TIMEOUT,
    )
}

/// [`run_pair`] with the guest tool allowed `limit` instead of [`TOOL_TIMEOUT`].
fn run_pair_within(
    rig: &Rig,
    log: &mut String,
    role: Role,
    (host_prog, host_args, host_ready): (&Path, &[String], &str),
    guest_body: &str,
    limit: Duration,
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
            let ready = if host_ready.is_empty() {
                host.wait_listen(rig, 18515, Duration::from_secs(30))
            } else {
                host.wait_for(host_ready, Duration::from_secs(30))
            };
            if let Err(e) = ready {
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
    let guest = job.wait(rig, limit);
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
    // A guest tool that failed or ran out of time often waits for a host side that gave up
    // first (softroce perf ends a wait after `STALL`, 30 s, and says why on stderr): the
    // failure carries the host side's end and rxe's counters (retransmits, sequence errors),
    // not only in the run's log, which a CI machine does not keep.
    let (guest_rc, guest_out) = guest.map_err(|e| {
        let rxe = rig.rxe_counters().map_or_else(
            |e| format!("(unreadable: {e})"),
            |m| {
                m.iter()
                    .filter(|(_, v)| **v != 0)
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            },
        );
        format!(
            "{e}\nhost side ({}): exit {:?}; stdout ends:\n{}\nstderr ends:\n{}\nrxe counters \
             now (non-zero): {rxe}",
            host_prog.display(),
            host.code,
            last_lines(&host.stdout, 12),
            last_lines(&host.stderr, 12)
        )
    })?;
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

/// The last `n` lines of `s`.
fn last_lines(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
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

/// `ibv_{rc,uc,ud,srq}_pingpong` against `softroce pingpong --rc/--uc/--ud/--srq`;
/// `srq-events`: srq with `-e` on both sides (each sleeps on a completion channel).
fn pingpong(
    rig: &Rig,
    log: &mut String,
    role: Role,
    qp: &str,
    size: u32,
    loss: bool,
) -> Res<String> {
    let iters = if loss { LOSS_ITERS } else { PINGPONG_ITERS };
    let (qp, events) = match qp.strip_suffix("-events") {
        Some(q) => (q, true),
        None => (qp, false),
    };
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
    if events {
        args.push("-e".into());
        tool.push_str(" -e");
    }
    if qp == "srq" {
        probe_implemented(rig, &args, "local address:", "--srq")?;
    }
    let before = rig.rxe_counters()?;
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
    let invalid: Vec<&str> = p
        .guest_out
        .lines()
        .filter(|l| l.contains("invalid data"))
        .collect();
    ensure!(
        invalid.is_empty(),
        "ibv_{qp}_pingpong -c reports {invalid:?} (its check of the {} pages it received from \
         softroce's messages: byte 0 of each page must be 0, as its own client sets it)\n{}",
        size.div_ceil(4096),
        p.guest_out
    );
    // "data: N received messages of S bytes checked" (with --srq: "... bytes on Q QPs and one
    // SRQ checked"). N is the iterations; with an SRQ up to one more per QP (16), since
    // srq_pingpong's loop ends once both counts reach -n while every QP keeps one exchange
    // going.
    let extra = if qp == "srq" { 16 } else { 0 };
    let received = p.host.stdout.lines().find_map(|l| {
        let rest = l.strip_prefix("data: ")?;
        let (n, rest) = rest.split_once(" received messages of ")?;
        rest.starts_with(&format!("{size} bytes "))
            .then_some(())
            .and(l.contains(" checked").then_some(()))?;
        n.parse::<u32>().ok()
    });
    ensure!(
        received.is_some_and(|n| n >= iters && n <= iters + extra),
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
    // Datagrams softroce received: `rx_datagrams`; `softroce pingpong --srq` prints only the
    // device counters, whose `rcvd_pkts` counts the same packets once their checks passed
    // (and the drop counters below must be zero).
    let sr_rx = sr
        .get("rx_datagrams")
        .or_else(|| sr.get("rcvd_pkts"))
        .copied()
        .unwrap_or(0);
    let accepted = g(&rxe, "rcvd_pkts") + lost_to_rxe;
    let late = (g(&rxe, "sent_pkts") - lost_by_rxe.min(g(&rxe, "sent_pkts"))).saturating_sub(sr_rx);
    let guest_slack = u64::from(loss);
    // ibv_srq_pingpong ends as soon as its own counts reach -n and destroys its 16 QPs while
    // the peer's last packets may still be on the way (as between two rxe devices, whose
    // control run shows retransmit timeouts too): rxe drops those uncounted. What softroce
    // sends then is end-of-run traffic of four kinds, each counted by softroce: the packets
    // of SENDs it posted that never completed (`sends: posted=` minus `rdma_sends`; seen
    // once: 8 SENDs of 4 packets, after a stall of the guest had made all 16 QPs time out),
    // request packets sent again after a retry (`retransmitted_pkts`), ACKs answering a
    // duplicate request (`duplicate_request`), and ACKs of the up to one extra message per
    // QP that rxe sent beyond -n (`rdma_recvs` - N). So with an SRQ every SEND that
    // completed at softroce must have been executed by rxe (its `rdma_recvs` equals
    // softroce's `rdma_sends`), and rxe may count fewer packets than softroce sent by at
    // most that end-of-run traffic.
    let per_msg = u64::from(size.div_ceil(1024).max(1));
    let teardown = if qp == "srq" {
        ensure!(
            g(&rxe, "rdma_recvs") == g(&sr, "rdma_sends"),
            "rxe executed {} SEND packets, softroce sent {}",
            g(&rxe, "rdma_recvs"),
            g(&sr, "rdma_sends")
        );
        let posted = p
            .host
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("sends: posted="))
            .and_then(|n| n.parse::<u64>().ok())
            .ok_or("softroce printed no 'sends: posted=N' line")?;
        ensure!(
            posted >= g(&sr, "rdma_sends") && posted <= u64::from(iters + extra),
            "softroce posted {posted} SENDs, completed {}",
            g(&sr, "rdma_sends")
        );
        (posted - g(&sr, "rdma_sends")) * per_msg
            + g(&sr, "retransmitted_pkts")
            + g(&sr, "duplicate_request")
            + g(&sr, "rdma_recvs")
                .saturating_sub(u64::from(iters))
                .min(u64::from(extra))
    } else {
        0
    };
    ensure!(
        accepted + teardown >= g(&sr, "sent_pkts")
            && accepted.saturating_sub(g(&sr, "sent_pkts")) <= late + guest_slack,
        "rxe accepted {} packets, netem dropped {lost_to_rxe} on the way, but softroce sent {} \
         (and at most {late} after reading its counters, {teardown} end-of-run packets that \
         may have reached destroyed QPs)",
        g(&rxe, "rcvd_pkts"),
        g(&sr, "sent_pkts")
    );
    no_malformed_drops(&sr)?;
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
        let rxe_sent = g(&rxe, "sent_pkts");
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

// ------------------------------------------------------------------------ negative cases

/// AETH syndrome of the NAK rxe sends for an RDMA READ that runs past the end of the MR
/// (remote access error: rxe_resp.c `check_rkey` finds the range outside the MR).
const READ_OOB_SYNDROME: u8 = 0x62;
/// RNR timer code both responders put in their RNR NAKs in the RNR scenarios (10.24 ms).
const RNR_TIMER: u8 = 20;
/// What the SEND scenarios send when softroce is the requester.
const SOFTROCE_SEND: &str = "softroce SEND, delivered after an RNR NAK";

/// A `softroce target` running in the namespace, driven through its JSON lines.
struct TargetProc {
    child: Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
    /// Lines read but not yet asked for (completions, events).
    pending: Vec<(String, serde_json::Value)>,
    /// Every line, for the log.
    transcript: String,
}

impl TargetProc {
    fn start(rig: &Rig, args: &[String]) -> Res<TargetProc> {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &rig.netns])
            .arg(softroce_bin())
            .arg("target")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start softroce target: {e}"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Ok(TargetProc {
            child,
            stdin,
            lines,
            pending: Vec::new(),
            transcript: format!("$ softroce target {}\n", args.join(" ")),
        })
    }

    /// The next output line as (kind, body).
    fn next(&mut self, timeout: Duration) -> Res<(String, serde_json::Value)> {
        let text = self
            .lines
            .recv_timeout(timeout)
            .map_err(|_| format!("softroce target printed nothing for {timeout:?}"))?;
        let _ = writeln!(self.transcript, "< {text}");
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("target line {text:?}: {e}"))?;
        let (k, body) = v
            .as_object()
            .and_then(|o| o.iter().next())
            .ok_or_else(|| format!("target line {text:?} is not an object"))?;
        Ok((k.clone(), body.clone()))
    }

    /// The next line of `kind` (earlier lines of other kinds are kept for later).
    fn wait_kind(&mut self, kind: &str, timeout: Duration) -> Res<serde_json::Value> {
        if let Some(i) = self.pending.iter().position(|(k, _)| k == kind) {
            return Ok(self.pending.remove(i).1);
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (k, v) = self
                .next(left)
                .map_err(|e| format!("waiting for a {kind:?} line: {e}"))?;
            if k == kind {
                return Ok(v);
            }
            if k == "error" {
                return Err(format!("softroce target: {v}"));
            }
            self.pending.push((k, v));
        }
    }

    /// Sends one command and returns its reply.
    fn cmd(&mut self, name: &str, args: serde_json::Value) -> Res<serde_json::Value> {
        let line = serde_json::json!({ name: args }).to_string();
        let _ = writeln!(self.transcript, "> {line}");
        let stdin = self.stdin.as_mut().ok_or("target stdin closed")?;
        use std::io::Write as _;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("write to softroce target: {e}"))?;
        self.wait_kind(name, Duration::from_secs(30))
    }

    fn counters(&mut self) -> Res<BTreeMap<String, u64>> {
        let c = self.cmd("counters", serde_json::json!({}))?;
        Ok(c.as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// `quit`, then the exit status.
    fn quit(mut self) -> (Option<i32>, String) {
        let _ = self.cmd("quit", serde_json::json!({}));
        self.stdin = None;
        let deadline = Instant::now() + Duration::from_secs(10);
        let code = loop {
            match self.child.try_wait() {
                Ok(Some(st)) => break st.code(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break None;
                }
            }
        };
        (code, std::mem::take(&mut self.transcript))
    }
}

impl Drop for TargetProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for a file the guest writes into the share (by rename), or for the guest job to end
/// first (then fails with its output).
fn wait_share_file(rig: &Rig, job: &GuestJob, path: &Path, timeout: Duration) -> Res<String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            return Ok(s);
        }
        if job.dir.join(format!("{}.rc", job.id)).exists() {
            let out = job.wait(rig, Duration::from_secs(1)).map(|r| r.1);
            return Err(format!(
                "the guest job ended before writing {}: {out:?}",
                path.display()
            ));
        }
        ensure!(
            Instant::now() < deadline,
            "{} did not appear in {timeout:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn put_share_file(path: &Path, text: &str) -> Res<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(|e| format!("write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("rename to {}: {e}", path.display()))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Neg {
    /// RDMA READ of 64 B starting 32 B before the end of a 4096-byte MR.
    ReadOob,
    /// SEND with no receive posted, rnr_retry 7: RNR NAK, then success once one is posted.
    RnrThenSuccess,
    /// SEND with no receive posted, rnr_retry 0: one RNR NAK, IBV_WC_RNR_RETRY_EXC_ERR.
    RnrExceeded,
}

/// A negative case between `softroce target` and pyverbs on rxe, seen from both sides: the
/// requester's completion status, the NAKs in a capture of the guest NIC, both sides'
/// counters, and that rxe accepted every packet softroce sent.
fn negative(rig: &Rig, log: &mut String, role: Role, case: Neg) -> Res<String> {
    use serde_json::json;
    let before = rig.rxe_counters()?;
    let ex = format!("neg-{}", rig.seq.load(Ordering::Relaxed));
    let host_ex = |suffix: &str| rig.run.join("jobs").join(format!("{ex}.{suffix}"));
    let softroce_requester = role == Role::SoftroceClient;
    let rnr_retry = if case == Neg::RnrExceeded { 0 } else { 7 };
    let args: Vec<String> = [
        "--ip",
        &rig.host_ip,
        "--mr-size",
        "4096",
        "--path-mtu",
        "1024",
        "--min-rnr-timer",
        &RNR_TIMER.to_string(),
        "--no-recv",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut t = TargetProc::start(rig, &args)?;
    let result = (|| -> Res<String> {
        let ready = t.wait_kind("ready", Duration::from_secs(30))?;
        let mr = ready["mrs"][0].clone();
        let (op, side, expect) = match (case, softroce_requester) {
            (Neg::ReadOob, _) => ("read-oob", "", "IBV_WC_REM_ACCESS_ERR"),
            (Neg::RnrThenSuccess, _) => ("send", "", "IBV_WC_SUCCESS"),
            (Neg::RnrExceeded, _) => ("send", " --no-recv", "IBV_WC_RNR_RETRY_EXC_ERR"),
        };
        let peer = if softroce_requester {
            format!(
                "python3 /share/pyverbs_peer.py neg responder --op {op} --ex /share/jobs/{ex} \
                 --min-rnr-timer {RNR_TIMER} --message '{SOFTROCE_SEND}'{side}"
            )
        } else {
            format!(
                "python3 /share/pyverbs_peer.py neg requester --op {op} --ex /share/jobs/{ex} \
                 --rnr-retry {rnr_retry} --expect {expect}"
            )
        };
        let body = format!(
            "capture_start /tmp/n.pcap || exit 98\n{peer}\nrc=$?\ncapture_stop\n\
             echo '--- pcap:'; python3 /share/pyverbs_peer.py pcap-summary /tmp/n.pcap\nexit $rc"
        );
        let _ = writeln!(log, "## guest:\n{body}");
        let job = rig.guest("neg", &body)?;
        let theirs: serde_json::Value = serde_json::from_str(&wait_share_file(
            rig,
            &job,
            &host_ex("rxe"),
            Duration::from_secs(60),
        )?)
        .map_err(|e| format!("the guest's endpoint: {e}"))?;
        let c = t.cmd(
            "connect",
            json!({"dest_qpn": theirs["qpn"], "dest_psn": theirs["psn"],
                   "dest_gid": rig.guest_ip, "rnr_retry": rnr_retry}),
        )?;
        ensure!(c["state"] == "RTS", "target connect: {c}");
        put_share_file(
            &host_ex("host"),
            &json!({"qpn": ready["qpn"], "psn": ready["psn"], "gid": ready["gid"],
                    "va": mr["va"], "rkey": mr["rkey"], "len": mr["length"]})
            .to_string(),
        )?;
        wait_share_file(rig, &job, &host_ex("rxe-ready"), Duration::from_secs(60))?;
        if softroce_requester {
            let wr = match case {
                Neg::ReadOob => {
                    let end =
                        theirs["va"].as_u64().unwrap_or(0) + theirs["len"].as_u64().unwrap_or(0);
                    json!({"opcode": "read", "length": 64, "remote_addr": end - 32,
                           "rkey": theirs["rkey"], "wr_id": 1})
                }
                _ => {
                    t.cmd(
                        "write_mr",
                        json!({"index": 0, "hex": hex_of(SOFTROCE_SEND.as_bytes())}),
                    )?;
                    json!({"opcode": "send", "length": SOFTROCE_SEND.len(), "wr_id": 1})
                }
            };
            t.cmd("post_send", wr)?;
            let wc = t.wait_kind("wc", Duration::from_secs(60))?;
            ensure!(
                wc["status"] == expect && wc["wr_id"] == 1,
                "softroce's completion: {wc}, expected {expect}"
            );
            if case == Neg::ReadOob {
                let d = t.cmd("dump_mr", json!({"index": 0, "length": 64}))?;
                ensure!(
                    d["hex"]
                        .as_str()
                        .is_some_and(|h| h.chars().all(|c| c == '0')),
                    "the READ's local buffer changed: {d}"
                );
            }
            put_share_file(&host_ex("done"), "done\n")?;
        } else {
            if case != Neg::ReadOob {
                // Wait until the target has RNR NAKed the SEND.
                let deadline = Instant::now() + Duration::from_secs(60);
                while t.counters()?.get("send_rnr_err").copied().unwrap_or(0) == 0 {
                    ensure!(
                        Instant::now() < deadline,
                        "softroce sent no RNR NAK in 60 s"
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            if case == Neg::RnrThenSuccess {
                t.cmd("post_recv", json!({}))?;
                let wc = t.wait_kind("wc", Duration::from_secs(60))?;
                let want = hex_of(RXE_MESSAGE.as_bytes());
                ensure!(
                    wc["status"] == "IBV_WC_SUCCESS"
                        && wc["opcode"] == "IBV_WC_RECV"
                        && wc["data"].as_str().is_some_and(|d| d.starts_with(&want)),
                    "softroce's receive completion: {wc}, expected the rxe message"
                );
            }
        }
        let (grc, gout) = job.wait(rig, TOOL_TIMEOUT)?;
        let _ = writeln!(log, "## guest exit {grc}:\n{gout}");
        ensure!(grc == 0, "pyverbs peer exited {grc}:\n{gout}");
        // Where the QPs were left: a NAKed request (remote access error) moves the responder's
        // QP to ERR too (rxe_resp.c: class A/C errors set goto_error); an RNR NAK does not;
        // an error completion moves the requester's QP to ERR.
        let rxe_state = gout
            .lines()
            .find_map(|l| l.strip_prefix("rxe QP state: "))
            .unwrap_or("?")
            .trim()
            .to_string();
        let q = t.cmd("query_qp", json!({}))?;
        let sr_state = q["state"].as_str().unwrap_or("?").to_string();
        let (want_req, want_resp) = match case {
            Neg::ReadOob => ("ERR", "ERR"),
            Neg::RnrThenSuccess => ("RTS", "RTS"),
            Neg::RnrExceeded => ("ERR", "RTS"),
        };
        let (req_state, resp_state) = if softroce_requester {
            (&sr_state, &rxe_state)
        } else {
            (&rxe_state, &sr_state)
        };
        ensure!(
            req_state == want_req && resp_state == want_resp,
            "QP states: requester {req_state}, responder {resp_state}; expected {want_req}, \
             {want_resp}"
        );
        let sr = t.counters()?;
        let _ = writeln!(log, "## softroce counters: {sr:?}");
        let after = rig.rxe_counters()?;
        let rxe = delta(&before, &after);
        let _ = writeln!(log, "## rxe counters (delta): {rxe:?}");
        let g = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);

        let pcap: Vec<&str> = gout
            .split("--- pcap:")
            .nth(1)
            .unwrap_or("")
            .lines()
            .filter(|l| l.contains(" opcode="))
            .collect();
        let from_host = format!("{} > {} ", rig.host_ip, rig.guest_ip);
        let from_guest = format!("{} > {} ", rig.guest_ip, rig.host_ip);
        let sent_by_softroce = pcap.iter().filter(|l| l.starts_with(&from_host)).count() as u64;
        ensure!(
            g(&rxe, "rcvd_pkts") == sent_by_softroce && g(&sr, "sent_pkts") == sent_by_softroce,
            "rxe accepted {} packets, the guest saw {sent_by_softroce} from softroce, softroce \
             counted {} sent",
            g(&rxe, "rcvd_pkts"),
            g(&sr, "sent_pkts")
        );
        no_malformed_drops(&sr)?;
        let responder = if softroce_requester {
            &from_guest
        } else {
            &from_host
        };
        let naks: Vec<u8> = pcap
            .iter()
            .filter(|l| l.starts_with(responder.as_str()) && l.contains("opcode=0x11"))
            .filter_map(|l| l.rsplit_once("syndrome=0x"))
            .filter_map(|(_, s)| u8::from_str_radix(s.trim(), 16).ok())
            .collect();
        // Every request is the one single-packet message (a retry keeps its PSN), and every
        // ACK, RNR NAK and NAK carries that PSN (IBTA 9.7.5.1; rxe `send_ack`).
        let requester = if softroce_requester {
            &from_host
        } else {
            &from_guest
        };
        let psn_of = |l: &str| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("psn="))
                .map(str::to_string)
        };
        let req_psns: Vec<String> = pcap
            .iter()
            .filter(|l| l.starts_with(requester.as_str()))
            .filter_map(|l| psn_of(l))
            .collect();
        let resp_psns: Vec<String> = pcap
            .iter()
            .filter(|l| l.starts_with(responder.as_str()))
            .filter_map(|l| psn_of(l))
            .collect();
        ensure!(
            !req_psns.is_empty()
                && req_psns.iter().chain(&resp_psns).all(|p| *p == req_psns[0])
                && naks.len() == resp_psns.len(),
            "expected requests and ACKs/NAKs all at one PSN: {pcap:#?}"
        );
        let (requester_c, responder_c) = if softroce_requester {
            (&sr, &rxe)
        } else {
            (&rxe, &sr)
        };
        let who = if softroce_requester {
            "rxe"
        } else {
            "softroce"
        };
        match case {
            Neg::ReadOob => {
                ensure!(
                    naks == [READ_OOB_SYNDROME],
                    "expected one NAK with AETH syndrome 0x{READ_OOB_SYNDROME:02x} from {who}, \
                     the capture has ACKNOWLEDGEs with {naks:02x?}"
                );
                Ok(format!(
                    "NAK remote access error (AETH 0x{READ_OOB_SYNDROME:02x}) from {who} on the \
                     wire at the READ's PSN, IBV_WC_REM_ACCESS_ERR at the requester{}, both QPs \
                     in ERR; rxe accepted \
                     {sent_by_softroce} of {sent_by_softroce} softroce packets",
                    if softroce_requester {
                        ", READ buffer untouched"
                    } else {
                        ""
                    }
                ))
            }
            Neg::RnrThenSuccess | Neg::RnrExceeded => {
                let rnr = 0x20 | RNR_TIMER;
                let n_rnr = naks.iter().filter(|s| **s == rnr).count() as u64;
                let acks = naks.iter().filter(|s| **s < 0x20).count();
                ensure!(
                    naks.iter().all(|s| *s == rnr || *s < 0x20),
                    "unexpected syndromes from {who}: {naks:02x?}"
                );
                ensure!(
                    g(responder_c, "send_rnr_err") == n_rnr
                        && g(requester_c, "rcvd_rnr_err") == n_rnr,
                    "{n_rnr} RNR NAKs on the wire, responder counted send_rnr_err {}, requester \
                     rcvd_rnr_err {}",
                    g(responder_c, "send_rnr_err"),
                    g(requester_c, "rcvd_rnr_err")
                );
                if case == Neg::RnrExceeded {
                    ensure!(
                        n_rnr == 1 && acks == 0,
                        "rnr_retry 0: expected exactly one RNR NAK (0x{rnr:02x}) and no ACK \
                         from {who}, got {naks:02x?}"
                    );
                    ensure!(
                        g(requester_c, "retry_rnr_exceeded_err") == 1,
                        "requester's retry_rnr_exceeded_err = {}",
                        g(requester_c, "retry_rnr_exceeded_err")
                    );
                    Ok(format!(
                        "one RNR NAK (AETH 0x{rnr:02x}) from {who} on the wire, \
                         IBV_WC_RNR_RETRY_EXC_ERR at the requester (QP in ERR, the responder's \
                         still RTS), nothing received; rxe \
                         accepted {sent_by_softroce} of {sent_by_softroce} softroce packets"
                    ))
                } else {
                    ensure!(
                        n_rnr >= 1 && acks >= 1,
                        "expected RNR NAKs (0x{rnr:02x}) then an ACK from {who}, got {naks:02x?}"
                    );
                    // The requester honours the RNR timer: each retry leaves at least the
                    // encoded 10.24 ms after the RNR NAK (capture times in the guest; 0.2 ms
                    // slack for the clock's granularity).
                    let t_of = |l: &str| {
                        l.split_whitespace()
                            .find_map(|w| w.strip_prefix("t="))
                            .and_then(|t| t.parse::<f64>().ok())
                    };
                    let mut min_wait = f64::INFINITY;
                    let mut last_rnr = None;
                    for l in &pcap {
                        if l.starts_with(responder.as_str())
                            && l.ends_with(&format!("syndrome=0x{rnr:02x}"))
                        {
                            last_rnr = t_of(l);
                        } else if l.starts_with(requester.as_str()) {
                            let waited = last_rnr.take().zip(t_of(l)).map(|(t0, t1)| t1 - t0);
                            min_wait = waited.map_or(min_wait, |w| min_wait.min(w));
                        }
                    }
                    let want_wait = 0.01024 - 0.0002;
                    ensure!(
                        min_wait.is_finite() && min_wait >= want_wait,
                        "the requester retried {:.2} ms after an RNR NAK (timer 10.24 ms): {pcap:#?}",
                        min_wait * 1e3
                    );
                    let requester_name = if softroce_requester {
                        "softroce"
                    } else {
                        "rxe"
                    };
                    Ok(format!(
                        "{n_rnr} RNR NAK(s) (AETH 0x{rnr:02x}) from {who}, {requester_name} retried \
                         {:.1} ms later (timer 10.24 ms), then the ACK of the retried SEND once a \
                         receive was posted; IBV_WC_SUCCESS at the \
                         requester, the message in {who}'s receive buffer; rxe accepted \
                         {sent_by_softroce} of {sent_by_softroce} softroce packets",
                        min_wait * 1e3
                    ))
                }
            }
        }
    })();
    let (code, transcript) = t.quit();
    let _ = writeln!(log, "## softroce target (exit {code:?}):\n{transcript}");
    let summary = result?;
    ensure!(code == Some(0), "softroce target exited {code:?}");
    Ok(summary)
}

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

// ------------------------------------------------------------- IP header and WC fields

/// IPv4 TOS both sides' QPs use in the WC-fields scenario: DSCP 46 (expedited forwarding),
/// ECN 0.
const FIELDS_TCLASS: u8 = 0xb8;
/// What each requester posts in the WC-fields scenario (as pyverbs_peer.py's FIELDS_WRS):
/// target opcode, length, immediate (wire value), offset of a WRITE in the peer's region.
const FIELDS_WRS: [(&str, u32, Option<u32>, Option<u64>); 4] = [
    ("send_imm", 3000, Some(0x5eed_1234), None),
    ("send", 5, None, None),
    ("write", 100, None, Some(0)),
    ("write_imm", 2500, Some(0xc0ff_ee01), Some(1024)),
];

/// pyverbs_peer.py's PATTERN: what both sides send.
fn fields_pattern() -> Vec<u8> {
    (0..4096u32).map(|i| ((i * 7 + 3) & 0xff) as u8).collect()
}

/// One completion, as either side reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct WcFields {
    status: String,
    opcode: String,
    byte_len: u64,
    grh: bool,
    with_imm: bool,
    imm_data: u64,
}

/// pyverbs_peer.py's `wc ...` lines.
fn rxe_wcs(out: &str) -> Vec<WcFields> {
    out.lines()
        .filter_map(|l| l.strip_prefix("wc "))
        .map(|l| {
            let kv: BTreeMap<&str, &str> = l
                .split_whitespace()
                .filter_map(|w| w.split_once('='))
                .collect();
            let num = |k: &str| {
                kv.get(k).map_or(0, |v| match v.strip_prefix("0x") {
                    Some(h) => u64::from_str_radix(h, 16).unwrap_or(0),
                    None => v.parse().unwrap_or(0),
                })
            };
            WcFields {
                status: kv.get("status").unwrap_or(&"?").to_string(),
                opcode: kv.get("opcode").unwrap_or(&"?").to_string(),
                byte_len: num("byte_len"),
                grh: num("grh") == 1,
                with_imm: num("with_imm") == 1,
                imm_data: num("imm_data"),
            }
        })
        .collect()
}

/// A `softroce target` `wc` line.
fn target_wc(v: &serde_json::Value) -> WcFields {
    WcFields {
        status: v["status"].as_str().unwrap_or("?").to_string(),
        opcode: v["opcode"].as_str().unwrap_or("?").to_string(),
        byte_len: v["byte_len"].as_u64().unwrap_or(0),
        grh: v["grh"].as_bool().unwrap_or(false),
        with_imm: v["with_imm"].as_bool().unwrap_or(false),
        imm_data: v["imm_data"].as_u64().unwrap_or(0),
    }
}

/// The completions rxe (kernel 6.1) gives: at the requester (rxe_comp.c `make_send_cqe`)
/// `byte_len` is the message length and SEND_WITH_IMM / RDMA_WRITE_WITH_IMM carry
/// IBV_WC_WITH_IMM with `imm_data` left 0 (seen in this scenario's first run); at the
/// responder (rxe_resp.c `do_complete`, user CQ) every receive has
/// IBV_WC_GRH, plus IBV_WC_WITH_IMM and the immediate when the message had one.
fn fields_expected(requester: bool) -> Vec<WcFields> {
    let ok = "IBV_WC_SUCCESS".to_string();
    FIELDS_WRS
        .iter()
        .filter(|(op, ..)| requester || *op != "write")
        .map(|&(op, len, imm, _)| {
            let opcode = match (requester, op) {
                (true, "send" | "send_imm") => "IBV_WC_SEND",
                (true, _) => "IBV_WC_RDMA_WRITE",
                (false, "write_imm") => "IBV_WC_RECV_RDMA_WITH_IMM",
                (false, _) => "IBV_WC_RECV",
            };
            WcFields {
                status: ok.clone(),
                opcode: opcode.to_string(),
                byte_len: u64::from(len),
                grh: !requester,
                with_imm: imm.is_some(),
                imm_data: if requester {
                    0
                } else {
                    u64::from(imm.unwrap_or(0))
                },
            }
        })
        .collect()
}

/// Issue 14's scenario: `softroce target` with traffic class 0xb8 against pyverbs on rxe (with
/// the same), SEND_WITH_IMM, SEND, RDMA WRITE and RDMA_WRITE_WITH_IMM from the requester.
/// Checks, in a capture on the guest NIC, that every softroce packet carries TOS 0xb8, records
/// the UDP checksums the guest sees, checks rxe accepted every packet, and compares both
/// sides' completions (byte_len, IBV_WC_GRH, IBV_WC_WITH_IMM, immediate) with what rxe gives.
fn wc_fields(rig: &Rig, log: &mut String, role: Role) -> Res<String> {
    use serde_json::json;
    let before = rig.rxe_counters()?;
    let ex = format!("fields-{}", rig.seq.load(Ordering::Relaxed));
    let host_ex = |suffix: &str| rig.run.join("jobs").join(format!("{ex}.{suffix}"));
    let softroce_requester = role == Role::SoftroceClient;
    let pattern = fields_pattern();
    let args: Vec<String> = [
        "--ip",
        &rig.host_ip,
        "--mr-size",
        "4096",
        "--path-mtu",
        "1024",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut t = TargetProc::start(rig, &args)?;
    let result = (|| -> Res<String> {
        let ready = t.wait_kind("ready", Duration::from_secs(30))?;
        let mr = ready["mrs"][0].clone();
        let side = if softroce_requester {
            "responder"
        } else {
            "requester"
        };
        let body = format!(
            "capture_start /tmp/f.pcap || exit 98\n\
             python3 /share/pyverbs_peer.py fields {side} --ex /share/jobs/{ex} \
             --tclass {FIELDS_TCLASS:#x}\nrc=$?\ncapture_stop\n\
             echo '--- pcap:'; python3 /share/pyverbs_peer.py pcap-summary /tmp/f.pcap\nexit $rc"
        );
        let _ = writeln!(log, "## guest:\n{body}");
        let job = rig.guest("fields", &body)?;
        let theirs: serde_json::Value = serde_json::from_str(&wait_share_file(
            rig,
            &job,
            &host_ex("rxe"),
            Duration::from_secs(60),
        )?)
        .map_err(|e| format!("the guest's endpoint: {e}"))?;
        let c = t.cmd(
            "connect",
            json!({"dest_qpn": theirs["qpn"], "dest_psn": theirs["psn"],
                   "dest_gid": rig.guest_ip, "traffic_class": FIELDS_TCLASS}),
        )?;
        ensure!(
            c["state"] == "RTS" && c["traffic_class"] == FIELDS_TCLASS,
            "target connect: {c}"
        );
        if softroce_requester {
            t.cmd("write_mr", json!({"index": 0, "hex": hex_of(&pattern)}))?;
        }
        put_share_file(
            &host_ex("host"),
            &json!({"qpn": ready["qpn"], "psn": ready["psn"], "gid": ready["gid"],
                    "va": mr["va"], "rkey": mr["rkey"], "len": mr["length"]})
            .to_string(),
        )?;
        wait_share_file(rig, &job, &host_ex("rxe-ready"), Duration::from_secs(60))?;
        let mut ours = Vec::new();
        if softroce_requester {
            let va = theirs["va"].as_u64().unwrap_or(0) + theirs["write_off"].as_u64().unwrap_or(0);
            for (i, &(op, len, imm, off)) in FIELDS_WRS.iter().enumerate() {
                let mut wr = json!({"opcode": op, "length": len, "wr_id": i + 1});
                if let Some(imm) = imm {
                    wr["imm_data"] = imm.into();
                }
                if let Some(off) = off {
                    wr["remote_addr"] = (va + off).into();
                    wr["rkey"] = theirs["rkey"].clone();
                }
                t.cmd("post_send", wr)?;
            }
            for _ in FIELDS_WRS {
                ours.push(t.wait_kind("wc", Duration::from_secs(60))?);
            }
        } else {
            for _ in 0..3 {
                let wc = t.wait_kind("wc", Duration::from_secs(60))?;
                if wc["opcode"] == "IBV_WC_RECV" {
                    let len = wc["byte_len"].as_u64().unwrap_or(0) as usize;
                    let want = hex_of(&pattern[..len.min(pattern.len())]);
                    ensure!(
                        wc["data"].as_str() == Some(want.as_str()),
                        "softroce received other bytes than rxe sent: {wc}"
                    );
                }
                ours.push(wc);
            }
            for &(op, len, _, off) in &FIELDS_WRS {
                let Some(off) = off else { continue };
                let d = t.cmd("dump_mr", json!({"index": 0, "offset": off, "length": len}))?;
                ensure!(
                    d["hex"].as_str() == Some(hex_of(&pattern[..len as usize]).as_str()),
                    "rxe's {op} of {len} B did not land in softroce's MR at +{off}"
                );
            }
        }
        put_share_file(&host_ex("done"), "done\n")?;
        let (grc, gout) = job.wait(rig, TOOL_TIMEOUT)?;
        let _ = writeln!(log, "## guest exit {grc}:\n{gout}");
        ensure!(grc == 0, "pyverbs peer exited {grc}:\n{gout}");
        let sr = t.counters()?;
        let _ = writeln!(log, "## softroce counters: {sr:?}");
        let after = rig.rxe_counters()?;
        let rxe = delta(&before, &after);
        let _ = writeln!(log, "## rxe counters (delta): {rxe:?}");
        let g = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);

        // Both sides' completions against rxe's (the requester's in posting order; the
        // responder's in arrival order, which RC keeps).
        let ours: Vec<WcFields> = ours.iter().map(target_wc).collect();
        let rxe_side = rxe_wcs(&gout);
        let (sr_want, rxe_want) = (
            fields_expected(softroce_requester),
            fields_expected(!softroce_requester),
        );
        ensure!(
            ours == sr_want,
            "softroce's completions differ from rxe's:\n got {ours:#?}\nwant {sr_want:#?}"
        );
        ensure!(
            rxe_side == rxe_want,
            "rxe's completions are not as expected:\n got {rxe_side:#?}\nwant {rxe_want:#?}\n{gout}"
        );

        // The IP and UDP headers as the guest's tcpdump sees them.
        let pcap: Vec<&str> = gout
            .split("--- pcap:")
            .nth(1)
            .unwrap_or("")
            .lines()
            .filter(|l| l.contains(" opcode="))
            .collect();
        let field = |l: &str, k: &str| -> Option<u64> {
            let v = l
                .split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{k}=")))?;
            match v.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16).ok(),
                None => v.parse().ok(),
            }
        };
        let from_host = format!("{} > {} ", rig.host_ip, rig.guest_ip);
        let (sr_pkts, rxe_pkts): (Vec<&str>, Vec<&str>) =
            pcap.iter().partition(|l| l.starts_with(&from_host));
        let sent_by_softroce = sr_pkts.len() as u64;
        ensure!(
            sent_by_softroce > 0
                && g(&rxe, "rcvd_pkts") == sent_by_softroce
                && g(&sr, "sent_pkts") == sent_by_softroce,
            "rxe accepted {} packets, the guest saw {sent_by_softroce} from softroce, softroce \
             counted {} sent",
            g(&rxe, "rcvd_pkts"),
            g(&sr, "sent_pkts")
        );
        no_malformed_drops(&sr)?;
        let bad_tos: Vec<&&str> = sr_pkts
            .iter()
            .filter(|l| field(l, "tos") != Some(u64::from(FIELDS_TCLASS)))
            .collect();
        ensure!(
            bad_tos.is_empty(),
            "softroce packets without TOS {FIELDS_TCLASS:#04x}: {bad_tos:#?}"
        );
        let tos_set = |pkts: &[&str]| {
            let mut v: Vec<String> = pkts
                .iter()
                .filter_map(|l| field(l, "tos"))
                .map(|t| format!("{t:#04x}"))
                .collect();
            v.sort();
            v.dedup();
            v.join("/")
        };
        let zero = |pkts: &[&str]| {
            pkts.iter()
                .filter(|l| field(l, "udpcsum") == Some(0))
                .count()
        };
        let ttls = |pkts: &[&str]| {
            let mut v: Vec<u64> = pkts.iter().filter_map(|l| field(l, "ttl")).collect();
            v.sort();
            v.dedup();
            format!("{v:?}")
        };
        let who = if softroce_requester {
            "softroce requester (4 WRs), rxe responder"
        } else {
            "rxe requester (4 WRs), softroce responder"
        };
        Ok(format!(
            "{who}: softroce's {sent_by_softroce} packets all TOS {FIELDS_TCLASS:#04x} (TTL \
             {}), UDP checksum 0 on {} of them as the guest sees them; rxe's {} packets TOS {} \
             (checksum 0 on {}); rxe accepted {sent_by_softroce} of {sent_by_softroce}; \
             completions as rxe gives them on both sides (requester: byte_len = message \
             length, IBV_WC_WITH_IMM on the _WITH_IMM opcodes; responder: IBV_WC_GRH on every \
             receive, IBV_WC_WITH_IMM and the immediate), data intact",
            ttls(&sr_pkts),
            zero(&sr_pkts),
            rxe_pkts.len(),
            tos_set(&rxe_pkts),
            zero(&rxe_pkts)
        ))
    })();
    let (code, transcript) = t.quit();
    let _ = writeln!(log, "## softroce target (exit {code:?}):\n{transcript}");
    let summary = result?;
    ensure!(code == Some(0), "softroce target exited {code:?}");
    Ok(summary)
}

/// Prefix of the error of a scenario whose softroce side does not exist yet (the row then says
/// so instead of pass or FAIL).
const NOT_IMPLEMENTED: &str = "not implemented: ";

/// Whether softroce implements what `args` asks for: starts it as the server and waits until
/// it prints `ready` (then stops it), or until it exits saying "not implemented", or its
/// command line parser refuses `feature` (an unknown test or option) (then
/// `Err("not implemented: <why>")`). Any other exit is a failure.
fn probe_implemented(rig: &Rig, args: &[String], ready: &str, feature: &str) -> Res<()> {
    let mut p = rig.host(&softroce_bin(), args)?;
    let r = p.wait_for(ready, Duration::from_secs(30));
    let exit = p.wait(Duration::ZERO);
    match r {
        Ok(()) => Ok(()),
        Err(e) => {
            let quoted = format!("'{feature}'");
            let refused = |l: &&str| {
                l.contains(&quoted)
                    && (l.contains("invalid value") || l.contains("unexpected argument"))
            };
            if let Some(l) = exit.stderr.lines().find(|l| l.contains("not implemented")) {
                Err(format!(
                    "{NOT_IMPLEMENTED}{}",
                    l.trim().trim_start_matches("softroce: ")
                ))
            } else if let Some(l) = exit.stderr.lines().find(refused) {
                Err(format!(
                    "{NOT_IMPLEMENTED}`softroce {}` is refused ({})",
                    args.iter().take(2).cloned().collect::<Vec<_>>().join(" "),
                    l.trim().trim_start_matches("error: ")
                ))
            } else {
                Err(e)
            }
        }
    }
}

/// What a perftest scenario runs: the test (perftest's program name without `ib_`), the
/// message size (`None`: the tool's own, 8 B for atomics) and the iterations.
fn perf_shape(test: &str) -> (Option<u32>, u32) {
    match test {
        "atomic_bw" => (None, PERF_ITERS),
        t if t.ends_with("_lat") => (Some(LAT_SIZE), LAT_ITERS),
        _ => (Some(PERF_SIZE), PERF_ITERS),
    }
}

/// Iterations per size of the `-a` (all sizes) runs: 23 sizes up to 8 MiB against rxe in a
/// TCG guest took 31-39 s per role at 5 on 2026-11-29, 44-65 s on 2026-12-07, and 71-75 s
/// inside a whole CI run that evening.
const ALL_SIZES_ITERS: u32 = 5;

/// How long the guest's `ib_write_lat -a` may run: it moves 160 MiB through the TCG guest,
/// five times the work of any other tool here, and its duration follows the guest's speed,
/// which varies by 2x between days on this machine class (rxe ↔ rxe control, no softroce
/// in it: 1,784 µs/iter in the run docs/interop.md records, 3,497 in the CI run of
/// 2026-12-07 evening, where this scenario took 71-75 s against [`TOOL_TIMEOUT`]'s 120 s).
/// A stall still fails the scenario: softroce perf gives up after 30 s without a completion
/// and exits non-zero, which [`perftest_sizes`] reports.
const ALL_SIZES_TOOL_TIMEOUT: Duration = Duration::from_secs(240);

/// The message sizes of perftest's `-a`: 2 B to 8 MiB, doubling (`perftest_parameters.c`).
fn all_sizes() -> Vec<u32> {
    (1..=23).map(|k| 1u32 << k).collect()
}

/// perftest `ib_<test>` against `softroce perf <test>`: exit statuses, both sides' result
/// rows, and rxe's counters against softroce's.
fn perftest(rig: &Rig, log: &mut String, role: Role, test: &str) -> Res<String> {
    perftest_sizes(rig, log, role, test, false)
}

/// As [`perftest`]; with `all`, both sides run perftest's `-a` and must print a row for each
/// of the 23 sizes (softroce's perf `-a` once failed against rxe from 128 KiB up).
fn perftest_sizes(rig: &Rig, log: &mut String, role: Role, test: &str, all: bool) -> Res<String> {
    let (size, iters) = perf_shape(test);
    let iters = if all { ALL_SIZES_ITERS } else { iters };
    let lat = test.ends_with("_lat");
    let mut args: Vec<String> = ["perf", test, "--ip", &rig.host_ip]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut tool = format!("ib_{test} -d $DEV -x $GIDX -F");
    if all {
        args.push("-a".to_string());
        tool.push_str(" -a");
    } else if let Some(size) = size {
        args.extend(["-s".to_string(), size.to_string()]);
        let _ = write!(tool, " -s {size}");
    }
    args.extend(
        ["-n", &iters.to_string(), "-m", "1024", "--counters"]
            .iter()
            .map(|s| s.to_string()),
    );
    let _ = write!(tool, " -n {iters} -m 1024");
    let ready = "Waiting for client to connect";
    probe_implemented(rig, &args, ready, test)?;
    let size = size.unwrap_or(8);
    let sizes = if all { all_sizes() } else { vec![size] };
    let before = rig.rxe_counters()?;
    if role == Role::SoftroceClient {
        args.push(rig.guest_ip.clone());
    } else {
        tool.push_str(" $HOST_IP");
    }
    let limit = if all {
        ALL_SIZES_TOOL_TIMEOUT
    } else {
        TOOL_TIMEOUT
    };
    let p = run_pair_within(
        rig,
        log,
        role,
        (&softroce_bin(), &args, ready),
        &tool,
        limit,
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
    // Bandwidth rows: bytes, iterations, peak, average (MB/s), message rate; latency rows:
    // bytes, iterations, t_min, t_max, t_typical, t_avg, t_stdev, 99%, 99.9% (µs).
    let (value_col, value_name) = if lat { (5, "t_avg") } else { (3, "BW average") };
    // One row per size, in order.
    let rows_of = |out: &str| -> Res<Vec<Vec<String>>> {
        let rows = result_rows(out, value_name)?;
        ensure!(
            rows.len() >= sizes.len(),
            "{} result rows, expected {}",
            rows.len(),
            sizes.len()
        );
        let rows = rows[..sizes.len()].to_vec();
        for (row, size) in rows.iter().zip(&sizes) {
            ensure!(
                row.len() > value_col && row[0] == size.to_string() && row[1] == iters.to_string(),
                "result row {row:?}: expected {size} bytes × {iters}"
            );
            ensure!(
                row[value_col].parse::<f64>().is_ok_and(|v| v > 0.0),
                "result row {row:?}: no {value_name}"
            );
        }
        Ok(rows)
    };
    let theirs = rows_of(&p.guest_out).map_err(|e| format!("ib_{test}: {e}"));
    let ours = rows_of(&p.host.stdout).map_err(|e| format!("softroce perf: {e}"));
    // The client prints its measurements. perftest's servers of the one-sided bandwidth tests
    // print the client's numbers, received in the results exchange; ib_read_lat's server
    // prints no row; the other servers print their own measurements.
    let (client, server) = match role {
        Role::SoftroceClient => (&ours, &theirs),
        _ => (&theirs, &ours),
    };
    let client_row = client.clone()?;
    match test {
        "write_bw" | "read_bw" | "atomic_bw" => ensure!(
            server.as_ref().ok() == Some(&client_row),
            "the server does not print the client's results: client {client_row:?}, server \
             {server:?}"
        ),
        "read_lat" => {}
        _ => {
            server.clone()?;
        }
    }
    // The row reported: the one size, or the largest of `-a`.
    let last = |rows: Vec<Vec<String>>| rows.last().cloned().unwrap_or_default();
    let (theirs, ours) = (
        last(theirs.unwrap_or_default()),
        last(ours.unwrap_or_default()),
    );
    let client_row = last(client_row);
    let sr = p
        .host
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("counters: "))
        .map(|l| parse_pairs(l.split_whitespace()))
        .ok_or("softroce printed no counters")?;
    let g = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
    // As in the pingpong scenarios: rxe accepted every packet softroce counted, and at most
    // one more per rxe packet that reached softroce after it read its counters (a re-ACK of
    // a spurious rxe retransmission).
    let late = g(&rxe, "sent_pkts").saturating_sub(g(&sr, "rx_datagrams"));
    ensure!(
        g(&rxe, "rcvd_pkts") >= g(&sr, "sent_pkts")
            && g(&rxe, "rcvd_pkts") - g(&sr, "sent_pkts") <= late,
        "rxe accepted {} packets but softroce sent {} (and at most {late} after reading its \
         counters); softroce retransmitted {} after {} timeouts, rxe counted {} duplicates; \
         drops on the way: {}",
        g(&rxe, "rcvd_pkts"),
        g(&sr, "sent_pkts"),
        g(&sr, "retransmitted_pkts"),
        g(&sr, "completer_retry_err"),
        g(&rxe, "duplicate_request"),
        path_drops(&rxe)
    );
    ensure!(
        g(&sr, "rx_datagrams") <= g(&rxe, "sent_pkts") && g(&sr, "icrc_errors") == 0,
        "softroce received {} datagrams ({} ICRC errors), rxe sent {}",
        g(&sr, "rx_datagrams"),
        g(&sr, "icrc_errors"),
        g(&rxe, "sent_pkts")
    );
    let measured = if lat {
        format!(
            "t_avg {} µs (client), rxe {} / softroce {}",
            client_row[5],
            theirs.get(5).map_or("-", String::as_str),
            ours.get(5).map_or("-", String::as_str)
        )
    } else {
        format!(
            "{} MB/s average (client), rxe prints {}, softroce {}",
            client_row[3],
            theirs.get(3).map_or("-", String::as_str),
            ours.get(3).map_or("-", String::as_str)
        )
    };
    let shape = if all {
        format!(
            "{iters} × each of {} sizes 2 B–8 MiB, at 8 MiB",
            sizes.len()
        )
    } else {
        format!("{iters} × {size} B")
    };
    Ok(format!(
        "{shape}: {measured}; softroce sent {} packets, rxe accepted {}",
        g(&sr, "sent_pkts"),
        g(&rxe, "rcvd_pkts")
    ))
}

// ------------------------------------------------- the C library (softroce exec) vs rxe

/// One rdma-core / perftest tool run through `softroce exec` on the host against the same tool
/// on rxe: the tool, its arguments on both sides (the GID index and device are added), and
/// what it prints (pingpong result lines, or perftest's table with its value column).
struct CapiTool {
    tool: &'static str,
    args: &'static str,
    size: u32,
    iters: u32,
}

fn capi_tool(name: &str) -> CapiTool {
    let (tool, args, size, iters) = match name {
        "rc" => ("ibv_rc_pingpong", "-s 4096 -n 500 -m 1024 -c", 4096, 500),
        "ud" => ("ibv_ud_pingpong", "-s 1024 -n 500 -c", 1024, 500),
        "srq" => ("ibv_srq_pingpong", "-s 4096 -n 500 -m 1024 -c", 4096, 500),
        "write_bw" => ("ib_write_bw", "-s 16384 -n 200 -m 1024 -F", 16384, 200),
        "read_bw" => ("ib_read_bw", "-s 16384 -n 200 -m 1024 -F", 16384, 200),
        "send_lat" => ("ib_send_lat", "-s 64 -n 200 -m 1024 -F", 64, 200),
        _ => ("ib_atomic_bw", "-n 200 -m 1024 -F", 8, 200),
    };
    CapiTool {
        tool,
        args,
        size,
        iters,
    }
}

/// One RoCE packet of a capture: source address, IP total length, capture time in µs, UDP
/// checksum.
/// The IPv4 RoCE datagrams (UDP 4791) of an Ethernet pcap: capture time in µs, the IPv4
/// header onwards (as captured).
fn pcap_roce_ip(path: &Path) -> Res<Vec<(u64, Vec<u8>)>> {
    let data = std::fs::read(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    ensure!(data.len() >= 24, "{}: no pcap header", path.display());
    let le = data[..4] == [0xd4, 0xc3, 0xb2, 0xa1] || data[..4] == [0x4d, 0x3c, 0xb2, 0xa1];
    let nano = data[..4] == [0x4d, 0x3c, 0xb2, 0xa1] || data[..4] == [0xa1, 0xb2, 0x3c, 0x4d];
    let u32_at = |b: &[u8]| {
        let a = [b[0], b[1], b[2], b[3]];
        if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    let mut out = Vec::new();
    let mut off = 24;
    while off + 16 <= data.len() {
        let (sec, frac, incl) = (
            u64::from(u32_at(&data[off..])),
            u64::from(u32_at(&data[off + 4..])),
            u32_at(&data[off + 8..]) as usize,
        );
        let pkt = &data[(off + 16).min(data.len())..(off + 16 + incl).min(data.len())];
        off += 16 + incl;
        if pkt.len() < 14 + 20 + 8 || pkt[12..14] != [0x08, 0x00] || pkt[23] != 17 {
            continue;
        }
        let ihl = usize::from(pkt[14] & 0x0f) * 4;
        let udp = &pkt[14 + ihl..];
        if udp.len() < 8 || u16::from_be_bytes([udp[2], udp[3]]) != 4791 {
            continue;
        }
        let t = sec * 1_000_000 + if nano { frac / 1000 } else { frac };
        out.push((t, pkt[14..].to_vec()));
    }
    Ok(out)
}

/// A RoCE packet of a tap capture, for the middleware scenarios' checks.
struct TapPacket {
    /// Capture time, µs.
    t: u64,
    /// Sent by the host (softroce), not by the guest (rxe).
    from_host: bool,
    /// The BTH opcode: its top 3 bits are 0 for RC (0x11 its ACK, 0x0c an RDMA READ
    /// request) and 3 for UD (IBTA Vol 1 9.2).
    opcode: u8,
    /// The IP total length, bytes.
    ip_len: u64,
    /// The UDP checksum as captured (0: none; softroce leaves it 0 where rxe does).
    udp_csum: u16,
    /// The BTH's destination QP and PSN.
    dqpn: u32,
    psn: u32,
    /// For a MAD to QP1: its attribute ID (a CM message: 0x10 REQ ... 0x16 DREP).
    mad_attr: Option<u16>,
}

impl TapPacket {
    /// An RC packet other than an ACK.
    fn is_rc_data(&self) -> bool {
        self.opcode >> 5 == 0 && self.opcode != 0x11
    }
}

/// The RoCE packets of the tap capture `pcap`, as [`TapPacket`]s; `host_ip` is softroce's.
fn tap_packets(host_ip: &str, pcap: &Path) -> Res<Vec<TapPacket>> {
    let host: [u8; 4] = host_ip
        .parse::<std::net::Ipv4Addr>()
        .map_err(|e| e.to_string())?
        .octets();
    Ok(pcap_roce_ip(pcap)?
        .into_iter()
        .filter_map(|(t, ip)| {
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            let dqpn = u32::from_be_bytes([0, *ip.get(ihl + 13)?, ip[ihl + 14], ip[ihl + 15]]);
            Some(TapPacket {
                t,
                from_host: ip[12..16] == host,
                opcode: *ip.get(ihl + 8)?,
                ip_len: u64::from(u16::from_be_bytes([ip[2], ip[3]])),
                udp_csum: u16::from_be_bytes([*ip.get(ihl + 6)?, *ip.get(ihl + 7)?]),
                dqpn,
                psn: u32::from_be_bytes([0, *ip.get(ihl + 17)?, ip[ihl + 18], ip[ihl + 19]]),
                // UDP 8, BTH 12, DETH 8, then the MAD header, whose attribute ID is at 16.
                mad_attr: ip
                    .get(ihl + 8 + 20 + 16..ihl + 8 + 20 + 18)
                    .filter(|_| dqpn == 1)
                    .map(|a| u16::from_be_bytes([a[0], a[1]])),
            })
        })
        .collect())
}

/// The last `n` RoCE packets of the tap capture `pcap`, one line each (time from the first
/// packet in µs, direction, BTH opcode, destination QP, PSN, IP length, and a MAD's CM
/// message name), for a failure message: a count that does not match says which packets
/// were on the wire when the tools tore down their QPs.
fn tap_tail(host_ip: &str, pcap: &Path, n: usize) -> String {
    let pkts = match tap_packets(host_ip, pcap) {
        Ok(p) => p,
        Err(e) => return format!("(no capture: {e})"),
    };
    let t0 = pkts.first().map_or(0, |p| p.t);
    let mut s = format!(
        "the capture's last {} of {} packets ({}):",
        n.min(pkts.len()),
        pkts.len(),
        pcap.display()
    );
    for p in &pkts[pkts.len().saturating_sub(n)..] {
        let _ = write!(
            s,
            "\n  +{} us {} opcode {:#04x} QP {:#x} PSN {} IP {} B{}",
            p.t - t0,
            if p.from_host {
                "softroce->rxe"
            } else {
                "rxe->softroce"
            },
            p.opcode,
            p.dqpn,
            p.psn,
            p.ip_len,
            p.mad_attr
                .map_or(String::new(), |a| format!(" MAD {}", cm_attr_name(a)))
        );
    }
    s
}

/// How many of softroce's packets in `pkts` came after rxe's last one (rxe's process may be
/// gone then: its counters cannot count them).
fn host_packets_after_rxe_last(pkts: &[TapPacket]) -> u64 {
    let rxe_last = pkts.iter().filter(|p| !p.from_host).map(|p| p.t).max();
    pkts.iter()
        .filter(|p| p.from_host && rxe_last.is_some_and(|t| p.t > t))
        .count() as u64
}

/// How many of softroce's packets in `pkts` came after rxe's last packet from the QP they
/// are for: ibv_srq_pingpong ends each side as soon as its own counts are reached and
/// destroys its 16 QPs with up to one exchange per QP still on the way, and rxe drops what
/// reaches a destroyed QP uncounted. Its protocol bounds what can be lost so: a QP sends its
/// next message only once its last one was acknowledged and the peer's next one came in, so
/// a softroce packet to rxe's QP X that precedes a packet of X on the tap was taken by a live
/// X. rxe's QP X behind softroce's QP Y is read from rxe's ACKs: an ACK to Y with PSN p
/// acknowledges softroce's request with PSN p, sent to X (the pairing most ACKs agree on).
/// A packet to a QP with no pairing counts from rxe's last packet overall
/// ([`host_packets_after_rxe_last`]), which this count never falls below.
fn host_packets_after_rxe_last_on_their_qp(pkts: &[TapPacket]) -> u64 {
    let mut sent_to: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    for p in pkts.iter().filter(|p| p.from_host && p.is_rc_data()) {
        sent_to.entry(p.psn).or_default().insert(p.dqpn);
    }
    let mut votes: BTreeMap<u32, BTreeMap<u32, u64>> = BTreeMap::new();
    let mut rxe_last_to: BTreeMap<u32, u64> = BTreeMap::new();
    for p in pkts.iter().filter(|p| !p.from_host) {
        let last = rxe_last_to.entry(p.dqpn).or_default();
        *last = (*last).max(p.t);
        if p.opcode == 0x11 {
            for &x in sent_to.get(&p.psn).into_iter().flatten() {
                *votes.entry(p.dqpn).or_default().entry(x).or_default() += 1;
            }
        }
    }
    // rxe's QP -> softroce's QP it talks to.
    let peer_of: BTreeMap<u32, u32> = votes
        .iter()
        .filter_map(|(&y, v)| v.iter().max_by_key(|&(_, n)| *n).map(|(&x, _)| (x, y)))
        .collect();
    let rxe_last = pkts.iter().filter(|p| !p.from_host).map(|p| p.t).max();
    pkts.iter()
        .filter(|p| p.from_host)
        .filter(|p| {
            let last = peer_of
                .get(&p.dqpn)
                .and_then(|y| rxe_last_to.get(y).copied())
                .or(rxe_last);
            last.is_some_and(|t| p.t > t)
        })
        .count() as u64
}

/// tcpdump on the tap, in the namespace (the host's side of the wire, where the kernel has
/// already cut softroce's GSO batches into packets).
fn host_capture(rig: &Rig, file: &Path) -> Res<HostProc> {
    host_capture_snap(rig, file, 128)
}

/// As [`host_capture`], keeping the first `snap_bytes` of each frame (a CM MAD's frame is 322).
fn host_capture_snap(rig: &Rig, file: &Path, snap_bytes: u32) -> Res<HostProc> {
    let mut p = rig.host(
        Path::new("tcpdump"),
        &[
            "-i".into(),
            "srtap0".into(),
            "-n".into(),
            "-Z".into(),
            "root".into(),
            "--immediate-mode".into(),
            "-U".into(),
            "-B".into(),
            "8192".into(),
            "-s".into(),
            snap_bytes.to_string(),
            "-w".into(),
            file.display().to_string(),
            "udp port 4791".into(),
        ],
    )?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !p.stderr().contains("listening on") {
        if let Ok(Some(st)) = p.child.try_wait() {
            return Err(format!("tcpdump exited ({st}): {}", p.stderr()));
        }
        ensure!(Instant::now() < deadline, "tcpdump did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(p)
}

/// Stops a capture (SIGINT, so it flushes) and waits for it.
fn stop_capture(p: HostProc) -> HostExit {
    std::thread::sleep(Duration::from_millis(500));
    let _ = Command::new("kill")
        .args(["-INT", &p.child.id().to_string()])
        .status();
    p.wait(Duration::from_secs(10))
}

/// Issue 15 acceptance 5: the unmodified rdma-core / perftest tool through softroce's
/// libibverbs.so.1 (`softroce exec`) on the host against the same tool on kernel rxe. Checks
/// both exit statuses, both sides' result lines (pingpong: bytes and iterations, `-c` page
/// checks; perftest: a row of the size and iterations, and the bandwidth servers print the
/// client's numbers), and, from a capture on the tap, that rxe accepted every packet
/// softroce's library sent (ibv_srq_pingpong: all but those sent to a QP after rxe's last
/// packet from it, when its tool may already have destroyed it), without a PSN gap on either
/// side.
fn capi(rig: &Rig, log: &mut String, role: Role, name: &str) -> Res<String> {
    let t = capi_tool(name);
    let perftest = t.tool.starts_with("ib_");
    let lib = softroce_bin()
        .parent()
        .map(|d| d.join("softroce-libs/libibverbs.so.1"))
        .ok_or("no target directory")?;
    ensure!(
        lib.exists(),
        "{} is missing: run `cargo build --release`",
        lib.display()
    );
    ensure!(
        Path::new("/usr/bin").join(t.tool).exists(),
        "/usr/bin/{} is missing: apt-get install ibverbs-utils perftest",
        t.tool
    );
    let gid_flag = if perftest { "-x" } else { "-g" };
    let mut args: Vec<String> = ["exec", "--ip", &rig.host_ip, "--", t.tool, gid_flag, "1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(t.args.split_whitespace().map(str::to_string));
    let mut tool = format!("{} -d $DEV {gid_flag} $GIDX {}", t.tool, t.args);
    if role == Role::SoftroceClient {
        args.push(rig.guest_ip.clone());
    } else {
        tool.push_str(" $HOST_IP");
    }
    let (p, cap, pcap, rxe) = captured_pair(rig, log, role, "capi", &softroce_bin(), &args, &tool)?;
    let g = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
    capture_complete(&cap)?;
    ensure!(
        p.guest_rc == 0,
        "{} on rxe exited {}:\n{}",
        t.tool,
        p.guest_rc,
        p.guest_out
    );
    ensure!(
        p.host.code == Some(0),
        "{} on softroce exited {:?}:\n{}{}",
        t.tool,
        p.host.code,
        p.host.stdout,
        p.host.stderr
    );
    let shape = if perftest {
        let (col, what, unit) = if t.tool.ends_with("_lat") {
            (5, "t_avg", "µs")
        } else {
            (3, "BW average", "MB/s")
        };
        let row = |out: &str| -> Res<Vec<String>> {
            let rows = result_rows(out, what)?;
            let r = rows[0].clone();
            ensure!(
                r.len() > col
                    && r[0] == t.size.to_string()
                    && r[1] == t.iters.to_string()
                    && r[col].parse::<f64>().is_ok_and(|v| v > 0.0),
                "result row {r:?}: expected {} bytes × {} with a {what}",
                t.size,
                t.iters
            );
            Ok(r)
        };
        let theirs = row(&p.guest_out).map_err(|e| format!("{} on rxe: {e}", t.tool))?;
        let ours = row(&p.host.stdout).map_err(|e| format!("{} on softroce: {e}", t.tool))?;
        let client = if role == Role::SoftroceClient {
            &ours
        } else {
            &theirs
        };
        if t.tool.ends_with("_bw") {
            ensure!(
                ours == theirs,
                "the server does not print the client's results: softroce {ours:?}, rxe \
                 {theirs:?}"
            );
        }
        format!(
            "{} × {} B: {what} {} {unit} (client)",
            t.iters, t.size, client[col]
        )
    } else {
        let (mbit, usec) = result_lines(&p.guest_out, t.size, t.iters)
            .map_err(|e| format!("{} on rxe: {e}", t.tool))?;
        result_lines(&p.host.stdout, t.size, t.iters)
            .map_err(|e| format!("{} on softroce: {e}", t.tool))?;
        for (side, out) in [("rxe", &p.guest_out), ("softroce", &p.host.stdout)] {
            ensure!(
                !out.contains("invalid data"),
                "{} -c on {side} found invalid data:\n{out}",
                t.tool
            );
        }
        format!(
            "{} × {} B, {mbit:.2} Mbit/s, {usec:.0} µs/iter (rxe's side), -c passed on both",
            t.iters, t.size
        )
    };
    let pkts = tap_packets(&rig.host_ip, &pcap)?;
    let from_softroce: Vec<&TapPacket> = pkts.iter().filter(|p| p.from_host).collect();
    let csum_zero = from_softroce.iter().filter(|p| p.udp_csum == 0).count();
    let sent = from_softroce.len() as u64;
    let rxe_sent = (pkts.len() - from_softroce.len()) as u64;
    let oversized = from_softroce.iter().filter(|p| p.ip_len > 1500).count();
    ensure!(
        oversized == 0,
        "{oversized} packets from softroce longer than the link MTU in the capture (a GSO \
         batch not cut into packets?)"
    );
    // After rxe's last packet from a QP its tool may already be destroying it (srq_pingpong
    // stops as soon as its own counts are reached): rxe drops what reaches a destroyed QP
    // uncounted.
    let after_rxe = host_packets_after_rxe_last_on_their_qp(&pkts);
    let slack = if name == "srq" { after_rxe } else { 0 };
    let rcvd = g(&rxe, "rcvd_pkts");
    ensure!(
        sent > 0 && rcvd <= sent && sent - rcvd <= slack,
        "rxe accepted {rcvd} packets, softroce's library sent {sent} (the tap's capture; \
         {after_rxe} of them after rxe's last packet from the QP they were for); drops on \
         the way: {}; {}",
        path_drops(&rxe),
        tap_tail(&rig.host_ip, &pcap, 24)
    );
    ensure!(
        rxe_sent == g(&rxe, "sent_pkts"),
        "rxe counted {} packets sent, the tap carried {rxe_sent}",
        g(&rxe, "sent_pkts")
    );
    for k in ["out_of_seq_request", "rcvd_seq_err"] {
        ensure!(g(&rxe, k) == 0, "rxe {k} = {}", g(&rxe, k));
    }
    Ok(format!(
        "{shape}; softroce's library sent {sent} packets (UDP checksum 0 on {csum_zero} on the \
         tap), rxe accepted {rcvd}{}; rxe sent {rxe_sent}; rxe retransmit timeouts {}",
        if sent > rcvd {
            format!(
                " ({} sent after rxe's last packet from their QP)",
                sent - rcvd
            )
        } else {
            String::new()
        },
        g(&rxe, "completer_retry_err")
    ))
}

// ------------------------------------------------------------ UCX (softroce exec) vs rxe

/// Where UCX's TCP exchange listens (the port the suite's readiness checks watch).
const UCX_PORT: u16 = 18515;

/// One ucx_perftest run of the UCX scenarios (issue 21 item 4): the test, its message size and
/// iterations, and `UCX_TLS`.
struct UcxTest {
    test: &'static str,
    size: u32,
    iters: u32,
    tls: &'static str,
}

fn ucx_test(name: &str) -> UcxTest {
    let (test, size, iters, tls) = match name {
        "tag_bw" => ("tag_bw", 65536, PERF_ITERS, "rc_verbs,ud_verbs:aux"),
        "ud" => ("tag_lat", 8, LAT_ITERS, "ud_verbs"),
        _ => ("tag_lat", 8, LAT_ITERS, "rc_verbs,ud_verbs:aux"),
    };
    UcxTest {
        test,
        size,
        iters,
        tls,
    }
}

/// ucx_perftest's "Final:" row (`Final: iterations median average overall bw_average
/// bw_overall msgrate_average msgrate_overall`), which must report `iters` iterations and an
/// overall latency and bandwidth above 0. Only the overall figures are whole-run ones: the
/// averages are the last report interval's (seen `inf`), and 8-byte messages every few hundred
/// µs print a bandwidth of 0.00 MB/s.
fn ucx_final(out: &str, iters: u32) -> Res<Vec<f64>> {
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("Final:"))
        .ok_or("no \"Final:\" row")?;
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|w| {
            w.parse()
                .map_err(|_| format!("{line:?}: {w:?} is no number"))
        })
        .collect::<Res<_>>()?;
    ensure!(
        v.len() == 8 && v[0] == f64::from(iters) && v[3] > 0.0 && v[7] > 0.0,
        "{line:?}: expected {iters} iterations, an overall latency and message rate above 0"
    );
    Ok(v)
}

/// [`run_pair`] (host program `host_prog` with `host_args`, no ready line; `guest_body` in
/// the guest) inside a capture of the host's tap (`RUNDIR/<prefix>-<n>.pcap`), with the rxe
/// counters read before and after: the pair, the capture, its file and the counters'
/// delta (the last two logged).
fn captured_pair(
    rig: &Rig,
    log: &mut String,
    role: Role,
    prefix: &str,
    host_prog: &Path,
    host_args: &[String],
    guest_body: &str,
) -> Res<(Pair, HostExit, PathBuf, BTreeMap<String, u64>)> {
    let pcap = rig.run.join(format!(
        "{prefix}-{}.pcap",
        rig.seq.fetch_add(1, Ordering::Relaxed)
    ));
    let before = rig.rxe_counters()?;
    let cap = host_capture(rig, &pcap)?;
    let p = run_pair(rig, log, role, host_prog, host_args, "", guest_body);
    let cap = stop_capture(cap);
    let p = p?;
    let after = rig.rxe_counters()?;
    let rxe = delta(&before, &after);
    let _ = writeln!(
        log,
        "## rxe counters (delta): {rxe:?}\n## tcpdump: {}",
        cap.stderr
    );
    Ok((p, cap, pcap, rxe))
}

/// tcpdump's closing statistics on stderr: every packet its filter took is in the file.
fn capture_complete(cap: &HostExit) -> Res<()> {
    let stat = |what: &str| {
        cap.stderr.lines().find_map(|l| {
            l.strip_suffix(what)
                .and_then(|n| n.trim().parse::<u64>().ok())
        })
    };
    let (captured, filtered, dropped) = (
        stat(" packets captured"),
        stat(" packets received by filter"),
        stat(" packets dropped by kernel"),
    );
    ensure!(
        captured.is_some() && captured == filtered && dropped == Some(0),
        "the tap's capture is incomplete: {}",
        cap.stderr
    );
    Ok(())
}

/// Issue 21 item 4: Debian's ucx_perftest (UCX 1.13) through `softroce exec` on the host
/// against ucx_perftest on kernel rxe in the guest, over `rc_verbs` (UD for the wire-up) or
/// `ud_verbs` alone. Both sides set `UCX_UD_VERBS_ETH_DGID_CHECK=n`: UCX reads a received
/// packet's IP version from `wc.sl`, which rxe and softroce both leave 0. Checks both exit
/// statuses, the client's "Final:" row (every iteration ran), and in a capture on the tap that
/// the data went over RoCE (RC or UD packets from softroce, at least one per iteration; the RC
/// payload at least the iterations' bytes) and that rxe accepted every packet softroce sent
/// but those sent after rxe's last one (UCX's disconnect, when rxe's process may be gone).
fn ucx(rig: &Rig, log: &mut String, role: Role, name: &str) -> Res<String> {
    let t = ucx_test(name);
    ensure!(
        Path::new("/usr/bin/ucx_perftest").exists(),
        "/usr/bin/ucx_perftest is missing: apt-get install ucx-utils"
    );
    let env = |dev: &str| {
        vec![
            format!("UCX_TLS={}", t.tls),
            format!("UCX_NET_DEVICES={dev}:1"),
            "UCX_UD_VERBS_ETH_DGID_CHECK=n".to_string(),
        ]
    };
    let mut args = env("softroce0");
    args.extend(
        [
            softroce_bin().display().to_string().as_str(),
            "exec",
            "--ip",
            &rig.host_ip,
            "--",
            "ucx_perftest",
            "-p",
            &UCX_PORT.to_string(),
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    let client = format!("-t {} -s {} -n {}", t.test, t.size, t.iters);
    let mut tool = format!("{} ucx_perftest -p {UCX_PORT}", env("$DEV").join(" "));
    if role == Role::SoftroceClient {
        args.extend(client.split_whitespace().map(str::to_string));
        args.push(rig.guest_ip.clone());
    } else {
        tool.push_str(&format!(" {client} $HOST_IP"));
    }
    let (p, cap, pcap, rxe) = captured_pair(rig, log, role, "ucx", Path::new("env"), &args, &tool)?;
    let g = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
    capture_complete(&cap)?;
    ensure!(
        p.guest_rc == 0,
        "ucx_perftest on rxe exited {}:\n{}",
        p.guest_rc,
        p.guest_out
    );
    ensure!(
        p.host.code == Some(0),
        "ucx_perftest on softroce exited {:?}:\n{}{}",
        p.host.code,
        p.host.stdout,
        p.host.stderr
    );
    let client_out = if role == Role::SoftroceClient {
        &p.host.stdout
    } else {
        &p.guest_out
    };
    let fin = ucx_final(client_out, t.iters).map_err(|e| format!("the client: {e}"))?;
    let shape = if t.test.ends_with("_lat") {
        format!(
            "{} × {} B over {}: latency median {:.2} µs, overall {:.2} µs (client)",
            t.iters, t.size, t.tls, fin[1], fin[3]
        )
    } else {
        format!(
            "{} × {} B over {}: {:.2} MB/s, {:.0} msg/s overall (client)",
            t.iters, t.size, t.tls, fin[5], fin[7]
        )
    };
    let pkts = tap_packets(&rig.host_ip, &pcap)?;
    let from_softroce = pkts.iter().filter(|p| p.from_host).count() as u64;
    let rxe_sent = pkts.len() as u64 - from_softroce;
    let sr_rc = pkts
        .iter()
        .filter(|p| p.from_host && p.is_rc_data())
        .count() as u64;
    let sr_rc_acks = pkts
        .iter()
        .filter(|p| p.from_host && p.opcode == 0x11)
        .count() as u64;
    let sr_ud = pkts
        .iter()
        .filter(|p| p.from_host && p.opcode >> 5 == 3)
        .count() as u64;
    let rc_all = pkts.iter().filter(|p| p.is_rc_data()).count() as u64;
    let rc_bytes = pkts
        .iter()
        .filter(|p| p.is_rc_data())
        .map(|p| p.ip_len)
        .sum::<u64>();
    let iters = u64::from(t.iters);
    if t.tls.starts_with("rc_") {
        // tag_lat is a ping-pong: each side sends a message an iteration. In tag_bw the
        // client sends; the server's RC QP answers with ACKs (and UCX's credit grants).
        let sr_min = if t.test.ends_with("_lat") { iters } else { 1 };
        ensure!(
            sr_rc + sr_rc_acks >= sr_min
                && rc_all >= iters
                && rc_bytes >= iters * u64::from(t.size),
            "the data did not go over RC: {rc_all} RC packets (not ACKs) on the tap, {rc_bytes} \
             bytes with their headers, softroce's {sr_rc} and {sr_rc_acks} ACKs, for {iters} \
             iterations of {} B",
            t.size
        );
    } else {
        ensure!(
            sr_ud >= iters && pkts.iter().all(|p| p.opcode >> 5 == 3),
            "the data did not go over UD alone: softroce sent {sr_ud} UD packets for {iters} \
             iterations, the tap carried {} others",
            pkts.iter().filter(|p| p.opcode >> 5 != 3).count()
        );
    }
    let after_rxe = host_packets_after_rxe_last(&pkts);
    let rcvd = g(&rxe, "rcvd_pkts");
    ensure!(
        from_softroce > 0 && rcvd <= from_softroce && from_softroce - rcvd <= after_rxe,
        "rxe accepted {rcvd} packets, softroce sent {from_softroce} (the tap's capture; \
         {after_rxe} of them after rxe's last packet); drops on the way: {}; {}",
        path_drops(&rxe),
        tap_tail(&rig.host_ip, &pcap, 24)
    );
    ensure!(
        rxe_sent == g(&rxe, "sent_pkts"),
        "rxe counted {} packets sent, the tap carried {rxe_sent}",
        g(&rxe, "sent_pkts")
    );
    Ok(format!(
        "{shape}; softroce sent {from_softroce} packets ({sr_rc} RC requests, {sr_rc_acks} RC \
         ACKs, {sr_ud} UD), rxe accepted {rcvd}{}; rxe sent {rxe_sent}; rxe retransmit timeouts {}",
        if from_softroce > rcvd {
            format!(" ({} sent after rxe's last packet)", from_softroce - rcvd)
        } else {
            String::new()
        },
        g(&rxe, "completer_retry_err")
    ))
}

// ------------------------------------------------------ Open MPI (softroce exec) vs rxe

/// The MPI ping-pong's message sizes and iterations (`SIZE:ITERS`, tests/c/mpi_pingpong.c),
/// and whether UCX sends the size by rendezvous: 8 B and 4 KiB go eagerly (RC SENDs), 256 KiB
/// is above UCX's rendezvous threshold (UCX 1.13 on rc_verbs: the receiver RDMA READs the
/// sender's buffer).
const MPI_SIZES: [(u32, u32, bool); 3] = [(8, 200, false), (4096, 100, false), (262_144, 20, true)];

/// tests/c/mpi_pingpong.c, compiled on the host with mpicc into the share's `cm-bin`.
fn mpi_program(rig: &Rig) -> Res<PathBuf> {
    let dir = rig.run.join("cm-bin");
    let exe = dir.join("mpi_pingpong");
    if exe.exists() {
        return Ok(exe);
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/mpi_pingpong.c");
    let out = Command::new("mpicc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .map_err(|e| format!("mpicc: {e} (apt-get install libopenmpi-dev)"))?;
    ensure!(
        out.status.success(),
        "mpicc {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(exe)
}

/// Writes mpirun's `plm_rsh_agent` for one MPI run, `RUNDIR/mpi-rsh-<job>`, and returns its
/// path. mpirun calls it as `AGENT HOST COMMAND...` (as it would call ssh) to start its daemon
/// (orted) on HOST, the guest: it writes COMMAND, shell text as ssh hands it to the remote
/// shell, as the guest job `job` (the rig's job channel, `RUNDIR/jobs`), waits for the job's
/// exit status, prints its output and exits with its status. The job first links the host's
/// path of the run directory to `/share`, so that the program's host path is its path in the
/// guest too. The agent gives up when mpirun, its parent, is gone. mpirun runs with
/// `--leave-session-attached`, so that orted stays in the job (without it, mpirun's
/// `plm_rsh_no_tree_spawn` tells orted to daemonize).
fn mpi_rsh_agent(rig: &Rig, job: &str) -> Res<PathBuf> {
    let run = rig.run.display().to_string();
    let parent = rig.run.parent().ok_or("the run directory has no parent")?;
    let agent = rig.run.join(format!("mpi-rsh-{job}"));
    let text = format!(
        "#!/bin/sh\n\
         # mpirun's plm_rsh_agent for the MPI scenario of tests/interop_rxe.rs: AGENT HOST COMMAND...\n\
         # runs COMMAND in the rig's guest as job {job} and exits with its status.\n\
         shift\n\
         jobs='{run}/jobs'\n\
         {{\n\
         \x20 echo \"mkdir -p '{parent}' && ln -sfn /share '{run}'\"\n\
         \x20 printf '%s\\n' \"$*\"\n\
         }} > \"$jobs/{job}.tmp\" && mv \"$jobs/{job}.tmp\" \"$jobs/{job}.sh\" || exit 255\n\
         while [ ! -e \"$jobs/{job}.rc\" ]; do\n\
         \x20 kill -0 \"$PPID\" 2>/dev/null || exit 255\n\
         \x20 sleep 0.05\n\
         done\n\
         cat \"$jobs/{job}.out\"\n\
         exit \"$(cat \"$jobs/{job}.rc\")\"\n",
        parent = parent.display()
    );
    std::fs::write(&agent, text).map_err(|e| format!("write {}: {e}", agent.display()))?;
    let chmod = Command::new("chmod")
        .arg("0755")
        .arg(&agent)
        .status()
        .map_err(|e| format!("chmod: {e}"))?;
    ensure!(chmod.success(), "chmod {} failed", agent.display());
    Ok(agent)
}

/// Issue 21 item 4: an MPI job across softroce and kernel rxe. Open MPI 4.1 (`--mca pml ucx
/// --mca btl self`, UCX 1.13 over `UCX_TLS=rc_verbs,ud_verbs:aux,self`) runs
/// tests/c/mpi_pingpong.c as two ranks, one on the host through `softroce exec` (mpirun
/// itself runs under it, so its local rank sees softroce0) and one on rxe in the guest, whose
/// orted mpirun starts through [`mpi_rsh_agent`] and reaches over the tap
/// (`oob_tcp_if_include`). `UCX_NET_DEVICES` is each rank's own (`-x` per application context:
/// softroce0:1, rxe0:1), and both set `UCX_UD_VERBS_ETH_DGID_CHECK=n` (see [`ucx`]).
/// `SoftroceClient`: softroce holds rank 0, which sends each ping; `SoftroceServer`: rank 1,
/// which checks each ping and answers it. Checks mpirun's and orted's exit statuses, where each
/// rank ran, the program's `ok` line for every size (both ranks check every byte they
/// receive), and in a capture on the tap that RC data went both ways with at least the
/// messages' bytes, that the 256 KiB messages went by rendezvous (RDMA READs from both sides),
/// and that rxe accepted every packet softroce sent but those after rxe's last one (rxe's
/// counters also count the packets its rank's UCX sends itself: `sent_pkts` beyond the tap's).
fn mpi(rig: &Rig, log: &mut String, role: Role) -> Res<String> {
    for (tool, pkg) in [("mpirun", "openmpi-bin"), ("mpicc", "libopenmpi-dev")] {
        ensure!(
            Path::new("/usr/bin").join(tool).exists(),
            "/usr/bin/{tool} is missing: apt-get install {pkg}"
        );
    }
    let exe = mpi_program(rig)?.display().to_string();
    let job = format!("{:03}-orted", rig.seq.fetch_add(1, Ordering::Relaxed));
    let agent = mpi_rsh_agent(rig, &job)?;
    let app = |host: &str, dev: &str| -> Vec<String> {
        let mut a: Vec<String> = [
            "-np",
            "1",
            "--host",
            host,
            "-x",
            "UCX_TLS=rc_verbs,ud_verbs:aux,self",
            "-x",
            "UCX_UD_VERBS_ETH_DGID_CHECK=n",
            "-x",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.push(format!("UCX_NET_DEVICES={dev}:1"));
        a.push(exe.clone());
        a.extend(MPI_SIZES.iter().map(|(s, n, _)| format!("{s}:{n}")));
        a
    };
    let softroce_app = app(&rig.host_ip, "softroce0");
    let rxe_app = app(&rig.guest_ip, "rxe0");
    let (first, second) = if role == Role::SoftroceClient {
        (softroce_app, rxe_app)
    } else {
        (rxe_app, softroce_app)
    };
    let mut args: Vec<String> = [
        "exec",
        "--ip",
        &rig.host_ip,
        "--",
        "mpirun",
        "--allow-run-as-root",
        "--leave-session-attached",
        "--mca",
        "plm_rsh_agent",
        &agent.display().to_string(),
        "--mca",
        "plm_rsh_no_tree_spawn",
        "1",
        "--mca",
        "oob_tcp_if_include",
        &rig.subnet()?,
        "--mca",
        "pml",
        "ucx",
        "--mca",
        "btl",
        "self",
        "--bind-to",
        "none",
        "-wdir",
        "/tmp",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(first);
    args.push(":".into());
    args.extend(second);
    let _ = writeln!(
        log,
        "## host: {} {}",
        softroce_bin().display(),
        args.join(" ")
    );

    let pcap = rig.run.join(format!("mpi-{job}.pcap"));
    let before = rig.rxe_counters()?;
    let cap = host_capture(rig, &pcap)?;
    let host = match rig.host(&softroce_bin(), &args) {
        Ok(p) => p.wait_launcher(TOOL_TIMEOUT, Duration::from_secs(20)),
        Err(e) => {
            let _ = stop_capture(cap);
            return Err(e);
        }
    };
    let guest_job = GuestJob {
        dir: rig.run.join("jobs"),
        id: job.clone(),
    };
    // orted leaves once mpirun told it to, or once mpirun is gone.
    let guest = if guest_job.dir.join(format!("{job}.sh")).exists() {
        Some(guest_job.wait(rig, Duration::from_secs(30)))
    } else {
        None
    };
    let cap = stop_capture(cap);
    let after = rig.rxe_counters()?;
    let rxe = delta(&before, &after);
    let orted = match &guest {
        None => "never started".to_string(),
        Some(Ok((rc, out))) => format!("exit {rc}, output:\n{out}"),
        Some(Err(e)) => e.clone(),
    };
    let _ = writeln!(
        log,
        "## mpirun exit: {:?}\n## mpirun stdout:\n{}\n## mpirun stderr:\n{}\n## orted in \
         the guest: {orted}\n## rxe counters (delta): {rxe:?}\n## tcpdump: {}",
        host.code, host.stdout, host.stderr, cap.stderr
    );
    let g = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
    ensure!(
        host.code == Some(0),
        "mpirun exited {:?} (None: stopped after {TOOL_TIMEOUT:?}):\n{}{}",
        host.code,
        host.stdout,
        host.stderr
    );
    let (guest_rc, guest_out) = guest.ok_or("mpirun never started its daemon in the guest")??;
    ensure!(
        guest_rc == 0,
        "orted in the guest exited {guest_rc}:\n{guest_out}"
    );
    capture_complete(&cap)?;

    // Where each rank ran: rxe's in the guest, softroce's on this host.
    let here = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_err(|e| format!("hostname: {e}"))?;
    let sr_rank = if role == Role::SoftroceClient { 0 } else { 1 };
    for rank in [0, 1] {
        let head = format!("mpi_pingpong: rank {rank} of 2 on ");
        let on = host
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix(&head))
            .ok_or_else(|| format!("no {head:?} line:\n{}", host.stdout))?;
        ensure!(
            (on == here.trim()) == (rank == sr_rank),
            "rank {rank} ran on {on:?}, expected {} (this host is {:?})",
            if rank == sr_rank {
                "this host"
            } else {
                "the guest"
            },
            here.trim()
        );
    }
    let mut rtts = Vec::new();
    for (size, iters, _) in MPI_SIZES {
        let head = format!("mpi_pingpong: ok {size} B x {iters}, round trip avg ");
        let us = host
            .stdout
            .lines()
            .find_map(|l| {
                l.strip_prefix(&head)?
                    .strip_suffix(" us")?
                    .parse::<f64>()
                    .ok()
            })
            .ok_or_else(|| format!("no {head:?} line:\n{}", host.stdout))?;
        rtts.push(format!("{size} B × {iters} {us:.0} µs"));
    }

    let pkts = tap_packets(&rig.host_ip, &pcap)?;
    let payload: u64 = MPI_SIZES
        .iter()
        .map(|(s, n, _)| u64::from(*s) * u64::from(*n))
        .sum();
    let rndv: u64 = MPI_SIZES
        .iter()
        .filter(|(_, _, r)| *r)
        .map(|(_, n, _)| u64::from(*n))
        .sum();
    let mut per_side = Vec::new();
    for (side, mine) in [("softroce", true), ("rxe", false)] {
        let rc: Vec<&TapPacket> = pkts
            .iter()
            .filter(|p| p.from_host == mine && p.is_rc_data())
            .collect();
        let bytes: u64 = rc.iter().map(|p| p.ip_len).sum();
        let reads = rc.iter().filter(|p| p.opcode == 0x0c).count() as u64;
        ensure!(
            bytes >= payload,
            "{side} sent {} RC packets (not ACKs) of {bytes} bytes with their headers; its \
             rank sent {payload} bytes of messages",
            rc.len()
        );
        ensure!(
            reads >= rndv,
            "{side} sent {reads} RDMA READ requests for the {rndv} rendezvous messages its rank \
             received"
        );
        per_side.push((rc.len(), reads));
    }
    let from_softroce = pkts.iter().filter(|p| p.from_host).count() as u64;
    let rxe_sent = pkts.len() as u64 - from_softroce;
    let sr_acks = pkts
        .iter()
        .filter(|p| p.from_host && p.opcode == 0x11)
        .count();
    let sr_ud = pkts
        .iter()
        .filter(|p| p.from_host && p.opcode >> 5 == 3)
        .count();
    let after_rxe = host_packets_after_rxe_last(&pkts);
    // The rank's UCX connects to itself too (MPI_Init of a lone rank on rxe: 5 packets sent
    // and received): rxe hands those packets to itself (rxe_loopback), they never reach the
    // wire, and both counters count them.
    let loopback = g(&rxe, "sent_pkts").checked_sub(rxe_sent).ok_or_else(|| {
        format!(
            "rxe counted {} packets sent, the tap carried {rxe_sent}",
            g(&rxe, "sent_pkts")
        )
    })?;
    let rcvd = g(&rxe, "rcvd_pkts").saturating_sub(loopback);
    ensure!(
        from_softroce > 0
            && g(&rxe, "rcvd_pkts") >= loopback
            && rcvd <= from_softroce
            && from_softroce - rcvd <= after_rxe,
        "rxe accepted {} packets, {loopback} of them its own (sent_pkts {} less the {rxe_sent} \
         on the tap); softroce sent {from_softroce} (the tap's capture; {after_rxe} of them \
         after rxe's last packet); drops on the way: {}",
        g(&rxe, "rcvd_pkts"),
        g(&rxe, "sent_pkts"),
        path_drops(&rxe)
    );
    Ok(format!(
        "rank {sr_rank} on softroce, rank {} on rxe; ok for {} (round trip avg); softroce sent \
         {from_softroce} packets ({} RC requests and responses, {} of them RDMA READ requests, \
         {sr_acks} RC ACKs, {sr_ud} UD), rxe accepted {rcvd}{}; rxe sent {rxe_sent} ({} RC \
         requests and responses, {} RDMA READ requests) and {loopback} to itself (its rank's \
         UCX loopback); rxe retransmit timeouts {}",
        1 - sr_rank,
        rtts.join(", "),
        per_side[0].0,
        per_side[0].1,
        if from_softroce > rcvd {
            format!(" ({} sent after rxe's last packet)", from_softroce - rcvd)
        } else {
            String::new()
        },
        per_side[1].0,
        per_side[1].1,
        g(&rxe, "completer_retry_err")
    ))
}

/// perftest's result rows: the lines after the header that starts with `#bytes` and names
/// `column`, up to the table's closing rule, each split at white space.
fn result_rows(out: &str, column: &str) -> Res<Vec<Vec<String>>> {
    let mut lines = out.lines();
    lines
        .find(|l| l.trim_start().starts_with("#bytes") && l.contains(column))
        .ok_or("no result table")?;
    let rows: Vec<Vec<String>> = lines
        .take_while(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect();
    ensure!(!rows.is_empty(), "no result row");
    Ok(rows)
}

/// `ibv_rc_pingpong` between two rxe devices in the guest, 4096 B: rxe's own retry behaviour.
/// (`srq`: `ibv_srq_pingpong`, 16 QPs on one SRQ per side, whose `-c` check must pass too.)
fn control(rig: &Rig, log: &mut String, qp: &str) -> Res<String> {
    let iters = PINGPONG_ITERS;
    let body = format!(
        "rxe_pair_up || exit 96\nGA=$(gid_index rxea 10.77.0.1) && GB=$(gid_index rxeb 10.77.0.2) || exit 95\n\
         echo before: $(counters rxea | grep -E 'completer_retry_err|duplicate_request')\n\
         ibv_{qp}_pingpong -d rxea -g $GA -s 4096 -n {iters} -c > /tmp/ctl-srv.out 2>&1 &\n\
         wait_listen 18515 || exit 94\n\
         ibv_{qp}_pingpong -d rxeb -g $GB -s 4096 -n {iters} -c 10.77.0.1; rc=$?\n\
         wait $! || rc=1\necho '--- server:'; cat /tmp/ctl-srv.out\n\
         echo after: $(counters rxea | grep -E 'completer_retry_err|duplicate_request') $(counters rxeb | grep -E 'completer_retry_err|duplicate_request')\n\
         exit $rc"
    );
    let _ = writeln!(log, "## guest:\n{body}");
    let (rc, out) = rig.guest_run("control", &body, TOOL_TIMEOUT)?;
    let _ = writeln!(log, "## guest exit {rc}:\n{out}");
    ensure!(rc == 0, "rxe ↔ rxe pingpong failed ({rc}):\n{out}");
    ensure!(
        !out.contains("invalid data"),
        "ibv_{qp}_pingpong -c found invalid data:\n{out}"
    );
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
        "{iters} × 4096 B, {mbit:.2} Mbit/s, {usec:.0} µs/iter, -c passed; rxe retransmit \
         timeouts (both devices, since boot) {retries}"
    ))
}

// ------------------------------------------- rdma_cm (softroce's librdmacm) vs rxe's rdma_cm

/// UDP source port of every QP1 datagram, rxe's (the hash of QPN 1) and softroce's
/// (docs/wire-facts.md §2.1).
const QP1_UDP_SPORT: u16 = 0xd872;
/// The GSI Q_Key QP1 datagrams carry in their DETH.
const GSI_QKEY: u32 = 0x8001_0000;
/// A port nobody listens on, for the REJ scenario.
const CM_NO_LISTENER_PORT: u16 = 9999;
/// How long the guest delays the CM MADs it receives when perftest's `-R` server runs there
/// (lib.sh `mad_delay`: perftest 4.5's client connects right after its handshake, before the
/// server's rdma_listen).
const PERFTEST_MAD_DELAY_MS: u32 = 100;

/// The C programs of the rdma_cm scenarios, compiled on the host into the share (the guest
/// runs the same binaries: both are Debian 12 with rdma-core 44): the seed's rdma_server and
/// rdma_client (with the seed's own command) and tests/c/cm_reject.c.
fn cm_programs(rig: &Rig) -> Res<PathBuf> {
    let dir = rig.run.join("cm-bin");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for (name, src) in [
        ("rdma_server", "tests/c/seed/rdma_server.c"),
        ("rdma_client", "tests/c/seed/rdma_client.c"),
        ("cm_reject", "tests/c/cm_reject.c"),
    ] {
        if dir.join(name).exists() {
            continue;
        }
        let out = Command::new("gcc")
            .arg("-o")
            .arg(dir.join(name))
            .arg(root.join(src))
            .args(["-lrdmacm", "-libverbs"])
            .output()
            .map_err(|e| format!("gcc: {e} (apt-get install gcc libc6-dev librdmacm-dev)"))?;
        ensure!(
            out.status.success(),
            "gcc {src} failed (apt-get install gcc libc6-dev librdmacm-dev):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(dir)
}

/// One QP1 datagram of a capture, as both sides' checks need it.
struct CapMad {
    /// IPv4 source address.
    src: [u8; 4],
    /// UDP source port.
    sport: u16,
    /// BTH P_Key.
    pkey: u16,
    /// DETH Q_Key.
    qkey: u32,
    /// The MAD's attribute ID (REQ 0x10, REJ 0x12, REP 0x13, RTU 0x14, DREQ 0x15, DREP 0x16,
    /// SIDR_REQ 0x17, SIDR_REP 0x18).
    attr: u16,
    /// REJ: the reason; SIDR_REP: the status; else 0.
    code: u16,
}

/// The datagrams to QP1 in a tap capture (frames cut shorter than a MAD header are skipped;
/// the capture keeps 400 bytes of each).
fn pcap_mads(path: &Path) -> Res<Vec<CapMad>> {
    let mut out = Vec::new();
    for (_, ip) in pcap_roce_ip(path)? {
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        let Some(udp) = ip.get(ihl..) else { continue };
        // UDP 8, BTH 12, DETH 8, then the MAD: header 24, message from 24.
        let Some(b) = udp.get(..8 + 20 + 24 + 8) else {
            continue;
        };
        let (bth, deth, mad) = (&b[8..20], &b[20..28], &b[28..]);
        if u32::from_be_bytes([0, bth[5], bth[6], bth[7]]) != 1 {
            continue;
        }
        let attr = u16::from_be_bytes([mad[16], mad[17]]);
        let code = match attr {
            // REJ reason: message offset 10; SIDR_REP status: message offset 4.
            0x12 => udp
                .get(28 + 24 + 10..28 + 24 + 12)
                .map_or(0, |r| u16::from_be_bytes([r[0], r[1]])),
            0x18 => u16::from(mad[24 + 4]),
            _ => 0,
        };
        out.push(CapMad {
            src: [ip[12], ip[13], ip[14], ip[15]],
            sport: u16::from_be_bytes([udp[0], udp[1]]),
            pkey: u16::from_be_bytes([bth[2], bth[3]]),
            qkey: u32::from_be_bytes([deth[0], deth[1], deth[2], deth[3]]),
            attr,
            code,
        });
    }
    Ok(out)
}

fn cm_attr_name(attr: u16) -> String {
    match attr {
        0x10 => "REQ".into(),
        0x11 => "MRA".into(),
        0x12 => "REJ".into(),
        0x13 => "REP".into(),
        0x14 => "RTU".into(),
        0x15 => "DREQ".into(),
        0x16 => "DREP".into(),
        0x17 => "SIDR_REQ".into(),
        0x18 => "SIDR_REP".into(),
        a => format!("attr {a:#06x}"),
    }
}

/// "REQ RTU DREQ" for the MADs of one side, in capture order, with REJ reasons and SIDR_REP
/// statuses.
fn mad_list(mads: &[&CapMad]) -> String {
    mads.iter()
        .map(|m| match m.attr {
            0x12 => format!("REJ({})", m.code),
            0x18 => format!("SIDR_REP({})", m.code),
            a => cm_attr_name(a),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Checks the QP1 datagrams of both sides in a capture (UDP source port 0xd872, P_Key 0xffff,
/// GSI Q_Key, as rxe's) and returns softroce's and rxe's MAD lists.
fn check_mads(rig: &Rig, pcap: &Path) -> Res<(String, String)> {
    let host: [u8; 4] = rig
        .host_ip
        .parse::<std::net::Ipv4Addr>()
        .map_err(|e| e.to_string())?
        .octets();
    let all = pcap_mads(pcap)?;
    for m in &all {
        let who = if m.src == host { "softroce" } else { "rxe" };
        ensure!(
            m.sport == QP1_UDP_SPORT && m.pkey == 0xffff && m.qkey == GSI_QKEY,
            "a {} from {who}: UDP source port {:#06x}, P_Key {:#06x}, Q_Key {:#010x} (rxe's: \
             0xd872, 0xffff, 0x80010000)",
            cm_attr_name(m.attr),
            m.sport,
            m.pkey,
            m.qkey
        );
    }
    let ours: Vec<&CapMad> = all.iter().filter(|m| m.src == host).collect();
    let theirs: Vec<&CapMad> = all.iter().filter(|m| m.src != host).collect();
    Ok((mad_list(&ours), mad_list(&theirs)))
}

/// What one rdma_cm tool scenario runs: the server's and the client's command lines, with
/// `{dev}`, `{self}` (the side's own address), `{server}` and `{bin}` (the compiled programs)
/// to fill in, the port its server listens on, and the lines both sides must print.
struct CmTool {
    server: &'static str,
    client: &'static str,
    port: u16,
}

fn cm_tool_shape(name: &str) -> CmTool {
    let (server, client, port) = match name {
        "rping" => (
            "rping -s -a {self} -C 10 -v",
            "rping -c -a {server} -C 10 -v -V",
            7174,
        ),
        "ucmatose" => ("ucmatose", "ucmatose -s {server}", 7471),
        "udaddy" => ("udaddy", "udaddy -s {server}", 7174),
        "send_bw" => (
            "ib_send_bw -R -d {dev} -n 200 -s 16384 -F",
            "ib_send_bw -R -d {dev} -n 200 -s 16384 -F {server}",
            18515,
        ),
        _ => (
            "{bin}/rdma_server 7472",
            "{bin}/rdma_client {server} 7472",
            7472,
        ),
    };
    CmTool {
        server,
        client,
        port,
    }
}

/// Waits until softroce's device on the host owns UDP 4791 in the namespace (the server
/// process opened it), then a moment for its rdma_listen, as tests/cm_tools.rs does.
fn wait_softroce_device(rig: &Rig, p: &mut HostProc) -> Res<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ss = Command::new("ip")
            .args(["netns", "exec", &rig.netns, "ss", "-Huln", "sport = :4791"])
            .output()
            .map_err(|e| format!("ss: {e}"))?;
        if !String::from_utf8_lossy(&ss.stdout).trim().is_empty() {
            std::thread::sleep(Duration::from_millis(300));
            return Ok(());
        }
        if let Ok(Some(st)) = p.child.try_wait() {
            std::thread::sleep(Duration::from_millis(50));
            return Err(format!(
                "`{}` exited ({st}) before opening its device:\n{}{}",
                p.cmd,
                p.stdout(),
                p.stderr()
            ));
        }
        ensure!(
            Instant::now() < deadline,
            "`{}` opened no device in 30 s",
            p.cmd
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue 16 acceptance 3: an rdma_cm tool through softroce's librdmacm.so.1 (`softroce exec`)
/// on the host against the same tool on rxe's rdma_cm in the guest, as server and as client.
/// Checks both exit statuses and result lines, the CM MADs on the tap (each side's list;
/// QP1's UDP source port, P_Key and Q_Key; no REJ), and that rxe accepted every packet
/// softroce sent (its `rcvd_pkts` against the tap's count).
fn cm_tool(rig: &Rig, log: &mut String, role: Role, name: &str) -> Res<String> {
    let t = cm_tool_shape(name);
    let bin = cm_programs(rig)?;
    let (host_cmd, guest_cmd) = match role {
        Role::SoftroceServer => (t.server, t.client),
        _ => (t.client, t.server),
    };
    let fill = |cmd: &str, host: bool| -> String {
        let (dev, me, server, b) = if host {
            (
                "softroce0".to_string(),
                rig.host_ip.clone(),
                rig.guest_ip.clone(),
                bin.display().to_string(),
            )
        } else {
            (
                "$DEV".to_string(),
                "$GUEST_IP".to_string(),
                "$HOST_IP".to_string(),
                "/share/cm-bin".to_string(),
            )
        };
        cmd.replace("{dev}", &dev)
            .replace("{self}", &me)
            .replace("{server}", &server)
            .replace("{bin}", &b)
    };
    let mut args: Vec<String> = ["exec", "--ip", &rig.host_ip, "--"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(fill(host_cmd, true).split_whitespace().map(str::to_string));
    let tool = fill(guest_cmd, false);
    let delay = name == "send_bw" && role == Role::SoftroceClient;
    let body = if delay {
        format!(
            "mad_delay {PERFTEST_MAD_DELAY_MS} || {{ mad_delay_off; exit 97; }}\ntimeout 60 {tool}"
        )
    } else {
        format!("timeout 60 {tool}")
    };
    let _ = writeln!(
        log,
        "## host: softroce {}\n## guest:\n{body}",
        args.join(" ")
    );
    let pcap = rig.run.join(format!(
        "cm-{}.pcap",
        rig.seq.fetch_add(1, Ordering::Relaxed)
    ));
    let before = rig.rxe_counters()?;
    let cap = host_capture_snap(rig, &pcap, 400)?;
    let run = (|| -> Res<(HostExit, i32, String)> {
        let pids = rig.netns_pids()?;
        if role == Role::SoftroceServer {
            let mut host = rig.host(&softroce_bin(), &args)?;
            if let Err(e) = wait_softroce_device(rig, &mut host) {
                let _ = host.wait(Duration::ZERO);
                return Err(e);
            }
            let guest = rig.guest_run("cm-client", &body, TOOL_TIMEOUT);
            let host = host.wait(if guest.is_ok() {
                Duration::from_secs(30)
            } else {
                Duration::ZERO
            });
            rig.wait_netns_done(&pids, Duration::from_secs(10))?;
            let (rc, out) = guest?;
            Ok((host, rc, out))
        } else {
            let job = rig.guest("cm-server", &body)?;
            let (rc, out) = rig.guest_run(
                "wait-cm-listen",
                &format!("wait_cm_listen {}", t.port),
                TOOL_TIMEOUT,
            )?;
            if rc != 0 {
                let r = job.wait(rig, Duration::from_secs(5));
                return Err(format!(
                    "the server in the guest did not listen: {out} {r:?}"
                ));
            }
            let host = rig
                .host(&softroce_bin(), &args)?
                .wait(Duration::from_secs(60));
            let _ = writeln!(
                log,
                "## host exit: {:?}\n## host stdout:\n{}\n## host stderr:\n{}",
                host.code, host.stdout, host.stderr
            );
            // The guest keeps delaying MADs until the program's stand-in has sent its last
            // one: a packet still in netem's queue when the delay goes is lost to rxe.
            rig.wait_netns_done(&pids, Duration::from_secs(10))?;
            let (rc, out) = job.wait(
                rig,
                if host.code == Some(0) {
                    TOOL_TIMEOUT
                } else {
                    Duration::from_secs(5)
                },
            )?;
            Ok((host, rc, out))
        }
    })();
    let undelay = if delay {
        rig.guest_run("mad-delay-off", "mad_delay_off", Duration::from_secs(30))
            .map(|_| ())
    } else {
        Ok(())
    };
    let cap = stop_capture(cap);
    let (host, guest_rc, guest_out) = run?;
    undelay.map_err(|e| format!("removing the MAD delay: {e}"))?;
    let _ = writeln!(
        log,
        "## host exit: {:?}\n## host stdout:\n{}\n## host stderr:\n{}\n## guest exit: \
         {guest_rc}\n## guest output:\n{guest_out}",
        host.code, host.stdout, host.stderr
    );
    let after = rig.rxe_counters()?;
    let rxe = delta(&before, &after);
    let _ = writeln!(
        log,
        "## rxe counters (delta): {rxe:?}\n## tcpdump: {}",
        cap.stderr
    );
    let (ours, theirs) = check_mads(rig, &pcap)?;
    let _ = writeln!(log, "## MADs softroce: {ours}\n## MADs rxe: {theirs}");
    ensure!(
        host.code == Some(0),
        "{name} on softroce exited {:?}:\n{}{}",
        host.code,
        host.stdout,
        host.stderr
    );
    ensure!(
        guest_rc == 0,
        "{name} on rxe exited {guest_rc}:\n{guest_out}"
    );
    let (server_out, client_out) = match role {
        Role::SoftroceServer => (host.stdout.as_str(), guest_out.as_str()),
        _ => (guest_out.as_str(), host.stdout.as_str()),
    };
    let shape = match name {
        "rping" => {
            ensure!(
                client_out.contains("ping data: rdma-ping-9: "),
                "the rping client did not verify ping 9:\n{client_out}"
            );
            ensure!(
                server_out.contains("server ping data: rdma-ping-9: "),
                "the rping server did not see ping 9:\n{server_out}"
            );
            "10 pings verified (rping -V)".to_string()
        }
        "ucmatose" | "udaddy" => {
            for (side, out) in [("server", server_out), ("client", client_out)] {
                ensure!(
                    out.contains("data transfers complete") && out.contains("return status 0"),
                    "{name} {side}:\n{out}"
                );
            }
            if name == "udaddy" {
                ensure!(server_out.contains("sending replies"), "{server_out}");
            }
            "data transfers complete on both sides, return status 0".to_string()
        }
        "send_bw" => {
            let row = |out: &str| -> Res<Vec<String>> {
                let r = result_rows(out, "BW average")?.remove(0);
                ensure!(
                    r.len() > 3 && r[0] == "16384" && r[1] == "200",
                    "result row {r:?}"
                );
                Ok(r)
            };
            // With -R each side measures its own average (the server's peak column is 0.00).
            let c = row(client_out).map_err(|e| format!("client: {e}"))?;
            let s = row(server_out).map_err(|e| format!("server: {e}"))?;
            format!(
                "200 × 16384 B, BW average {} MB/s (client), {} MB/s (server)",
                c[3], s[3]
            )
        }
        _ => {
            ensure!(
                server_out.lines().any(|l| l
                    == "[server] received: 'Hello RDMA from client! Data lands directly in \
                        server memory.'"),
                "rdma_server:\n{server_out}"
            );
            ensure!(
                client_out
                    .lines()
                    .any(|l| l == "[client] write done, status=0"),
                "rdma_client:\n{client_out}"
            );
            "the server printed the client's message, the client `write done, status=0`".to_string()
        }
    };
    ensure!(
        !ours.contains("REJ") && !theirs.contains("REJ"),
        "a REJ on the wire: softroce {ours}; rxe {theirs}"
    );
    let sent = tap_packets(&rig.host_ip, &pcap)?
        .iter()
        .filter(|p| p.from_host)
        .count() as u64;
    let rcvd = rxe.get("rcvd_pkts").copied().unwrap_or(0);
    ensure!(
        sent > 0 && rcvd == sent,
        "rxe accepted {rcvd} packets, softroce sent {sent} (the tap's capture); drops on the \
         way: {}; {}",
        path_drops(&rxe),
        tap_tail(&rig.host_ip, &pcap, 24)
    );
    Ok(format!(
        "{shape}; CM MADs softroce: {ours}; rxe: {theirs} (QP1 from UDP port 0xd872, Q_Key \
         0x80010000 both ways); rxe accepted all {sent} packets softroce sent{}",
        if delay {
            format!(
                "; CM MADs into the guest delayed {PERFTEST_MAD_DELAY_MS} ms (perftest 4.5's listen race)"
            )
        } else {
            String::new()
        }
    ))
}

/// The commands of the REJ scenario, each connecting to `{server}` where nobody listens:
/// tests/c/cm_reject.c, ucmatose and rping on port 9999, udaddy on its own port (SIDR_REQ).
fn cm_reject_cmds(bin: &str, server: &str) -> Vec<String> {
    let p = CM_NO_LISTENER_PORT;
    vec![
        format!("{bin}/cm_reject {server} {p}"),
        format!("ucmatose -s {server} -p {p}"),
        format!("rping -c -a {server} -p {p} -C 1"),
        format!("udaddy -s {server}"),
    ]
}

/// A guest job that runs `cmds` one after the other and prints each one's output (stdout and
/// stderr, sorted: the tools interleave them differently on a pipe) and exit status.
fn cm_reject_guest_body(cmds: &[String]) -> String {
    cmds.iter()
        .map(|c| {
            format!(
                "echo '>>> {c}'; timeout 30 {c} > /tmp/o 2>&1; rc=$?; sort /tmp/o; echo \"exit $rc\""
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Lines rping's main thread prints after a failed connect, racing the exit(-1) its CM thread
/// makes right after printing the event (rping.c `cm_thread`): on rxe the main thread usually
/// prints them first, through softroce (whose rdma_ack_cm_event takes no system call) the exit
/// usually comes first. Not compared.
const RPING_RACING_LINES: [&str; 2] = ["wait for CONNECTED state 4", "connect error -1"];

/// Splits the output of [`cm_reject_guest_body`] into (command, sorted lines and exit status),
/// without [`RPING_RACING_LINES`].
fn cm_reject_results(out: &str) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = Vec::new();
    for l in out.lines() {
        if let Some(c) = l.strip_prefix(">>> ") {
            v.push((c.to_string(), String::new()));
        } else if RPING_RACING_LINES.contains(&l) {
            continue;
        } else if let Some(last) = v.last_mut() {
            last.1.push_str(l);
            last.1.push('\n');
        }
    }
    v
}

/// Issue 16 acceptance 3, item 6: an rdma_cm REQ (and udaddy's SIDR_REQ) to a port nobody
/// listens on. SoftroceClient: softroce's librdmacm connects to the guest, whose kernel CM
/// answers REJ 8 (SIDR_REP 1); SoftroceServer: the tools on rxe connect to a softroce device
/// (a `softroce exec rping -s` holds it open, listening on another port), whose CM answers
/// the same. Each command's output and exit status must equal what the same command prints
/// on rdma-core + rxe against the guest's own address (the reference run); the capture must
/// show the REJ reasons and SIDR statuses on the wire.
fn cm_reject(rig: &Rig, log: &mut String, role: Role) -> Res<String> {
    let bin = cm_programs(rig)?;
    let reference = cm_reject_guest_body(&cm_reject_cmds("/share/cm-bin", "$GUEST_IP"));
    let pcap = rig.run.join(format!(
        "cm-{}.pcap",
        rig.seq.fetch_add(1, Ordering::Relaxed)
    ));
    let before = rig.rxe_counters()?;
    let cap = host_capture_snap(rig, &pcap, 400)?;
    let run = (|| -> Res<Vec<(String, String)>> {
        if role == Role::SoftroceClient {
            let mut got = Vec::new();
            let host_cmds = cm_reject_cmds(&bin.display().to_string(), &rig.guest_ip);
            for (c, shown) in host_cmds
                .iter()
                .zip(cm_reject_cmds("/share/cm-bin", "$GUEST_IP"))
            {
                let mut args: Vec<String> = ["exec", "--ip", &rig.host_ip, "--"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                args.extend(c.split_whitespace().map(str::to_string));
                let h = rig
                    .host(&softroce_bin(), &args)?
                    .wait(Duration::from_secs(30));
                let mut lines: Vec<&str> = h
                    .stdout
                    .lines()
                    .chain(h.stderr.lines())
                    .filter(|l| !RPING_RACING_LINES.contains(l))
                    .collect();
                lines.sort_unstable();
                let mut text = lines.join("\n");
                text.push('\n');
                let _ = writeln!(text, "exit {}", h.code.map_or(-1, |c| c & 0xff));
                got.push((shown, text));
            }
            Ok(got)
        } else {
            let mut holder = rig.host(
                &softroce_bin(),
                &[
                    "exec".into(),
                    "--ip".into(),
                    rig.host_ip.clone(),
                    "--".into(),
                    "rping".into(),
                    "-s".into(),
                    "-a".into(),
                    rig.host_ip.clone(),
                    "-p".into(),
                    "7000".into(),
                ],
            )?;
            if let Err(e) = wait_softroce_device(rig, &mut holder) {
                let _ = holder.wait(Duration::ZERO);
                return Err(e);
            }
            let body = cm_reject_guest_body(&cm_reject_cmds("/share/cm-bin", "$HOST_IP"));
            let r = rig.guest_run("cm-reject", &body, TOOL_TIMEOUT);
            let h = holder.wait(Duration::ZERO);
            let _ = writeln!(
                log,
                "## softroce rping -s -p 7000 (killed): {:?} {}",
                h.code, h.stderr
            );
            let (rc, out) = r?;
            ensure!(rc == 0, "the guest job failed ({rc}):\n{out}");
            let _ = writeln!(log, "## guest against softroce:\n{out}");
            Ok(cm_reject_results(
                &out.replace(&rig.host_ip, "$GUEST_IP")
                    .replace("$HOST_IP", "$GUEST_IP"),
            ))
        }
    })();
    let cap = stop_capture(cap);
    let _ = writeln!(log, "## tcpdump: {}", cap.stderr);
    let got = run?;
    let after = rig.rxe_counters()?;
    let (rc, out) = rig.guest_run("cm-reject-reference", &reference, TOOL_TIMEOUT)?;
    ensure!(rc == 0, "the reference job failed ({rc}):\n{out}");
    let want = cm_reject_results(&out);
    let _ = writeln!(
        log,
        "## reference (rxe to itself):\n{out}\n## softroce side:\n{got:?}"
    );
    ensure!(
        want.len() == 4 && got.len() == 4,
        "expected 4 commands: reference {want:?}, softroce {got:?}"
    );
    for ((wc, wt), (gc, gt)) in want.iter().zip(&got) {
        ensure!(
            wc == gc && wt == gt,
            "`{gc}` printed (sorted)\n{gt}where rdma-core on rxe prints\n{wt}"
        );
    }
    let rxe = delta(&before, &after);
    let (ours, theirs) = check_mads(rig, &pcap)?;
    let _ = writeln!(log, "## MADs softroce: {ours}\n## MADs rxe: {theirs}");
    let (asks, answers) = match role {
        Role::SoftroceClient => (&ours, &theirs),
        _ => (&theirs, &ours),
    };
    ensure!(
        asks == "REQ REQ REQ SIDR_REQ" && answers == "REJ(8) REJ(8) REJ(8) SIDR_REP(1)",
        "MADs on the wire: requests {asks}; answers {answers}"
    );
    let sent = tap_packets(&rig.host_ip, &pcap)?
        .iter()
        .filter(|p| p.from_host)
        .count() as u64;
    let rcvd = rxe.get("rcvd_pkts").copied().unwrap_or(0);
    ensure!(
        rcvd == sent,
        "rxe accepted {rcvd} packets, softroce sent {sent}; drops on the way: {}",
        path_drops(&rxe)
    );
    let first = |s: &str| {
        s.lines()
            .find(|l| l.contains("REJECTED") || l.contains("UNREACHABLE"))
            .unwrap_or("")
            .trim()
            .to_string()
    };
    Ok(format!(
        "requests {asks}, answers {answers} on the wire; each tool prints what it prints on \
         rxe against itself (cm_reject: `{}`, ucmatose: `{}`, udaddy: `{}`) and exits alike \
         (8, 8, 255, 1); rxe accepted all {sent} packets softroce sent",
        first(&got[0].1),
        first(&got[1].1),
        first(&got[3].1)
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

impl Outcome {
    /// The scenario's softroce side does not exist yet.
    fn not_implemented(&self) -> bool {
        self.result
            .as_ref()
            .is_err_and(|e| e.starts_with(NOT_IMPLEMENTED))
    }
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
            "srq_pingpong 64 B",
            "ibv_srq_pingpong -s 64 -m 1024 -c (16 RC QPs on one SRQ) vs softroce pingpong --srq; \
             rxe must execute every SEND packet softroce sent (`rdma_recvs` = softroce's \
             `rdma_sends`), and its `rcvd_pkts` may fall short of softroce's count only by \
             softroce's end-of-run packets: retransmitted requests, ACKs of duplicates and of \
             the extra message per QP (the tool destroys its QPs as soon as its own counts are \
             reached, as between two rxe devices)",
            |r, l, role| pingpong(r, l, role, "srq", 64, false),
        ),
        (
            "srq_pingpong 4096 B",
            "ibv_srq_pingpong -s 4096 -m 1024 -c vs softroce pingpong --srq",
            |r, l, role| pingpong(r, l, role, "srq", 4096, false),
        ),
        (
            "srq_pingpong 4096 B, CQ events",
            "as above with -e on both sides: each sleeps on a completion channel",
            |r, l, role| pingpong(r, l, role, "srq-events", 4096, false),
        ),
        (
            "rc_pingpong 4096 B, 10% loss",
            "as above while netem in the guest drops 10% of the RoCE requests in each \
             direction (ACKs are spared: rc_pingpong itself fails when the last ACK of a run is \
             lost, since its requester retransmits into a QP the peer has destroyed)",
            |r, l, role| pingpong(r, l, role, "rc", 4096, true),
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
            "RDMA READ past the end of the MR",
            "softroce target vs pyverbs on rxe: a 64-byte READ starting 32 B before the end of \
             a 4096-byte MR: NAK remote access error (AETH 0x62) from the responder, \
             IBV_WC_REM_ACCESS_ERR at the requester, nothing written to the READ buffer",
            |r, l, role| negative(r, l, role, Neg::ReadOob),
        ),
        (
            "SEND, no receive posted (rnr_retry 7)",
            "softroce target vs pyverbs on rxe: the responder RNR NAKs (AETH 0x34, timer code \
             20) until the test posts a receive, then ACKs; IBV_WC_SUCCESS at the requester and \
             the message in the receive buffer; both sides' RNR counters match the NAKs on \
             the wire",
            |r, l, role| negative(r, l, role, Neg::RnrThenSuccess),
        ),
        (
            "SEND, no receive posted (rnr_retry 0)",
            "as above with rnr_retry 0 and no receive ever: exactly one RNR NAK, \
             IBV_WC_RNR_RETRY_EXC_ERR at the requester (retry_rnr_exceeded_err 1)",
            |r, l, role| negative(r, l, role, Neg::RnrExceeded),
        ),
        (
            "IP TOS, UDP checksum and WC fields",
            "softroce target vs pyverbs on rxe, both QPs with traffic class 0xb8 (DSCP 46): the \
             requester posts SEND_WITH_IMM 3000 B, SEND 5 B, RDMA WRITE 100 B and \
             RDMA_WRITE_WITH_IMM 2500 B; every softroce packet in the guest's capture has TOS \
             0xb8, the UDP checksums the guest sees are recorded (softroce sends 0 except on \
             GSO bulk segments; the ICRC protects the packet), rxe accepts every packet; the \
             requester's completions carry byte_len (the message length) and IBV_WC_WITH_IMM \
             on the _WITH_IMM opcodes, the responder's receives IBV_WC_GRH (and WITH_IMM with \
             the immediate), on both sides as rxe gives them",
            |r, l, role| wc_fields(r, l, role),
        ),
        (
            "C library: ibv_rc_pingpong 4096 B",
            "Debian's ibv_rc_pingpong -s 4096 -n 500 -m 1024 -c through softroce's \
             libibverbs.so.1 (`softroce exec`) vs ibv_rc_pingpong on rxe; rxe accepts every \
             packet the tap carried from softroce",
            |r, l, role| capi(r, l, role, "rc"),
        ),
        (
            "C library: ibv_ud_pingpong 1024 B",
            "ibv_ud_pingpong -s 1024 -n 500 -c through softroce exec vs ibv_ud_pingpong on rxe",
            |r, l, role| capi(r, l, role, "ud"),
        ),
        (
            "C library: ibv_srq_pingpong 4096 B",
            "ibv_srq_pingpong -s 4096 -n 500 -m 1024 -c through softroce exec vs \
             ibv_srq_pingpong on rxe; rxe accepts every softroce packet but those sent to a \
             QP after rxe's last packet from it (its tool destroys its 16 QPs as soon as its \
             own counts are reached)",
            |r, l, role| capi(r, l, role, "srq"),
        ),
        (
            "C library: ib_write_bw",
            "perftest's ib_write_bw -s 16384 -n 200 -m 1024 through softroce exec vs ib_write_bw \
             on rxe; the server prints the client's row",
            |r, l, role| capi(r, l, role, "write_bw"),
        ),
        (
            "C library: ib_read_bw",
            "ib_read_bw -s 16384 -n 200 -m 1024 through softroce exec vs ib_read_bw on rxe",
            |r, l, role| capi(r, l, role, "read_bw"),
        ),
        (
            "C library: ib_send_lat",
            "ib_send_lat -s 64 -n 200 -m 1024 through softroce exec vs ib_send_lat on rxe; both \
             print a latency row",
            |r, l, role| capi(r, l, role, "send_lat"),
        ),
        (
            "C library: ib_atomic_bw",
            "ib_atomic_bw -n 200 -m 1024 (8-byte FETCH_AND_ADD) through softroce exec vs \
             ib_atomic_bw on rxe",
            |r, l, role| capi(r, l, role, "atomic_bw"),
        ),
        (
            "UCX: ucx_perftest tag_lat rc_verbs",
            "Debian's ucx_perftest -t tag_lat -s 8 -n 200 (UCX 1.13, UCX_TLS=rc_verbs,ud_verbs:aux, \
             UCX_UD_VERBS_ETH_DGID_CHECK=n on both sides) through softroce exec vs ucx_perftest \
             on rxe; the client's Final: row shows every iteration, the tap carries at least one \
             RC request an iteration (softroce's among them), rxe accepts every softroce packet but those after its last \
             one",
            |r, l, role| ucx(r, l, role, "tag_lat"),
        ),
        (
            "UCX: ucx_perftest tag_bw 64 KiB rc_verbs",
            "ucx_perftest -t tag_bw -s 65536 -n 200 over rc_verbs through softroce exec vs \
             ucx_perftest on rxe; the RC packets (not ACKs) carry at least the 200 messages' \
             bytes",
            |r, l, role| ucx(r, l, role, "tag_bw"),
        ),
        (
            "UCX: ucx_perftest tag_lat ud_verbs",
            "ucx_perftest -t tag_lat -s 8 -n 200 over ud_verbs alone through softroce exec vs \
             ucx_perftest on rxe; UD packets only, at least one from softroce an iteration",
            |r, l, role| ucx(r, l, role, "ud"),
        ),
        (
            "MPI: Open MPI ping-pong, pml ucx",
            "tests/c/mpi_pingpong.c under Open MPI 4.1 (Debian's mpirun --mca pml ucx --mca btl \
             self, UCX_TLS=rc_verbs,ud_verbs:aux,self, UCX_UD_VERBS_ETH_DGID_CHECK=n on both \
             sides) with one rank through softroce exec on the host and one on rxe in the guest, \
             whose orted mpirun starts through the rig's job channel (plm_rsh_agent) and which \
             reaches mpirun over the tap: 200 × 8 B, 100 × 4 KiB and 20 × 256 KiB round trips, \
             every message checked byte by byte by the rank that receives it. Server: softroce \
             holds rank 1, which answers each ping; client: rank 0, which sends them. The tap \
             carries RC data both ways with at least the messages' bytes, the 256 KiB messages \
             go by UCX's rendezvous (both sides RDMA READ), rxe accepts every softroce packet \
             but those after its last one (rxe's counters also count the few packets its rank's \
             UCX sends itself over rxe's loopback: `sent_pkts` beyond the tap's)",
            |r, l, role| mpi(r, l, role),
        ),
        (
            "rdma_cm: rping",
            "rping -s / rping -c -C 10 -v -V through softroce's librdmacm.so.1 (`softroce exec`) \
             vs rping on rxe's rdma_cm: REQ/REP/RTU, 10 verified pings (SEND, RDMA READ and \
             WRITE), DREQ/DREP; every CM MAD from UDP port 0xd872 with P_Key 0xffff and Q_Key \
             0x80010000, no REJ, rxe accepts every softroce packet",
            |r, l, role| cm_tool(r, l, role, "rping"),
        ),
        (
            "rdma_cm: ucmatose",
            "ucmatose / ucmatose -s ADDR through softroce exec vs ucmatose on rxe: connect, \
             SENDs both ways, disconnect",
            |r, l, role| cm_tool(r, l, role, "ucmatose"),
        ),
        (
            "rdma_cm: udaddy",
            "udaddy / udaddy -s ADDR through softroce exec vs udaddy on rxe: UD ids, \
             SIDR_REQ/SIDR_REP, datagrams both ways (the server answers through an AH from the \
             receive's GRH)",
            |r, l, role| cm_tool(r, l, role, "udaddy"),
        ),
        (
            "rdma_cm: ib_send_bw -R",
            "perftest ib_send_bw -R -n 200 -s 16384 (handshake and data QPs through rdma_cm) \
             through softroce exec vs ib_send_bw -R on rxe; the server prints the client's row. \
             With rxe as the server the guest delays the CM MADs it receives by 100 ms: \
             perftest 4.5's client connects right after the handshake, racing the server's \
             rdma_listen (REJ 8), and its retry then double-frees (fixed upstream in perftest \
             3d9d8d0)",
            |r, l, role| cm_tool(r, l, role, "send_bw"),
        ),
        (
            "rdma_cm: seed rdma_server / rdma_client",
            "tests/c/seed's rdma_server and rdma_client (gcc ... -lrdmacm -libverbs on the host; \
             the guest runs the same binaries): the client's RDMA WRITE lands in the buffer the \
             server announced in its REP; `[server] received: 'Hello RDMA from client! Data \
             lands directly in server memory.'` and `[client] write done, status=0`",
            |r, l, role| cm_tool(r, l, role, "seed"),
        ),
        (
            "rdma_cm: REQ to a port nobody listens on",
            "tests/c/cm_reject.c, ucmatose -p 9999, rping -p 9999 (REQ) and udaddy (SIDR_REQ) \
             against an address whose CM has no listener there: softroce as client gets the \
             kernel's REJ 8 / SIDR_REP 1, softroce as server (its device held open by an rping \
             -s on another port) answers the kernel's REQs with REJ 8 and SIDR_REP 1; every \
             tool prints and exits exactly as it does on rxe against its own address \
             (RDMA_CM_EVENT_REJECTED status 8, RDMA_CM_EVENT_UNREACHABLE status 1)",
            |r, l, role| cm_reject(r, l, role),
        ),
        (
            "perftest ib_write_bw",
            "ib_write_bw -s 16384 -n 200 -m 1024 vs softroce perf write_bw; both print the \
             client's results",
            |r, l, role| perftest(r, l, role, "write_bw"),
        ),
        (
            "perftest ib_read_bw",
            "ib_read_bw -s 16384 -n 200 -m 1024 vs softroce perf read_bw (128 outstanding \
             READs); both print the client's results",
            |r, l, role| perftest(r, l, role, "read_bw"),
        ),
        (
            "perftest ib_send_bw",
            "ib_send_bw -s 16384 -n 200 -m 1024 vs softroce perf send_bw",
            |r, l, role| perftest(r, l, role, "send_bw"),
        ),
        (
            "perftest ib_atomic_bw",
            "ib_atomic_bw -n 200 -m 1024 (8-byte FETCH_AND_ADD) vs softroce perf atomic_bw; both \
             print the client's results",
            |r, l, role| perftest(r, l, role, "atomic_bw"),
        ),
        (
            "perftest ib_write_lat",
            "ib_write_lat -s 64 -n 200 -m 1024 vs softroce perf write_lat; both print a latency \
             row",
            |r, l, role| perftest(r, l, role, "write_lat"),
        ),
        (
            "perftest ib_write_lat -a",
            "ib_write_lat -a -n 5 -m 1024 vs softroce perf write_lat -a: every size from 2 B to \
             8 MiB (8,192 packets a message at the top), both print all 23 rows",
            |r, l, role| perftest_sizes(r, l, role, "write_lat", true),
        ),
        (
            "perftest ib_read_lat",
            "ib_read_lat -s 64 -n 200 -m 1024 vs softroce perf read_lat; the client prints the \
             latency row",
            |r, l, role| perftest(r, l, role, "read_lat"),
        ),
        (
            "perftest ib_send_lat",
            "ib_send_lat -s 64 -n 200 -m 1024 vs softroce perf send_lat; both print a latency \
             row",
            |r, l, role| perftest(r, l, role, "send_lat"),
        ),
    ]
}

#[test]
#[ignore = "boots a QEMU guest with kernel rxe: needs root, /dev/net/tun, apt-get; run tests/interop/run.sh"]
fn interop_rxe() {
    let t0 = Instant::now();
    let only = std::env::var("SOFTROCE_INTEROP_ONLY").unwrap_or_default();
    let update_docs = std::env::var("SOFTROCE_INTEROP_UPDATE_DOCS").is_ok_and(|v| v == "1");
    assert!(
        only.is_empty() || !update_docs,
        "SOFTROCE_INTEROP_UPDATE_DOCS=1 needs the full suite: unset SOFTROCE_INTEROP_ONLY"
    );
    let cache = PathBuf::from(
        std::env::var("SOFTROCE_INTEROP_CACHE")
            .unwrap_or_else(|_| "/var/cache/softroce-interop".into()),
    );
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // run.sh's cleanup recognises its own run by the owner suffix.
    let owner = std::env::var("SOFTROCE_INTEROP_OWNER")
        .map(|o| format!("-o{o}"))
        .unwrap_or_default();
    let run = cache
        .join("runs")
        .join(format!("{stamp}-{}{owner}", std::process::id()));
    std::fs::create_dir_all(run.join("logs")).expect("create the run directory");
    prune_runs(&cache.join("runs"), 5);

    let rig = Rig::up(&run).unwrap_or_else(|e| panic!("the rxe guest did not come up: {e}"));
    let boot_secs = t0.elapsed().as_secs_f64();
    let mut outcomes = Vec::new();
    let list = scenarios();
    for (name, _, f) in &list {
        for role in [Role::SoftroceServer, Role::SoftroceClient] {
            if !selected(&only, name) {
                continue;
            }
            outcomes.push(run_one(&rig, name, role, |r, l| f(r, l, role)));
        }
    }
    if selected(&only, CONTROL) {
        outcomes.push(run_one(&rig, CONTROL, Role::Control, |r, l| {
            control(r, l, "rc")
        }));
    }
    if selected(&only, CONTROL_SRQ) {
        outcomes.push(run_one(&rig, CONTROL_SRQ, Role::Control, |r, l| {
            control(r, l, "srq")
        }));
    }
    let manifest =
        std::fs::read_to_string(cache.join("guest").join("manifest.txt")).unwrap_or_default();
    drop(rig);
    let wall = t0.elapsed().as_secs_f64();
    let report = report(&list, &outcomes, &manifest, boot_secs, wall);
    println!("\n{report}");
    std::fs::write(run.join("interop.md"), &report).expect("write the report");
    if update_docs {
        let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/interop.md");
        std::fs::create_dir_all(doc.parent().expect("docs dir")).expect("create docs/");
        std::fs::write(&doc, &report).expect("write docs/interop.md");
        println!("wrote {}", doc.display());
    }
    let not_impl: Vec<String> = outcomes
        .iter()
        .filter(|o| o.not_implemented())
        .map(|o| format!("{} [{}]", o.scenario, o.role.column()))
        .collect();
    if !not_impl.is_empty() {
        println!(
            "NOT IMPLEMENTED in softroce (reported in the table, not failures): {}",
            not_impl.join(", ")
        );
    }
    let strict = std::env::var("SOFTROCE_INTEROP_REQUIRE_ALL").is_ok_and(|v| v == "1");
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| o.result.is_err() && (strict || !o.not_implemented()))
        .map(|o| format!("{} [{}]", o.scenario, o.role.column()))
        .collect();
    // What each failure said, at the end of the output: CI keeps only the tail of a run,
    // and the report above may be cut off.
    for o in outcomes
        .iter()
        .filter(|o| o.result.is_err() && (strict || !o.not_implemented()))
    {
        let why = o.result.as_ref().err().map_or("", String::as_str);
        let cut: String = why.chars().take(3000).collect();
        eprintln!(
            "FAILED {} [{}] after {:.1} s:\n{cut}",
            o.scenario,
            o.role.column(),
            o.secs
        );
    }
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

/// Whether `SOFTROCE_INTEROP_ONLY` (`|`-separated parts; empty: everything) selects the
/// scenario `name`: it does when `name` contains one of the parts.
fn selected(only: &str, name: &str) -> bool {
    only.is_empty() || only.split('|').any(|p| !p.is_empty() && name.contains(p))
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
        Err(e) if e.starts_with(NOT_IMPLEMENTED) => println!("    {e}"),
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
        Some(Outcome { result: Err(e), .. }) if e.starts_with(NOT_IMPLEMENTED) => e.clone(),
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
                Err(e) if e.starts_with(NOT_IMPLEMENTED) => e.clone(),
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
         The WRITE scenarios and the negative cases capture the guest NIC with tcpdump and \
         decode the AETH syndromes and PSNs; there rxe's `rcvd_pkts` must equal both the \
         number of softroce's packets in the capture and softroce's own count. A row that says \
         \"not implemented\" quotes softroce's reason: the scenario is written and runs as soon \
         as softroce has the feature.\n\n\
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

/// The end-of-run allowance of ibv_srq_pingpong: softroce's QP 0x11 talks to rxe's 0x22 (an
/// ACK to 0x11 with PSN 7 acknowledges softroce's request PSN 7 to 0x22), softroce's 0x12 to
/// rxe's 0x23. rxe's last packet from 0x22 is at 30 and from 0x23 at 50: what softroce sent
/// to 0x22 after 30 (its ACK at 40, its SEND at 60) may have reached a destroyed QP, what it
/// sent to 0x23 before 50 may not; a packet to an rxe QP never paired (0x24 at 45) counts
/// only after rxe's last packet overall.
#[test]
fn the_srq_allowance_counts_packets_after_their_qps_last() {
    let pkt = |t, from_host, opcode, dqpn, psn| TapPacket {
        t,
        from_host,
        opcode,
        ip_len: 100,
        udp_csum: 0,
        dqpn,
        psn,
        mad_attr: None,
    };
    let (send, ack) = (0x04, 0x11);
    let pkts = [
        pkt(10, true, send, 0x22, 7),
        pkt(20, false, ack, 0x11, 7),
        pkt(25, true, send, 0x23, 900),
        pkt(30, false, send, 0x11, 3),
        pkt(40, true, ack, 0x22, 3),
        pkt(45, true, send, 0x24, 5),
        pkt(46, true, ack, 0x23, 12),
        pkt(50, false, ack, 0x12, 900),
        pkt(60, true, send, 0x22, 8),
    ];
    assert_eq!(host_packets_after_rxe_last(&pkts), 1);
    assert_eq!(host_packets_after_rxe_last_on_their_qp(&pkts), 2);
}

/// `tap_tail` on a real capture (two kernel rxe devices, `ib_send_bw -R`; 10.77.0.1 plays
/// softroce's part): the run ends with a handshake SEND and its ACK, then the CM's two
/// disconnects (DREQ, DREP each way) on QP1.
#[test]
fn tap_tail_lists_the_last_packets_of_a_capture() {
    let pcap = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/captures/23-send-bw-rdmacm.pcap");
    let tail = tap_tail("10.77.0.1", &pcap, 6);
    let lines: Vec<&str> = tail.lines().collect();
    assert_eq!(lines.len(), 7, "{tail}");
    assert!(
        lines[0].starts_with("the capture's last 6 of 64 packets"),
        "{tail}"
    );
    let want = [
        "+727690 us softroce->rxe opcode 0x04 QP 0x24 PSN 14374683 IP 100 B",
        "+727882 us rxe->softroce opcode 0x11 QP 0x24 PSN 14374683 IP 48 B",
        "+731214 us rxe->softroce opcode 0x64 QP 0x1 PSN 4 IP 308 B MAD DREQ",
        "+739451 us softroce->rxe opcode 0x64 QP 0x1 PSN 2 IP 308 B MAD DREP",
        "+760894 us softroce->rxe opcode 0x64 QP 0x1 PSN 3 IP 308 B MAD DREQ",
        "+771454 us rxe->softroce opcode 0x64 QP 0x1 PSN 5 IP 308 B MAD DREP",
    ];
    for (l, w) in lines[1..].iter().zip(want) {
        assert_eq!(l.trim(), w, "{tail}");
    }
}
