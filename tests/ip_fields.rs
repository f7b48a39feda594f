//! Issue 14, wire items 1–4: the IP and UDP header fields of what softroce sends, read two
//! ways from real UDP devices: as the kernel put them on the wire (an `AF_PACKET` socket on
//! `lo` of a network namespace the test makes, re-running itself there as
//! tests/ipv6_loopback.rs does) and as the `--pcap` writer records them. Like rxe
//! (docs/wire-facts.md §0.7, §2.1): the address vector's traffic class as IPv4 TOS / IPv6
//! traffic class (item 1); IPv6 flow label 0, also when the address handle asks for one
//! (item 2); the address handle's hop limit toward a multicast group, the route's (64)
//! toward a unicast address (item 3); UDP checksum 0 on IPv4 and IPv6 (item 4), except on
//! UDP GSO sends, which Linux refuses without a checksum. Without root it says why it
//! skipped.

mod netns;
mod support;

use netns::Netns;
use softroce::net::pcap_reader::CaptureReader;
use softroce::net::{Capture, UdpOptions};
use softroce::verbs::{
    AccessFlags, AhAttr, Gid, MULTICAST_QPN, PathMtu, QpCap, QpInitAttr, QpType, RcConnect, RecvWr,
    SendWr, WcStatus, WrOpcode,
};
use softroce::wire::ROCE_V2_UDP_PORT;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use support::{Side, side, wait_one};

const CHILD_ENV: &str = "SOFTROCE_IP_FIELDS_NETNS_PCAP";
const A4: Ipv4Addr = Ipv4Addr::new(127, 0, 93, 1);
const B4: Ipv4Addr = Ipv4Addr::new(127, 0, 93, 2);
const GROUP: Ipv4Addr = Ipv4Addr::new(239, 0, 93, 1);
const A6: Ipv6Addr = Ipv6Addr::LOCALHOST;
const B6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x93, 0, 0, 0, 0, 0, 2);
const DSCP_46: u8 = 0xb8;
const QKEY: u32 = 0x0093_0093;

#[test]
fn ip_fields_as_sent_in_a_test_netns() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let Some(ns) = Netns::create_or_skip("ipf") else {
        return;
    };
    ns.ip(&["addr", "add", "fd00:93::2/128", "dev", "lo", "nodad"])
        .unwrap();
    let pcap = std::env::temp_dir().join(format!("softroce-ipf-{}.pcap", std::process::id()));
    ns.run_ignored_test("in_netns", CHILD_ENV, pcap.as_os_str());
    let _ = std::fs::remove_file(&pcap);
}

/// The fields checked of one RoCEv2 datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fields {
    traffic_class: u8,
    hop_limit: u8,
    flow_label: u32,
    udp_checksum: u16,
}

/// The fields of an IP packet carrying UDP to port 4791, with its UDP source port.
fn roce_fields(ip: &[u8]) -> Option<(u16, Fields)> {
    let (udp, f) = match ip.first()? >> 4 {
        4 => {
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            (
                ip.get(ihl..)?,
                Fields {
                    traffic_class: ip[1],
                    hop_limit: ip[8],
                    flow_label: 0,
                    udp_checksum: 0,
                },
            )
        }
        6 if ip.get(6) == Some(&17) => {
            let w = u32::from_be_bytes(ip[0..4].try_into().ok()?);
            (
                ip.get(40..)?,
                Fields {
                    traffic_class: (w >> 20) as u8,
                    hop_limit: ip[7],
                    flow_label: w & 0x000f_ffff,
                    udp_checksum: 0,
                },
            )
        }
        _ => return None,
    };
    if ip[0] >> 4 == 4 && ip[9] != 17 {
        return None;
    }
    let dport = u16::from_be_bytes(udp.get(2..4)?.try_into().ok()?);
    (dport == ROCE_V2_UDP_PORT).then(|| {
        let sport = u16::from_be_bytes([udp[0], udp[1]]);
        let udp_checksum = u16::from_be_bytes([udp[6], udp[7]]);
        (sport, Fields { udp_checksum, ..f })
    })
}

/// An `AF_PACKET` socket that sees every frame on every interface of the namespace.
fn sniffer() -> OwnedFd {
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket creation; the fd is owned at once.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK,
            libc::c_int::from(proto),
        )
    };
    assert!(fd >= 0, "AF_PACKET: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is a new socket no one else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // Room for the 64 KiB GSO super-datagrams of the bulk phase (root: beyond rmem_max).
    rustix::net::sockopt::set_socket_recv_buffer_size_force(&fd, 32 << 20).unwrap();
    fd
}

/// The RoCEv2 frames the sniffer holds now, as (UDP source port, fields); loopback frames
/// carry a 14-byte Ethernet header. Outgoing frames only (each loopback packet is seen
/// twice, leaving and arriving).
fn drain(s: &OwnedFd) -> Vec<(u16, Fields)> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 70_000];
    loop {
        // SAFETY: an all-zero sockaddr_ll is valid; `buf` and `from` outlive the call and the
        // lengths passed are theirs.
        let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        let n = unsafe {
            libc::recvfrom(
                s.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                (&raw mut from).cast(),
                &raw mut len,
            )
        };
        if n < 0 {
            return out;
        }
        if from.sll_pkttype != libc::PACKET_OUTGOING {
            continue;
        }
        if let Some(f) = buf.get(14..n as usize).and_then(roce_fields) {
            out.push(f);
        }
    }
}

