//! The `rdmacm_driver` fuzz check on stable: every file in `fuzz/seeds_rdmacm/` goes through
//! the same check as the cargo-fuzz target (`fuzz/src/rdmacm.rs`, included below):
//! librdmacm.so.1's CM driver and rdma_* calls on the in-memory bench
//! (`softroce_rdmacm::testing`), against a peer CM engine. Files named `seed-*` are written
//! by `write_rdmacm_seeds` (ignored; `seeds_are_current` keeps them equal to what it would
//! write); `regress-*` files are fuzz findings, only run.

#[path = "../fuzz/src/rdmacm.rs"]
mod rdmacm;

use rdmacm::{Op, Rig};
use softroce::cm::CmState;
use std::path::PathBuf;

fn seed_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds_rdmacm")
}

// `Op::Lib` calls (see `Rig::lib`) and `Op::Peer` calls (`Rig::peer`).
const CREATE_QP: u8 = 10;
const ACCEPT: u8 = 5;
const REJECT: u8 = 6;
const ESTABLISH: u8 = 7;
const DISCONNECT: u8 = 8;
const DESTROY: u8 = 9;
const CONNECT_FLOW: u8 = 13;
const LISTEN_FLOW: u8 = 14;
const P_CONNECT: u8 = 0;
const P_ACCEPT: u8 = 1;
const P_ESTABLISH: u8 = 3;
const P_DISCONNECT: u8 = 4;
const P_SIDR_REQUEST: u8 = 5;
const P_SIDR_REPLY: u8 = 6;
// `connect_flow` / `listen_flow` arguments.
const UDP: u8 = 0x40;
const NO_QP: u8 = 0x20;
const TO_C: u8 = 0x80;
const LISTEN_UDP: u8 = 1;

fn lib(call: u8, id: u8, arg: u8) -> Op {
    Op::Lib { call, id, arg }
}

fn peer(call: u8, conn: u8, arg: u8) -> Op {
    Op::Peer { call, conn, arg }
}

fn to_l(how: u8) -> Op {
    Op::Deliver { to_l: true, how }
}

fn to_p(how: u8) -> Op {
    Op::Deliver { to_l: false, how }
}

/// A REQ (kind 0) or SIDR_REQ (7) to L's service `service` from `SOURCES[src]` with comm ID
/// pool index `local` and cma header variant `cma`, cut to `cut` bytes (0: whole).
fn req(kind: u8, src: u8, local: u8, service: u8, cma: u8, cut: u8) -> Op {
    Op::Mad {
        src,
        kind,
        local,
        remote: 0,
        service,
        tid: 0,
        a: cma,
        b: 0x40,
        cut,
        flips: vec![],
    }
}

/// P connects to L's listener; L accepts with a QP; P establishes; L disconnects, P answers;
/// both leave TIMEWAIT; L destroys its ids, and its service lingers, then ends.
fn accept() -> Vec<Op> {
    vec![
        lib(LISTEN_FLOW, 0, 0), // id 0: TCP 10.0.0.2:7174
        peer(P_CONNECT, 0, 0),
        to_l(0), // CONNECT_REQUEST: id 1
        lib(CREATE_QP, 1, 0),
        lib(ACCEPT, 1, 0), // RTR, RTS, REP
        to_p(0),
        peer(P_ESTABLISH, 0, 0),
        to_l(0), // RTU: ESTABLISHED
        lib(DISCONNECT, 1, 0),
        to_p(0),
        peer(P_DISCONNECT, 0, 0),
        to_l(0), // DREP: DISCONNECTED
        Op::NextTimer,
        Op::NextTimer, // TIMEWAIT_EXIT
        lib(DESTROY, 1, 0),
        lib(DESTROY, 0, 0),
        Op::NextTimer, // the linger ends
    ]
}

/// L connects to P with a QP (the REP goes to the QP, then the RTU), P disconnects, L
/// answers; then a connect without a QP (CONNECT_RESPONSE, then rdma_establish).
fn connect() -> Vec<Op> {
    vec![
        lib(CONNECT_FLOW, 0, 0), // id 0: ADDR_RESOLVED, ROUTE_RESOLVED, REQ
        to_p(0),
        peer(P_ACCEPT, 0, 0),
        to_l(0), // REP: RTR, RTS, RTU, ESTABLISHED
        to_p(0),
        peer(P_DISCONNECT, 0, 0),
        to_l(0), // DISCONNECTED
        lib(DISCONNECT, 0, 0),
        to_p(0),
        lib(CONNECT_FLOW, 0, NO_QP), // id 1
        to_p(0),
        peer(P_ACCEPT, 1, 0),
        to_l(0), // CONNECT_RESPONSE
        lib(ESTABLISH, 1, 0),
        to_p(0),
        Op::NextTimer,
        Op::NextTimer,
    ]
}

