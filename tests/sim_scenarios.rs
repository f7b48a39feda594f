//! Scenario tests on the deterministic simulator: kernel rxe's behaviour as seen in the
//! captures (RNR, loss recovery, NAKs, retries, PSN wrap, duplicates), each driven with
//! chosen packets dropped and timed on the virtual clock.

use parking_lot::Mutex;
use softroce::net::sim::{Sim, SimFaults};
use softroce::transport::Instant;
use softroce::verbs::{
    AccessFlags, Cq, Device, Gid, Mr, PathMtu, Pd, Qp, QpCap, QpInitAttr, QpType, RcConnect,
    RecvWr, SendFlags, SendWr, Wc, WcOpcode, WcStatus, WrOpcode,
};
use softroce::wire::{Opcode, RocePacket};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2));

#[derive(Clone, Copy)]
struct Opts {
    psn_a: u32,
    psn_b: u32,
    mtu: PathMtu,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    min_rnr_timer: u8,
    qp_type: QpType,
}

impl Default for Opts {
    fn default() -> Opts {
        Opts {
            psn_a: 0x1000,
            psn_b: 0x2000,
            mtu: PathMtu::Mtu1024,
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            qp_type: QpType::Rc,
        }
    }
}

struct Pair {
    sim: Sim,
    _devs: (Device, Device),
    _pds: (Pd, Pd),
    ca: Cq,
    cb: Cq,
    qa: Qp,
    qb: Qp,
    local: Mr,
    remote: Mr,
    recv: Mr,
}

const MB: usize = 1 << 20;

fn pair(o: Opts) -> Pair {
    let mut sim = Sim::new(1, SimFaults::NONE);
    let a = sim.add_device("simA", A);
    let b = sim.add_device("simB", B);
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
    let init = |cq| QpInitAttr {
        qp_type: o.qp_type,
        send_cq: cq,
        recv_cq: cq,
        cap: QpCap::default(),
        sq_sig_all: true,
        srq: None,
    };
    let qa = pa.create_qp(&init(&ca)).unwrap();
    let qb = pb.create_qp(&init(&cb)).unwrap();
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let local = pa.reg_mr(MB, all).unwrap();
    let remote = pb.reg_mr(MB, all).unwrap();
    let recv = pb.reg_mr(MB, all).unwrap();
    for (me, peer_qpn, peer_ip, rq, sq) in [
        (&qa, qb.qp_num(), B, o.psn_b, o.psn_a),
        (&qb, qa.qp_num(), A, o.psn_a, o.psn_b),
    ] {
        let mut c = RcConnect::new(peer_qpn, Gid::from_ip(peer_ip), rq, sq);
        c.path_mtu = o.mtu;
        c.timeout = o.timeout;
        c.retry_cnt = o.retry_cnt;
        c.rnr_retry = o.rnr_retry;
        c.min_rnr_timer = o.min_rnr_timer;
        c.max_rd_atomic = 4;
        c.max_dest_rd_atomic = 4;
        me.connect_rc(&c).unwrap();
    }
    Pair {
        sim,
        _devs: (a, b),
        _pds: (pa, pb),
        ca,
        cb,
        qa,
        qb,
        local,
        remote,
        recv,
    }
}

impl Pair {
    /// Steps the simulation until `cq` yields a completion or `limit` of virtual time passes.
    fn wait(&mut self, which: char, limit: Duration) -> Option<Wc> {
        let end = self.sim.now() + limit;
        loop {
            let cq = if which == 'a' { &self.ca } else { &self.cb };
            if let Some(wc) = cq.poll_one() {
                return Some(wc);
            }
            if self.sim.now() > end || !self.sim.step() {
                return None;
            }
        }
    }

    fn send(&self, wr_id: u64, len: u32) {
        let sg = if len == 0 {
            vec![]
        } else {
            vec![self.local.sge(0, len)]
        };
        self.qa
            .post_send(&[SendWr::new(wr_id, WrOpcode::Send, sg)])
            .unwrap();
    }