/// Connects the RC QPs of `a` and `b` with traffic class `tclass` on both address vectors.
fn connect(a: &Side, b: &Side, tclass: u8) {
    for (me, peer) in [(a, b), (b, a)] {
        let mut c = RcConnect::new(peer.qp.qp_num(), Gid::from_ip(peer.dev.ip()), 0x10, 0x10);
        c.path_mtu = PathMtu::Mtu1024;
        c.traffic_class = tclass;
        me.qp.connect_rc(&c).expect("connect_rc");
    }
}

/// A 3000-byte SEND from `a` to `b` (three packets and an ACK), completed on both sides.
fn send_3000(a: &Side, b: &Side) {
    let (src, dst) = (support::mr(a, 3000), support::mr(b, 3000));
    b.qp.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: vec![dst.sge(0, 3000)],
    }])
    .unwrap();
    let mut wr = SendWr::new(2, WrOpcode::Send, vec![src.sge(0, 3000)]);
    wr.send_flags |= softroce::verbs::SendFlags::SIGNALED;
    a.qp.post_send(&[wr]).unwrap();
    assert_eq!(wait_one(&b.cq).status, WcStatus::Success);
    assert_eq!(wait_one(&a.cq).status, WcStatus::Success);
}

fn ud_qp(s: &Side) -> (softroce::verbs::Qp, softroce::verbs::Cq) {
    let cq = s.dev.create_cq(16).unwrap();
    let qp =
        s.pd.create_qp(&QpInitAttr {
            qp_type: QpType::Ud,
            send_cq: &cq,
            recv_cq: &cq,
            cap: QpCap::default(),
            sq_sig_all: true,
            srq: None,
        })
        .unwrap();
    qp.ready_ud(QKEY, 0).unwrap();
    (qp, cq)
}

/// One UD SEND of 8 bytes from `s` through an address handle `ah` to `qpn`.
fn ud_send(s: &Side, qp: &softroce::verbs::Qp, cq: &softroce::verbs::Cq, ah: &AhAttr, qpn: u32) {
    let buf = s.pd.reg_mr(8, AccessFlags::LOCAL_WRITE).unwrap();
    let ah = s.pd.create_ah(ah).unwrap();
    let mut wr = SendWr::new(9, WrOpcode::Send, vec![buf.sge(0, 8)]);
    wr.ud = Some(ah.dest(qpn, QKEY));
    qp.post_send(&[wr]).unwrap();
    assert_eq!(wait_one(cq).status, WcStatus::Success);
}

const RC: Fields = Fields {
    traffic_class: DSCP_46,
    hop_limit: 64,
    flow_label: 0,
    udp_checksum: 0,
};

