//! Shared receive queues, asynchronous events, SQ drain and completion channels: over real
//! UDP on loopback (127.0.20.x, two devices) and on the deterministic simulator for anything
//! that depends on timing.

use softroce::net::UdpDevice;
use softroce::net::sim::{Sim, SimFaults};
use softroce::verbs::{
    AccessFlags, AsyncEvent, Cq, Device, DropReason, ErrorKind, EventElement, EventType, Gid, Mr,
    Pd, Qp, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, RcConnect, RecvWr, SendFlags,
    SendWr, Srq, SrqAttr, SrqAttrMask, SrqInitAttr, Wc, WcOpcode, WcStatus, WrOpcode,
};
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::time::Duration;

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2));
const ALL: AccessFlags = AccessFlags(
    AccessFlags::LOCAL_WRITE.0
        | AccessFlags::REMOTE_WRITE.0
        | AccessFlags::REMOTE_READ.0
        | AccessFlags::REMOTE_ATOMIC.0,
);

fn qp(pd: &Pd, t: QpType, cq: &Cq, srq: Option<&Srq>) -> Qp {
    pd.create_qp(&QpInitAttr {
        qp_type: t,
        send_cq: cq,
        recv_cq: cq,
        cap: QpCap::default(),
        sq_sig_all: true,
        srq,
    })
    .unwrap()
}

fn connect(me: &Qp, peer: &Qp, peer_ip: IpAddr, rnr_retry: u8) {
    let mut c = RcConnect::new(peer.qp_num(), Gid::from_ip(peer_ip), 0x100, 0x100);
    c.timeout = 10;
    c.min_rnr_timer = 1;
    c.rnr_retry = rnr_retry;
    me.connect_rc(&c).unwrap();
}

fn recv_wr(id: u64, mr: &Mr, off: usize, len: u32) -> RecvWr {
    RecvWr {
        wr_id: id,
        sg_list: vec![mr.sge(off, len)],
    }
}

fn send(qp: &Qp, id: u64, mr: &Mr, len: u32, flags: SendFlags) {
    let mut w = SendWr::new(id, WrOpcode::Send, vec![mr.sge(0, len)]);
    w.send_flags = flags;
    qp.post_send(&[w]).unwrap();
}

/// Every pending async event of `dev`, PORT_ACTIVE of the device's opening left out.
fn events(dev: &Device) -> Vec<AsyncEvent> {
    std::iter::from_fn(|| dev.try_get_async_event())
        .filter(|e| e.event_type != EventType::PortActive)
        .collect()
}

fn readable(fd: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no timeout.
    let n = unsafe { libc::poll(&raw mut p, 1, 0) };
    n == 1 && p.revents & libc::POLLIN != 0
}

/// Simulated A (two RC QPs, or `n`) sending to B, whose QPs all use one SRQ.
struct SrqPair {
    sim: Sim,
    a: Device,
    b: Device,
    _pds: (Pd, Pd),
    ca: Cq,
    cb: Cq,
    qa: Vec<Qp>,
    qb: Vec<Qp>,
    srq: Srq,
    src: Mr,
    dst: Mr,
}

fn srq_pair(n: usize, qp_type: QpType, srq_attr: SrqInitAttr, rnr_retry: u8) -> SrqPair {
    let mut sim = Sim::new(7, SimFaults::NONE);
    let a = sim.add_device("simA", A);
    let b = sim.add_device("simB", B);
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
    let srq = pb.create_srq(&srq_attr).unwrap();
    let qa: Vec<Qp> = (0..n).map(|_| qp(&pa, qp_type, &ca, None)).collect();
    let qb: Vec<Qp> = (0..n).map(|_| qp(&pb, qp_type, &cb, Some(&srq))).collect();
    for (x, y) in qa.iter().zip(&qb) {
        if qp_type == QpType::Ud {
            x.ready_ud(0x1111_1111, 0x10).unwrap();
            y.ready_ud(0x1111_1111, 0x20).unwrap();
        } else {
            connect(x, y, B, rnr_retry);
            connect(y, x, A, rnr_retry);
        }
    }
    let src = pa.reg_mr(1 << 16, ALL).unwrap();
    let dst = pb.reg_mr(1 << 16, ALL).unwrap();
    SrqPair {
        sim,
        a,
        b,
        _pds: (pa, pb),
        ca,
        cb,
        qa,
        qb,
        srq,
        src,
        dst,
    }
}

impl SrqPair {
    /// Posts `n` receives of `len` bytes at offset 0 of the destination MR (wr_id 0..n) on
    /// the SRQ.
    fn post_srq_recvs(&self, n: u64, len: u32) {
        let wrs: Vec<RecvWr> = (0..n).map(|i| recv_wr(i, &self.dst, 0, len)).collect();
        self.srq.post_recv(&wrs).unwrap();
    }
    fn settle(&mut self) {
        self.sim.run_until(Duration::from_millis(50), || false);
    }
    fn drain(cq: &Cq) -> Vec<Wc> {
        std::iter::from_fn(|| cq.poll_one()).collect()
    }
}

