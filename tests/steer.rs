//! `net::steer` in the kernel: a `SO_REUSEPORT` group of UDP sockets on one loopback address
//! (port 4791 of 127.0.92.1; run inside `unshare -n` with `lo` up, or on the host) with the
//! steering program attached, and datagrams shaped as RoCEv2 packets sent to it from a plain
//! socket: each lands on the socket of its slot — by the BTH destination QP, and for QP1 by
//! the CM message (REQ by the listener table, the others by the receiver's comm ID) — and what
//! names no slot, or is too short to say, lands on slot 0.

use socket2::{Domain, Protocol, Socket, Type};
use softroce::net::steer::{self, Listener};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::Duration;

const IP: Ipv4Addr = Ipv4Addr::new(127, 0, 92, 1);
const SLOTS: usize = 4;

fn member() -> UdpSocket {
    member_at(IP)
}

fn member_at(ip: Ipv4Addr) -> UdpSocket {
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
    s.set_reuse_port(true).unwrap();
    s.bind(&SocketAddr::from((ip, 4791)).into())
        .unwrap_or_else(|e| panic!("bind {ip}:4791 (is another test or device on it?): {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.into()
}

/// A UDP payload: a BTH with destination QP `qpn`, and for QP1 a DETH and a CM MAD of
/// attribute `attr` with the CM message's first 16 bytes `cm`.
fn datagram(qpn: u32, attr: u16, cm: [u8; 16]) -> Vec<u8> {
    let mut d = vec![0u8; 12 + 8 + 256];
    d[0] = 0x64; // UD SEND only
    d[4..8].copy_from_slice(&(qpn & 0x00ff_ffff).to_be_bytes());
    d[20] = 1; // MAD base version
    d[21] = 7; // CM class
    d[36..38].copy_from_slice(&attr.to_be_bytes());
    d[44..60].copy_from_slice(&cm);
    d
}

fn cm_ids(local: u32, remote: u32) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[0..4].copy_from_slice(&local.to_be_bytes());
    m[4..8].copy_from_slice(&remote.to_be_bytes());
    m
}

fn req(service_id: u64) -> [u8; 16] {
    let mut m = cm_ids(0x1234_5678, 0);
    m[8..16].copy_from_slice(&service_id.to_be_bytes());
    m
}

#[test]
fn each_datagram_reaches_the_socket_of_its_slot() {
    let group: Vec<UdpSocket> = (0..SLOTS).map(|_| member()).collect();
    let listeners = [
        Listener {
            service_id: 0x0000_0000_0106_4e21,
            slot: 2,
        },
        Listener {
            service_id: 0x0000_0000_0106_4e22,
            slot: 3,
        },
    ];
    let prog = steer::program(SLOTS, &listeners).unwrap();
    steer::attach(&group[0], &prog).expect("the kernel takes the program");
    let tx = UdpSocket::bind((IP, 0)).unwrap();
    let slot_qpn = |slot: u32, n: u32| (slot << steer::QPN_SHIFT) | n;
    let slot_id = |slot: u32, n: u32| (slot << steer::COMM_ID_SHIFT) | n;
    let cases: Vec<(&str, Vec<u8>, usize)> = vec![
        ("RC QPN of slot 1", datagram(slot_qpn(1, 17), 0, [0; 16]), 1),
        (
            "RC QPN of slot 3",
            datagram(slot_qpn(3, 0xffff), 0, [0; 16]),
            3,
        ),
        ("a QPN of slot 0", datagram(0x11, 0, [0; 16]), 0),
        (
            "a QPN of a slot with no socket",
            datagram(slot_qpn(9, 1), 0, [0; 16]),
            0,
        ),
        (
            "REQ for slot 2's listener",
            datagram(1, 0x0010, req(0x0106_4e21)),
            2,
        ),
        (
            "SIDR_REQ for slot 3's listener",
            datagram(1, 0x0017, req(0x0106_4e22)),
            3,
        ),
        (
            "REQ nobody listens for",
            datagram(1, 0x0010, req(0x0106_4e23)),
            0,
        ),
        (
            "REP to slot 1's comm ID",
            datagram(1, 0x0013, cm_ids(0xdead, slot_id(1, 5))),
            1,
        ),
        (
            "DREQ to slot 3's comm ID",
            datagram(1, 0x0015, cm_ids(0xbeef, slot_id(3, 6))),
            3,
        ),
        (
            "SIDR_REP to slot 2's request ID",
            datagram(1, 0x0018, cm_ids(slot_id(2, 7), 0)),
            2,
        ),
        (
            "REJ naming comm ID 0 (a withdrawn REQ)",
            datagram(1, 0x0012, cm_ids(0x1234_5678, 0)),
            0,
        ),
        ("a datagram too short for a BTH", vec![0x64, 0, 0], 0),
    ];
    let mut buf = [0u8; 2048];
    for (what, d, want) in &cases {
        tx.send_to(d, (IP, 4791)).unwrap();
        let (n, _) = group[*want]
            .recv_from(&mut buf)
            .unwrap_or_else(|e| panic!("{what}: nothing on slot {want}'s socket ({e})"));
        assert_eq!(&buf[..n], &d[..], "{what}: another datagram on slot {want}");
        for (i, s) in group.iter().enumerate() {
            s.set_nonblocking(true).unwrap();
            assert!(
                s.recv_from(&mut buf).is_err(),
                "{what}: a datagram also on slot {i} (want {want})"
            );
            s.set_nonblocking(false).unwrap();
        }
    }
}

/// With an `unnamed` slot, what names comm ID 0 as its receiver's goes there (the keeper's
/// choice: the newest listener's slot), and the rest as before.
#[test]
fn a_rej_naming_no_receiver_goes_to_the_unnamed_slot() {
    const IP3: Ipv4Addr = Ipv4Addr::new(127, 0, 92, 3);
    let group: Vec<UdpSocket> = (0..SLOTS).map(|_| member_at(IP3)).collect();
    let prog = steer::program_with_unnamed(SLOTS, &[], 2).unwrap();
    steer::attach(&group[0], &prog).expect("the kernel takes the program");
    let tx = UdpSocket::bind((IP3, 0)).unwrap();
    let mut buf = [0u8; 2048];
    for (d, want) in [
        (datagram(1, 0x0012, cm_ids(0x1234_5678, 0)), 2),
        (datagram(1, 0x0015, cm_ids(0x1234_5678, 3 << 24)), 3),
    ] {
        tx.send_to(&d, (IP3, 4791)).unwrap();
        let (n, _) = group[want].recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], &d[..]);
    }
    assert_eq!(
        steer::program_with_unnamed(SLOTS, &[], SLOTS as u16)
            .unwrap_err()
            .raw_os_error(),
        Some(22)
    );
}

