//! Byte-for-byte parity with kernel rxe: the sans-IO engine, given the QPNs, PSNs, addresses,
//! UDP ports and data of a captured kernel-rxe exchange (tests/captures, rxe 6.1), must emit
//! the same requests and the same responses — every byte but the ICRC identical, and the ICRC
//! equal to rxe's once computed with the IPv4 ID rxe's IP layer wrote (we send ID 0).

mod common;

use common::{CapturedDatagram, datagrams};
use softroce::transport::{
    AccessFlags, Instant, MemoryTable, Path, PathMtu, QpAttrMask, QpAttrs, QpCap, QpEngine,
    QpModify, QpState, QpType, SendWr, Sge, Transmit, WrOpcode,
};
use softroce::wire::{IcrcIp, Psn, RocePacket, icrc_of_body};

const PD: u32 = 1;

fn engine(qpn: u32, dest: u32, local: &CapturedDatagram, sq_psn: u32, rq_psn: u32) -> QpEngine {
    engine_of(QpType::Rc, qpn, dest, local, sq_psn, rq_psn)
}

fn engine_of(
    t: QpType,
    qpn: u32,
    dest: u32,
    local: &CapturedDatagram,
    sq_psn: u32,
    rq_psn: u32,
) -> QpEngine {
    // `local` is a datagram this engine's side sent: its source is our address.
    let mut e = QpEngine::new(qpn, t, PD, QpCap::default(), false);
    let attrs = QpAttrs {
        path_mtu: PathMtu::Mtu1024,
        dest_qp_num: dest,
        sq_psn: Psn::new(sq_psn),
        rq_psn: Psn::new(rq_psn),
        qp_access_flags: AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        ..QpAttrs::default()
    };
    let path = Path {
        local: local.src,
        remote: local.dst,
        src_port: local.src_port,
        ip: Default::default(),
    };
    if t.is_datagram() {
        // A datagram QP's source is fixed at creation.
        e.set_path(path);
    }
    e.modify_to(QpState::Rts, &attrs, Some(path))
        .expect("RESET -> RTS");
    e
}

/// Asserts our datagram equals rxe's (ICRC checked with rxe's IP ID).
fn assert_same(ours: &Transmit, rxe: &CapturedDatagram, what: &str) {
    assert_eq!(ours.dst, rxe.dst, "{what}: destination");
    assert_eq!(ours.src_port, rxe.src_port, "{what}: UDP source port");
    let n = rxe.payload.len();
    assert_eq!(ours.payload.len(), n, "{what}: length");
    assert_eq!(
        format!("{:02x?}", &ours.payload[..n - 4]),
        format!("{:02x?}", &rxe.payload[..n - 4]),
        "{what}: bytes"
    );
    assert_eq!(
        icrc_of_body(&rxe.icrc_ip(), &ours.payload[..n - 4]),
        rxe.payload[n - 4..],
        "{what}: ICRC"
    );
}

fn pkt(d: &CapturedDatagram) -> RocePacket<'_> {
    RocePacket::parse(&d.payload).expect("captured packet parses")
}

/// Registers an MR holding `data`; returns (key, va).
fn mr_with(mem: &mut MemoryTable, data: &[u8]) -> (u32, u64) {
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let key = mem.register(PD, data.len().max(8), all).expect("register");
    let mr = mem.get_mut(key).expect("mr");
    mr.owned_bytes_mut().expect("owned")[..data.len()].copy_from_slice(data);
    (key, mr.iova)
}

/// The request `req` re-emitted with its RETH/AtomicETH pointing at our MR.
fn retarget(req: &CapturedDatagram, key: u32, va: u64) -> Vec<u8> {
    let p = pkt(req);
    let mut repr = p.repr;
    if let Some(r) = repr.reth.as_mut() {
        r.va = va;
        r.rkey = key;
    }
    if let Some(a) = repr.atomic_eth.as_mut() {
        a.va = va;
        a.rkey = key;
    }
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut buf, p.payload, &req.icrc_ip());
    buf
}

fn drain(e: &mut QpEngine, mem: &MemoryTable) -> Vec<Transmit> {
    std::iter::from_fn(|| e.poll_transmit(Instant::ZERO, mem)).collect()
}