    fn rdma(&self, wr_id: u64, op: WrOpcode, len: u32, remote_off: u64) {
        let sg = if len == 0 {
            vec![]
        } else {
            vec![self.local.sge(0, len)]
        };
        let mut wr = SendWr::new(wr_id, op, sg);
        wr.remote_addr = self.remote.addr() + remote_off;
        wr.rkey = self.remote.rkey();
        self.qa.post_send(&[wr]).unwrap();
    }

    fn post_recv(&self, wr_id: u64, len: u32) {
        let sg = if len == 0 {
            vec![]
        } else {
            vec![self.recv.sge(0, len)]
        };
        self.qb.post_recv(&[RecvWr { wr_id, sg_list: sg }]).unwrap();
    }
}

/// A packet the link carried, as the filter saw it.
#[derive(Debug, Clone)]
struct Seen {
    at: Instant,
    from_a: bool,
    opcode: Opcode,
    psn: u32,
    syndrome: Option<u8>,
    reth_va: Option<u64>,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// Installs a filter that logs every datagram and drops those `drop` picks (it sees the
/// packet and how many earlier packets had the same opcode and direction).
fn watch(p: &mut Pair, mut drop: impl FnMut(&Seen, usize) -> bool + Send + 'static) -> Log {
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    p.sim.set_filter(Some(Box::new(move |at, src, _dst, bytes| {
        let Ok(pkt) = RocePacket::parse(bytes) else {
            return true;
        };
        let s = Seen {
            at,
            from_a: src.ip() == A,
            opcode: pkt.repr.bth.opcode,
            psn: pkt.repr.bth.psn.value(),
            syndrome: pkt.repr.aeth.map(|a| a.syndrome),
            reth_va: pkt.repr.reth.map(|r| r.va),
        };
        let mut l = l.lock();
        let nth = l
            .iter()
            .filter(|x| x.opcode == s.opcode && x.from_a == s.from_a)
            .count();
        let dropped = drop(&s, nth);
        l.push(s);
        !dropped
    })));
    log
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(salt))
        .collect()
}

#[test]
fn rnr_nak_until_a_receive_is_posted_then_ack() {
    // Capture 59-rnr-nak-then-ok: SENDs with no receive draw RNR NAKs until one is posted.
    let mut p = pair(Opts {
        min_rnr_timer: 4,
        ..Opts::default()
    });
    let log = watch(&mut p, |_, _| false);
    p.local.write(0, b"hello").unwrap();
    p.send(1, 5);
    assert!(
        p.wait('a', Duration::from_millis(5)).is_none(),
        "no completion while RNR"
    );
    let rnr = log
        .lock()
        .iter()
        .filter(|s| s.syndrome.is_some_and(|x| x & 0xe0 == 0x20))
        .count();
    assert!(rnr >= 2, "several RNR NAKs, got {rnr}");
    assert!(
        log.lock()
            .iter()
            .all(|s| s.syndrome.is_none_or(|x| x == 0x20 | 4)),
        "timer code 4"
    );
    p.post_recv(9, 64);
    let wc = p
        .wait('a', Duration::from_millis(5))
        .expect("SEND completes");
    assert_eq!(wc.status, WcStatus::Success);
    let r = p.wait('b', Duration::ZERO).expect("receive completion");
    assert_eq!((r.wr_id, r.byte_len, r.status), (9, 5, WcStatus::Success));
    let c = p._devs.0.counters();
    assert_eq!(c.rcvd_rnr_err as usize, rnr);
    assert_eq!(p._devs.1.counters().send_rnr_err as usize, rnr);
}

