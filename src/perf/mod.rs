//! `softroce perf`: perftest's bandwidth and latency tests (`ib_write_bw`, `ib_read_bw`,
//! `ib_send_bw`, `ib_atomic_bw`, `ib_write_lat`, `ib_read_lat`, `ib_send_lat`) on a softroce
//! device, as client or server, interoperable with the unmodified perftest tools (Debian's
//! perftest 4.5-0.17, whose exchange calls itself version "6.06") on kernel rxe; plus raw UDP
//! and TCP baselines on loopback to put the numbers in proportion.
//!
//! - [`oob`]: the TCP exchange (port 18515 unless `-p`), byte for byte as perftest's.
//! - [`session`]: device, CQs, `-q` QPs and the MR; the moves to RTS.
//! - [`bw`], [`lat`]: the traffic of the bandwidth and latency tests.
//! - [`report`]: perftest's result tables, `--json`, and comparisons with a baseline.
//! - [`baseline`]: `softroce perf udp-baseline` and `--compare-tcp`.
//!
//! The order of the exchange's steps per test is in [`Flow`]. Each test's traffic, who
//! measures and who prints follow perftest's `src/<test>.c`:
//! - write_bw, read_bw, atomic_bw: the client posts, the server only waits; the client sends
//!   its results over TCP and both print them (`xchg_bw_reports`).
//! - send_bw: the server posts receives, the client SENDs; each side prints its own numbers.
//! - write_lat, send_lat: a ping-pong; both sides measure and print. read_lat: the client
//!   alone READs and prints.
//!
//! Checked against the unmodified perftest 4.5-0.17 tools on kernel rxe 6.1 (a QEMU guest
//! of the interop rig, tests/interop), softroce as server and as client: send_bw (also
//! `-q 2`), atomic_bw, write_bw (`-q 2`, `-a`), read_lat, write_lat and send_lat complete
//! with matching rows. `-a` latency runs against rxe in that (emulated, slow) guest end in
//! "transport retry counter exceeded" at messages of 128 KiB to 8 MiB; every size before
//! passes, so the exchange itself holds.
//!
//! `--loopback` runs the server and the client as two devices of one process (127.0.0.1 and
//! 127.0.0.2 unless `--ip` / `--peer-ip`), prints the client's results, and the UDP (and with
//! `--compare-tcp` the TCP) baseline beside them with the ratio.

pub mod baseline;
pub mod bw;
pub mod cpu;
pub mod lat;
pub mod oob;
pub mod report;
pub mod session;

use crate::BoxError;
use crate::pingpong::{DEFAULT_TCP_PORT, device_ip, quiesce};
use bw::{BwOp, Limit};
use clap::{Args, ValueEnum};
use cpu::{End, Placement};
use lat::LatOp;
use oob::Oob;
use report::{BwResult, LatResult, Out};
use session::{Session, SessionSpec};
use softroce::verbs::PathMtu;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::time::Duration;

/// The perftest test to run (perftest's program name without "ib_"), or the UDP baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PerfTest {
    /// RDMA WRITE bandwidth (ib_write_bw).
    #[value(name = "write_bw")]
    WriteBw,
    /// RDMA READ bandwidth (ib_read_bw).
    #[value(name = "read_bw")]
    ReadBw,
    /// SEND bandwidth (ib_send_bw).
    #[value(name = "send_bw")]
    SendBw,
    /// Atomic bandwidth (ib_atomic_bw): FETCH_AND_ADD, or CMP_AND_SWAP with -A.
    #[value(name = "atomic_bw")]
    AtomicBw,
    /// RDMA WRITE latency (ib_write_lat).
    #[value(name = "write_lat")]
    WriteLat,
    /// SEND latency (ib_send_lat).
    #[value(name = "send_lat")]
    SendLat,
    /// RDMA READ latency (ib_read_lat).
    #[value(name = "read_lat")]
    ReadLat,
    /// Raw UDP stream and ping-pong between two sockets on loopback, with the datagram size
    /// of the RoCE data path at this MTU and message size.
    #[value(name = "udp-baseline")]
    UdpBaseline,
}

