//! Baselines on loopback, to put softroce's numbers in proportion: what the kernel's UDP and
//! TCP do between two sockets of this process with the same sizes.
//!
//! - UDP stream: each message of `-s` bytes as the RoCE data path carries it at this MTU,
//!   `ceil(size / mtu)` datagrams of `min(size, mtu) + 16` bytes (the payload plus a BTH and
//!   the ICRC; the last the rest of the payload + 16), sent and received with the data
//!   path's batching (`net::batch`): UDP GSO sends of up to 64 segments and 65,507 bytes
//!   (`sendmmsg` when the kernel refuses GSO), `recvmmsg` of 8 with UDP GRO; a credit
//!   window stands in for RC's ACKs; the receiver counts the payload that arrived (see
//!   [`udp_stream`]). `udp-baseline` prints the datagrams per system call ([`Batching`]).
//! - UDP ping-pong: the same datagrams echoed one message at a time (one `send_to` for a
//!   message of one datagram, as the data path sends a lone packet).
//! - TCP stream and ping-pong (`--compare-tcp`): the messages themselves on one connection.
//!
//! Bandwidth is in perftest's MB/s (2^20 bytes), latency in perftest's way (the gap between
//! consecutive sends, halved for a ping-pong unless the test is read_lat, whose latency is
//! a whole round trip).

use super::Row;
use super::cpu::{End, Placement};
use super::report::{BwResult, Compared, LatResult, Out};
use crate::BoxError;
use rustix::net::sockopt;
use socket2::{Domain, Protocol, Socket, Type};
use softroce::net::batch::{self, GSO_MAX_BYTES, GSO_MAX_SEGMENTS, RecvBatch};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// BTH (12 bytes) and ICRC (4) around every RoCE payload.
const ROCE_OVERHEAD_BYTES: usize = 16;
/// Socket buffers asked for (the kernel caps them at `net.core.[rw]mem_max`).
const UDP_BUF_BYTES: usize = 8 << 20;
/// Most messages a baseline runs (a `-D` test may have run many more).
const MAX_ITERS: u64 = 200_000;

/// What the baselines run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Latency (ping-pong) rather than bandwidth (stream).
    pub lat: bool,
    /// Message sizes, bytes.
    pub sizes: Vec<u32>,
    /// Messages per size.
    pub iters: u64,
    /// Path MTU, bytes.
    pub mtu_bytes: u32,
    /// One end's address.
    pub ip: IpAddr,
    /// The other end's address.
    pub peer_ip: IpAddr,
    /// read_lat: a latency sample is a whole round trip.
    pub read: bool,
    /// `--busy-poll`: the ping-pong's receivers spin on non-blocking receives, as softroce's
    /// busy-polling threads do, instead of sleeping in the kernel.
    pub busy_poll: bool,
    /// `--cpus`: each baseline's ends run where the test's ends ran.
    pub cpus: Option<Placement>,
}

/// The transport of a baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Datagrams shaped as the RoCE data path's.
    Udp,
    /// One TCP connection.
    Tcp,
}

impl Kind {
    pub fn name(self, lat: bool) -> &'static str {
        match (self, lat) {
            (Kind::Udp, false) => "udp-stream",
            (Kind::Udp, true) => "udp-pingpong",
            (Kind::Tcp, false) => "tcp-stream",
            (Kind::Tcp, true) => "tcp-pingpong",
        }
    }
}

/// `softroce perf udp-baseline`: the UDP stream and ping-pong for every size, as perftest
/// rows.
pub fn udp_baseline(p: &Plan, out: Out) -> Result<(), BoxError> {
    out.line(format!(
        " UDP baseline on loopback ({} -> {}, {}), MTU {} B: {}-byte datagrams carry each message",
        p.ip,
        p.peer_ip,
        Placement::describe(p.cpus),
        p.mtu_bytes,
        p.sizes
            .iter()
            .map(|s| (*s.min(&p.mtu_bytes) as usize + ROCE_OVERHEAD_BYTES).to_string())
            .collect::<Vec<_>>()
            .join("/")
    ));
    out.line(" UDP stream:");
    out.bw_header();
    let mut batching = Vec::new();
    for &size in &p.sizes {
        let (r, b) = udp_stream(p, size, p.iters.min(MAX_ITERS))?;
        out.bw_row("udp-stream", &r);
        batching.push((size, b));
    }
    for (size, b) in batching.drain(..) {
        b.report("udp-stream", size, out);
    }
    out.line(" UDP ping-pong:");
    out.lat_header(false);
    for &size in &p.sizes {
        let (r, b) = udp_pingpong(p, size, p.iters.clamp(5, MAX_ITERS))?;
        out.lat_row("udp-pingpong", &r);
        batching.push((size, b));
    }
    for (size, b) in batching {
        b.report("udp-pingpong", size, out);
    }
    out.line(super::report::LINE);
    Ok(())
}

