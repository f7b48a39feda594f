//! RC over real UDP on loopback: two softroce devices in one process, each with its own
//! 127.x address and port 4791, move SEND/RECV, WRITE, WRITE_WITH_IMM and READ, and a wrong
//! rkey gives IBV_WC_REM_ACCESS_ERR. Every test uses its own pair of addresses.

use softroce::net::UdpDevice;
use softroce::verbs::{
    AccessFlags, AhAttr, Cq, Gid, Mr, PathMtu, Pd, Qp, QpAttr, QpAttrMask as M, QpCap, QpInitAttr,
    QpState, QpType, RecvWr, SendFlags, SendWr, Wc, WcFlags, WcOpcode, WcStatus, WrOpcode,
};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

struct Side {
    dev: UdpDevice,
    pd: Pd,
    cq: Cq,
    qp: Qp,
}

fn side(ip: Ipv4Addr) -> Side {
    let dev = UdpDevice::open("softroce_test", IpAddr::V4(ip)).expect("open device");
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4096).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            cap: QpCap {
                max_send_wr: 512,
                max_recv_wr: 512,
                ..QpCap::default()
            },
            sq_sig_all: false,
            srq: None,
        })
        .unwrap();
    Side { dev, pd, cq, qp }
}

fn connect(a: &Side, b: &Side, mtu: PathMtu) {
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    for (me, peer, my_psn, peer_psn) in [(a, b, 0x00ff_fff0u32, 0x100), (b, a, 0x100, 0x00ff_fff0)]
    {
        let init = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: all,
            ..QpAttr::default()
        };
        me.qp
            .modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
            .unwrap();
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: mtu,
            dest_qp_num: peer.qp.qp_num(),
            rq_psn: peer_psn,
            max_dest_rd_atomic: 4,
            min_rnr_timer: 1,
            ah_attr: AhAttr::roce_v2(Gid::from_ip(peer.dev.ip())),
            ..QpAttr::default()
        };
        me.qp
            .modify(
                &rtr,
                M::STATE
                    | M::AV
                    | M::PATH_MTU
                    | M::DEST_QPN
                    | M::RQ_PSN
                    | M::MAX_DEST_RD_ATOMIC
                    | M::MIN_RNR_TIMER,
            )
            .unwrap();
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: my_psn,
            timeout: 12,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 4,
            ..QpAttr::default()
        };
        me.qp
            .modify(
                &rts,
                M::STATE
                    | M::SQ_PSN
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC,
            )
            .unwrap();
    }
}

fn pair(n: u8, mtu: PathMtu) -> (Side, Side) {
    let a = side(Ipv4Addr::new(127, 0, 10 + n, 1));
    let b = side(Ipv4Addr::new(127, 0, 10 + n, 2));
    connect(&a, &b, mtu);
    (a, b)
}