fn attr(max_wr: u32, max_sge: u32, srq_limit: u32) -> SrqInitAttr {
    SrqInitAttr {
        max_wr,
        max_sge,
        srq_limit,
    }
}

#[test]
fn two_rc_qps_share_one_srq_over_udp_loopback() {
    let ip_a: IpAddr = "127.0.20.1".parse().unwrap();
    let ip_b: IpAddr = "127.0.20.2".parse().unwrap();
    let da = UdpDevice::open("srqA", ip_a).unwrap();
    let db = UdpDevice::open("srqB", ip_b).unwrap();
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    let (ca, cb) = (da.create_cq(64).unwrap(), db.create_cq(64).unwrap());
    let srq = pb.create_srq(&attr(16, 1, 0)).unwrap();
    let qa = [
        qp(&pa, QpType::Rc, &ca, None),
        qp(&pa, QpType::Rc, &ca, None),
    ];
    let qb = [
        qp(&pb, QpType::Rc, &cb, Some(&srq)),
        qp(&pb, QpType::Rc, &cb, Some(&srq)),
    ];
    for (x, y) in qa.iter().zip(&qb) {
        connect(x, y, ip_b, 7);
        connect(y, x, ip_a, 7);
    }
    let src = pa.reg_mr(4096, ALL).unwrap();
    let dst = pb.reg_mr(4 * 4096, ALL).unwrap();
    let wrs: Vec<RecvWr> = (0..4)
        .map(|i| recv_wr(100 + i as u64, &dst, i * 4096, 4096))
        .collect();
    srq.post_recv(&wrs).unwrap();
    // A QP on an SRQ has no receive queue of its own.
    let e = qb[0].post_recv(&wrs[..1]).unwrap_err();
    assert_eq!((e.kind(), e.bad_wr()), (ErrorKind::Inval, Some(0)));
    // Messages alternate between the two QPs; each takes the SRQ's head WR in turn.
    let order = [0usize, 1, 1, 0];
    let mut got = Vec::new();
    for (k, &i) in order.iter().enumerate() {
        let data: Vec<u8> = (0..3000).map(|j| (j as u8) ^ (k as u8 * 17)).collect();
        src.write(0, &data).unwrap();
        send(&qa[i], k as u64, &src, 3000, SendFlags::SIGNALED);
        let mut wc = [Wc::default()];
        assert_eq!(ca.wait(&mut wc, Duration::from_secs(10)), 1);
        assert_eq!((wc[0].status, wc[0].wr_id), (WcStatus::Success, k as u64));
        assert_eq!(cb.wait(&mut wc, Duration::from_secs(10)), 1);
        let r = wc[0];
        assert_eq!(r.status, WcStatus::Success);
        assert_eq!(r.opcode, WcOpcode::Recv);
        assert_eq!(r.wr_id, 100 + k as u64, "SRQ WRs are consumed in order");
        assert_eq!(
            r.qp_num,
            qb[i].qp_num(),
            "the WC names the QP that received"
        );
        assert_eq!(r.src_qp, qa[i].qp_num());
        assert_eq!(r.byte_len, 3000);
        let mut landed = vec![0u8; 3000];
        dst.read(k * 4096, &mut landed).unwrap();
        assert_eq!(landed, data);
        got.push(r.qp_num);
    }
    assert!(srq.is_empty());
    assert_eq!(
        got,
        vec![
            qb[0].qp_num(),
            qb[1].qp_num(),
            qb[1].qp_num(),
            qb[0].qp_num()
        ]
    );
}