/// Runs the baseline of `kind` for each softroce row and prints both with the ratio
/// softroce / baseline (bandwidth: average MB/s; latency: typical us).
/// Measures the `kind` baseline for each of `rows` (same sizes and iterations), prints each
/// beside softroce's figure with the ratio, and returns the comparisons.
pub fn compare(p: &Plan, rows: &[Row], kind: Kind, out: Out) -> Result<Vec<Compared>, BoxError> {
    let mut done = Vec::new();
    if rows.is_empty() {
        return Ok(done);
    }
    let name = kind.name(p.lat);
    out.line(format!(
        " softroce vs {name} on loopback, {} (ratio = softroce / {name}):",
        Placement::describe(p.cpus)
    ));
    for row in rows {
        let c = match row {
            Row::Bw(r) => {
                let size = u32::try_from(r.size).unwrap_or(u32::MAX);
                let iters = r.iters.clamp(1, MAX_ITERS);
                let b = match kind {
                    Kind::Udp => udp_stream(p, size, iters)?.0,
                    Kind::Tcp => tcp_stream(p, size, iters)?,
                };
                Compared {
                    what: format!("BW average {} B", r.size),
                    unit: "MB/sec",
                    ours: r.bw_avg,
                    theirs: b.bw_avg,
                }
            }
            Row::Lat(r) => {
                let (size, iters) = match r {
                    LatResult::Iters(s) => (s.size, s.iters),
                    LatResult::Duration(d) => (d.size, d.iters),
                };
                let size = u32::try_from(size).unwrap_or(u32::MAX);
                let iters = iters.clamp(5, MAX_ITERS / 10);
                let b = match kind {
                    Kind::Udp => udp_pingpong(p, size, iters)?.0,
                    Kind::Tcp => tcp_pingpong(p, size, iters)?,
                };
                Compared {
                    what: format!("t_typical {size} B"),
                    unit: "usec",
                    ours: r.typical(),
                    theirs: b.typical(),
                }
            }
        };
        out.compare(&c, name);
        done.push(c);
    }
    Ok(done)
}

/// Prints, per compared row, the median ratio over interleaved trials with its range and
/// the medians of both figures (`--trials`): on a shared, noisy machine one trial's ratio
/// can be off by 2x either way.
pub fn summarize(p: &Plan, trials: &[Vec<Compared>], name: &str, out: Out) {
    let Some(first) = trials.first() else { return };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        match n {
            0 => 0.0,
            _ if n % 2 == 1 => v[n / 2],
            _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    };
    out.line(format!(
        " softroce vs {name}: median of {} interleaved trials, {} (ratio range in brackets):",
        trials.len(),
        Placement::describe(p.cpus)
    ));
    for (i, row) in first.iter().enumerate() {
        let col: Vec<&Compared> = trials.iter().filter_map(|t| t.get(i)).collect();
        let ratios: Vec<f64> = col.iter().map(|c| c.ratio()).collect();
        let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let medians = Compared {
            what: row.what.clone(),
            unit: row.unit,
            ours: median(col.iter().map(|c| c.ours).collect()),
            theirs: median(col.iter().map(|c| c.theirs).collect()),
        };
        out.summary(&medians, name, median(ratios), (lo, hi), col.len());
    }
}

