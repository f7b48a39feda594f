//! Data-path benchmark: softroce RC over UDP on loopback against same-run baselines of raw
//! UDP and TCP on the same machine, reported as ratios (issue 7 targets).
//!
//! Run (release, in a private network namespace; both devices in this process):
//!
//! ```text
//! cargo build --release --example dataplane
//! unshare -n -- sh -c 'ip link set lo up && target/release/examples/dataplane'
//! ```
//!
//! Options: `--secs S` (length of each bandwidth/rate run, default 1), `--iters N` (round trips
//! per latency run, default 20000), `--rounds R` (every measurement R times, interleaved;
//! medians reported, default 3), `--busy-poll` (the devices' busy-polling mode: the thread
//! that polls a CQ also drives the device's socket), `--no-gso` (the plain one-datagram-per-call
//! path), `--only NAME,...` (a subset of: udp_stream tcp_stream udp_rate udp_pingpong write_bw
//! read_bw write_rate send_lat write_lat).
//!
//! What is measured (threads: one per side, unpinned, on a 2-core VM the two sides share
//! the cores with the devices' driver threads):
//! - `udp_stream`: one thread sends 4112-byte datagrams (the UDP payload of an RDMA WRITE
//!   MIDDLE packet at path MTU 4096) with `send_to`, one receives; UDP payload GB/s received.
//! - `tcp_stream`: 64 KiB `write`s over TCP loopback; GB/s received.
//! - `udp_rate`: as `udp_stream` with 96-byte datagrams (a 64-byte RDMA WRITE ONLY); datagrams/s
//!   received.
//! - `udp_pingpong`: 96-byte round trips, both sides spinning on a non-blocking socket; p50 and
//!   p99 of the round trip in µs.
//! - `write_bw` / `read_bw`: RC RDMA WRITE / READ of 64 KiB messages at path MTU 4096, 32
//!   outstanding; message bytes per second.
//! - `write_rate`: 64-byte RDMA WRITEs posted 32 per `post_send`, 256 outstanding, one
//!   completion per 32 (the rest unsignaled); messages/s.
//! - `send_lat` / `write_lat`: 64-byte SEND (receive completion polled) and RDMA WRITE (last
//!   byte of the target MR polled; only with `--busy-poll`) ping-pong; round-trip p50/p99 in
//!   µs. Without `--busy-poll` the CQ is waited on (blocking), which measures the default
//!   mode's wakeups.
//!
//! Throughputs are reported per wall second and per CPU second of this process (user +
//! system, `getrusage`): the second is steadier on a machine shared with other work.
//! Ratios are of medians over the rounds.
//!
//! Every softroce run keeps every check on (ICRC, PSN, rkey); the device counters are printed
//! at the end so drops or retransmissions show (all non-zero ones with `DATAPLANE_COUNTERS=1`).

use softroce::net::{UdpDevice, UdpOptions};
use softroce::verbs::{
    AccessFlags, Cq, DeviceConfig, Gid, Mr, PathMtu, Pd, Qp, QpCap, QpInitAttr, QpType, RcConnect,
    RecvWr, SendFlags, SendWr, Wc, WcStatus, WrOpcode,
};
use std::error::Error;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

type Res<T> = Result<T, Box<dyn Error>>;

const A: &str = "127.0.23.1";
const B: &str = "127.0.23.2";
const MTU4096_MIDDLE: usize = 12 + 4096 + 4;
const WRITE_ONLY_64: usize = 12 + 16 + 64 + 4;
const BW_MSG: usize = 64 << 10;

struct Cfg {
    secs: f64,
    iters: usize,
    rounds: usize,
    opts: UdpOptions,
    busy: bool,
    only: Option<Vec<String>>,
}

impl Cfg {
    fn wants(&self, name: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|o| o.iter().any(|x| x == name))
    }
}

