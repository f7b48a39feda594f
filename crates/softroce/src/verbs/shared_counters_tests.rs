//! A device whose link shares its counters ([`Link::shared_counters`]): what the device
//! counts reaches its part of the shared counters as it counts (without a read of
//! [`Device::counters`] pushing it there), exactly once (a destroyed QP's counts are not
//! added again), and [`Device::counters`] is the shared total.

use super::{
    AccessFlags, Counters, Device, DeviceConfig, DropReason, Gid, Link, QpCap, QpInitAttr, QpType,
    RcConnect, RecvWr, SendWr, SharedCounters, WcStatus, WrOpcode,
};
use crate::net::ManualClock;
use crate::net::sim::RecordingLink;
use crate::transport::Transmit;
use parking_lot::Mutex;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

/// The shared counters of two processes: this device's part, and another process's.
struct TwoParts {
    mine: Mutex<[u64; Counters::LEN]>,
    other: Counters,
}

impl SharedCounters for TwoParts {
    fn add(&self, index: usize, n: u64) {
        self.mine.lock()[index] += n;
    }

    fn total(&self) -> Counters {
        let mut t = Counters::from_values(&self.mine.lock());
        t.add(&self.other);
        t
    }
}

/// Keeps what the device sends (to be fed back to it: its QPs talk to each other) and
/// shares its counters with [`TwoParts`].
struct Loopback {
    sent: RecordingLink,
    share: Arc<TwoParts>,
}

impl Link for Loopback {
    fn send(&self, t: &Transmit) -> std::io::Result<()> {
        self.sent.send(t)
    }

    fn shared_counters(&self) -> Option<Arc<dyn SharedCounters>> {
        Some(self.share.clone())
    }
}

const IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 7);

/// Feeds every datagram the device sent back to it until it sends no more.
fn deliver(dev: &Device, link: &Loopback) -> usize {
    let mut n = 0;
    loop {
        let sent = link.sent.take();
        if sent.is_empty() {
            return n;
        }
        for t in sent {
            dev.handle_datagram(SocketAddr::new(IpAddr::V4(IP), t.src_port), &t.payload);
            n += 1;
        }
    }
}

#[test]
fn a_device_adds_its_counts_to_its_part_once_and_reads_the_total() {
    let mut other = Counters {
        sent_pkts: 1000,
        ..Counters::default()
    };
    other.count_drop(DropReason::UnknownQp);
    let share = Arc::new(TwoParts {
        mine: Mutex::new([0; Counters::LEN]),
        other: other.clone(),
    });
    let link = Arc::new(Loopback {
        sent: RecordingLink::new(),
        share: share.clone(),
    });
    let dev = Device::new(
        DeviceConfig::new("softroce_share", IpAddr::V4(IP)),
        link.clone(),
        Arc::new(ManualClock::new()),
    );
    let mine = || Counters::from_values(&share.mine.lock());
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let init = QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: &cq,
        recv_cq: &cq,
        cap: QpCap::default(),
        sq_sig_all: true,
        srq: None,
    };
    let (qa, qb) = (pd.create_qp(&init).unwrap(), pd.create_qp(&init).unwrap());
    let gid = Gid::from_ip(IpAddr::V4(IP));
    qa.connect_rc(&RcConnect::new(qb.qp_num(), gid, 0, 0))
        .unwrap();
    qb.connect_rc(&RcConnect::new(qa.qp_num(), gid, 0, 0))
        .unwrap();
    let mr = pd
        .reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    let sends = 3;
    for i in 0..sends {
        let recv = RecvWr {
            wr_id: 100 + i,
            sg_list: vec![mr.sge(2048, 64)],
        };
        qb.post_recv(&[recv]).unwrap();
        qa.post_send(&[SendWr::new(i, WrOpcode::Send, vec![mr.sge(0, 64)])])
            .unwrap();
        // The SEND, then its ACK.
        assert_eq!(deliver(&dev, &link), 2);
    }
    let mut ok = 0;
    while let Some(wc) = cq.poll_one() {
        assert_eq!(wc.status, WcStatus::Success);
        ok += 1;
    }
    assert_eq!(ok, 2 * sends);
    // A datagram too short for a BTH: a drop of the device's own.
    dev.handle_datagram(SocketAddr::new(IpAddr::V4(IP), 1), b"short");

    // Everything counted is in the device's part already, with nothing read.
    let own = dev.process_counters();
    assert_eq!(mine(), own);
    assert_eq!(
        (own.sent_pkts, own.rcvd_pkts, own.rdma_sends, own.rdma_recvs),
        (2 * sends, 2 * sends, sends, sends)
    );
    assert_eq!(own.dropped(DropReason::Truncated), 1);
    let mut total = own.clone();
    total.add(&other);
    assert_eq!(dev.counters(), total, "the device's counters are the total");

    // A destroyed QP's counts stay in the part, once.
    drop(qa);
    assert_eq!(mine(), own);
    assert_eq!(dev.process_counters(), own);
    assert_eq!(dev.counters(), total);
    drop(qb);
    assert_eq!(dev.counters(), total);
}