fn udp_socket(ip: IpAddr) -> Result<UdpSocket, BoxError> {
    let sock = Socket::new(
        Domain::for_address(SocketAddr::new(ip, 0)),
        Type::DGRAM,
        Some(Protocol::UDP),
    )?;
    // As the data path's receive socket: SO_RCVBUFFORCE when root, else up to rmem_max.
    if sockopt::set_socket_recv_buffer_size_force(&sock, UDP_BUF_BYTES).is_err() {
        let _ = sock.set_recv_buffer_size(UDP_BUF_BYTES);
    }
    let _ = sock.set_send_buffer_size(UDP_BUF_BYTES);
    if ip.is_ipv4() {
        // As the data path's send sockets: DF set, IPv4 ID 0 on lone datagrams.
        let _ = sockopt::set_ip_mtu_discover(&sock, sockopt::Ipv4PathMtuDiscovery::DO);
    }
    sock.bind(&SocketAddr::new(ip, 0).into())
        .map_err(|e| format!("UDP baseline: cannot bind {ip}: {e}"))?;
    Ok(sock.into())
}

/// The datagrams of one message: (count, bytes of each but the last, bytes of the last).
fn segments(size: u32, mtu: u32) -> (u64, usize, usize) {
    let per = size.min(mtu).max(1);
    let count = size.div_ceil(per).max(1);
    let last = size.saturating_sub((count - 1) * per).max(1);
    (
        u64::from(count),
        per as usize + ROCE_OVERHEAD_BYTES,
        last as usize + ROCE_OVERHEAD_BYTES,
    )
}

/// Most datagrams of `dgram` bytes one send carries, as the data path batches them: at most
/// [`GSO_MAX_SEGMENTS`] and [`GSO_MAX_BYTES`] in all.
fn max_batch(dgram: usize) -> usize {
    (GSO_MAX_BYTES / dgram.max(1)).clamp(1, GSO_MAX_SEGMENTS)
}

/// Receive slots of one `recvmmsg`, as the data path's driver thread uses.
const RECV_SLOTS: usize = 8;

/// How a baseline's datagrams went through the kernel: system calls on either side and how
/// many datagrams each carried (UDP GSO / `sendmmsg` on send, UDP GRO / `recvmmsg` on
/// receive, as the data path does; `net::batch`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Batching {
    /// Datagrams sent.
    pub datagrams_sent: u64,
    /// Send system calls (`sendto`, `sendmsg` with `UDP_SEGMENT`, `sendmmsg`).
    pub send_calls: u64,
    /// Of those, UDP GSO sends.
    pub gso_sends: u64,
    /// Datagrams received.
    pub datagrams_received: u64,
    /// Receive system calls (`recvmmsg`).
    pub recv_calls: u64,
    /// Received buffers that held more than one datagram (UDP GRO).
    pub gro_buffers: u64,
}

impl Batching {
    /// Datagrams per send system call.
    pub fn per_send(&self) -> f64 {
        self.datagrams_sent as f64 / self.send_calls.max(1) as f64
    }

    /// Datagrams per receive system call.
    pub fn per_recv(&self) -> f64 {
        self.datagrams_received as f64 / self.recv_calls.max(1) as f64
    }

    fn add(&mut self, o: &Batching) {
        self.datagrams_sent += o.datagrams_sent;
        self.send_calls += o.send_calls;
        self.gso_sends += o.gso_sends;
        self.datagrams_received += o.datagrams_received;
        self.recv_calls += o.recv_calls;
        self.gro_buffers += o.gro_buffers;
    }

    /// Prints the batching of the baseline `name` for `size`-byte messages: a text line, or
    /// with `--json` one object (`"test": "<name>-batching"`).
    fn report(&self, name: &str, size: u32, out: Out) {
        if out.quiet {
        } else if out.json {
            println!(
                "{}",
                serde_json::json!({
                    "test": format!("{name}-batching"),
                    "bytes": size,
                    "datagrams_sent": self.datagrams_sent,
                    "send_calls": self.send_calls,
                    "gso_sends": self.gso_sends,
                    "datagrams_per_send": self.per_send(),
                    "datagrams_received": self.datagrams_received,
                    "recv_calls": self.recv_calls,
                    "gro_buffers": self.gro_buffers,
                    "datagrams_per_recv": self.per_recv(),
                })
            );
        } else {
            out.line(format!(
                " ({name} {size} B: {} datagrams in {} sends ({} UDP GSO), {:.1} per send; \
                 {} received in {} recvmmsg ({} GRO buffers), {:.1} per receive)",
                self.datagrams_sent,
                self.send_calls,
                self.gso_sends,
                self.per_send(),
                self.datagrams_received,
                self.recv_calls,
                self.gro_buffers,
                self.per_recv()
            ));
        }
    }
}

