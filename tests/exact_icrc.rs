//! Exact receive-side ICRC on loopback (`UdpOptions::exact_icrc`: a raw IPv4 socket beside the
//! bound UDP socket), against the plain-UDP check that solves for the IPv4 ID; and the pcap
//! capture of both receive paths.
//!
//! Needs CAP_NET_RAW (root). Without it each test prints why it skipped. Addresses 127.3.2.x,
//! port 4791, loopback only.

mod support;

use socket2::{Domain, Protocol, Socket, Type};
use softroce::net::pcap::ip_packet;
use softroce::net::{Capture, UdpOptions};
use softroce::transport::DropReason;
use softroce::verbs::{RecvWr, SendWr, WcStatus, WrOpcode};
use softroce::wire::ip_udp::{LinkType, parse_frame};
use softroce::wire::{
    BthRepr, IcrcIp, Opcode, PacketRepr, Psn, ROCE_V2_UDP_PORT, RocePacket, icrc_compute,
};
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use support::{Side, connect, every_rc_operation, side, wait_one};

/// A capture into memory, readable after the devices are gone.
#[derive(Clone, Default)]
struct Mem(Arc<parking_lot::Mutex<Vec<u8>>>);

impl Write for Mem {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.lock().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn capture() -> (Arc<Capture>, Mem) {
    let mem = Mem::default();
    (Capture::to_writer(Box::new(mem.clone())).unwrap(), mem)
}

/// Every record of a raw-IP pcap held in memory.
fn records(mem: &Mem) -> Vec<Vec<u8>> {
    let bytes = mem.0.lock().clone();
    softroce::net::CaptureReader::new(&bytes[..])
        .unwrap()
        .map(|f| {
            let f = f.unwrap();
            assert_eq!(f.link, Ok(LinkType::RawIp));
            f.data
        })
        .collect()
}

/// The IPv4 ID and ICRC verdict (over the recorded header) of one record.
fn id_and_icrc_ok(record: &[u8]) -> (u16, bool) {
    let d = parse_frame(record, LinkType::RawIp).unwrap();
    let pkt = RocePacket::parse(d.payload).unwrap();
    let id = u16::from_be_bytes([d.ip_header[4], d.ip_header[5]]);
    assert_eq!(d.ip_header[6] & 0x40, 0x40, "DF");
    (
        id,
        icrc_compute(d.ip_header, d.udp_header, pkt.body) == pkt.icrc,
    )
}

/// Opens a side, or None with the reason printed when raw sockets are not permitted.
fn try_side(ip: Ipv4Addr, opts: &UdpOptions) -> Option<Side> {
    match side(IpAddr::V4(ip), opts) {
        Ok(s) => Some(s),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            eprintln!("SKIPPED: exact ICRC mode needs CAP_NET_RAW for its raw socket: {e}");
            None
        }
        Err(e) => panic!("open device on {ip}: {e}"),
    }
}

#[test]
fn exact_mode_runs_every_rc_operation_and_captures_received_headers() {
    let (cap_a, mem_a) = capture();
    let exact_a = UdpOptions {
        exact_icrc: true,
        capture: Some(cap_a),
        ..Default::default()
    };
    let Some(a) = try_side(Ipv4Addr::new(127, 3, 2, 1), &exact_a) else {
        return;
    };
    let Some(b) = try_side(
        Ipv4Addr::new(127, 3, 2, 2),
        &UdpOptions {
            exact_icrc: true,
            capture: None,
            ..Default::default()
        },
    ) else {
        return;
    };
    assert!(a.dev.link().exact_icrc() && b.dev.link().exact_icrc());
    connect(&a, &b);
    assert_eq!(every_rc_operation(&a, &b), 7);
    for s in [&a, &b] {
        let c = s.dev.counters();
        assert_eq!(c.dropped_total(), 0, "{:?}", c.entries());
        assert_eq!(c.duplicate_request, 0, "a datagram was handled twice");
    }
    let (a_tx, b_tx) = (
        a.dev
            .link()
            .tx_datagrams
            .load(std::sync::atomic::Ordering::Relaxed),
        b.dev
            .link()
            .tx_datagrams
            .load(std::sync::atomic::Ordering::Relaxed),
    );
    drop((a, b));
    // A's capture: what A sent (built, ID 0) and what A received (the raw socket's bytes).
    let recs = records(&mem_a);
    let (mut sent, mut received) = (0u64, 0u64);
    let mut last_rx_id = None;
    for r in &recs {
        let d = parse_frame(r, LinkType::RawIp).unwrap();
        let (id, ok) = id_and_icrc_ok(r);
        assert!(ok, "ICRC of a captured record fails");
        // Linux writes ID 0 through an unconnected IP_PMTUDISC_DO socket (docs/wire-facts.md §0.2): the
        // sent ones are built that way; a lone received datagram proves it on the wire, and
        // segment i of a UDP GSO send from B carries ID i (the kernel numbers the segments).
        if d.src == IpAddr::V4(Ipv4Addr::new(127, 3, 2, 1)) {
            assert_eq!(id, 0);
            sent += 1;
        } else {
            assert!(
                id == 0 || last_rx_id.is_some_and(|l: u16| id == l + 1),
                "received ID {id} after {last_rx_id:?}"
            );
            last_rx_id = Some(id);
            received += 1;
        }
    }
    assert_eq!(sent, a_tx);
    assert_eq!(received, b_tx, "every datagram from B was read once, raw");
}

