//! Baselines on loopback, to put softroce's numbers in proportion: what the kernel's UDP and
//! TCP do between two sockets of this process with the same sizes.
//!
//! - UDP stream: each message of `-s` bytes as the RoCE data path carries it at this MTU,
//!   `ceil(size / mtu)` datagrams of `min(size, mtu) + 16` bytes (the payload plus a BTH and
//!   the ICRC), one `send_to` each, with a credit window standing in for RC's ACKs; the
//!   receiver counts the payload that arrived (see [`udp_stream`]).
//! - UDP ping-pong: the same datagrams echoed one message at a time.
//! - TCP stream and ping-pong (`--compare-tcp`): the messages themselves on one connection.
//!
//! Bandwidth is in perftest's MB/s (2^20 bytes), latency in perftest's way (the gap between
//! consecutive sends, halved for a ping-pong unless the test is read_lat, whose latency is
//! a whole round trip).

use super::Row;
use super::report::{BwResult, LatResult, Out};
use crate::BoxError;
use socket2::{Domain, Protocol, Socket, Type};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
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
    fn name(self, lat: bool) -> &'static str {
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
        " UDP baseline on loopback ({} -> {}), MTU {} B: {}-byte datagrams carry each message",
        p.ip,
        p.peer_ip,
        p.mtu_bytes,
        p.sizes
            .iter()
            .map(|s| (*s.min(&p.mtu_bytes) as usize + ROCE_OVERHEAD_BYTES).to_string())
            .collect::<Vec<_>>()
            .join("/")
    ));
    out.line(" UDP stream:");
    out.bw_header();
    for &size in &p.sizes {
        let r = udp_stream(p, size, p.iters.min(MAX_ITERS))?;
        out.bw_row("udp-stream", &r);
    }
    out.line(" UDP ping-pong:");
    out.lat_header(false);
    for &size in &p.sizes {
        let r = udp_pingpong(p, size, p.iters.clamp(5, MAX_ITERS))?;
        out.lat_row("udp-pingpong", &r);
    }
    out.line(super::report::LINE);
    Ok(())
}

/// Runs the baseline of `kind` for each softroce row and prints both with the ratio
/// softroce / baseline (bandwidth: average MB/s; latency: typical us).
pub fn compare(p: &Plan, rows: &[Row], kind: Kind, out: Out) -> Result<(), BoxError> {
    if rows.is_empty() {
        return Ok(());
    }
    let name = kind.name(p.lat);
    out.line(format!(
        " softroce vs {name} on loopback (ratio = softroce / {name}):"
    ));
    for row in rows {
        match row {
            Row::Bw(r) => {
                let size = u32::try_from(r.size).unwrap_or(u32::MAX);
                let iters = r.iters.clamp(1, MAX_ITERS);
                let b = match kind {
                    Kind::Udp => udp_stream(p, size, iters)?,
                    Kind::Tcp => tcp_stream(p, size, iters)?,
                };
                out.compare(
                    &format!("BW average {} B", r.size),
                    "MB/sec",
                    r.bw_avg,
                    name,
                    b.bw_avg,
                );
            }
            Row::Lat(r) => {
                let (size, iters) = match r {
                    LatResult::Iters(s) => (s.size, s.iters),
                    LatResult::Duration(d) => (d.size, d.iters),
                };
                let size = u32::try_from(size).unwrap_or(u32::MAX);
                let iters = iters.clamp(5, MAX_ITERS / 10);
                let b = match kind {
                    Kind::Udp => udp_pingpong(p, size, iters)?,
                    Kind::Tcp => tcp_pingpong(p, size, iters)?,
                };
                out.compare(
                    &format!("t_typical {size} B"),
                    "usec",
                    r.typical(),
                    name,
                    b.typical(),
                );
            }
        }
    }
    Ok(())
}

fn udp_socket(ip: IpAddr) -> Result<UdpSocket, BoxError> {
    let sock = Socket::new(
        Domain::for_address(SocketAddr::new(ip, 0)),
        Type::DGRAM,
        Some(Protocol::UDP),
    )?;
    let _ = sock.set_recv_buffer_size(UDP_BUF_BYTES);
    let _ = sock.set_send_buffer_size(UDP_BUF_BYTES);
    sock.bind(&SocketAddr::new(ip, 0).into())
        .map_err(|e| format!("UDP baseline: cannot bind {ip}: {e}"))?;
    Ok(sock.into())
}

/// The datagrams of one message: (count, bytes each).
fn segments(size: u32, mtu: u32) -> (u64, usize) {
    let per = size.min(mtu).max(1);
    (
        u64::from(size.div_ceil(per)),
        per as usize + ROCE_OVERHEAD_BYTES,
    )
}

/// Bytes of datagrams the UDP stream keeps in flight: a quarter of what the receive buffer
/// holds when the kernel grants [`UDP_BUF_BYTES`] (it caps it at `net.core.rmem_max`, 4 MiB
/// on the test machines; the socket then gets twice the value for bookkeeping).
const UDP_WINDOW_BYTES: usize = 1 << 20;

