//! State-machine tests of the CM engine: two engines, A (active, 10.0.0.1) and B (passive,
//! 10.0.0.2), one constructor per state, MADs moved by hand so a test can lose, duplicate or
//! reorder any of them. Names are `<state>_<event>_<outcome>`.

use super::*;
use crate::wire::cm::{attr, port_space, rdma_cm_service_id};

const A_IP: IpAddr = IpAddr::V4(core::net::Ipv4Addr::new(10, 0, 0, 1));
const B_IP: IpAddr = IpAddr::V4(core::net::Ipv4Addr::new(10, 0, 0, 2));
const SERVICE: u64 = rdma_cm_service_id(port_space::TCP, 7174);

struct Pair {
    a: CmEngine,
    b: CmEngine,
    now: Instant,
}

fn config(ip: IpAddr, guid: u64) -> CmConfig {
    let mut c = CmConfig::new(ip, guid, guid);
    // Short timers keep the arithmetic readable: 2 × 4.2 ms + 4.2 ms per response.
    c.cm_response_timeout = 10;
    c.packet_life_time = 10;
    c.max_cm_retries = 3;
    c
}

fn connect_params() -> ConnectParams {
    ConnectParams {
        peer: B_IP,
        service_id: SERVICE,
        local_qpn: 0x11,
        starting_psn: 0x12_3456,
        responder_resources: 1,
        initiator_depth: 1,
        path_mtu: 3,
        retry_count: 7,
        rnr_retry_count: 7,
        local_ack_timeout: 19,
        flow_label: rdma_cm_flow_label(0xd59c, 7174),
        traffic_class: 0,
        hop_limit: 64,
        srq: false,
        private_data: vec![1, 2, 3],
    }
}

fn accept_params() -> AcceptParams {
    AcceptParams {
        local_qpn: 0x22,
        starting_psn: 0x65_4321,
        responder_resources: 1,
        initiator_depth: 1,
        target_ack_delay: 15,
        rnr_retry_count: 7,
        srq: false,
        private_data: vec![9],
    }
}

fn attr_of(m: &MadTransmit) -> u16 {
    u16::from_be_bytes([m.mad[16], m.mad[17]])
}

fn parse(m: &MadTransmit) -> CmMsgRepr {
    CmMadRepr::parse(&m.mad[..]).unwrap().msg
}

impl Pair {
    fn new() -> Pair {
        let mut b = CmEngine::new(config(B_IP, 0xbbbb));
        b.listen(SERVICE).unwrap();
        Pair {
            a: CmEngine::new(config(A_IP, 0xaaaa)),
            b,
            now: Instant::ZERO,
        }
    }
    fn take_a(&mut self) -> Vec<MadTransmit> {
        std::iter::from_fn(|| self.a.poll_mad()).collect()
    }
    fn take_b(&mut self) -> Vec<MadTransmit> {
        std::iter::from_fn(|| self.b.poll_mad()).collect()
    }
    fn deliver_b(&mut self, mads: &[MadTransmit]) {
        for m in mads {
            assert_eq!(m.dst, B_IP);
            self.b.handle_mad(self.now, A_IP, &m.mad[..]);
        }
    }
    fn deliver_a(&mut self, mads: &[MadTransmit]) {
        for m in mads {
            assert_eq!(m.dst, A_IP);
            self.a.handle_mad(self.now, B_IP, &m.mad[..]);
        }
    }
    fn advance_to(&mut self, t: Instant) {
        self.now = t;
        self.a.handle_timeout(t);
        self.b.handle_timeout(t);
    }

    /// Both engines' tables agree and nothing waits without a timer.
    fn check(&self) {
        self.a.check_invariants().unwrap();
        self.b.check_invariants().unwrap();
    }

    /// A: REQ_SENT; B has not seen the REQ (it is returned).
    fn req_sent() -> (Pair, CommId, Vec<MadTransmit>) {
        let mut p = Pair::new();
        let id = p.a.connect(p.now, &connect_params()).unwrap();
        let req = p.take_a();
        assert_eq!(req.len(), 1);
        p.check();
        (p, id, req)
    }
    /// A: REQ_SENT, B: REQ_RCVD (event taken).
    fn req_rcvd() -> (Pair, CommId, CommId, Vec<MadTransmit>) {
        let (mut p, a_id, req) = Pair::req_sent();
        p.deliver_b(&req);
        let Some(CmEvent::ConnectRequest { id, .. }) = p.b.poll_event() else {
            panic!()
        };
        p.check();
        (p, a_id, id, req)
    }
    /// A: REQ_SENT, B: REP_SENT (REP returned, not delivered).
    fn rep_sent() -> (Pair, CommId, CommId, Vec<MadTransmit>, Vec<MadTransmit>) {
        let (mut p, a_id, b_id, req) = Pair::req_rcvd();
        p.b.accept(p.now, b_id, &accept_params()).unwrap();
        let rep = p.take_b();
        assert_eq!(rep.len(), 1);
        p.check();
        (p, a_id, b_id, req, rep)
    }
    /// Both ESTABLISHED (events taken); returns the REP for duplicate tests.
    fn established() -> (Pair, CommId, CommId, Vec<MadTransmit>) {
        let (mut p, a_id, b_id, _, rep) = Pair::rep_sent();
        p.deliver_a(&rep);
        assert!(matches!(
            p.a.poll_event(),
            Some(CmEvent::ConnectResponse { .. })
        ));
        p.a.establish(p.now, a_id).unwrap();
        assert_eq!(p.a.poll_event(), Some(CmEvent::Established { id: a_id }));
        let rtu = p.take_a();
        p.deliver_b(&rtu);
        assert_eq!(p.b.poll_event(), Some(CmEvent::Established { id: b_id }));
        p.check();
        (p, a_id, b_id, rep)
    }
    /// A: DREQ_SENT (DREQ returned), B: ESTABLISHED.
    fn dreq_sent() -> (Pair, CommId, CommId, Vec<MadTransmit>) {
        let (mut p, a_id, b_id, _) = Pair::established();
        p.a.disconnect(p.now, a_id).unwrap();
        let dreq = p.take_a();
        assert_eq!(attr_of(&dreq[0]), attr::DREQ);
        p.check();
        (p, a_id, b_id, dreq)
    }
    /// Both in TIMEWAIT after a clean DREQ/DREP; returns the DREQ.
    fn timewait() -> (Pair, CommId, CommId, Vec<MadTransmit>) {
        let (mut p, a_id, b_id, dreq) = Pair::dreq_sent();
        p.deliver_b(&dreq);
        assert_eq!(p.b.poll_event(), Some(CmEvent::Disconnected { id: b_id }));
        p.b.disconnect(p.now, b_id).unwrap();
        let drep = p.take_b();
        p.deliver_a(&drep);
        assert_eq!(p.a.poll_event(), Some(CmEvent::Disconnected { id: a_id }));
        assert_eq!(p.a.state(a_id), Some(CmState::Timewait));
        assert_eq!(p.b.state(b_id), Some(CmState::Timewait));
        p.check();
        (p, a_id, b_id, dreq)
    }
}

