//! The receive checks of `Device` without sockets: every `wire::Error` is one counted drop
//! reason; a bad ICRC is dropped and counted, never answered; the IPv4 ICRC is checked by
//! solving for the hidden IP ID on a plain UDP receive and over the header as received on a
//! raw one; CNPs are parsed and counted apart from drops.
//!
//! The device runs on a recording link and a manual clock, so everything it sends is seen.

use softroce::net::ManualClock;
use softroce::net::sim::RecordingLink;
use softroce::transport::DropReason;
use softroce::verbs::{Device, DeviceConfig, Gid, QpCap, QpInitAttr, QpType, RcConnect};
use softroce::wire::ip_udp::{LinkType, parse_frame};
use softroce::wire::{
    BthRepr, Error, IcrcIp, Opcode, PacketRepr, Psn, ROCE_V2_UDP_PORT, RocePacket, icrc_compute,
};
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

/// The ConnectX-4 Lx CNP frame of secdev/scapy test/contrib/roce.uts ("RoCE CNP captured on
/// ConnectX-4 Lx"): 10.0.17.1:0 → 10.0.18.1:4791, IPv4 ID 0x718c, DF, TOS 0xc2, BTH opcode
/// 0x81 with BECN, DestQP 0x118, 16 reserved bytes, ICRC 82 fd 00 2a (docs/wire-facts.md §2.2).
const CX4_CNP_FRAME: [u8; 74] = [
    0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2, 0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32, 0x08, 0x00, 0x45, 0xc2,
    0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61, 0x0a, 0x00, 0x11, 0x01, 0x0a, 0x00,
    0x12, 0x01, 0x00, 0x00, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00, 0x81, 0x00, 0xff, 0xff, 0x40, 0x00,
    0x01, 0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x82, 0xfd, 0x00, 0x2a,
];

fn device(ip: Ipv4Addr) -> (Device, Arc<RecordingLink>) {
    let link = Arc::new(RecordingLink::new());
    let dev = Device::new(
        DeviceConfig::new("softroce_rx", IpAddr::V4(ip)),
        link.clone(),
        Arc::new(ManualClock::new()),
    );
    (dev, link)
}

const DEV_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 18, 1);
const PEER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 17, 1);
const PEER_PORT: u16 = 0xc123;

/// A packet from the peer to `dest_qpn` on the device, its ICRC computed with IPv4 ID `ident`.
fn packet(opcode: Opcode, dest_qpn: u32, payload: &[u8], ident: u16) -> Vec<u8> {
    let mut repr = PacketRepr::new(BthRepr {
        ack_req: true,
        ..BthRepr::new(opcode, dest_qpn, Psn::new(0x100))
    });
    repr.payload_len = payload.len();
    let ip = IcrcIp::V4 {
        src: PEER_IP,
        dst: DEV_IP,
        ident,
        src_port: PEER_PORT,
        dst_port: ROCE_V2_UDP_PORT,
    };
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut buf, payload, &ip);
    buf
}

fn peer() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(PEER_IP), PEER_PORT)
}

/// A device with one RC QP at RTS towards the peer (QPN 0x11 on both sides, first PSN 0x100).
fn device_with_qp() -> (Device, Arc<RecordingLink>, softroce::verbs::Qp) {
    let (dev, link) = device(DEV_IP);
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            cap: QpCap::default(),
            sq_sig_all: false,
            srq: None,
        })
        .unwrap();
    qp.connect_rc(&RcConnect::new(0x11, Gid::from(PEER_IP), 0x100, 0x200))
        .unwrap();
    assert_eq!(qp.qp_num(), 0x11);
    (dev, link, qp)
}