/// A raw UDP stream of `iters` messages of `size` bytes, segmented as RoCE at the MTU. Raw
/// UDP has no flow control, and a sender that outruns the receiver only measures drops; so,
/// like RC's ACKs, the receiver returns a 1-byte credit every quarter window and the sender
/// keeps at most a window ([`UDP_WINDOW_BYTES`]) unacknowledged. A credit that does not come
/// within 20 ms (datagrams lost) releases the window. Bandwidth is the payload that arrived
/// over the time from the first arrival to the last.
pub fn udp_stream(p: &Plan, size: u32, iters: u64) -> Result<BwResult, BoxError> {
    let (per_msg, dgram) = segments(size, p.mtu_bytes);
    let payload = dgram - ROCE_OVERHEAD_BYTES;
    let window = (UDP_WINDOW_BYTES / dgram).max(4) as u64;
    let credit_every = (window / 4).max(1);
    let rx = udp_socket(p.peer_ip)?;
    let tx = udp_socket(p.ip)?;
    let (to, back) = (rx.local_addr()?, tx.local_addr()?);
    rx.set_read_timeout(Some(Duration::from_millis(200)))?;
    tx.set_read_timeout(Some(Duration::from_millis(20)))?;
    let total = per_msg * iters;
    let sender = std::thread::spawn(move || -> std::io::Result<()> {
        let buf = vec![0x5au8; dgram];
        let mut credit = [0u8; 8];
        let (mut sent, mut acked) = (0u64, 0u64);
        while sent < total {
            while sent - acked >= window {
                match tx.recv(&mut credit) {
                    Ok(_) => acked += credit_every,
                    Err(_) => acked = sent,
                }
            }
            tx.send_to(&buf, to)?;
            sent += 1;
        }
        Ok(())
    });
    let mut buf = vec![0u8; dgram + 64];
    let mut got = 0u64;
    let (mut first, mut last) = (None, Instant::now());
    while got < total {
        match rx.recv(&mut buf) {
            Ok(_) => {
                got += 1;
                last = Instant::now();
                first.get_or_insert(last);
                if got.is_multiple_of(credit_every) {
                    let _ = rx.send_to(&[1], back);
                }
            }
            Err(_) => break,
        }
    }
    sender
        .join()
        .map_err(|_| "UDP sender panicked")?
        .map_err(|e| format!("UDP baseline send: {e}"))?;
    let start = first.unwrap_or(last);
    // Arrivals after the first, over the time since the first.
    let got_timed = got.saturating_sub(1).max(1);
    let secs = last.duration_since(start).as_secs_f64().max(1e-9);
    let bytes = got_timed as f64 * payload as f64;
    let avg = bytes / secs / f64::from(1u32 << 20);
    if got < total {
        eprintln!(" (udp-stream {size} B: {got} of {total} datagrams arrived)");
    }
    Ok(BwResult {
        size: u64::from(size),
        iters,
        bw_peak: avg,
        bw_avg: avg,
        msg_rate: got_timed as f64 / per_msg as f64 / secs / 1e6,
    })
}

/// A raw UDP ping-pong: each message's datagrams out, echoed back, then the next.
pub fn udp_pingpong(p: &Plan, size: u32, iters: u64) -> Result<LatResult, BoxError> {
    let (per_msg, dgram) = segments(size, p.mtu_bytes);
    let echo = udp_socket(p.peer_ip)?;
    let me = udp_socket(p.ip)?;
    let echo_addr = echo.local_addr()?;
    echo.set_read_timeout(Some(Duration::from_secs(2)))?;
    me.set_read_timeout(Some(Duration::from_secs(2)))?;
    let echoer = std::thread::spawn(move || {
        let mut buf = vec![0u8; dgram + 64];
        while let Ok((n, from)) = echo.recv_from(&mut buf) {
            if n == 1 || echo.send_to(&buf[..n], from).is_err() {
                break;
            }
        }
    });
    let buf = vec![0xa5u8; dgram];
    let mut rbuf = vec![0u8; dgram + 64];
    let mut posted_us = Vec::with_capacity(iters as usize);
    let start = Instant::now();
    let mut err = None;
    'outer: for _ in 0..iters {
        posted_us.push(start.elapsed().as_secs_f64() * 1e6);
        for _ in 0..per_msg {
            if let Err(e) = me.send_to(&buf, echo_addr) {
                err = Some(e);
                break 'outer;
            }
        }
        for _ in 0..per_msg {
            if let Err(e) = me.recv(&mut rbuf) {
                err = Some(e);
                break 'outer;
            }
        }
    }
    let _ = me.send_to(&[0], echo_addr);
    let _ = echoer.join();
    if let Some(e) = err {
        return Err(format!("UDP ping-pong: {e} (a datagram was lost?)").into());
    }
    let rtt = if p.read { 1.0 } else { 2.0 };
    Ok(LatResult::from_posts(u64::from(size), &posted_us, rtt))
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
    let start = Instant::now();
    let len = size as usize;
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
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
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
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
