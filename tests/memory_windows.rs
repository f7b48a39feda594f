//! Memory windows, fast-register MRs, invalidation, SEND_WITH_INV, inline data, MR key reuse
//! and MRs over caller memory: over real UDP on loopback (two devices per test, 127.0.2x.1 and
//! 127.0.2x.2) and in the sans-IO engine (two `QpEngine`s wired back to back, no sockets).
//!
//! Rules checked (IBTA Vol 1 ch. 10; rxe `rxe_mw.c`, `rxe_mr.c`, `rxe_req.c`, `rxe_resp.c`):
//! a window grants exactly its bound range and rights; unbinding, LOCAL_INV and
//! SEND_WITH_INVALIDATE revoke a key, after which a remote WRITE with it is NAKed 0x62
//! (IBV_WC_REM_ACCESS_ERR) and leaves the target unchanged; a fast-register MR is usable only
//! between REG_MR and invalidation; LOCAL_INV waits for every earlier WR; inline data is
//! copied at post time and limited by `max_inline_data`.

use softroce::net::UdpDevice;
use softroce::transport::{
    AccessFlags, CqSel, Instant, MemoryTable, Path, PathMtu, QpAttrs, QpCap, QpEngine, QpState,
    QpType, RecvWr, SendFlags, SendWr, Sge, WcFlags, WcOpcode, WcStatus, WrOpcode,
};
use softroce::verbs::{
    Cq, ErrorKind, Gid, Mr, Mw, MwBind, MwType, Pd, Qp, QpInitAttr, RcConnect, Wc,
};
use softroce::wire::{Opcode, Psn, RocePacket};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// Loopback rig
// ---------------------------------------------------------------------------------------------

struct Side {
    dev: UdpDevice,
    pd: Pd,
    cq: Cq,
    qp: Qp,
}

fn side(ip: Ipv4Addr, max_inline_data: u32) -> Side {
    let dev = UdpDevice::open("softroce_mw", IpAddr::V4(ip)).expect("open device");
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(1024).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            cap: QpCap {
                max_inline_data,
                ..QpCap::default()
            },
            sq_sig_all: false,
            srq: None,
        })
        .unwrap();
    Side { dev, pd, cq, qp }
}

/// Two connected RC QPs on 127.0.(20 + n).1 and .2.
fn pair(n: u8) -> (Side, Side) {
    let a = side(Ipv4Addr::new(127, 0, 20 + n, 1), 512);
    let b = side(Ipv4Addr::new(127, 0, 20 + n, 2), 512);
    let mut ca = RcConnect::new(b.qp.qp_num(), Gid::from_ip(b.dev.ip()), 0x200, 0x100);
    let mut cb = RcConnect::new(a.qp.qp_num(), Gid::from_ip(a.dev.ip()), 0x100, 0x200);
    for c in [&mut ca, &mut cb] {
        c.min_rnr_timer = 1; // 0.01 ms: RNR retries come quickly
        c.max_rd_atomic = 4;
        c.max_dest_rd_atomic = 4;
    }
    a.qp.connect_rc(&ca).unwrap();
    b.qp.connect_rc(&cb).unwrap();
    (a, b)
}

fn wait_one(cq: &Cq) -> Wc {
    let mut wc = [Wc::default()];
    assert_eq!(
        cq.wait(&mut wc, Duration::from_secs(20)),
        1,
        "no completion in 20 s"
    );
    wc[0]
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(salt))
        .collect()
}

fn all_local() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::MW_BIND
}

fn rw() -> AccessFlags {
    AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
}

/// Posts a signaled RDMA WRITE of `data` (from a fresh MR of `s`) to `rkey`/`va` and returns
/// its completion.
fn write(s: &Side, rkey: u32, va: u64, data: &[u8]) -> Wc {
    write_on(&s.pd, &s.qp, &s.cq, rkey, va, data)
}

fn write_on(pd: &Pd, qp: &Qp, cq: &Cq, rkey: u32, va: u64, data: &[u8]) -> Wc {
    let src = pd
        .reg_mr(data.len().max(1), AccessFlags::LOCAL_WRITE)
        .unwrap();
    src.write(0, data).unwrap();
    let mut w = SendWr::new(
        0x77,
        WrOpcode::RdmaWrite,
        vec![src.sge(0, data.len() as u32)],
    );
    w.remote_addr = va;
    w.rkey = rkey;
    qp.post_send(&[w]).unwrap();
    wait_one(cq)
}

fn post_recv(s: &Side, mr: &Mr, id: u64, len: u32) {
    s.qp.post_recv(&[RecvWr {
        wr_id: id,
        sg_list: vec![mr.sge(0, len)],
    }])
    .unwrap();
}

// ---------------------------------------------------------------------------------------------
// Inline data
// ---------------------------------------------------------------------------------------------

/// A C frontend gathers inline data itself (libibverbs reads plain memory, registered or
/// not): `post_send_gathered` posts an inline SEND whose SGE lies outside every MR and the
/// peer receives the caller's bytes; data of another length than the SGEs' is EINVAL with
/// `bad_wr` naming the WR.
#[test]
fn inline_data_gathered_by_the_caller_needs_no_mr() {
    let (a, b) = pair(15);
    let dst = b.pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let wr = |id| {
        let sge = Sge {
            addr: 0x10,
            length: 8,
            lkey: 0,
        };
        let mut w = SendWr::new(id, WrOpcode::Send, vec![sge]);
        w.send_flags = SendFlags::SIGNALED | SendFlags::INLINE;
        w
    };
    let e =
        a.qp.post_send_gathered(&[wr(1)], vec![Some(vec![7; 5])])
            .unwrap_err();
    assert_eq!((e.kind(), e.bad_wr()), (ErrorKind::Inval, Some(0)));
    let data = pattern(8, 3);
    a.qp.post_send_gathered(&[wr(2)], vec![Some(data.clone())])
        .unwrap();
    post_recv(&b, &dst, 100, 64);
    assert_eq!((wait_one(&a.cq).wr_id, wait_one(&b.cq).byte_len), (2, 8));
    let mut got = vec![0u8; 8];
    dst.read(0, &mut got).unwrap();
    assert_eq!(got, data);
}

