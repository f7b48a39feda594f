//! Adversarial tests for the verbs added with SRQs, memory windows, fast-register MRs,
//! invalidation, GSI and multicast: hostile packets fed to a `Device` (a link that records
//! nothing, a manual clock) and bad API calls. Rule: bad input never panics and never
//! corrupts memory; a bad packet is dropped or NAKed as kernel rxe does and counted; a bad
//! call returns a typed `verbs::Error`.
//!
//! The device fuzz check (`fuzz/src/device.rs`, target `device_verbs`) is included here and
//! replayed over `fuzz/seeds_device/` (its hand-made seeds and `regress-*` findings).

#[path = "../fuzz/src/device.rs"]
mod device;

use device::Rig;
use std::path::PathBuf;

/// Every file in `fuzz/seeds_device/` passes the device fuzz check.
#[test]
fn device_fuzz_seeds_replay() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds_device");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("fuzz/seeds_device exists") {
        let p = e.expect("dir entry").path();
        let data = std::fs::read(&p).expect("read seed");
        device::check_device(&data);
        n += 1;
    }
    assert!(n > 0, "no seeds in {}", dir.display());
}

/// The fixed rig builds, holds its invariants untouched, and tears down.
#[test]
fn device_rig_is_sound() {
    let rig = Rig::new();
    rig.check();
    assert_eq!(rig.srq.len(), device::SRQ_WR as usize);
    rig.teardown();
}

// ---------------------------------------------------------------------------------------------
// Packet builders and answers
// ---------------------------------------------------------------------------------------------

use device::{DEV_IP, FILL, GROUP, PEER_IP, PEER_PORT, RC_PSN, UD_QKEY};
use softroce::transport::{AccessFlags, DropReason, QpState, SendFlags, WcOpcode, WcStatus};
use softroce::verbs::{GSI_QKEY, MULTICAST_QPN, MwBind, Wc};
use softroce::wire::{
    AtomicEthRepr, BthRepr, DethRepr, IcrcIp, IethRepr, Opcode, PacketRepr, Psn, ROCE_V2_UDP_PORT,
    RethRepr, RocePacket,
};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

const ACK: u8 = 0x1f;
const NAK_INV: u8 = 0x61;
const NAK_ACC: u8 = 0x62;

fn bth(op: Opcode, qpn: u32, psn: u32) -> BthRepr {
    BthRepr {
        ack_req: true,
        ..BthRepr::new(op, qpn, Psn::new(psn))
    }
}

/// The datagram bytes of `repr` + `payload` with a correct ICRC to `dst`.
fn emit(mut repr: PacketRepr, payload: &[u8], dst: Ipv4Addr) -> Vec<u8> {
    repr.payload_len = payload.len();
    let mut buf = vec![0u8; repr.buffer_len()];
    let ip = IcrcIp::V4 {
        src: PEER_IP,
        dst,
        ident: 0,
        src_port: PEER_PORT,
        dst_port: ROCE_V2_UDP_PORT,
    };
    repr.emit(&mut buf, payload, &ip);
    buf
}

fn send_inv(qpn: u32, psn: u32, rkey: u32, payload: &[u8]) -> Vec<u8> {
    let mut r = PacketRepr::new(bth(Opcode::RC_SEND_ONLY_WITH_INVALIDATE, qpn, psn));
    r.ieth = Some(IethRepr { rkey });
    emit(r, payload, DEV_IP)
}

fn write(qpn: u32, psn: u32, va: u64, rkey: u32, dma_len: u32, payload: &[u8]) -> Vec<u8> {
    let op = if payload.len() == dma_len as usize {
        Opcode::RC_RDMA_WRITE_ONLY
    } else {
        Opcode::RC_RDMA_WRITE_FIRST
    };
    let mut r = PacketRepr::new(bth(op, qpn, psn));
    r.reth = Some(RethRepr { va, rkey, dma_len });
    emit(r, payload, DEV_IP)
}

fn read(qpn: u32, psn: u32, va: u64, rkey: u32, dma_len: u32) -> Vec<u8> {
    let mut r = PacketRepr::new(bth(Opcode::RC_RDMA_READ_REQUEST, qpn, psn));
    r.reth = Some(RethRepr { va, rkey, dma_len });
    emit(r, &[], DEV_IP)
}

fn fetch_add(qpn: u32, psn: u32, va: u64, rkey: u32, add: u64) -> Vec<u8> {
    let mut r = PacketRepr::new(bth(Opcode::RC_FETCH_ADD, qpn, psn));
    r.atomic_eth = Some(AtomicEthRepr {
        va,
        rkey,
        swap_add: add,
        compare: 0,
    });
    emit(r, &[], DEV_IP)
}

fn ud_send(op: Opcode, qpn: u32, qkey: u32, payload: &[u8], dst: Ipv4Addr) -> Vec<u8> {
    let mut r = PacketRepr::new(bth(op, qpn, 0));
    r.deth = Some(DethRepr {
        qkey,
        src_qpn: 0x77,
    });
    if op == Opcode::RC_SEND_ONLY_WITH_INVALIDATE {
        r.ieth = Some(IethRepr { rkey: 0x1234 });
    }
    emit(r, payload, dst)
}

fn peer() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(PEER_IP), PEER_PORT)
}

/// (opcode, PSN, AETH syndrome) of every datagram the device sent since the last call.
fn answers(rig: &Rig) -> Vec<(Opcode, u32, Option<u8>)> {
    let sent = rig.link.take();
    sent.iter()
        .map(|t| {
            let p = RocePacket::parse(&t.payload[..]).expect("the device sends valid packets");
            (
                p.repr.bth.opcode,
                p.repr.bth.psn.value(),
                p.repr.aeth.map(|a| a.syndrome),
            )
        })
        .collect()
}

fn polled(rig: &Rig) -> Vec<Wc> {
    let mut wc = [Wc::default(); 64];
    let n = rig.cq.poll(&mut wc);
    wc[..n].to_vec()
}

fn drops(rig: &Rig, why: DropReason) -> u64 {
    rig.dev.counters().dropped(why)
}

fn is_nak(a: &[(Opcode, u32, Option<u8>)], psn: u32, syn: u8) -> bool {
    a == [(Opcode::RC_ACKNOWLEDGE, psn, Some(syn))]
}

// ---------------------------------------------------------------------------------------------
// SEND_WITH_INVALIDATE
// ---------------------------------------------------------------------------------------------

/// A SEND_WITH_INVALIDATE whose IETH names something the QP may not invalidate: a type 1
/// window (IBTA o10-37.2.26), the type 2 window with a wrong key byte, a fast-register MR
/// with windows bound (rxe `rxe_invalidate_mr`: num_mw > 0), a fast-register MR of another
/// PD, an ordinary MR (not invalidatable), an unknown key. rxe: `rxe_invalidate_mr/mw` fails -> the receive WQE (here
/// lent by the SRQ) completes IBV_WC_REM_INV_REQ_ERR, NAK invalid request (0x61), QP to
/// ERROR; nothing is invalidated.
#[test]
fn send_with_invalidate_of_a_key_the_qp_may_not_invalidate() {
    let other_pd_mr = |rig: &Rig| {
        let pd2 = rig.dev.alloc_pd().unwrap();
        let mr = pd2.alloc_mr(1).unwrap();
        (pd2, mr)
    };
    for case in 0..6 {
        let rig = Rig::new();
        let keep = other_pd_mr(&rig);
        let mw2 = rig.mw2.rkey();
        let rkey = match case {
            0 => rig.mw1.rkey(),
            1 => mw2 ^ 0x01,
            2 => rig.win.rkey(),
            3 => keep.1.rkey(),
            4 => rig.rbuf.rkey(),
            _ => 0x00ab_cd00,
        };
        rig.dev
            .handle_datagram(peer(), &send_inv(0x11, RC_PSN, rkey, b"hi"));
        let wcs = polled(&rig);
        assert_eq!(wcs.len(), 1, "case {case}: {wcs:?}");
        assert_eq!(wcs[0].status, WcStatus::RemInvReqErr, "case {case}");
        assert!(is_nak(&answers(&rig), RC_PSN, NAK_INV), "case {case}");
        assert_eq!(rig.rc_a.state(), QpState::Err, "case {case}");
        assert_eq!(rig.mw2.rkey(), mw2, "case {case}: the window survives");
        rig.check();
        rig.teardown();
    }
}

