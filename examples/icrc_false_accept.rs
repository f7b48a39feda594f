//! Measures how often the plain-UDP IPv4 ICRC check accepts a corrupted packet.
//!
//! A UDP socket hides the IPv4 Identification field, which the ICRC covers, so softroce
//! accepts an IPv4 packet when *some* 16-bit ID (with DF set) makes its ICRC valid
//! (`softroce::wire::solve_ipv4_ident`). This program corrupts real-shaped RoCEv2 packets in
//! several ways and counts how many corrupted packets that check still accepts, next to the
//! exact check over the true IP header (what a raw socket or kernel rxe does).
//!
//! Run: `cargo run --release --example icrc_false_accept [-- TRIALS]` (default 2,000,000).
//! Each class of random corruption runs TRIALS × 96 / (datagram bytes + 96) times per packet
//! shape, at least TRIALS / 40, so that larger packets cost about as much CRC work; single-bit
//! flips are tried exhaustively.
//! Deterministic: a fixed seed, so the counts repeat exactly.
//!
//! Corruptions hit the UDP payload (BTH … pad ‖ ICRC), which is what a UDP socket delivers.
//! BTH byte 4 (FECN, BECN, reserved) is left alone: the ICRC masks it by design, so no check
//! can see errors there.

use softroce::rand::SplitMix64;
use softroce::wire::{IcrcIp, icrc_of_body, solve_ipv4_ident};
use std::net::Ipv4Addr;

/// The engine's seeded splitmix64, with `usize` bounds for picking bit positions.
struct Rng(SplitMix64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn below(&mut self, n: usize) -> usize {
        self.0.below(n as u64) as usize
    }
}

/// One packet shape: a UDP payload (body ‖ ICRC) as a kernel-rxe sender with IPv4 ID
/// 0x1c8 would send it.
struct Shape {
    name: &'static str,
    flow: IcrcIp,
    datagram: Vec<u8>,
}

fn shape(name: &'static str, header: &[u8], payload_bytes: usize) -> Shape {
    let flow = IcrcIp::V4 {
        src: Ipv4Addr::new(10, 77, 0, 2),
        dst: Ipv4Addr::new(10, 77, 0, 1),
        ident: 0x1c8,
        src_port: 0xc240,
        dst_port: 4791,
    };
    let mut body = header.to_vec();
    body.extend((0..payload_bytes).map(|i| (i * 7 + 3) as u8));
    let icrc = icrc_of_body(&flow, &body);
    body.extend_from_slice(&icrc);
    Shape {
        name,
        flow,
        datagram: body,
    }
}

/// Bit positions that may be corrupted: every bit of the UDP payload except BTH byte 4.
fn positions(len: usize) -> Vec<usize> {
    (0..len * 8).filter(|b| b / 8 != 4).collect()
}

/// (accepted by the plain check, accepted by the exact check) for one corrupted datagram.
fn verdicts(s: &Shape, corrupted: &[u8]) -> (bool, bool) {
    let n = corrupted.len() - 4;
    let (body, icrc) = corrupted.split_at(n);
    let mut rx = [0u8; 4];
    rx.copy_from_slice(icrc);
    let plain = solve_ipv4_ident(&s.flow, body, rx).is_some();
    let exact = icrc_of_body(&s.flow, body) == rx;
    (plain, exact)
}

#[derive(Default, Clone, Copy)]
struct Tally {
    trials: u64,
    plain: u64,
    exact: u64,
}

impl Tally {
    fn add(&mut self, (plain, exact): (bool, bool)) {
        self.trials += 1;
        self.plain += u64::from(plain);
        self.exact += u64::from(exact);
    }
    fn merge(&mut self, o: Tally) {
        self.trials += o.trials;
        self.plain += o.plain;
        self.exact += o.exact;
    }
}

fn flip(d: &mut [u8], bit: usize) {
    d[bit / 8] ^= 0x80 >> (bit % 8);
}

