//! The CM over real UDP: two devices on loopback (127.0.97.1 / 127.0.97.2; run inside
//! `unshare -n` beside other tests, or anywhere 127/8 is on lo), each with a [`CmPort`] on its
//! QP1. A connects an RC QP to B's listening service with REQ/REP/RTU, both sides apply the
//! exchanged QP parameters with `connect_rc` (as librdmacm does with modify_qp), and a SEND
//! goes through the connected QPs; a REQ to a port nobody listens on gets REJ reason 8; then
//! DREQ/DREP, DISCONNECTED on both sides, TIMEWAIT, TIMEWAIT_EXIT and no state left.
//! The CM timers run on the real clock here; nothing asserts on durations.

mod support;

use softroce::cm::{AcceptParams, CmConfig, CmEngine, CmEvent, CommId, ConnectParams};
use softroce::net::UdpOptions;
use softroce::transport::Instant;
use softroce::verbs::{CmPort, Gid, PathMtu, RcConnect, RecvWr, SendWr, WcStatus, WrOpcode};
use softroce::wire::cm::{CmaHdrRepr, RejReason, port_space, rdma_cm_service_id};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;
use support::{Side, side, wait_one};

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 97, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 97, 2));
const PORT: u16 = 7471;

struct Node {
    side: Side,
    cm: CmPort,
}

fn node(ip: IpAddr, guid: u64) -> Node {
    // The test drives its own CM engine on QP1 (CmPort), not the device's CM: the port to
    // this device alone, since a shared device steers by the device CM's listeners.
    let opts = UdpOptions {
        exclusive: true,
        ..UdpOptions::default()
    };
    let side = side(ip, &opts).expect("open device (127.0.97.0/24 on lo)");
    let mut c = CmConfig::new(ip, guid, guid);
    c.packet_life_time = 8; // TIMEWAIT ≈ 2 ms
    // rdma_cm's 4.3 s response timeout: no retransmission on a loaded machine, so no
    // duplicate to count.
    c.cm_response_timeout = softroce::cm::CMA_CM_RESPONSE_TIMEOUT;
    let cm = CmPort::new(side.dev.device(), CmEngine::new(c)).expect("CmPort");
    Node { side, cm }
}

fn now(t0: std::time::Instant) -> Instant {
    Instant::from_nanos(t0.elapsed().as_nanos() as u64)
}

/// Processes both ports (yielding, up to 10 s) until one of them reports an event.
fn next_event(t0: std::time::Instant, nodes: &mut [&mut Node; 2]) -> (usize, CmEvent) {
    let end = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        for (i, n) in nodes.iter_mut().enumerate() {
            n.cm.process(now(t0)).expect("process");
            if let Some(ev) = n.cm.cm().poll_event() {
                return (i, ev);
            }
        }
        assert!(std::time::Instant::now() < end, "no CM event within 10 s");
        std::thread::yield_now();
    }
}

fn connect_params(peer: IpAddr, port: u16, qpn: u32, psn: u32) -> ConnectParams {
    let mut pd = [0u8; 36];
    CmaHdrRepr::new(A, 0xd59c, peer).emit(&mut pd);
    ConnectParams {
        peer,
        service_id: rdma_cm_service_id(port_space::TCP, port),
        local_qpn: qpn,
        starting_psn: psn,
        responder_resources: 4,
        initiator_depth: 4,
        path_mtu: 3,
        retry_count: 7,
        rnr_retry_count: 7,
        local_ack_timeout: 12,
        flow_label: softroce::cm::rdma_cm_flow_label(0xd59c, port),
        traffic_class: 0,
        hop_limit: 64,
        srq: false,
        private_data: pd.to_vec(),
    }
}

fn rc(dest_qp_num: u32, peer: IpAddr, rq_psn: u32, sq_psn: u32) -> RcConnect {
    let mut c = RcConnect::new(dest_qp_num, Gid::from_ip(peer), rq_psn, sq_psn);
    c.path_mtu = PathMtu::Mtu1024;
    c.max_rd_atomic = 4;
    c.timeout = 12;
    c
}