#[test]
fn every_decode_error_is_one_distinct_counted_drop_reason() {
    // Typed decode errors: one wire::Error variant per way bytes can be wrong, each mapped to
    // exactly one DropReason (and no two to the same one).
    let all = [
        Error::Truncated,
        Error::BadTver(1),
        Error::UnknownOpcode(0x15),
        Error::BadPadCount,
        Error::LengthMismatch,
        Error::IcrcMismatch,
        Error::BadFraming,
    ];
    let reasons: BTreeSet<&str> = all.iter().map(|e| DropReason::from(*e).name()).collect();
    assert_eq!(reasons.len(), all.len(), "two errors share a drop reason");

    // And the device counts each one under that reason when the bytes arrive.
    let (dev, link, _qp) = device_with_qp();
    let ack = packet(Opcode::RC_ACKNOWLEDGE, 0x11, &[0x1f, 0, 0, 1], 0);
    let mut bad_tver = ack.clone();
    bad_tver[1] |= 0x01;
    let mut unknown = ack.clone();
    unknown[0] = 0x15;
    let mut bad_pad = ack.clone();
    bad_pad[1] |= 0x10; // pad count 1 on an opcode without payload ...
    bad_pad.insert(16, 0); // ... with its pad byte present
    let mut long_ack = ack.clone();
    long_ack.splice(16..16, [0u8; 4]); // four payload bytes on an ACK
    let mut bad_icrc = packet(Opcode::RC_SEND_ONLY, 0x11, b"abcd", 0);
    let n = bad_icrc.len();
    bad_icrc[n - 1] ^= 0x01;
    let cases: [(&[u8], Error); 6] = [
        (&ack[..5], Error::Truncated),
        (&bad_tver, Error::BadTver(1)),
        (&unknown, Error::UnknownOpcode(0x15)),
        (&bad_pad, Error::BadPadCount),
        (&long_ack, Error::LengthMismatch),
        (&bad_icrc, Error::IcrcMismatch),
    ];
    for (bytes, want) in cases {
        if want != Error::IcrcMismatch {
            assert_eq!(RocePacket::parse(bytes).err(), Some(want));
        }
        let before = dev.counters();
        dev.handle_datagram(peer(), bytes);
        let after = dev.counters();
        let reason = DropReason::from(want);
        assert_eq!(
            after.dropped(reason),
            before.dropped(reason) + 1,
            "{want:?} not counted as {}",
            reason.name()
        );
        assert_eq!(
            after.dropped_total(),
            before.dropped_total() + 1,
            "{want:?}"
        );
    }
    // BadFraming: a raw-socket packet that is not IPv4/IPv6 + UDP.
    dev.handle_ip_packet(&[0x45, 0, 0, 20]);
    assert_eq!(dev.counters().dropped(DropReason::BadFraming), 1);
    assert!(
        link.is_empty(),
        "a dropped packet was answered: {:?}",
        link.snapshot()
    );
}

#[test]
fn a_bad_icrc_is_dropped_and_counted_never_naked() {
    let (dev, link, _qp) = device_with_qp();
    // IBTA A17 / rxe_rcv: a bad ICRC is dropped silently, whatever the packet asks for.
    let mut bad = packet(Opcode::RC_SEND_ONLY, 0x11, b"hello, rxe!!", 0);
    bad[20] ^= 0x80; // a payload bit
    dev.handle_datagram(peer(), &bad);
    assert_eq!(dev.counters().dropped(DropReason::IcrcMismatch), 1);
    assert!(link.is_empty(), "answered a bad-ICRC packet");
    // The same SEND with a good ICRC (and an ID that kernel rxe could have written) is
    // executed: no receive is posted, so the responder answers with an RNR NAK.
    let good = packet(Opcode::RC_SEND_ONLY, 0x11, b"hello, rxe!!", 0xbeef);
    dev.handle_datagram(peer(), &good);
    let sent = link.snapshot();
    assert_eq!(sent.len(), 1, "{sent:?}");
    let nak = RocePacket::parse(&sent[0].payload).unwrap();
    assert_eq!(nak.repr.bth.opcode, Opcode::RC_ACKNOWLEDGE);
    assert_eq!(nak.repr.aeth.unwrap().syndrome >> 5, 0b01, "RNR NAK");
    assert_eq!(dev.counters().dropped(DropReason::IcrcMismatch), 1);
}