#[test]
fn create_post_modify_query_and_destroy_check_their_arguments() {
    let mut sim = Sim::new(1, SimFaults::NONE);
    let b = sim.add_device("simB", B);
    let pd = b.alloc_pd().unwrap();
    let cap = b.query_device();
    assert_eq!(
        (cap.max_srq, cap.max_srq_wr, cap.max_srq_sge),
        (65536, 16384, 32)
    );
    for bad in [
        attr(0, 1, 0),
        attr(cap.max_srq_wr + 1, 1, 0),
        attr(4, cap.max_srq_sge + 1, 0),
        attr(4, 1, 5),
    ] {
        assert_eq!(pd.create_srq(&bad).unwrap_err().kind(), ErrorKind::Inval);
    }
    let mut srq = pd.create_srq(&attr(4, 2, 0)).unwrap();
    let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    // Too many SGEs: EINVAL at that WR; the ones before it are posted.
    let three = RecvWr {
        wr_id: 9,
        sg_list: vec![mr.sge(0, 8); 3],
    };
    let e = srq.post_recv(&[recv_wr(1, &mr, 0, 8), three]).unwrap_err();
    assert_eq!((e.kind(), e.bad_wr()), (ErrorKind::Inval, Some(1)));
    assert_eq!(srq.len(), 1);
    // Full: ENOMEM at the fifth.
    let wrs: Vec<RecvWr> = (2..6).map(|i| recv_wr(i, &mr, 0, 8)).collect();
    let e = srq.post_recv(&wrs).unwrap_err();
    assert_eq!((e.kind(), e.bad_wr()), (ErrorKind::NoMem, Some(3)));
    assert_eq!(srq.len(), 4);
    // Limit above max_wr, resize below the WRs queued: EINVAL, nothing changes.
    let lim = |l| SrqAttr {
        srq_limit: l,
        ..SrqAttr::default()
    };
    assert_eq!(
        srq.modify(&lim(5), SrqAttrMask::LIMIT).unwrap_err().kind(),
        ErrorKind::Inval
    );
    let size = |n| SrqAttr {
        max_wr: n,
        ..SrqAttr::default()
    };
    assert_eq!(
        srq.modify(&size(3), SrqAttrMask::MAX_WR)
            .unwrap_err()
            .kind(),
        ErrorKind::Inval
    );
    srq.modify(&size(8), SrqAttrMask::MAX_WR).unwrap();
    srq.modify(&lim(2), SrqAttrMask::LIMIT).unwrap();
    assert_eq!(
        srq.query().unwrap(),
        SrqAttr {
            max_wr: 8,
            max_sge: 2,
            srq_limit: 2
        }
    );
    assert_eq!(
        srq.modify(&size(1), SrqAttrMask::MAX_WR)
            .unwrap_err()
            .kind(),
        ErrorKind::Inval,
        "below the armed limit"
    );
    // Destroy while a QP uses it: EBUSY; after the QP is gone: fine.
    let cq = b.create_cq(8).unwrap();
    let q = qp(&pd, QpType::Rc, &cq, Some(&srq));
    assert_eq!(srq.destroy().unwrap_err().kind(), ErrorKind::Busy);
    assert_eq!(srq.len(), 4);
    drop(q);
    srq.destroy().unwrap();
    assert_eq!(srq.query().unwrap_err().kind(), ErrorKind::NoEnt);
    assert_eq!(srq.destroy().unwrap_err().kind(), ErrorKind::NoEnt);
}

#[test]
fn the_limit_event_fires_once_when_fewer_than_the_limit_are_left() {
    let mut p = srq_pair(2, QpType::Rc, attr(8, 1, 0), 7);
    p.post_srq_recvs(6, 64);
    p.srq
        .modify(
            &SrqAttr {
                srq_limit: 3,
                ..SrqAttr::default()
            },
            SrqAttrMask::LIMIT,
        )
        .unwrap();
    assert!(events(&p.b).is_empty());
    let srq_num = p.srq.srq_num();
    let mut fired_at = Vec::new();
    for k in 0..6 {
        send(&p.qa[k % 2], k as u64, &p.src, 64, SendFlags::SIGNALED);
        p.settle();
        assert_eq!(SrqPair::drain(&p.cb).len(), 1);
        for e in events(&p.b) {
            assert_eq!(
                e,
                AsyncEvent {
                    event_type: EventType::SrqLimitReached,
                    element: EventElement::Srq(srq_num)
                }
            );
            fired_at.push(p.srq.len());
        }
    }
    // 6 WRs, limit 3: after the 4th receive 2 are left (< 3); then the limit is disarmed.
    assert_eq!(fired_at, vec![2]);
    assert_eq!(p.srq.query().unwrap().srq_limit, 0);
}

#[test]
fn rc_on_an_empty_srq_draws_rnr_naks_then_completes_once_a_wr_is_posted() {
    let mut p = srq_pair(1, QpType::Rc, attr(4, 1, 0), 7);
    p.src.write(0, b"hello srq").unwrap();
    send(&p.qa[0], 1, &p.src, 9, SendFlags::SIGNALED);
    p.sim.run_until(Duration::from_millis(5), || false);
    assert!(p.ca.poll_one().is_none() && p.cb.poll_one().is_none());
    let rnr_sent = p.qb[0].counters().send_rnr_err;
    assert!(rnr_sent >= 1, "RNR NAKs sent: {rnr_sent}");
    assert!(p.qa[0].counters().rcvd_rnr_err >= 1);
    p.srq.post_recv(&[recv_wr(77, &p.dst, 128, 64)]).unwrap();
    p.settle();
    let s = p.ca.poll_one().unwrap();
    assert_eq!((s.status, s.wr_id), (WcStatus::Success, 1));
    let r = p.cb.poll_one().unwrap();
    assert_eq!((r.status, r.wr_id, r.byte_len), (WcStatus::Success, 77, 9));
    let mut got = [0u8; 9];
    p.dst.read(128, &mut got).unwrap();
    assert_eq!(&got, b"hello srq");
    assert!(events(&p.a).is_empty() && events(&p.b).is_empty());
}

#[test]
fn rnr_retry_exhausted_on_an_empty_srq_is_qp_fatal_on_the_requester() {
    let mut p = srq_pair(1, QpType::Rc, attr(4, 1, 0), 0);
    send(&p.qa[0], 1, &p.src, 9, SendFlags::SIGNALED);
    p.settle();
    let s = p.ca.poll_one().unwrap();
    assert_eq!(s.status, WcStatus::RnrRetryExcErr);
    assert_eq!(p.qa[0].state(), QpState::Err);
    assert_eq!(
        events(&p.a),
        vec![AsyncEvent {
            event_type: EventType::QpFatal,
            element: EventElement::Qp(p.qa[0].qp_num())
        }]
    );
    // The responder's QP is unaffected: no event there.
    assert!(events(&p.b).is_empty());
}