/// IBV_SEND_INLINE with 0, 1 and 512 bytes (rxe's largest `max_inline_data`) arrives intact
/// although the sender overwrites its buffer right after posting (the data was copied at
/// post time: the receiver posts its buffer only afterwards, so the SEND is RNR-retried from
/// the copy) and the SGE carries no lkey; 513 bytes is refused at post with EINVAL and
/// `bad_wr` naming it, and `max_inline_data` 513 is refused at QP creation.
#[test]
fn inline_0_1_512_and_513_bytes() {
    let (a, b) = pair(1);
    let src = a.pd.reg_mr(1024, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = b.pd.reg_mr(1024, AccessFlags::LOCAL_WRITE).unwrap();
    for (i, n) in [0usize, 1, 512].into_iter().enumerate() {
        let data = pattern(n, i as u8 + 1);
        src.write(0, &data).unwrap();
        let mut sge = src.sge(0, n as u32);
        sge.lkey = 0; // inline needs no lkey
        let mut w = SendWr::new(i as u64, WrOpcode::Send, vec![sge]);
        w.send_flags = SendFlags::SIGNALED | SendFlags::INLINE;
        a.qp.post_send(&[w]).unwrap();
        src.write(0, &vec![0xee; 1024]).unwrap();
        dst.write(0, &[0u8; 1024]).unwrap();
        post_recv(&b, &dst, 100 + i as u64, 1024);
        let s = wait_one(&a.cq);
        assert_eq!(
            (s.wr_id, s.status, s.opcode),
            (i as u64, WcStatus::Success, WcOpcode::Send)
        );
        let r = wait_one(&b.cq);
        assert_eq!((r.status, r.byte_len), (WcStatus::Success, n as u32));
        let mut got = vec![0u8; n];
        dst.read(0, &mut got).unwrap();
        assert_eq!(got, data, "{n} inline bytes");
    }
    // Inline RDMA WRITE.
    let data = pattern(300, 9);
    src.write(0, &data).unwrap();
    let mut w = SendWr::new(7, WrOpcode::RdmaWrite, vec![src.sge(0, 300)]);
    w.send_flags = SendFlags::SIGNALED | SendFlags::INLINE;
    let target = b.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | rw()).unwrap();
    w.remote_addr = target.addr() + 8;
    w.rkey = target.rkey();
    a.qp.post_send(&[w]).unwrap();
    assert_eq!(wait_one(&a.cq).status, WcStatus::Success);
    let mut got = vec![0u8; 300];
    target.read(8, &mut got).unwrap();
    assert_eq!(got, data);
    // 513 bytes: EINVAL at post, the first WR of the list is posted, the second is bad_wr.
    let ok = SendWr::new(20, WrOpcode::Send, vec![]);
    let mut big = SendWr::new(21, WrOpcode::Send, vec![src.sge(0, 513)]);
    big.send_flags = SendFlags::SIGNALED | SendFlags::INLINE;
    post_recv(&b, &dst, 200, 1024);
    let e = a.qp.post_send(&[ok, big]).unwrap_err();
    assert_eq!((e.kind(), e.bad_wr()), (ErrorKind::Inval, Some(1)));
    assert_eq!(wait_one(&a.cq).wr_id, 20);
    assert_eq!(wait_one(&b.cq).byte_len, 0);
    // max_inline_data over 512 at creation.
    let e =
        a.pd.create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &a.cq,
            recv_cq: &a.cq,
            cap: QpCap {
                max_inline_data: 513,
                ..QpCap::default()
            },
            sq_sig_all: false,
            srq: None,
        })
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Inval);
}

// ---------------------------------------------------------------------------------------------
// Memory windows
// ---------------------------------------------------------------------------------------------

/// A type 1 window bound with `ibv_bind_mw` (completes with IBV_WC_BIND_MW, new R_Key =
/// `ibv_inc_rkey`) lets the peer WRITE and READ exactly its range; unbinding revokes the key:
/// a WRITE with it is IBV_WC_REM_ACCESS_ERR and the target is unchanged.
#[test]
fn mw_type1_grants_its_range_and_unbind_revokes_it() {
    let (a, b) = pair(2);
    let mr = b.pd.reg_mr(16384, all_local()).unwrap();
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let before = mw.rkey();
    let base = mr.addr() + 4096;
    let rkey =
        b.qp.bind_mw(
            &mw,
            &MwBind {
                mr: &mr,
                addr: base,
                length: 4096,
                access: rw(),
                wr_id: 5,
                send_flags: SendFlags::SIGNALED,
            },
        )
        .unwrap();
    assert_eq!(rkey, softroce::verbs::inc_rkey(before));
    let wc = wait_one(&b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (5, WcStatus::Success, WcOpcode::BindMw)
    );
    assert_eq!(mw.rkey(), rkey);
    // WRITE at both ends of the window.
    let data = pattern(100, 3);
    assert_eq!(write(&a, rkey, base, &data).status, WcStatus::Success);
    assert_eq!(
        write(&a, rkey, base + 4096 - 100, &data).status,
        WcStatus::Success
    );
    let mut got = vec![0u8; 100];
    mr.read(4096, &mut got).unwrap();
    assert_eq!(got, data);
    mr.read(8192 - 100, &mut got).unwrap();
    assert_eq!(got, data);
    // READ through the window.
    let sink = a.pd.reg_mr(100, AccessFlags::LOCAL_WRITE).unwrap();
    let mut r = SendWr::new(6, WrOpcode::RdmaRead, vec![sink.sge(0, 100)]);
    r.remote_addr = base;
    r.rkey = rkey;
    a.qp.post_send(&[r]).unwrap();
    assert_eq!(wait_one(&a.cq).status, WcStatus::Success);
    assert_eq!(sink.to_vec(), data);
    // Unbind (length 0): the key changes again and the old one is dead.
    let unbound =
        b.qp.bind_mw(
            &mw,
            &MwBind {
                mr: &mr,
                addr: 0,
                length: 0,
                access: rw(),
                wr_id: 8,
                send_flags: SendFlags::SIGNALED,
            },
        )
        .unwrap();
    assert_ne!(unbound, rkey);
    assert_eq!(wait_one(&b.cq).opcode, WcOpcode::BindMw);
    let snapshot = mr.to_vec();
    let wc = write(&a, rkey, base, &[0xaa; 16]);
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    assert_eq!(mr.to_vec(), snapshot, "target unchanged");
}

/// An access outside the window (still inside its MR) or needing a right the window does
/// not grant is IBV_WC_REM_ACCESS_ERR; the MR's own key still works.
#[test]
fn mw_outside_its_range_is_a_remote_access_error() {
    for (n, case) in [(3u8, "below"), (4, "above"), (5, "atomic")] {
        let (a, b) = pair(n);
        let mr =
            b.pd.reg_mr(16384, all_local() | AccessFlags::REMOTE_ATOMIC)
                .unwrap();
        let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
        let base = mr.addr() + 4096;
        let bind = MwBind {
            mr: &mr,
            addr: base,
            length: 4096,
            access: rw(),
            wr_id: 1,
            send_flags: SendFlags::empty(),
        };
        let rkey = b.qp.bind_mw(&mw, &bind).unwrap();
        assert_eq!(
            write(&a, mr.rkey(), base - 8, &[1; 8]).status,
            WcStatus::Success
        );
        let snapshot = mr.to_vec();
        let wc = match case {
            "below" => write(&a, rkey, base - 8, &[2; 16]),
            "above" => write(&a, rkey, base + 4096 - 8, &[2; 16]),
            _ => {
                let sink = a.pd.reg_mr(8, AccessFlags::LOCAL_WRITE).unwrap();
                let mut f = SendWr::new(3, WrOpcode::AtomicFetchAndAdd, vec![sink.sge(0, 8)]);
                f.remote_addr = base;
                f.rkey = rkey;
                f.compare_add = 1;
                a.qp.post_send(&[f]).unwrap();
                wait_one(&a.cq)
            }
        };
        assert_eq!(wc.status, WcStatus::RemAccessErr, "{case}");
        assert_eq!(mr.to_vec(), snapshot, "{case}: target unchanged");
    }
}