fn wait_one(cq: &Cq) -> Wc {
    let mut wc = [Wc::default()];
    let n = cq.wait(&mut wc, Duration::from_secs(20));
    assert_eq!(n, 1, "no completion within 20 s");
    wc[0]
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

fn mr(s: &Side, len: usize) -> Mr {
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    s.pd.reg_mr(len.max(1), all).unwrap()
}

fn send_recv(n: u8, mtu: PathMtu) {
    let (a, b) = pair(n, mtu);
    for (i, len) in [0usize, 1, 4095, 1 << 20].into_iter().enumerate() {
        let src = mr(&a, len);
        let dst = mr(&b, len);
        let data = pattern(len, i as u8);
        src.write(0, &data).unwrap();
        b.qp.post_recv(&[RecvWr {
            wr_id: 100 + i as u64,
            sg_list: vec![dst.sge(0, len as u32)],
        }])
        .unwrap();
        let sg = if len == 0 {
            vec![]
        } else {
            vec![src.sge(0, len as u32)]
        };
        a.qp.post_send(&[SendWr::new(i as u64, WrOpcode::Send, sg)])
            .unwrap();
        let s = wait_one(&a.cq);
        assert_eq!(
            (s.status, s.wr_id, s.opcode),
            (WcStatus::Success, i as u64, WcOpcode::Send)
        );
        let r = wait_one(&b.cq);
        assert_eq!(
            (r.status, r.wr_id, r.opcode),
            (WcStatus::Success, 100 + i as u64, WcOpcode::Recv)
        );
        assert_eq!(r.byte_len as usize, len);
        assert_eq!(r.src_qp, a.qp.qp_num());
        assert_eq!(
            dst.to_vec()[..len],
            data[..],
            "SEND of {len} bytes at {mtu:?}"
        );
    }
    let c = a.dev.counters();
    assert_eq!(c.dropped_total(), 0, "{:?}", c.entries());
}

#[test]
fn send_recv_mtu_1024() {
    send_recv(0, PathMtu::Mtu1024);
}

#[test]
fn send_recv_mtu_4096() {
    send_recv(1, PathMtu::Mtu4096);
}

#[test]
fn write_and_write_with_imm() {
    for (n, mtu) in [(2u8, PathMtu::Mtu1024), (3, PathMtu::Mtu4096)] {
        let (a, b) = pair(n, mtu);
        for (i, len) in [0usize, 1, 4095, 70_000].into_iter().enumerate() {
            let src = mr(&a, len);
            let dst = mr(&b, len + 8);
            let data = pattern(len, 7 + i as u8);
            src.write(0, &data).unwrap();
            let sg = if len == 0 {
                vec![]
            } else {
                vec![src.sge(0, len as u32)]
            };
            // Plain WRITE: no receive consumed at the target.
            let mut w = SendWr::new(1, WrOpcode::RdmaWrite, sg.clone());
            w.remote_addr = dst.addr() + 8;
            w.rkey = dst.rkey();
            a.qp.post_send(&[w]).unwrap();
            let s = wait_one(&a.cq);
            assert_eq!(
                (s.status, s.opcode),
                (WcStatus::Success, WcOpcode::RdmaWrite)
            );
            assert_eq!(dst.to_vec()[8..8 + len], data[..]);
            // WRITE_WITH_IMM consumes a receive and carries the immediate in network order.
            b.qp.post_recv(&[RecvWr {
                wr_id: 77,
                sg_list: vec![],
            }])
            .unwrap();
            let mut w = SendWr::new(2, WrOpcode::RdmaWriteWithImm, sg);
            w.remote_addr = dst.addr();
            w.rkey = dst.rkey();
            w.imm_data = u32::to_be(0x1234_0000 + i as u32);
            a.qp.post_send(&[w]).unwrap();
            assert_eq!(wait_one(&a.cq).status, WcStatus::Success);
            let r = wait_one(&b.cq);
            assert_eq!(
                (r.status, r.opcode, r.wr_id),
                (WcStatus::Success, WcOpcode::RecvRdmaWithImm, 77)
            );
            assert!(r.wc_flags.contains(WcFlags::WITH_IMM));
            assert_eq!(u32::from_be(r.imm_data), 0x1234_0000 + i as u32);
            assert_eq!(r.byte_len as usize, len);
            assert_eq!(dst.to_vec()[..len], data[..]);
        }
    }
}

#[test]
fn read_one_mib() {
    for (n, mtu) in [(4u8, PathMtu::Mtu1024), (5, PathMtu::Mtu4096)] {
        let (a, b) = pair(n, mtu);
        let len = 1 << 20;
        let remote = mr(&b, len);
        let data = pattern(len, 42);
        remote.write(0, &data).unwrap();
        let local = mr(&a, len);
        let mut w = SendWr::new(9, WrOpcode::RdmaRead, vec![local.sge(0, len as u32)]);
        w.remote_addr = remote.addr();
        w.rkey = remote.rkey();
        a.qp.post_send(&[w]).unwrap();
        let s = wait_one(&a.cq);
        assert_eq!(
            (s.status, s.opcode, s.byte_len as usize),
            (WcStatus::Success, WcOpcode::RdmaRead, len)
        );
        assert!(local.to_vec() == data, "READ data differs at {mtu:?}");
    }
}

#[test]
fn wrong_rkey_is_remote_access_error() {
    let (a, b) = pair(6, PathMtu::Mtu1024);
    let dst = mr(&b, 64);
    let src = mr(&a, 64);
    let mut w = SendWr::new(5, WrOpcode::RdmaWrite, vec![src.sge(0, 64)]);
    w.remote_addr = dst.addr();
    w.rkey = dst.rkey() ^ 0x55;
    w.send_flags = SendFlags::SIGNALED;
    // A second WR behind it is flushed once the QP is in ERR.
    let mut w2 = w.clone();
    w2.wr_id = 6;
    w2.send_flags = SendFlags::empty();
    a.qp.post_send(&[w, w2]).unwrap();
    let e = wait_one(&a.cq);
    assert_eq!((e.status, e.wr_id), (WcStatus::RemAccessErr, 5));
    assert_eq!(e.status.to_string(), "remote access error");
    let f = wait_one(&a.cq);
    assert_eq!((f.status, f.wr_id), (WcStatus::WrFlushErr, 6));
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(
        b.qp.state(),
        QpState::Err,
        "the responder follows rxe into ERR"
    );
}

#[test]
fn read_past_the_mr_is_remote_access_error() {
    let (a, b) = pair(7, PathMtu::Mtu1024);
    let remote = mr(&b, 100);
    let local = mr(&a, 200);
    let mut w = SendWr::new(1, WrOpcode::RdmaRead, vec![local.sge(0, 200)]);
    w.remote_addr = remote.addr();
    w.rkey = remote.rkey();
    a.qp.post_send(&[w]).unwrap();
    assert_eq!(wait_one(&a.cq).status, WcStatus::RemAccessErr);
}
