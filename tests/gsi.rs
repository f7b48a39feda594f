//! QP1, the GSI QP every device has, over real UDP on loopback (127.0.24.1 / 127.0.24.2; run
//! inside `unshare -n` beside other tests): a MAD sent from one device's QP1 to the other's
//! lands in a posted receive after the 40-byte GRH, with `src_qp` 1 and Q_Key 0x80010000 on
//! the wire; a UD QP reaches QP1 with that Q_Key and is dropped (BadQkey) with any other; a
//! datagram to QP1 with no receive posted is dropped and counted (UdNoReceive); the GSI rows
//! of the modify_qp table apply to QP1, and dropping its handle destroys nothing.

mod support;

use softroce::net::{UdpDevice, UdpOptions};
use softroce::transport::DropReason;
use softroce::verbs::{
    AccessFlags, DeviceConfig, GSI_QKEY, Mr, Pd, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState,
    QpType, RecvWr, SendWr, UdDest, WcFlags, WcStatus, WrOpcode,
};
use std::net::{IpAddr, Ipv4Addr};
use support::{eventually, wait_one};

const A: Ipv4Addr = Ipv4Addr::new(127, 0, 24, 1);
const B: Ipv4Addr = Ipv4Addr::new(127, 0, 24, 2);
const MAD: usize = 256;

/// A device with its port alone: these tests use QP1 for MADs of their own, which a shared
/// device gives to the process whose CM listener or connection they name
/// (`softroce::net::steer`).
fn open(ip: Ipv4Addr) -> UdpDevice {
    UdpDevice::open_with_options(
        DeviceConfig::new("softroce_gsi", IpAddr::V4(ip)),
        &UdpOptions {
            exclusive: true,
            ..UdpOptions::default()
        },
    )
    .expect("open device (run inside `unshare -n` with lo up)")
}

fn mr(pd: &Pd, len: usize) -> Mr {
    pd.reg_mr(len, AccessFlags::LOCAL_WRITE).expect("reg_mr")
}

fn mad(salt: u8) -> Vec<u8> {
    (0..MAD).map(|i| (i as u8) ^ salt).collect()
}