#[test]
fn rnr_retry_zero_fails_after_one_rnr_nak() {
    // Capture 60-rnr-retry-exceeded: rnr_retry 0 → one RNR NAK → IBV_WC_RNR_RETRY_EXC_ERR.
    let mut p = pair(Opts {
        rnr_retry: 0,
        ..Opts::default()
    });
    let log = watch(&mut p, |_, _| false);
    p.send(1, 8);
    let wc = p.wait('a', Duration::from_millis(50)).expect("completion");
    assert_eq!(wc.status, WcStatus::RnrRetryExcErr);
    assert_eq!(wc.status.to_string(), "RNR retry counter exceeded");
    let rnr = log
        .lock()
        .iter()
        .filter(|s| s.syndrome.is_some_and(|x| x & 0xe0 == 0x20))
        .count();
    assert_eq!(rnr, 1);
}

#[test]
fn after_an_rnr_nak_the_wait_is_the_naks_timer_not_the_ack_timeout() {
    // RNR timer code 20 = 10.24 ms; ACK timeout 4.096 µs × 2^8 ≈ 1.05 ms.
    let mut p = pair(Opts {
        min_rnr_timer: 20,
        timeout: 8,
        ..Opts::default()
    });
    let log = watch(&mut p, |_, _| false);
    p.send(1, 8);
    assert!(p.wait('a', Duration::from_millis(15)).is_none());
    let sends: Vec<Instant> = log
        .lock()
        .iter()
        .filter(|s| s.from_a && s.opcode == Opcode::RC_SEND_ONLY)
        .map(|s| s.at)
        .collect();
    let naks: Vec<Instant> = log
        .lock()
        .iter()
        .filter(|s| s.syndrome == Some(0x20 | 20))
        .map(|s| s.at)
        .collect();
    assert!(
        sends.len() >= 2 && naks.len() >= sends.len() - 1,
        "{sends:?} {naks:?}"
    );
    // Every retry waits the RNR time after its NAK, though the ACK timeout is 10× shorter.
    for (send, nak) in sends[1..].iter().zip(&naks) {
        let wait = send.since(*nak);
        assert!(
            wait >= Duration::from_micros(10_240),
            "retried after {wait:?}"
        );
        assert!(
            wait < Duration::from_micros(10_240 + 1_050),
            "retried after {wait:?}"
        );
    }
}

#[test]
fn a_lost_write_packet_draws_one_psn_sequence_nak_and_go_back_n() {
    // Captures 40/41: loss → NAK PSN sequence error (0x60) with the expected PSN → resend.
    let mut p = pair(Opts::default());
    let log = watch(&mut p, |s, nth| {
        s.opcode == Opcode::RC_RDMA_WRITE_MIDDLE && nth == 0
    });
    let data = pattern(5 * 1024, 3);
    p.local.write(0, &data).unwrap();
    p.rdma(1, WrOpcode::RdmaWrite, data.len() as u32, 100);
    let wc = p.wait('a', Duration::from_millis(50)).expect("completion");
    assert_eq!(wc.status, WcStatus::Success);
    let mut got = vec![0u8; data.len()];
    p.remote.read(100, &mut got).unwrap();
    assert_eq!(got, data);
    let naks: Vec<Seen> = log
        .lock()
        .iter()
        .filter(|s| s.syndrome == Some(0x60))
        .cloned()
        .collect();
    assert_eq!(naks.len(), 1, "one NAK per gap");
    assert_eq!(naks[0].psn, 0x1001, "the NAK carries the expected PSN");
    assert_eq!(p._devs.1.counters().out_of_seq_request, 1);
    assert_eq!(p._devs.0.counters().rcvd_seq_err, 1);
}

#[test]
fn a_lost_read_response_reissues_the_read_from_the_missing_psn() {
    // Capture 42: lost READ responses → the READ is re-issued with VA advanced and length
    // reduced by what already arrived (rxe req_retry).
    let mut p = pair(Opts::default());
    let data = pattern(5000, 9);
    p.remote.write(0, &data).unwrap();
    let log = watch(&mut p, |s, nth| {
        s.opcode == Opcode::RC_RDMA_READ_RESPONSE_MIDDLE && nth == 1
    });
    p.rdma(1, WrOpcode::RdmaRead, 5000, 0);
    let wc = p.wait('a', Duration::from_millis(100)).expect("completion");
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 5000));
    let mut got = vec![0u8; 5000];
    p.local.read(0, &mut got).unwrap();
    assert_eq!(got, data);
    let reads: Vec<Seen> = log
        .lock()
        .iter()
        .filter(|s| s.opcode == Opcode::RC_RDMA_READ_REQUEST)
        .cloned()
        .collect();
    assert_eq!(reads.len(), 2, "{reads:?}");
    assert_eq!(
        reads[1].psn, 0x1002,
        "re-issued at the first missing response PSN"
    );
    assert_eq!(reads[1].reth_va, Some(p.remote.addr() + 2048));
}

