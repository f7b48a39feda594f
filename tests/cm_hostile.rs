//! The Rust API's rdma_cm-shaped connection setup (`softroce_ibverbs::cm`, over the engine's
//! `net::CmDriver`) against a hostile user and a hostile peer, over real UDP on loopback,
//! addresses 127.0.190.0/24: private data at and past every limit, a connect to the
//! device's own listener, a listener dropped with requests pending, a peer that gives up
//! before the accept, many connects at once, and a peer that sends QP1 garbage, truncated
//! datagrams, MADs of other classes, REQs with absurd fields and replayed or stale
//! REP/RTU/DREQ. Nothing may panic or hang, every refusal is what kernel rdma_cm answers,
//! and the driver's threads and descriptors and its mailboxes are back where they started.
//!
//! The hostile peer is a UDP socket on port 4791 of its own address driving a sans-IO
//! `CmEngine` (so its REQs are well formed until the test bends them) and wrapping each MAD
//! by hand in BTH / DETH / ICRC as rxe's QP1 does.

use softroce::cm::rdma_cm::RDMA_CM_REQ_USER_DATA_MAX;
use softroce::cm::{CmConfig, CmEngine, ConnectParams};
use softroce::transport::Instant;
use softroce::wire::cm::{CmMadRepr, CmMsgRepr, DreqRepr, RejReason, RepRepr, RtuRepr, port_space};
use softroce::wire::mad::{MAD_LEN, MadHdrRepr};
use softroce::wire::{BthRepr, DethRepr, IcrcIp, Opcode, PacketRepr, Psn, ROCE_V2_UDP_PORT};
use softroce_ibverbs::{CmListener, Context, DeviceList, Error, QpType};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::Duration;

const T: Duration = Duration::from_secs(10);
const GSI_QKEY: u32 = 0x8001_0000;

fn open(ip: &str) -> Context {
    DeviceList::with_ip(&[ip.parse::<IpAddr>().unwrap()])[0]
        .open()
        .expect("open device (127.0.190.0/24 on lo)")
}

fn ip4(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

/// One test at a time: the leak check counts the whole process's threads and descriptors,
/// which a test running beside it would change.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// softroce's threads (device drivers and CM drivers, named `softroce-…`) and the
/// process's sockets and anonymous-inode descriptors (eventfds, epoll): what opening
/// devices and using the CM adds. The test harness's own threads (named after tests) and
/// files are left out, as they come and go with the tests around this one.
fn threads_and_fds() -> (usize, usize) {
    let threads = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("softroce"))
        .count();
    let fds = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|f| std::fs::read_link(f.ok()?.path()).ok())
        .filter(|l| {
            let l = l.to_string_lossy();
            l.starts_with("socket:") || l.starts_with("anon_inode:")
        })
        .count();
    (threads, fds)
}

/// A peer that speaks CM from a plain UDP socket on `ip`:4791.
struct Peer {
    sock: UdpSocket,
    ip: Ipv4Addr,
    cm: CmEngine,
    t0: std::time::Instant,
}

impl Peer {
    fn new(ip: &str) -> Peer {
        let sock = UdpSocket::bind((ip4(ip), ROCE_V2_UDP_PORT)).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        Peer {
            sock,
            ip: ip4(ip),
            cm: CmEngine::new(CmConfig::new(IpAddr::V4(ip4(ip)), 0x1122_3344, 7)),
            t0: std::time::Instant::now(),
        }
    }

    fn now(&self) -> Instant {
        Instant::from_nanos(self.t0.elapsed().as_nanos() as u64 + 1)
    }

    /// `payload` (a MAD, or anything) as a UD SEND to QP1 of `dst` with Q_Key `qkey`.
    fn send_to_qp1(&self, dst: Ipv4Addr, qkey: u32, payload: &[u8]) {
        let mut r = PacketRepr::new(BthRepr::new(Opcode::UD_SEND_ONLY, 1, Psn::new(0)));
        r.deth = Some(DethRepr { qkey, src_qpn: 1 });
        r.payload_len = payload.len();
        let mut buf = vec![0u8; r.buffer_len()];
        let port = self.sock.local_addr().unwrap().port();
        let ip = IcrcIp::V4 {
            src: self.ip,
            dst,
            ident: 0,
            src_port: port,
            dst_port: ROCE_V2_UDP_PORT,
        };
        let n = r.emit(&mut buf, payload, &ip);
        self.sock
            .send_to(&buf[..n], (dst, ROCE_V2_UDP_PORT))
            .unwrap();
    }