#[test]
fn modify_to_err_raises_last_wqe_reached_and_leaves_the_srq_wrs_alone() {
    let mut p = srq_pair(2, QpType::Rc, attr(8, 1, 0), 7);
    p.post_srq_recvs(3, 64);
    p.qb[0]
        .modify(
            &QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
    assert_eq!(
        events(&p.b),
        vec![AsyncEvent {
            event_type: EventType::QpLastWqeReached,
            element: EventElement::Qp(p.qb[0].qp_num())
        }],
        "by modify: LAST_WQE_REACHED, not QP_FATAL"
    );
    // Nothing flushed: the WRs belong to the SRQ, and the other QP still receives.
    assert!(p.cb.poll_one().is_none());
    assert_eq!(p.srq.len(), 3);
    send(&p.qa[1], 5, &p.src, 64, SendFlags::SIGNALED);
    p.settle();
    let r = p.cb.poll_one().unwrap();
    assert_eq!(
        (r.status, r.wr_id, r.qp_num),
        (WcStatus::Success, 0, p.qb[1].qp_num())
    );
    assert_eq!(p.srq.len(), 2);
}

#[test]
fn a_send_too_long_for_the_srq_wr_is_fatal_with_last_wqe_reached() {
    let mut p = srq_pair(1, QpType::Rc, attr(8, 1, 0), 7);
    p.srq
        .post_recv(&[recv_wr(1, &p.dst, 0, 16), recv_wr(2, &p.dst, 0, 64)])
        .unwrap();
    send(&p.qa[0], 1, &p.src, 64, SendFlags::SIGNALED);
    p.settle();
    // The responder completes the WR it took with LOC_LEN_ERR and enters ERR (rxe class C).
    let r = p.cb.poll_one().unwrap();
    assert_eq!((r.status, r.wr_id), (WcStatus::LocLenErr, 1));
    assert!(
        p.cb.poll_one().is_none(),
        "the SRQ's other WR is not flushed"
    );
    assert_eq!(p.srq.len(), 1);
    let qpn = p.qb[0].qp_num();
    assert_eq!(
        events(&p.b),
        vec![
            AsyncEvent {
                event_type: EventType::QpFatal,
                element: EventElement::Qp(qpn)
            },
            AsyncEvent {
                event_type: EventType::QpLastWqeReached,
                element: EventElement::Qp(qpn)
            },
        ]
    );
}

#[test]
fn ud_and_uc_qps_take_their_receives_from_the_srq() {
    for t in [QpType::Ud, QpType::Uc] {
        let mut p = srq_pair(2, t, attr(8, 1, 0), 7);
        // Empty SRQ: dropped (and counted), never an RNR NAK.
        let mut w = SendWr::new(1, WrOpcode::Send, vec![p.src.sge(0, 32)]);
        if t == QpType::Ud {
            let ah = p
                ._pds
                .0
                .create_ah(&softroce::verbs::AhAttr::roce_v2(Gid::from_ip(B)))
                .unwrap();
            w.ud = Some(ah.dest(p.qb[1].qp_num(), 0x1111_1111));
        }
        p.qa[1].post_send(std::slice::from_ref(&w)).unwrap();
        p.settle();
        assert_eq!(p.ca.poll_one().map(|c| c.status), Some(WcStatus::Success));
        assert!(p.cb.poll_one().is_none());
        let c = p.qb[1].counters();
        let reason = if t == QpType::Ud {
            DropReason::UdNoReceive
        } else {
            DropReason::UcMessageDropped
        };
        assert_eq!(c.dropped(reason), 1, "{t:?}");
        assert_eq!(c.send_rnr_err, 0);
        p.srq.post_recv(&[recv_wr(9, &p.dst, 0, 128)]).unwrap();
        w.wr_id = 2;
        p.qa[1].post_send(&[w]).unwrap();
        p.settle();
        assert_eq!(p.ca.poll_one().map(|c| c.wr_id), Some(2));
        let r = p.cb.poll_one().unwrap();
        let want_len = if t == QpType::Ud { 40 + 32 } else { 32 };
        assert_eq!(
            (r.status, r.wr_id, r.qp_num, r.byte_len),
            (WcStatus::Success, 9, p.qb[1].qp_num(), want_len),
            "{t:?}"
        );
        assert!(p.srq.is_empty());
    }
}

#[test]
fn the_device_raises_port_active_once_and_its_fd_is_readable_while_events_wait() {
    let mut sim = Sim::new(1, SimFaults::NONE);
    let b = sim.add_device("simB", B);
    let fd = b.as_raw_fd();
    assert!(fd >= 0);
    assert!(readable(fd));
    assert_eq!(
        b.try_get_async_event(),
        Some(AsyncEvent {
            event_type: EventType::PortActive,
            element: EventElement::Port(1)
        })
    );
    assert!(!readable(fd));
    assert_eq!(
        b.get_async_event(Duration::from_millis(1))
            .unwrap_err()
            .kind(),
        ErrorKind::Again
    );
    // A QP on an SRQ moved to ERR makes the fd readable again.
    let pd = b.alloc_pd().unwrap();
    let cq = b.create_cq(4).unwrap();
    let srq = pd.create_srq(&attr(4, 1, 0)).unwrap();
    let q = qp(&pd, QpType::Ud, &cq, Some(&srq));
    q.ready_ud(1, 0).unwrap();
    q.modify(
        &QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        },
        QpAttrMask::STATE,
    )
    .unwrap();
    assert!(readable(fd));
    assert_eq!(
        b.get_async_event(Duration::from_millis(1))
            .unwrap()
            .event_type,
        EventType::QpLastWqeReached
    );
    assert!(!readable(fd));
}