/// The type 2 window is bound to `rc_a`; a SEND_WITH_INVALIDATE of its key arriving on
/// `rc_b` (same PD, same SRQ) must not invalidate it (rxe `rxe_invalidate_mw`: "mw->qp !=
/// qp"). Afterwards the window still grants `rc_a` its range; on `rc_a` the same SEND
/// invalidates it, and a WRITE through it is then NAKed 0x62.
#[test]
fn send_with_invalidate_of_a_window_bound_to_another_qp() {
    let rig = Rig::new();
    let mw2 = rig.mw2.rkey();
    let va = device::WIN_VA + 1024;
    rig.dev
        .handle_datagram(peer(), &send_inv(0x12, RC_PSN, mw2, b"x"));
    let wcs = polled(&rig);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::RemInvReqErr);
    assert!(is_nak(&answers(&rig), RC_PSN, NAK_INV));
    assert_eq!(rig.rc_b.state(), QpState::Err);
    // rc_a still writes through the window.
    rig.dev
        .handle_datagram(peer(), &write(0x11, RC_PSN, va, mw2, 4, &[1, 2, 3, 4]));
    assert_eq!(answers(&rig), [(Opcode::RC_ACKNOWLEDGE, RC_PSN, Some(ACK))]);
    let mut b = [0u8; 4];
    rig.win.read(1024, &mut b).unwrap();
    assert_eq!(b, [1, 2, 3, 4]);
    // The rightful invalidation, then the key is dead.
    rig.dev
        .handle_datagram(peer(), &send_inv(0x11, RC_PSN + 1, mw2, b"y"));
    let wcs = polled(&rig);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(wcs[0].opcode, WcOpcode::Recv);
    rig.dev
        .handle_datagram(peer(), &write(0x11, RC_PSN + 2, va, mw2, 4, &[9; 4]));
    assert!(is_nak(&answers(&rig)[1..], RC_PSN + 2, NAK_ACC));
    rig.win.read(1024, &mut b).unwrap();
    assert_eq!(b, [1, 2, 3, 4]);
    rig.check();
    rig.teardown();
}

/// SEND_WITH_INVALIDATE exists only for RC (and XRC): its opcode on a UD QP, unicast or to
/// the multicast group, is a `WrongQpType` drop, never delivered, never answered.
#[test]
fn send_with_invalidate_opcode_on_a_ud_qp_is_dropped() {
    let rig = Rig::new();
    let before = drops(&rig, DropReason::WrongQpType);
    rig.dev.handle_datagram(
        peer(),
        &ud_send(
            Opcode::RC_SEND_ONLY_WITH_INVALIDATE,
            rig.ud.qp_num(),
            UD_QKEY,
            b"x",
            DEV_IP,
        ),
    );
    let mut r = PacketRepr::new(bth(Opcode::RC_SEND_ONLY_WITH_INVALIDATE, MULTICAST_QPN, 0));
    r.ieth = Some(IethRepr {
        rkey: rig.mw2.rkey(),
    });
    rig.dev
        .handle_multicast_datagram(peer(), IpAddr::V4(GROUP), &emit(r, b"x", GROUP));
    assert!(polled(&rig).is_empty());
    assert!(answers(&rig).is_empty());
    assert!(
        drops(&rig, DropReason::WrongQpType) + drops(&rig, DropReason::UnknownQp) >= before + 2
    );
    rig.check();
    rig.teardown();
}

// ---------------------------------------------------------------------------------------------
// RDMA through memory windows: edges, wrap-around, wrong QP, after the MR is gone
// ---------------------------------------------------------------------------------------------

/// WRITE / READ / atomics through the type 2 window `[1024, 2048)` of `win` at its edges.
/// Inside: executed. Crossing either end, starting past it, or with `va + len` wrapping past
/// u64::MAX: NAK remote access error (a misaligned atomic: NAK invalid request) (0x62, rxe `check_rkey` -> RESPST_ERR_RKEY_VIOLATION),
/// QP to ERROR, and no byte outside the window changes (`Rig::check`).
#[test]
fn window_edges_and_wrap_around() {
    let ok = |f: &dyn Fn(&Rig) -> Vec<u8>| {
        let rig = Rig::new();
        rig.dev.handle_datagram(peer(), &f(&rig));
        let a = answers(&rig);
        rig.check();
        assert_eq!(rig.rc_a.state(), QpState::Rts);
        rig.teardown();
        a
    };
    let bad_with = |name: &str, syn: u8, f: &dyn Fn(&Rig) -> Vec<u8>| {
        let rig = Rig::new();
        rig.dev.handle_datagram(peer(), &f(&rig));
        let a = answers(&rig);
        assert!(is_nak(&a, RC_PSN, syn), "{name}: {a:?}");
        assert_eq!(rig.rc_a.state(), QpState::Err, "{name}");
        rig.check();
        rig.teardown();
    };
    let bad = |name: &str, f: &dyn Fn(&Rig) -> Vec<u8>| bad_with(name, NAK_ACC, f);
    let lo = |_: &Rig| device::WIN_VA + 1024;
    let hi = |_: &Rig| device::WIN_VA + 2048;
    // Inside, touching both ends.
    let a = ok(&|r| write(0x11, RC_PSN, lo(r), r.mw2.rkey(), 256, &[7; 256]));
    assert_eq!(a, [(Opcode::RC_ACKNOWLEDGE, RC_PSN, Some(ACK))]);
    let a = ok(&|r| write(0x11, RC_PSN, hi(r) - 256, r.mw2.rkey(), 256, &[7; 256]));
    assert_eq!(a, [(Opcode::RC_ACKNOWLEDGE, RC_PSN, Some(ACK))]);
    let a = ok(&|r| read(0x11, RC_PSN, hi(r) - 8, r.mw2.rkey(), 8));
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].0, Opcode::RC_RDMA_READ_RESPONSE_ONLY);
    let a = ok(&|r| fetch_add(0x11, RC_PSN, hi(r) - 8, r.mw2.rkey(), 1));
    assert_eq!(a[0].0, Opcode::RC_ATOMIC_ACKNOWLEDGE);
    // Crossing, outside, wrapping.
    bad("write crossing the end", &|r| {
        write(0x11, RC_PSN, hi(r) - 2, r.mw2.rkey(), 4, &[7; 4])
    });
    bad("write crossing the start", &|r| {
        write(0x11, RC_PSN, lo(r) - 2, r.mw2.rkey(), 4, &[7; 4])
    });
    bad("write at the end", &|r| {
        write(0x11, RC_PSN, hi(r), r.mw2.rkey(), 1, &[7])
    });
    bad("read crossing the end", &|r| {
        read(0x11, RC_PSN, hi(r) - 4, r.mw2.rkey(), 8)
    });
    bad("read wrapping u64", &|r| {
        read(0x11, RC_PSN, u64::MAX - 3, r.mw2.rkey(), 8)
    });
    bad("read of 2 GiB", &|r| {
        read(0x11, RC_PSN, lo(r), r.mw2.rkey(), 0x8000_0000)
    });
    bad("write wrapping u64", &|r| {
        write(0x11, RC_PSN, u64::MAX - 1, r.mw2.rkey(), 4, &[7; 4])
    });
    bad("atomic past the end", &|r| {
        fetch_add(0x11, RC_PSN, hi(r), r.mw2.rkey(), 1)
    });
    // Misaligned: rxe RESPST_ERR_MISALIGNED_ATOMIC, NAK invalid request, before the R_Key.
    bad_with("atomic crossing the end", NAK_INV, &|r| {
        fetch_add(0x11, RC_PSN, hi(r) - 4, r.mw2.rkey(), 1)
    });
    bad("atomic at u64::MAX - 7", &|r| {
        fetch_add(0x11, RC_PSN, u64::MAX - 7, r.mw2.rkey(), 1)
    });
    // The type 1 window grants READ only; the MR itself grants nothing remote.
    bad("write through the read-only window", &|r| {
        write(
            0x11,
            RC_PSN,
            device::WIN_VA + 4096,
            r.mw1.rkey(),
            4,
            &[7; 4],
        )
    });
    bad("atomic through the read-only window", &|r| {
        fetch_add(0x11, RC_PSN, device::WIN_VA + 4096, r.mw1.rkey(), 1)
    });
    bad("write through the MR's own key", &|r| {
        write(0x11, RC_PSN, lo(r), r.win.rkey(), 4, &[7; 4])
    });
    bad("write through a window key with a wrong key byte", &|r| {
        write(0x11, RC_PSN, lo(r), r.mw2.rkey() ^ 0x80, 4, &[7; 4])
    });
}

