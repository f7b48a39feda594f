//! The CM engine fuzz check on stable: every file in `fuzz/seeds_cm/` goes through the same
//! check as the cargo-fuzz target `cm_engine` (`fuzz/src/cm.rs`, included below). Files named
//! `seed-*` are written by `write_cm_seeds` (ignored; `seeds_are_current` keeps them equal to
//! what it would write); `regress-*` files are fuzz findings, only run.

#[path = "../fuzz/src/cm.rs"]
mod cm;

use cm::{Op, Rig};
use softroce::cm::CmState;
use std::path::PathBuf;

fn seed_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds_cm")
}

// Pool indices (see `Rig::id`): 0 = comm ID 0, 3 = 0x5eed, 4 = the first ID an engine
// reported or sent, 5 = the second. Peer indices (`cm::PEERS`): 0 = A, 1 = B, 2 = C.
const ID_0: u8 = 0;
const ID_5EED: u8 = 3;
const FIRST: u8 = 4;
const SECOND: u8 = 5;
const TO_B: u8 = 1;

fn api(on_b: bool, call: u8, id: u8, arg: u8) -> Op {
    Op::Api {
        on_b,
        call,
        id,
        arg,
    }
}

fn mad(kind: u8, local: u8, remote: u8, a: u8, b: u8) -> Op {
    Op::Mad {
        to_b: true,
        src: 0,
        kind,
        local,
        remote,
        service: 0,
        tid: 0,
        a,
        b,
        flips: vec![],
    }
}

fn deliver(from_b: bool, how: u8) -> Op {
    Op::Deliver { from_b, how }
}

/// A connects to B, B accepts, A establishes, A disconnects, B answers, both leave TIMEWAIT.
fn handshake() -> Vec<Op> {
    vec![
        api(false, 0, TO_B, 0), // A: connect to B, SERVICE (A's REQ: pool 4 = A's ID)
        deliver(false, 0),      // B: ConnectRequest (pool 5 = B's ID)
        api(true, 1, SECOND, 0),
        deliver(true, 0),
        api(false, 3, FIRST, 0), // A: establish
        deliver(false, 0),
        api(false, 4, FIRST, 0), // A: disconnect
        deliver(false, 0),
        api(true, 4, SECOND, 0), // B: DREP
        deliver(true, 0),
        Op::NextTimer,
        Op::NextTimer,
    ]
}

/// The sequence of the comm-ID-0 bug: a REQ with local comm ID 0, accepted; an MRA for the
/// REP with local comm ID 0x5eed; a REJ; the same REQ again (it used to find the stale
/// `by_remote` entry of the connection the REJ removed and panic).
fn comm_id_0_mra() -> Vec<Op> {
    vec![
        mad(0, ID_0, ID_0, 0x50, 0x3a), // REQ, comm ID 0 (B's ConnectRequest: pool 4)
        api(true, 1, FIRST, 0),         // B: accept
        mad(1, ID_5EED, FIRST, 1, 10),  // MRA for the REP
        mad(2, ID_5EED, FIRST, 1, 1),   // REJ, consumer defined
        mad(0, ID_0, ID_0, 0x50, 0x3a), // the REQ again
    ]
}

/// A SIDR_REQ from A, answered by B.
fn sidr() -> Vec<Op> {
    vec![
        api(false, 8, TO_B, 1), // A: sidr_request to B, SIDR_SERVICE
        deliver(false, 2),      // delivered twice: B drops the duplicate
        api(true, 9, SECOND, 0),
        deliver(true, 0),
    ]
}

/// A REQ that is lost: retransmitted, then REJ(timeout) and Unreachable; a REQ from C that
/// nobody answers; then the clock runs on.
fn timeouts() -> Vec<Op> {
    let mut ops = vec![
        api(false, 0, TO_B, 0),
        deliver(false, 3),
        Op::Mad {
            to_b: true,
            src: 2,
            kind: 0,
            local: 1,
            remote: 0,
            service: 0,
            tid: 0,
            a: 0xff,
            b: 0xff,
            flips: vec![],
        },
    ];
    ops.extend(std::iter::repeat_n(Op::NextTimer, 8));
    ops.push(Op::Advance { exp: 31 });
    ops
}

/// A duplicate REQ draws an MRA; the MRA reaches A; B accepts; the REP is lost and resent.
fn dup_req_mra() -> Vec<Op> {
    vec![
        api(false, 0, TO_B, 0),
        deliver(false, 2),
        deliver(true, 0),
        api(true, 1, SECOND, 0),
        deliver(true, 3),
        Op::NextTimer,
        deliver(true, 0),
        api(false, 3, FIRST, 0),
        deliver(false, 0),
    ]
}