#[test]
fn the_program_refuses_slots_out_of_range_and_tables_too_long() {
    let bad = Listener {
        service_id: 1,
        slot: 4,
    };
    assert_eq!(
        steer::program(4, &[bad]).unwrap_err().raw_os_error(),
        Some(22)
    );
    assert_eq!(steer::program(0, &[]).unwrap_err().raw_os_error(), Some(22));
    let too_many_slots = steer::MAX_SLOTS + 1;
    assert_eq!(
        steer::program(too_many_slots, &[])
            .unwrap_err()
            .raw_os_error(),
        Some(22)
    );
    let many: Vec<Listener> = (0..1000)
        .map(|i| Listener {
            service_id: i,
            slot: 1,
        })
        .collect();
    assert_eq!(
        steer::program(2, &many).unwrap_err().raw_os_error(),
        Some(22)
    );
    let most: Vec<Listener> = (0..800)
        .map(|i| Listener {
            service_id: i,
            slot: 1,
        })
        .collect();
    assert!(steer::program(2, &most).is_ok());
}

// The fact the design is built around (docs/architecture.md): a socket's index in the group
// is its place in the kernel's array, and when one closes the last takes its place, so a
// datagram for slot 1 then reaches what was slot 2's socket. Hence the group's owner keeps
// every slot's socket open for the life of the group, and a process only borrows its own.
#[test]
fn a_closed_member_is_replaced_by_the_last_one() {
    const IP2: Ipv4Addr = Ipv4Addr::new(127, 0, 92, 2);
    let bind = || {
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
        s.set_reuse_port(true).unwrap();
        s.bind(&SocketAddr::from((IP2, 4791)).into()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        UdpSocket::from(s)
    };
    let (s0, s1, s2) = (bind(), bind(), bind());
    steer::attach(&s0, &steer::program(3, &[]).unwrap()).unwrap();
    drop(s1);
    let tx = UdpSocket::bind((IP2, 0)).unwrap();
    let d = datagram(1 << steer::QPN_SHIFT, 0, [0; 16]);
    tx.send_to(&d, (IP2, 4791)).unwrap();
    let mut buf = [0u8; 512];
    let (n, _) = s2
        .recv_from(&mut buf)
        .expect("slot 1's datagram on the moved socket");
    assert_eq!(&buf[..n], &d[..]);
    s0.set_nonblocking(true).unwrap();
    assert!(s0.recv_from(&mut buf).is_err());
}