fn to_state(q: &Qp, s: QpState) {
    q.modify(
        &QpAttr {
            qp_state: s,
            ..QpAttr::default()
        },
        QpAttrMask::STATE,
    )
    .unwrap();
}

#[test]
fn sqd_finishes_the_wrs_in_flight_raises_sq_drained_once_and_starts_nothing_new() {
    let mut p = srq_pair(1, QpType::Rc, attr(16, 1, 0), 7);
    let wrs: Vec<RecvWr> = (0..4)
        .map(|i| recv_wr(i, &p.dst, i as usize * 8192, 8192))
        .collect();
    p.srq.post_recv(&wrs).unwrap();
    // Three 5000-byte SENDs (5 packets each at MTU 1024) leave at post time and are in flight.
    for k in 0..3 {
        send(&p.qa[0], k, &p.src, 5000, SendFlags::SIGNALED);
    }
    to_state(&p.qa[0], QpState::Sqd);
    assert_eq!(p.qa[0].state(), QpState::Sqd);
    assert!(events(&p.a).is_empty(), "not drained while ACKs are due");
    // Posting in SQD is allowed; the WR does not start.
    send(&p.qa[0], 3, &p.src, 100, SendFlags::SIGNALED);
    p.settle();
    let done: Vec<u64> = SrqPair::drain(&p.ca).iter().map(|w| w.wr_id).collect();
    assert_eq!(done, vec![0, 1, 2]);
    assert_eq!(SrqPair::drain(&p.cb).len(), 3);
    assert_eq!(
        events(&p.a),
        vec![AsyncEvent {
            event_type: EventType::SqDrained,
            element: EventElement::Qp(p.qa[0].qp_num())
        }]
    );
    p.settle();
    assert!(events(&p.a).is_empty(), "raised once");
    assert_eq!(p.srq.len(), 1, "the WR posted in SQD was not sent");
    // SQD -> RTS resumes.
    to_state(&p.qa[0], QpState::Rts);
    p.settle();
    assert_eq!(
        SrqPair::drain(&p.ca)
            .iter()
            .map(|w| w.wr_id)
            .collect::<Vec<_>>(),
        vec![3]
    );
    assert_eq!(SrqPair::drain(&p.cb).len(), 1);
    assert!(events(&p.a).is_empty());
}

#[test]
fn sqd_with_an_empty_send_queue_drains_at_once() {
    let mut p = srq_pair(1, QpType::Rc, attr(4, 1, 0), 7);
    to_state(&p.qa[0], QpState::Sqd);
    p.settle();
    assert_eq!(
        events(&p.a),
        vec![AsyncEvent {
            event_type: EventType::SqDrained,
            element: EventElement::Qp(p.qa[0].qp_num())
        }]
    );
}

#[test]
fn solicited_only_notification_ignores_unsolicited_sends() {
    let mut sim = Sim::new(5, SimFaults::NONE);
    let a = sim.add_device("simA", A);
    let b = sim.add_device("simB", B);
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let ch = b.create_comp_channel().unwrap();
    let ca = a.create_cq(16).unwrap();
    let cb = b.create_cq_with_channel(16, &ch).unwrap();
    let qa = qp(&pa, QpType::Rc, &ca, None);
    let qb = qp(&pb, QpType::Rc, &cb, None);
    connect(&qa, &qb, B, 7);
    connect(&qb, &qa, A, 7);
    let src = pa.reg_mr(64, ALL).unwrap();
    let dst = pb.reg_mr(64, ALL).unwrap();
    qb.post_recv(&(0..3).map(|i| recv_wr(i, &dst, 0, 64)).collect::<Vec<_>>())
        .unwrap();
    // A CQ without a channel cannot be armed.
    assert_eq!(ca.req_notify(false).unwrap_err().kind(), ErrorKind::Inval);
    cb.req_notify(true).unwrap();
    send(&qa, 1, &src, 8, SendFlags::SIGNALED);
    sim.run_until(Duration::from_millis(10), || false);
    assert_eq!(cb.poll_one().map(|w| w.wr_id), Some(0));
    assert!(
        ch.try_get_cq_event().is_none(),
        "an unsolicited SEND is no event"
    );
    assert!(!readable(ch.as_raw_fd()));
    send(&qa, 2, &src, 8, SendFlags::SIGNALED | SendFlags::SOLICITED);
    sim.run_until(Duration::from_millis(10), || false);
    assert!(readable(ch.as_raw_fd()));
    let got = ch.try_get_cq_event().expect("a solicited SEND is an event");
    assert!(got.same_cq(&cb));
    assert_eq!(cb.unacked_events(), 1);
    ch.ack_cq_events(&cb, 1).unwrap();
    assert_eq!(
        ch.ack_cq_events(&cb, 1).unwrap_err().kind(),
        ErrorKind::Inval
    );
    assert_eq!(cb.poll_one().map(|w| w.wr_id), Some(1));
    // Disarmed after one event: the next completion is no event until re-armed.
    send(&qa, 3, &src, 8, SendFlags::SIGNALED | SendFlags::SOLICITED);
    sim.run_until(Duration::from_millis(10), || false);
    assert!(ch.try_get_cq_event().is_none());
    assert_eq!(cb.poll_one().map(|w| w.wr_id), Some(2));
    // Armed solicited-only, an error completion fires too (a flush on ERR).
    qb.post_recv(&[recv_wr(9, &dst, 0, 64)]).unwrap();
    cb.req_notify(true).unwrap();
    to_state(&qb, QpState::Err);
    assert_eq!(
        cb.poll_one().map(|w| (w.wr_id, w.status)),
        Some((9, WcStatus::WrFlushErr))
    );
    assert!(
        ch.try_get_cq_event().is_some(),
        "an error completion is an event"
    );
}