impl PerfTest {
    /// perftest's program name without "ib_".
    pub fn name(self) -> &'static str {
        match self {
            PerfTest::WriteBw => "write_bw",
            PerfTest::ReadBw => "read_bw",
            PerfTest::SendBw => "send_bw",
            PerfTest::AtomicBw => "atomic_bw",
            PerfTest::WriteLat => "write_lat",
            PerfTest::SendLat => "send_lat",
            PerfTest::ReadLat => "read_lat",
            PerfTest::UdpBaseline => "udp-baseline",
        }
    }

    fn is_lat(self) -> bool {
        matches!(
            self,
            PerfTest::WriteLat | PerfTest::SendLat | PerfTest::ReadLat
        )
    }
}

/// `-A`: the atomic operation of atomic_bw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AtomicType {
    /// IBV_WR_ATOMIC_FETCH_AND_ADD (perftest's default).
    #[value(name = "FETCH_AND_ADD")]
    FetchAndAdd,
    /// IBV_WR_ATOMIC_CMP_AND_SWP.
    #[value(name = "CMP_AND_SWAP")]
    CmpAndSwap,
}

/// Options of `softroce perf`, named and defaulted as perftest's (`src/perftest_parameters.c`).
#[derive(Args, Debug, Clone)]
#[command(arg_required_else_help = true)]
pub struct PerfArgs {
    #[command(flatten)]
    pub net: crate::NetArgs,
    /// The test (perftest's program name without "ib_"), or udp-baseline.
    test: PerfTest,
    /// Server to connect to; without it, wait for a client.
    host: Option<String>,
    /// Listen on / connect to this TCP port.
    #[arg(short = 'p', long = "port", default_value_t = DEFAULT_TCP_PORT)]
    port: u16,
    /// Device name.
    #[arg(short = 'd', long = "ib-dev", default_value = "softroce0")]
    ib_dev: String,
    /// Device port (softroce devices have port 1 only).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// Message size in bytes (perftest: 65536 for bandwidth, 2 for latency, 8 for atomics).
    #[arg(short = 's', long = "size")]
    size: Option<u32>,
    /// Iterations (perftest: 5000 for bandwidth, 1000 for latency; latency needs at least 5).
    #[arg(short = 'n', long = "iters")]
    iters: Option<u64>,
    /// Run for this many seconds instead of -n iterations.
    #[arg(short = 'D', long = "duration")]
    duration: Option<u64>,
    /// Run every size from 2 to 2^23 bytes.
    #[arg(short = 'a', long = "all")]
    all: bool,
    /// Path MTU in bytes; the smaller of both sides' is used.
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
    /// Number of QPs (bandwidth tests).
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    qps: u32,
    /// Messages in flight per QP (perftest: 128 for bandwidth, 1 for latency).
    #[arg(short = 't', long = "tx-depth")]
    tx_depth: Option<u32>,
    /// Bandwidth tests: signal (and so complete visibly) every Nth WR of a QP and its last
    /// (perftest's CQ moderation; at most -t).
    #[arg(short = 'Q', long = "cq-mod", default_value_t = 100)]
    cq_mod: u32,
    /// Receives posted per QP in the SEND tests (perftest: 512, at most -n).
    #[arg(short = 'r', long = "rx-depth")]
    rx_depth: Option<u32>,
    /// Connection type (perftest's -c): RC; UC and UD are not supported yet.
    #[arg(
        short = 'c',
        long = "connection",
        value_name = "RC|UC|UD",
        default_value = "RC"
    )]
    connection: String,
    /// perftest's -e (CQ events): not supported yet.
    #[arg(short = 'e', long = "events")]
    events: bool,
    /// perftest's -b (bidirectional): not supported yet.
    #[arg(short = 'b', long = "bidirectional")]
    bidirectional: bool,
    /// perftest's -R (connect with rdma_cm): not supported yet.
    #[arg(short = 'R', long = "rdma_cm")]
    rdma_cm: bool,
    /// Local GID index (1: the RoCE v2 GID of the device address).
    #[arg(short = 'x', long = "gid-index", default_value_t = 1)]
    gid_index: u8,
    /// Atomic operation of atomic_bw.
    #[arg(short = 'A', long = "atomic_type", value_enum, default_value_t = AtomicType::FetchAndAdd)]
    atomic_type: AtomicType,
    /// Accepted for perftest compatibility (softroce reads no CPU frequency).
    #[arg(short = 'F', long = "CPU-freq")]
    cpu_freq: bool,
    /// Bandwidth in Gb/s instead of MB/s.
    #[arg(long = "report_gbits")]
    report_gbits: bool,
    /// One JSON object per result row on stdout (everything else goes to stderr).
    #[arg(long)]
    json: bool,
    /// Address the device binds (UDP 4791); default $SOFTROCE_IP, else 127.0.0.1. With
    /// --loopback: the server's device (default 127.0.0.1).
    #[arg(long)]
    ip: Option<IpAddr>,
    /// With --loopback: the client's device (default 127.0.0.2).
    #[arg(long)]
    peer_ip: Option<IpAddr>,
    /// Server and client as two devices in this process; prints the client's results beside
    /// the UDP baseline (and the TCP one with --compare-tcp).
    #[arg(long)]
    loopback: bool,
    /// After the test, a TCP stream (bandwidth tests) or ping-pong (latency tests) on
    /// loopback with the same message size, printed beside the result with the ratio.
    #[arg(long)]
    compare_tcp: bool,
    /// Busy-poll: the thread polling the CQ (or, in write_lat, the buffer) also receives
    /// from the device's socket itself instead of waiting for the device's receive thread
    /// to hand datagrams over (a cross-core wakeup, tens of µs), and the UDP baselines'
    /// receivers spin too. For latency, and for bandwidth on few cores; costs a core per
    /// polling side. See `softroce::net::UdpOptions::busy_poll`.
    #[arg(long)]
    busy_poll: bool,
    /// With --loopback: run the test and its baselines this many times, alternating, and
    /// end with the median of each ratio and its range (on a busy machine one trial's ratio
    /// can be off by 2x).
    #[arg(long, default_value_t = 1)]
    trials: u32,
    /// Pin the client side (requester, its device's driver thread, each baseline's sender
    /// or pinger) to CPU A and the server side to CPU B; `A` alone puts both on one CPU.
    /// Two processes each take their own side's CPU. Without it the scheduler places the
    /// threads, differently from run to run, which on two cores moves a result up to 2×.
    #[arg(long, value_name = "A[,B]")]
    cpus: Option<Placement>,
    /// After the results, print the device's counters (rxe hw_counters names), read once the
    /// link has been quiet for 200 ms.
    #[arg(long)]
    counters: bool,
}