/// The kernel refused UDP GSO (as the data path judges it, `net::udp`).
fn gso_refused(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT | libc::EOPNOTSUPP)
    )
}

/// A sending socket that batches as the data path does: a run of datagrams as one UDP GSO
/// send, else (GSO refused) one `sendmmsg`; a lone datagram with `send_to`.
struct Tx {
    sock: UdpSocket,
    to: SocketAddr,
    gso: bool,
    stats: Batching,
}

impl Tx {
    fn new(sock: UdpSocket, to: SocketAddr) -> Tx {
        Tx {
            sock,
            to,
            gso: true,
            stats: Batching::default(),
        }
    }

    /// Sends `n` datagrams (1 ≤ n ≤ [`max_batch`]`(seg)`) cut from `buf`: `n - 1` of `seg`
    /// bytes, then one of `last` bytes (≤ `seg`). Errors: the kernel's.
    fn send(&mut self, buf: &[u8], seg: usize, n: usize, last: usize) -> std::io::Result<()> {
        let bytes = (n.max(1) - 1) * seg + last;
        let data = buf.get(..bytes).ok_or(std::io::ErrorKind::InvalidInput)?;
        let fd = self.sock.as_raw_fd();
        if n <= 1 {
            self.sock.send_to(data, self.to)?;
            self.stats.send_calls += 1;
            self.stats.datagrams_sent += 1;
            return Ok(());
        }
        if self.gso {
            self.stats.send_calls += 1;
            match batch::send_gso(fd, &self.to, data, seg as u16) {
                Ok(()) => {
                    self.stats.gso_sends += 1;
                    self.stats.datagrams_sent += n as u64;
                    return Ok(());
                }
                Err(e) if gso_refused(&e) => self.gso = false,
                Err(e) => return Err(e),
            }
        }
        let parts: Vec<&[u8]> = data.chunks(seg).collect();
        let mut k = 0;
        while k < parts.len() {
            self.stats.send_calls += 1;
            k += batch::send_mmsg(fd, &self.to, &parts[k..])?;
        }
        self.stats.datagrams_sent += parts.len() as u64;
        Ok(())
    }
}

/// A receiving socket that batches as the data path's driver thread does: UDP GRO on (when
/// the kernel has it) and `recvmmsg` of [`RECV_SLOTS`].
struct Rx {
    sock: UdpSocket,
    batch: RecvBatch,
    stats: Batching,
    /// Spin on non-blocking receives (for at most the socket's 2 s) instead of blocking.
    spin: bool,
}

impl Rx {
    fn new(sock: UdpSocket) -> Rx {
        // Refused before Linux 5.0: datagrams then come one per buffer.
        let _ = batch::enable_gro(sock.as_raw_fd());
        Rx {
            sock,
            batch: RecvBatch::new(RECV_SLOTS),
            stats: Batching::default(),
            spin: false,
        }
    }

    /// One `recvmmsg` (blocking up to the socket's read timeout for the first datagram);
    /// calls `each(datagram bytes)` for every datagram of every buffer. Errors: the
    /// kernel's (`EAGAIN` on timeout).
    fn recv(&mut self, mut each: impl FnMut(&[u8])) -> std::io::Result<()> {
        if self.spin {
            let until = Instant::now() + Duration::from_secs(2);
            loop {
                match self.batch.recv(self.sock.as_raw_fd(), false) {
                    Ok(_) => break,
                    Err(e)
                        if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < until =>
                    {
                        std::hint::spin_loop();
                    }
                    Err(e) => return Err(e),
                }
            }
        } else {
            self.batch.recv(self.sock.as_raw_fd(), true)?;
        }
        self.stats.recv_calls += 1;
        for r in self.batch.received() {
            let mut n = 0;
            for d in r.segments() {
                n += 1;
                each(d);
            }
            self.stats.datagrams_received += n;
            if n > 1 {
                self.stats.gro_buffers += 1;
            }
        }
        Ok(())
    }
}