#[test]
#[ignore = "runs inside the network namespace that ip_fields_as_sent_in_a_test_netns makes"]
fn in_netns() {
    let Some(pcap) = std::env::var_os(CHILD_ENV) else {
        eprintln!("not inside the test namespace: run ip_fields_as_sent_in_a_test_netns");
        return;
    };
    let sniff = sniffer();
    let capture = Capture::create(PathBuf::from(&pcap).as_path()).unwrap();
    let opts = UdpOptions {
        capture: Some(capture.clone()),
        ..Default::default()
    };

    // Items 1 and 4, IPv4 and IPv6: every packet of an RC QP whose address vector asks for
    // traffic class 0xB8 (DSCP 46), both directions, ACKs included, leaves with it, with
    // the route's TTL (ibv_rc_pingpong's hop limit 1 does not apply to unicast), flow label
    // 0 (item 2) and UDP checksum 0.
    for (a_ip, b_ip) in [
        (IpAddr::V4(A4), IpAddr::V4(B4)),
        (IpAddr::V6(A6), IpAddr::V6(B6)),
    ] {
        let (a, b) = (side(a_ip, &opts).unwrap(), side(b_ip, &opts).unwrap());
        connect(&a, &b, DSCP_46);
        send_3000(&a, &b);
        let seen = drain(&sniff);
        assert_eq!(
            seen.len(),
            4,
            "{a_ip}: three SEND packets and an ACK: {seen:?}"
        );
        for (_, f) in &seen {
            assert_eq!(*f, RC, "{a_ip}");
        }

        // Items 2 and 3 on UD: an address handle with hop limit 1 and flow label 0x12345 to
        // a unicast address: the route's TTL, flow label 0 (rxe 6.1 sends 0 whatever the
        // AH says; docs/wire-facts.md §0.7).
        let (qa, ca) = ud_qp(&a);
        let (qb, _cb) = ud_qp(&b);
        let ah = AhAttr {
            hop_limit: 1,
            flow_label: 0x1_2345,
            traffic_class: 0x20,
            ..AhAttr::roce_v2(Gid::from_ip(b_ip))
        };
        ud_send(&a, &qa, &ca, &ah, qb.qp_num());
        let seen = drain(&sniff);
        let want = Fields {
            traffic_class: 0x20,
            ..RC
        };
        assert_eq!(
            seen.iter().map(|s| s.1).collect::<Vec<_>>(),
            [want],
            "{a_ip} UD"
        );
    }

    // Item 3: toward a multicast group the address handle's hop limit applies (Linux's
    // multicast default would be 1).
    let (a, b) = (
        side(IpAddr::V4(A4), &opts).unwrap(),
        side(IpAddr::V4(B4), &opts).unwrap(),
    );
    let (qa, ca) = ud_qp(&a);
    let (qb, _cb) = ud_qp(&b);
    qb.attach_mcast(&Gid::from(GROUP), 0).unwrap();
    for hop_limit in [64, 7] {
        let ah = AhAttr {
            hop_limit,
            ..AhAttr::roce_v2(Gid::from(GROUP))
        };
        ud_send(&a, &qa, &ca, &ah, MULTICAST_QPN);
        let seen = drain(&sniff);
        let want = Fields {
            traffic_class: 0,
            hop_limit,
            ..RC
        };
        assert_eq!(
            seen.iter().map(|s| s.1).collect::<Vec<_>>(),
            [want],
            "multicast"
        );
    }
    drop((a, b, qa, qb));

    // The capture tells the same truth: every record sent by softroce has the fields the
    // sniffer saw (the receiving side records nothing twice).
    capture.flush().unwrap();
    let mut recorded = Vec::new();
    for frame in CaptureReader::open(PathBuf::from(&pcap).as_path()).unwrap() {
        let frame = frame.unwrap();
        if let Some((_, f)) = roce_fields(&frame.data) {
            recorded.push(f);
        }
    }
    let multicast = |h| Fields {
        traffic_class: 0,
        hop_limit: h,
        ..RC
    };
    let ud = Fields {
        traffic_class: 0x20,
        ..RC
    };
    let mut want = Vec::new();
    for _ in 0..2 {
        want.extend([RC; 4]);
        want.push(ud);
    }
    want.extend([multicast(64), multicast(7)]);
    assert_eq!(recorded, want, "pcap records");

    // With batching on (no capture), a bulk WRITE still goes by UDP GSO, whose segments
    // carry a UDP checksum (Linux refuses GSO without one), and the datagrams sent alone
    // (the ACK) carry checksum 0.
    let plain = UdpOptions::default();
    let (a, b) = (
        side(IpAddr::V4(A4), &plain).unwrap(),
        side(IpAddr::V4(B4), &plain).unwrap(),
    );
    connect(&a, &b, 0);
    let (src, dst) = (support::mr(&a, 65536), support::mr(&b, 65536));
    src.write(0, &support::pattern(65536, 3)).unwrap();
    let mut wr = SendWr::new(5, WrOpcode::RdmaWrite, vec![src.sge(0, 65536)]);
    wr.remote_addr = dst.addr();
    wr.rkey = dst.rkey();
    wr.send_flags |= softroce::verbs::SendFlags::SIGNALED;
    a.qp.post_send(&[wr]).unwrap();
    assert_eq!(wait_one(&a.cq).status, WcStatus::Success);
    assert_eq!(dst.to_vec(), support::pattern(65536, 3));
    assert!(
        a.dev
            .link()
            .tx_gso_sends
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
    let seen = drain(&sniff);
    let zero = seen.iter().filter(|(_, f)| f.udp_checksum == 0).count();
    assert!(zero >= 1, "the ACK goes alone, with checksum 0: {seen:?}");

    // Datagrams that leave together but cannot form a GSO send (a short one, then a longer
    // one) go out of the checksum-free socket: every one carries checksum 0 (the interop
    // suite saw checksums on such runs, an ACK beside a SEND, before).
    let (small, big) = (support::mr(&a, 40), support::mr(&a, 100));
    let rx = support::mr(&b, 200);
    b.qp.post_recv(&[
        RecvWr {
            wr_id: 11,
            sg_list: vec![rx.sge(0, 100)],
        },
        RecvWr {
            wr_id: 12,
            sg_list: vec![rx.sge(100, 100)],
        },
    ])
    .unwrap();
    let mut first = SendWr::new(6, WrOpcode::Send, vec![small.sge(0, 40)]);
    first.send_flags |= softroce::verbs::SendFlags::SIGNALED;
    let mut second = SendWr::new(7, WrOpcode::Send, vec![big.sge(0, 100)]);
    second.send_flags |= softroce::verbs::SendFlags::SIGNALED;
    a.qp.post_send(&[first, second]).unwrap();
    for cq in [&b.cq, &b.cq, &a.cq, &a.cq] {
        assert_eq!(wait_one(cq).status, WcStatus::Success);
    }
    let seen = drain(&sniff);
    assert!(seen.len() >= 3, "two SENDs and an ACK: {seen:?}");
    assert!(
        seen.iter().all(|(_, f)| f.udp_checksum == 0),
        "lone datagrams carry checksum 0: {seen:?}"
    );
}