/// A type 2 window is bound by a BIND_MW work request to the posting QP; the peer WRITEs
/// through it; LOCAL_INV (IBV_WC_LOCAL_INV) revokes it: the next WRITE is
/// IBV_WC_REM_ACCESS_ERR and the target is unchanged.
#[test]
fn mw_type2_bind_wr_grants_and_local_inv_revokes() {
    let (a, b) = pair(6);
    let mr = b.pd.reg_mr(8192, all_local()).unwrap();
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let bind = mw.bind_wr(11, &mr, mr.addr(), 8192, rw());
    let rkey = bind.bind_mw.unwrap().rkey;
    b.qp.post_send(&[bind]).unwrap();
    let wc = wait_one(&b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (11, WcStatus::Success, WcOpcode::BindMw)
    );
    assert_eq!(mw.rkey(), rkey);
    let data = pattern(2000, 4);
    assert_eq!(
        write(&a, rkey, mr.addr() + 100, &data).status,
        WcStatus::Success
    );
    let mut got = vec![0u8; 2000];
    mr.read(100, &mut got).unwrap();
    assert_eq!(got, data);
    b.qp.post_send(&[SendWr::local_inv(12, rkey)]).unwrap();
    let wc = wait_one(&b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (12, WcStatus::Success, WcOpcode::LocalInv)
    );
    let snapshot = mr.to_vec();
    assert_eq!(
        write(&a, rkey, mr.addr(), &[9; 64]).status,
        WcStatus::RemAccessErr
    );
    assert_eq!(mr.to_vec(), snapshot, "target unchanged");
}

/// A type 2 window is usable only through the QP it was bound by (rxe `rxe_lookup_mw`: the
/// window's QP must be the receiving one): a WRITE with its key arriving on a second
/// connection between the same PDs is IBV_WC_REM_ACCESS_ERR and changes nothing.
#[test]
fn mw_type2_is_usable_only_through_its_qp() {
    let (a, b) = pair(14);
    let mk = |s: &Side| {
        s.pd.create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &s.cq,
            recv_cq: &s.cq,
            cap: QpCap::default(),
            sq_sig_all: false,
            srq: None,
        })
        .unwrap()
    };
    let (a2, b2) = (mk(&a), mk(&b));
    a2.connect_rc(&RcConnect::new(b2.qp_num(), Gid::from_ip(b.dev.ip()), 1, 1))
        .unwrap();
    b2.connect_rc(&RcConnect::new(a2.qp_num(), Gid::from_ip(a.dev.ip()), 1, 1))
        .unwrap();
    let mr = b.pd.reg_mr(4096, all_local()).unwrap();
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let bind = mw.bind_wr(1, &mr, mr.addr(), 4096, rw());
    let rkey = bind.bind_mw.unwrap().rkey;
    b.qp.post_send(&[bind]).unwrap();
    assert_eq!(wait_one(&b.cq).status, WcStatus::Success);
    assert_eq!(
        write(&a, rkey, mr.addr(), b"via b.qp").status,
        WcStatus::Success
    );
    let snapshot = mr.to_vec();
    let wc = write_on(&a.pd, &a2, &a.cq, rkey, mr.addr(), b"via b2!!");
    assert_eq!(
        (wc.qp_num, wc.status),
        (a2.qp_num(), WcStatus::RemAccessErr)
    );
    assert_eq!(mr.to_vec(), snapshot, "target unchanged");
}

/// A bind that breaks a rule (MR without IBV_ACCESS_MW_BIND, C10-73) completes with
/// IBV_WC_MW_BIND_ERR and takes the QP to ERR; binding a type 2 window with `ibv_bind_mw` is
/// EINVAL.
#[test]
fn mw_bind_errors() {
    let (_a, b) = pair(7);
    let plain = b.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | rw()).unwrap();
    let t2 = b.pd.alloc_mw(MwType::Type2).unwrap();
    let e =
        b.qp.bind_mw(
            &t2,
            &MwBind {
                mr: &plain,
                addr: plain.addr(),
                length: 8,
                access: rw(),
                wr_id: 1,
                send_flags: SendFlags::SIGNALED,
            },
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Inval);
    b.qp.post_send(&[t2.bind_wr(2, &plain, plain.addr(), 8, rw())])
        .unwrap();
    let wc = wait_one(&b.cq);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::MwBindErr));
    assert_eq!(b.qp.state(), QpState::Err);
}

// ---------------------------------------------------------------------------------------------
// Fast-register MRs, SEND_WITH_INV, LOCAL_INV ordering
// ---------------------------------------------------------------------------------------------

fn reg(b: &Side, mr: &Mr, wr_id: u64, key_byte: u8, iova: u64) -> u32 {
    let w = mr.reg_wr(
        wr_id,
        key_byte,
        iova,
        16384,
        AccessFlags::LOCAL_WRITE | rw(),
    );
    let key = w.reg_mr.unwrap().key;
    b.qp.post_send(&[w]).unwrap();
    let wc = wait_one(&b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (wr_id, WcStatus::Success, WcOpcode::RegMr)
    );
    assert_eq!((mr.lkey(), mr.rkey(), mr.addr()), (key, key, iova));
    key
}