/// REQs for L's listener whose rdma_cm IP header is right, names another address, has CMA
/// version 1, IPv4 addresses under IP version 6, IPv6 addresses, IP version 5, is all zero,
/// is missing (all but the first get REJ 28); a right one cut inside its header (REJ 28: the
/// rest reads as zeros); L rejects the good one.
fn bad_cma() -> Vec<Op> {
    let mut ops = vec![lib(LISTEN_FLOW, 0, 0)];
    for cma in 0..8 {
        ops.push(req(0, cma / 4, cma % 4, 0, cma, 0));
    }
    ops.push(req(0, 2, 0, 0, 0, 180));
    ops.push(lib(REJECT, 1, 1));
    ops.push(Op::NextTimer);
    ops
}

/// P's SIDR_REQ to L's UDP listener, accepted; L's SIDR_REQ to P, answered; a SIDR_REQ to
/// L whose cma header is missing (SIDR_REP reject, no id).
fn sidr() -> Vec<Op> {
    vec![
        lib(LISTEN_FLOW, 0, LISTEN_UDP), // id 0: UDP 10.0.0.2:7174
        peer(P_SIDR_REQUEST, 0, 0),
        to_l(0), // CONNECT_REQUEST: id 1
        lib(CREATE_QP, 1, 0),
        lib(ACCEPT, 1, 0), // SIDR_REP
        to_p(0),
        lib(CONNECT_FLOW, 0, UDP), // id 2: a UD QP, SIDR_REQ to P
        to_p(0),
        peer(P_SIDR_REPLY, 0, 0),
        to_l(0),               // ESTABLISHED (UD)
        req(7, 0, 1, 2, 7, 0), // SIDR_REQ without a cma header: SIDR_REP(reject)
        lib(REJECT, 3, 0),     // (an id that does not exist: on the listener, EINVAL)
        Op::NextTimer,
    ]
}

/// L's listener goes away: P's REQ is parked while the service lingers, a new listener takes
/// it (and rejects it); a REQ parked again gets REJ 8 when the linger ends.
fn linger() -> Vec<Op> {
    vec![
        lib(LISTEN_FLOW, 0, 0),
        lib(DESTROY, 0, 0), // the service lingers
        peer(P_CONNECT, 0, 0),
        to_l(0),                // parked
        lib(LISTEN_FLOW, 0, 0), // id 0 again: CONNECT_REQUEST, id 1
        lib(REJECT, 1, 0),
        to_p(0),
        lib(DESTROY, 0, 0),
        peer(P_CONNECT, 0, 0),
        to_l(0), // parked
        Op::NextTimer,
        Op::NextTimer, // the linger ends: REJ 8
        to_p(0),
    ]
}

/// A connect to C (nobody): the ICMP "unreachable" ends it; a connect to P whose REQ is
/// lost: retries, then UNREACHABLE.
fn unreachable() -> Vec<Op> {
    let mut ops = vec![
        lib(CONNECT_FLOW, 0, TO_C),
        Op::Unreachable { src: 1 },
        lib(CONNECT_FLOW, 0, 0),
    ];
    ops.extend(std::iter::repeat_n(Op::NextTimer, 18));
    ops
}

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("accept", rdmacm::encode(&accept())),
        ("connect", rdmacm::encode(&connect())),
        ("bad-cma", rdmacm::encode(&bad_cma())),
        ("sidr", rdmacm::encode(&sidr())),
        ("linger", rdmacm::encode(&linger())),
        ("unreachable", rdmacm::encode(&unreachable())),
    ]
}

/// Writes `fuzz/seeds_rdmacm/seed-*`.
#[test]
#[ignore = "writes fuzz/seeds_rdmacm; run by hand after the seeds change"]
fn write_rdmacm_seeds() {
    std::fs::create_dir_all(seed_dir()).unwrap();
    for (name, data) in seeds() {
        std::fs::write(seed_dir().join(format!("seed-{name}")), data).unwrap();
    }
}

/// Every file in `fuzz/seeds_rdmacm/` passes the check.
#[test]
fn rdmacm_fuzz_seeds_replay() {
    let mut n = 0;
    for e in std::fs::read_dir(seed_dir()).expect("fuzz/seeds_rdmacm exists") {
        let p = e.expect("dir entry").path();
        let data = std::fs::read(&p).expect("read seed");
        eprintln!("{}", p.display());
        rdmacm::check_rdmacm(&data);
        n += 1;
    }
    assert!(
        n >= seeds().len(),
        "seeds missing in {}",
        seed_dir().display()
    );
}

