//! Criterion micro-benchmarks of the per-packet work softroce itself does (no sockets):
//! header encode/decode (ns per packet), ICRC (bytes/s), PSN window arithmetic, and one
//! whole 64 KiB RDMA WRITE through two engines on the simulator (ns per packet).
//!
//! Run: `cargo bench --bench dataplane` (or `cargo bench --no-run` to build only). The
//! socket-level figures (bandwidth, message rate, latency against raw UDP and TCP) are in
//! `examples/dataplane.rs`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use softroce::net::sim::{Sim, SimFaults};
use softroce::verbs::{
    AccessFlags, Gid, PathMtu, QpCap, QpInitAttr, QpType, RcConnect, SendFlags, SendWr, Wc,
    WcStatus, WrOpcode,
};
use softroce::wire::{
    BthRepr, IcrcIp, Opcode, PacketRepr, Psn, ROCE_V2_UDP_PORT, RethRepr, RocePacket,
    icrc_of_datagram, solve_ipv4_ident,
};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

const IP: IcrcIp = IcrcIp::V4 {
    src: Ipv4Addr::new(127, 0, 23, 1),
    dst: Ipv4Addr::new(127, 0, 23, 2),
    ident: 0,
    src_port: 0xc240,
    dst_port: ROCE_V2_UDP_PORT,
};

fn write_first(payload_len: usize) -> PacketRepr {
    let mut r = PacketRepr::new(BthRepr::new(
        Opcode::RC_RDMA_WRITE_FIRST,
        0x12,
        Psn::new(0x00ff_fff0),
    ));
    r.reth = Some(RethRepr {
        va: 0x7f00_0000_1000,
        rkey: 0x1234,
        dma_len: 65536,
    });
    r.payload_len = payload_len;
    r
}

fn headers(c: &mut Criterion) {
    let mut g = c.benchmark_group("headers");
    g.throughput(Throughput::Elements(1));
    let repr = write_first(4096);
    let payload = vec![0x5au8; 4096];
    let mut buf = vec![0u8; repr.buffer_len()];
    g.bench_function("emit_headers (BTH+RETH)", |b| {
        b.iter(|| black_box(&repr).emit_headers(black_box(&mut buf)))
    });
    g.bench_function("emit 4 KiB packet (headers+copy+ICRC)", |b| {
        b.iter(|| black_box(&repr).emit(&mut buf, black_box(&payload), &IP))
    });
    repr.emit(&mut buf, &payload, &IP);
    g.bench_function("parse 4 KiB packet", |b| {
        b.iter(|| RocePacket::parse(black_box(&buf)).map(|p| p.repr.payload_len))
    });
    g.bench_function("parse + ICRC check 4 KiB packet", |b| {
        b.iter(|| RocePacket::parse(black_box(&buf)).map(|p| p.icrc_ok(&IP)))
    });
    g.finish();
}

fn icrc(c: &mut Criterion) {
    let mut g = c.benchmark_group("icrc");
    for len in [96usize, 1052, 4124] {
        let data = vec![0xa5u8; len];
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_function(format!("icrc_of_datagram {len} B"), |b| {
            b.iter(|| icrc_of_datagram(black_box(&IP), black_box(&data)))
        });
    }
    // The plain-UDP receive check of a packet whose IPv4 ID is not 0 (kernel rxe, NICs).
    let repr = write_first(4096);
    let mut buf = vec![0u8; repr.buffer_len()];
    let ip7 = match IP {
        IcrcIp::V4 {
            src,
            dst,
            src_port,
            dst_port,
            ..
        } => IcrcIp::V4 {
            src,
            dst,
            ident: 7,
            src_port,
            dst_port,
        },
        v6 => v6,
    };
    repr.emit(&mut buf, &vec![1u8; 4096], &ip7);
    let body = &buf[..buf.len() - 4];
    let got: [u8; 4] = buf[buf.len() - 4..].try_into().unwrap_or_default();
    g.throughput(Throughput::Bytes(buf.len() as u64));
    g.bench_function("solve_ipv4_ident 4 KiB", |b| {
        b.iter(|| solve_ipv4_ident(black_box(&IP), black_box(body), got))
    });
    g.finish();
}