#[test]
fn idle_connect_sends_req_with_the_qp_parameters() {
    let (p, id, req) = Pair::req_sent();
    assert_eq!(p.a.state(id), Some(CmState::ReqSent));
    let CmMsgRepr::Req(r) = parse(&req[0]) else {
        panic!()
    };
    assert_eq!((r.local_comm_id, r.service_id), (id.0, SERVICE));
    assert_eq!(
        (r.local_qpn, r.starting_psn, r.path_mtu),
        (0x11, 0x12_3456, 3)
    );
    assert_eq!(r.primary_path.remote_gid, gid_of_ip(B_IP));
    assert_eq!(r.primary_path.flow_label, rdma_cm_flow_label(0xd59c, 7174));
    assert_eq!(&r.private_data[..3], &[1, 2, 3]);
    assert_eq!(
        p.a.poll_timeout(),
        Some(Instant::ZERO + p.a.response_timeout(10))
    );
}

// IBTA C12 (kernel cm_req_handler): a REQ for a service nobody listens on gets REJ reason 8.
#[test]
fn idle_req_for_unknown_service_rejects_invalid_service_id() {
    let (mut p, a_id, req) = Pair::req_sent();
    p.b.unlisten(SERVICE);
    p.deliver_b(&req);
    assert_eq!(p.b.connection_count(), 0);
    let rej = p.take_b();
    let CmMsgRepr::Rej(r) = parse(&rej[0]) else {
        panic!()
    };
    assert_eq!(
        (r.reason, r.message_rejected),
        (RejReason::INVALID_SERVICE_ID, 0)
    );
    assert_eq!((r.local_comm_id, r.remote_comm_id), (0, a_id.0));
    // The REJ answers the REQ's transaction.
    assert_eq!(rej[0].mad[8..16], req[0].mad[8..16]);
    p.deliver_a(&rej);
    let Some(CmEvent::Rejected { id, reason, .. }) = p.a.poll_event() else {
        panic!()
    };
    assert_eq!((id, reason), (a_id, RejReason::INVALID_SERVICE_ID));
    assert_eq!(p.a.connection_count(), 0);
    assert_eq!(p.a.poll_timeout(), None);
}

#[test]
fn req_sent_timeout_retransmits_max_cm_retries_then_unreachable() {
    let (mut p, a_id, req) = Pair::req_sent();
    let step = p.a.response_timeout(10);
    for i in 1..=3u32 {
        // Just under the deadline: nothing.
        p.advance_to(Instant::ZERO + (step * i - Duration::from_nanos(1)));
        assert!(p.take_a().is_empty());
        p.advance_to(Instant::ZERO + step * i);
        assert_eq!(p.take_a()[..], req[..], "retry {i}");
    }
    p.advance_to(Instant::ZERO + step * 4);
    let rej = p.take_a();
    let CmMsgRepr::Rej(r) = parse(&rej[0]) else {
        panic!()
    };
    assert_eq!(r.reason, RejReason::TIMEOUT);
    assert_eq!(p.a.poll_event(), Some(CmEvent::Unreachable { id: a_id }));
    assert_eq!((p.a.connection_count(), p.a.counters().retransmits), (0, 3));
}

// kernel cm_destroy_id: a connect abandoned in REQ_SENT sends REJ(timeout), leaves nothing.
#[test]
fn req_sent_cancel_sends_rej_timeout_and_forgets_the_connection() {
    let (mut p, a_id, _req) = Pair::req_sent();
    p.a.cancel(p.now, a_id).unwrap();
    let rej = p.take_a();
    assert_eq!(rej.len(), 1);
    let CmMsgRepr::Rej(r) = parse(&rej[0]) else {
        panic!()
    };
    assert_eq!((r.reason, r.local_comm_id), (RejReason::TIMEOUT, a_id.0));
    assert_eq!(p.a.poll_event(), None);
    assert_eq!((p.a.connection_count(), p.a.poll_timeout()), (0, None));
    // The connection is gone: a second cancel is refused.
    assert!(matches!(
        p.a.cancel(p.now, a_id),
        Err(CmError::InvalidState { .. } | CmError::NoSuchId)
    ));
}

#[test]
fn req_sent_rep_reports_connect_response_with_the_peer_qp() {
    let (mut p, a_id, _, _, rep) = Pair::rep_sent();
    p.deliver_a(&rep);
    let Some(CmEvent::ConnectResponse { id, rep }) = p.a.poll_event() else {
        panic!()
    };
    assert_eq!(
        (id, rep.local_qpn, rep.starting_psn),
        (a_id, 0x22, 0x65_4321)
    );
    assert_eq!(p.a.state(a_id), Some(CmState::RepRcvd));
    assert_eq!(p.a.remote_qpn(a_id), Some(0x22));
    assert_eq!(p.a.poll_timeout(), None);
}

#[test]
fn req_rcvd_event_carries_req_and_rdma_cm_header() {
    let mut p = Pair::new();
    let mut cp = connect_params();
    let mut pd = [0u8; 36];
    crate::wire::cm::CmaHdrRepr::new(A_IP, 0xd59c, B_IP).emit(&mut pd);
    cp.private_data = pd.to_vec();
    p.a.connect(p.now, &cp).unwrap();
    let req = p.take_a();
    p.deliver_b(&req);
    let Some(CmEvent::ConnectRequest { peer, req, cma, .. }) = p.b.poll_event() else {
        panic!()
    };
    assert_eq!((peer, req.local_qpn), (A_IP, 0x11));
    let cma = cma.unwrap();
    assert_eq!(
        (cma.src_ip(), cma.dst_ip(), cma.port),
        (Some(A_IP), Some(B_IP), 0xd59c)
    );
}