/// The committed `seed-*` files are what `write_rdmacm_seeds` writes, and decode to their
/// ops.
#[test]
fn seeds_are_current() {
    for (name, data) in seeds() {
        let stored = std::fs::read(seed_dir().join(format!("seed-{name}"))).expect("committed");
        assert_eq!(stored, data, "fuzz/seeds_rdmacm/seed-{name} is stale");
        assert_eq!(rdmacm::encode(&Op::decode(&data)), data, "seed-{name}");
    }
}

/// A rig that ran `ops`.
fn run(ops: &[Op]) -> Rig {
    let mut rig = Rig::new();
    for op in ops {
        rig.step(op);
    }
    rig
}

/// The seeds reach what they are for: an accepted and an active connection established,
/// the bad cma headers refused, a parked REQ taken by the next listener.
#[test]
fn seeds_reach_their_states() {
    let ops = accept();
    let rig = run(&ops[..8]);
    let ids = rig.bench.ids();
    assert_eq!(ids.len(), 2);
    assert_eq!(rig.bench.conn_state(ids[1]), Some(CmState::Established));
    drop(rig);

    let ops = connect();
    let rig = run(&ops[..4]);
    assert_eq!(
        rig.bench.conn_state(rig.bench.ids()[0]),
        Some(CmState::Established)
    );
    drop(rig);

    // Of the nine REQs only the one with a right header made an id.
    let rig = run(&bad_cma()[..10]);
    assert_eq!(rig.bench.ids().len(), 2);
    drop(rig);

    let mut rig = run(&linger()[..4]);
    assert_eq!(rig.bench.ids().len(), 0, "the REQ is parked");
    rig.step(&linger()[4]);
    assert_eq!(rig.bench.ids().len(), 2, "the new listener took it");
}

/// A listener destroyed with a CONNECT_REQUEST the application has not taken: the event
/// goes, its new id is destroyed and the request refused (kernel ucma_cleanup_ctx_events);
/// before, the event stayed queued naming the freed listener (a fuzz finding,
/// seeds_rdmacm/regress-listener-destroyed-with-queued-request).
#[test]
fn a_destroyed_listeners_untaken_requests_are_refused() {
    let hold = |op| Op::Hold(Box::new(op));
    let mut rig = run(&[
        lib(LISTEN_FLOW, 0, 0),
        peer(P_CONNECT, 0, 0),
        hold(to_l(0)),
        hold(peer(P_CONNECT, 0, 0)),
        hold(to_l(0)),
    ]);
    assert_eq!((rig.bench.queued_events(), rig.bench.ids().len()), (2, 1));
    rig.step(&hold(lib(DESTROY, 0, 0)));
    assert_eq!((rig.bench.queued_events(), rig.bench.ids().len()), (0, 0));
    assert_eq!(rig.peer.connections().count(), 2);
    rig.step(&to_p(0));
    assert_eq!(rig.peer.connections().count(), 0, "both REQs were rejected");
}

/// An rdma_reject or rdma_accept that fails leaves the id its connection and request:
/// rdma_reject of an established connection is EINVAL and the id can still disconnect it;
/// rdma_accept with too much private data (RC: 196 bytes, SIDR: 136) is EINVAL and a
/// second rdma_accept succeeds. Before, the id forgot its connection first, leaving it in
/// the engine with no id (a fuzz finding, seeds_rdmacm/regress-reject-established).
#[test]
fn a_failed_reject_or_accept_keeps_the_connection() {
    let mut rig = run(&connect()[..4]);
    let id = rig.bench.ids()[0];
    assert_eq!(rig.bench.reject(id, &[]), Err(libc::EINVAL));
    assert_eq!(rig.bench.conn_state(id), Some(CmState::Established));
    rig.bench.check_invariants().unwrap();
    rig.bench.disconnect(id).unwrap();
    assert_eq!(rig.bench.conn_state(id), Some(CmState::DreqSent));
    drop(rig); // (one bench at a time)

    let too_long = softroce_rdmacm::testing::ConnParam {
        private_data: vec![7; 200],
        ..Default::default()
    };
    for listen in [0, LISTEN_UDP] {
        let mut rig = run(&[
            lib(LISTEN_FLOW, 0, listen),
            peer(P_CONNECT + 5 * listen, 0, 0),
        ]);
        rig.step(&to_l(0));
        let id = rig.bench.ids()[1];
        assert_eq!(rig.bench.accept(id, Some(&too_long)), Err(libc::EINVAL));
        let want = if listen == 0 {
            CmState::ReqRcvd
        } else {
            CmState::SidrReqRcvd
        };
        assert_eq!(rig.bench.conn_state(id), Some(want));
        rig.bench.check_invariants().unwrap();
        rig.bench.accept(id, None).unwrap();
        let want = if listen == 0 {
            Some(CmState::RepSent)
        } else {
            None
        };
        assert_eq!(rig.bench.conn_state(id), want);
    }
}