/// alloc_mr → REG_MR (IBV_WC_REG_MR) → remote WRITE at the registered iova → LOCAL_INV →
/// REG_MR with a new key byte → WRITE → SEND_WITH_INV from the peer (the receive has
/// IBV_WC_WITH_INV and invalidated_rkey) → a WRITE with the invalidated key is
/// IBV_WC_REM_ACCESS_ERR and changes nothing.
#[test]
fn frmr_register_use_invalidate_cycle() {
    let (a, b) = pair(8);
    let mr = b.pd.alloc_mr(4).unwrap();
    assert_eq!(mr.len(), 16384);
    let k1 = reg(&b, &mr, 1, 0x31, 0x1000_0000);
    let data = pattern(5000, 5);
    assert_eq!(
        write(&a, k1, 0x1000_0000 + 1000, &data).status,
        WcStatus::Success
    );
    let mut got = vec![0u8; 5000];
    mr.read(1000, &mut got).unwrap();
    assert_eq!(got, data);
    b.qp.post_send(&[SendWr::local_inv(2, k1)]).unwrap();
    assert_eq!(wait_one(&b.cq).opcode, WcOpcode::LocalInv);
    let k2 = reg(&b, &mr, 3, 0x32, 0x2000_0000);
    assert_ne!(k1, k2);
    assert_eq!(
        write(&a, k2, 0x2000_0000, b"second").status,
        WcStatus::Success
    );
    // SEND_WITH_INV of k2.
    let rbuf = b.pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    post_recv(&b, &rbuf, 40, 64);
    let src = a.pd.reg_mr(5, AccessFlags::LOCAL_WRITE).unwrap();
    src.write(0, b"bye!!").unwrap();
    let mut s = SendWr::new(41, WrOpcode::SendWithInv, vec![src.sge(0, 5)]);
    s.invalidate_rkey = k2;
    a.qp.post_send(&[s]).unwrap();
    let sw = wait_one(&a.cq);
    assert_eq!(
        (sw.wr_id, sw.status, sw.opcode),
        (41, WcStatus::Success, WcOpcode::Send)
    );
    let rw_ = wait_one(&b.cq);
    assert_eq!(
        (rw_.wr_id, rw_.status, rw_.byte_len),
        (40, WcStatus::Success, 5)
    );
    assert!(rw_.wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(rw_.invalidated_rkey(), Some(k2));
    let snapshot = mr.to_vec();
    assert_eq!(
        write(&a, k2, 0x2000_0000, b"third").status,
        WcStatus::RemAccessErr
    );
    assert_eq!(mr.to_vec(), snapshot, "target unchanged");
}

/// A fast-register MR is unusable before its first REG_MR.
#[test]
fn frmr_before_reg_mr_is_a_remote_access_error() {
    let (a, b) = pair(9);
    let mr = b.pd.alloc_mr(1).unwrap();
    assert_eq!(
        write(&a, mr.rkey(), mr.addr(), b"x").status,
        WcStatus::RemAccessErr
    );
    assert_eq!(mr.to_vec(), vec![0u8; 4096]);
}

/// SEND_WITH_INV of a type 2 window bound to the receiving QP: the receive reports it, and
/// the window's key is dead afterwards.
#[test]
fn send_with_inv_revokes_a_type2_window() {
    let (a, b) = pair(10);
    let mr = b.pd.reg_mr(4096, all_local()).unwrap();
    let mw: Mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let bind = mw.bind_wr(1, &mr, mr.addr(), 4096, rw());
    let rkey = bind.bind_mw.unwrap().rkey;
    b.qp.post_send(&[bind]).unwrap();
    assert_eq!(wait_one(&b.cq).status, WcStatus::Success);
    assert_eq!(write(&a, rkey, mr.addr(), b"ok").status, WcStatus::Success);
    let rbuf = b.pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    post_recv(&b, &rbuf, 2, 64);
    let mut s = SendWr::new(3, WrOpcode::SendWithInv, vec![]);
    s.invalidate_rkey = rkey;
    a.qp.post_send(&[s]).unwrap();
    assert_eq!(wait_one(&a.cq).status, WcStatus::Success);
    let r = wait_one(&b.cq);
    assert_eq!(
        (r.status, r.invalidated_rkey()),
        (WcStatus::Success, Some(rkey))
    );
    let snapshot = mr.to_vec();
    assert_eq!(
        write(&a, rkey, mr.addr(), b"no").status,
        WcStatus::RemAccessErr
    );
    assert_eq!(mr.to_vec(), snapshot);
}

/// LOCAL_INV waits for every earlier WR: b's SEND is stuck in RNR retries (a has no receive
/// posted) when b posts a type 2 bind and then LOCAL_INV of its fast-register MR's key. The
/// bind is not fenced: it runs at once (a WRITEs through the new window) but completes in
/// order; LOCAL_INV has not run: the key still works (a WRITEs through it). Once a posts a
/// receive: SEND, bind and LOCAL_INV complete in that order and the key is dead.
#[test]
fn local_inv_waits_for_earlier_wrs() {
    let (a, b) = pair(11);
    let frmr = b.pd.alloc_mr(4).unwrap();
    let key = reg(&b, &frmr, 1, 0x10, 0x4000_0000);
    let mr = b.pd.reg_mr(4096, all_local()).unwrap();
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let src = b.pd.reg_mr(16, AccessFlags::LOCAL_WRITE).unwrap();
    let bind = mw.bind_wr(4, &mr, mr.addr(), 4096, rw());
    let mw_key = bind.bind_mw.unwrap().rkey;
    b.qp.post_send(&[SendWr::new(2, WrOpcode::Send, vec![src.sge(0, 16)])])
        .unwrap();
    b.qp.post_send(&[bind, SendWr::local_inv(3, key)]).unwrap();
    // The SEND is outstanding, so LOCAL_INV has not run: the key still works.
    assert_eq!(
        write(&a, key, 0x4000_0000, b"still").status,
        WcStatus::Success
    );
    // The bind behind it already ran.
    assert_eq!(
        write(&a, mw_key, mr.addr(), b"bound").status,
        WcStatus::Success
    );
    assert!(
        b.cq.poll_one().is_none(),
        "nothing completes before the SEND"
    );
    let rbuf = a.pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    post_recv(&a, &rbuf, 9, 64);
    assert_eq!(wait_one(&a.cq).wr_id, 9);
    let order: Vec<(u64, WcOpcode)> = (0..3)
        .map(|_| {
            let w = wait_one(&b.cq);
            assert_eq!(w.status, WcStatus::Success);
            (w.wr_id, w.opcode)
        })
        .collect();
    assert_eq!(
        order,
        [
            (2, WcOpcode::Send),
            (4, WcOpcode::BindMw),
            (3, WcOpcode::LocalInv)
        ]
    );
    let mut got = [0u8; 5];
    frmr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"still");
    assert_eq!(
        write(&a, key, 0x4000_0000, b"late!").status,
        WcStatus::RemAccessErr
    );
    frmr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"still", "target unchanged");
}

// ---------------------------------------------------------------------------------------------
// MR keys and caller memory
// ---------------------------------------------------------------------------------------------

/// After deregistration and a new registration the old key is rejected remotely
/// (IBV_WC_REM_ACCESS_ERR), and the new MR has another key.
#[test]
fn a_deregistered_key_is_rejected_after_reregistration() {
    let (a, b) = pair(12);
    let old = b.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | rw()).unwrap();
    let (old_key, old_addr) = (old.rkey(), old.addr());
    assert_eq!(
        write(&a, old_key, old_addr, b"live").status,
        WcStatus::Success
    );
    drop(old);
    let new = b.pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | rw()).unwrap();
    assert_ne!(new.rkey(), old_key);
    assert_eq!(
        write(&a, old_key, new.addr(), b"stale").status,
        WcStatus::RemAccessErr
    );
    assert_eq!(new.to_vec(), vec![0u8; 4096]);
}

/// An MR over caller memory: the peer WRITEs into the caller's buffer and READs from it;
/// after the MR is dropped the buffer holds what was written.
#[test]
fn reg_mr_user_over_caller_memory() {
    let (a, b) = pair(13);
    let mut buf = vec![0u8; 8192];
    let ptr = buf.as_mut_ptr();
    // SAFETY: `buf` outlives `mr` (dropped below before `buf` is touched again) and is not
    // accessed except through `mr` until then.
    let mr = unsafe {
        b.pd.reg_mr_user(ptr, buf.len(), AccessFlags::LOCAL_WRITE | rw())
    }
    .unwrap();
    assert_eq!(mr.addr(), ptr as u64);
    let data = pattern(3000, 8);
    assert_eq!(
        write(&a, mr.rkey(), mr.addr() + 10, &data).status,
        WcStatus::Success
    );
    mr.write(5000, b"from the owner").unwrap();
    let sink = a.pd.reg_mr(14, AccessFlags::LOCAL_WRITE).unwrap();
    let mut r = SendWr::new(1, WrOpcode::RdmaRead, vec![sink.sge(0, 14)]);
    r.remote_addr = mr.addr() + 5000;
    r.rkey = mr.rkey();
    a.qp.post_send(&[r]).unwrap();
    assert_eq!(wait_one(&a.cq).status, WcStatus::Success);
    assert_eq!(sink.to_vec(), b"from the owner");
    drop(mr);
    assert_eq!(&buf[10..3010], &data[..]);
    assert_eq!(&buf[5000..5014], b"from the owner");
    // SAFETY: a null address is refused before anything is registered.
    let e = unsafe {
        b.pd.reg_mr_user(std::ptr::null_mut(), 8, AccessFlags::LOCAL_WRITE)
    };
    assert_eq!(e.unwrap_err().kind(), ErrorKind::Inval);
}

// ---------------------------------------------------------------------------------------------
// Sans-IO engine pair
// ---------------------------------------------------------------------------------------------

const A_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 9, 0, 1));
const B_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 9, 0, 2));
const PD: u32 = 1;

struct Node {
    e: QpEngine,
    mem: MemoryTable,
}