/// rc_b may not use the type 2 window bound to rc_a (rxe `rxe_lookup_mw` / `check_rkey`:
/// `mw->qp != qp`): NAK 0x62 on rc_b, rc_a unaffected.
#[test]
fn type2_window_on_another_qp_is_an_access_error() {
    let rig = Rig::new();
    let va = device::WIN_VA + 1024;
    rig.dev
        .handle_datagram(peer(), &write(0x12, RC_PSN, va, rig.mw2.rkey(), 4, &[7; 4]));
    assert!(is_nak(&answers(&rig), RC_PSN, NAK_ACC));
    assert_eq!(rig.rc_b.state(), QpState::Err);
    assert_eq!(rig.rc_a.state(), QpState::Rts);
    rig.check();
    let w = rig.win.to_vec();
    assert!(w[1024..1028].iter().all(|&b| b == FILL));
    rig.teardown();
}

/// A zero-length WRITE and READ carry an R_Key nobody checks (rxe `check_rkey` skips the
/// lookup for a zero-length RETH): acknowledged whatever the key and address, nothing
/// written.
#[test]
fn zero_length_rdma_at_any_address_is_acknowledged() {
    for (va, rkey) in [
        (0u64, 0u32),
        (u64::MAX, 0xdead_beef),
        (u64::MAX, 0x0100_0100),
    ] {
        let rig = Rig::new();
        rig.dev
            .handle_datagram(peer(), &write(0x11, RC_PSN, va, rkey, 0, &[]));
        rig.dev
            .handle_datagram(peer(), &read(0x11, RC_PSN + 1, va, rkey, 0));
        let a = answers(&rig);
        assert_eq!(
            a,
            [
                (Opcode::RC_ACKNOWLEDGE, RC_PSN, Some(ACK)),
                (Opcode::RC_RDMA_READ_RESPONSE_ONLY, RC_PSN + 1, Some(ACK)),
            ],
            "va {va:#x} rkey {rkey:#x}"
        );
        rig.check();
        rig.teardown();
    }
}

/// After the MR a window is bound to is deregistered, and after a type 1 window is unbound
/// (bound with length 0), its key grants nothing: NAK 0x62.
#[test]
fn window_after_its_mr_is_gone_or_after_unbind() {
    // MR gone: the type 2 window's key is dead.
    // (A new MR of the same PD and size, registered after, does not revive it either.)
    let mut rig = Rig::new();
    let rkey = rig.mw2.rkey();
    let va = device::WIN_VA + 1024;
    let len = rig.win.len();
    let win2 = rig
        .pd
        .reg_mr(len, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)
        .unwrap();
    let win1 = std::mem::replace(&mut rig.win, win2);
    drop(win1);
    let win3 = rig
        .pd
        .reg_mr(len, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)
        .unwrap();
    rig.dev
        .handle_datagram(peer(), &write(0x11, RC_PSN, va, rkey, 4, &[7; 4]));
    assert!(is_nak(&answers(&rig), RC_PSN, NAK_ACC));
    assert!(win3.to_vec().iter().all(|&b| b == 0));
    drop(win3);
    rig.teardown();

    // Type 1 window unbound: length-0 bind.
    let rig = Rig::new();
    rig.rc_a
        .bind_mw(
            &rig.mw1,
            &MwBind {
                mr: &rig.win,
                addr: 0,
                length: 0,
                access: AccessFlags::REMOTE_READ,
                wr_id: 9,
                send_flags: SendFlags::SIGNALED,
            },
        )
        .unwrap();
    let wcs = polled(&rig);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::Success);
    rig.dev.handle_datagram(
        peer(),
        &read(0x11, RC_PSN, device::WIN_VA + 4096, rig.mw1.rkey(), 8),
    );
    assert!(is_nak(&answers(&rig), RC_PSN, NAK_ACC));
    rig.teardown();
}

// ---------------------------------------------------------------------------------------------
// Fuzz seeds for the device target
// ---------------------------------------------------------------------------------------------

/// One record of the device fuzz input: `[kind, len_hi, len_lo, bytes...]`.
fn record(kind: u8, bytes: &[u8]) -> Vec<u8> {
    let mut v = vec![kind];
    v.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
    v.extend_from_slice(bytes);
    v
}

/// The hand-made seeds of `fuzz/seeds_device/`: one valid exchange per feature.
fn device_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let r = Rig::new();
    let lo = device::WIN_VA + 1024;
    let (mw1, mw2) = (r.mw1.rkey(), r.mw2.rkey());
    let w1 = device::WIN_VA + 4096;
    let send = |qpn, psn, op, p: &[u8]| emit(PacketRepr::new(bth(op, qpn, psn)), p, DEV_IP);
    let poll = record(3, &[]);
    let tick = record(2, &[0, 10]);
    let v = vec![
        (
            "send-srq",
            [
                record(0, &send(0x11, RC_PSN, Opcode::RC_SEND_ONLY, b"hello")),
                poll.clone(),
                record(0, &send(0x12, RC_PSN, Opcode::RC_SEND_ONLY, b"world")),
            ]
            .concat(),
        ),
        (
            "send-multi-srq",
            [
                record(0, &send(0x12, RC_PSN, Opcode::RC_SEND_FIRST, &[1; 4096])),
                record(
                    0,
                    &send(0x12, RC_PSN + 1, Opcode::RC_SEND_MIDDLE, &[2; 4096]),
                ),
                record(0, &send(0x12, RC_PSN + 2, Opcode::RC_SEND_LAST, &[3; 100])),
                tick.clone(),
                poll.clone(),
            ]
            .concat(),
        ),
        (
            "mw-write-read-atomic",
            [
                record(0, &write(0x11, RC_PSN, lo, mw2, 16, &[9; 16])),
                record(0, &read(0x11, RC_PSN + 1, lo, mw2, 64)),
                record(0, &read(0x11, RC_PSN + 2, w1, mw1, 64)),
                record(0, &fetch_add(0x11, RC_PSN + 3, lo + 8, mw2, 5)),
            ]
            .concat(),
        ),
        (
            "send-inv",
            [
                record(0, &send_inv(0x11, RC_PSN, mw2, b"inv")),
                record(0, &write(0x11, RC_PSN + 1, lo, mw2, 4, &[1; 4])),
                poll.clone(),
            ]
            .concat(),
        ),
        (
            "ud-mcast",
            [
                record(
                    1,
                    &ud_send(Opcode::UD_SEND_ONLY, MULTICAST_QPN, UD_QKEY, b"m", GROUP),
                ),
                record(
                    0,
                    &ud_send(Opcode::UD_SEND_ONLY, r.ud.qp_num(), UD_QKEY, b"u", DEV_IP),
                ),
                record(
                    0,
                    &ud_send(Opcode::UD_SEND_ONLY, 1, GSI_QKEY, &[0; 256], DEV_IP),
                ),
                poll,
                tick,
            ]
            .concat(),
        ),
    ];
    r.teardown();
    v
}