    fn send_raw(&self, dst: Ipv4Addr, bytes: &[u8]) {
        self.sock.send_to(bytes, (dst, ROCE_V2_UDP_PORT)).unwrap();
    }

    /// The CM MADs that came to this peer's QP1 within `wait`.
    fn recv_mads(&self, wait: Duration) -> Vec<CmMadRepr> {
        self.recv_some(wait, usize::MAX)
    }

    /// The first `n` CM MADs that come to this peer's QP1, or those that came within `wait`.
    fn recv_some(&self, wait: Duration, n: usize) -> Vec<CmMadRepr> {
        let end = std::time::Instant::now() + wait;
        let mut got = Vec::new();
        let mut buf = [0u8; 2048];
        while std::time::Instant::now() < end && got.len() < n {
            let Ok(n) = self.sock.recv(&mut buf) else {
                continue;
            };
            // BTH (12) + DETH (8) + MAD (256) + ICRC (4).
            if n == 12 + 8 + MAD_LEN + 4
                && let Ok(m) = CmMadRepr::parse(&buf[20..20 + MAD_LEN])
            {
                got.push(m);
            }
        }
        got
    }

    /// The first MAD (from our engine's queue) to send after a call on the engine.
    fn take_mad(&mut self) -> [u8; MAD_LEN] {
        *self
            .cm
            .poll_mad()
            .expect("the peer's engine queued a MAD")
            .mad
    }

    /// A REQ from our engine to `dst:port` (rdma_cm format), as bytes.
    fn req_bytes(&mut self, dst: Ipv4Addr, port: u16, user: &[u8]) -> [u8; MAD_LEN] {
        let p = ConnectParams::rdma_cm(
            SocketAddr::new(IpAddr::V4(self.ip), 40000),
            SocketAddr::new(IpAddr::V4(dst), port),
            port_space::TCP,
            0x77,
            0x1234,
            3,
            user,
        )
        .unwrap();
        let now = self.now();
        self.cm.connect(now, &p).unwrap();
        self.take_mad()
    }
}

fn rejs(mads: &[CmMadRepr]) -> Vec<RejReason> {
    mads.iter()
        .filter_map(|m| match &m.msg {
            CmMsgRepr::Rej(r) => Some(r.reason),
            _ => None,
        })
        .collect()
}