// IBTA C12: a duplicate REQ while the consumer has not answered gets an MRA.
#[test]
fn req_rcvd_duplicate_req_sends_mra() {
    let (mut p, a_id, b_id, req) = Pair::req_rcvd();
    p.deliver_b(&req);
    let mra = p.take_b();
    let CmMsgRepr::Mra(m) = parse(&mra[0]) else {
        panic!()
    };
    assert_eq!((m.message_mraed, m.remote_comm_id), (0, a_id.0));
    assert_eq!(p.b.state(b_id), Some(CmState::MraReqSent));
    // A third copy gets the same MRA again.
    p.deliver_b(&req);
    assert_eq!(p.take_b()[..], mra[..]);
    // The MRA stops A's retransmissions and stretches its wait.
    p.deliver_a(&mra);
    assert_eq!(p.a.state(a_id), Some(CmState::MraReqRcvd));
    let wait = p.a.response_timeout(p.b.config().mra_service_timeout);
    assert_eq!(p.a.poll_timeout(), Some(p.now + wait));
    // accept still works from MRA_REQ_SENT.
    p.b.accept(p.now, b_id, &accept_params()).unwrap();
    let rep = p.take_b();
    p.deliver_a(&rep);
    assert!(matches!(
        p.a.poll_event(),
        Some(CmEvent::ConnectResponse { .. })
    ));
}

#[test]
fn rep_sent_duplicate_req_resends_rep() {
    let (mut p, _, _, req, rep) = Pair::rep_sent();
    p.deliver_b(&req);
    assert_eq!(p.take_b()[..], rep[..]);
    assert_eq!(p.b.counters().resends, 1);
}

#[test]
fn rep_sent_timeout_rejects_and_reports_unreachable() {
    let (mut p, _, b_id, _, rep) = Pair::rep_sent();
    let step = p.b.response_timeout(10);
    for i in 1..=3u32 {
        p.advance_to(Instant::ZERO + step * i);
        p.take_a();
        assert_eq!(p.take_b()[..], rep[..]);
    }
    p.advance_to(Instant::ZERO + step * 4);
    p.take_a();
    let rej = p.take_b();
    let CmMsgRepr::Rej(r) = parse(&rej[0]) else {
        panic!()
    };
    assert_eq!((r.reason, r.message_rejected), (RejReason::TIMEOUT, 1));
    assert_eq!(p.b.poll_event(), Some(CmEvent::Unreachable { id: b_id }));
    assert_eq!(p.b.connection_count(), 0);
}

#[test]
fn rep_sent_dreq_before_rtu_reports_disconnected() {
    let (mut p, a_id, b_id, _, rep) = Pair::rep_sent();
    p.deliver_a(&rep);
    let _ = p.a.poll_event();
    p.a.establish(p.now, a_id).unwrap();
    p.take_a(); // the RTU is lost
    p.a.disconnect(p.now, a_id).unwrap();
    let dreq = p.take_a();
    p.deliver_b(&dreq);
    assert_eq!(p.b.poll_event(), Some(CmEvent::Disconnected { id: b_id }));
    assert_eq!(p.b.state(b_id), Some(CmState::DreqRcvd));
}

#[test]
fn established_duplicate_rep_resends_rtu() {
    let (mut p, _, _, rep) = Pair::established();
    p.deliver_a(&rep);
    let rtu = p.take_a();
    assert_eq!(attr_of(&rtu[0]), attr::RTU);
    assert_eq!(p.a.counters().resends, 1);
}

#[test]
fn established_duplicate_rtu_is_dropped_and_counted() {
    let (mut p, a_id, b_id, _) = Pair::established();
    let rtu = CmMadRepr {
        hdr: MadHdrRepr::cm(1, attr::RTU),
        msg: CmMsgRepr::Rtu(RtuRepr {
            local_comm_id: a_id.0,
            remote_comm_id: b_id.0,
            private_data: [0; 224],
        }),
    };
    p.b.handle_mad(p.now, A_IP, &rtu.to_bytes());
    assert_eq!(p.b.counters().drops(CmDropReason::DuplicateRtu), 1);
    // From another peer, the same bytes are a WrongPeer drop.
    p.b.handle_mad(p.now, B_IP, &rtu.to_bytes());
    assert_eq!(p.b.counters().drops(CmDropReason::WrongPeer), 1);
}

#[test]
fn dreq_sent_drep_enters_timewait_then_exits_and_frees() {
    let (mut p, a_id, b_id, _) = Pair::timewait();
    let tw = ib_time(11);
    p.advance_to(Instant::ZERO + (tw - Duration::from_nanos(1)));
    assert_eq!(p.a.poll_event(), None);
    p.advance_to(Instant::ZERO + tw);
    assert_eq!(p.a.poll_event(), Some(CmEvent::TimewaitExit { id: a_id }));
    assert_eq!(p.b.poll_event(), Some(CmEvent::TimewaitExit { id: b_id }));
    assert_eq!((p.a.connection_count(), p.b.connection_count()), (0, 0));
    assert_eq!((p.a.poll_timeout(), p.b.poll_timeout()), (None, None));
}

#[test]
fn dreq_sent_timeout_enters_timewait_and_reports_disconnected() {
    let (mut p, a_id, _, dreq) = Pair::dreq_sent();
    let step = p.a.response_timeout(10);
    for i in 1..=3u32 {
        p.advance_to(Instant::ZERO + step * i);
        assert_eq!(p.take_a()[..], dreq[..]);
    }
    p.advance_to(Instant::ZERO + step * 4);
    assert_eq!(p.a.poll_event(), Some(CmEvent::Disconnected { id: a_id }));
    assert_eq!(p.a.state(a_id), Some(CmState::Timewait));
}

#[test]
fn dreq_sent_crossing_dreq_answers_drep_and_enters_timewait() {
    let (mut p, a_id, b_id, dreq_a) = Pair::dreq_sent();
    p.b.disconnect(p.now, b_id).unwrap();
    let dreq_b = p.take_b();
    p.deliver_b(&dreq_a);
    p.deliver_a(&dreq_b);
    assert_eq!(p.a.state(a_id), Some(CmState::Timewait));
    assert_eq!(p.b.state(b_id), Some(CmState::Timewait));
    let (drep_a, drep_b) = (p.take_a(), p.take_b());
    assert_eq!(attr_of(&drep_a[0]), attr::DREP);
    // Each DREP arrives in TIMEWAIT and answers nothing: counted.
    p.deliver_a(&drep_b);
    p.deliver_b(&drep_a);
    assert_eq!(p.a.counters().drops(CmDropReason::UnexpectedResponse), 1);
}

#[test]
fn dreq_rcvd_duplicate_dreq_is_dropped_and_counted() {
    let (mut p, _, b_id, dreq) = Pair::dreq_sent();
    p.deliver_b(&dreq);
    p.deliver_b(&dreq);
    assert_eq!(p.b.state(b_id), Some(CmState::DreqRcvd));
    assert_eq!(p.b.counters().drops(CmDropReason::DuplicateDreq), 1);
}

// kernel cm_dreq_handler: a DREQ in TIMEWAIT gets the DREP again.
#[test]
fn timewait_duplicate_dreq_resends_drep() {
    let (mut p, _, _, dreq) = Pair::timewait();
    p.deliver_b(&dreq);
    let drep = p.take_b();
    assert_eq!(attr_of(&drep[0]), attr::DREP);
    assert_eq!(drep[0].mad[8..16], dreq[0].mad[8..16]);
}