#[test]
fn rdma_write_only_and_its_ack() {
    // ib_write_bw, 64 B: frame 1 is RC RDMA WRITE ONLY, frame 2 the ACK.
    let d = datagrams("13-write-bw.pcap");
    let (req, ack) = (&d[0], &d[1]);
    let w = pkt(req);
    let reth = w.repr.reth.expect("RETH");
    let (req_qpn, resp_qpn) = (pkt(ack).repr.bth.dest_qpn, w.repr.bth.dest_qpn);
    let psn = w.repr.bth.psn.value();

    let mut mem = MemoryTable::new(1);
    let (key, va) = mr_with(&mut mem, w.payload);
    let mut a = engine(req_qpn, resp_qpn, req, psn, 0);
    let mut wr = SendWr::new(
        1,
        WrOpcode::RdmaWrite,
        vec![Sge {
            addr: va,
            length: 64,
            lkey: key,
        }],
    );
    wr.remote_addr = reth.va;
    wr.rkey = reth.rkey;
    a.post_send(wr).unwrap();
    let out = drain(&mut a, &mem);
    assert_eq!(out.len(), 1);
    assert_same(&out[0], req, "RC_RDMA_WRITE_ONLY");

    let mut mem_b = MemoryTable::new(2);
    let (bkey, bva) = mr_with(&mut mem_b, &[0; 64]);
    let mut b = engine(resp_qpn, req_qpn, ack, 0, psn);
    let bytes = retarget(req, bkey, bva);
    b.handle_packet(
        Instant::ZERO,
        &RocePacket::parse(&bytes).unwrap(),
        req.src,
        &mut mem_b,
    );
    let out = drain(&mut b, &mem_b);
    assert_eq!(out.len(), 1);
    assert_same(&out[0], ack, "RC_ACKNOWLEDGE");
    assert_eq!(mem_b.get(bkey).unwrap().owned_bytes().unwrap(), w.payload);
}

#[test]
fn multi_packet_send_and_ack() {
    // ibv_rc_pingpong, 2500 B at MTU 1024: SEND FIRST, MIDDLE, LAST, then one ACK.
    let d = datagrams("05-rc-pingpong-multi.pcap");
    let first = pkt(&d[0]);
    assert_eq!(first.repr.bth.opcode.to_string(), "RC_SEND_FIRST");
    let data: Vec<u8> = d[0..3]
        .iter()
        .flat_map(|x| pkt(x).payload.to_vec())
        .collect();
    assert_eq!(data.len(), 2500);
    let ack = &d[3];
    let (req_qpn, resp_qpn) = (pkt(ack).repr.bth.dest_qpn, first.repr.bth.dest_qpn);
    let psn = first.repr.bth.psn.value();

    let mut mem = MemoryTable::new(1);
    let (key, va) = mr_with(&mut mem, &data);
    let mut a = engine(req_qpn, resp_qpn, &d[0], psn, 0);
    a.post_send(SendWr::new(
        1,
        WrOpcode::Send,
        vec![Sge {
            addr: va,
            length: 2500,
            lkey: key,
        }],
    ))
    .unwrap();
    let out = drain(&mut a, &mem);
    assert_eq!(out.len(), 3);
    for (i, o) in out.iter().enumerate() {
        assert_same(o, &d[i], &format!("SEND packet {i}"));
    }

    let mut mem_b = MemoryTable::new(2);
    let (bkey, bva) = mr_with(&mut mem_b, &[0; 4096]);
    let mut b = engine(resp_qpn, req_qpn, ack, 0, psn);
    b.post_recv(softroce::transport::RecvWr {
        wr_id: 7,
        sg_list: vec![Sge {
            addr: bva,
            length: 4096,
            lkey: bkey,
        }],
    })
    .unwrap();
    for x in &d[0..3] {
        b.handle_packet(Instant::ZERO, &pkt(x), x.src, &mut mem_b);
    }
    let out = drain(&mut b, &mem_b);
    assert_eq!(out.len(), 1, "one ACK for the LAST packet (AckReq)");
    assert_same(&out[0], ack, "RC_ACKNOWLEDGE");
    assert_eq!(
        &mem_b.get(bkey).unwrap().owned_bytes().unwrap()[..2500],
        &data[..]
    );
}