#[test]
fn qp1_receives_mads_with_the_gsi_qkey_only() {
    let (a, b) = (open(A), open(B));
    let (qa, qb) = (a.gsi_qp(), b.gsi_qp());
    assert_eq!((qa.qp_num(), qa.qp_type()), (1, QpType::Gsi));
    assert_eq!(qa.state(), QpState::Rts);

    // QP1 -> QP1: the receive gets GRH + MAD.
    let rbuf = mr(&b.gsi_pd(), 40 + MAD);
    qb.post_recv(&[RecvWr {
        wr_id: 11,
        sg_list: vec![rbuf.sge(0, (40 + MAD) as u32)],
    }])
    .unwrap();
    let sbuf = mr(&a.gsi_pd(), MAD);
    sbuf.write(0, &mad(0x5a)).unwrap();
    let mut wr = SendWr::new(21, WrOpcode::Send, vec![sbuf.sge(0, MAD as u32)]);
    // The WR's Q_Key does not matter on QP1: GSI_QKEY goes on the wire.
    wr.ud = Some(UdDest {
        remote_ip: IpAddr::V4(B),
        remote_qpn: 1,
        remote_qkey: 0x1234,
        ip: Default::default(),
    });
    qa.post_send(&[wr]).unwrap();
    let s = wait_one(&a.gsi_cq());
    assert_eq!((s.wr_id, s.status, s.qp_num), (21, WcStatus::Success, 1));
    let r = wait_one(&b.gsi_cq());
    assert_eq!((r.wr_id, r.status), (11, WcStatus::Success));
    assert_eq!((r.byte_len, r.src_qp, r.qp_num), ((40 + MAD) as u32, 1, 1));
    assert!(r.wc_flags.contains(WcFlags::GRH));
    let got = rbuf.to_vec();
    // IPv4 GRH: 20 zero bytes, then the IPv4 header from A to B.
    assert_eq!(&got[..20], &[0u8; 20]);
    assert_eq!(got[20] >> 4, 4);
    assert_eq!(&got[32..36], &A.octets());
    assert_eq!(&got[36..40], &B.octets());
    assert_eq!(&got[40..], &mad(0x5a)[..]);

    // No receive posted: dropped and counted.
    let before = qb.counters().dropped(DropReason::UdNoReceive);
    let mut wr = SendWr::new(22, WrOpcode::Send, vec![sbuf.sge(0, MAD as u32)]);
    wr.ud = Some(UdDest {
        remote_ip: IpAddr::V4(B),
        remote_qpn: 1,
        remote_qkey: GSI_QKEY,
        ip: Default::default(),
    });
    qa.post_send(&[wr]).unwrap();
    assert_eq!(wait_one(&a.gsi_cq()).status, WcStatus::Success);
    eventually("ud_no_receive on QP1", || {
        qb.counters().dropped(DropReason::UdNoReceive) == before + 1
    });

    // A UD QP reaches QP1 only with GSI_QKEY.
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(16).unwrap();
    let ud = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Ud,
            send_cq: &cq,
            recv_cq: &cq,
            cap: QpCap::default(),
            sq_sig_all: true,
            srq: None,
        })
        .unwrap();
    ud.ready_ud(0x1111, 0).unwrap();
    let ubuf = mr(&pd, MAD);
    ubuf.write(0, &mad(0x33)).unwrap();
    qb.post_recv(&[RecvWr {
        wr_id: 12,
        sg_list: vec![rbuf.sge(0, (40 + MAD) as u32)],
    }])
    .unwrap();
    let bad_before = qb.counters().dropped(DropReason::BadQkey);
    for (id, qkey) in [(31, 0x8001_0001u32), (32, GSI_QKEY)] {
        let mut wr = SendWr::new(id, WrOpcode::Send, vec![ubuf.sge(0, MAD as u32)]);
        wr.ud = Some(UdDest {
            remote_ip: IpAddr::V4(B),
            remote_qpn: 1,
            remote_qkey: qkey,
            ip: Default::default(),
        });
        // Both Q_Keys have bit 31 set, which in a UD WR means "the QP's own Q_Key" (the
        // controlled Q_Keys of IBTA): so set the QP's Q_Key to the one to send.
        ud.modify(
            &QpAttr {
                qp_state: QpState::Rts,
                qkey,
                ..QpAttr::default()
            },
            QpAttrMask::QKEY,
        )
        .unwrap();
        ud.post_send(&[wr]).unwrap();
        assert_eq!(wait_one(&cq).status, WcStatus::Success);
        if qkey != GSI_QKEY {
            eventually("bad_qkey on QP1", || {
                qb.counters().dropped(DropReason::BadQkey) == bad_before + 1
            });
        }
    }
    let r = wait_one(&b.gsi_cq());
    assert_eq!(
        (r.wr_id, r.status, r.src_qp),
        (12, WcStatus::Success, ud.qp_num())
    );
    assert_eq!(&rbuf.to_vec()[40..], &mad(0x33)[..]);
    assert_eq!(qb.counters().dropped(DropReason::BadQkey), bad_before + 1);

    // Dropping a handle destroys nothing; QP1 follows the GSI rows of the table.
    drop(qb);
    let qb = b.gsi_qp();
    assert_eq!(qb.state(), QpState::Rts);
    let to = |s: QpState| QpAttr {
        qp_state: s,
        qkey: GSI_QKEY,
        ..QpAttr::default()
    };
    qb.modify(&to(QpState::Err), QpAttrMask::STATE).unwrap();
    qb.modify(&to(QpState::Reset), QpAttrMask::STATE).unwrap();
    let e = qb
        .modify(
            &to(QpState::Init),
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::QKEY | QpAttrMask::PORT,
        )
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "modify_qp RESET->INIT: attribute PORT not allowed"
    );
    qb.modify(
        &to(QpState::Init),
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::QKEY,
    )
    .unwrap();
    qb.modify(&to(QpState::Rtr), QpAttrMask::STATE).unwrap();
    qb.modify(&to(QpState::Rts), QpAttrMask::STATE | QpAttrMask::SQ_PSN)
        .unwrap();
    assert_eq!(qb.state(), QpState::Rts);
}