// kernel cm_dup_req_handler: a REQ for a connection in TIMEWAIT is stale.
#[test]
fn timewait_duplicate_req_rejects_stale_connection() {
    let (mut p, a_id, b_id, req) = Pair::req_rcvd();
    p.b.accept(p.now, b_id, &accept_params()).unwrap();
    let rep = p.take_b();
    p.deliver_a(&rep);
    let _ = p.a.poll_event();
    p.a.establish(p.now, a_id).unwrap();
    let rtu = p.take_a();
    p.deliver_b(&rtu);
    p.b.disconnect(p.now, b_id).unwrap();
    let dreq = p.take_b();
    p.deliver_a(&dreq);
    p.a.disconnect(p.now, a_id).unwrap();
    let drep = p.take_a();
    p.deliver_b(&drep);
    assert_eq!(p.b.state(b_id), Some(CmState::Timewait));
    p.deliver_b(&req);
    let rej = p.take_b();
    let CmMsgRepr::Rej(r) = parse(&rej[0]) else {
        panic!()
    };
    assert_eq!(r.reason, RejReason::STALE_CONN);
}

// kernel cm_issue_drep / cm_issue_rej: answers for IDs nobody holds.
#[test]
fn idle_dreq_and_rep_for_unknown_ids_are_answered() {
    // A fresh B (its state lost) gets A's DREQ: it answers with a DREP.
    let (p, _, _, dreq) = Pair::dreq_sent();
    let mut b2 = CmEngine::new(config(B_IP, 0xcccc));
    b2.handle_mad(p.now, A_IP, &dreq[0].mad[..]);
    let drep = b2.poll_mad().unwrap();
    assert_eq!(attr_of(&drep), attr::DREP);
    assert_eq!(drep.mad[8..16], dreq[0].mad[8..16]);
    // A fresh A gets B's REP: REJ(invalid comm ID) for the REP.
    let (q, _, _, _, rep) = Pair::rep_sent();
    let mut a2 = CmEngine::new(config(A_IP, 0xdddd));
    a2.handle_mad(q.now, B_IP, &rep[0].mad[..]);
    let CmMsgRepr::Rej(r) = parse(&a2.poll_mad().unwrap()) else {
        panic!()
    };
    assert_eq!(
        (r.reason, r.message_rejected),
        (RejReason::INVALID_COMM_ID, 1)
    );
    assert_eq!((a2.connection_count(), b2.connection_count()), (0, 0));
}

#[test]
fn req_rcvd_reject_sends_consumer_rej_and_the_peer_reports_rejected() {
    let (mut p, a_id, b_id, _) = Pair::req_rcvd();
    p.b.reject(p.now, b_id, b"no").unwrap();
    assert_eq!(p.b.connection_count(), 0);
    let rej = p.take_b();
    p.deliver_a(&rej);
    let Some(CmEvent::Rejected {
        id,
        reason,
        private_data,
    }) = p.a.poll_event()
    else {
        panic!()
    };
    assert_eq!((id, reason), (a_id, RejReason::CONSUMER_DEFINED));
    assert_eq!(&private_data[..2], b"no");
}

// IBTA C12: a REQ held by the frontend and given up is answered as if nobody listened.
#[test]
fn req_rcvd_reject_no_listener_sends_rej_invalid_service_id() {
    let (mut p, a_id, b_id, req) = Pair::req_rcvd();
    p.b.reject_no_listener(p.now, b_id).unwrap();
    assert_eq!(p.b.connection_count(), 0);
    let rej = p.take_b();
    let CmMsgRepr::Rej(r) = parse(&rej[0]) else {
        panic!()
    };
    assert_eq!(
        (
            r.reason,
            r.message_rejected,
            r.local_comm_id,
            r.remote_comm_id
        ),
        (RejReason::INVALID_SERVICE_ID, 0, 0, a_id.0)
    );
    assert_eq!(rej[0].mad[8..16], req[0].mad[8..16]);
    p.deliver_a(&rej);
    let Some(CmEvent::Rejected { id, reason, .. }) = p.a.poll_event() else {
        panic!()
    };
    assert_eq!((id, reason), (a_id, RejReason::INVALID_SERVICE_ID));
    assert!(p.b.reject_no_listener(p.now, b_id).is_err());
}

#[test]
fn idle_api_calls_in_wrong_states_are_errors() {
    let (mut p, a_id, _) = Pair::req_sent();
    assert_eq!(
        p.a.establish(p.now, a_id),
        Err(CmError::InvalidState {
            op: "establish",
            state: CmState::ReqSent
        })
    );
    assert_eq!(p.a.disconnect(p.now, CommId(0)), Err(CmError::NoSuchId));
    assert_eq!(p.b.listen(SERVICE), Err(CmError::AddrInUse));
    let mut cp = connect_params();
    cp.private_data = vec![0; 93];
    assert_eq!(
        p.a.connect(p.now, &cp),
        Err(CmError::PrivateDataTooLong { given: 93, max: 92 })
    );
}

#[test]
fn idle_bad_headers_are_dropped_and_counted() {
    let (mut p, _, req) = Pair::req_sent();
    let mut m = req[0].mad.clone();
    m[2] = 1; // class version
    p.b.handle_mad(p.now, A_IP, &m[..]);
    m[2] = 2;
    m[3] = 0x83; // a response method
    p.b.handle_mad(p.now, A_IP, &m[..]);
    p.b.handle_mad(p.now, A_IP, &m[..100]);
    m[3] = 3;
    m[16..18].copy_from_slice(&attr::LAP.to_be_bytes());
    p.b.handle_mad(p.now, A_IP, &m[..]);
    let c = p.b.counters();
    assert_eq!(c.drops(CmDropReason::BadClassVersion), 1);
    assert_eq!(c.drops(CmDropReason::BadMethod), 1);
    assert_eq!(c.drops(CmDropReason::Truncated), 1);
    assert_eq!(c.drops(CmDropReason::UnsupportedAttribute), 1);
    assert_eq!((c.total_drops(), c.mads_received), (4, 4));
    assert_eq!(p.b.connection_count(), 0);
}