/// Runs the file `$RDMACM_FUZZ_INPUT` (a fuzz finding, say) through the check on stable.
#[test]
#[ignore = "runs the file named by RDMACM_FUZZ_INPUT"]
fn replay_input() {
    let path = std::env::var_os("RDMACM_FUZZ_INPUT").expect("RDMACM_FUZZ_INPUT names a file");
    let data = std::fs::read(&path).expect("read the input");
    for op in Op::decode(&data) {
        eprintln!("{op:?}");
    }
    rdmacm::check_rdmacm(&data);
}

/// rdma_connect needs a route the application resolved: an id only bound, and a passive
/// id (whose address is what its peer's rdma_cm header says), are EINVAL, and a passive id
/// resolves nothing. Before, a passive id whose request had ended sent a REQ to the
/// address a cut header named, 10.0.0.0 (a fuzz finding,
/// seeds_rdmacm/regress-connect-from-passive-id).
#[test]
fn rdma_connect_needs_a_resolved_route() {
    let mut rig = run(&[lib(LISTEN_FLOW, 0, 0), peer(P_CONNECT, 0, 0), to_l(0)]);
    let (listener, passive) = (rig.bench.ids()[0], rig.bench.ids()[1]);
    rig.bench.reject(passive, &[]).unwrap();
    let p_addr = std::net::SocketAddr::new(rdmacm::P_IP, rdmacm::P_PORT);
    for id in [listener, passive] {
        assert_eq!(rig.bench.connect(id, None), Err(libc::EINVAL));
        assert_eq!(rig.bench.resolve(id, p_addr), Err(libc::EINVAL));
    }
    let bound = rig
        .bench
        .create_id(softroce_rdmacm::abi::RDMA_PS_TCP)
        .unwrap();
    let l_addr = std::net::SocketAddr::new(rdmacm::L_IP, 0);
    rig.bench.bind(bound, l_addr).unwrap();
    assert_eq!(rig.bench.connect(bound, None), Err(libc::EINVAL));
    rig.bench.resolve(bound, p_addr).unwrap();
    rig.bench.connect(bound, None).unwrap();
    assert_eq!(rig.bench.conn_state(bound), Some(CmState::ReqSent));
    assert!(
        rig.bench
            .take_sent()
            .iter()
            .all(|(to, _)| *to == rdmacm::P_IP)
    );
}

/// A SIDR_REQ for L's UDP listener is a CONNECT_REQUEST only with an rdma_cm header that
/// names L; every other header (another address, CMA version 1, IPv4 under IP version 6,
/// IPv6, IP version 5, zero, none) gets SIDR_REP(reject) and makes no id, as the kernel
/// (cma_ib_id_from_event finds no listener, cm_destroy_id rejects), and as a REQ gets REJ 28.
#[test]
fn a_sidr_req_whose_cma_header_names_another_address_is_rejected() {
    use softroce::wire::cm::{CmMadRepr, CmMsgRepr, SidrStatus};
    use softroce::wire::mad::MadHdrRepr;
    for cma in 0..8 {
        let mut rig = run(&[lib(LISTEN_FLOW, 0, LISTEN_UDP)]);
        // SIDR_REQ (kind 7) for UDP 7174 (service 2) from P, request ID 1, header `cma`.
        let msg = rig.build(rdmacm::P_IP, 7, (1, 0), 2, cma, 0x40);
        let mad = CmMadRepr {
            hdr: MadHdrRepr::cm(1, msg.attr_id()),
            msg,
        };
        rig.bench.deliver(rdmacm::P_IP, &mad.to_bytes()).unwrap();
        rig.bench.check_invariants().unwrap();
        let sent: Vec<_> = rig.bench.take_sent();
        let statuses: Vec<_> = sent
            .iter()
            .filter_map(|(_, m)| match CmMadRepr::parse(&m[..]).map(|p| p.msg) {
                Ok(CmMsgRepr::SidrRep(r)) => Some(r.status),
                _ => None,
            })
            .collect();
        if cma == 0 {
            assert_eq!((rig.bench.queued_events(), statuses.len()), (1, 0));
        } else {
            assert_eq!(rig.bench.queued_events(), 0, "header variant {cma}");
            assert_eq!(statuses, [SidrStatus::REJECT], "header variant {cma}");
        }
    }
}