fn main() -> Res<()> {
    let mut cfg = Cfg {
        secs: 1.0,
        iters: 20_000,
        rounds: 3,
        opts: UdpOptions::default(),
        busy: false,
        only: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--secs" => cfg.secs = args.next().ok_or("--secs S")?.parse()?,
            "--iters" => cfg.iters = args.next().ok_or("--iters N")?.parse()?,
            "--rounds" => cfg.rounds = args.next().ok_or("--rounds R")?.parse()?,
            "--busy-poll" => cfg.busy = true,
            "--no-gso" => cfg.opts.no_offload = true,
            "--only" => {
                cfg.only = Some(
                    args.next()
                        .ok_or("--only a,b")?
                        .split(',')
                        .map(String::from)
                        .collect(),
                )
            }
            _ => return Err(format!("unknown argument {a}").into()),
        }
    }
    cfg.opts.busy_poll = cfg.busy;
    println!(
        "dataplane: secs={} iters={} busy_poll={} offload={}",
        cfg.secs, cfg.iters, cfg.busy, !cfg.opts.no_offload
    );
    let pair = Pair::open(&cfg)?;
    let mut m = Medians::default();
    for round in 0..cfg.rounds {
        if cfg.wants("udp_stream") {
            let (bytes, _, t) = udp_stream(MTU4096_MIDDLE, cfg.secs)?;
            m.rate(round, "udp_stream", bytes, t);
        }
        if cfg.wants("tcp_stream") {
            let (bytes, t) = tcp_stream(cfg.secs)?;
            m.rate(round, "tcp_stream", bytes, t);
        }
        if cfg.wants("udp_rate") {
            let (_, n, t) = udp_stream(WRITE_ONLY_64, cfg.secs)?;
            m.rate(round, "udp_rate", n, t);
        }
        if cfg.wants("udp_pingpong") {
            m.latency(
                round,
                "udp_pingpong",
                udp_pingpong(WRITE_ONLY_64, cfg.iters)?,
            );
        }
        if cfg.wants("write_bw") {
            let (bytes, t) = pair.bandwidth(WrOpcode::RdmaWrite, cfg.secs)?;
            m.rate(round, "write_bw", bytes, t);
        }
        if cfg.wants("read_bw") {
            let (bytes, t) = pair.bandwidth(WrOpcode::RdmaRead, cfg.secs)?;
            m.rate(round, "read_bw", bytes, t);
        }
        if cfg.wants("write_rate") {
            let (n, t) = pair.write_rate(cfg.secs)?;
            m.rate(round, "write_rate", n, t);
        }
        if cfg.wants("send_lat") {
            m.latency(round, "send_lat", pair.send_latency(cfg.iters)?);
        }
        // Without busy polling the target side would spin on its MR against the driver
        // threads for the cores; skipped (use --busy-poll).
        if cfg.wants("write_lat") && cfg.busy {
            m.latency(round, "write_lat", pair.write_latency(cfg.iters)?);
        }
    }
    println!(
        "medians of {} rounds; rate = per wall second, eff = per CPU second of this process",
        cfg.rounds
    );
    let gb = |v: f64| format!("{:>8.3} GB/s", v / 1e9);
    let mps = |v: f64| format!("{:>8.3} M/s ", v / 1e6);
    for (name, fmt, unit) in [
        (
            "udp_stream",
            &gb as &dyn Fn(f64) -> String,
            "4112-byte datagrams",
        ),
        ("tcp_stream", &gb, "64 KiB writes"),
        ("udp_rate", &mps, "96-byte datagrams"),
        ("write_bw", &gb, "64 KiB RDMA WRITE, MTU 4096"),
        ("read_bw", &gb, "64 KiB RDMA READ, MTU 4096"),
        ("write_rate", &mps, "64 B RDMA WRITE, 32 per post"),
    ] {
        if let (Some(r), Some(e)) = (m.get(name, false), m.get(name, true)) {
            println!("{name:<12} rate {}  eff {}  ({unit})", fmt(r), fmt(e));
        }
    }
    for name in ["udp_pingpong", "send_lat", "write_lat"] {
        if let (Some(p50), Some(p99)) = (m.get(name, false), m.get(name, true)) {
            println!("{name:<12} RTT p50 {p50:>7.2} us  p99 {p99:>8.2} us");
        }
    }
    println!("ratios (rate; eff):");
    for (num, den, target) in [
        ("write_bw", "tcp_stream", "target >= 1.0"),
        ("write_bw", "udp_stream", "target >= 0.8"),
        ("read_bw", "write_bw", "target >= 0.8"),
        ("write_rate", "udp_rate", "target >= 0.8"),
    ] {
        if let (Some(a), Some(b), Some(ae), Some(be)) = (
            m.get(num, false),
            m.get(den, false),
            m.get(num, true),
            m.get(den, true),
        ) {
            println!("  {num} / {den}: {:.2}; {:.2}  ({target})", a / b, ae / be);
        }
    }
    for num in ["send_lat", "write_lat"] {
        if let (Some(a), Some(b)) = (m.get(num, false), m.get("udp_pingpong", false)) {
            println!(
                "  {num} p50 / udp_pingpong p50: {:.2}  (target <= 1.5 with --busy-poll)",
                a / b
            );
        }
    }
    let (ca, cb) = (pair.a.dev.counters(), pair.b.dev.counters());
    if std::env::var_os("DATAPLANE_COUNTERS").is_some() {
        let nz = |c: &softroce::verbs::Counters| {
            c.entries()
                .into_iter()
                .filter(|(_, v)| *v != 0)
                .collect::<Vec<_>>()
        };
        println!(
            "all counters a: {:?}\nall counters b: {:?}",
            nz(&ca),
            nz(&cb)
        );
    }
    println!(
        "counters a: sent_pkts={} rcvd_pkts={} retransmits={} drops={} send_err={}",
        ca.sent_pkts,
        ca.rcvd_pkts,
        ca.rcvd_seq_err + ca.completer_retry_err,
        ca.dropped_total(),
        ca.send_err
    );
    println!(
        "counters b: sent_pkts={} rcvd_pkts={} retransmits={} drops={} send_err={}",
        cb.sent_pkts,
        cb.rcvd_pkts,
        cb.out_of_seq_request + cb.duplicate_request,
        cb.dropped_total(),
        cb.send_err
    );
    println!(
        "datagrams: a tx {} rx {}; b tx {} rx {}",
        pair.a.dev.link().tx_datagrams.load(Ordering::Relaxed),
        pair.a.dev.link().rx_datagrams.load(Ordering::Relaxed),
        pair.b.dev.link().tx_datagrams.load(Ordering::Relaxed),
        pair.b.dev.link().rx_datagrams.load(Ordering::Relaxed),
    );
    Ok(())
}