#[test]
fn sidr_req_sent_sidr_rep_reports_qpn_and_qkey() {
    let mut p = Pair::new();
    let udp = rdma_cm_service_id(port_space::UDP, 7174);
    p.b.listen(udp).unwrap();
    let id = p.a.sidr_request(p.now, B_IP, udp, b"hi").unwrap();
    let req = p.take_a();
    p.deliver_b(&req);
    p.deliver_b(&req);
    assert_eq!(p.b.counters().drops(CmDropReason::DuplicateSidrReq), 1);
    let Some(CmEvent::SidrRequest {
        id: b_id, req: r, ..
    }) = p.b.poll_event()
    else {
        panic!()
    };
    assert_eq!((r.service_id, &r.private_data[..2]), (udp, &b"hi"[..]));
    p.b.sidr_reply(p.now, b_id, SidrStatus::SUCCESS, 0x28, 0x0123_4567, &[])
        .unwrap();
    let rep = p.take_b();
    p.deliver_a(&rep);
    let Some(CmEvent::SidrResponse { id: got, rep }) = p.a.poll_event() else {
        panic!()
    };
    assert_eq!(
        (got, rep.status, rep.qpn, rep.qkey),
        (id, SidrStatus::SUCCESS, 0x28, 0x0123_4567)
    );
    assert_eq!((p.a.connection_count(), p.b.connection_count()), (0, 0));
}

// kernel cm_destroy_id: IB_CM_SIDR_REQ_SENT cancels the MAD; no message, no retry.
#[test]
fn sidr_req_sent_cancel_forgets_the_request_and_a_late_sidr_rep_finds_nothing() {
    let mut p = Pair::new();
    let udp = rdma_cm_service_id(port_space::UDP, 7174);
    p.b.listen(udp).unwrap();
    let id = p.a.sidr_request(p.now, B_IP, udp, &[]).unwrap();
    let req = p.take_a();
    p.a.cancel(p.now, id).unwrap();
    assert!(p.take_a().is_empty(), "SIDR has no REJ");
    assert_eq!((p.a.connection_count(), p.a.poll_timeout()), (0, None));
    p.deliver_b(&req);
    let Some(CmEvent::SidrRequest { id: b_id, .. }) = p.b.poll_event() else {
        panic!()
    };
    p.b.sidr_reply(p.now, b_id, SidrStatus::SUCCESS, 0x28, 0x0123_4567, &[])
        .unwrap();
    let rep = p.take_b();
    p.deliver_a(&rep);
    assert_eq!(p.a.poll_event(), None);
    assert_eq!(p.a.connection_count(), 0);
}

#[test]
fn idle_sidr_req_for_unknown_service_gets_unsupported() {
    let mut p = Pair::new();
    let id = p.a.sidr_request(p.now, B_IP, 0x0111_0001, &[]).unwrap();
    let req = p.take_a();
    p.deliver_b(&req);
    let rep = p.take_b();
    p.deliver_a(&rep);
    let Some(CmEvent::SidrResponse { id: got, rep }) = p.a.poll_event() else {
        panic!()
    };
    assert_eq!((got, rep.status), (id, SidrStatus::UNSUPPORTED));
}

#[test]
fn mad_agent_demultiplexes_by_class_and_strips_the_grh() {
    let (p, _, req) = Pair::req_sent();
    let mut b = CmEngine::new(config(B_IP, 0xbbbb));
    b.listen(SERVICE).unwrap();
    let mut agent = MadAgent::new(b);
    let mut recv = vec![0u8; 40];
    recv.extend_from_slice(&req[0].mad[..]);
    agent.handle_recv(p.now, A_IP, &recv);
    assert!(matches!(
        agent.cm.poll_event(),
        Some(CmEvent::ConnectRequest { .. })
    ));
    let mut sa = req[0].mad.clone();
    sa[1] = 0x03; // subnet administration
    agent.handle_mad(p.now, A_IP, &sa[..]);
    agent.handle_recv(p.now, A_IP, &recv[..39]);
    assert_eq!(agent.drops().by_class.get(&3), Some(&1));
    assert_eq!(agent.drops().truncated, 1);
}

// kernel cm_acquire_rejected_id: the REJ(timeout) of a peer that abandons its connect in
// REQ_SENT carries remote comm ID 0 and names the connection by the peer's own ID; the
// passive side finds it by that ID, reports Rejected and forgets the request.
#[test]
fn req_rcvd_rej_timeout_of_abandoned_connect_removes_the_request() {
    let (mut p, a_id, b_id, _req) = Pair::req_rcvd();
    p.a.cancel(p.now, a_id).unwrap();
    let rej = p.take_a();
    let CmMsgRepr::Rej(r) = parse(&rej[0]) else {
        panic!()
    };
    assert_eq!((r.reason, r.remote_comm_id), (RejReason::TIMEOUT, 0));
    p.deliver_b(&rej);
    assert!(matches!(
        p.b.poll_event(),
        Some(CmEvent::Rejected { id, reason: RejReason::TIMEOUT, .. }) if id == b_id
    ));
    assert_eq!(p.b.state(b_id), None);
    // A REJ of another reason with remote comm ID 0 names nothing.
    let (mut p, _a_id, b_id, _req) = Pair::req_rcvd();
    let mut r2 = r;
    r2.reason = RejReason::CONSUMER_DEFINED;
    let mad = CmMadRepr {
        hdr: MadHdrRepr::cm(1, 0),
        msg: CmMsgRepr::Rej(r2),
    }
    .to_bytes();
    p.b.handle_mad(p.now, A_IP, &mad);
    assert_eq!(p.b.poll_event(), None);
    assert_eq!(p.b.state(b_id), Some(CmState::ReqRcvd));
}

#[test]
fn route_mtu_follows_the_link_mtu_as_rdma_cm() {
    // cma.c cma_resolve_iboe_route: iboe_get_mtu(ndev->mtu), 96 header bytes off.
    assert_eq!(rdma_cm_route_mtu(1500), Some(3)); // the interop rig's tap: the kernel's REQ says 1024
    assert_eq!(rdma_cm_route_mtu(9000), Some(5));
    assert_eq!(rdma_cm_route_mtu(65536), Some(5)); // loopback
    assert_eq!(rdma_cm_route_mtu(4096 + 96), Some(5));
    assert_eq!(rdma_cm_route_mtu(4096 + 95), Some(4));
    assert_eq!(rdma_cm_route_mtu(1024 + 96), Some(3));
    assert_eq!(rdma_cm_route_mtu(1024 + 95), Some(2));
    assert_eq!(rdma_cm_route_mtu(256 + 96), Some(1));
    assert_eq!(rdma_cm_route_mtu(256 + 95), None);
    assert_eq!(rdma_cm_route_mtu(0), None);
}

/// A hand-made MAD from A to B carrying `msg`, with TID 1.
fn mad_of(msg: CmMsgRepr) -> [u8; MAD_LEN] {
    CmMadRepr {
        hdr: MadHdrRepr::cm(1, msg.attr_id()),
        msg,
    }
    .to_bytes()
}