fn outage(until_ns: u64) -> (Pair, Log) {
    let mut p = pair(Opts {
        retry_cnt: 3,
        timeout: 10,
        ..Opts::default()
    });
    let log = watch(&mut p, move |s, _| s.from_a && s.at.as_nanos() < until_ns);
    p.send(1, 8);
    p.post_recv(1, 8);
    (p, log)
}

#[test]
fn retry_cnt_timeouts_just_under_succeed_and_just_over_fail() {
    // retry_cnt 3, ACK timeout 4.096 µs × 2^10: retransmissions at t, 2t, 3t; the error at 4t.
    let t = 4096u64 << 10;
    let (mut ok, _) = outage(3 * t - 50_000);
    let wc = ok
        .wait('a', Duration::from_millis(100))
        .expect("completion");
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(ok._devs.0.counters().completer_retry_err, 3);

    let (mut bad, log) = outage(3 * t + 50_000);
    let wc = bad
        .wait('a', Duration::from_millis(100))
        .expect("completion");
    assert_eq!(wc.status, WcStatus::RetryExcErr);
    assert_eq!(wc.status.to_string(), "transport retry counter exceeded");
    assert_eq!(
        log.lock().iter().filter(|s| s.from_a).count(),
        4,
        "first send + 3 retries"
    );
    let c = bad._devs.0.counters();
    assert_eq!((c.retry_exceeded_err, c.completer_retry_err), (1, 3));
    assert!(bad.sim.now().as_nanos() >= 4 * t);
}

#[test]
fn zero_length_operations_are_single_packets_and_need_no_rkey() {
    // C9-88: a zero-length RDMA operation needs no valid R_Key or address.
    let mut p = pair(Opts::default());
    let log = watch(&mut p, |_, _| false);
    let mut w = SendWr::new(1, WrOpcode::RdmaWrite, vec![]);
    w.rkey = 0xdead_beef;
    w.remote_addr = 0;
    let mut wi = SendWr::new(2, WrOpcode::RdmaWriteWithImm, vec![]);
    wi.rkey = 0x1234_5678;
    wi.imm_data = 7u32.to_be();
    p.post_recv(20, 0);
    p.post_recv(30, 0);
    p.qa.post_send(&[w, wi, SendWr::new(3, WrOpcode::Send, vec![])])
        .unwrap();
    for id in 1..=3 {
        let wc = p.wait('a', Duration::from_millis(10)).expect("completion");
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success));
    }
    let r1 = p.wait('b', Duration::ZERO).unwrap();
    assert_eq!(
        (r1.wr_id, r1.opcode, r1.byte_len, u32::from_be(r1.imm_data)),
        (20, WcOpcode::RecvRdmaWithImm, 0, 7)
    );
    let r2 = p.wait('b', Duration::ZERO).unwrap();
    assert_eq!((r2.wr_id, r2.opcode, r2.byte_len), (30, WcOpcode::Recv, 0));
    let reqs: Vec<Opcode> = log
        .lock()
        .iter()
        .filter(|s| s.from_a)
        .map(|s| s.opcode)
        .collect();
    assert_eq!(
        reqs,
        [
            Opcode::RC_RDMA_WRITE_ONLY,
            Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
            Opcode::RC_SEND_ONLY
        ]
    );
}