/// REQs from three peers with the fixed comm IDs fill B's table; then B connects to A.
fn fill() -> Vec<Op> {
    let mut ops = Vec::new();
    for src in 0..3 {
        for local in 0..4 {
            ops.push(Op::Mad {
                to_b: true,
                src,
                kind: 0,
                local,
                remote: 0,
                service: 0,
                tid: 0,
                a: 0,
                b: 0,
                flips: vec![],
            });
        }
    }
    ops.push(api(true, 0, 0, 0));
    ops.push(api(false, 6, 0, 0)); // A listens on SERVICE
    ops.push(deliver(true, 0));
    ops
}

/// B relistens with backlog 2; four REQs from A (two dropped), B accepts one, a dropped one
/// is retried and gets in; the rest age out.
fn backlog() -> Vec<Op> {
    let mut ops = vec![api(true, 7, 0, 0), api(true, 11, 2, 0)];
    for local in 0..4 {
        ops.push(mad(0, local, 0, 0, 0x3a));
    }
    ops.push(api(true, 1, FIRST, 0));
    ops.push(mad(0, 2, 0, 0, 0x3a));
    ops.extend(std::iter::repeat_n(Op::NextTimer, 4));
    ops
}

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("handshake", cm::encode(&handshake())),
        ("comm-id-0-mra", cm::encode(&comm_id_0_mra())),
        ("sidr", cm::encode(&sidr())),
        ("timeouts", cm::encode(&timeouts())),
        ("dup-req-mra", cm::encode(&dup_req_mra())),
        ("fill", cm::encode(&fill())),
        ("backlog", cm::encode(&backlog())),
    ]
}

/// Writes `fuzz/seeds_cm/seed-*`.
#[test]
#[ignore]
fn write_cm_seeds() {
    std::fs::create_dir_all(seed_dir()).unwrap();
    for (name, data) in seeds() {
        std::fs::write(seed_dir().join(format!("seed-{name}")), data).unwrap();
    }
}

/// Every file in `fuzz/seeds_cm/` passes the CM fuzz check.
#[test]
fn cm_fuzz_seeds_replay() {
    let mut n = 0;
    for e in std::fs::read_dir(seed_dir()).expect("fuzz/seeds_cm exists") {
        let p = e.expect("dir entry").path();
        let data = std::fs::read(&p).expect("read seed");
        cm::check_cm(&data);
        n += 1;
    }
    assert!(
        n >= seeds().len(),
        "seeds missing in {}",
        seed_dir().display()
    );
}

/// The committed `seed-*` files are what `write_cm_seeds` writes, and decode to their ops.
#[test]
fn seeds_are_current() {
    for (name, data) in seeds() {
        let stored = std::fs::read(seed_dir().join(format!("seed-{name}"))).expect("committed");
        assert_eq!(stored, data, "fuzz/seeds_cm/seed-{name} is stale");
    }
    assert_eq!(Op::decode(&cm::encode(&handshake())), handshake());
}

/// The handshake seed gets both sides to ESTABLISHED and through TIMEWAIT.
#[test]
fn handshake_seed_connects_and_disconnects() {
    let ops = handshake();
    let mut rig = Rig::new();
    for op in &ops[..6] {
        rig.step(op);
    }
    let states: Vec<_> = rig.a.connections().chain(rig.b.connections()).collect();
    assert_eq!(states.len(), 2);
    assert!(states.iter().all(|(_, s)| *s == CmState::Established));
    for op in &ops[6..] {
        rig.step(op);
    }
    assert_eq!((rig.a.connection_count(), rig.b.connection_count()), (0, 0));
}

/// The backlog seed fills B's backlog of 2: the third and fourth REQ are dropped, and the
/// retried one gets in once B has accepted one.
#[test]
fn backlog_seed_fills_the_backlog() {
    use softroce::cm::CmDropReason;
    let ops = backlog();
    let mut rig = Rig::new();
    for op in &ops[..6] {
        rig.step(op);
    }
    assert_eq!(rig.b.backlog(cm::SERVICE), Some(2));
    assert_eq!(rig.b.pending_requests(cm::SERVICE), 2);
    assert_eq!(rig.b.counters().drops(CmDropReason::BacklogFull), 2);
    rig.step(&ops[6]);
    rig.step(&ops[7]);
    assert_eq!(rig.b.pending_requests(cm::SERVICE), 2);
    assert_eq!(rig.b.connection_count(), 3);
}

/// The comm-ID-0 seed reproduces the sequence: B reaches MRA_REP_RCVD under the REQ's comm
/// ID 0, the REJ removes the connection, and the REQ again is a new ConnectRequest.
#[test]
fn comm_id_0_seed_reproduces_the_sequence() {
    let ops = comm_id_0_mra();
    let mut rig = Rig::new();
    for op in &ops[..3] {
        rig.step(op);
    }
    let b: Vec<_> = rig.b.connections().collect();
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].1, CmState::MraRepRcvd);
    rig.step(&ops[3]);
    assert_eq!(rig.b.connection_count(), 0);
    rig.step(&ops[4]);
    let again: Vec<_> = rig.b.connections().collect();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].1, CmState::ReqRcvd);
    assert_ne!(again[0].0, b[0].0);
}