/// A CNP from 127.3.2.9 to `dst`, its ICRC computed over IPv4 ID `icrc_ident`.
/// A CNP to QP `qpn` of the device on `dst` (a QP of its own: a shared device steers by
/// the destination QP, `softroce::net::steer`).
fn cnp(dst: Ipv4Addr, qpn: u32, icrc_ident: u16) -> Vec<u8> {
    let mut repr = PacketRepr::new(BthRepr {
        becn: true,
        ..BthRepr::new(Opcode::CNP, qpn, Psn::new(0))
    });
    repr.payload_len = 16;
    let ip = IcrcIp::V4 {
        src: Ipv4Addr::new(127, 3, 2, 9),
        dst,
        ident: icrc_ident,
        src_port: 0xc0de,
        dst_port: ROCE_V2_UDP_PORT,
    };
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut buf, &[0u8; 16], &ip);
    buf
}

#[test]
fn exact_mode_checks_the_ip_id_that_plain_mode_can_only_solve_for() {
    let x_ip = Ipv4Addr::new(127, 3, 2, 4);
    let y_ip = Ipv4Addr::new(127, 3, 2, 5);
    let (cap_x, mem_x) = capture();
    let (cap_y, mem_y) = capture();
    let Some(x) = try_side(
        x_ip,
        &UdpOptions {
            exact_icrc: true,
            capture: Some(cap_x),
            ..Default::default()
        },
    ) else {
        return;
    };
    let y = side(
        IpAddr::V4(y_ip),
        &UdpOptions {
            exact_icrc: false,
            capture: Some(cap_y),
            ..Default::default()
        },
    )
    .unwrap();
    connect(&x, &y);
    // A kernel-rxe-like sender: a raw socket writing its own IPv4 header with a non-zero ID.
    let inject = match Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::UDP)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("SKIPPED: cannot open a raw socket to inject packets: {e}");
            return;
        }
    };
    inject.set_header_included_v4(true).unwrap();
    let send = |dst: Ipv4Addr, wire_ident: u16, payload: &[u8]| {
        let src = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 3, 2, 9)), 0xc0de);
        let to = SocketAddr::new(IpAddr::V4(dst), ROCE_V2_UDP_PORT);
        let pkt = ip_packet(src, to, wire_ident, 64, payload).unwrap();
        inject
            .send_to(&pkt, &SocketAddr::new(IpAddr::V4(dst), 0).into())
            .unwrap();
    };
    for (dst, qpn) in [(x_ip, x.qp.qp_num()), (y_ip, y.qp.qp_num())] {
        // (a) ICRC over ID 0x1234, sent with ID 0x1234: valid.
        send(dst, 0x1234, &cnp(dst, qpn, 0x1234));
        // (b) ICRC over ID 0x1234, sent with ID 0x4321: the ID field was corrupted.
        send(dst, 0x4321, &cnp(dst, qpn, 0x1234));
        // (c) a reserved byte flipped: the payload was corrupted.
        let mut bad = cnp(dst, qpn, 0x1234);
        bad[20] ^= 0x10;
        send(dst, 0x1234, &bad);
    }
    // A SEND each way after the injected datagrams: once its completions are in, each driver
    // has handled everything that reached its socket before (loopback keeps the order).
    for (from, to) in [(&x, &y), (&y, &x)] {
        to.qp
            .post_recv(&[RecvWr {
                wr_id: 1,
                sg_list: vec![],
            }])
            .unwrap();
        from.qp
            .post_send(&[SendWr::new(2, WrOpcode::Send, vec![])])
            .unwrap();
        assert_eq!(wait_one(&from.cq).status, WcStatus::Success);
        assert_eq!(wait_one(&to.cq).status, WcStatus::Success);
    }
    // Exact: accepts (a), drops (b) and (c).
    assert_eq!(x.dev.rp_cnp_ignored(), 1);
    assert_eq!(x.dev.counters().dropped(DropReason::IcrcMismatch), 2);
    // Plain: accepts (a) and (b), since ID 0x1234 makes (b)'s ICRC valid; drops (c).
    assert_eq!(y.dev.rp_cnp_ignored(), 2);
    assert_eq!(y.dev.counters().dropped(DropReason::IcrcMismatch), 1);
    drop((x, y));

    // The captures: the exact side recorded the headers as received (IDs as on the wire, (b)
    // fails its ICRC there too); the plain side rebuilt them with the solved ID (0x1234 for
    // (a) and (b)) or 0 for (c), whose ICRC no ID fixes.
    let injected = |mem: &Mem| -> Vec<(u16, bool)> {
        records(mem)
            .iter()
            .filter(|r| {
                parse_frame(r, LinkType::RawIp).unwrap().src
                    == IpAddr::V4(Ipv4Addr::new(127, 3, 2, 9))
            })
            .map(|r| id_and_icrc_ok(r))
            .collect()
    };
    assert_eq!(
        injected(&mem_x),
        [(0x1234, true), (0x4321, false), (0x1234, false)]
    );
    assert_eq!(
        injected(&mem_y),
        [(0x1234, true), (0x1234, true), (0, false)]
    );
}