#[test]
fn a_message_starting_at_psn_0xfffffe_wraps_to_2() {
    let mut p = pair(Opts {
        psn_a: 0x00ff_fffe,
        ..Opts::default()
    });
    let log = watch(&mut p, |_, _| false);
    let data = pattern(5 * 1024, 77);
    p.local.write(0, &data).unwrap();
    p.post_recv(5, 5 * 1024);
    p.send(1, 5 * 1024);
    assert_eq!(
        p.wait('a', Duration::from_millis(10)).unwrap().status,
        WcStatus::Success
    );
    let psns: Vec<u32> = log
        .lock()
        .iter()
        .filter(|s| s.from_a)
        .map(|s| s.psn)
        .collect();
    assert_eq!(psns, [0x00ff_fffe, 0x00ff_ffff, 0, 1, 2]);
    let mut got = vec![0u8; data.len()];
    p.recv.read(0, &mut got).unwrap();
    assert_eq!(got, data);
    assert_eq!(p.qa.counters().dropped_total(), 0);
}

#[test]
fn a_duplicated_atomic_returns_the_saved_original_and_changes_memory_once() {
    // The ATOMIC ACKNOWLEDGE is lost; the requester times out and resends the FETCH_ADD; the
    // responder answers from its saved result without adding again.
    let mut p = pair(Opts::default());
    p.remote.write(0, &40u64.to_ne_bytes()).unwrap();
    let log = watch(&mut p, |s, nth| {
        s.opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE && nth == 0
    });
    let mut w = SendWr::new(1, WrOpcode::AtomicFetchAndAdd, vec![p.local.sge(0, 8)]);
    w.remote_addr = p.remote.addr();
    w.rkey = p.remote.rkey();
    w.compare_add = 2;
    p.qa.post_send(&[w]).unwrap();
    let wc = p.wait('a', Duration::from_millis(100)).expect("completion");
    assert_eq!(wc.status, WcStatus::Success);
    let mut orig = [0u8; 8];
    p.local.read(0, &mut orig).unwrap();
    assert_eq!(u64::from_ne_bytes(orig), 40);
    let mut now = [0u8; 8];
    p.remote.read(0, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 42, "added once");
    assert_eq!(
        log.lock()
            .iter()
            .filter(|s| s.opcode == Opcode::RC_FETCH_ADD)
            .count(),
        2
    );
    assert_eq!(p._devs.1.counters().duplicate_request, 1);
}

#[test]
fn a_send_longer_than_the_receive_is_loc_len_err_there_and_rem_inv_req_err_here() {
    let mut p = pair(Opts::default());
    p.post_recv(7, 10);
    p.send(1, 100);
    let wc = p.wait('a', Duration::from_millis(10)).expect("completion");
    assert_eq!(wc.status, WcStatus::RemInvReqErr);
    let r = p.wait('b', Duration::ZERO).expect("receive completion");
    assert_eq!((r.wr_id, r.status), (7, WcStatus::LocLenErr));
}

#[test]
fn a_fenced_write_waits_for_the_read_before_it() {
    let mut p = pair(Opts::default());
    let log = watch(&mut p, |_, _| false);
    p.remote.write(0, &pattern(4096, 1)).unwrap();
    p.rdma(1, WrOpcode::RdmaRead, 4096, 0);
    let mut w = SendWr::new(2, WrOpcode::RdmaWrite, vec![p.local.sge(8192, 64)]);
    w.remote_addr = p.remote.addr();
    w.rkey = p.remote.rkey();
    w.send_flags = SendFlags::SIGNALED | SendFlags::FENCE;
    p.qa.post_send(&[w]).unwrap();
    for id in 1..=2 {
        assert_eq!(p.wait('a', Duration::from_millis(10)).unwrap().wr_id, id);
    }
    let l = log.lock();
    let last_resp = l
        .iter()
        .rposition(|s| s.opcode == Opcode::RC_RDMA_READ_RESPONSE_LAST)
        .unwrap();
    let write = l
        .iter()
        .position(|s| s.opcode == Opcode::RC_RDMA_WRITE_ONLY)
        .unwrap();
    assert!(
        write > last_resp,
        "the fenced WRITE left after the READ completed"
    );
    let mut got = vec![0u8; 4096];
    p.local.read(0, &mut got).unwrap();
    assert_eq!(
        got,
        pattern(4096, 1),
        "the READ saw memory before the WRITE"
    );
}

