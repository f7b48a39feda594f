//! Issue 14, engine items 5–10: what the work completions and counters of two sans-IO QP
//! engines, fed each other's packets, say against kernel rxe 6.1 (rxe_comp.c
//! `make_send_cqe`, rxe_resp.c `do_complete`, rxe_recv.c `rxe_rcv`), and the two deliberate
//! differences from rxe that spec/deviations.toml records (items 5 and 6). The wire items
//! (1–4) are pinned on real sockets by tests/ip_fields.rs.

use softroce::transport::{
    AccessFlags, CqSel, DropReason, Instant, IpFields, MULTICAST_QPN, MemoryTable, Path, PathMtu,
    QpAttrMask, QpAttrs, QpCap, QpEngine, QpModify, QpState, QpType, RecvWr, SendWr, Sge, Wc,
    WcFlags, WcOpcode, WcStatus, WrOpcode,
};
use softroce::wire::{BthRepr, DethRepr, Opcode, PacketRepr, Psn, RocePacket};
use std::net::{IpAddr, Ipv4Addr};

const PD: u32 = 1;
const A_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 93, 1));
const B_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 93, 2));
const A_QPN: u32 = 0x11;
const B_QPN: u32 = 0x12;
const QKEY: u32 = 0x1111_2222;

/// One side: an engine and its memory, with one 64 KiB MR (every right).
struct Side {
    e: QpEngine,
    mem: MemoryTable,
    key: u32,
    va: u64,
    ip: IpAddr,
}

fn side(t: QpType, qpn: u32, dest: u32, ip: IpAddr, peer: IpAddr) -> Side {
    let mut e = QpEngine::new(qpn, t, PD, QpCap::default(), true);
    let attrs = QpAttrs {
        path_mtu: PathMtu::Mtu1024,
        dest_qp_num: dest,
        rq_psn: Psn::new(0x100),
        sq_psn: Psn::new(0x100),
        qkey: QKEY,
        qp_access_flags: AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        timeout: 14,
        retry_cnt: 7,
        ..QpAttrs::default()
    };
    let path = Path {
        local: ip,
        remote: peer,
        src_port: 0xc000,
        ip: IpFields::default(),
    };
    if t.is_datagram() {
        // A datagram QP's source is fixed at creation.
        e.set_path(path);
    }
    e.modify_to(QpState::Rts, &attrs, Some(path))
        .expect("RESET -> RTS");
    let mut mem = MemoryTable::new(7);
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let key = mem.register(PD, 65536, all).expect("register");
    let va = mem.get(key).expect("mr").iova;
    Side {
        e,
        mem,
        key,
        va,
        ip,
    }
}

fn rc_pair() -> (Side, Side) {
    (
        side(QpType::Rc, A_QPN, B_QPN, A_IP, B_IP),
        side(QpType::Rc, B_QPN, A_QPN, B_IP, A_IP),
    )
}

fn sge(s: &Side, offset: u64, length: u32) -> Vec<Sge> {
    vec![Sge {
        addr: s.va + offset,
        length,
        lkey: s.key,
    }]
}

/// Moves every datagram between the two engines until neither has one; returns the AETH
/// syndromes of the ACKs that went by.
fn pump(a: &mut Side, b: &mut Side) -> Vec<u8> {
    let mut aeths = Vec::new();
    for _ in 0..1000 {
        let moved = carry(a, b, &mut aeths) + carry(b, a, &mut aeths);
        if moved == 0 {
            return aeths;
        }
    }
    panic!("the engines never went quiet");
}

/// Delivers everything `from` sends now to `to`; returns how many datagrams.
fn carry(from: &mut Side, to: &mut Side, aeths: &mut Vec<u8>) -> usize {
    let mut n = 0;
    while let Some(t) = from.e.poll_transmit(Instant::ZERO, &from.mem) {
        // SAFETY: the engine built `t` just now and no MR has changed since.
        let bytes = unsafe { t.to_vec() };
        let pkt = RocePacket::parse(&bytes).expect("engine output parses");
        if let Some(aeth) = pkt.repr.aeth {
            aeths.push(aeth.syndrome);
        }
        to.e.handle_packet(Instant::ZERO, &pkt, from.ip, &mut to.mem);
        n += 1;
    }
    n
}

fn completions(s: &mut Side, cq: CqSel) -> Vec<Wc> {
    std::iter::from_fn(|| s.e.poll_completion())
        .filter(|c| c.cq == cq)
        .map(|c| c.wc)
        .collect()
}

