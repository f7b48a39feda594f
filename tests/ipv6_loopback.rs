//! IPv6 end to end on loopback. Two devices need two addresses and the host's loopback has one
//! IPv6 address (::1), so the test makes its own network namespace (`ip netns add`), brings
//! its `lo` up (::1) and adds fd00:5f::2 to it, then runs the checks below inside it by
//! re-running this test binary under `ip netns exec`; it deletes the namespace afterwards.
//! Without root or iproute2 it prints why it skipped.
//!
//! Inside: devices on ::1 and fd00:5f::2 (IPv6 GIDs, not IPv4-mapped) connect RC QPs through
//! address vectors with IPv6 DGIDs and run every RC operation; every datagram is captured and
//! each record's ICRC verifies over its IPv6 header; a datagram with UDP checksum 0 (what kernel
//! rxe sends over IPv6) reaches the device, thanks to UDP_NO_CHECK6_RX; an IPv4-mapped DGID is
//! refused on an IPv6 device. When tshark is installed, the outer test also has it decode the
//! capture and checks that it finds no malformed packet.

mod netns;
mod support;

use netns::Netns;
use socket2::{Domain, Protocol, Socket, Type};
use softroce::net::pcap::ip_packet;
use softroce::net::{Capture, UdpOptions};
use softroce::transport::DropReason;
use softroce::verbs::{
    AhAttr, ErrorKind, Gid, QpAttr, QpAttrMask, QpState, RecvWr, SendWr, WcStatus, WrOpcode,
};
use softroce::wire::ip_udp::{LinkType, parse_frame};
use softroce::wire::{
    BthRepr, IcrcIp, Opcode, PacketRepr, Psn, ROCE_V2_UDP_PORT, RocePacket, icrc_compute,
};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Command;
use support::{connect, every_rc_operation, side, wait_one};

/// Set in the re-run inside the namespace; its value is the pcap path to write.
const CHILD_ENV: &str = "SOFTROCE_IPV6_NETNS_PCAP";
const A: Ipv6Addr = Ipv6Addr::LOCALHOST;
const B: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x5f, 0, 0, 0, 0, 0, 2);

#[test]
fn ipv6_end_to_end_in_a_test_netns() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return; // the re-run executes only `in_netns`
    }
    let Some(ns) = Netns::create_or_skip("v6") else {
        return;
    };
    ns.ip(&["addr", "add", "fd00:5f::2/128", "dev", "lo", "nodad"])
        .unwrap();
    let pcap = std::env::temp_dir().join(format!("softroce-ipv6-{}.pcap", std::process::id()));
    ns.run_ignored_test("in_netns", CHILD_ENV, pcap.as_os_str());
    check_with_tshark(&pcap);
    let _ = std::fs::remove_file(&pcap);
}

/// tshark decodes the IPv6 capture as RoCE (InfiniBand over UDP 4791) with nothing malformed.
fn check_with_tshark(pcap: &PathBuf) {
    let out = match Command::new("tshark")
        .args(support::TSHARK_NO_PAYLOAD_HEURISTICS)
        .arg("-r")
        .arg(pcap)
        .args([
            "-T",
            "fields",
            "-e",
            "ipv6.src",
            "-e",
            "infiniband.bth.opcode",
        ])
        .args(["-e", "_ws.malformed"])
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("tshark not run ({e}); the capture was checked by softroce alone");
            return;
        }
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() > 10, "{text}");
    for l in lines {
        let f: Vec<&str> = l.split('\t').collect();
        assert!(f[0] == "::1" || f[0] == "fd00:5f::2", "{l}");
        assert!(!f[1].is_empty(), "not decoded as InfiniBand: {l}");
        assert!(f.get(2).is_none_or(|m| m.is_empty()), "malformed: {l}");
    }
}

/// A CNP from ::1 to B with its ICRC over the IPv6 flow, as UDP header + payload with UDP
/// checksum 0 (rxe's IPv6 framing), for a raw IPv6 socket to send.
/// A CNP to QP `qpn` (a QP of the device: a shared device steers by the destination QP,
/// `softroce::net::steer`).
fn zero_checksum_cnp(qpn: u32, corrupt: bool) -> Vec<u8> {
    let mut repr = PacketRepr::new(BthRepr {
        becn: true,
        ..BthRepr::new(Opcode::CNP, qpn, Psn::new(0))
    });
    repr.payload_len = 16;
    let flow = IcrcIp::V6 {
        src: A,
        dst: B,
        src_port: 0xc0de,
        dst_port: ROCE_V2_UDP_PORT,
    };
    let mut roce = vec![0u8; repr.buffer_len()];
    repr.emit(&mut roce, &[0u8; 16], &flow);
    if corrupt {
        roce[14] ^= 0x01;
    }
    let mut udp = Vec::new();
    udp.extend_from_slice(&0xc0deu16.to_be_bytes());
    udp.extend_from_slice(&ROCE_V2_UDP_PORT.to_be_bytes());
    udp.extend_from_slice(&u16::try_from(8 + roce.len()).unwrap().to_be_bytes());
    udp.extend_from_slice(&[0, 0]); // no checksum
    udp.extend_from_slice(&roce);
    udp
}