// ---- UC: no ACKs, no NAKs; a broken message is dropped whole ----

fn uc() -> Opts {
    Opts {
        qp_type: QpType::Uc,
        ..Opts::default()
    }
}

#[test]
fn uc_send_write_and_write_with_imm_complete_without_any_ack() {
    let mut p = pair(uc());
    let log = watch(&mut p, |_, _| false);
    let data = pattern(3000, 5);
    p.local.write(0, &data).unwrap();
    p.post_recv(1, 3000);
    p.post_recv(2, 0);
    p.send(10, 3000);
    p.rdma(11, WrOpcode::RdmaWrite, 3000, 64);
    p.rdma(12, WrOpcode::RdmaWriteWithImm, 100, 8192);
    for id in 10..=12 {
        let wc = p.wait('a', Duration::from_millis(5)).expect("completion");
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success));
    }
    p.sim.run_until(Duration::from_millis(5), || false);
    let r = p.wait('b', Duration::ZERO).unwrap();
    assert_eq!((r.wr_id, r.byte_len, r.opcode), (1, 3000, WcOpcode::Recv));
    let r = p.wait('b', Duration::ZERO).unwrap();
    assert_eq!(
        (r.wr_id, r.byte_len, r.opcode),
        (2, 100, WcOpcode::RecvRdmaWithImm)
    );
    let mut got = vec![0u8; 3000];
    p.recv.read(0, &mut got).unwrap();
    assert_eq!(got, data);
    p.remote.read(64, &mut got).unwrap();
    assert_eq!(got, data);
    let l = log.lock();
    assert!(
        l.iter().all(|s| s.from_a),
        "UC: the responder sends nothing"
    );
    assert!(
        l.iter().all(|s| s.opcode.transport_bits() == 1),
        "UC opcodes only"
    );
    assert_eq!(l.first().map(|s| s.opcode), Some(Opcode::UC_SEND_FIRST));
}

#[test]
fn uc_lost_middle_drops_the_message_and_keeps_the_receive_for_the_next() {
    let mut p = pair(uc());
    let log = watch(&mut p, |s, nth| {
        s.opcode == Opcode::UC_SEND_MIDDLE && nth == 0
    });
    p.local.write(0, &pattern(3000, 1)).unwrap();
    p.post_recv(1, 3000);
    p.send(10, 3000);
    assert_eq!(
        p.wait('a', Duration::from_millis(5)).unwrap().status,
        WcStatus::Success
    );
    p.sim.run_until(Duration::from_millis(5), || false);
    assert!(
        p.cb.poll_one().is_none(),
        "the broken message completes nothing"
    );
    // The next message lands in the same receive WQE.
    p.local.write(0, &pattern(200, 2)).unwrap();
    p.send(11, 200);
    assert_eq!(
        p.wait('a', Duration::from_millis(5)).unwrap().status,
        WcStatus::Success
    );
    let r = p
        .wait('b', Duration::from_millis(5))
        .expect("receive completion");
    assert_eq!((r.wr_id, r.byte_len), (1, 200));
    let mut got = vec![0u8; 200];
    p.recv.read(0, &mut got).unwrap();
    assert_eq!(got, pattern(200, 2));
    assert!(log.lock().iter().all(|s| s.from_a), "no NAK on UC");
    assert!(
        p._devs
            .1
            .counters()
            .dropped(softroce::verbs::DropReason::UcMessageDropped)
            >= 1
    );
}