/// Regenerates `fuzz/seeds_device/seed-*` (run after the rig or the packet layout changes).
#[test]
#[ignore]
fn write_device_seeds() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds_device");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, data) in device_seeds() {
        std::fs::write(dir.join(format!("seed-{name}")), data).unwrap();
    }
}

/// The committed seeds are what `write_device_seeds` writes, and each one reaches the
/// transport (the device counts received packets for it).
#[test]
fn device_seeds_are_current_and_reach_the_qps() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds_device");
    for (name, data) in device_seeds() {
        let stored = std::fs::read(dir.join(format!("seed-{name}"))).expect("seed committed");
        assert_eq!(stored, data, "fuzz/seeds_device/seed-{name} is stale");
    }
    let rig = Rig::new();
    let before = rig.dev.counters().rcvd_pkts;
    let r = device_seeds();
    let send_srq = &r[0].1;
    rig.feed(
        &send_srq[3..3 + usize::from(u16::from_be_bytes([send_srq[1], send_srq[2]]))],
        false,
    );
    assert_eq!(rig.dev.counters().rcvd_pkts, before + 1);
    let wcs = polled(&rig);
    assert_eq!(wcs.len(), 1);
    assert_eq!((wcs[0].status, wcs[0].byte_len), (WcStatus::Success, 5));
    rig.teardown();
}

// ---------------------------------------------------------------------------------------------
// SRQ
// ---------------------------------------------------------------------------------------------

fn send_only(qpn: u32, psn: u32, payload: &[u8]) -> Vec<u8> {
    emit(
        PacketRepr::new(bth(Opcode::RC_SEND_ONLY, qpn, psn)),
        payload,
        DEV_IP,
    )
}

/// SENDs to two QPs sharing an SRQ of 8 WRs, 6 each: the first 8 take the WRs in order
/// (FIFO across QPs), the rest are RNR NAKed (rxe `check_resource` on an empty SRQ ->
/// RESPST_ERR_RNR); no WR is used twice, none is lost; once reposted, the retried SENDs land.
#[test]
fn sends_to_many_qps_on_one_srq_beyond_its_depth() {
    let mut rig = Rig::new();
    let mut psn = [RC_PSN; 2];
    let mut acks = 0;
    let mut rnrs = Vec::new();
    for i in 0..12u32 {
        let q = (i % 2) as usize;
        rig.dev.handle_datagram(
            peer(),
            &send_only(0x11 + q as u32, psn[q], &i.to_be_bytes()),
        );
        for (op, p, syn) in answers(&rig) {
            assert_eq!(op, Opcode::RC_ACKNOWLEDGE);
            match syn {
                Some(ACK) => {
                    acks += 1;
                    psn[q] += 1;
                }
                Some(s) if s & 0xe0 == 0x20 => rnrs.push((q, p)),
                other => panic!("unexpected syndrome {other:?}"),
            }
        }
    }
    assert_eq!(acks, device::SRQ_WR);
    assert_eq!(rnrs.len(), 4);
    assert!(rig.srq.is_empty());
    let wcs = polled(&rig);
    assert_eq!(wcs.len(), device::SRQ_WR as usize);
    let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0x1000..0x1008).collect::<Vec<u64>>());
    assert!(
        wcs.iter()
            .all(|w| w.status == WcStatus::Success && w.byte_len == 4)
    );
    // The payload of SEND i sits in slot i.
    let r = rig.rbuf.to_vec();
    for i in 0..8u32 {
        let s = i as usize * device::SLOT;
        assert_eq!(&r[s..s + 4], &i.to_be_bytes());
    }
    // Repost and retry the RNR-NAKed SENDs (one per QP, the first refused PSN of each).
    for _ in 0..device::SRQ_WR {
        assert!(rig.post_srq_one());
    }
    for (qpn, p) in [(0x11, psn[0]), (0x12, psn[1])] {
        rig.dev.handle_datagram(peer(), &send_only(qpn, p, b"late"));
        assert_eq!(answers(&rig), [(Opcode::RC_ACKNOWLEDGE, p, Some(ACK))]);
    }
    assert_eq!(polled(&rig).len(), 2);
    rig.check();
    rig.teardown();
}

/// A SEND longer than the SRQ WR it took (256 bytes): FIRST fills it, MIDDLE overflows it.
/// rxe RESPST_ERR_LENGTH: NAK invalid request (0x61) for the MIDDLE, the WR completes
/// IBV_WC_LOC_LEN_ERR, the QP goes to ERROR, nothing is written past the SGE; the other QP
/// on the SRQ is unaffected and gets the next WR.
#[test]
fn srq_send_longer_than_the_wr() {
    let rig = Rig::new();
    for (op, psn) in [
        (Opcode::RC_SEND_FIRST, RC_PSN),
        (Opcode::RC_SEND_MIDDLE, RC_PSN + 1),
    ] {
        rig.dev.handle_datagram(
            peer(),
            &emit(PacketRepr::new(bth(op, 0x11, psn)), &[1; 256], DEV_IP),
        );
    }
    let a = answers(&rig);
    let wcs = polled(&rig);
    assert_eq!(
        a,
        [
            (Opcode::RC_ACKNOWLEDGE, RC_PSN, Some(ACK)),
            (Opcode::RC_ACKNOWLEDGE, RC_PSN + 1, Some(NAK_INV))
        ]
    );
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    assert_eq!((wcs[0].wr_id, wcs[0].status), (0x1000, WcStatus::LocLenErr));
    assert_eq!(rig.srq.len(), device::SRQ_WR as usize - 1);
    rig.dev
        .handle_datagram(peer(), &send_only(0x12, RC_PSN, b"ok"));
    assert_eq!(answers(&rig), [(Opcode::RC_ACKNOWLEDGE, RC_PSN, Some(ACK))]);
    let wcs = polled(&rig);
    assert_eq!((wcs.len(), wcs[0].wr_id), (1, 0x1001));
    rig.check();
    rig.teardown();
}