#[test]
fn read_request_and_three_responses() {
    // ib_read_bw, 2500 B at MTU 1024: READ request at p, responses FIRST/MIDDLE/LAST at
    // p, p+1, p+2 (docs/wire-facts.md §2.8).
    let d = datagrams("17-read-bw-multi.pcap");
    let req = &d[0];
    let r = pkt(req);
    let reth = r.repr.reth.expect("RETH");
    assert_eq!(reth.dma_len, 2500);
    let (req_qpn, resp_qpn) = (pkt(&d[1]).repr.bth.dest_qpn, r.repr.bth.dest_qpn);
    let psn = r.repr.bth.psn.value();
    let data: Vec<u8> = d[1..4]
        .iter()
        .flat_map(|x| pkt(x).payload.to_vec())
        .collect();

    let mut mem = MemoryTable::new(1);
    let (key, va) = mr_with(&mut mem, &[0; 2500]);
    let mut a = engine(req_qpn, resp_qpn, req, psn, 0);
    let mut wr = SendWr::new(
        1,
        WrOpcode::RdmaRead,
        vec![Sge {
            addr: va,
            length: 2500,
            lkey: key,
        }],
    );
    wr.remote_addr = reth.va;
    wr.rkey = reth.rkey;
    a.post_send(wr).unwrap();
    let out = drain(&mut a, &mem);
    assert_eq!(out.len(), 1);
    assert_same(&out[0], req, "RC_RDMA_READ_REQUEST");
    assert_eq!(
        a.next_psn(),
        Psn::new(psn).add(3),
        "a 2500 B READ uses 3 PSNs"
    );

    let mut mem_b = MemoryTable::new(2);
    let (bkey, bva) = mr_with(&mut mem_b, &data);
    let mut b = engine(resp_qpn, req_qpn, &d[1], 0, psn);
    let bytes = retarget(req, bkey, bva);
    b.handle_packet(
        Instant::ZERO,
        &RocePacket::parse(&bytes).unwrap(),
        req.src,
        &mut mem_b,
    );
    let out = drain(&mut b, &mem_b);
    assert_eq!(out.len(), 3);
    for (i, o) in out.iter().enumerate() {
        assert_same(o, &d[1 + i], &format!("READ response {i}"));
    }
    // And the requester takes them: the READ completes with rxe's bytes.
    for x in &d[1..4] {
        a.handle_packet(Instant::ZERO, &pkt(x), x.src, &mut mem);
    }
    let c = a.poll_completion().expect("READ completion");
    assert_eq!(c.wc.status, softroce::transport::WcStatus::Success);
    assert_eq!(mem.get(key).unwrap().owned_bytes().unwrap(), &data[..]);
}

#[test]
fn fetch_add_and_atomic_acknowledge() {
    let d = datagrams("18-atomic-fadd.pcap");
    let (req, ack) = (&d[0], &d[1]);
    let f = pkt(req);
    let at = f.repr.atomic_eth.expect("AtomicETH");
    let orig = pkt(ack)
        .repr
        .atomic_ack_eth
        .expect("AtomicAckETH")
        .orig_remote_data;
    let (req_qpn, resp_qpn) = (pkt(ack).repr.bth.dest_qpn, f.repr.bth.dest_qpn);
    let psn = f.repr.bth.psn.value();

    let mut mem = MemoryTable::new(1);
    let (key, va) = mr_with(&mut mem, &[0; 8]);
    let mut a = engine(req_qpn, resp_qpn, req, psn, 0);
    let mut wr = SendWr::new(
        1,
        WrOpcode::AtomicFetchAndAdd,
        vec![Sge {
            addr: va,
            length: 8,
            lkey: key,
        }],
    );
    wr.remote_addr = at.va;
    wr.rkey = at.rkey;
    wr.compare_add = at.swap_add;
    a.post_send(wr).unwrap();
    let out = drain(&mut a, &mem);
    assert_same(&out[0], req, "RC_FETCH_ADD");

    let mut mem_b = MemoryTable::new(2);
    let (bkey, bva) = mr_with(&mut mem_b, &orig.to_ne_bytes());
    let mut b = engine(resp_qpn, req_qpn, ack, 0, psn);
    let bytes = retarget(req, bkey, bva);
    b.handle_packet(
        Instant::ZERO,
        &RocePacket::parse(&bytes).unwrap(),
        req.src,
        &mut mem_b,
    );
    let out = drain(&mut b, &mem_b);
    assert_same(&out[0], ack, "RC_ATOMIC_ACKNOWLEDGE");
    let now = u64::from_ne_bytes(
        mem_b.get(bkey).unwrap().owned_bytes().unwrap()[..8]
            .try_into()
            .unwrap(),
    );
    assert_eq!(now, orig.wrapping_add(at.swap_add));
}

#[test]
fn write_with_bad_rkey_draws_nak_remote_access_error() {
    // pyverbs WRITE with a wrong R_Key: rxe answers NAK 0x62 at the request's PSN.
    let d = datagrams("54-nak-write-rkey.pcap");
    let (req, nak) = (&d[0], &d[1]);
    let w = pkt(req);
    let (req_qpn, resp_qpn) = (pkt(nak).repr.bth.dest_qpn, w.repr.bth.dest_qpn);
    let mut mem_b = MemoryTable::new(2);
    let _ = mr_with(&mut mem_b, &[0; 64]);
    let mut b = engine(resp_qpn, req_qpn, nak, 0, w.repr.bth.psn.value());
    b.handle_packet(Instant::ZERO, &w, req.src, &mut mem_b);
    let out = drain(&mut b, &mem_b);
    assert_eq!(out.len(), 1);
    assert_same(&out[0], nak, "NAK remote access error");
    assert_eq!(b.state(), QpState::Err);
}