#[test]
fn uc_send_without_a_receive_is_dropped_silently_and_the_qp_keeps_working() {
    let mut p = pair(uc());
    p.send(10, 8);
    assert_eq!(
        p.wait('a', Duration::from_millis(5)).unwrap().status,
        WcStatus::Success
    );
    p.sim.run_until(Duration::from_millis(1), || false);
    assert_eq!(p.qb.state(), softroce::verbs::QpState::Rts);
    p.post_recv(1, 8);
    p.send(11, 8);
    p.wait('a', Duration::from_millis(5)).unwrap();
    assert_eq!(p.wait('b', Duration::from_millis(5)).unwrap().wr_id, 1);
}

#[test]
fn uc_refuses_read_and_atomics_at_post_time() {
    let p = pair(uc());
    let mut w = SendWr::new(1, WrOpcode::RdmaRead, vec![p.local.sge(0, 8)]);
    w.rkey = p.remote.rkey();
    let e = p.qa.post_send(&[w]).unwrap_err();
    assert_eq!((e.errno(), e.bad_wr()), (95, Some(0)));
}

// ---- UD: datagrams with a DETH, a GRH in front of every receive, Q_Key checks ----

struct UdPair {
    sim: Sim,
    devs: (Device, Device),
    _pds: (Pd, Pd),
    ca: Cq,
    cb: Cq,
    qa: Qp,
    qb: Qp,
    local: Mr,
    recv: Mr,
    ah: softroce::verbs::Ah,
}

const QKEY: u32 = 0x1111_1111;

fn ud_pair() -> UdPair {
    let mut sim = Sim::new(3, SimFaults::NONE);
    let a = sim.add_device("simA", A);
    let b = sim.add_device("simB", B);
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let init = |cq| QpInitAttr {
        qp_type: QpType::Ud,
        send_cq: cq,
        recv_cq: cq,
        cap: QpCap::default(),
        sq_sig_all: true,
        srq: None,
    };
    let qa = pa.create_qp(&init(&ca)).unwrap();
    let qb = pb.create_qp(&init(&cb)).unwrap();
    qa.ready_ud(QKEY, 0x10).unwrap();
    qb.ready_ud(QKEY, 0x20).unwrap();
    let local = pa.reg_mr(8192, AccessFlags::LOCAL_WRITE).unwrap();
    let recv = pb.reg_mr(8192, AccessFlags::LOCAL_WRITE).unwrap();
    let ah = pa
        .create_ah(&softroce::verbs::AhAttr::roce_v2(Gid::from_ip(B)))
        .unwrap();
    UdPair {
        sim,
        devs: (a, b),
        _pds: (pa, pb),
        ca,
        cb,
        qa,
        qb,
        local,
        recv,
        ah,
    }
}

impl UdPair {
    fn send(&self, wr_id: u64, len: u32, qkey: u32, imm: Option<u32>) {
        let sg = if len == 0 {
            vec![]
        } else {
            vec![self.local.sge(0, len)]
        };
        let mut w = SendWr::new(
            wr_id,
            if imm.is_some() {
                WrOpcode::SendWithImm
            } else {
                WrOpcode::Send
            },
            sg,
        );
        w.imm_data = imm.unwrap_or(0);
        w.ud = Some(self.ah.dest(self.qb.qp_num(), qkey));
        self.qa.post_send(&[w]).unwrap();
    }
    fn settle(&mut self) {
        self.sim.run_until(Duration::from_millis(1), || false);
    }
}