/// A result row of either kind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Row {
    /// Bandwidth test row.
    Bw(BwResult),
    /// Latency test row.
    Lat(LatResult),
}

/// The validated settings of one side.
#[derive(Debug, Clone)]
struct Plan {
    test: PerfTest,
    sizes: Vec<u32>,
    limit: Limit,
    tx_depth: u32,
    cq_mod: u32,
    rx_depth: u32,
    qps: usize,
    mtu: PathMtu,
    gid_index: u8,
    atomic: AtomicType,
    counters: bool,
    cpus: Option<Placement>,
}

impl Plan {
    fn from_args(a: &PerfArgs) -> Result<Plan, BoxError> {
        // perftest options softroce does not have yet, refused by name rather than ignored.
        if a.rdma_cm {
            return Err(
                "-R: rdma_cm support is not there yet: softroce perf connects through \
                        perftest's TCP exchange only (run both sides without -R)"
                    .into(),
            );
        }
        if a.bidirectional {
            return Err("-b: bidirectional tests are not supported yet".into());
        }
        if a.events {
            return Err("-e: CQ events are not supported by softroce perf yet (it polls)".into());
        }
        match a.connection.to_ascii_uppercase().as_str() {
            "RC" => {}
            "UC" | "UD" => {
                return Err(format!(
                    "-c {}: only RC connections are supported by softroce perf yet",
                    a.connection
                )
                .into());
            }
            other => return Err(format!("-c {other}: use RC, UC or UD").into()),
        }
        if a.ib_port != 1 {
            return Err(format!("device port {} does not exist (only port 1)", a.ib_port).into());
        }
        let mtu = PathMtu::from_bytes(a.mtu)
            .ok_or_else(|| format!("MTU {} is not one of 256, 512, 1024, 2048, 4096", a.mtu))?;
        let lat = a.test.is_lat();
        let atomic = a.test == PerfTest::AtomicBw;
        let size = a.size.unwrap_or(if lat {
            2
        } else if atomic {
            8
        } else {
            65536
        });
        let iters = a.iters.unwrap_or(if lat { 1000 } else { 5000 });
        if size == 0 || size > 1 << 23 && a.test != PerfTest::UdpBaseline {
            return Err(format!("message size {size} is not between 1 and 8388608").into());
        }
        if lat && iters < 5 && a.duration.is_none() {
            // perftest's wording (without its leading space).
            return Err("Iteration num should be between 5 and 100000000".into());
        }
        if iters == 0 {
            return Err("-n must be at least 1".into());
        }
        if a.qps == 0 || a.qps > 64 || (lat && a.qps != 1) {
            return Err(format!(
                "-q {}: bandwidth tests take 1 to 64 QPs, latency tests 1",
                a.qps
            )
            .into());
        }
        let sizes = if atomic {
            vec![8]
        } else if a.all {
            (1..24).map(|i| 1u32 << i).collect()
        } else {
            vec![size]
        };
        if atomic && a.size.is_some_and(|s| s != 8) {
            return Err("atomic_bw messages are 8 bytes (-s 8)".into());
        }
        let limit = match a.duration {
            Some(0) => return Err("-D must be at least 1 second".into()),
            Some(d) => {
                // Ctrl-C ends the timed run early; its results are still reported.
                crate::interrupt::handle_in_command();
                Limit::Duration(Duration::from_secs(d))
            }
            None => Limit::Iters(iters),
        };
        let tx_depth = a.tx_depth.unwrap_or(if lat { 1 } else { 128 });
        if tx_depth == 0 {
            return Err("-t must be at least 1".into());
        }
        if a.cq_mod == 0 {
            return Err("-Q must be at least 1".into());
        }
        let rx_cap = u32::try_from(iters).unwrap_or(u32::MAX);
        let rx_depth = a.rx_depth.unwrap_or(512).min(rx_cap).max(1);
        let _ = a.cpu_freq;
        Ok(Plan {
            test: a.test,
            sizes,
            limit,
            tx_depth,
            cq_mod: a.cq_mod.min(tx_depth),
            rx_depth,
            qps: a.qps as usize,
            mtu,
            gid_index: a.gid_index,
            atomic: a.atomic_type,
            counters: a.counters,
            cpus: a.cpus,
        })
    }