/// A QP moved to ERROR, or destroyed, while a multi-packet SEND holds an SRQ WR: ERROR
/// flushes that WR (IBV_WC_WR_FLUSH_ERR, IBTA 10.8.3.1 / rxe `flush_recv_queue` of the WQE
/// in progress); destruction takes it with the QP. Either way the SRQ keeps every WR it did
/// not lend and the other QP on it goes on receiving.
#[test]
fn qp_error_or_destroy_while_it_holds_an_srq_wr() {
    for destroy in [false, true] {
        let mut rig = Rig::new();
        rig.dev.handle_datagram(
            peer(),
            &emit(
                PacketRepr::new(bth(Opcode::RC_SEND_FIRST, 0x11, RC_PSN)),
                &[1; 256],
                DEV_IP,
            ),
        );
        assert!(polled(&rig).is_empty());
        assert_eq!(rig.srq.len(), device::SRQ_WR as usize - 1);
        if destroy {
            // A stand-in so the rig stays whole: a fresh RC QP on the same SRQ.
            let stand_in = rig
                .pd
                .create_qp(&softroce::verbs::QpInitAttr {
                    qp_type: softroce::transport::QpType::Rc,
                    send_cq: &rig.cq,
                    recv_cq: &rig.cq,
                    cap: softroce::transport::QpCap::default(),
                    sq_sig_all: false,
                    srq: Some(&rig.srq),
                })
                .unwrap();
            let gone = std::mem::replace(&mut rig.rc_a, stand_in);
            drop(gone);
            assert!(polled(&rig).is_empty());
        } else {
            rig.rc_a
                .modify(
                    &softroce::verbs::QpAttr {
                        qp_state: QpState::Err,
                        ..Default::default()
                    },
                    softroce::verbs::QpAttrMask::STATE,
                )
                .unwrap();
            let wcs = polled(&rig);
            assert_eq!(wcs.len(), 1, "{wcs:?}");
            assert_eq!(
                (wcs[0].wr_id, wcs[0].status),
                (0x1000, WcStatus::WrFlushErr)
            );
        }
        assert_eq!(rig.srq.len(), device::SRQ_WR as usize - 1);
        // The rest of the message, to the dead or destroyed QP: dropped, nothing taken.
        rig.dev.handle_datagram(
            peer(),
            &emit(
                PacketRepr::new(bth(Opcode::RC_SEND_LAST, 0x11, RC_PSN + 1)),
                &[2; 8],
                DEV_IP,
            ),
        );
        assert_eq!(rig.srq.len(), device::SRQ_WR as usize - 1);
        rig.dev
            .handle_datagram(peer(), &send_only(0x12, RC_PSN, b"ok"));
        assert_eq!(
            answers(&rig).last(),
            Some(&(Opcode::RC_ACKNOWLEDGE, RC_PSN, Some(ACK)))
        );
        let wcs = polled(&rig);
        assert_eq!(wcs.len(), 1);
        assert_eq!((wcs[0].wr_id, wcs[0].status), (0x1001, WcStatus::Success));
        rig.check();
        rig.teardown();
    }
}

// ---------------------------------------------------------------------------------------------
// Multicast and QP1
// ---------------------------------------------------------------------------------------------

fn group_dgram(repr: PacketRepr, payload: &[u8]) -> Vec<u8> {
    emit(repr, payload, GROUP)
}

/// Datagrams to the multicast group: a good UD SEND reaches the attached UD QP once; an RC or
/// UC opcode with DestQP 0xFFFFFF, a wrong Q_Key, a group nobody joined, and DestQP 0xFFFFFF
/// arriving at the unicast address are dropped and counted (rxe `rxe_rcv_mcast_pkt`,
/// `check_type_state`, `check_keys`); none is answered.
#[test]
fn multicast_attacks_are_dropped_and_counted() {
    let rig = Rig::new();
    let d0 = rig.dev.counters();
    let ud_c0 = rig.ud.counters();
    // Good.
    rig.dev.handle_multicast_datagram(
        peer(),
        IpAddr::V4(GROUP),
        &ud_send(Opcode::UD_SEND_ONLY, MULTICAST_QPN, UD_QKEY, b"good", GROUP),
    );
    // Once to each member: `ud` in its own WR, `ud_srq` in the SRQ's head WR.
    let wcs = polled(&rig);
    assert_eq!(wcs.len(), 2, "{wcs:?}");
    for (qp, wr_id) in [(&rig.ud, 0x100), (&rig.ud_srq, 0x1000)] {
        let w = wcs
            .iter()
            .find(|w| w.qp_num == qp.qp_num())
            .expect("one per member");
        assert_eq!(
            (w.status, w.byte_len, w.wr_id),
            (WcStatus::Success, 4 + 40, wr_id)
        );
    }
    // RC and UC opcodes to the group.
    for op in [
        Opcode::RC_SEND_ONLY,
        Opcode::UC_SEND_ONLY,
        Opcode::RC_RDMA_WRITE_ONLY,
    ] {
        let mut r = PacketRepr::new(bth(op, MULTICAST_QPN, 0));
        if op == Opcode::RC_RDMA_WRITE_ONLY {
            r.reth = Some(RethRepr {
                va: device::WIN_VA + 1024,
                rkey: rig.mw2.rkey(),
                dma_len: 4,
            });
        }
        rig.dev
            .handle_multicast_datagram(peer(), IpAddr::V4(GROUP), &group_dgram(r, &[7; 4]));
    }
    // Bad Q_Key, and a Q_Key with the high bit set (never valid on the wire).
    for qkey in [UD_QKEY ^ 1, 0x8000_0000 | UD_QKEY, GSI_QKEY] {
        rig.dev.handle_multicast_datagram(
            peer(),
            IpAddr::V4(GROUP),
            &ud_send(Opcode::UD_SEND_ONLY, MULTICAST_QPN, qkey, b"bad", GROUP),
        );
    }
    // A group nobody joined.
    let other = Ipv4Addr::new(239, 9, 0, 2);
    rig.dev.handle_multicast_datagram(
        peer(),
        IpAddr::V4(other),
        &ud_send(Opcode::UD_SEND_ONLY, MULTICAST_QPN, UD_QKEY, b"x", other),
    );
    // DestQP 0xFFFFFF to the unicast address.
    rig.dev.handle_datagram(
        peer(),
        &ud_send(Opcode::UD_SEND_ONLY, MULTICAST_QPN, UD_QKEY, b"x", DEV_IP),
    );
    assert!(polled(&rig).is_empty());
    assert!(answers(&rig).is_empty());
    let d = rig.dev.counters();
    let ud_c = rig.ud.counters();
    let dropped = |c: &softroce::transport::Counters, c0: &softroce::transport::Counters, r| {
        c.dropped(r) - c0.dropped(r)
    };
    assert_eq!(dropped(&ud_c, &ud_c0, DropReason::WrongQpType), 3);
    assert_eq!(dropped(&ud_c, &ud_c0, DropReason::BadQkey), 3);
    assert_eq!(dropped(&d, &d0, DropReason::UnknownQp), 2);
    rig.check();
    rig.teardown();
}

/// QP1 (GSI, UD): RC opcodes are `WrongQpType` drops; a UD SEND with a Q_Key other than
/// 0x80010000 is a `BadQkey` drop (rxe `check_keys`: QP1 takes GSI_QKEY only); neither is
/// answered nor completes anything on the GSI CQ.
#[test]
fn qp1_rejects_rc_opcodes_and_foreign_qkeys() {
    let rig = Rig::new();
    let gsi = rig.dev.gsi_qp();
    let c0 = gsi.counters();
    for op in [
        Opcode::RC_SEND_ONLY,
        Opcode::RC_RDMA_WRITE_ONLY,
        Opcode::RC_SEND_ONLY_WITH_INVALIDATE,
    ] {
        let mut r = PacketRepr::new(bth(op, 1, 0));
        if op == Opcode::RC_RDMA_WRITE_ONLY {
            r.reth = Some(RethRepr {
                va: 0,
                rkey: 0,
                dma_len: 4,
            });
        }
        if op == Opcode::RC_SEND_ONLY_WITH_INVALIDATE {
            r.ieth = Some(IethRepr {
                rkey: rig.mw2.rkey(),
            });
        }
        rig.dev.handle_datagram(peer(), &emit(r, &[1; 4], DEV_IP));
    }
    for qkey in [0, UD_QKEY, GSI_QKEY ^ 1] {
        rig.dev.handle_datagram(
            peer(),
            &ud_send(Opcode::UD_SEND_ONLY, 1, qkey, &[0; 256], DEV_IP),
        );
    }
    let c = gsi.counters();
    assert_eq!(
        c.dropped(DropReason::WrongQpType) - c0.dropped(DropReason::WrongQpType),
        3
    );
    assert_eq!(
        c.dropped(DropReason::BadQkey) - c0.dropped(DropReason::BadQkey),
        3
    );
    assert!(answers(&rig).is_empty());
    let mut wc = [Wc::default(); 4];
    assert_eq!(rig.dev.gsi_cq().poll(&mut wc), 0);
    rig.check();
    drop(gsi);
    rig.teardown();
}