#[test]
fn the_solicited_bit_is_on_the_last_packet_only() {
    let mut sim = Sim::new(6, SimFaults::NONE);
    let a = sim.add_device("simA", A);
    let b = sim.add_device("simB", B);
    let log = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let l = log.clone();
    sim.set_filter(Some(Box::new(move |_, _, _, bytes| {
        if let Ok(p) = softroce::wire::RocePacket::parse(bytes) {
            l.lock().push((p.repr.bth.opcode, p.repr.bth.se));
        }
        true
    })));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
    let qa = qp(&pa, QpType::Rc, &ca, None);
    let qb = qp(&pb, QpType::Rc, &cb, None);
    connect(&qa, &qb, B, 7);
    connect(&qb, &qa, A, 7);
    let src = pa.reg_mr(4096, ALL).unwrap();
    let dst = pb.reg_mr(4096, ALL).unwrap();
    qb.post_recv(&[recv_wr(0, &dst, 0, 4096)]).unwrap();
    send(
        &qa,
        1,
        &src,
        2500,
        SendFlags::SIGNALED | SendFlags::SOLICITED,
    );
    sim.run_until(Duration::from_millis(10), || false);
    use softroce::wire::Opcode;
    let reqs: Vec<(Opcode, bool)> = log
        .lock()
        .iter()
        .copied()
        .filter(|(o, _)| *o != Opcode::RC_ACKNOWLEDGE)
        .collect();
    assert_eq!(
        reqs,
        vec![
            (Opcode::RC_SEND_FIRST, false),
            (Opcode::RC_SEND_MIDDLE, false),
            (Opcode::RC_SEND_LAST, true)
        ]
    );
}

#[test]
fn a_completion_channel_wakes_a_thread_blocked_in_get_cq_event() {
    let ip_a: IpAddr = "127.0.20.3".parse().unwrap();
    let ip_b: IpAddr = "127.0.20.4".parse().unwrap();
    let da = UdpDevice::open("chA", ip_a).unwrap();
    let db = UdpDevice::open("chB", ip_b).unwrap();
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    let ch = db.create_comp_channel().unwrap();
    let ca = da.create_cq(16).unwrap();
    let cb = db.create_cq_with_channel(16, &ch).unwrap();
    let srq = pb.create_srq(&attr(4, 1, 0)).unwrap();
    let qa = qp(&pa, QpType::Rc, &ca, None);
    let qb = qp(&pb, QpType::Rc, &cb, Some(&srq));
    connect(&qa, &qb, ip_b, 7);
    connect(&qb, &qa, ip_a, 7);
    let src = pa.reg_mr(64, ALL).unwrap();
    let dst = pb.reg_mr(64, ALL).unwrap();
    srq.post_recv(&[recv_wr(5, &dst, 0, 64)]).unwrap();
    cb.req_notify(false).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = {
        let ch = ch.clone();
        std::thread::spawn(move || {
            tx.send(()).unwrap();
            let cq = ch.get_cq_event(Duration::from_secs(20)).unwrap();
            let wc = cq.poll_one();
            ch.ack_cq_events(&cq, 1).unwrap();
            wc
        })
    };
    rx.recv().unwrap();
    send(&qa, 1, &src, 16, SendFlags::SIGNALED);
    let wc = waiter
        .join()
        .unwrap()
        .expect("a completion after the event");
    assert_eq!(
        (wc.status, wc.wr_id, wc.qp_num),
        (WcStatus::Success, 5, qb.qp_num())
    );
    assert_eq!(cb.unacked_events(), 0);
}