// Private data at each limit: 0 and 56 bytes in a REQ (57: EINVAL), 196 in a REP (197:
// EINVAL; the request, consumed, is rejected without data), 148 in a REJ (149: EINVAL, the
// same); what arrives is what was given, zero-padded.
#[test]
fn private_data_at_and_past_the_limits() {
    let _serial = serial();
    let (a, b) = (open("127.0.190.1"), open("127.0.190.2"));
    let listener = CmListener::bind(&b, 7000).unwrap();
    let server = std::thread::spawn(move || {
        let (pd, cq) = (b.alloc_pd().unwrap(), b.create_cq(8, 0).unwrap());
        let qp = || pd.create_qp(&cq, &cq, QpType::Rc).build().unwrap();
        // 1: empty private data; a REP with 197 bytes is EINVAL.
        let req = listener.get_request(T).unwrap();
        assert_eq!(req.private_data(), &[0u8; 56][..]);
        assert_eq!(req.accept_with(qp(), &[1; 197]).unwrap_err().errno(), 22);
        // 2: 56 bytes; a REP with 196.
        let req = listener.get_request(T).unwrap();
        assert_eq!(req.private_data(), &[0x5a; 56][..]);
        let mut conn = req.accept_with(qp(), &[0xa5; 196]).unwrap();
        conn.wait_for_disconnect(T).unwrap();
        conn.disconnect(T).unwrap();
        // 3: a REJ with 149 bytes is EINVAL; 4: one with 148.
        let req = listener.get_request(T).unwrap();
        assert_eq!(req.reject(&[7; 149]).unwrap_err().errno(), 22);
        listener.get_request(T).unwrap().reject(&[9; 148]).unwrap();
        // Nothing else is waiting.
        let e = listener.get_request(Duration::from_millis(1)).unwrap_err();
        assert_eq!(e.errno(), 110);
        listener
    });
    let (pd, cq) = (a.alloc_pd().unwrap(), a.create_cq(8, 0).unwrap());
    let qp = || pd.create_qp(&cq, &cq, QpType::Rc).build().unwrap();
    let to: SocketAddr = "127.0.190.2:7000".parse().unwrap();
    let rejected = |e: Error| match e {
        Error::Rejected(r) => r,
        e => panic!("{e}"),
    };
    let r = rejected(qp().connect(to, &[], T).unwrap_err());
    assert_eq!(r.reason, RejReason::CONSUMER_DEFINED);
    assert_eq!(r.private_data, vec![0u8; 148]);
    let e = qp().connect(to, &[0; RDMA_CM_REQ_USER_DATA_MAX + 1], T);
    assert_eq!(e.unwrap_err().errno(), 22);
    let mut conn = qp().connect(to, &[0x5a; 56], T).unwrap();
    assert_eq!(conn.private_data(), &[0xa5; 196][..]);
    conn.disconnect(T).unwrap();
    let r = rejected(qp().connect(to, b"x", T).unwrap_err());
    assert_eq!(r.private_data, vec![0u8; 148]);
    let r = rejected(qp().connect(to, b"y", T).unwrap_err());
    assert_eq!(
        (r.reason, r.private_data),
        (RejReason::CONSUMER_DEFINED, vec![9u8; 148])
    );
    let _listener = server.join().unwrap();
}

// A device connects to its own listener (rdma_cm allows a connect to a local address): both
// ends on one CM engine, one QP each; data flows and both disconnect.
#[test]
fn connect_to_own_listener() {
    let _serial = serial();
    let a = open("127.0.190.3");
    let listener = CmListener::bind(&a, 7001).unwrap();
    let a2 = a.clone();
    let server = std::thread::spawn(move || {
        let (pd, cq) = (a2.alloc_pd().unwrap(), a2.create_cq(16, 0).unwrap());
        let qp = pd.create_qp(&cq, &cq, QpType::Rc).build().unwrap();
        let mut conn = listener.get_request(T).unwrap().accept(qp).unwrap();
        conn.wait_for_disconnect(T).unwrap();
        conn.disconnect(T).unwrap();
    });
    let (pd, cq) = (a.alloc_pd().unwrap(), a.create_cq(16, 0).unwrap());
    let qp = pd.create_qp(&cq, &cq, QpType::Rc).build().unwrap();
    let mut conn = qp
        .connect("127.0.190.3:7001".parse().unwrap(), b"me", T)
        .unwrap();
    conn.disconnect(T).unwrap();
    server.join().unwrap();
}

/// Connects to `to` from a fresh QP of `ctx` with a short timeout: `Ok` or the error.
fn try_connect(ctx: &Context, to: &str) -> Result<softroce_ibverbs::CmConnection, Error> {
    let (pd, cq) = (ctx.alloc_pd().unwrap(), ctx.create_cq(8, 0).unwrap());
    let qp = pd.create_qp(&cq, &cq, QpType::Rc).build().unwrap();
    qp.connect(to.parse().unwrap(), b"probe", T)
}