/// Per-metric samples over the rounds: throughputs per wall second and per CPU second of
/// the process (robust to other load on the machine), latency p50 and p99.
#[derive(Default)]
struct Medians {
    samples: std::collections::BTreeMap<(String, bool), Vec<f64>>,
    cpu_mark: f64,
}

/// User + system CPU seconds of this process so far.
fn cpu_seconds() -> f64 {
    // SAFETY: `getrusage` writes one `rusage` into the zeroed value we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is valid.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &raw mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

impl Medians {
    fn push(&mut self, name: &str, second: bool, v: f64) {
        self.samples
            .entry((name.to_string(), second))
            .or_default()
            .push(v);
    }
    /// Records `units` done in `wall` seconds, with the CPU time since the previous record.
    fn rate(&mut self, round: usize, name: &str, units: f64, wall: f64) {
        let now = cpu_seconds();
        let cpu = now - self.cpu_mark;
        self.cpu_mark = now;
        self.push(name, false, units / wall);
        self.push(name, true, units / cpu.max(1e-9));
        println!(
            "  round {round} {name:<12} {:>10.4e}/s wall, {:>10.4e}/s cpu",
            units / wall,
            units / cpu
        );
    }
    fn latency(&mut self, round: usize, name: &str, (p50, p99): (f64, f64)) {
        self.cpu_mark = cpu_seconds();
        self.push(name, false, p50);
        self.push(name, true, p99);
        println!("  round {round} {name:<12} p50 {p50:.2} us p99 {p99:.2} us");
    }
    fn get(&self, name: &str, second: bool) -> Option<f64> {
        let mut v = self.samples.get(&(name.to_string(), second))?.clone();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    }
}

fn bound(ip: &str, port: u16) -> Res<UdpSocket> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    let _ = s.set_recv_buffer_size(8 << 20);
    s.bind(&SocketAddr::new(ip.parse()?, port).into())?;
    Ok(s.into())
}