#[test]
#[ignore = "runs inside the network namespace that ipv6_end_to_end_in_a_test_netns makes"]
fn in_netns() {
    let Some(pcap) = std::env::var_os(CHILD_ENV) else {
        eprintln!("not inside the test namespace: run ipv6_end_to_end_in_a_test_netns");
        return;
    };
    let capture = Capture::create(PathBuf::from(&pcap).as_path()).unwrap();
    let opts = UdpOptions {
        exact_icrc: false,
        capture: Some(capture.clone()),
        ..Default::default()
    };
    let a = side(IpAddr::V6(A), &opts).expect("device on ::1");
    let b = side(IpAddr::V6(B), &opts).expect("device on fd00:5f::2");

    // GID table: index 1 is the IPv6 address itself, which names IPv6 (not IPv4-mapped).
    for (s, addr) in [(&a, A), (&b, B)] {
        let g = s.dev.query_gid(1, 1).unwrap();
        assert_eq!(g.gid, Gid(addr.octets()));
        assert_eq!(g.gid.ip(), IpAddr::V6(addr));
        assert_eq!(g.gid.to_string(), addr.to_string());
    }

    // An IPv4-mapped DGID on an IPv6 device is refused before anything changes.
    let init = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        ..QpAttr::default()
    };
    a.qp.modify(
        &init,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        dest_qp_num: 0x11,
        ah_attr: AhAttr::roce_v2(Gid::from(std::net::Ipv4Addr::LOCALHOST)),
        ..QpAttr::default()
    };
    let e =
        a.qp.modify(
            &rtr,
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER,
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Inval, "{e}");
    assert_eq!(a.qp.state(), QpState::Init);
    drop(a);
    let a = side(IpAddr::V6(A), &opts).expect("device on ::1");

    // Every RC operation over IPv6 address vectors.
    connect(&a, &b);
    assert_eq!(every_rc_operation(&a, &b), 7);

    // rxe's IPv6 datagrams carry UDP checksum 0: a raw IPv6 socket sends two such CNPs (one
    // corrupted) from ::1, then a SEND from A orders them before its completion.
    let raw = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::UDP)).unwrap();
    raw.bind(&SocketAddr::new(IpAddr::V6(A), 0).into()).unwrap();
    for corrupt in [false, true] {
        raw.send_to(
            &zero_checksum_cnp(b.qp.qp_num(), corrupt),
            &SocketAddr::new(IpAddr::V6(B), 0).into(),
        )
        .unwrap();
    }
    b.qp.post_recv(&[RecvWr {
        wr_id: 9,
        sg_list: vec![],
    }])
    .unwrap();
    a.qp.post_send(&[SendWr::new(9, WrOpcode::Send, vec![])])
        .unwrap();
    assert_eq!(wait_one(&a.cq).status, WcStatus::Success);
    assert_eq!(wait_one(&b.cq).status, WcStatus::Success);
    assert_eq!(
        b.dev.rp_cnp_ignored(),
        1,
        "the zero-checksum CNP did not arrive"
    );
    assert_eq!(b.dev.counters().dropped(DropReason::IcrcMismatch), 1);
    assert_eq!(b.dev.counters().dropped_total(), 1);
    assert_eq!(a.dev.counters().dropped_total(), 0);
    drop((a, b));
    capture.flush().unwrap();

    // Every captured record is IPv6 + UDP/4791 and its ICRC verifies over the recorded
    // headers, except the corrupted CNP.
    let (mut ok, mut bad) = (0, 0);
    for p in softroce::net::CaptureReader::open(pcap.as_ref()).unwrap() {
        let p = p.unwrap();
        let d = parse_frame(&p.data, LinkType::RawIp).unwrap();
        assert!(d.src.is_ipv6() && d.dst.is_ipv6());
        assert_eq!(d.dst_port, ROCE_V2_UDP_PORT);
        let pkt = RocePacket::parse(d.payload).unwrap();
        if icrc_compute(d.ip_header, d.udp_header, pkt.body) == pkt.icrc {
            ok += 1;
        } else {
            bad += 1;
        }
    }
    assert_eq!(bad, 1, "only the corrupted CNP fails its ICRC");
    assert!(ok > 15, "only {ok} good records");
    // And the capture's IPv6 builder agrees with what the raw socket sent.
    let rebuilt = ip_packet(
        SocketAddr::new(IpAddr::V6(A), 0xc0de),
        SocketAddr::new(IpAddr::V6(B), ROCE_V2_UDP_PORT),
        0,
        64,
        &zero_checksum_cnp(0x11, false)[8..],
    )
    .unwrap();
    let d = parse_frame(&rebuilt, LinkType::RawIp).unwrap();
    let pkt = RocePacket::parse(d.payload).unwrap();
    assert_eq!(icrc_compute(d.ip_header, d.udp_header, pkt.body), pkt.icrc);
}