#[test]
fn write_with_imm_takes_an_srq_wr_and_plain_write_takes_none() {
    let mut p = srq_pair(1, QpType::Rc, attr(4, 1, 0), 7);
    p.srq
        .post_recv(&[recv_wr(1, &p.dst, 0, 0), recv_wr(2, &p.dst, 0, 0)])
        .unwrap();
    p.src.write(0, &[0xab; 100]).unwrap();
    for (id, op) in [(10, WrOpcode::RdmaWrite), (11, WrOpcode::RdmaWriteWithImm)] {
        let mut w = SendWr::new(id, op, vec![p.src.sge(0, 100)]);
        w.remote_addr = p.dst.addr() + 4096;
        w.rkey = p.dst.rkey();
        w.imm_data = 0x0102_0304;
        p.qa[0].post_send(&[w]).unwrap();
    }
    p.settle();
    assert_eq!(
        SrqPair::drain(&p.ca)
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect::<Vec<_>>(),
        vec![(10, WcStatus::Success), (11, WcStatus::Success)]
    );
    let r = SrqPair::drain(&p.cb);
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].wr_id, r[0].opcode, r[0].byte_len, r[0].imm_data),
        (1, WcOpcode::RecvRdmaWithImm, 100, 0x0102_0304)
    );
    assert_eq!(p.srq.len(), 1);
    let mut landed = [0u8; 100];
    p.dst.read(4096, &mut landed).unwrap();
    assert_eq!(landed, [0xab; 100]);
}

#[test]
fn an_srq_dropped_while_qps_use_it_keeps_serving_them() {
    let mut p = srq_pair(2, QpType::Rc, attr(4, 1, 0), 7);
    p.srq
        .post_recv(&[recv_wr(1, &p.dst, 0, 64), recv_wr(2, &p.dst, 0, 64)])
        .unwrap();
    // Drop the handle (replacing it with an unrelated SRQ): the QPs still hold the old one.
    let old = std::mem::replace(&mut p.srq, p._pds.1.create_srq(&attr(1, 1, 0)).unwrap());
    drop(old);
    for (k, q) in p.qa.iter().enumerate() {
        send(q, k as u64, &p.src, 8, SendFlags::SIGNALED);
    }
    p.settle();
    let got: Vec<(u64, u32)> = SrqPair::drain(&p.cb)
        .iter()
        .map(|w| (w.wr_id, w.qp_num))
        .collect();
    assert_eq!(got, vec![(1, p.qb[0].qp_num()), (2, p.qb[1].qp_num())]);
}

#[test]
fn a_cq_event_of_a_dropped_cq_is_skipped() {
    let mut sim = Sim::new(9, SimFaults::NONE);
    let b = sim.add_device("simB", B);
    let pd = b.alloc_pd().unwrap();
    let ch = b.create_comp_channel().unwrap();
    let keep = b.create_cq_with_channel(4, &ch).unwrap();
    for cq in [b.create_cq_with_channel(4, &ch).unwrap(), keep.clone()] {
        let q = qp(&pd, QpType::Ud, &cq, None);
        q.ready_ud(1, 0).unwrap();
        let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        q.post_recv(&[recv_wr(3, &mr, 0, 64)]).unwrap();
        cq.req_notify(false).unwrap();
        // The flush completion on ERR is the event.
        to_state(&q, QpState::Err);
    }
    let got = ch.get_cq_event(Duration::from_millis(1)).unwrap();
    assert!(
        got.same_cq(&keep),
        "the first CQ is gone, its event skipped"
    );
    assert!(ch.try_get_cq_event().is_none());
}

#[test]
fn uc_and_ud_qps_drain_in_sqd_and_resume_in_rts() {
    for t in [QpType::Uc, QpType::Ud] {
        let mut p = srq_pair(1, t, attr(8, 1, 0), 7);
        p.post_srq_recvs(4, 4096);
        let ah = p
            ._pds
            .0
            .create_ah(&softroce::verbs::AhAttr::roce_v2(Gid::from_ip(B)))
            .unwrap();
        let wr = |id| {
            let mut w = SendWr::new(id, WrOpcode::Send, vec![p.src.sge(0, 512)]);
            if t == QpType::Ud {
                w.ud = Some(ah.dest(p.qb[0].qp_num(), 0x1111_1111));
            }
            w
        };
        p.qa[0].post_send(&[wr(1)]).unwrap();
        to_state(&p.qa[0], QpState::Sqd);
        p.qa[0].post_send(&[wr(2)]).unwrap();
        p.settle();
        assert_eq!(
            events(&p.a),
            vec![AsyncEvent {
                event_type: EventType::SqDrained,
                element: EventElement::Qp(p.qa[0].qp_num())
            }],
            "{t:?}"
        );
        let ids = |cq: &Cq| {
            SrqPair::drain(cq)
                .iter()
                .map(|w| w.wr_id)
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&p.ca), vec![1], "{t:?}: the WR posted in SQD waits");
        assert_eq!(ids(&p.cb), vec![0], "{t:?}");
        to_state(&p.qa[0], QpState::Rts);
        p.settle();
        assert_eq!(ids(&p.ca), vec![2], "{t:?}");
        assert_eq!(ids(&p.cb), vec![1], "{t:?}");
        assert!(events(&p.a).is_empty());
    }
}