/// Bytes of datagrams the UDP stream keeps in flight: half the receive buffer the data
/// path's socket gets ([`UDP_BUF_BYTES`], forced as root; the kernel doubles it for
/// bookkeeping, so a quarter of what it holds), and the same fraction without root when
/// `net.core.rmem_max` is 4 MiB. Measured on loopback with 64 KiB messages at MTU 4096
/// (release, 4-5 runs each, MB/s): 1 MiB 3,800-4,600, 2 MiB 3,300-4,700, 4 MiB
/// 4,600-5,300, 8 MiB 1,400-3,400 (credits wait behind a full queue); so a smaller window
/// would throttle the kernel and a larger one only adds queueing.
const UDP_WINDOW_BYTES: usize = 4 << 20;

/// A raw UDP stream of `iters` messages of `size` bytes, segmented as RoCE at the MTU and
/// batched as the data path batches ([`Tx`], [`Rx`]: UDP GSO sends of up to
/// [`max_batch`] datagrams, `recvmmsg` with UDP GRO). Raw UDP has no flow control, and a
/// sender that outruns the receiver only measures drops; so, like RC's ACKs, the receiver
/// returns a 1-byte credit every quarter window (after each receive batch, as the data
/// path's ACKs leave) and the sender keeps at most a window ([`UDP_WINDOW_BYTES`], rounded
/// down to whole sends of [`max_batch`] datagrams) unacknowledged. A credit that does not
/// come within 20 ms (datagrams lost) releases the window. Bandwidth is the payload that
/// arrived over the time from the first send to the last arrival, as perftest times from
/// the first post to the last completion (a batched receiver may take everything in a
/// few calls, so the time between arrivals measures nothing for short runs).
pub fn udp_stream(p: &Plan, size: u32, iters: u64) -> Result<(BwResult, Batching), BoxError> {
    let (per_msg, dgram, last_dgram) = segments(size, p.mtu_bytes);
    let most = max_batch(dgram) as u64;
    // A credit stands for whole sends, so the window never cuts a send short.
    let credit_every = ((UDP_WINDOW_BYTES / dgram) as u64 / 4 / most).max(1) * most;
    let window = 4 * credit_every;
    let rx = udp_socket(p.peer_ip)?;
    let tx = udp_socket(p.ip)?;
    let (to, back) = (rx.local_addr()?, tx.local_addr()?);
    rx.set_read_timeout(Some(Duration::from_millis(200)))?;
    tx.set_read_timeout(Some(Duration::from_millis(20)))?;
    let total = per_msg * iters;
    // GRO on before the first datagram comes (the kernel segments what it queued before).
    let mut rx = Rx::new(rx);
    // With --busy-poll the receiver spins, as softroce's polling thread then does.
    rx.spin = p.busy_poll;
    let cpus = p.cpus;
    Placement::pin_opt(cpus, End::Server)?;
    let sender = std::thread::spawn(move || -> std::io::Result<(Instant, Batching)> {
        Placement::pin_opt(cpus, End::Client).map_err(std::io::Error::other)?;
        let buf = vec![0x5au8; GSO_MAX_BYTES];
        let mut credit = [0u8; 8];
        let credits = tx.try_clone()?;
        let mut tx = Tx::new(tx, to);
        let (mut sent, mut acked) = (0u64, 0u64);
        let started = Instant::now();
        while sent < total {
            while sent - acked >= window {
                match credits.recv(&mut credit) {
                    Ok(_) => acked += credit_every,
                    Err(_) => acked = sent,
                }
            }
            // The next run: what the window allows, ending at the message's short last
            // datagram if it has one (a GSO send's segments are equal but the last).
            let left_in_msg = per_msg - sent % per_msg;
            let mut n = most.min(window - (sent - acked)).min(total - sent);
            let last = if last_dgram < dgram && n >= left_in_msg {
                n = left_in_msg;
                last_dgram
            } else {
                dgram
            };
            tx.send(&buf, dgram, n as usize, last)?;
            sent += n;
        }
        Ok((started, tx.stats))
    });
    let mut got = 0u64;
    let mut bytes = 0u64;
    let mut next_credit = credit_every;
    let mut last = None;
    while got < total {
        let r = rx.recv(|d| {
            got += 1;
            bytes += d.len().saturating_sub(ROCE_OVERHEAD_BYTES) as u64;
        });
        if r.is_err() {
            break;
        }
        last = Some(Instant::now());
        while got >= next_credit {
            let _ = rx.sock.send_to(&[1], back);
            next_credit += credit_every;
        }
    }
    let (started, mut stats) = sender
        .join()
        .map_err(|_| "UDP sender panicked")?
        .map_err(|e| format!("UDP baseline send: {e}"))?;
    stats.add(&rx.stats);
    let last = last.unwrap_or(started);
    let secs = last
        .saturating_duration_since(started)
        .as_secs_f64()
        .max(1e-9);
    let avg = bytes as f64 / secs / f64::from(1u32 << 20);
    if got < total {
        eprintln!(" (udp-stream {size} B: {got} of {total} datagrams arrived)");
    }
    Ok((
        BwResult {
            size: u64::from(size),
            iters,
            bw_peak: avg,
            bw_avg: avg,
            msg_rate: got as f64 / per_msg as f64 / secs / 1e6,
        },
        stats,
    ))
}