/// Two RC engines, QPN 0x11 (a) and 0x12 (b), each with its own memory table.
fn engines(max_inline_data: u32) -> (Node, Node) {
    let mk = |qpn, dest, local, remote, seed| {
        let cap = QpCap {
            max_inline_data,
            ..QpCap::default()
        };
        let mut e = QpEngine::new(qpn, QpType::Rc, PD, cap, false);
        let attrs = QpAttrs {
            dest_qp_num: dest,
            path_mtu: PathMtu::Mtu1024,
            qp_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            max_dest_rd_atomic: 4,
            max_rd_atomic: 4,
            rq_psn: Psn::new(0x10),
            sq_psn: Psn::new(0x10),
            min_rnr_timer: 1,
            ..QpAttrs::default()
        };
        let path = Path {
            local,
            remote,
            src_port: 0xc000,
            ip: Default::default(),
        };
        e.modify_to(QpState::Rts, &attrs, Some(path))
            .expect("RESET -> RTS");
        Node {
            e,
            mem: MemoryTable::new(seed),
        }
    };
    (mk(0x11, 0x12, A_IP, B_IP, 1), mk(0x12, 0x11, B_IP, A_IP, 2))
}

/// Moves packets both ways (and runs local operations) until both sides are quiet. Returns
/// the opcodes carried, in order.
fn drive(a: &mut Node, b: &mut Node) -> Vec<(Opcode, Option<u32>)> {
    let mut seen = Vec::new();
    for _ in 0..10_000 {
        let moved = step(a, b, A_IP, &mut seen) | step(b, a, B_IP, &mut seen);
        if !moved {
            return seen;
        }
    }
    panic!("no quiescence");
}

/// Runs `from`'s local operations and delivers everything it sends to `to`.
fn step(
    from: &mut Node,
    to: &mut Node,
    src: IpAddr,
    seen: &mut Vec<(Opcode, Option<u32>)>,
) -> bool {
    let mut moved = from.e.run_local_ops(&mut from.mem);
    while let Some(t) = from.e.poll_transmit(Instant::ZERO, &from.mem) {
        let p = RocePacket::parse(&t.payload).expect("parses");
        seen.push((p.repr.bth.opcode, p.repr.ieth.map(|i| i.rkey)));
        to.e.handle_packet(Instant::ZERO, &p, src, &mut to.mem);
        moved = true;
    }
    moved
}

fn completions(n: &mut Node) -> Vec<(CqSel, u64, WcStatus, WcOpcode, Option<u32>)> {
    std::iter::from_fn(|| n.e.poll_completion())
        .map(|c| {
            (
                c.cq,
                c.wc.wr_id,
                c.wc.status,
                c.wc.opcode,
                c.wc.invalidated_rkey(),
            )
        })
        .collect()
}