#[test]
fn the_new_objects_can_move_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Srq>();
    send_sync::<softroce::verbs::CompChannel>();
    send_sync::<AsyncEvent>();
    send_sync::<Cq>();
}

/// Drops the first datagram for which `pick` holds, delivers everything else.
fn drop_first(
    sim: &mut Sim,
    pick: impl Fn(&softroce::wire::RocePacket<'_>) -> bool + Send + 'static,
) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = dropped.clone();
    sim.set_filter(Some(Box::new(move |_, _, _, bytes| {
        let Ok(p) = softroce::wire::RocePacket::parse(bytes) else {
            return true;
        };
        if !d.load(std::sync::atomic::Ordering::Relaxed) && pick(&p) {
            d.store(true, std::sync::atomic::Ordering::Relaxed);
            return false;
        }
        true
    })));
    dropped
}

#[test]
fn a_retransmitted_send_whose_ack_was_lost_takes_no_second_srq_wr() {
    let mut p = srq_pair(1, QpType::Rc, attr(4, 1, 0), 7);
    p.post_srq_recvs(3, 64);
    use softroce::wire::Opcode;
    let dropped = drop_first(&mut p.sim, |pkt| {
        pkt.repr.bth.opcode == Opcode::RC_ACKNOWLEDGE
    });
    send(&p.qa[0], 1, &p.src, 16, SendFlags::SIGNALED);
    p.sim.run_until(Duration::from_secs(1), || false);
    assert!(dropped.load(std::sync::atomic::Ordering::Relaxed));
    assert_eq!(
        p.ca.poll_one().map(|w| (w.wr_id, w.status)),
        Some((1, WcStatus::Success))
    );
    // IBTA C9-105: the duplicate is re-ACKed, not executed: one receive, one WR consumed.
    assert_eq!(p.qb[0].counters().duplicate_request, 1);
    assert_eq!(SrqPair::drain(&p.cb).len(), 1);
    assert_eq!(p.srq.len(), 2);
}

#[test]
fn sqd_drains_through_a_retransmission() {
    let mut p = srq_pair(1, QpType::Rc, attr(8, 1, 0), 7);
    p.post_srq_recvs(4, 8192);
    use softroce::wire::Opcode;
    // Lose the middle packet of the first 3-packet SEND: the responder NAKs the gap (or the
    // timer fires) and the requester goes back while the QP is in SQD.
    let dropped = drop_first(&mut p.sim, |pkt| {
        pkt.repr.bth.opcode == Opcode::RC_SEND_MIDDLE
    });
    send(&p.qa[0], 1, &p.src, 3000, SendFlags::SIGNALED);
    send(&p.qa[0], 2, &p.src, 3000, SendFlags::SIGNALED);
    to_state(&p.qa[0], QpState::Sqd);
    p.sim.run_until(Duration::from_secs(2), || false);
    assert!(dropped.load(std::sync::atomic::Ordering::Relaxed));
    let c = p.qa[0].counters();
    assert!(
        c.rcvd_seq_err + c.completer_retry_err >= 1,
        "a retransmission happened: {c:?}"
    );
    assert_eq!(
        SrqPair::drain(&p.ca)
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect::<Vec<_>>(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(
        events(&p.a),
        vec![AsyncEvent {
            event_type: EventType::SqDrained,
            element: EventElement::Qp(p.qa[0].qp_num())
        }]
    );
    assert_eq!(SrqPair::drain(&p.cb).len(), 2);
}

/// A CQ that overruns loses the completion, counts it, and raises `IBV_EVENT_CQ_ERR` naming
/// the CQ, once per lost completion (rxe `rxe_cq_post`). Three receives flushed by ERR into a
/// two-entry CQ: two completions kept in order, one lost, one event.
#[test]
fn a_cq_overrun_raises_cq_err_naming_the_cq() {
    let mut sim = Sim::new(1, SimFaults::NONE);
    let b = sim.add_device("simB", B);
    assert!(events(&b).is_empty());
    let pd = b.alloc_pd().unwrap();
    let cq = b.create_cq(2).unwrap();
    let other = b.create_cq(2).unwrap();
    assert_ne!(cq.cq_num(), other.cq_num());
    let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let q = qp(&pd, QpType::Ud, &cq, None);
    q.ready_ud(1, 0).unwrap();
    q.post_recv(&[
        recv_wr(1, &mr, 0, 64),
        recv_wr(2, &mr, 64, 64),
        recv_wr(3, &mr, 128, 64),
    ])
    .unwrap();
    to_state(&q, QpState::Err);
    let mut wc = [Wc::default(); 4];
    let n = cq.poll(&mut wc);
    assert_eq!(
        wc[..n]
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect::<Vec<_>>(),
        [(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(cq.overflows(), 1);
    assert_eq!(
        events(&b),
        [AsyncEvent {
            event_type: EventType::CqErr,
            element: EventElement::Cq(cq.cq_num())
        }]
    );
}