/// A raw UDP ping-pong: each message's datagrams out (batched as in [`udp_stream`]; one
/// `send_to` when the message fits one datagram, as the data path sends a lone packet),
/// received with `recvmmsg` + GRO and echoed back the same way, then the next.
pub fn udp_pingpong(p: &Plan, size: u32, iters: u64) -> Result<(LatResult, Batching), BoxError> {
    let (per_msg, dgram, last_dgram) = segments(size, p.mtu_bytes);
    let echo = udp_socket(p.peer_ip)?;
    let me = udp_socket(p.ip)?;
    let (echo_addr, me_addr) = (echo.local_addr()?, me.local_addr()?);
    echo.set_read_timeout(Some(Duration::from_secs(2)))?;
    me.set_read_timeout(Some(Duration::from_secs(2)))?;
    let most = max_batch(dgram) as u64;
    // Sends one message: runs of up to `most` datagrams, the short last one ending a run.
    let send_msg = move |tx: &mut Tx, buf: &[u8]| -> std::io::Result<()> {
        let mut sent = 0;
        while sent < per_msg {
            let n = most.min(per_msg - sent);
            let last = if sent + n == per_msg {
                last_dgram
            } else {
                dgram
            };
            tx.send(buf, dgram, n as usize, last)?;
            sent += n;
        }
        Ok(())
    };
    // GRO on before the first datagram comes (the kernel segments what it queued before).
    let mut tx = Tx::new(echo.try_clone()?, me_addr);
    let mut rx = Rx::new(echo);
    rx.spin = p.busy_poll;
    let cpus = p.cpus;
    Placement::pin_opt(cpus, End::Client)?;
    let echoer = std::thread::spawn(move || -> Batching {
        // The CPUs were checked when the options were read (`Placement::check`).
        if let Err(e) = Placement::pin_opt(cpus, End::Server) {
            eprintln!(" (udp-pingpong: {e})");
        }
        let buf = vec![0xa5u8; GSO_MAX_BYTES];
        let mut got = 0;
        let mut stop = false;
        while !stop {
            let r = rx.recv(|d| {
                if d.len() == 1 {
                    stop = true;
                } else {
                    got += 1;
                }
            });
            if r.is_err() {
                break;
            }
            if got == per_msg {
                got = 0;
                if send_msg(&mut tx, &buf).is_err() {
                    break;
                }
            }
        }
        if stop {
            // The end marker is no datagram of the baseline; it comes alone, after the
            // last echo, in a receive of its own.
            rx.stats.datagrams_received -= 1;
            rx.stats.recv_calls -= 1;
        }
        let mut s = tx.stats;
        s.add(&rx.stats);
        s
    });
    let buf = vec![0xa5u8; GSO_MAX_BYTES];
    let mut tx = Tx::new(me.try_clone()?, echo_addr);
    let mut rx = Rx::new(me);
    rx.spin = p.busy_poll;
    let mut posted_us = Vec::with_capacity(iters as usize);
    let start = Instant::now();
    let mut err = None;
    'outer: for _ in 0..iters {
        posted_us.push(start.elapsed().as_secs_f64() * 1e6);
        if let Err(e) = send_msg(&mut tx, &buf) {
            err = Some(e);
            break;
        }
        let mut got = 0;
        while got < per_msg {
            if let Err(e) = rx.recv(|_| got += 1) {
                err = Some(e);
                break 'outer;
            }
        }
    }
    let _ = tx.sock.send_to(&[0], echo_addr);
    let echo_stats = echoer.join().map_err(|_| "UDP echo panicked")?;
    if let Some(e) = err {
        return Err(format!("UDP ping-pong: {e} (a datagram was lost?)").into());
    }
    let mut stats = tx.stats;
    stats.add(&rx.stats);
    stats.add(&echo_stats);
    let rtt = if p.read { 1.0 } else { 2.0 };
    Ok((
        LatResult::from_posts(u64::from(size), &posted_us, rtt),
        stats,
    ))
}