    fn uses_recvs(&self) -> bool {
        matches!(self.test, PerfTest::SendBw | PerfTest::SendLat)
    }

    fn rd_atomic(&self) -> bool {
        matches!(
            self.test,
            PerfTest::ReadBw | PerfTest::AtomicBw | PerfTest::ReadLat
        )
    }

    fn max_size(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(8) as usize
    }
}

/// How one side reaches the other over TCP.
enum Role {
    Client(String, u16),
    Server(TcpListener),
}

/// Runs `softroce perf`.
pub fn run(a: PerfArgs) -> Result<(), BoxError> {
    let out = Out {
        json: a.json,
        quiet: false,
        gbits: a.report_gbits,
    };
    let plan = Plan::from_args(&a)?;
    if let Some(p) = a.cpus {
        p.check()?;
    }
    if a.busy_poll {
        // Every device this process opens from here on (one, or two with --loopback).
        softroce::net::UdpOptions::set_process_default(softroce::net::UdpOptions {
            busy_poll: true,
            ..softroce::net::UdpOptions::process_default()
        });
    }
    if a.test == PerfTest::UdpBaseline {
        return baseline::udp_baseline(&plan_baseline(&a, &plan), out);
    }
    if a.trials == 0 {
        return Err("--trials must be at least 1".into());
    }
    if a.loopback && a.host.is_some() {
        return Err("--loopback runs both sides in this process: give no HOST".into());
    }
    if a.trials > 1 {
        if !a.loopback {
            return Err("--trials needs --loopback (both sides in this process)".into());
        }
        return trials(&a, &plan, out);
    }
    let rows = if a.loopback {
        loopback(&a, &plan, out)?
    } else {
        let ip = device_ip(a.ip)?;
        let role = match &a.host {
            Some(h) => Role::Client(h.clone(), a.port),
            None => Role::Server(listen(ip, a.port)?),
        };
        run_side(&plan, &a.ib_dev, ip, role, out, None)?
    };
    let b = plan_baseline(&a, &plan);
    if a.loopback {
        baseline::compare(&b, &rows, baseline::Kind::Udp, out)?;
    }
    if a.compare_tcp {
        baseline::compare(&b, &rows, baseline::Kind::Tcp, out)?;
    }
    Ok(())
}