#[test]
fn cnp_from_a_connectx_capture_is_parsed_and_counted_apart() {
    let d = parse_frame(&CX4_CNP_FRAME, LinkType::Ethernet).unwrap();
    let cnp = RocePacket::parse(d.payload).unwrap();
    assert_eq!(cnp.repr.bth.opcode, Opcode::CNP);
    assert_eq!(cnp.info.name, "CNP");
    assert!(cnp.repr.bth.becn && !cnp.repr.bth.fecn);
    assert_eq!(cnp.repr.bth.dest_qpn, 0x118);
    assert_eq!(cnp.payload, &[0u8; 16], "16 reserved bytes");
    assert!(!cnp.info.is_request());
    assert_eq!(
        icrc_compute(d.ip_header, d.udp_header, cnp.body),
        [0x82, 0xfd, 0x00, 0x2a]
    );
    // Re-emitting the repr gives the captured bytes.
    let ip = IcrcIp::V4 {
        src: PEER_IP,
        dst: DEV_IP,
        ident: 0x718c,
        src_port: 0,
        dst_port: ROCE_V2_UDP_PORT,
    };
    let mut again = vec![0u8; cnp.repr.buffer_len()];
    cnp.repr.emit(&mut again, cnp.payload, &ip);
    assert_eq!(again, d.payload);

    // No QP 0x118 exists: a CNP is counted before any QP lookup, and is no drop.
    let (dev, link) = device(DEV_IP);
    dev.handle_ip_packet(&CX4_CNP_FRAME[14..]);
    assert_eq!(
        dev.rp_cnp_ignored(),
        1,
        "exact check over the captured header"
    );
    dev.handle_datagram(SocketAddr::new(IpAddr::V4(PEER_IP), 0), d.payload);
    assert_eq!(dev.rp_cnp_ignored(), 2, "plain check solves for ID 0x718c");
    assert_eq!(dev.counters().dropped_total(), 0);
    // A corrupted CNP is an ICRC drop, not a CNP.
    let mut bad = CX4_CNP_FRAME;
    bad[50] ^= 0x04;
    dev.handle_ip_packet(&bad[14..]);
    dev.handle_datagram(SocketAddr::new(IpAddr::V4(PEER_IP), 0), &bad[42..]);
    assert_eq!(dev.rp_cnp_ignored(), 2);
    assert_eq!(dev.counters().dropped(DropReason::IcrcMismatch), 2);
    assert!(link.is_empty());
}

#[test]
fn exact_check_sees_the_ip_id_that_the_plain_check_solves_for() {
    let (dev, _link, _qp) = device_with_qp();
    // A SEND whose ICRC was computed over IPv4 ID 0x1234 ...
    let pkt = packet(Opcode::RC_SEND_ONLY, 0x11, b"0123456789abcdef", 0x1234);
    let ip_pkt = |ident: u16| {
        softroce::net::pcap::ip_packet(
            peer(),
            SocketAddr::new(IpAddr::V4(DEV_IP), ROCE_V2_UDP_PORT),
            ident,
            64,
            &pkt,
        )
        .unwrap()
    };
    // ... arrives with ID 0x4321: the raw-socket check sees the real header and drops it;
    dev.handle_ip_packet(&ip_pkt(0x4321));
    assert_eq!(dev.counters().dropped(DropReason::IcrcMismatch), 1);
    // the plain-socket check cannot see the ID and accepts it (some ID fits);
    assert_eq!(
        softroce::net::pcap::recovered_ident(
            peer(),
            SocketAddr::new(IpAddr::V4(DEV_IP), ROCE_V2_UDP_PORT),
            &pkt
        ),
        Some(0x1234)
    );
    dev.handle_datagram(peer(), &pkt);
    assert_eq!(dev.counters().dropped(DropReason::IcrcMismatch), 1);
    // with the right ID the exact check accepts it too.
    let before = dev.counters().dropped_total();
    dev.handle_ip_packet(&ip_pkt(0x1234));
    assert_eq!(dev.counters().dropped_total(), before);
    // A UDP header that disagrees with the datagram (wrong destination port) is framing.
    let mut other_port = ip_pkt(0x1234);
    other_port[23] ^= 1;
    dev.handle_ip_packet(&other_port);
    assert_eq!(dev.counters().dropped(DropReason::BadFraming), 1);
}