/// B in REP_SENT for a REQ whose local comm ID is 0, then an MRA for the REP that carries a
/// non-zero local comm ID (what a structured fuzzer found, issue "Reliability" item 5).
/// Returns the pair, B's ID and the REQ as sent.
fn rep_sent_for_comm_id_0_then_mra() -> (Pair, CommId, ReqRepr) {
    let (mut p, _a_id, req) = Pair::req_sent();
    let CmMsgRepr::Req(mut r) = parse(&req[0]) else {
        panic!()
    };
    r.local_comm_id = 0;
    p.b.handle_mad(p.now, A_IP, &mad_of(CmMsgRepr::Req(r)));
    let Some(CmEvent::ConnectRequest { id: b_id, .. }) = p.b.poll_event() else {
        panic!("B reports no ConnectRequest for comm ID 0")
    };
    p.b.accept(p.now, b_id, &accept_params()).unwrap();
    let _rep = p.take_b();
    let mra = MraRepr {
        local_comm_id: 0x5eed,
        remote_comm_id: b_id.0,
        message_mraed: msg_ref::REP,
        service_timeout: 10,
        private_data: [0; 222],
    };
    p.b.handle_mad(p.now, A_IP, &mad_of(CmMsgRepr::Mra(mra)));
    assert_eq!(p.b.state(b_id), Some(CmState::MraRepRcvd));
    p.b.check_invariants().unwrap();
    (p, b_id, r)
}

// The connection's by_remote entry is the key its REQ registered (comm ID 0), whatever the
// MRA says, so it goes with the connection: the next REQ with comm ID 0 is a new request,
// not a duplicate of a connection that is gone (which panicked the CM driver thread).
#[test]
fn rep_sent_mra_with_other_comm_id_then_rej_leaves_no_entry_behind() {
    let (mut p, b_id, r) = rep_sent_for_comm_id_0_then_mra();
    let rej = RejRepr {
        local_comm_id: 0x5eed,
        remote_comm_id: b_id.0,
        message_rejected: msg_ref::REP,
        rejected_info_length: 0,
        reason: RejReason::CONSUMER_DEFINED,
        ari: [0; 72],
        private_data: [0; 148],
    };
    p.b.handle_mad(p.now, A_IP, &mad_of(CmMsgRepr::Rej(rej)));
    assert!(matches!(p.b.poll_event(), Some(CmEvent::Rejected { id, .. }) if id == b_id));
    assert_eq!(p.b.connection_count(), 0);
    p.b.check_invariants().unwrap();
    // A REJ(timeout) with comm IDs 0 names nothing now: dropped and counted.
    let drops = p.b.counters().drops(CmDropReason::UnknownCommId);
    let mut rej0 = rej;
    (rej0.local_comm_id, rej0.remote_comm_id) = (0, 0);
    rej0.reason = RejReason::TIMEOUT;
    p.b.handle_mad(p.now, A_IP, &mad_of(CmMsgRepr::Rej(rej0)));
    assert_eq!(p.b.counters().drops(CmDropReason::UnknownCommId), drops + 1);
    // The same REQ again is a new request.
    p.b.handle_mad(p.now, A_IP, &mad_of(CmMsgRepr::Req(r)));
    assert!(matches!(
        p.b.poll_event(),
        Some(CmEvent::ConnectRequest { id, .. }) if id != b_id
    ));
    p.b.check_invariants().unwrap();
}

// The same with the MRA's timer ending the connection (no RTU within the MRA's service
// timeout: REJ(timeout) and Unreachable).
#[test]
fn rep_sent_mra_with_other_comm_id_then_timeout_leaves_no_entry_behind() {
    let (mut p, b_id, r) = rep_sent_for_comm_id_0_then_mra();
    // The REP keeps its retries after the MRA (kernel ib_modify_mad): the connection ends
    // when the last has waited out the MRA's time.
    let ev = loop {
        let deadline = p.b.poll_timeout().expect("a timer while the REP waits");
        p.advance_to(deadline);
        let _ = p.take_b();
        if let Some(ev) = p.b.poll_event() {
            break ev;
        }
    };
    assert_eq!(ev, CmEvent::Unreachable { id: b_id });
    assert_eq!(p.b.connection_count(), 0);
    p.b.check_invariants().unwrap();
    p.b.handle_mad(p.now, A_IP, &mad_of(CmMsgRepr::Req(r)));
    assert!(matches!(
        p.b.poll_event(),
        Some(CmEvent::ConnectRequest { .. })
    ));
    p.b.check_invariants().unwrap();
}

// Issue 25 item 3: the network says B has no CM (ICMP port unreachable for the REQ): A's
// connect ends with Unreachable at once, sends nothing more, and forgets the connection; a
// connection B has answered, and one to another peer, are left alone.
#[test]
fn req_sent_icmp_unreachable_reports_unreachable_at_once() {
    let (mut p, a_id, _req) = Pair::req_sent();
    let (mut q, a2, _b2, _) = Pair::established();
    assert_eq!(p.a.handle_unreachable(p.now, A_IP), 0);
    assert_eq!(p.a.state(a_id), Some(CmState::ReqSent));
    assert_eq!(p.a.handle_unreachable(p.now, B_IP), 1);
    assert_eq!(p.a.poll_event(), Some(CmEvent::Unreachable { id: a_id }));
    assert_eq!(p.a.state(a_id), None);
    assert_eq!(p.a.poll_mad(), None);
    assert_eq!(p.a.poll_timeout(), None);
    assert_eq!(p.a.counters().unreachable, 1);
    assert_eq!(q.a.handle_unreachable(q.now, B_IP), 0);
    assert_eq!(q.a.state(a2), Some(CmState::Established));
    q.a.check_invariants().unwrap();
    p.a.check_invariants().unwrap();
}

// ---- bounded and aged request state (issue 22 item 5) ----

/// A REQ from `src` (an address of the flood) with comm ID `comm`, for `SERVICE`, with the
/// timeouts and retries a hostile peer would choose (the largest the fields hold).
fn hostile_req(comm: u32) -> [u8; MAD_LEN] {
    let (p, _, req) = Pair::req_sent();
    drop(p);
    let CmMsgRepr::Req(mut r) = parse(&req[0]) else {
        panic!()
    };
    r.local_comm_id = comm;
    r.local_cm_response_timeout = 31;
    r.remote_cm_response_timeout = 31;
    r.max_cm_retries = 15;
    mad_of(CmMsgRepr::Req(r))
}

fn flood_ip(i: u32) -> IpAddr {
    IpAddr::V4(core::net::Ipv4Addr::from(0x0a01_0000 + i))
}