/// `--trials N --loopback`: N rounds of (softroce test, UDP baseline, TCP baseline with
/// --compare-tcp), each round printed as a single run prints it, then the medians.
fn trials(a: &PerfArgs, plan: &Plan, out: Out) -> Result<(), BoxError> {
    let b = plan_baseline(a, plan);
    let (mut udp, mut tcp) = (Vec::new(), Vec::new());
    for t in 0..a.trials {
        out.line(format!(" ---- trial {} of {}", t + 1, a.trials));
        let rows = loopback(a, plan, out)?;
        udp.push(baseline::compare(&b, &rows, baseline::Kind::Udp, out)?);
        if a.compare_tcp {
            tcp.push(baseline::compare(&b, &rows, baseline::Kind::Tcp, out)?);
        }
    }
    out.line(report::LINE);
    baseline::summarize(&b, &udp, baseline::Kind::Udp.name(plan.test.is_lat()), out);
    if a.compare_tcp {
        baseline::summarize(&b, &tcp, baseline::Kind::Tcp.name(plan.test.is_lat()), out);
    }
    Ok(())
}

fn plan_baseline(a: &PerfArgs, plan: &Plan) -> baseline::Plan {
    baseline::Plan {
        lat: plan.test.is_lat(),
        sizes: plan.sizes.clone(),
        iters: match plan.limit {
            Limit::Iters(n) => n,
            Limit::Duration(_) => a.iters.unwrap_or(5000),
        },
        mtu_bytes: plan.mtu.bytes(),
        ip: a.ip.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        peer_ip: a.peer_ip.unwrap_or(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))),
        read: matches!(a.test, PerfTest::ReadLat),
        busy_poll: a.busy_poll,
        cpus: a.cpus,
    }
}

fn listen(ip: IpAddr, port: u16) -> Result<TcpListener, BoxError> {
    let unspecified = if ip.is_ipv4() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    };
    TcpListener::bind(SocketAddr::new(unspecified, port))
        .map_err(|e| format!("Couldn't listen to port {port}: {e}").into())
}

/// Server and client in one process: the server on `--ip` (default 127.0.0.1) in a thread,
/// quiet; the client on `--peer-ip` (default 127.0.0.2), printing. Returns the client's rows.
fn loopback(a: &PerfArgs, plan: &Plan, out: Out) -> Result<Vec<Row>, BoxError> {
    let sip = a.ip.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let cip = a.peer_ip.unwrap_or(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)));
    let listener = crate::listen_on(sip)?;
    let port = listener.local_addr()?.port();
    let splan = plan.clone();
    let sdev = format!("{}-server", a.ib_dev);
    let quiet = Out { quiet: true, ..out };
    // The client starts once the server's device is open: a server that cannot open its
    // device (its address taken, say) is the cause of what the client would see (a refused
    // connection), so its error is the one reported.
    let (opened_tx, opened_rx) = std::sync::mpsc::sync_channel(1);
    let server = std::thread::spawn(move || {
        run_side(
            &splan,
            &sdev,
            sip,
            Role::Server(listener),
            quiet,
            Some(opened_tx),
        )
        .map_err(|e| e.to_string())
    });
    if !matches!(opened_rx.recv(), Ok(true)) {
        let s = server.join().map_err(|_| "server thread panicked")?;
        return Err(format!("server: {}", s.err().unwrap_or_default()).into());
    }
    let c = run_side(
        plan,
        &a.ib_dev,
        cip,
        Role::Client(sip.to_string(), port),
        out,
        None,
    );
    if c.is_err() {
        // The server may still wait in accept() for this client: a connection that closes at
        // once ends its wait (its handshake then fails, and the client's error is reported).
        let _ = std::net::TcpStream::connect_timeout(
            &SocketAddr::new(sip, port),
            std::time::Duration::from_secs(2),
        );
    }
    let s = server.join().map_err(|_| "server thread panicked")?;
    let rows = c.map_err(|e| format!("client: {e}"))?;
    s.map_err(|e| format!("server: {e}"))?;
    Ok(rows)
}