/// Bytes and datagrams received of a one-way stream of `size`-byte datagrams, and the
/// seconds it took.
fn udp_stream(size: usize, secs: f64) -> Res<(f64, f64, f64)> {
    let rx = bound(B, 40001)?;
    let tx = bound(A, 40002)?;
    rx.set_read_timeout(Some(Duration::from_millis(50)))?;
    let stop = Arc::new(AtomicBool::new(false));
    let got = Arc::new(AtomicU64::new(0));
    let r = {
        let (stop, got) = (stop.clone(), got.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            while !stop.load(Ordering::Relaxed) {
                if rx.recv(&mut buf).is_ok() {
                    got.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    let buf = vec![7u8; size];
    let dst: SocketAddr = format!("{B}:40001").parse()?;
    let start = Instant::now();
    let d = Duration::from_secs_f64(secs);
    let g0 = got.load(Ordering::Relaxed);
    while start.elapsed() < d {
        for _ in 0..64 {
            let _ = tx.send_to(&buf, dst);
        }
    }
    let n = got.load(Ordering::Relaxed) - g0;
    let t = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let _ = r.join();
    Ok((n as f64 * size as f64, n as f64, t))
}

/// Bytes received over TCP and the seconds it took.
fn tcp_stream(secs: f64) -> Res<(f64, f64)> {
    let l = TcpListener::bind(format!("{B}:40003"))?;
    let r = std::thread::spawn(move || -> u64 {
        let Ok((mut s, _)) = l.accept() else { return 0 };
        let mut buf = vec![0u8; 1 << 16];
        let mut n = 0u64;
        while let Ok(k) = s.read(&mut buf) {
            if k == 0 {
                break;
            }
            n += k as u64;
        }
        n
    });
    let mut s = TcpStream::connect(format!("{B}:40003"))?;
    let buf = vec![7u8; 1 << 16];
    let start = Instant::now();
    let d = Duration::from_secs_f64(secs);
    while start.elapsed() < d {
        s.write_all(&buf)?;
    }
    drop(s);
    let n = r.join().map_err(|_| "tcp reader panicked")?;
    Ok((n as f64, start.elapsed().as_secs_f64()))
}

fn percentiles(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.99))
}

/// Round trip p50/p99 in µs, both sides spinning on non-blocking sockets.
fn udp_pingpong(size: usize, iters: usize) -> Res<(f64, f64)> {
    let a = bound(A, 40004)?;
    let b = bound(B, 40005)?;
    a.set_nonblocking(true)?;
    b.set_nonblocking(true)?;
    let (da, db): (SocketAddr, SocketAddr) =
        (format!("{A}:40004").parse()?, format!("{B}:40005").parse()?);
    let echo = std::thread::spawn(move || {
        let mut buf = vec![0u8; 2048];
        for _ in 0..iters + 100 {
            loop {
                if let Ok(n) = b.recv(&mut buf) {
                    let _ = b.send_to(&buf[..n], da);
                    break;
                }
            }
        }
    });
    let buf = vec![1u8; size];
    let mut rb = vec![0u8; 2048];
    let mut lat = Vec::with_capacity(iters);
    for i in 0..iters + 100 {
        let t = Instant::now();
        a.send_to(&buf, db)?;
        while a.recv(&mut rb).is_err() {}
        if i >= 100 {
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    echo.join().map_err(|_| "echo panicked")?;
    Ok(percentiles(lat))
}

struct Side {
    dev: UdpDevice,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

struct Pair {
    a: Side,
    b: Side,
    busy: bool,
}

const MR_BYTES: usize = 32 * BW_MSG;

impl Pair {
    fn open(cfg: &Cfg) -> Res<Pair> {
        let side = |ip: &str, name: &str| -> Res<Side> {
            let ip: IpAddr = ip.parse()?;
            let dev = UdpDevice::open_with_options(DeviceConfig::new(name, ip), &cfg.opts)?;
            let pd = dev.alloc_pd()?;
            let cq = dev.create_cq(4096)?;
            let qp = pd.create_qp(&QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                cap: QpCap {
                    max_send_wr: 1024,
                    max_recv_wr: 1024,
                    ..QpCap::default()
                },
                sq_sig_all: false,
                srq: None,
            })?;
            let mr = pd.reg_mr(
                MR_BYTES,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            )?;
            Ok(Side {
                dev,
                _pd: pd,
                cq,
                qp,
                mr,
            })
        };
        let a = side(A, "dp_a")?;
        let b = side(B, "dp_b")?;
        for (me, peer, mine, theirs) in [(&a, &b, 100, 200), (&b, &a, 200, 100)] {
            let mut c = RcConnect::new(peer.qp.qp_num(), Gid::from_ip(peer.dev.ip()), theirs, mine);
            c.path_mtu = PathMtu::Mtu4096;
            c.max_rd_atomic = 16;
            c.max_dest_rd_atomic = 16;
            me.qp.connect_rc(&c)?;
        }
        Ok(Pair {
            a,
            b,
            busy: cfg.busy,
        })
    }

    /// Message bytes of 64 KiB WRITEs (or READs) from a to b, 32 outstanding, and seconds.
    fn bandwidth(&self, op: WrOpcode, secs: f64) -> Res<(f64, f64)> {
        let (a, b) = (&self.a, &self.b);
        let depth = if op == WrOpcode::RdmaRead { 16 } else { 32 };
        let wr = |i: u64| {
            let slot = (i as usize % 32) * BW_MSG;
            let mut w = SendWr::new(i, op, vec![a.mr.sge(slot, BW_MSG as u32)]);
            w.remote_addr = b.mr.addr() + slot as u64;
            w.rkey = b.mr.rkey();
            w
        };
        let d = Duration::from_secs_f64(secs);
        let start = Instant::now();
        let (mut posted, mut done) = (0u64, 0u64);
        let mut wcs = [Wc::default(); 32];
        while start.elapsed() < d || done < posted {
            while posted - done < depth && start.elapsed() < d {
                a.qp.post_send(&[wr(posted)])?;
                posted += 1;
            }
            let n = poll(a, &mut wcs, self.busy)?;
            done += n as u64;
        }
        Ok((done as f64 * BW_MSG as f64, start.elapsed().as_secs_f64()))
    }

    /// 64-byte WRITEs, 32 per post, one signaled per 32, 256 outstanding; and seconds.
    fn write_rate(&self, secs: f64) -> Res<(f64, f64)> {
        let (a, b) = (&self.a, &self.b);
        let batch: Vec<SendWr> = (0..32u64)
            .map(|i| {
                let mut w =
                    SendWr::new(i, WrOpcode::RdmaWrite, vec![a.mr.sge(64 * i as usize, 64)]);
                w.remote_addr = b.mr.addr() + 64 * i;
                w.rkey = b.mr.rkey();
                if i != 31 {
                    w.send_flags = SendFlags::empty();
                }
                w
            })
            .collect();
        let d = Duration::from_secs_f64(secs);
        let start = Instant::now();
        let (mut posted, mut done) = (0u64, 0u64);
        let mut wcs = [Wc::default(); 32];
        while start.elapsed() < d || done < posted {
            while posted - done < 8 && start.elapsed() < d {
                a.qp.post_send(&batch)?;
                posted += 1;
            }
            done += poll(a, &mut wcs, self.busy)? as u64;
        }
        Ok((done as f64 * 32.0, start.elapsed().as_secs_f64()))
    }

    /// SEND ping-pong of 64 bytes: RTT p50/p99 in µs.
    fn send_latency(&self, iters: usize) -> Res<(f64, f64)> {
        let (a, b) = (&self.a, &self.b);
        let total = iters + 100;
        let recv = |s: &Side| RecvWr {
            wr_id: 0,
            sg_list: vec![s.mr.sge(BW_MSG, 64)],
        };
        for s in [a, b] {
            for _ in 0..64 {
                s.qp.post_recv(&[recv(s)])?;
            }
        }
        let send = |s: &Side| {
            let mut w = SendWr::new(1, WrOpcode::Send, vec![s.mr.sge(0, 64)]);
            w.send_flags = SendFlags::SIGNALED;
            w
        };
        // Waits for the receive completion (send completions are consumed on the way).
        let wait_recv = |s: &Side| -> Res<()> {
            let mut wcs = [Wc::default(); 4];
            loop {
                let n = poll(s, &mut wcs, self.busy)?;
                for wc in &wcs[..n] {
                    if wc.status != WcStatus::Success {
                        return Err(format!("completion {:?}", wc.status).into());
                    }
                    if wc.wr_id == 0 {
                        s.qp.post_recv(&[recv(s)])?;
                        return Ok(());
                    }
                }
            }
        };
        std::thread::scope(|sc| -> Res<(f64, f64)> {
            let echo = sc.spawn(|| -> Result<(), String> {
                for _ in 0..total {
                    wait_recv(b).map_err(|e| e.to_string())?;
                    b.qp.post_send(&[send(b)]).map_err(|e| e.to_string())?;
                }
                Ok(())
            });
            let mut lat = Vec::with_capacity(iters);
            for i in 0..total {
                let t = Instant::now();
                a.qp.post_send(&[send(a)])?;
                wait_recv(a)?;
                if i >= 100 {
                    lat.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            echo.join().map_err(|_| "echo panicked")??;
            Ok(percentiles(lat))
        })
    }

    /// RDMA WRITE ping-pong of 64 bytes, each side polling the last byte of its MR slot:
    /// RTT p50/p99 in µs.
    fn write_latency(&self, iters: usize) -> Res<(f64, f64)> {
        let (a, b) = (&self.a, &self.b);
        let total = iters + 100;
        let off = 2 * BW_MSG;
        for s in [a, b] {
            s.mr.write(off, &[0u8; 64])?;
        }
        let write = |s: &Side, peer: &Side, seq: u8| -> Res<()> {
            s.mr.write(off - 64, &[seq; 64])?;
            let mut w = SendWr::new(2, WrOpcode::RdmaWrite, vec![s.mr.sge(off - 64, 64)]);
            w.remote_addr = peer.mr.addr() + off as u64;
            w.rkey = peer.mr.rkey();
            // Signal one in 64 so the send queue drains.
            w.send_flags = if seq.is_multiple_of(64) {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            };
            s.qp.post_send(&[w])?;
            Ok(())
        };
        let wait = |s: &Side, seq: u8| -> Res<()> {
            let mut last = [0u8];
            let mut wcs = [Wc::default(); 4];
            loop {
                let _ = poll(s, &mut wcs, self.busy)?;
                s.mr.read(off + 63, &mut last)?;
                if last[0] == seq {
                    return Ok(());
                }
                if !self.busy {
                    std::thread::yield_now();
                }
            }
        };
        std::thread::scope(|sc| -> Res<(f64, f64)> {
            let echo = sc.spawn(|| -> Result<(), String> {
                for i in 0..total {
                    let seq = (i % 255 + 1) as u8;
                    wait(b, seq).map_err(|e| e.to_string())?;
                    write(b, a, seq).map_err(|e| e.to_string())?;
                }
                Ok(())
            });
            let mut lat = Vec::with_capacity(iters);
            for i in 0..total {
                let seq = (i % 255 + 1) as u8;
                let t = Instant::now();
                write(a, b, seq)?;
                wait(a, seq)?;
                if i >= 100 {
                    lat.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            echo.join().map_err(|_| "echo panicked")??;
            Ok(percentiles(lat))
        })
    }
}

/// Polls `s`'s CQ once; fails on an error completion. In busy-poll mode the call also drives
/// the device's socket and never sleeps; otherwise it waits for a completion (up to 100 ms),
/// leaving the cores to the devices' driver threads.
fn poll(s: &Side, wcs: &mut [Wc], busy: bool) -> Res<usize> {
    let n = if busy {
        s.dev.poll_cq(&s.cq, wcs)
    } else {
        s.cq.wait(wcs, Duration::from_millis(100))
    };
    for wc in &wcs[..n] {
        if wc.status != WcStatus::Success {
            return Err(format!("completion {:?} wr_id {}", wc.status, wc.wr_id).into());
        }
    }
    Ok(n)
}