// kernel ucma_listen: a backlog of 0 or above max_backlog (1024) is max_backlog.
#[test]
fn idle_listen_backlog_is_clamped_as_ucma_does() {
    let mut e = CmEngine::new(config(B_IP, 1));
    e.listen(1).unwrap();
    e.listen_with_backlog(2, 0).unwrap();
    e.listen_with_backlog(3, 5000).unwrap();
    e.listen_with_backlog(4, 7).unwrap();
    assert_eq!(
        [1, 2, 3, 4].map(|s| e.backlog(s)),
        [Some(1024), Some(1024), Some(1024), Some(7)]
    );
    assert_eq!(e.listen_with_backlog(4, 1), Err(CmError::AddrInUse));
    assert!(e.unlisten(4));
    assert_eq!(e.backlog(4), None);
    let listened: Vec<_> = e.listened().collect();
    assert_eq!(listened, [(1, 1024), (2, 1024), (3, 1024)]);
}

// kernel ucma_event_handler + cm_destroy_id(-ENOMEM): a REQ beyond the backlog is dropped
// without a REJ, so that the peer's retry may find room once the application answers.
#[test]
fn req_rcvd_beyond_backlog_is_dropped_without_rej_and_a_retry_finds_room() {
    let mut p = Pair::new();
    p.b.unlisten(SERVICE);
    p.b.listen_with_backlog(SERVICE, 2).unwrap();
    for comm in [0x100, 0x101] {
        p.b.handle_mad(p.now, A_IP, &hostile_req(comm));
    }
    let first = p.b.poll_event().unwrap().id();
    assert!(p.b.poll_event().is_some());
    assert_eq!(p.b.pending_requests(SERVICE), 2);
    p.b.handle_mad(p.now, A_IP, &hostile_req(0x102));
    assert_eq!(p.b.counters().drops(CmDropReason::BacklogFull), 1);
    assert_eq!((p.take_b().len(), p.b.poll_event()), (0, None));
    assert_eq!(p.b.connection_count(), 2);
    // Accepting one frees its slot (REP_SENT is not pending); the retried REQ gets in.
    p.b.accept(p.now, first, &accept_params()).unwrap();
    p.take_b();
    assert_eq!(p.b.pending_requests(SERVICE), 1);
    p.b.handle_mad(p.now, A_IP, &hostile_req(0x102));
    assert!(matches!(
        p.b.poll_event(),
        Some(CmEvent::ConnectRequest { .. })
    ));
    p.b.check_invariants().unwrap();
}

// kernel cm_destroy_id in SIDR_REQ_RCVD: a SIDR_REQ beyond the backlog gets IB_SIDR_REJECT.
#[test]
fn sidr_req_rcvd_beyond_backlog_gets_sidr_rep_reject() {
    let mut p = Pair::new();
    let udp = rdma_cm_service_id(port_space::UDP, 7174);
    p.b.listen_with_backlog(udp, 1).unwrap();
    p.a.sidr_request(p.now, B_IP, udp, &[]).unwrap();
    let second = p.a.sidr_request(p.now, B_IP, udp, &[]).unwrap();
    let reqs = p.take_a();
    p.deliver_b(&reqs);
    assert!(matches!(
        p.b.poll_event(),
        Some(CmEvent::SidrRequest { .. })
    ));
    let rep = p.take_b();
    assert_eq!(rep.len(), 1);
    p.deliver_a(&rep);
    let Some(CmEvent::SidrResponse { id, rep }) = p.a.poll_event() else {
        panic!()
    };
    assert_eq!((id, rep.status), (second, SidrStatus::REJECT));
    assert_eq!(p.b.counters().drops(CmDropReason::BacklogFull), 1);
}

// A request the application never answers is aged out once the peer has given up: after
// every try of the REQ's remote CM response timeout. REJ(timeout), Unreachable, gone.
#[test]
fn req_rcvd_unanswered_ages_out_when_the_peer_has_given_up() {
    let (mut p, a_id, b_id, _) = Pair::req_rcvd();
    // The REQ says: 3 retries, remote response timeout 10.
    let age = p.b.response_timeout(10) * 4;
    assert_eq!(p.b.poll_timeout(), Some(Instant::ZERO + age));
    // A gives up no later: it waits as long, its 3 retries included, and started first.
    let mut t = Instant::ZERO;
    while p.a.state(a_id).is_some() {
        t = p.a.poll_timeout().unwrap();
        p.a.handle_timeout(t);
    }
    assert!(t <= Instant::ZERO + age);
    p.b.handle_timeout(Instant::ZERO + (age - Duration::from_nanos(1)));
    assert_eq!(p.b.state(b_id), Some(CmState::ReqRcvd));
    p.b.handle_timeout(Instant::ZERO + age);
    assert_eq!(p.b.poll_event(), Some(CmEvent::Unreachable { id: b_id }));
    let rej = p.take_b();
    let CmMsgRepr::Rej(r) = parse(&rej[0]) else {
        panic!()
    };
    assert_eq!(
        (r.reason, r.message_rejected, r.remote_comm_id),
        (RejReason::TIMEOUT, msg_ref::REQ, a_id.0)
    );
    assert_eq!((p.b.connection_count(), p.b.poll_timeout()), (0, None));
    p.b.check_invariants().unwrap();
}

// After an MRA the peer waits the MRA's service timeout at each try: the request ages out
// that long after the last duplicate REQ.
#[test]
fn mra_req_sent_ages_out_after_the_mra_wait_from_the_last_duplicate() {
    let (mut p, _a_id, b_id, req) = Pair::req_rcvd();
    let mra_age = p.b.response_timeout(p.b.config().mra_service_timeout) * 4;
    p.now = Instant::ZERO + Duration::from_millis(5);
    p.deliver_b(&req);
    assert_eq!(p.b.state(b_id), Some(CmState::MraReqSent));
    assert_eq!(p.b.poll_timeout(), Some(p.now + mra_age));
    p.now = Instant::ZERO + Duration::from_millis(9);
    p.deliver_b(&req);
    let deadline = p.now + mra_age;
    assert_eq!(p.b.poll_timeout(), Some(deadline));
    p.take_b();
    p.b.handle_timeout(deadline);
    assert_eq!(p.b.poll_event(), Some(CmEvent::Unreachable { id: b_id }));
    assert_eq!(p.b.connection_count(), 0);
}