/// The order of one test's TCP steps after the prelude, as perftest 4.5's `main` of each
/// test performs them (counted in captures of two perftest peers). "sync" is a
/// `ctx_hand_shake` of the first QP's address; `addr` one per QP.
///
/// | test | before the traffic | per size | after |
/// |---|---|---|---|
/// | write_bw, read_bw | addr, addr, sync | – | sync, reports, close |
/// | atomic_bw | addr, addr, sync | – | sync, reports, close |
/// | send_bw | addr, sync, addr | sync, traffic, (sync with -a) | close |
/// | write_lat | addr, addr, sync, sync | – | – (no close) |
/// | read_lat | addr, addr, addr, sync | – | close (the server at once) |
/// | send_lat | addr, addr, sync | sync, traffic | close |
#[derive(Debug, Clone, Copy)]
struct Flow {
    /// Extra address exchanges after the first (each one per QP).
    addr_repeats: usize,
    /// Synchronisations after the address exchanges, before the first size.
    syncs: usize,
    /// Whether the `addr` repeats come after the syncs (true) or before.
    addr_after_syncs: bool,
}

fn flow(test: PerfTest) -> Flow {
    let f = |addr_repeats, syncs, addr_after_syncs| Flow {
        addr_repeats,
        syncs,
        addr_after_syncs,
    };
    match test {
        PerfTest::WriteBw | PerfTest::ReadBw | PerfTest::AtomicBw | PerfTest::SendLat => {
            f(1, 1, false)
        }
        PerfTest::SendBw => f(1, 1, true),
        PerfTest::WriteLat => f(1, 2, false),
        PerfTest::ReadLat => f(2, 1, false),
        PerfTest::UdpBaseline => f(0, 0, false),
    }
}