// ---------------------------------------------------------------------------------------------
// Bad API calls
// ---------------------------------------------------------------------------------------------

use softroce::transport::{BindMw, RecvWr, RegMr, SendWr, Sge, WrOpcode};
use softroce::verbs::{ErrorKind, MwType, SrqAttr, SrqAttrMask, SrqInitAttr};

/// A change to one field of a work request's extension, given the rig.
type Tweak<T> = fn(&Rig, &mut T);

/// Posts `wr` on a fresh rig's `rc_a` and returns the status of its completion (the post
/// itself must succeed: these errors are found when the WR executes, as in rxe).
fn local_op_status(make: &dyn Fn(&Rig) -> SendWr) -> WcStatus {
    let rig = Rig::new();
    let mut wr = make(&rig);
    wr.send_flags = SendFlags::SIGNALED;
    rig.rc_a.post_send(&[wr]).expect("post accepted");
    let wcs = polled(&rig);
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    rig.check();
    rig.teardown();
    wcs[0].status
}

/// REG_MR work requests with absurd lengths, addresses, keys and access: each completes
/// IBV_WC_LOC_QP_OP_ERR (rxe `rxe_reg_fast_mr` / `rxe_check_reg_mr`) and leaves the MR
/// unusable; none panics.
#[test]
fn reg_mr_with_absurd_arguments_fails_the_wr() {
    let reg = |f: fn(&Rig, &mut RegMr)| {
        move |r: &Rig| {
            let mr = r.pd.alloc_mr(1).unwrap();
            let mut wr = mr.reg_wr(7, 0x33, 0x1000, 4096, AccessFlags::LOCAL_WRITE);
            let mut reg = wr.reg_mr.unwrap();
            f(r, &mut reg);
            wr.reg_mr = Some(reg);
            std::mem::forget(mr); // the rig's teardown drops the PD's objects
            wr
        }
    };
    let cases: [(&str, Tweak<RegMr>); 7] = [
        ("length past the pages", |_, m| m.length = 4097),
        ("length u64::MAX", |_, m| m.length = u64::MAX),
        ("iova + length wraps", |_, m| m.iova = u64::MAX - 100),
        ("new key of another index", |_, m| m.key ^= 0x100),
        ("an ordinary MR", |r, m| m.mr_key = r.rbuf.lkey()),
        ("remote write without local write", |_, m| {
            m.access = AccessFlags::REMOTE_WRITE
        }),
        ("an MR already registered", |r, m| {
            m.mr_key = r.win.lkey();
            m.key = (r.win.lkey() & !0xff) | 0x77;
        }),
    ];
    for (name, f) in cases {
        assert_eq!(
            local_op_status(&reg(f)),
            WcStatus::LocQpOpErr,
            "REG_MR: {name}"
        );
    }
}

/// BIND_MW work requests with absurd ranges and rights: IBV_WC_MW_BIND_ERR (rxe
/// `rxe_check_bind_mw`: C10-72..75); the window stays unbound.
#[test]
fn bind_mw_with_absurd_arguments_fails_the_wr() {
    let bind = |f: fn(&Rig, &mut BindMw)| {
        move |r: &Rig| {
            let mw = r.pd.alloc_mw(MwType::Type2).unwrap();
            let mut wr = mw.bind_wr(7, &r.win, device::WIN_VA, 64, AccessFlags::REMOTE_READ);
            let mut b = wr.bind_mw.unwrap();
            f(r, &mut b);
            wr.bind_mw = Some(b);
            std::mem::forget(mw);
            wr
        }
    };
    let cases: [(&str, Tweak<BindMw>); 8] = [
        ("crossing the MR's end", |_, b| {
            b.addr = device::WIN_VA + 8192 - 8;
            b.length = 16
        }),
        ("before the MR", |_, b| b.addr = device::WIN_VA - 1),
        ("addr + length wraps", |_, b| {
            b.addr = u64::MAX - 8;
            b.length = 64
        }),
        ("length u64::MAX", |_, b| b.length = u64::MAX),
        ("zero length (type 2)", |_, b| b.length = 0),
        ("local rights", |_, b| b.access = AccessFlags::LOCAL_WRITE),
        ("MR without MW_BIND", |r, b| {
            b.mr_lkey = r.rbuf.lkey();
            b.addr = r.rbuf.sge(0, 0).addr
        }),
        ("the window already bound", |r, b| {
            b.mw_rkey = r.mw2.rkey();
            b.rkey = r.mw2.rkey() + 1
        }),
    ];
    for (name, f) in cases {
        assert_eq!(
            local_op_status(&bind(f)),
            WcStatus::MwBindErr,
            "BIND_MW: {name}"
        );
    }
}

/// Inline data must be readable memory: an inline SGE outside every registered buffer is
/// refused at post time with EINVAL (libibverbs would fault; softroce reads only MR buffers),
/// as is a SEND_WITH_INV / LOCAL_INV / REG_MR on a UD QP (EOPNOTSUPP, rxe
/// `rxe_wr_opcode_info`).
#[test]
fn inline_outside_any_mr_and_rc_only_opcodes_on_ud_are_refused_at_post() {
    let rig = Rig::new();
    let cap_ok = rig.rc_a.post_send(&[{
        let mut wr = SendWr::new(
            1,
            WrOpcode::Send,
            vec![Sge {
                addr: 0x10,
                length: 8,
                lkey: 0,
            }],
        );
        wr.send_flags = SendFlags::INLINE | SendFlags::SIGNALED;
        wr
    }]);
    let e = cap_ok.expect_err("inline SGE outside memory");
    assert!(matches!(e.kind(), ErrorKind::Inval), "{e}");
    for op in [WrOpcode::SendWithInv, WrOpcode::LocalInv, WrOpcode::RegMr] {
        let e = rig
            .ud
            .post_send(&[SendWr::new(2, op, Vec::new())])
            .expect_err("RC-only opcode on UD");
        assert!(matches!(e.kind(), ErrorKind::OpNotSupp), "{op:?}: {e}");
    }
    assert!(polled(&rig).is_empty());
    assert!(answers(&rig).is_empty());
    assert_eq!(rig.rc_a.state(), QpState::Rts);
    rig.teardown();
}

/// An SGE built from an MR with an offset that overflows the address space is a bad SGE
/// (found at post or when used), never a panic.
#[test]
fn sge_with_an_absurd_offset_does_not_panic() {
    let rig = Rig::new();
    let s = rig.rbuf.sge(usize::MAX, 16);
    let r = rig
        .rc_a
        .post_send(&[SendWr::new(1, WrOpcode::Send, vec![s])]);
    if r.is_ok() {
        let wcs = polled(&rig);
        assert_eq!(wcs.len(), 1);
        assert_ne!(wcs[0].status, WcStatus::Success);
    }
    assert!(answers(&rig).is_empty());
    rig.teardown();
}