fn psn(c: &mut Criterion) {
    let mut g = c.benchmark_group("psn");
    let base = Psn::new(0x00ff_ff00);
    g.throughput(Throughput::Elements(1024));
    g.bench_function("window check x1024 (across the 2^24 wrap)", |b| {
        b.iter(|| {
            let mut n = 0u32;
            for i in 0..1024u32 {
                let p = black_box(base).add(i);
                if p >= base && p.diff(base) < 128 {
                    n += 1;
                }
            }
            n
        })
    });
    g.bench_function("distance_from + add x1024", |b| {
        b.iter(|| {
            let mut acc = 0u32;
            for i in 0..1024u32 {
                acc = acc.wrapping_add(black_box(base).add(i).distance_from(base));
            }
            acc
        })
    });
    g.finish();
}

/// One 64 KiB WRITE (16 packets at MTU 4096, plus ACKs) through two devices on the
/// simulator: post, deliver every packet, complete. Throughput counts request packets.
fn engine_write(c: &mut Criterion) {
    let (a_ip, b_ip) = (
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
    );
    let mut sim = Sim::new(1, SimFaults::NONE);
    let a = sim.add_device("benchA", a_ip);
    let b = sim.add_device("benchB", b_ip);
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
    let init = |cq| QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        // perftest's default send queue (-t 128) holds a window of 100.
        cap: QpCap {
            max_send_wr: 128,
            ..QpCap::default()
        },
        sq_sig_all: false,
        srq: None,
    };
    let qa = pa.create_qp(&init(&ca)).unwrap();
    let qb = pb.create_qp(&init(&cb)).unwrap();
    for (me, peer, ip) in [(&qa, &qb, b_ip), (&qb, &qa, a_ip)] {
        let mut rc = RcConnect::new(peer.qp_num(), Gid::from_ip(ip), 0, 0);
        rc.path_mtu = PathMtu::Mtu4096;
        me.connect_rc(&rc).unwrap();
    }
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    const LEN: usize = 64 << 10;
    const SMALL: u32 = 64;
    const WINDOW: usize = 100;
    let src = pa.reg_mr(LEN, all).unwrap();
    let dst = pb.reg_mr(LEN, all).unwrap();
    let mut g = c.benchmark_group("engine");
    g.throughput(Throughput::Elements((LEN / 4096) as u64));
    g.bench_function("64 KiB RDMA WRITE on the simulator (per packet)", |bch| {
        bch.iter(|| {
            let mut w = SendWr::new(1, WrOpcode::RdmaWrite, vec![src.sge(0, LEN as u32)]);
            w.remote_addr = dst.addr();
            w.rkey = dst.rkey();
            w.send_flags = SendFlags::SIGNALED;
            qa.post_send(&[w]).unwrap();
            let mut wc = [Wc::default()];
            let done = sim.run_until(Duration::from_secs(1), || ca.poll(&mut wc) == 1);
            assert!(done && wc[0].status == WcStatus::Success);
        })
    });
    // perftest's `ib_write_bw -s 64` window: 100 WRITEs of 64 B in one post, the last one
    // signaled (its completion stands for all), each a packet of its own and an ACK.
    g.throughput(Throughput::Elements(WINDOW as u64));
    g.bench_function(
        "100 x 64 B RDMA WRITE on the simulator (per message)",
        |bch| {
            let wrs: Vec<SendWr> = (0..WINDOW)
                .map(|i| {
                    let off = (i % 64) * SMALL as usize;
                    let mut w =
                        SendWr::new(i as u64, WrOpcode::RdmaWrite, vec![src.sge(off, SMALL)]);
                    w.remote_addr = dst.addr() + off as u64;
                    w.rkey = dst.rkey();
                    w.send_flags = if i + 1 == WINDOW {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::empty()
                    };
                    w
                })
                .collect();
            bch.iter(|| {
                qa.post_send(&wrs).unwrap();
                let mut wc = [Wc::default()];
                let done = sim.run_until(Duration::from_secs(1), || ca.poll(&mut wc) == 1);
                assert!(done && wc[0].status == WcStatus::Success);
            })
        },
    );
    g.finish();
}

criterion_group!(
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    targets = headers, icrc, psn, engine_write
);
criterion_main!(benches);