// MAX_PEER_CM_RESPONSE_TIMEOUT: the timeouts a REQ chooses count as at most 24, both for
// aging the request and for waiting for the RTU after our REP.
#[test]
fn req_rcvd_hostile_timeouts_are_capped() {
    let mut p = Pair::new();
    p.b.handle_mad(p.now, A_IP, &hostile_req(0x77));
    let Some(CmEvent::ConnectRequest { id, .. }) = p.b.poll_event() else {
        panic!()
    };
    let per_try = p.b.response_timeout(MAX_PEER_CM_RESPONSE_TIMEOUT);
    assert_eq!(p.b.poll_timeout(), Some(p.now + per_try * 16));
    p.b.accept(p.now, id, &accept_params()).unwrap();
    assert_eq!(p.b.poll_timeout(), Some(p.now + per_try));
    // Retries 15, then REJ(timeout): about 18.5 min with rdma_cm's packet lifetime, not 39 h.
    let mut t = p.now;
    for _ in 0..=15 {
        t = p.b.poll_timeout().unwrap();
        p.b.handle_timeout(t);
    }
    assert_eq!(t, Instant::ZERO + per_try * 16);
    assert_eq!(p.b.poll_event(), Some(CmEvent::Unreachable { id }));
    assert_eq!(p.b.connection_count(), 0);
}

// kernel cm_mra_handler: an MRA's service timeout is capped like a REQ's, and a second MRA
// for the same message is a counted duplicate that does not stretch the wait again.
#[test]
fn mra_req_rcvd_capped_and_a_duplicate_mra_does_not_stretch_the_wait() {
    let (mut p, a_id, b_id, _) = Pair::req_rcvd();
    let mra = || MraRepr {
        local_comm_id: b_id.0,
        remote_comm_id: a_id.0,
        message_mraed: msg_ref::REQ,
        service_timeout: 31,
        private_data: [0; 222],
    };
    let m = mra();
    p.a.handle_mad(p.now, B_IP, &mad_of(CmMsgRepr::Mra(m)));
    let wait = p.a.response_timeout(MAX_PEER_CM_RESPONSE_TIMEOUT);
    let deadline = p.now + wait;
    assert_eq!(p.a.poll_timeout(), Some(deadline));
    p.now = p.now + (wait - Duration::from_millis(1));
    p.a.handle_mad(p.now, B_IP, &mad_of(CmMsgRepr::Mra(m)));
    assert_eq!(p.a.counters().drops(CmDropReason::DuplicateMra), 1);
    assert_eq!(p.a.poll_timeout(), Some(deadline));
    // The REQ keeps its retries (kernel ib_modify_mad), each waiting the stretched time;
    // after the last, Unreachable. So a peer's MRAs hold the connection at most
    // (retries + 1) x the capped wait.
    let _ = p.take_a();
    let mut t = deadline;
    let mut resent = 0;
    p.a.handle_timeout(t);
    loop {
        if let Some(ev) = p.a.poll_event() {
            assert_eq!(ev, CmEvent::Unreachable { id: a_id });
            break;
        }
        let mads = p.take_a();
        assert_eq!(mads.len(), 1);
        assert_eq!(attr_of(&mads[0]), attr::REQ);
        resent += 1;
        assert_eq!(p.a.poll_timeout(), Some(t + wait));
        t = t + wait;
        p.a.handle_timeout(t);
    }
    assert_eq!(resent, u32::from(p.a.config().max_cm_retries));
}

// A REQ flood: 10,000 REQs from 10,000 addresses with the largest timeouts, against rdma_cm's
// real timers and table size. The listener holds at most its backlog, the rest are dropped
// and counted; the engine's own connect still works; a legitimate REQ that finds the backlog
// full is dropped like the rest, and once the flood has aged out it goes through.
#[test]
fn idle_req_flood_is_bounded_aged_and_a_legitimate_connect_goes_through() {
    let mut a = CmEngine::new(CmConfig::new(A_IP, 0xaaaa, 0xaaaa));
    let mut b = CmEngine::new(CmConfig::new(B_IP, 0xbbbb, 0xbbbb));
    b.listen(SERVICE).unwrap();
    let mut now = Instant::ZERO;
    for i in 0..10_000 {
        b.handle_mad(now, flood_ip(i), &hostile_req(i));
    }
    assert_eq!(b.connection_count(), UCMA_MAX_BACKLOG);
    assert_eq!(b.pending_requests(SERVICE), UCMA_MAX_BACKLOG);
    assert_eq!(
        b.counters().drops(CmDropReason::BacklogFull),
        10_000 - UCMA_MAX_BACKLOG as u64
    );
    b.check_invariants().unwrap();
    // The engine's own connect is not starved.
    let mut cp = connect_params();
    cp.peer = IpAddr::V4(core::net::Ipv4Addr::new(10, 0, 0, 9));
    let own = b.connect(now, &cp).unwrap();
    b.cancel(now, own).unwrap();
    // A legitimate REQ while the backlog is full: dropped, no answer.
    let drain = |e: &mut CmEngine| std::iter::from_fn(|| e.poll_mad()).collect::<Vec<_>>();
    let drain_ev = |e: &mut CmEngine| std::iter::from_fn(|| e.poll_event()).count();
    drain(&mut b);
    drain_ev(&mut b);
    a.connect(now, &connect_params()).unwrap();
    for m in drain(&mut a) {
        b.handle_mad(now, A_IP, &m.mad[..]);
    }
    assert!(drain(&mut b).is_empty());
    // The flood ages out at 16 tries of the capped timeout; every request goes, with a
    // REJ(timeout) each and an Unreachable the frontend uses to drop it from its queue.
    let age = b.response_timeout(MAX_PEER_CM_RESPONSE_TIMEOUT) * 16;
    now = Instant::ZERO + age;
    a.handle_timeout(now);
    b.handle_timeout(now);
    assert_eq!(b.pending_requests(SERVICE), 0);
    assert_eq!(drain_ev(&mut b), UCMA_MAX_BACKLOG);
    assert_eq!(b.connection_count(), 0);
    drain(&mut b);
    drain_ev(&mut a);
    drain(&mut a);
    // Now the legitimate connection goes through.
    let a_id = a.connect(now, &connect_params()).unwrap();
    for m in drain(&mut a) {
        b.handle_mad(now, A_IP, &m.mad[..]);
    }
    let Some(CmEvent::ConnectRequest { id: b_id, .. }) = b.poll_event() else {
        panic!("the legitimate REQ gets no ConnectRequest")
    };
    b.accept(now, b_id, &accept_params()).unwrap();
    for m in drain(&mut b) {
        a.handle_mad(now, B_IP, &m.mad[..]);
    }
    assert!(matches!(
        a.poll_event(),
        Some(CmEvent::ConnectResponse { .. })
    ));
    a.establish(now, a_id).unwrap();
    for m in drain(&mut a) {
        b.handle_mad(now, A_IP, &m.mad[..]);
    }
    assert_eq!(b.poll_event(), Some(CmEvent::Established { id: b_id }));
    b.check_invariants().unwrap();
}