#[test]
fn cm_connect_send_reject_and_disconnect_over_udp() {
    let t0 = std::time::Instant::now();
    let (mut a, mut b) = (node(A, 0xa), node(B, 0xb));
    b.cm.cm()
        .listen(rdma_cm_service_id(port_space::TCP, PORT))
        .unwrap();

    // REQ -> CONNECT_REQUEST on B.
    let (a_qpn, b_qpn) = (a.side.qp.qp_num(), b.side.qp.qp_num());
    let a_id =
        a.cm.cm()
            .connect(now(t0), &connect_params(B, PORT, a_qpn, 0x1111))
            .unwrap();
    let (who, ev) = next_event(t0, &mut [&mut a, &mut b]);
    let CmEvent::ConnectRequest {
        id: b_id,
        peer,
        req,
        cma,
    } = ev
    else {
        panic!("B: {ev:?}")
    };
    assert_eq!(
        (who, peer, req.local_qpn, req.starting_psn),
        (1, A, a_qpn, 0x1111)
    );
    assert_eq!(cma.and_then(|c| c.src_ip()), Some(A));

    // B applies the REQ to its QP (RTR/RTS), then REP -> CONNECT_RESPONSE on A. As the
    // kernel's CM: the passive side sends from the REQ's starting PSN and receives from the
    // REP's.
    b.side
        .qp
        .connect_rc(&rc(req.local_qpn, peer, 0x2222, req.starting_psn))
        .unwrap();
    let ap = AcceptParams {
        local_qpn: b_qpn,
        starting_psn: 0x2222,
        responder_resources: 4,
        initiator_depth: 4,
        target_ack_delay: 0,
        rnr_retry_count: 7,
        srq: false,
        private_data: b"hello".to_vec(),
    };
    b.cm.cm().accept(now(t0), b_id, &ap).unwrap();
    let (who, ev) = next_event(t0, &mut [&mut a, &mut b]);
    let CmEvent::ConnectResponse { id, rep } = ev else {
        panic!("A: {ev:?}")
    };
    assert_eq!((who, id, rep.local_qpn), (0, a_id, b_qpn));
    assert_eq!(&rep.private_data[..5], b"hello");
    a.side
        .qp
        .connect_rc(&rc(rep.local_qpn, B, 0x1111, rep.starting_psn))
        .unwrap();
    a.cm.cm().establish(now(t0), a_id).unwrap();
    let mut established = vec![next_event(t0, &mut [&mut a, &mut b])];
    established.push(next_event(t0, &mut [&mut a, &mut b]));
    established.sort_by_key(|(w, _)| *w);
    assert_eq!(
        established,
        [
            (0, CmEvent::Established { id: a_id }),
            (1, CmEvent::Established { id: b_id })
        ]
    );

    // The QPs the CM connected carry a SEND.
    let rbuf = b
        .side
        .pd
        .reg_mr(64, softroce::verbs::AccessFlags::LOCAL_WRITE)
        .unwrap();
    b.side
        .qp
        .post_recv(&[RecvWr {
            wr_id: 7,
            sg_list: vec![rbuf.sge(0, 64)],
        }])
        .unwrap();
    let sbuf = a
        .side
        .pd
        .reg_mr(64, softroce::verbs::AccessFlags::LOCAL_WRITE)
        .unwrap();
    sbuf.write(0, b"over the CM").unwrap();
    let mut wr = SendWr::new(8, WrOpcode::Send, vec![sbuf.sge(0, 11)]);
    wr.send_flags = softroce::verbs::SendFlags::SIGNALED;
    a.side.qp.post_send(&[wr]).unwrap();
    let wc = wait_one(&b.side.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (7, WcStatus::Success, 11)
    );
    assert_eq!(&rbuf.to_vec()[..11], b"over the CM");

    // A REQ to a port nobody listens on: REJ, reason 8 (invalid service ID).
    let bad =
        a.cm.cm()
            .connect(now(t0), &connect_params(B, 9, a_qpn + 100, 1))
            .unwrap();
    let (who, ev) = next_event(t0, &mut [&mut a, &mut b]);
    let CmEvent::Rejected { id, reason, .. } = ev else {
        panic!("{ev:?}")
    };
    assert_eq!((who, id, reason), (0, bad, RejReason::INVALID_SERVICE_ID));

    // DREQ -> DISCONNECTED on B; B's rdma_disconnect sends the DREP -> DISCONNECTED on A.
    a.cm.cm().disconnect(now(t0), a_id).unwrap();
    let (who, ev) = next_event(t0, &mut [&mut a, &mut b]);
    assert_eq!((who, ev), (1, CmEvent::Disconnected { id: b_id }));
    b.cm.cm().disconnect(now(t0), b_id).unwrap();
    let mut rest: Vec<(usize, CmEvent)> = (0..3)
        .map(|_| next_event(t0, &mut [&mut a, &mut b]))
        .collect();
    rest.sort_by_key(|(w, e)| (*w, matches!(e, CmEvent::TimewaitExit { .. })));
    let exit = |id: CommId| CmEvent::TimewaitExit { id };
    assert_eq!(
        rest,
        [
            (0, CmEvent::Disconnected { id: a_id }),
            (0, exit(a_id)),
            (1, exit(b_id))
        ]
    );
    for n in [&mut a, &mut b] {
        assert_eq!(n.cm.cm().connection_count(), 0);
        assert_eq!(n.cm.cm().counters().total_drops(), 0);
        assert_eq!(n.cm.recv_errors(), 0);
    }
}

// Issue 25 item 3: a connect to an address with no RoCE device (127.0.97.9, where nothing
// listens on UDP 4791) comes back as ICMP port unreachable, and the CM reports Unreachable
// from that, not after its retries: no retransmission was needed (the 4.3 s response timeout
// of rdma_cm would be the first), and the engine counts it as unreachable.
#[test]
fn a_connect_to_an_address_without_a_device_is_unreachable_from_icmp() {
    let t0 = std::time::Instant::now();
    let mut a = node(IpAddr::V4(Ipv4Addr::new(127, 0, 97, 8)), 0xa8);
    let nobody = IpAddr::V4(Ipv4Addr::new(127, 0, 97, 9));
    let id =
        a.cm.cm()
            .connect(now(t0), &connect_params(nobody, PORT, 0x11, 1))
            .unwrap();
    let end = std::time::Instant::now() + Duration::from_secs(10);
    let ev = loop {
        a.cm.process(now(t0)).expect("process");
        if let Some(ev) = a.cm.cm().poll_event() {
            break ev;
        }
        assert!(std::time::Instant::now() < end, "no CM event within 10 s");
        std::thread::yield_now();
    };
    assert_eq!(ev, CmEvent::Unreachable { id });
    let c = a.cm.cm().counters();
    assert_eq!((c.unreachable, c.retransmits), (1, 0));
    assert_eq!(a.cm.cm().connection_count(), 0);
}
