//! Many QPs on one device share the device's one driver thread: 64 RC QP pairs between two
//! devices each WRITE 64 KiB at once (GSO batches per QP source port), every byte arrives,
//! and the process has the same number of threads with 64 QPs as with one.
//! Its own test binary, so no other test's threads are counted. Addresses 127.0.26.x.

mod support;

use softroce::net::UdpOptions;
use softroce::verbs::{Gid, PathMtu, QpCap, QpInitAttr, QpType, RcConnect, SendWr, WrOpcode};
use std::net::{IpAddr, Ipv4Addr};
use support::{mr, pattern, side, wait_one};

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

#[test]
fn sixty_four_qps_share_one_driver_thread_per_device() {
    const QPS: usize = 64;
    const LEN: usize = 64 << 10;
    let ip = |h| IpAddr::V4(Ipv4Addr::new(127, 0, 26, h));
    let a = side(ip(1), &UdpOptions::default()).expect("device a");
    let b = side(ip(2), &UdpOptions::default()).expect("device b");
    let before = threads();
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        ..QpCap::default()
    };
    let mk = |s: &support::Side| {
        s.pd.create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &s.cq,
            recv_cq: &s.cq,
            cap,
            sq_sig_all: false,
            srq: None,
        })
        .expect("create_qp")
    };
    let pairs: Vec<_> = (0..QPS).map(|_| (mk(&a), mk(&b))).collect();
    for (qa, qb) in &pairs {
        for (me, peer, peer_ip) in [(qa, qb, b.dev.ip()), (qb, qa, a.dev.ip())] {
            let mut c = RcConnect::new(peer.qp_num(), Gid::from_ip(peer_ip), 0, 0);
            c.path_mtu = PathMtu::Mtu4096;
            me.connect_rc(&c).expect("connect_rc");
        }
    }
    let src = mr(&a, QPS * LEN);
    let dst = mr(&b, QPS * LEN);
    let data = pattern(QPS * LEN, 5);
    src.write(0, &data).unwrap();
    for (i, (qa, _)) in pairs.iter().enumerate() {
        let mut w = SendWr::new(
            i as u64,
            WrOpcode::RdmaWrite,
            vec![src.sge(i * LEN, LEN as u32)],
        );
        w.remote_addr = dst.addr() + (i * LEN) as u64;
        w.rkey = dst.rkey();
        qa.post_send(&[w]).unwrap();
    }
    let mut done = [false; QPS];
    for _ in 0..QPS {
        let wc = wait_one(&a.cq);
        assert_eq!(wc.status, softroce::verbs::WcStatus::Success);
        done[wc.wr_id as usize] = true;
    }
    assert!(done.iter().all(|d| *d));
    assert!(dst.to_vec() == data, "some WRITE data differs");
    assert_eq!(threads(), before, "threads with {QPS} QP pairs");
    let c = b.dev.counters();
    assert_eq!(c.dropped_total(), 0, "{:?}", c.entries());
}