/// SRQ misuse: more SGEs than `max_sge` (EINVAL), posting to a full SRQ (ENOMEM, checked
/// first as in rxe `post_one_recv`), resizing
/// below the WRs queued or to 0 or past the device limit (EINVAL, rxe `rxe_srq_chk_attr`),
/// arming the limit above `max_wr` (EINVAL), creating with absurd sizes (EINVAL); a refused
/// call changes nothing.
#[test]
fn srq_misuse_returns_typed_errors() {
    let mut rig = Rig::new();
    let sge = rig.rbuf.sge(0, 1);
    // (On a full SRQ rxe `post_one_recv` reports ENOMEM first, so use an empty one.)
    let spare = rig
        .pd
        .create_srq(&SrqInitAttr {
            max_wr: 4,
            max_sge: 2,
            srq_limit: 0,
        })
        .unwrap();
    let e = spare
        .post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: vec![sge; 3],
        }])
        .expect_err("max_sge + 1");
    assert!(matches!(e.kind(), ErrorKind::Inval));
    assert!(spare.is_empty());
    drop(spare);
    assert!(!rig.post_srq_one(), "full");
    let e = rig
        .srq
        .post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: vec![sge],
        }])
        .expect_err("full");
    assert!(matches!(e.kind(), ErrorKind::NoMem));
    let before = rig.srq.query().unwrap();
    for (max_wr, limit, mask) in [
        (4, 0, SrqAttrMask::MAX_WR),
        (0, 0, SrqAttrMask::MAX_WR),
        (u32::MAX, 0, SrqAttrMask::MAX_WR),
        (0, 9, SrqAttrMask::LIMIT),
        (16, 17, SrqAttrMask::MAX_WR | SrqAttrMask::LIMIT),
        (16, 0, SrqAttrMask(0x80)),
    ] {
        let attr = SrqAttr {
            max_wr,
            max_sge: 0,
            srq_limit: limit,
        };
        let e = rig.srq.modify(&attr, mask).expect_err("bad modify_srq");
        assert!(matches!(e.kind(), ErrorKind::Inval), "{max_wr} {limit}");
        assert_eq!(rig.srq.query().unwrap(), before);
    }
    assert_eq!(rig.srq.len(), device::SRQ_WR as usize);
    for (max_wr, max_sge, srq_limit) in [(0, 1, 0), (u32::MAX, 1, 0), (8, 1000, 0), (8, 1, 9)] {
        let e = rig
            .pd
            .create_srq(&SrqInitAttr {
                max_wr,
                max_sge,
                srq_limit,
            })
            .expect_err("bad create_srq");
        assert!(matches!(e.kind(), ErrorKind::Inval));
    }
    rig.check();
    rig.teardown();
}

/// Completion channel misuse: acknowledging more events than were delivered is EINVAL and
/// changes nothing; arming a CQ without a channel is EINVAL.
#[test]
fn completion_channel_misuse_returns_typed_errors() {
    let rig = Rig::new();
    let ch = rig.dev.create_comp_channel().unwrap();
    let cq = rig.dev.create_cq_with_channel(16, &ch).unwrap();
    assert!(matches!(
        ch.ack_cq_events(&cq, 1).unwrap_err().kind(),
        ErrorKind::Inval
    ));
    assert!(matches!(
        ch.ack_cq_events(&cq, u32::MAX).unwrap_err().kind(),
        ErrorKind::Inval
    ));
    assert_eq!(cq.unacked_events(), 0);
    assert!(matches!(
        rig.cq.req_notify(false).unwrap_err().kind(),
        ErrorKind::Inval
    ));
    // An armed CQ that is dropped before any completion: the channel reports nothing.
    cq.req_notify(false).unwrap();
    drop(cq);
    assert!(ch.try_get_cq_event().is_none());
    rig.teardown();
}

/// SQD with nothing outstanding: the drain is immediate (IBV_EVENT_SQ_DRAINED once), the QP
/// still receives, and going back to RTS works.
#[test]
fn sqd_with_nothing_outstanding() {
    let rig = Rig::new();
    while rig.dev.try_get_async_event().is_some() {}
    let sqd = softroce::verbs::QpAttr {
        qp_state: QpState::Sqd,
        ..Default::default()
    };
    rig.rc_a
        .modify(
            &sqd,
            softroce::verbs::QpAttrMask::STATE | softroce::verbs::QpAttrMask::EN_SQD_ASYNC_NOTIFY,
        )
        .unwrap();
    rig.dev.handle_timeouts();
    let evs: Vec<_> = std::iter::from_fn(|| rig.dev.try_get_async_event()).collect();
    let drained = evs
        .iter()
        .filter(|e| e.event_type == softroce::verbs::EventType::SqDrained)
        .count();
    assert_eq!(drained, 1, "{evs:?}");
    assert_eq!(rig.rc_a.state(), QpState::Sqd);
    rig.dev
        .handle_datagram(peer(), &send_only(0x11, RC_PSN, b"in sqd"));
    assert_eq!(answers(&rig), [(Opcode::RC_ACKNOWLEDGE, RC_PSN, Some(ACK))]);
    assert_eq!(polled(&rig).len(), 1);
    rig.rc_a
        .modify(
            &softroce::verbs::QpAttr {
                qp_state: QpState::Rts,
                ..Default::default()
            },
            softroce::verbs::QpAttrMask::STATE,
        )
        .unwrap();
    assert_eq!(rig.rc_a.state(), QpState::Rts);
    rig.teardown();
}

/// RDMA WRITE with immediate through the type 2 window to a QP whose SRQ is empty: RNR NAK
/// and the window's bytes untouched (the receive WQE is checked before memory, rxe
/// `check_resource`); after a repost the retried WRITE lands and completes
/// IBV_WC_RECV_RDMA_WITH_IMM on the SRQ's WR.
#[test]
fn write_with_immediate_through_a_window_to_an_empty_srq() {
    let mut rig = Rig::new();
    // Drain the SRQ with 8 SENDs on rc_b.
    for i in 0..device::SRQ_WR {
        rig.dev
            .handle_datagram(peer(), &send_only(0x12, RC_PSN + i, b"fill"));
    }
    assert_eq!(polled(&rig).len(), device::SRQ_WR as usize);
    answers(&rig);
    assert!(rig.srq.is_empty());
    let imm = |rkey| {
        let mut r = PacketRepr::new(bth(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, 0x11, RC_PSN));
        r.reth = Some(RethRepr {
            va: device::WIN_VA + 1024,
            rkey,
            dma_len: 4,
        });
        r.immdt = Some(softroce::wire::ImmDtRepr { imm_data: 0xfeed });
        emit(r, &[1, 2, 3, 4], DEV_IP)
    };
    rig.dev.handle_datagram(peer(), &imm(rig.mw2.rkey()));
    let a = answers(&rig);
    assert_eq!(a.len(), 1);
    assert!(a[0].2.is_some_and(|s| s & 0xe0 == 0x20), "RNR NAK: {a:?}");
    assert!(rig.win.to_vec()[1024..1028].iter().all(|&b| b == FILL));
    assert!(polled(&rig).is_empty());
    assert!(rig.post_srq_one());
    rig.dev.handle_datagram(peer(), &imm(rig.mw2.rkey()));
    assert_eq!(answers(&rig), [(Opcode::RC_ACKNOWLEDGE, RC_PSN, Some(ACK))]);
    assert_eq!(&rig.win.to_vec()[1024..1028], &[1, 2, 3, 4]);
    let wcs = polled(&rig);
    assert_eq!(wcs.len(), 1);
    assert_eq!(
        (wcs[0].status, wcs[0].opcode, wcs[0].imm_data, wcs[0].wr_id),
        (WcStatus::Success, WcOpcode::RecvRdmaWithImm, 0xfeed, 0x1000)
    );
    rig.check();
    rig.teardown();
}

/// An RC packet for a connected QP (DestQP 0x11, not 0xFFFFFF) that arrives on the multicast
/// group's socket: its destination IP is the group, not the QP's address, so rxe
/// `check_addr` ("dst addr != qp source addr") drops it. Dropped and counted
/// (`WrongSource`), never executed, never answered.
#[test]
fn rc_packet_to_a_connected_qp_via_the_group_address_is_dropped() {
    let rig = Rig::new();
    let c0 = rig.rc_a.counters();
    rig.dev.handle_multicast_datagram(
        peer(),
        IpAddr::V4(GROUP),
        &group_dgram(
            PacketRepr::new(bth(Opcode::RC_SEND_ONLY, 0x11, RC_PSN)),
            b"sneaky",
        ),
    );
    let mut w = PacketRepr::new(bth(Opcode::RC_RDMA_WRITE_ONLY, 0x11, RC_PSN));
    w.reth = Some(RethRepr {
        va: device::WIN_VA + 1024,
        rkey: rig.mw2.rkey(),
        dma_len: 4,
    });
    rig.dev
        .handle_multicast_datagram(peer(), IpAddr::V4(GROUP), &group_dgram(w, &[7; 4]));
    assert!(answers(&rig).is_empty());
    assert!(polled(&rig).is_empty());
    assert_eq!(rig.srq.len(), device::SRQ_WR as usize);
    let c = rig.rc_a.counters();
    assert_eq!(
        c.dropped(DropReason::WrongSource) - c0.dropped(DropReason::WrongSource),
        2
    );
    rig.check();
    rig.teardown();
}