/// One side of a test, from the TCP connection to the closing handshake. Returns the rows
/// this side printed (for the server of write_bw/read_bw/atomic_bw: the client's). `opened`
/// is told whether the side's device opened, before the side waits for its peer.
fn run_side(
    plan: &Plan,
    dev_name: &str,
    ip: IpAddr,
    role: Role,
    out: Out,
    opened: Option<std::sync::mpsc::SyncSender<bool>>,
) -> Result<Vec<Row>, BoxError> {
    let test = plan.test;
    let client = matches!(role, Role::Client(..));
    // Before the device opens: its driver thread inherits this thread's CPU.
    Placement::pin_opt(plan.cpus, if client { End::Client } else { End::Server })?;
    let s = Session::open(
        dev_name,
        ip,
        &SessionSpec {
            qps: plan.qps,
            max_size: plan.max_size(),
            tx_depth: plan.tx_depth,
            rx_depth: if plan.uses_recvs() { plan.rx_depth } else { 1 },
            rd_atomic: plan.rd_atomic(),
            remote_access: !plan.uses_recvs(),
            gid_index: plan.gid_index,
        },
    );
    if let Some(tx) = opened {
        let _ = tx.send(s.is_ok());
    }
    let s = s?;
    let mut oob = match role {
        Role::Client(host, port) => Oob::new(crate::exchange::connect(&host, port)?, true),
        Role::Server(listener) => {
            out.line("\n************************************");
            out.line("* Waiting for client to connect... *");
            out.line("************************************");
            let (tcp, peer) = listener
                .accept()
                .map_err(|e| format!("accept() failed: {e}"))?;
            Oob::new(crate::exchange::Conn::accepted(tcp, peer), false)
        }
    };
    let pre = oob.prelude(plan.mtu)?;
    print_info(plan, client, &pre, out, &s);

    let f = flow(test);
    let me0 = s.me[0];
    let peers = oob.addresses(&s.me)?;
    s.connect(&peers, pre.mtu, plan.gid_index)?;
    if !f.addr_after_syncs {
        for _ in 0..f.addr_repeats {
            oob.addresses(&s.me)?;
        }
    }
    for _ in 0..f.syncs {
        oob.sync(&me0)?;
    }
    if f.addr_after_syncs {
        for _ in 0..f.addr_repeats {
            oob.addresses(&s.me)?;
        }
    }
    let keys = test.is_lat() && test != PerfTest::SendLat;
    // The run itself may take long: the steps after it wait for the peer without deadline.
    oob.without_deadline();
    for (m, p) in s.me.iter().zip(&peers) {
        for l in m.describe("local", plan.rd_atomic(), keys) {
            out.line(l);
        }
        for l in p.describe("remote", plan.rd_atomic(), keys) {
            out.line(l);
        }
    }

    let mut rows = Vec::new();
    let tname = test.name();
    match test {
        PerfTest::WriteBw | PerfTest::ReadBw | PerfTest::AtomicBw => {
            let op = match (test, plan.atomic) {
                (PerfTest::WriteBw, _) => BwOp::Write,
                (PerfTest::ReadBw, _) => BwOp::Read,
                (_, AtomicType::FetchAndAdd) => BwOp::FetchAdd,
                (_, AtomicType::CmpAndSwap) => BwOp::CmpSwap,
            };
            out.bw_header();
            let mut last = None;
            if client {
                for &size in &plan.sizes {
                    let r =
                        bw::client(&s, &peers, op, size, plan.limit, plan.tx_depth, plan.cq_mod)?;
                    out.bw_row(tname, &r);
                    rows.push(Row::Bw(r));
                    last = Some(r);
                }
            }
            oob.sync(&me0)?;
            let mine = last.map_or(
                oob::BwReport {
                    size: 0,
                    iters: 0,
                    bw_peak: 0.0,
                    bw_avg: 0.0,
                    msg_rate: 0.0,
                },
                |r| oob::BwReport {
                    size: r.size,
                    iters: r.iters,
                    bw_peak: r.bw_peak,
                    bw_avg: r.bw_avg,
                    msg_rate: r.msg_rate,
                },
            );
            let theirs = oob.reports(&mine)?;
            if !client {
                let r = BwResult {
                    size: theirs.size,
                    iters: theirs.iters,
                    bw_peak: theirs.bw_peak,
                    bw_avg: theirs.bw_avg,
                    msg_rate: theirs.msg_rate,
                };
                out.bw_row(tname, &r);
                rows.push(Row::Bw(r));
            }
            oob.close(&me0)?;
        }
        PerfTest::SendBw => {
            out.bw_header();
            for &size in &plan.sizes {
                let mut initial = vec![0u64; s.qps.len()];
                if !client {
                    let first = match plan.limit {
                        Limit::Iters(n) => n.min(u64::from(plan.rx_depth)),
                        Limit::Duration(_) => u64::from(plan.rx_depth),
                    };
                    for (i, n) in initial.iter_mut().enumerate() {
                        bw::post_recvs(&s, i, size, first)?;
                        *n = first;
                    }
                }
                oob.sync(&me0)?;
                let r = if client {
                    bw::client(
                        &s,
                        &peers,
                        BwOp::Send,
                        size,
                        plan.limit,
                        plan.tx_depth,
                        plan.cq_mod,
                    )?
                } else {
                    bw::server(&s, size, plan.limit, plan.rx_depth, &initial)?
                };
                out.bw_row(tname, &r);
                rows.push(Row::Bw(r));
                if plan.sizes.len() > 1 {
                    oob.sync(&me0)?;
                }
            }
            oob.close(&me0)?;
        }
        PerfTest::WriteLat | PerfTest::SendLat | PerfTest::ReadLat => {
            let op = match test {
                PerfTest::WriteLat => LatOp::Write,
                PerfTest::SendLat => LatOp::Send,
                _ => LatOp::Read,
            };
            let duration = matches!(plan.limit, Limit::Duration(_));
            if op == LatOp::Read && !client {
                oob.close(&me0)?;
                out.line(report::LINE);
            } else {
                out.lat_header(duration);
                for &size in &plan.sizes {
                    let mut posted = 0;
                    if op == LatOp::Send {
                        posted = match plan.limit {
                            Limit::Iters(n) => n.min(u64::from(plan.rx_depth)),
                            Limit::Duration(_) => u64::from(plan.rx_depth),
                        };
                        bw::post_recvs(&s, 0, size, posted)?;
                        oob.sync(&me0)?;
                    }
                    let r = lat::run(
                        &s,
                        &peers[0],
                        lat::LatRun {
                            op,
                            size,
                            limit: plan.limit,
                            client,
                            rx_depth: u64::from(plan.rx_depth),
                            recvs_posted: posted,
                        },
                    )?;
                    out.lat_row(tname, &r);
                    rows.push(Row::Lat(r));
                }
                if op != LatOp::Write {
                    oob.close(&me0)?;
                }
            }
        }
        PerfTest::UdpBaseline => {}
    }
    if test != PerfTest::ReadLat || client {
        out.line(report::LINE);
    }
    if plan.counters {
        quiesce(&s.dev);
        let link = s.dev.link();
        let tx = link.tx_datagrams.load(std::sync::atomic::Ordering::Relaxed);
        let rx = link.rx_datagrams.load(std::sync::atomic::Ordering::Relaxed);
        let mut line = format!("counters: tx_datagrams={tx} rx_datagrams={rx}");
        for (name, v) in s.dev.counters().entries() {
            line.push_str(&format!(" {name}={v}"));
        }
        out.line(line);
    }
    Ok(rows)
}