fn tcp_pair(p: &Plan) -> Result<(TcpStream, TcpStream), BoxError> {
    let l = TcpListener::bind(SocketAddr::new(p.peer_ip, 0))
        .map_err(|e| format!("TCP baseline: cannot listen on {}: {e}", p.peer_ip))?;
    let a = TcpStream::connect(l.local_addr()?)?;
    let (b, _) = l.accept()?;
    a.set_nodelay(true)?;
    b.set_nodelay(true)?;
    Ok((a, b))
}

/// A TCP stream of `iters` messages of `size` bytes.
pub fn tcp_stream(p: &Plan, size: u32, iters: u64) -> Result<BwResult, BoxError> {
    let (mut a, mut b) = tcp_pair(p)?;
    let cpus = p.cpus;
    Placement::pin_opt(cpus, End::Server)?;
    let start = Instant::now();
    let len = size as usize;
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        Placement::pin_opt(cpus, End::Client).map_err(std::io::Error::other)?;
        let buf = vec![0x5au8; len];
        for _ in 0..iters {
            a.write_all(&buf)?;
        }
        Ok(())
    });
    let mut buf = vec![0u8; len.max(1)];
    for _ in 0..iters {
        b.read_exact(&mut buf)?;
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    writer
        .join()
        .map_err(|_| "TCP writer panicked")?
        .map_err(|e| format!("TCP baseline: {e}"))?;
    let avg = size as f64 * iters as f64 / secs / f64::from(1u32 << 20);
    Ok(BwResult {
        size: u64::from(size),
        iters,
        bw_peak: avg,
        bw_avg: avg,
        msg_rate: iters as f64 / secs / 1e6,
    })
}

/// A TCP ping-pong of `size`-byte messages.
pub fn tcp_pingpong(p: &Plan, size: u32, iters: u64) -> Result<LatResult, BoxError> {
    let (mut a, mut b) = tcp_pair(p)?;
    let len = size as usize;
    let cpus = p.cpus;
    Placement::pin_opt(cpus, End::Client)?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        Placement::pin_opt(cpus, End::Server).map_err(std::io::Error::other)?;
        let mut buf = vec![0u8; len];
        for _ in 0..iters {
            b.read_exact(&mut buf)?;
            b.write_all(&buf)?;
        }
        Ok(())
    });
    let out = vec![0xa5u8; len];
    let mut back = vec![0u8; len];
    let mut posted_us = Vec::with_capacity(iters as usize);
    let start = Instant::now();
    for _ in 0..iters {
        posted_us.push(start.elapsed().as_secs_f64() * 1e6);
        a.write_all(&out)?;
        a.read_exact(&mut back)?;
    }
    echo.join()
        .map_err(|_| "TCP echo panicked")?
        .map_err(|e| format!("TCP baseline: {e}"))?;
    let rtt = if p.read { 1.0 } else { 2.0 };
    Ok(LatResult::from_posts(u64::from(size), &posted_us, rtt))
}