// Items 7 and 9 (rxe `make_send_cqe`): a successful send completion carries the message
// length as byte_len, and IBV_WC_WITH_IMM for SEND_WITH_IMM and RDMA_WRITE_WITH_IMM.
#[test]
fn issue_14_requester_completions_carry_byte_len_and_with_imm() {
    let (mut a, mut b) = rc_pair();
    for i in 0..3 {
        b.e.post_recv(RecvWr {
            wr_id: 100 + i,
            sg_list: sge(&b, 0, 8192),
        })
        .unwrap();
    }
    let mut send_imm = SendWr::new(1, WrOpcode::SendWithImm, sge(&a, 0, 3000));
    send_imm.imm_data = 0x0102_0304;
    a.e.post_send(send_imm).unwrap();
    a.e.post_send(SendWr::new(2, WrOpcode::Send, sge(&a, 0, 5)))
        .unwrap();
    let mut write = SendWr::new(3, WrOpcode::RdmaWrite, sge(&a, 0, 100));
    write.remote_addr = b.va + 16384;
    write.rkey = b.key;
    a.e.post_send(write.clone()).unwrap();
    let mut write_imm = write.clone();
    write_imm.wr_id = 4;
    write_imm.opcode = WrOpcode::RdmaWriteWithImm;
    write_imm.sg_list = sge(&a, 0, 2500);
    a.e.post_send(write_imm).unwrap();
    let mut read = write.clone();
    read.wr_id = 5;
    read.opcode = WrOpcode::RdmaRead;
    read.sg_list = sge(&a, 32768, 1500);
    a.e.post_send(read).unwrap();
    pump(&mut a, &mut b);
    let got: Vec<(u64, WcStatus, WcOpcode, u32, WcFlags)> = completions(&mut a, CqSel::Send)
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len, w.wc_flags))
        .collect();
    let ok = WcStatus::Success;
    assert_eq!(
        got,
        [
            (1, ok, WcOpcode::Send, 3000, WcFlags::WITH_IMM),
            (2, ok, WcOpcode::Send, 5, WcFlags::empty()),
            (3, ok, WcOpcode::RdmaWrite, 100, WcFlags::empty()),
            (4, ok, WcOpcode::RdmaWrite, 2500, WcFlags::WITH_IMM),
            (5, ok, WcOpcode::RdmaRead, 1500, WcFlags::empty()),
        ]
    );
}

// Item 8 (rxe `do_complete`, user CQ): every successful receive completion has IBV_WC_GRH,
// on RC too, since every RoCE packet arrives with a network header.
#[test]
fn issue_14_rc_receive_completions_have_grh() {
    let (mut a, mut b) = rc_pair();
    for i in 0..2 {
        b.e.post_recv(RecvWr {
            wr_id: 100 + i,
            sg_list: sge(&b, 0, 4096),
        })
        .unwrap();
    }
    a.e.post_send(SendWr::new(1, WrOpcode::Send, sge(&a, 0, 10)))
        .unwrap();
    let mut write_imm = SendWr::new(2, WrOpcode::RdmaWriteWithImm, sge(&a, 0, 20));
    write_imm.remote_addr = b.va + 8192;
    write_imm.rkey = b.key;
    write_imm.imm_data = 0x0a0b_0c0d;
    a.e.post_send(write_imm).unwrap();
    pump(&mut a, &mut b);
    let got: Vec<(u64, WcOpcode, u32, WcFlags, u32)> = completions(&mut b, CqSel::Recv)
        .iter()
        .map(|w| (w.wr_id, w.opcode, w.byte_len, w.wc_flags, w.imm_data))
        .collect();
    assert_eq!(
        got,
        [
            (100, WcOpcode::Recv, 10, WcFlags::GRH, 0),
            (
                101,
                WcOpcode::RecvRdmaWithImm,
                20,
                WcFlags::GRH | WcFlags::WITH_IMM,
                0x0a0b_0c0d
            ),
        ]
    );
}

// Item 6, a recorded deviation (spec/deviations.toml): IBTA ch. 9, a SEND longer than its
// receive WQE is a length error: NAK Invalid Request, LOC_LEN_ERR at the responder and
// REM_INV_REQ_ERR at the requester (rxe 6.1: NAK 0x63, LOC_QP_OP_ERR, REM_OP_ERR).
#[test]
fn issue_14_send_longer_than_the_receive_is_a_length_error_as_ibta_says() {
    let (mut a, mut b) = rc_pair();
    b.e.post_recv(RecvWr {
        wr_id: 100,
        sg_list: sge(&b, 0, 64),
    })
    .unwrap();
    a.e.post_send(SendWr::new(1, WrOpcode::Send, sge(&a, 0, 100)))
        .unwrap();
    let aeths = pump(&mut a, &mut b);
    assert_eq!(aeths, [0x61], "NAK Invalid Request");
    let recv = completions(&mut b, CqSel::Recv);
    assert_eq!(recv[0].status, WcStatus::LocLenErr);
    assert_eq!(
        recv[0].wc_flags,
        WcFlags::empty(),
        "no GRH on an error completion"
    );
    let send = completions(&mut a, CqSel::Send);
    assert_eq!(send[0].status, WcStatus::RemInvReqErr);
    assert_eq!(send[0].byte_len, 0, "no byte_len on an error completion");
    assert_eq!((a.e.state(), b.e.state()), (QpState::Err, QpState::Err));
}

fn ud_side(qpn: u32, ip: IpAddr) -> Side {
    let mut s = side(QpType::Ud, qpn, 0, ip, ip);
    let m = QpModify {
        qkey: QKEY,
        ..QpModify::default()
    };
    s.e.modify(&m, QpAttrMask::QKEY)
        .expect("RTS -> RTS with a Q_Key");
    s
}