#[test]
fn our_icrc_is_the_one_for_ip_id_zero() {
    // What softroce sends goes through an IP_PMTUDISC_DO socket: ID 0, DF. The ICRC the
    // engine writes must be the one for exactly that header.
    let d = datagrams("13-write-bw.pcap");
    let req = &d[0];
    let w = pkt(req);
    let mut mem = MemoryTable::new(1);
    let (key, va) = mr_with(&mut mem, w.payload);
    let mut a = engine(
        pkt(&d[1]).repr.bth.dest_qpn,
        w.repr.bth.dest_qpn,
        req,
        w.repr.bth.psn.value(),
        0,
    );
    let mut wr = SendWr::new(
        1,
        WrOpcode::RdmaWrite,
        vec![Sge {
            addr: va,
            length: 64,
            lkey: key,
        }],
    );
    wr.remote_addr = 0x1000;
    wr.rkey = 0x2000;
    a.post_send(wr).unwrap();
    let out = drain(&mut a, &mem);
    let p = &out[0].payload;
    let IcrcIp::V4 {
        src,
        dst,
        src_port,
        dst_port,
        ..
    } = req.icrc_ip()
    else {
        unreachable!()
    };
    let ip0 = IcrcIp::V4 {
        src,
        dst,
        ident: 0,
        src_port,
        dst_port,
    };
    assert_eq!(icrc_of_body(&ip0, &p[..p.len() - 4]), p[p.len() - 4..]);
}

#[test]
fn uc_send_only_with_and_without_immediate() {
    // ibv_uc_pingpong (64 B) and pyverbs' UC SEND ONLY WITH IMMEDIATE: AckReq 0, no ACK.
    for (file, op) in [
        ("02-uc-pingpong.pcap", WrOpcode::Send),
        ("52-uc-imm.pcap", WrOpcode::SendWithImm),
    ] {
        let d = datagrams(file);
        let s = pkt(&d[0]);
        let mut mem = MemoryTable::new(1);
        let (key, va) = mr_with(&mut mem, s.payload);
        let mut a = engine_of(
            QpType::Uc,
            0x99,
            s.repr.bth.dest_qpn,
            &d[0],
            s.repr.bth.psn.value(),
            0,
        );
        let mut wr = SendWr::new(
            1,
            op,
            vec![Sge {
                addr: va,
                length: s.payload.len() as u32,
                lkey: key,
            }],
        );
        wr.imm_data = s.repr.immdt.map_or(0, |i| i.imm_data);
        a.post_send(wr).unwrap();
        let out = drain(&mut a, &mem);
        assert_eq!(out.len(), 1);
        assert_same(&out[0], &d[0], file);
        let c = a.poll_completion().expect("UC completes when sent");
        assert_eq!(c.wc.status, softroce::transport::WcStatus::Success);
    }
}

#[test]
fn ud_send_only_with_immediate_and_its_udp_source_port() {
    // pyverbs UD SEND ONLY WITH IMMEDIATE, Q_Key 0x11111111 (53-ud-send-imm), and
    // ibv_ud_pingpong's UD SEND ONLY (03-ud-pingpong): DETH, AckReq 0, and the source port
    // rxe gives a UD QP at creation (0xC000 + hash_32(qpn, 14)).
    for (file, op) in [
        ("53-ud-send-imm.pcap", WrOpcode::SendWithImm),
        ("03-ud-pingpong.pcap", WrOpcode::Send),
    ] {
        let d = datagrams(file);
        let s = pkt(&d[0]);
        let deth = s.repr.deth.expect("DETH");
        assert_eq!(
            d[0].src_port,
            softroce::verbs::rxe_initial_udp_sport(deth.src_qpn),
            "{file}"
        );
        let mut mem = MemoryTable::new(1);
        let (key, va) = mr_with(&mut mem, s.payload);
        let mut a = engine_of(
            QpType::Ud,
            deth.src_qpn,
            0,
            &d[0],
            s.repr.bth.psn.value(),
            0,
        );
        let m = QpModify {
            qkey: deth.qkey,
            ..QpModify::default()
        };
        a.modify(&m, QpAttrMask::QKEY)
            .expect("RTS -> RTS with a Q_Key");
        a.set_datagram_path_mtu(PathMtu::Mtu4096);
        let mut wr = SendWr::new(
            1,
            op,
            vec![Sge {
                addr: va,
                length: s.payload.len() as u32,
                lkey: key,
            }],
        );
        wr.imm_data = s.repr.immdt.map_or(0, |i| i.imm_data);
        wr.ud = Some(softroce::transport::UdDest {
            remote_ip: d[0].dst,
            remote_qpn: s.repr.bth.dest_qpn,
            remote_qkey: deth.qkey,
            ip: Default::default(),
        });
        a.post_send(wr).unwrap();
        let out = drain(&mut a, &mem);
        assert_eq!(out.len(), 1);
        assert_same(&out[0], &d[0], file);
    }
}
