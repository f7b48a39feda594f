//! Tests of [`UdpLink`](super::UdpLink): its ICMP reading, the hold of ACKs, the ICRC
//! corrections of GSO sends.

use super::*;
use crate::transport::TxKind;
use crate::wire::{IcrcIp, icrc_of_body};

fn datagram(kind: TxKind, dst: IpAddr, src_port: u16, tag: u8) -> Transmit {
    Transmit {
        kind,
        dst,
        src_port,
        payload: vec![tag; 24],
        tail: None,
        ip: crate::transport::IpFields::default(),
    }
}

/// A QP's datagrams to an address where no RoCE device listens draw ICMP port
/// unreachable, which the link reads and logs (issue 25 item 3): the send that the
/// pending error fails is made again, and the peer is told.
#[test]
fn icmp_for_a_qps_datagrams_is_read_and_logged() {
    let ip = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 23, 21));
    let nobody = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 23, 22));
    let link = UdpLink::bind(ip).expect("bind");
    let t = datagram(TxKind::Request, nobody, 0xc321, 0x5e);
    // Loopback answers at once; each send after the first meets the pending error.
    let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !link.told_unreachable(nobody) {
        link.send(&t)
            .expect("a send, made again after an ICMP error");
        assert!(
            std::time::Instant::now() < end,
            "no ICMP error read within 20 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(!link.told_unreachable(ip));
}

/// ACKs held back while received datagrams are delivered leave before a later MAD of
/// QP1: a DREQ overtaking them ends the peer's QP before its last SENDs are
/// acknowledged (the ucmatose failure against rxe: the peer drops the late ACKs).
#[test]
fn a_qp1_mad_sends_the_held_acks_first() {
    let ip = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 23, 11));
    let peer_ip = std::net::Ipv4Addr::new(127, 0, 23, 12);
    let peer = std::net::UdpSocket::bind((peer_ip, ROCE_V2_UDP_PORT)).expect("bind peer");
    peer.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .expect("timeout");
    let link = UdpLink::bind(ip).expect("bind");
    let dst = IpAddr::V4(peer_ip);
    link.holding_acks.store(true, Ordering::Relaxed);
    assert_eq!(
        link.send_batch(&[datagram(TxKind::Acknowledge, dst, 0xc123, 0xac)]),
        0
    );
    link.holding_acks.store(false, Ordering::Relaxed);
    assert_eq!(link.deferred.lock().len(), 1, "the ACK is held");
    let mad = datagram(TxKind::Request, dst, gsi_source_port(), 0x3a);
    assert_eq!(link.send_batch(&[mad]), 0);
    assert!(link.deferred.lock().is_empty(), "nothing is held any more");
    let mut buf = [0u8; 256];
    let mut order = Vec::new();
    for _ in 0..2 {
        let (n, from) = peer.recv_from(&mut buf).expect("a datagram within 20 s");
        assert!(n >= 24, "{n} B");
        order.push((buf[0], from.port()));
    }
    assert_eq!(
        order,
        [(0xac, 0xc123), (0x3a, gsi_source_port())],
        "the held ACK, then the MAD"
    );
}

/// Entry `i` of a correction table turns the ICRC computed for IPv4 ID 0 into the one
/// for ID `i`, for any body of the table's length; tables are per flow and length.
#[test]
fn ident_deltas_turn_the_icrc_for_id_0_into_the_icrc_for_id_i() {
    let ip = std::net::Ipv4Addr::new(127, 0, 23, 1);
    let link = UdpLink::bind(IpAddr::V4(ip)).expect("bind");
    let dst = std::net::Ipv4Addr::new(127, 0, 23, 2);
    for (len, port) in [(20usize, 0xc000u16), (4108, 0xc001), (77, 0xc000)] {
        let body: Vec<u8> = (0..len as u32).map(|i| (i * 29 % 253) as u8).collect();
        let flow = |ident| IcrcIp::V4 {
            src: ip,
            dst,
            ident,
            src_port: port,
            dst_port: ROCE_V2_UDP_PORT,
        };
        let table = link.ident_deltas(ip, dst, port, len);
        let at0 = icrc_of_body(&flow(0), &body);
        for (i, d) in table.iter().enumerate() {
            let mut got = at0;
            for (g, x) in got.iter_mut().zip(d) {
                *g ^= x;
            }
            assert_eq!(got, icrc_of_body(&flow(i as u16), &body), "{len} B, ID {i}");
        }
        assert!(Arc::ptr_eq(&table, &link.ident_deltas(ip, dst, port, len)));
    }
}

/// `stage_messages` copies each message's parts into one buffer, in order, and hands back
/// one part per message with the message's GSO segment size, so a staged send carries
/// exactly the bytes the gathered one would.
#[test]
fn staged_messages_carry_their_parts_bytes_in_order() {
    let (a, b, c, d) = ([1u8; 5], [2u8; 3], [3u8; 4], [4u8; 7]);
    let parts = [
        TxPart::from(&a[..]),
        TxPart::from(&b[..]),
        TxPart::from(&c[..]),
        TxPart::from(&d[..]),
    ];
    let msgs = [
        GatheredMsg {
            first: 0,
            count: 3,
            segment_bytes: Some(4),
        },
        GatheredMsg {
            first: 3,
            count: 1,
            segment_bytes: None,
        },
    ];
    let mut staging = vec![9u8; 100];
    let staged = stage_messages(&parts, &msgs, &mut staging);
    let (p, m) = staged.as_slices();
    assert_eq!(p.len(), 2);
    let bytes = |t: &TxPart<'_>| {
        let mut v = Vec::new();
        t.copy_into(&mut v);
        v
    };
    assert_eq!(bytes(&p[0]), [&a[..], &b[..], &c[..]].concat());
    assert_eq!(bytes(&p[1]), d.to_vec());
    assert_eq!(
        m,
        &[
            GatheredMsg {
                first: 0,
                count: 1,
                segment_bytes: Some(4),
            },
            GatheredMsg {
                first: 1,
                count: 1,
                segment_bytes: None,
            },
        ]
    );
}