/// A retransmitted SEND_WITH_INVALIDATE (its ACK was lost) is a duplicate: re-ACKed with the
/// same PSN, no second SRQ WR taken, no second completion, no invalidation error although
/// the key is already invalid (IBTA C9-105; rxe `duplicate_request`). BIND_MW on a UD QP is
/// refused at post (EOPNOTSUPP).
#[test]
fn duplicate_send_with_invalidate_is_reacked_only() {
    let rig = Rig::new();
    let mw2 = rig.mw2.rkey();
    let pkt = send_inv(0x11, RC_PSN, mw2, b"once");
    rig.dev.handle_datagram(peer(), &pkt);
    assert_eq!(answers(&rig), [(Opcode::RC_ACKNOWLEDGE, RC_PSN, Some(ACK))]);
    let wcs = polled(&rig);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert!(
        wcs[0]
            .wc_flags
            .contains(softroce::transport::WcFlags::WITH_INV)
    );
    for _ in 0..3 {
        rig.dev.handle_datagram(peer(), &pkt);
        assert_eq!(answers(&rig), [(Opcode::RC_ACKNOWLEDGE, RC_PSN, Some(ACK))]);
    }
    assert!(polled(&rig).is_empty());
    assert_eq!(rig.srq.len(), device::SRQ_WR as usize - 1);
    assert_eq!(rig.rc_a.state(), QpState::Rts);
    let e = rig
        .ud
        .post_send(&[rig
            .mw2
            .bind_wr(1, &rig.win, device::WIN_VA, 8, AccessFlags::REMOTE_READ)])
        .expect_err("BIND_MW on UD");
    assert!(matches!(e.kind(), ErrorKind::OpNotSupp), "{e}");
    rig.check();
    rig.teardown();
}

/// Destroying an SRQ in use is EBUSY and changes nothing (rxe: the SRQ is referenced by its
/// QPs); once its QPs are gone it is destroyed, a second destroy is ENOENT, and using it
/// (post_recv, create_qp on it) is refused with a typed error.
#[test]
fn srq_destroy_while_in_use_and_use_after_destroy() {
    let rig = Rig::new();
    let Rig {
        dev,
        cq,
        mut srq,
        rc_a,
        rc_b,
        ud_srq,
        rbuf,
        pd,
        ..
    } = rig;
    let e = srq.destroy().expect_err("QPs use it");
    assert!(matches!(e.kind(), ErrorKind::Busy), "{e}");
    assert_eq!(srq.len(), device::SRQ_WR as usize);
    drop(rc_a);
    assert!(matches!(srq.destroy().unwrap_err().kind(), ErrorKind::Busy));
    drop(rc_b);
    drop(ud_srq);
    srq.destroy().unwrap();
    assert!(matches!(
        srq.destroy().unwrap_err().kind(),
        ErrorKind::NoEnt
    ));
    let post = srq.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: vec![rbuf.sge(0, 8)],
    }]);
    assert!(post.is_err());
    assert!(srq.query().is_err());
    let qp = pd.create_qp(&softroce::verbs::QpInitAttr {
        qp_type: softroce::transport::QpType::Rc,
        send_cq: &cq,
        recv_cq: &cq,
        cap: softroce::transport::QpCap::default(),
        sq_sig_all: false,
        srq: Some(&srq),
    });
    assert!(matches!(
        qp.map(|_| ()).unwrap_err().kind(),
        ErrorKind::Inval
    ));
    dev.handle_timeouts();
}

/// A UD QP that takes its receive WQEs from an SRQ and is attached to a multicast group gets
/// the group's datagrams in the SRQ's WRs, like its unicast ones (rxe `rxe_rcv_mcast_pkt`
/// hands each member the packet through the same receive path, `get_srq_wqe` included).
/// Before the fix the SRQ member dropped every group datagram (`UdNoReceive`): multicast
/// delivery bypassed the SRQ lending.
#[test]
fn multicast_to_a_ud_qp_on_an_srq() {
    let rig = Rig::new();
    let srq = rig
        .pd
        .create_srq(&SrqInitAttr {
            max_wr: 4,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let ud2 = rig
        .pd
        .create_qp(&softroce::verbs::QpInitAttr {
            qp_type: softroce::transport::QpType::Ud,
            send_cq: &rig.cq,
            recv_cq: &rig.cq,
            cap: softroce::transport::QpCap::default(),
            sq_sig_all: false,
            srq: Some(&srq),
        })
        .unwrap();
    ud2.ready_ud(UD_QKEY, 0).unwrap();
    ud2.attach_mcast(&softroce::verbs::Gid::from(GROUP), 0)
        .unwrap();
    srq.post_recv(&[RecvWr {
        wr_id: 0x77,
        sg_list: vec![rig.ubuf.sge(3 * 4096, 4096)],
    }])
    .unwrap();
    rig.dev.handle_multicast_datagram(
        peer(),
        IpAddr::V4(GROUP),
        &ud_send(Opcode::UD_SEND_ONLY, MULTICAST_QPN, UD_QKEY, b"both", GROUP),
    );
    let wcs = polled(&rig);
    assert_eq!(wcs.len(), 3, "{wcs:?}");
    let w = wcs
        .iter()
        .find(|w| w.wr_id == 0x77)
        .expect("the SRQ member's completion");
    assert_eq!(w.qp_num, ud2.qp_num());
    assert_eq!((w.status, w.byte_len), (WcStatus::Success, 40 + 4));
    assert!(
        wcs.iter()
            .any(|w| w.wr_id == 0x100 && w.status == WcStatus::Success)
    );
    assert!(srq.is_empty());
    drop(ud2);
    drop(srq);
    rig.teardown();
}

/// A QP with no send queue (`max_send_wr` 0), as rxe's `rxe_qp_chk_cap` allows and qperf's
/// rc_bw server makes (it only receives), is created; a post to its send queue is refused
/// as a full queue, and its receive queue works. Before the fix create_qp refused it with
/// EINVAL ("qperf -cm1 HOST rc_bw": "server: failed to create QP: Invalid argument").
#[test]
fn qp_without_a_send_queue() {
    let rig = Rig::new();
    let qp = rig
        .pd
        .create_qp(&softroce::verbs::QpInitAttr {
            qp_type: softroce::transport::QpType::Rc,
            send_cq: &rig.cq,
            recv_cq: &rig.cq,
            cap: softroce::transport::QpCap {
                max_send_wr: 0,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
            srq: None,
        })
        .expect("max_send_wr 0 is a valid capacity");
    assert_eq!(qp.cap().max_send_wr, 0);
    assert!(
        qp.post_send(&[SendWr::new(1, WrOpcode::Send, Vec::new())])
            .is_err()
    );
    let over = rig.pd.create_qp(&softroce::verbs::QpInitAttr {
        qp_type: softroce::transport::QpType::Rc,
        send_cq: &rig.cq,
        recv_cq: &rig.cq,
        cap: softroce::transport::QpCap {
            max_send_wr: u32::MAX,
            ..softroce::transport::QpCap::default()
        },
        sq_sig_all: false,
        srq: None,
    });
    assert!(matches!(
        over.map(|_| ()).unwrap_err().kind(),
        ErrorKind::Inval
    ));
    drop(qp);
    rig.teardown();
}