/// perftest's `ctx_print_test_info` (the lines that apply to softroce).
fn print_info(plan: &Plan, client: bool, pre: &oob::Prelude, out: Out, s: &Session) {
    let title = match (plan.test, plan.atomic) {
        (PerfTest::WriteBw, _) => "RDMA_Write BW Test".to_string(),
        (PerfTest::ReadBw, _) => "RDMA_Read BW Test".to_string(),
        (PerfTest::SendBw, _) => "Send BW Test".to_string(),
        (PerfTest::AtomicBw, AtomicType::FetchAndAdd) => "Atomic FETCH_AND_ADD BW Test".to_string(),
        (PerfTest::AtomicBw, AtomicType::CmpAndSwap) => "Atomic CMP_AND_SWAP BW Test".to_string(),
        (PerfTest::WriteLat, _) => "RDMA_Write Latency Test".to_string(),
        (PerfTest::SendLat, _) => "Send Latency Test".to_string(),
        (PerfTest::ReadLat, _) => "RDMA_Read Latency Test".to_string(),
        (PerfTest::UdpBaseline, _) => String::new(),
    };
    out.line(report::LINE);
    out.line(format!("                    {title}"));
    out.line(format!(
        " Number of qps   : {}\t\tTransport type : IB",
        plan.qps
    ));
    out.line(" Connection type : RC\t\tUsing SRQ      : OFF");
    if client {
        out.line(format!(" TX depth        : {}", plan.tx_depth));
        if !plan.test.is_lat() {
            out.line(format!(" CQ Moderation   : {}", plan.cq_mod));
        }
    } else if plan.uses_recvs() {
        out.line(format!(" RX depth        : {}", plan.rx_depth));
    }
    out.line(format!(" Mtu             : {}[B]", pre.mtu.bytes()));
    out.line(" Link type       : Ethernet");
    out.line(format!(" GID index       : {}", plan.gid_index));
    if plan.rd_atomic() {
        out.line(format!(" Outstand reads  : {}", s.me[0].out_reads));
    }
    if plan.cpus.is_some() {
        out.line(format!(
            " CPUs            : {}",
            Placement::describe(plan.cpus)
        ));
    }
    out.line(format!(
        " Data ex. method : Ethernet (peer exchange version {})",
        pre.their_version
    ));
    out.line(report::LINE);
}