#[test]
fn ud_send_lands_after_a_40_byte_grh_with_src_qp_and_imm() {
    let mut p = ud_pair();
    let log_sport = Arc::new(Mutex::new(Vec::new()));
    let l = log_sport.clone();
    p.sim.set_filter(Some(Box::new(move |_, src, _, bytes| {
        let pkt = RocePacket::parse(bytes).unwrap();
        l.lock().push((
            src.port(),
            pkt.repr.bth.opcode,
            pkt.repr.deth.map(|d| (d.qkey, d.src_qpn)),
        ));
        true
    })));
    p.local.write(0, b"datagram!").unwrap();
    p.qb.post_recv(&[RecvWr {
        wr_id: 5,
        sg_list: vec![p.recv.sge(0, 4096)],
    }])
    .unwrap();
    p.send(1, 9, QKEY, Some(0xabcd_0001));
    p.settle();
    assert_eq!(p.ca.poll_one().unwrap().status, WcStatus::Success);
    let r = p.cb.poll_one().expect("receive completion");
    assert_eq!(
        (r.wr_id, r.status, r.byte_len, r.src_qp),
        (5, WcStatus::Success, 49, p.qa.qp_num())
    );
    assert!(
        r.wc_flags
            .contains(softroce::verbs::WcFlags::GRH | softroce::verbs::WcFlags::WITH_IMM)
    );
    assert_eq!(r.imm_data, 0xabcd_0001);
    let mut buf = vec![0u8; 49];
    p.recv.read(0, &mut buf).unwrap();
    assert_eq!(
        &buf[..20],
        &[0u8; 20],
        "IPv4: 20 zero bytes, then the IPv4 header"
    );
    assert_eq!(buf[20], 0x45);
    assert_eq!(&buf[32..36], &[192, 0, 2, 1], "GRH source = the sender");
    assert_eq!(&buf[36..40], &[192, 0, 2, 2]);
    assert_eq!(&buf[40..], b"datagram!");
    let seen = log_sport.lock();
    // rxe: a UD QP keeps its creation-time source port 0xC000 + hash_32(qpn, 14).
    let want = softroce::verbs::rxe_initial_udp_sport(p.qa.qp_num());
    assert_eq!(
        seen[0],
        (
            want,
            Opcode::UD_SEND_ONLY_WITH_IMMEDIATE,
            Some((QKEY, p.qa.qp_num()))
        )
    );
}

#[test]
fn ud_wrong_qkey_and_missing_receive_are_dropped_counted_and_the_qp_keeps_working() {
    let mut p = ud_pair();
    p.send(1, 4, 0x2222_2222, None); // wrong Q_Key
    p.send(2, 4, QKEY, None); // no receive posted
    p.settle();
    assert!(p.cb.poll_one().is_none());
    let c = p.devs.1.counters();
    assert_eq!(c.dropped(softroce::verbs::DropReason::BadQkey), 1);
    assert_eq!(c.dropped(softroce::verbs::DropReason::UdNoReceive), 1);
    // A Q_Key with bit 31 set means "the QP's own Q_Key".
    p.qb.post_recv(&[RecvWr {
        wr_id: 7,
        sg_list: vec![p.recv.sge(0, 100)],
    }])
    .unwrap();
    p.send(3, 4, 0x8000_0000, None);
    p.settle();
    let r = p.cb.poll_one().expect("completion");
    assert_eq!((r.wr_id, r.byte_len), (7, 44));
    assert_eq!(p.qb.state(), softroce::verbs::QpState::Rts);
    for id in 1..=3 {
        assert_eq!(
            p.ca.poll_one().map(|w| (w.wr_id, w.status)),
            Some((id, WcStatus::Success))
        );
    }
}

#[test]
fn ud_message_longer_than_the_mtu_is_not_sent_and_completes() {
    // C10-93.1.1, as rxe does: the WR completes successfully and nothing goes out.
    let mut p = ud_pair();
    let sent = Arc::new(Mutex::new(0usize));
    let s2 = sent.clone();
    p.sim.set_filter(Some(Box::new(move |_, _, _, _| {
        *s2.lock() += 1;
        true
    })));
    p.send(1, 4096 + 1, QKEY, None);
    p.settle();
    assert_eq!(p.ca.poll_one().map(|w| w.status), Some(WcStatus::Success));
    assert_eq!(*sent.lock(), 0);
}

#[test]
fn ud_refuses_rdma_and_a_wr_without_an_address_handle() {
    let p = ud_pair();
    let e =
        p.qa.post_send(&[SendWr::new(1, WrOpcode::RdmaWrite, vec![])])
            .unwrap_err();
    assert_eq!(e.errno(), 95);
    let e =
        p.qa.post_send(&[SendWr::new(1, WrOpcode::Send, vec![])])
            .unwrap_err();
    assert_eq!(e.errno(), 22);
}