// Item 5, a recorded deviation (spec/deviations.toml): IBTA ch. 10, a WR Q_Key with the
// high bit set is replaced by the sending QP's own (rxe 6.1 sends it as is).
#[test]
fn issue_14_ud_qkey_with_the_high_bit_is_the_qps_own_as_ibta_says() {
    let mut a = ud_side(A_QPN, A_IP);
    for (asked, sent) in [
        (0x8000_0000, QKEY),
        (0x8765_4321, QKEY),
        (0x0765_4321, 0x0765_4321),
    ] {
        let mut wr = SendWr::new(1, WrOpcode::Send, sge(&a, 0, 8));
        wr.ud = Some(softroce::transport::UdDest {
            remote_ip: B_IP,
            remote_qpn: B_QPN,
            remote_qkey: asked,
            ip: IpFields::default(),
        });
        a.e.post_send(wr).unwrap();
        let t =
            a.e.poll_transmit(Instant::ZERO, &a.mem)
                .expect("a datagram");
        // SAFETY: built just now.
        let bytes = unsafe { t.to_vec() };
        let deth = RocePacket::parse(&bytes).unwrap().repr.deth.unwrap();
        assert_eq!(deth.qkey, sent, "WR Q_Key {asked:#x}");
    }
}

/// A UD SEND ONLY of 8 bytes to `dest_qpn` with Q_Key `qkey`, as the peer would send it.
fn ud_send(dest_qpn: u32, qkey: u32) -> Vec<u8> {
    let mut repr = PacketRepr::new(BthRepr::new(Opcode::UD_SEND_ONLY, dest_qpn, Psn::new(0)));
    repr.deth = Some(DethRepr {
        qkey,
        src_qpn: B_QPN,
    });
    repr.payload_len = 8;
    let mut buf = vec![0u8; repr.buffer_len()];
    let flow = Path {
        local: B_IP,
        remote: A_IP,
        src_port: 0xc000,
        ip: IpFields::default(),
    };
    repr.emit(&mut buf, &[7u8; 8], &flow_icrc(&flow));
    buf
}

fn flow_icrc(p: &Path) -> softroce::wire::IcrcIp {
    match (p.local, p.remote) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => softroce::wire::IcrcIp::V4 {
            src,
            dst,
            ident: 0,
            src_port: p.src_port,
            dst_port: softroce::wire::ROCE_V2_UDP_PORT,
        },
        _ => unreachable!("IPv4 only here"),
    }
}

// Item 10 (rxe `rxe_rcv`): rcvd_pkts counts a packet only once it passed the header checks
// (rxe `hdr_check`, the Q_Key among them) and the ICRC; a wrong Q_Key is softroce's
// bad_qkey drop and not a received packet. A packet to the multicast QPN is counted by the
// device that fans it out, once, not by each member.
#[test]
fn issue_14_rcvd_pkts_counts_only_packets_past_the_header_checks() {
    let mut a = ud_side(A_QPN, A_IP);
    for i in 0..3 {
        a.e.post_recv(RecvWr {
            wr_id: i,
            sg_list: sge(&a, 0, 4096),
        })
        .unwrap();
    }
    let feed = |a: &mut Side, bytes: &[u8]| {
        let pkt = RocePacket::parse(bytes).unwrap();
        a.e.handle_packet(Instant::ZERO, &pkt, B_IP, &mut a.mem);
    };
    feed(&mut a, &ud_send(A_QPN, 0x0bad));
    assert_eq!(a.e.counters().rcvd_pkts, 0, "wrong Q_Key: not received");
    assert_eq!(a.e.counters().dropped(DropReason::BadQkey), 1);
    assert!(DropReason::BadQkey.precedes_rcvd_pkts());
    feed(&mut a, &ud_send(A_QPN, QKEY));
    assert_eq!(a.e.counters().rcvd_pkts, 1);
    feed(&mut a, &ud_send(MULTICAST_QPN, QKEY));
    assert_eq!(a.e.counters().rcvd_pkts, 1, "the device counts multicast");
    let recv = completions(&mut a, CqSel::Recv);
    assert_eq!(recv.len(), 2);
    assert!(recv.iter().all(|w| w.status == WcStatus::Success));

    // Every drop reason is on one side of rcvd_pkts, as in rxe_recv.c: what rxe_rcv checks
    // before counting, and what the responder or completer decides after.
    let before: Vec<&str> = DropReason::ALL
        .iter()
        .filter(|r| r.precedes_rcvd_pkts())
        .map(|r| r.name())
        .collect();
    assert_eq!(
        before,
        [
            "truncated",
            "bad_tver",
            "unknown_opcode",
            "bad_pad_count",
            "length_mismatch",
            "icrc_errors",
            "bad_framing",
            "unknown_qp",
            "wrong_qp_type",
            "wrong_qp_state",
            "bad_pkey",
            "wrong_source",
            "bad_qkey",
        ]
    );
}
