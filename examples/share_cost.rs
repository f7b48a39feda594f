//! What sharing one device address between processes costs a datagram, measured three ways
//! on loopback (docs/architecture.md, "A host's device"): UDP ping-pongs of 64-byte
//! RoCE-shaped datagrams between a client and an echo that
//!
//! - `direct`: owns the address's only socket (today's one process per address);
//! - `steered`: owns slot 1 of a `SO_REUSEPORT` group of 4 sockets with the
//!   `net::steer` program attached (the kernel picks the socket by the BTH QPN);
//! - `relayed`: gets each datagram from a dispatcher thread that owns the socket and passes it
//!   on over a Unix datagram socket (a per-address dispatcher's hand-off; the echo answers
//!   over UDP itself).
//!
//! Each trial is 20,000 round trips; the modes alternate for `TRIALS` rounds (default 5,
//! first argument) and the medians of the round-trip medians and 99th percentiles are
//! printed with their ranges and as ratios to `direct`.
//!
//!     cargo run --release --example share_cost [TRIALS]
//!
//! Run it in a private network namespace (`unshare -n`, `ip link set lo up`) so nothing else
//! holds 127.0.93.1:4791.

use socket2::{Domain, Protocol, Socket, Type};
use softroce::net::steer;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

const IP: Ipv4Addr = Ipv4Addr::new(127, 0, 93, 1);
const ROUNDS: usize = 20_000;

fn reuse_member() -> UdpSocket {
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).expect("socket");
    s.set_reuse_port(true).expect("SO_REUSEPORT");
    s.bind(&SocketAddr::from((IP, 4791)).into())
        .expect("bind 127.0.93.1:4791");
    s.into()
}

/// A 64-byte datagram whose BTH names QPN `qpn`.
fn datagram(qpn: u32) -> [u8; 64] {
    let mut d = [0u8; 64];
    d[0] = 0x0a; // RC RDMA WRITE only
    d[4..8].copy_from_slice(&qpn.to_be_bytes());
    d
}

/// Round trips from a client socket to `IP:4791`; returns the sorted RTTs.
fn ping(rounds: usize) -> Vec<Duration> {
    let c = UdpSocket::bind((IP, 0)).expect("client socket");
    let d = datagram(1 << steer::QPN_SHIFT | 17);
    let mut buf = [0u8; 128];
    let mut rtts = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        c.send_to(&d, (IP, 4791)).expect("send");
        c.recv_from(&mut buf).expect("echo");
        rtts.push(t.elapsed());
    }
    rtts.sort();
    rtts
}

/// One trial of `mode`: (median, 99th percentile) in µs.
fn trial(mode: &str) -> (f64, f64) {
    let stop = |s: &UdpSocket| {
        let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    };
    let rtts = std::thread::scope(|scope| match mode {
        "direct" => {
            let s = UdpSocket::bind((IP, 4791)).expect("bind 4791");
            stop(&s);
            scope.spawn(move || echo(&s));
            ping(ROUNDS)
        }
        "steered" => {
            let group: Vec<UdpSocket> = (0..4).map(|_| reuse_member()).collect();
            steer::attach(&group[0], &steer::program(4, &[]).expect("program")).expect("attach");
            stop(&group[1]);
            // The thread keeps the whole group (and so the program) until the echo ends.
            scope.spawn(move || echo(&group[1]));
            ping(ROUNDS)
        }
        _ => {
            let s = UdpSocket::bind((IP, 4791)).expect("bind 4791");
            stop(&s);
            let (tx, rx) = UnixDatagram::pair().expect("socketpair");
            let _ = rx.set_read_timeout(Some(Duration::from_millis(200)));
            let reply = UdpSocket::bind((IP, 0)).expect("reply socket");
            scope.spawn(move || {
                // The dispatcher: the address's socket, each datagram passed on with its
                // sender's address in front.
                let mut buf = [0u8; 2048];
                while let Ok((n, from)) = s.recv_from(&mut buf) {
                    let SocketAddr::V4(from) = from else { continue };
                    let mut m = Vec::with_capacity(n + 6);
                    m.extend_from_slice(&from.ip().octets());
                    m.extend_from_slice(&from.port().to_be_bytes());
                    m.extend_from_slice(&buf[..n]);
                    if tx.send(&m).is_err() {
                        break;
                    }
                }
            });
            scope.spawn(move || {
                let mut buf = [0u8; 2048];
                while let Ok(n) = rx.recv(&mut buf) {
                    if n < 6 {
                        continue;
                    }
                    let ip = Ipv4Addr::new(buf[0], buf[1], buf[2], buf[3]);
                    let port = u16::from_be_bytes([buf[4], buf[5]]);
                    let _ = reply.send_to(&buf[6..n], (ip, port));
                }
            });
            ping(ROUNDS)
        }
    });
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    (us(rtts[rtts.len() / 2]), us(rtts[rtts.len() * 99 / 100]))
}

/// Echoes every datagram back to its sender until 200 ms pass without one.
fn echo(s: &UdpSocket) {
    let mut buf = [0u8; 2048];
    while let Ok((n, from)) = s.recv_from(&mut buf) {
        let _ = s.send_to(&buf[..n], from);
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let trials: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let modes = ["direct", "steered", "relayed"];
    let mut res: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); modes.len()];
    for _ in 0..trials {
        for (i, m) in modes.iter().enumerate() {
            let (p50, p99) = trial(m);
            res[i].0.push(p50);
            res[i].1.push(p99);
            // Let the echo threads see their 200 ms of silence and go.
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    let base = median(&mut res[0].0.clone());
    let base99 = median(&mut res[0].1.clone());
    println!("UDP ping-pong, 64 B, {ROUNDS} round trips a trial, {trials} alternating trials");
    for (i, m) in modes.iter().enumerate() {
        let (p50, p99) = (&mut res[i].0.clone(), &mut res[i].1.clone());
        let (lo, hi) = (
            p50.iter().copied().fold(f64::MAX, f64::min),
            p50.iter().copied().fold(0.0, f64::max),
        );
        let (m50, m99) = (median(p50), median(p99));
        println!(
            "{m:>8}: RTT median {m50:6.2} us [{lo:.2}-{hi:.2}] ({:.2}x direct), 99% {m99:7.2} us ({:.2}x)",
            m50 / base,
            m99 / base99
        );
    }
}