fn main() {
    let trials: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.replace('_', "").parse().ok())
        .unwrap_or(2_000_000);
    let shapes = [
        // RC ACKNOWLEDGE: BTH + AETH, no payload.
        shape(
            "ACK (16 B + ICRC)",
            &[
                0x11, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 7, 0x1f, 0, 0, 1,
            ],
            0,
        ),
        // RC SEND ONLY with 64 bytes.
        shape(
            "SEND 64 B (76 B + ICRC)",
            &[0x04, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, 0, 0, 7],
            64,
        ),
        // RC RDMA WRITE MIDDLE at path MTU 1024.
        shape(
            "WRITE 1024 B (1036 B + ICRC)",
            &[0x07, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 7],
            1024,
        ),
        // RC RDMA WRITE MIDDLE at path MTU 4096.
        shape(
            "WRITE 4096 B (4108 B + ICRC)",
            &[0x07, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 7],
            4096,
        ),
    ];
    let classes = [
        "single-bit (every bit)",
        "2 random bits",
        "3-8 random bits",
        "burst 2-32 bits",
        "burst 33-128 bits",
        "1-8 random bytes",
        "whole payload random",
    ];
    let mut rng = Rng(SplitMix64::new(0x5eed_0001));
    let mut totals = vec![Tally::default(); classes.len()];
    println!("plain = accepted by solving for the IPv4 ID; exact = ICRC over the true header");
    for s in &shapes {
        let len = s.datagram.len();
        let pos = positions(len);
        // Larger packets cost more CRC passes per trial: fewer trials, same total bytes.
        let n = (trials * 96 / (len as u64 + 96).max(1)).max(trials / 40);
        let mut t = vec![Tally::default(); classes.len()];
        let mut d = s.datagram.clone();
        for &bit in &pos {
            flip(&mut d, bit);
            t[0].add(verdicts(s, &d));
            flip(&mut d, bit);
        }
        for _ in 0..n {
            // 2 random distinct bits.
            let mut c = s.datagram.clone();
            let a = pos[rng.below(pos.len())];
            let mut b = pos[rng.below(pos.len())];
            while b == a {
                b = pos[rng.below(pos.len())];
            }
            flip(&mut c, a);
            flip(&mut c, b);
            t[1].add(verdicts(s, &c));
            // 3..=8 random distinct bits.
            let mut c = s.datagram.clone();
            let k = 3 + rng.below(6);
            let mut chosen: Vec<usize> = Vec::with_capacity(k);
            while chosen.len() < k {
                let p = pos[rng.below(pos.len())];
                if !chosen.contains(&p) {
                    chosen.push(p);
                    flip(&mut c, p);
                }
            }
            t[2].add(verdicts(s, &c));
            // Bursts: first and last bit flipped, the ones between at random.
            for (class, lo, hi) in [(3, 2usize, 32usize), (4, 33, 128)] {
                let mut c = s.datagram.clone();
                let blen = (lo + rng.below(hi - lo + 1)).min(len * 8);
                let start = rng.below(len * 8 - blen + 1);
                for i in 0..blen {
                    let bit = start + i;
                    if bit / 8 == 4 {
                        continue;
                    }
                    if i == 0 || i == blen - 1 || rng.next() & 1 == 1 {
                        flip(&mut c, bit);
                    }
                }
                if c == s.datagram {
                    continue;
                }
                t[class].add(verdicts(s, &c));
            }
            // 1..=8 bytes replaced by different random values.
            let mut c = s.datagram.clone();
            for _ in 0..1 + rng.below(8) {
                let mut i = rng.below(len);
                while i == 4 {
                    i = rng.below(len);
                }
                let v = rng.next() as u8;
                c[i] = if v == s.datagram[i] { !v } else { v };
            }
            t[5].add(verdicts(s, &c));
            // Every byte random (BTH byte 4 kept).
            let mut c: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            c[4] = s.datagram[4];
            if c != s.datagram {
                t[6].add(verdicts(s, &c));
            }
        }
        println!("\n{}:", s.name);
        for (name, x) in classes.iter().zip(&t) {
            println!(
                "  {name:<24} {:>10} trials  plain {:>6} ({:.2e})  exact {:>3}",
                x.trials,
                x.plain,
                x.plain as f64 / x.trials.max(1) as f64,
                x.exact
            );
        }
        for (tot, x) in totals.iter_mut().zip(&t) {
            tot.merge(*x);
        }
    }
    println!("\nAll shapes (2^-16 = {:.2e}):", 1.0 / 65536.0);
    let mut random = Tally::default();
    for (i, (name, x)) in classes.iter().zip(&totals).enumerate() {
        let rate = x.plain as f64 / x.trials.max(1) as f64;
        println!(
            "  {name:<24} {:>10} trials  plain {:>6} ({rate:.2e} = {:.2} x 2^-16)  exact {:>3}",
            x.trials,
            x.plain,
            rate * 65536.0,
            x.exact
        );
        if i > 0 {
            random.merge(*x);
        }
    }
    println!(
        "  {:<24} {:>10} trials  plain {:>6} ({:.2e})  exact {:>3}",
        "all random classes",
        random.trials,
        random.plain,
        random.plain as f64 / random.trials.max(1) as f64,
        random.exact
    );
}