/// Waits (polling, up to `T`) until `f` holds.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let end = std::time::Instant::now() + T;
    while !f() {
        assert!(std::time::Instant::now() < end, "never: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

// A listener dropped with requests not yet taken: each connect is refused with REJ 28
// (consumer defined, as rdma_destroy_id of a listener does to ids it never handed out), at
// once, not after its timeout; the driver keeps nothing for them.
#[test]
fn dropping_a_listener_rejects_its_pending_requests() {
    let _serial = serial();
    let (a, b) = (open("127.0.190.4"), open("127.0.190.5"));
    let listener = CmListener::bind(&b, 7003).unwrap();
    let cm = b.cm().unwrap();
    let clients: Vec<_> = (0..3)
        .map(|_| {
            let a = a.clone();
            std::thread::spawn(move || try_connect(&a, "127.0.190.5:7003").map(|_| ()))
        })
        .collect();
    eventually("three requests queued", || {
        cm.with(|cm, _| cm.connection_count()) == 3
    });
    drop(listener);
    for c in clients {
        let Err(Error::Rejected(r)) = c.join().unwrap() else {
            panic!("connect was not rejected")
        };
        assert_eq!(r.reason, RejReason::CONSUMER_DEFINED);
    }
    assert_eq!(cm.with(|cm, _| cm.connection_count()), 0);
    assert_eq!(cm.mailbox_count(), 0);
    // The port is free again, and a connect to it is REJ 8 until someone listens.
    let Err(Error::Rejected(r)) = try_connect(&a, "127.0.190.5:7003") else {
        panic!("connect to an unlistened port was not rejected")
    };
    assert_eq!(r.reason, RejReason::INVALID_SERVICE_ID);
    let _again = CmListener::bind(&b, 7003).unwrap();
}

// A peer that withdraws its connect (REJ timeout, the kernel's cm_destroy_id of an id in
// REQ_SENT) before the listener takes the request: the listener does not hand out the dead
// request, and the driver keeps no mailbox for it.
#[test]
fn a_request_withdrawn_before_it_is_taken_is_not_handed_out() {
    let _serial = serial();
    let b = open("127.0.190.6");
    let listener = CmListener::bind(&b, 7004).unwrap();
    let cm = b.cm().unwrap();
    let dst = ip4("127.0.190.6");
    let mut p = Peer::new("127.0.190.7");
    let req = p.req_bytes(dst, 7004, b"soon gone");
    p.send_to_qp1(dst, GSI_QKEY, &req);
    eventually("the request queued", || {
        cm.with(|cm, _| cm.connection_count()) == 1
    });
    // The peer gives up: REJ (timeout) for its REQ.
    let id = p.cm.connections().next().unwrap().0;
    let now = p.now();
    p.cm.cancel(now, id).unwrap();
    let rej = p.take_mad();
    p.send_to_qp1(dst, GSI_QKEY, &rej);
    eventually("the request withdrawn", || {
        cm.with(|cm, _| cm.connection_count()) == 0
    });
    let e = listener
        .get_request(Duration::from_millis(300))
        .unwrap_err();
    assert_eq!(e.errno(), 110, "{e}");
    assert_eq!(cm.mailbox_count(), 0);

    // Withdrawn after the listener took it: the accept fails (no REP goes out), and
    // nothing is left behind for it.
    let req = p.req_bytes(dst, 7004, b"taken, then gone");
    p.send_to_qp1(dst, GSI_QKEY, &req);
    let taken = listener.get_request(T).unwrap();
    let id = p.cm.connections().last().unwrap().0;
    let now = p.now();
    p.cm.cancel(now, id).unwrap();
    let rej = p.take_mad();
    p.send_to_qp1(dst, GSI_QKEY, &rej);
    eventually("the request withdrawn", || {
        cm.with(|cm, _| cm.connection_count()) == 0
    });
    let (pd, cq) = (b.alloc_pd().unwrap(), b.create_cq(8, 0).unwrap());
    let qp = pd.create_qp(&cq, &cq, QpType::Rc).build().unwrap();
    assert!(taken.accept(qp).is_err());
    assert!(p.recv_mads(Duration::from_millis(300)).is_empty());
    assert_eq!(cm.mailbox_count(), 0);
}

// Many connects at once to one listener (each on its own QP and thread): all are accepted,
// carry their own private data, and disconnect; afterwards the process has the threads and
// descriptors it had before (the devices' own included), and the drivers no mailbox.
#[test]
fn many_concurrent_connects_then_nothing_leaks() {
    let _serial = serial();
    const N: usize = 24;
    let before = threads_and_fds();
    {
        let (a, b) = (open("127.0.190.8"), open("127.0.190.9"));
        let listener = CmListener::bind(&b, 7005).unwrap();
        // The count sees what the devices and the CM add (so the check below means
        // something): two device threads, a CM thread and their sockets at least, once
        // the threads have named themselves.
        eventually("the devices' threads and sockets counted", || {
            let during = threads_and_fds();
            during.0 >= before.0 + 3 && during.1 >= before.1 + 2
        });
        let bb = b.clone();
        let server = std::thread::spawn(move || {
            let (pd, cq) = (bb.alloc_pd().unwrap(), bb.create_cq(8, 0).unwrap());
            let mut conns = Vec::new();
            for _ in 0..N {
                let req = listener.get_request(T).unwrap();
                let tag = req.private_data()[0];
                let qp = pd.create_qp(&cq, &cq, QpType::Rc).build().unwrap();
                conns.push(req.accept_with(qp, &[tag]).unwrap());
            }
            for mut c in conns {
                c.wait_for_disconnect(T).unwrap();
                c.disconnect(T).unwrap();
            }
        });
        let clients: Vec<_> = (0..N)
            .map(|i| {
                let a = a.clone();
                std::thread::spawn(move || {
                    let (pd, cq) = (a.alloc_pd().unwrap(), a.create_cq(8, 0).unwrap());
                    let qp = pd.create_qp(&cq, &cq, QpType::Rc).build().unwrap();
                    let mut c = qp
                        .connect("127.0.190.9:7005".parse().unwrap(), &[i as u8], T)
                        .unwrap();
                    assert_eq!(c.private_data()[0], i as u8);
                    c.disconnect(T).unwrap();
                })
            })
            .collect();
        for c in clients {
            c.join().unwrap();
        }
        server.join().unwrap();
        // Each side's connections leave TIMEWAIT, and then nothing is held for them.
        let (ca, cb) = (a.cm().unwrap(), b.cm().unwrap());
        eventually("mailboxes empty", || {
            ca.mailbox_count() == 0 && cb.mailbox_count() == 0
        });
    }
    // The devices are closed: their threads end (joined) and their sockets close.
    eventually("threads and descriptors back", || {
        threads_and_fds() == before
    });
}

// A peer that sends QP1 garbage: datagrams too short for a BTH, all-0x00 and all-0xff
// payloads, truncated MADs, MADs longer than a MAD (more than QP1's receive buffers hold,
// a hundred of them: more than the receives QP1 keeps posted), a REQ with the wrong Q_Key,
// MADs of other management classes. The CM stays up: a well-formed connect afterwards is
// accepted.
#[test]
fn qp1_garbage_does_not_take_the_cm_down() {
    let _serial = serial();
    let d = open("127.0.190.20");
    let listener = CmListener::bind(&d, 7006).unwrap();
    let dst = ip4("127.0.190.20");
    let mut p = Peer::new("127.0.190.21");
    for bytes in [&[][..], &[0xff], &[0; 12], &[0xff; 300], &[0; 300]] {
        p.send_raw(dst, bytes);
    }
    for payload in [&[][..], &[1; 100], &[0; 256], &[0xff; 256], &[0; 255]] {
        p.send_to_qp1(dst, GSI_QKEY, payload);
    }
    let req = p.req_bytes(dst, 7006, b"wrong qkey");
    p.send_to_qp1(dst, 0x1234_5678, &req);
    p.send_to_qp1(dst, GSI_QKEY, &req[..200]);
    let mut long = req.to_vec();
    long.extend_from_slice(&[0xee; 64]);
    for _ in 0..100 {
        p.send_to_qp1(dst, GSI_QKEY, &long);
    }
    for class in [0x01u8, 0x03, 0x04, 0x81, 0xff] {
        let mut m = req;
        m[1] = class;
        p.send_to_qp1(dst, GSI_QKEY, &m);
    }
    // None of it made a connection or drew an answer.
    assert!(rejs(&p.recv_mads(Duration::from_millis(300))).is_empty());
    let cm = d.cm().unwrap();
    assert_eq!(cm.with(|cm, _| cm.connection_count()), 0);
    let a = open("127.0.190.22");
    let server = std::thread::spawn(move || {
        let (pd, cq) = (d.alloc_pd().unwrap(), d.create_cq(8, 0).unwrap());
        let qp = pd.create_qp(&cq, &cq, QpType::Rc).build().unwrap();
        let mut c = listener.get_request(T).unwrap().accept(qp).unwrap();
        c.wait_for_disconnect(T).unwrap();
    });
    let mut c = try_connect(&a, "127.0.190.20:7006").unwrap();
    c.disconnect(T).unwrap();
    server.join().unwrap();
}

// REQs with absurd fields and stale or replayed messages from a hostile peer, answered as
// kernel rdma_cm / ib_cm answers them: a service ID nobody listens on (all ones, another
// port space) is REJ 8; a REQ whose rdma_cm IP header says IP version 6 over an IPv4
// address, or CMA version 1, is REJ 28 and never reaches the listener; a REP or DREQ for a
// connection that does not exist is REJ 6 / a DREP; an RTU for one is dropped; a REQ
// replayed after the connection is established changes nothing.
#[test]
fn absurd_reqs_and_stale_messages_get_the_kernel_answers() {
    let _serial = serial();
    let d = open("127.0.190.23");
    let listener = CmListener::bind(&d, 7007).unwrap();
    let cm = d.cm().unwrap();
    let dst = ip4("127.0.190.23");
    let mut p = Peer::new("127.0.190.24");
    let bent = |p: &mut Peer, f: &dyn Fn(&mut softroce::wire::cm::ReqRepr)| {
        let mut m = CmMadRepr::parse(&p.req_bytes(dst, 7007, b"bent")).unwrap();
        let CmMsgRepr::Req(r) = &mut m.msg else {
            unreachable!()
        };
        f(r);
        m.to_bytes()
    };
    let expect_rej = |p: &Peer, mad: &[u8; MAD_LEN], reason: RejReason| {
        p.send_to_qp1(dst, GSI_QKEY, mad);
        assert_eq!(rejs(&p.recv_mads(Duration::from_millis(400))), vec![reason]);
    };
    for sid in [u64::MAX, 0, 0x0000_0000_013f_1b5f, 0x0100_0000_0106_1b5f] {
        let m = bent(&mut p, &|r| r.service_id = sid);
        expect_rej(&p, &m, RejReason::INVALID_SERVICE_ID);
    }
    // private data byte 1: IP version in bits 7:4; byte 0: CMA version.
    let m = bent(&mut p, &|r| r.private_data[1] = 6 << 4);
    expect_rej(&p, &m, RejReason::CONSUMER_DEFINED);
    let m = bent(&mut p, &|r| r.private_data[0] = 1);
    expect_rej(&p, &m, RejReason::CONSUMER_DEFINED);
    let m = bent(&mut p, &|r| r.private_data = [0xff; 92]);
    expect_rej(&p, &m, RejReason::CONSUMER_DEFINED);
    let e = listener
        .get_request(Duration::from_millis(200))
        .unwrap_err();
    assert_eq!(e.errno(), 110, "{e}");
    // Absurd QP fields in an otherwise good REQ reach the listener (the kernel passes them
    // on too) and the accept still answers: MTU code 0xf, QPN 0, every retry count 7.
    let m = bent(&mut p, &|r| {
        r.path_mtu = 0xf;
        r.local_qpn = 0;
        r.local_cm_response_timeout = 31;
        r.max_cm_retries = 15;
    });
    p.send_to_qp1(dst, GSI_QKEY, &m);
    let req = listener.get_request(T).unwrap();
    drop(req);
    assert_eq!(
        rejs(&p.recv_mads(Duration::from_millis(400))),
        vec![RejReason::CONSUMER_DEFINED]
    );

    // Stale messages naming connections that do not exist.
    let stale = |msg: CmMsgRepr| {
        CmMadRepr {
            hdr: MadHdrRepr::cm(0x42, 0),
            msg,
        }
        .to_bytes()
    };
    let rep = RepRepr {
        local_comm_id: 0x1234,
        remote_comm_id: 0xdead_beef,
        local_qkey: 0,
        local_qpn: 0x99,
        local_eecn: 0,
        starting_psn: 0,
        responder_resources: 0,
        initiator_depth: 0,
        target_ack_delay: 0,
        failover_accepted: 0,
        end_to_end_flow_control: false,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: 1,
        private_data: [0; 196],
    };
    p.send_to_qp1(dst, GSI_QKEY, &stale(CmMsgRepr::Rep(rep)));
    assert_eq!(
        rejs(&p.recv_mads(Duration::from_millis(400))),
        vec![RejReason::INVALID_COMM_ID]
    );
    let dreq = DreqRepr {
        local_comm_id: 0x1234,
        remote_comm_id: 0xdead_beef,
        remote_qpn_eecn: 0x99,
        private_data: [0; 220],
    };
    p.send_to_qp1(dst, GSI_QKEY, &stale(CmMsgRepr::Dreq(dreq)));
    let got = p.recv_mads(Duration::from_millis(400));
    assert!(
        matches!(
            got[..],
            [CmMadRepr {
                msg: CmMsgRepr::Drep(_),
                ..
            }]
        ),
        "{got:?}"
    );
    let rtu = RtuRepr {
        local_comm_id: 0x1234,
        remote_comm_id: 0xdead_beef,
        private_data: [0; 224],
    };
    p.send_to_qp1(dst, GSI_QKEY, &stale(CmMsgRepr::Rtu(rtu)));
    assert!(p.recv_mads(Duration::from_millis(300)).is_empty());
    assert_eq!(cm.with(|cm, _| cm.connection_count()), 0);
    eventually("mailboxes empty", || cm.mailbox_count() == 0);
}

/// Feeds the CM MADs that reach the peer within `wait` to its engine; returns them.
fn peer_pump(p: &mut Peer, from: Ipv4Addr, wait: Duration) -> Vec<CmMadRepr> {
    let got = p.recv_some(wait, 1);
    for m in &got {
        let now = p.now();
        p.cm.handle_mad(now, IpAddr::V4(from), &m.to_bytes());
    }
    got
}

// A peer that connects properly, then replays what it sent: the REQ while established
// (dropped, kernel cm_dup_req_handler), the RTU (dropped), its DREQ after the DREP
// (the DREP again) and the REQ in TIMEWAIT (REJ 10, stale connection; after TIMEWAIT a
// replayed REQ is a new one, in the kernel too, as its remote ID is forgotten). The listener's
// side sees one connection, established then disconnected; the driver keeps nothing after
// TIMEWAIT.
#[test]
fn replayed_req_rtu_and_dreq_get_the_kernel_answers() {
    let _serial = serial();
    let d = open("127.0.190.25");
    let listener = CmListener::bind(&d, 7008).unwrap();
    let cm = d.cm().unwrap();
    let dd = d.clone();
    let server = std::thread::spawn(move || {
        let (pd, cq) = (dd.alloc_pd().unwrap(), dd.create_cq(8, 0).unwrap());
        let qp = pd.create_qp(&cq, &cq, QpType::Rc).build().unwrap();
        let mut conn = listener.get_request(T).unwrap().accept(qp).unwrap();
        conn.wait_for_disconnect(T).unwrap();
        conn.disconnect(T).unwrap();
        listener
    });
    let dst = ip4("127.0.190.25");
    let mut p = Peer::new("127.0.190.26");
    let req = p.req_bytes(dst, 7008, b"replayer");
    let id = p.cm.connections().next().unwrap().0;
    p.send_to_qp1(dst, GSI_QKEY, &req);
    let got = peer_pump(&mut p, dst, Duration::from_millis(500));
    assert!(
        matches!(
            got[..],
            [CmMadRepr {
                msg: CmMsgRepr::Rep(_),
                ..
            }]
        ),
        "{got:?}"
    );
    let now = p.now();
    p.cm.establish(now, id).unwrap();
    let rtu = p.take_mad();
    p.send_to_qp1(dst, GSI_QKEY, &rtu);
    // Replays while established: nothing answers.
    p.send_to_qp1(dst, GSI_QKEY, &req);
    p.send_to_qp1(dst, GSI_QKEY, &rtu);
    assert!(p.recv_mads(Duration::from_millis(300)).is_empty());
    // Our DREQ: the listener's side answers with its DREP once its owner disconnects.
    let now = p.now();
    p.cm.disconnect(now, id).unwrap();
    let dreq = p.take_mad();
    p.send_to_qp1(dst, GSI_QKEY, &dreq);
    let got = peer_pump(&mut p, dst, Duration::from_millis(500));
    assert!(
        matches!(
            got[..],
            [CmMadRepr {
                msg: CmMsgRepr::Drep(_),
                ..
            }]
        ),
        "{got:?}"
    );
    let _listener = server.join().unwrap();
    // In TIMEWAIT (4.096 us x 2^17, about 0.54 s, from the DREP): the REQ again is stale,
    // the DREQ again gets the DREP again.
    p.send_to_qp1(dst, GSI_QKEY, &req);
    assert_eq!(
        rejs(&p.recv_some(Duration::from_millis(300), 1)),
        vec![RejReason::STALE_CONN]
    );
    p.send_to_qp1(dst, GSI_QKEY, &dreq);
    let got = p.recv_some(Duration::from_millis(300), 1);
    assert!(
        matches!(
            got[..],
            [CmMadRepr {
                msg: CmMsgRepr::Drep(_),
                ..
            }]
        ),
        "{got:?}"
    );
    eventually("TIMEWAIT over, mailboxes empty", || {
        cm.with(|cm, _| cm.connection_count()) == 0 && cm.mailbox_count() == 0
    });
}

// A peer that gives up mid-handshake, after the listener's REP: with a REJ (the accept
// fails with Rejected, reason and private data the peer's), or by never answering a REQ
// that asked for short CM timeouts (the REP's retries run out: the accept fails with
// ETIMEDOUT and the peer gets REJ(timeout)). Neither leaves anything behind.
#[test]
fn a_peer_that_drops_out_after_the_rep() {
    let _serial = serial();
    let d = open("127.0.190.27");
    let listener = CmListener::bind(&d, 7009).unwrap();
    let cm = d.cm().unwrap();
    let dst = ip4("127.0.190.27");
    let mut p = Peer::new("127.0.190.28");
    let dd = d.clone();
    let server = std::thread::spawn(move || {
        let (pd, cq) = (dd.alloc_pd().unwrap(), dd.create_cq(8, 0).unwrap());
        let mut results = Vec::new();
        for _ in 0..2 {
            let qp = pd.create_qp(&cq, &cq, QpType::Rc).build().unwrap();
            let r = listener.get_request(T).unwrap().accept(qp);
            results.push(r.map(|_| ()));
        }
        results
    });
    // 1: REJ after the REP.
    let req = p.req_bytes(dst, 7009, b"then no");
    let id = p.cm.connections().last().unwrap().0;
    p.send_to_qp1(dst, GSI_QKEY, &req);
    let got = peer_pump(&mut p, dst, T);
    assert!(
        matches!(
            got[..],
            [CmMadRepr {
                msg: CmMsgRepr::Rep(_),
                ..
            }]
        ),
        "{got:?}"
    );
    let now = p.now();
    p.cm.reject(now, id, b"changed my mind").unwrap();
    let rej = p.take_mad();
    p.send_to_qp1(dst, GSI_QKEY, &rej);
    // 2: a REQ with a 1 ms response timeout and one retry, whose REP nobody answers.
    let mut m = CmMadRepr::parse(&p.req_bytes(dst, 7009, b"silent")).unwrap();
    let CmMsgRepr::Req(r) = &mut m.msg else {
        unreachable!()
    };
    r.local_cm_response_timeout = 8;
    r.max_cm_retries = 1;
    p.send_to_qp1(dst, GSI_QKEY, &m.to_bytes());
    let results = server.join().unwrap();
    let Err(Error::Rejected(r)) = &results[0] else {
        panic!("{:?}", results[0])
    };
    assert_eq!(r.reason, RejReason::CONSUMER_DEFINED);
    assert_eq!(&r.private_data[..15], b"changed my mind");
    let e = results[1].as_ref().unwrap_err();
    assert_eq!(e.errno(), 110, "{e}");
    // The REP (and its retry), then REJ(timeout).
    let got = p.recv_mads(Duration::from_millis(300));
    assert_eq!(rejs(&got), vec![RejReason::TIMEOUT], "{got:?}");
    eventually("nothing held", || {
        cm.with(|cm, _| cm.connection_count()) == 0 && cm.mailbox_count() == 0
    });
}