/// In the engine: a SEND_WITH_INV goes on the wire as RC SEND ONLY WITH INVALIDATE (0x17)
/// with the R_Key in its IETH (a multi-packet one as FIRST … LAST WITH INVALIDATE, 0x16,
/// IETH on the last packet only); the receiver's FRMR is invalidated; a WRITE with the key
/// afterwards is NAKed 0x62 and completes with IBV_WC_REM_ACCESS_ERR.
#[test]
fn engine_send_with_inv_wire_and_revocation() {
    let (mut a, mut b) = engines(0);
    let k = b.mem.alloc_fast_reg(PD, 8192).unwrap();
    b.e.post_send({
        let mut w = SendWr::new(1, WrOpcode::RegMr, vec![]);
        w.reg_mr = Some(softroce::transport::RegMr {
            mr_key: k,
            key: k,
            iova: 0x9000,
            length: 8192,
            access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        });
        w
    })
    .unwrap();
    drive(&mut a, &mut b);
    assert_eq!(
        completions(&mut b),
        [(CqSel::Send, 1, WcStatus::Success, WcOpcode::RegMr, None)]
    );
    let rk = b.mem.register(PD, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let rva = b.mem.get(rk).unwrap().iova;
    for (id, len) in [(10u64, 100u32), (11, 2500)] {
        b.e.post_recv(RecvWr {
            wr_id: id,
            sg_list: vec![Sge {
                addr: rva,
                length: 4096,
                lkey: rk,
            }],
        })
        .unwrap();
        let sk = a
            .mem
            .register(PD, len as usize, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let sva = a.mem.get(sk).unwrap().iova;
        let mut s = SendWr::new(
            id,
            WrOpcode::SendWithInv,
            vec![Sge {
                addr: sva,
                length: len,
                lkey: sk,
            }],
        );
        // The first invalidates the FRMR; the second names it again, now FREE: that is
        // still a valid invalidation of a fast-register MR (rxe `rxe_invalidate_mr` does
        // not require VALID).
        s.invalidate_rkey = k;
        a.e.post_send(s).unwrap();
        let wire = drive(&mut a, &mut b);
        let sends: Vec<_> = wire
            .into_iter()
            .filter(|(op, _)| *op != Opcode::RC_ACKNOWLEDGE)
            .collect();
        if len <= 1024 {
            assert_eq!(sends, [(Opcode::RC_SEND_ONLY_WITH_INVALIDATE, Some(k))]);
        } else {
            assert_eq!(
                sends,
                [
                    (Opcode::RC_SEND_FIRST, None),
                    (Opcode::RC_SEND_MIDDLE, None),
                    (Opcode::RC_SEND_LAST_WITH_INVALIDATE, Some(k)),
                ]
            );
        }
        assert_eq!(
            completions(&mut a),
            [(CqSel::Send, id, WcStatus::Success, WcOpcode::Send, None)]
        );
        assert_eq!(
            completions(&mut b),
            [(CqSel::Recv, id, WcStatus::Success, WcOpcode::Recv, Some(k))]
        );
    }
    // The invalidated key: NAK remote access error, target untouched.
    let sk = a.mem.register(PD, 4, AccessFlags::LOCAL_WRITE).unwrap();
    let sva = a.mem.get(sk).unwrap().iova;
    let mut w = SendWr::new(
        20,
        WrOpcode::RdmaWrite,
        vec![Sge {
            addr: sva,
            length: 4,
            lkey: sk,
        }],
    );
    w.remote_addr = 0x9000;
    w.rkey = k;
    a.e.post_send(w).unwrap();
    drive(&mut a, &mut b);
    assert_eq!(
        completions(&mut a),
        [(
            CqSel::Send,
            20,
            WcStatus::RemAccessErr,
            WcOpcode::RdmaWrite,
            None
        )]
    );
    assert!(
        b.mem
            .get(k)
            .unwrap()
            .owned_bytes()
            .unwrap()
            .iter()
            .all(|&x| x == 0)
    );
}

/// In the engine: LOCAL_INV behind an unacknowledged SEND does not run until the SEND's ACK
/// arrives; then it completes after it (IBV_WC_LOCAL_INV), and the key is dead.
#[test]
fn engine_local_inv_waits_for_the_ack_of_earlier_sends() {
    let (mut a, mut b) = engines(0);
    let k = a.mem.alloc_fast_reg(PD, 4096).unwrap();
    let mut reg = SendWr::new(1, WrOpcode::RegMr, vec![]);
    reg.reg_mr = Some(softroce::transport::RegMr {
        mr_key: k,
        key: k,
        iova: 0x100,
        length: 4096,
        access: AccessFlags::LOCAL_WRITE,
    });
    a.e.post_send(reg).unwrap();
    assert!(a.e.run_local_ops(&mut a.mem));
    assert_eq!(completions(&mut a)[0].3, WcOpcode::RegMr);
    b.e.post_recv(RecvWr {
        wr_id: 5,
        sg_list: vec![],
    })
    .unwrap();
    a.e.post_send(SendWr::new(2, WrOpcode::Send, vec![]))
        .unwrap();
    a.e.post_send(SendWr::local_inv(3, k)).unwrap();
    // The SEND goes out; LOCAL_INV must wait for its ACK.
    let t = a.e.poll_transmit(Instant::ZERO, &a.mem).expect("the SEND");
    assert!(a.e.poll_transmit(Instant::ZERO, &a.mem).is_none());
    assert!(!a.e.run_local_ops(&mut a.mem), "fenced behind the SEND");
    assert!(
        a.mem.check(k, PD, 0x100, 1, AccessFlags::empty()).is_ok(),
        "key still valid"
    );
    assert!(completions(&mut a).is_empty());
    let p = RocePacket::parse(&t.payload).unwrap();
    b.e.handle_packet(Instant::ZERO, &p, A_IP, &mut b.mem);
    let ack = b.e.poll_transmit(Instant::ZERO, &b.mem).expect("the ACK");
    let p = RocePacket::parse(&ack.payload).unwrap();
    a.e.handle_packet(Instant::ZERO, &p, B_IP, &mut a.mem);
    assert!(a.e.run_local_ops(&mut a.mem));
    let got: Vec<_> = completions(&mut a).iter().map(|c| (c.1, c.3)).collect();
    assert_eq!(got, [(2, WcOpcode::Send), (3, WcOpcode::LocalInv)]);
    assert!(a.mem.check(k, PD, 0x100, 1, AccessFlags::empty()).is_err());
}

/// In the engine: inline data is taken at post time (`post_send_mem`), so changing the
/// source afterwards does not change what is sent; `post_send` refuses inline data it
/// cannot copy; over `max_inline_data` is EINVAL.
#[test]
fn engine_inline_is_copied_at_post() {
    let (mut a, mut b) = engines(64);
    let sk = a.mem.register(PD, 64, AccessFlags::LOCAL_WRITE).unwrap();
    let host = a.mem.get(sk).unwrap().host_addr();
    a.mem.get_mut(sk).unwrap().owned_bytes_mut().unwrap()[..5].copy_from_slice(b"early");
    let sge = Sge {
        addr: host,
        length: 5,
        lkey: 0,
    };
    let mut w = SendWr::new(1, WrOpcode::Send, vec![sge]);
    w.send_flags = SendFlags::SIGNALED | SendFlags::INLINE;
    assert!(matches!(
        a.e.post_send(w.clone()),
        Err(softroce::transport::PostError::Invalid(_))
    ));
    a.e.post_send_mem(w.clone(), &a.mem).unwrap();
    a.mem.get_mut(sk).unwrap().owned_bytes_mut().unwrap()[..5].copy_from_slice(b"late!");
    let rk = b.mem.register(PD, 64, AccessFlags::LOCAL_WRITE).unwrap();
    let rva = b.mem.get(rk).unwrap().iova;
    b.e.post_recv(RecvWr {
        wr_id: 9,
        sg_list: vec![Sge {
            addr: rva,
            length: 64,
            lkey: rk,
        }],
    })
    .unwrap();
    drive(&mut a, &mut b);
    assert_eq!(
        &b.mem.get(rk).unwrap().owned_bytes().unwrap()[..5],
        b"early"
    );
    let mut big = w;
    big.sg_list[0].length = 65;
    assert!(matches!(
        a.e.post_send_mem(big, &a.mem),
        Err(softroce::transport::PostError::Invalid(_))
    ));
}

fn reg_wr(wr_id: u64, key: u32, access: AccessFlags) -> SendWr {
    let mut w = SendWr::new(wr_id, WrOpcode::RegMr, vec![]);
    w.reg_mr = Some(softroce::transport::RegMr {
        mr_key: key,
        key,
        iova: 0x100,
        length: 4096,
        access,
    });
    w
}

/// Go-back-N over an executed local operation does not execute it again: a's first SEND is
/// lost, b NAKs the sequence error when the second arrives, a resends from the first SEND
/// and steps over the REG_MR between them (executing it twice would fail: it is no longer
/// FREE). Everything completes in order and the QP stays in RTS.
#[test]
fn engine_retransmission_skips_executed_local_ops() {
    let (mut a, mut b) = engines(0);
    let k = a.mem.alloc_fast_reg(PD, 4096).unwrap();
    for _ in 0..2 {
        b.e.post_recv(RecvWr {
            wr_id: 0,
            sg_list: vec![],
        })
        .unwrap();
    }
    a.e.post_send(SendWr::new(1, WrOpcode::Send, vec![]))
        .unwrap();
    a.e.post_send(reg_wr(2, k, AccessFlags::LOCAL_WRITE))
        .unwrap();
    a.e.post_send(SendWr::new(3, WrOpcode::Send, vec![]))
        .unwrap();
    let lost = a.e.poll_transmit(Instant::ZERO, &a.mem).expect("SEND 1");
    assert!(a.e.poll_transmit(Instant::ZERO, &a.mem).is_none());
    assert!(a.e.run_local_ops(&mut a.mem), "REG_MR runs at once");
    assert_eq!(
        a.mem.get(k).unwrap().state(),
        softroce::transport::MrState::Valid
    );
    drop(lost);
    let wire = drive(&mut a, &mut b);
    assert!(wire.contains(&(Opcode::RC_SEND_ONLY, None)));
    let got: Vec<_> = completions(&mut a)
        .iter()
        .map(|c| (c.1, c.2, c.3))
        .collect();
    assert_eq!(
        got,
        [
            (1, WcStatus::Success, WcOpcode::Send),
            (2, WcStatus::Success, WcOpcode::RegMr),
            (3, WcStatus::Success, WcOpcode::Send),
        ]
    );
    assert_eq!(a.e.state(), QpState::Rts);
    assert_eq!(a.e.counters().rcvd_seq_err, 1);
}

/// IBV_SEND_FENCE on a local operation waits for earlier READs (as on any WR); without the
/// fence a REG_MR behind a READ runs at once. A failing REG_MR completes with
/// IBV_WC_LOC_QP_OP_ERR and moves the QP to ERR (rxe `rxe_do_local_ops`).
#[test]
fn engine_fenced_local_op_waits_for_reads() {
    let (mut a, mut b) = engines(0);
    let src = b
        .mem
        .register(PD, 64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
        .unwrap();
    let sva = b.mem.get(src).unwrap().iova;
    let sink = a.mem.register(PD, 64, AccessFlags::LOCAL_WRITE).unwrap();
    let kva = a.mem.get(sink).unwrap().iova;
    let k1 = a.mem.alloc_fast_reg(PD, 4096).unwrap();
    let k2 = a.mem.alloc_fast_reg(PD, 4096).unwrap();
    let mut read = SendWr::new(
        1,
        WrOpcode::RdmaRead,
        vec![Sge {
            addr: kva,
            length: 64,
            lkey: sink,
        }],
    );
    read.remote_addr = sva;
    read.rkey = src;
    a.e.post_send(read).unwrap();
    a.e.post_send(reg_wr(2, k1, AccessFlags::LOCAL_WRITE))
        .unwrap();
    let mut fenced = reg_wr(3, k2, AccessFlags::LOCAL_WRITE);
    fenced.send_flags |= SendFlags::FENCE;
    a.e.post_send(fenced).unwrap();
    let req =
        a.e.poll_transmit(Instant::ZERO, &a.mem)
            .expect("READ request");
    assert!(a.e.run_local_ops(&mut a.mem));
    let state = |a: &Node, k| a.mem.get(k).unwrap().state();
    assert_eq!(
        state(&a, k1),
        softroce::transport::MrState::Valid,
        "not fenced"
    );
    assert_eq!(state(&a, k2), softroce::transport::MrState::Free, "fenced");
    let p = RocePacket::parse(&req.payload).unwrap();
    b.e.handle_packet(Instant::ZERO, &p, A_IP, &mut b.mem);
    drive(&mut a, &mut b);
    assert_eq!(state(&a, k2), softroce::transport::MrState::Valid);
    let got: Vec<_> = completions(&mut a).iter().map(|c| (c.1, c.3)).collect();
    assert_eq!(
        got,
        [
            (1, WcOpcode::RdmaRead),
            (2, WcOpcode::RegMr),
            (3, WcOpcode::RegMr)
        ]
    );
    // REG_MR of an MR that is not FREE fails.
    a.e.post_send(reg_wr(4, k2, AccessFlags::LOCAL_WRITE))
        .unwrap();
    a.e.post_send(SendWr::new(5, WrOpcode::Send, vec![]))
        .unwrap();
    drive(&mut a, &mut b);
    let got: Vec<_> = completions(&mut a).iter().map(|c| (c.1, c.2)).collect();
    assert_eq!(got, [(4, WcStatus::LocQpOpErr), (5, WcStatus::WrFlushErr)]);
    assert_eq!(a.e.state(), QpState::Err);
}

// ---------------------------------------------------------------------------------------------
// Simulator: the FRMR / SEND_WITH_INV cycle over a lossy, duplicating, reordering link
// ---------------------------------------------------------------------------------------------

fn sim_wait(sim: &mut softroce::net::sim::Sim, cq: &Cq) -> Wc {
    let end = sim.now() + Duration::from_secs(30);
    loop {
        if let Some(wc) = cq.poll_one() {
            return wc;
        }
        assert!(
            sim.now() <= end && sim.step(),
            "no completion in 30 s of virtual time"
        );
    }
}

/// For several seeds (swarm-tested faults: loss, duplication, reordering, bit flips, delay),
/// 12 rounds of: b registers its FRMR under a new key (REG_MR), a WRITEs a round-specific
/// pattern through it and SEND_WITH_INVs the key; b's receive reports the key invalidated and
/// the MR holds the pattern. Duplicated or retransmitted SEND_WITH_INVs are re-ACKed, never
/// executed twice (C9-105), so each round's REG_MR finds the MR FREE. Finally a WRITE with the
/// last key is IBV_WC_REM_ACCESS_ERR and leaves the MR unchanged. A failure prints the seed.
#[test]
fn sim_frmr_send_with_inv_cycle_under_faults() {
    use softroce::net::sim::{Sim, SimFaults};
    let mut faults = 0;
    for seed in [1u64, 2, 3, 5, 8, 13] {
        let mut sim = Sim::new(seed, SimFaults::from_seed(seed));
        let (ia, ib) = (
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)),
        );
        let (da, db) = (sim.add_device("simA", ia), sim.add_device("simB", ib));
        let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
        let (ca, cb) = (da.create_cq(64).unwrap(), db.create_cq(64).unwrap());
        let init = |cq| QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            cap: QpCap::default(),
            sq_sig_all: false,
            srq: None,
        };
        let (qa, qb) = (
            pa.create_qp(&init(&ca)).unwrap(),
            pb.create_qp(&init(&cb)).unwrap(),
        );
        for (me, peer, ip) in [(&qa, &qb, ib), (&qb, &qa, ia)] {
            let mut c = RcConnect::new(peer.qp_num(), Gid::from_ip(ip), 0x10, 0x10);
            c.timeout = 10;
            c.min_rnr_timer = 1;
            me.connect_rc(&c).unwrap();
        }
        let frmr = pb.alloc_mr(1).unwrap();
        let rbuf = pb.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        let src = pa.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let mut key = 0;
        for round in 0..12u8 {
            let w = frmr.reg_wr(100, round, 0x5000, 4096, AccessFlags::LOCAL_WRITE | rw());
            key = w.reg_mr.unwrap().key;
            qb.post_send(&[w]).unwrap();
            let wc = sim_wait(&mut sim, &cb);
            assert_eq!(
                (wc.status, wc.opcode),
                (WcStatus::Success, WcOpcode::RegMr),
                "SOFTROCE_SEED={seed}"
            );
            qb.post_recv(&[RecvWr {
                wr_id: u64::from(round),
                sg_list: vec![rbuf.sge(0, 64)],
            }])
            .unwrap();
            let data = pattern(3000, round);
            src.write(0, &data).unwrap();
            let mut wr = SendWr::new(1, WrOpcode::RdmaWrite, vec![src.sge(0, 3000)]);
            wr.remote_addr = 0x5000 + u64::from(round);
            wr.rkey = key;
            let mut inv = SendWr::new(2, WrOpcode::SendWithInv, vec![]);
            inv.invalidate_rkey = key;
            qa.post_send(&[wr, inv]).unwrap();
            for id in [1, 2] {
                let wc = sim_wait(&mut sim, &ca);
                assert_eq!(
                    (wc.wr_id, wc.status),
                    (id, WcStatus::Success),
                    "SOFTROCE_SEED={seed}"
                );
            }
            let r = sim_wait(&mut sim, &cb);
            assert_eq!(
                (r.wr_id, r.status, r.invalidated_rkey()),
                (u64::from(round), WcStatus::Success, Some(key)),
                "SOFTROCE_SEED={seed}"
            );
            let mut got = vec![0u8; 3000];
            frmr.read(usize::from(round), &mut got).unwrap();
            assert_eq!(got, data, "SOFTROCE_SEED={seed} round {round}");
        }
        // Watch b's answers: the WRITE with the dead key must draw NAK 0x62.
        let naks = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let seen = naks.clone();
        sim.set_filter(Some(Box::new(move |_, from, _, payload| {
            if from.ip() == ib
                && let Ok(p) = RocePacket::parse(payload)
                && p.repr.aeth.is_some_and(|a| a.syndrome == 0x62)
            {
                seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            true
        })));
        let snapshot = frmr.to_vec();
        let mut wr = SendWr::new(3, WrOpcode::RdmaWrite, vec![src.sge(0, 8)]);
        wr.remote_addr = 0x5000;
        wr.rkey = key;
        qa.post_send(&[wr]).unwrap();
        let wc = sim_wait(&mut sim, &ca);
        assert_eq!(frmr.to_vec(), snapshot, "SOFTROCE_SEED={seed}");
        assert_eq!(
            naks.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "SOFTROCE_SEED={seed}"
        );
        assert_eq!(qb.state(), QpState::Err, "SOFTROCE_SEED={seed}");
        // The NAK itself may be lost on this link; then a's retries meet a responder in ERR.
        assert!(
            matches!(wc.status, WcStatus::RemAccessErr | WcStatus::RetryExcErr),
            "SOFTROCE_SEED={seed}: {:?}",
            wc.status
        );
        let st = sim.stats();
        faults += st.lost + st.duplicated + st.reordered + st.corrupted;
    }
    assert!(faults > 20, "the seeds exercised the faults ({faults})");
}

/// The bytes of a SEND ONLY WITH INVALIDATE as rxe lays them out (rxe_hdr.h, IBTA ch. 9):
/// BTH (12 bytes, opcode 0x17, AckReq set), IETH (the R_Key, 4 bytes big-endian), payload,
/// ICRC (4 bytes).
#[test]
fn engine_send_with_inv_bytes() {
    let (mut a, _b) = engines(16);
    let sk = a.mem.register(PD, 4, AccessFlags::LOCAL_WRITE).unwrap();
    a.mem
        .get_mut(sk)
        .unwrap()
        .owned_bytes_mut()
        .unwrap()
        .copy_from_slice(b"data");
    let host = a.mem.get(sk).unwrap().host_addr();
    let mut s = SendWr::new(
        1,
        WrOpcode::SendWithInv,
        vec![Sge {
            addr: host,
            length: 4,
            lkey: sk,
        }],
    );
    s.invalidate_rkey = 0x0001_2345;
    a.e.post_send(s).unwrap();
    let t =
        a.e.poll_transmit(Instant::ZERO, &a.mem)
            .expect("one packet");
    let b = &t.payload;
    assert_eq!(b.len(), 12 + 4 + 4 + 4);
    assert_eq!(b[0], 0x17, "RC SEND ONLY WITH INVALIDATE");
    assert_eq!(b[8] & 0x80, 0x80, "AckReq");
    assert_eq!(&b[4..8], &[0, 0, 0, 0x12], "dest QPN");
    assert_eq!(&b[12..16], &0x0001_2345u32.to_be_bytes(), "IETH");
    assert_eq!(&b[16..20], b"data");
}

/// Which QP types take which new opcodes (rxe `rxe_wr_opcode_info`): LOCAL_INV, REG_MR and
/// SEND_WITH_INV on RC only, BIND_MW on RC and UC; refused with EOPNOTSUPP otherwise. A UC
/// QP executes a bind at once and completes it (UC WQEs complete when sent).
#[test]
fn engine_opcodes_by_qp_type() {
    use softroce::transport::PostError;
    for qp_type in [QpType::Uc, QpType::Ud] {
        let mut e = QpEngine::new(0x11, qp_type, PD, QpCap::default(), false);
        let path = Path {
            local: A_IP,
            remote: B_IP,
            src_port: 0xc000,
            ip: Default::default(),
        };
        if qp_type.is_datagram() {
            // A datagram QP's source is fixed at creation.
            e.set_path(path);
        }
        e.modify_to(QpState::Rts, &QpAttrs::default(), Some(path))
            .expect("RESET -> RTS");
        let mut mem = MemoryTable::new(1);
        let mr = mem
            .register(PD, 64, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)
            .unwrap();
        let va = mem.get(mr).unwrap().iova;
        let mw = mem.alloc_mw(PD, MwType::Type1).unwrap();
        let mut bind = SendWr::new(1, WrOpcode::BindMw, vec![]);
        bind.bind_mw = Some(softroce::transport::BindMw {
            mw_rkey: mw,
            rkey: softroce::transport::inc_rkey(mw),
            mr_lkey: mr,
            addr: va,
            length: 64,
            access: AccessFlags::REMOTE_READ,
        });
        for op in [WrOpcode::LocalInv, WrOpcode::RegMr, WrOpcode::SendWithInv] {
            let mut w = SendWr::new(9, op, vec![]);
            w.reg_mr = Some(softroce::transport::RegMr {
                mr_key: mr,
                key: mr,
                iova: 0,
                length: 0,
                access: AccessFlags::empty(),
            });
            assert_eq!(
                e.post_send(w),
                Err(PostError::NotSupported),
                "{qp_type:?} {op:?}"
            );
        }
        if qp_type == QpType::Ud {
            assert_eq!(e.post_send(bind), Err(PostError::NotSupported));
            continue;
        }
        e.post_send(bind).unwrap();
        assert!(e.run_local_ops(&mut mem));
        let c = e.poll_completion().expect("bind completes");
        assert_eq!(
            (c.wc.wr_id, c.wc.status, c.wc.opcode),
            (1, WcStatus::Success, WcOpcode::BindMw)
        );
        let w = softroce::transport::inc_rkey(mw);
        assert!(
            mem.check_remote(w, PD, 0x11, va, 64, AccessFlags::REMOTE_READ)
                .is_ok()
        );
    }
}

/// In the engine pair: windows of both types grant a peer's WRITE; unbinding (type 1) and
/// LOCAL_INV (type 2) revoke them: the next WRITE draws NAK 0x62 → IBV_WC_REM_ACCESS_ERR and
/// the target keeps its bytes.
#[test]
fn engine_mw_types_grant_and_revocation_revokes() {
    for mw_type in [MwType::Type1, MwType::Type2] {
        let (mut a, mut b) = engines(0);
        let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::MW_BIND;
        let mr = b.mem.register(PD, 256, all).unwrap();
        let va = b.mem.get(mr).unwrap().iova;
        let mw = b.mem.alloc_mw(PD, mw_type).unwrap();
        let rkey = softroce::transport::inc_rkey(mw);
        let bind_wr = |id, mw_rkey, rkey, length| {
            let mut w = SendWr::new(id, WrOpcode::BindMw, vec![]);
            w.bind_mw = Some(softroce::transport::BindMw {
                mw_rkey,
                rkey,
                mr_lkey: mr,
                addr: va + 128,
                length,
                access: AccessFlags::REMOTE_WRITE,
            });
            w
        };
        b.e.post_send(bind_wr(1, mw, rkey, 128)).unwrap();
        drive(&mut a, &mut b);
        assert_eq!(completions(&mut b)[0].3, WcOpcode::BindMw);
        let src = a.mem.register(PD, 8, AccessFlags::LOCAL_WRITE).unwrap();
        let sva = a.mem.get(src).unwrap().iova;
        a.mem
            .get_mut(src)
            .unwrap()
            .owned_bytes_mut()
            .unwrap()
            .copy_from_slice(b"windowed");
        let write = |id, rkey| {
            let mut w = SendWr::new(
                id,
                WrOpcode::RdmaWrite,
                vec![Sge {
                    addr: sva,
                    length: 8,
                    lkey: src,
                }],
            );
            w.remote_addr = va + 200;
            w.rkey = rkey;
            w
        };
        a.e.post_send(write(2, rkey)).unwrap();
        drive(&mut a, &mut b);
        assert_eq!(completions(&mut a)[0].2, WcStatus::Success, "{mw_type:?}");
        assert_eq!(
            &b.mem.get(mr).unwrap().owned_bytes().unwrap()[200..208],
            b"windowed"
        );
        b.mem.get_mut(mr).unwrap().owned_bytes_mut().unwrap()[200..208]
            .copy_from_slice(b"original");
        let revoke = match mw_type {
            MwType::Type1 => bind_wr(3, rkey, softroce::transport::inc_rkey(rkey), 0),
            MwType::Type2 => SendWr::local_inv(3, rkey),
        };
        b.e.post_send(revoke).unwrap();
        drive(&mut a, &mut b);
        assert_eq!(completions(&mut b)[0].2, WcStatus::Success);
        a.e.post_send(write(4, rkey)).unwrap();
        drive(&mut a, &mut b);
        assert_eq!(
            completions(&mut a)[0].2,
            WcStatus::RemAccessErr,
            "{mw_type:?}"
        );
        assert_eq!(
            &b.mem.get(mr).unwrap().owned_bytes().unwrap()[200..208],
            b"original"
        );
    }
}
