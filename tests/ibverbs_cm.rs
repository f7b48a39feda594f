//! The Rust API's rdma_cm-shaped connection setup (`softroce_ibverbs::cm`) over real UDP on
//! loopback, addresses 127.0.170.0/24 (run inside `unshare -n` beside other tests, or
//! anywhere 127/8 is on lo): two devices connect RC QPs through REQ/REP/RTU with private
//! data both ways (the seed's pattern: the listener announces {addr, rkey, len} in its REP,
//! the connecting side RDMA WRITEs there), then DREQ/DREP; a listener that rejects with
//! private data; a connect to a port nobody listens on (REJ 8); a connect to an address
//! with no device (ETIMEDOUT after the caller's timeout); a port listened on twice
//! (EADDRINUSE); a dropped connection disconnecting; and, through `softroce exec` on
//! softroce's librdmacm.so.1, our connect against the seed's C rdma_server and the seed's C
//! rdma_client against our listener (skipped, saying why, without librdmacm-dev or cc).

mod exec_support;

use softroce_ibverbs::{
    AccessFlags, CmListener, Context, DeviceList, Error, QpType, RejReason, Wc, WcStatus,
};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

fn open(ip: &str) -> Context {
    DeviceList::with_ip(&[ip.parse::<IpAddr>().unwrap()])[0]
        .open()
        .expect("open device (127.0.170.0/24 on lo)")
}

/// The seed's `struct ConnInfo { uint64_t addr; uint32_t rkey; uint32_t len; }`, packed,
/// little-endian (x86-64), as the listener sends it in its REP.
fn conn_info(addr: u64, rkey: u32, len: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&addr.to_le_bytes());
    b[8..12].copy_from_slice(&rkey.to_le_bytes());
    b[12..].copy_from_slice(&len.to_le_bytes());
    b
}

fn parse_conn_info(b: &[u8]) -> (u64, u32, u32) {
    (
        u64::from_le_bytes(b[..8].try_into().unwrap()),
        u32::from_le_bytes(b[8..12].try_into().unwrap()),
        u32::from_le_bytes(b[12..16].try_into().unwrap()),
    )
}

#[test]
fn connect_accept_with_private_data_then_rdma_write_and_disconnect() {
    let (a, b) = (open("127.0.170.1"), open("127.0.170.2"));
    let listener = CmListener::bind(&b, 7471).unwrap();
    assert_eq!(listener.local_addr(), "127.0.170.2:7471".parse().unwrap());

    let server = std::thread::spawn(move || {
        let (pd, cq) = (b.alloc_pd().unwrap(), b.create_cq(8, 0).unwrap());
        let buf = pd.allocate(4096).unwrap();
        let req = listener.get_request(T).unwrap();
        assert_eq!(
            req.peer_addr().ip(),
            "127.0.170.1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(req.private_data().len(), 56);
        assert_eq!(&req.private_data()[..12], b"client hello");
        let qp = pd
            .create_qp(&cq, &cq, QpType::Rc)
            .set_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .build()
            .unwrap();
        let info = conn_info(buf.addr(), buf.rkey(), 4096);
        let mut conn = req.accept_with(qp, &info).unwrap();
        assert_eq!(&conn.private_data()[..12], b"client hello");
        // The client writes, then disconnects; our disconnect answers with the DREP.
        conn.wait_for_disconnect(T).unwrap();
        conn.disconnect(T).unwrap();
        buf.to_vec()
    });

    let (pd, cq) = (a.alloc_pd().unwrap(), a.create_cq(8, 0).unwrap());
    let prep = pd
        .create_qp(&cq, &cq, QpType::Rc)
        .set_access(AccessFlags::LOCAL_WRITE)
        .build()
        .unwrap();
    let mut conn = prep
        .connect("127.0.170.2:7471".parse().unwrap(), b"client hello", T)
        .unwrap();
    assert_eq!(conn.peer_addr(), "127.0.170.2:7471".parse().unwrap());
    assert_eq!(conn.private_data().len(), 196);
    let (addr, rkey, len) = parse_conn_info(conn.private_data());
    assert_eq!(len, 4096);
    let msg = b"Hello RDMA over the Rust CM";
    let src = pd.register(msg).unwrap();
    let remote = softroce_ibverbs::RemoteMemorySlice {
        addr,
        length: u64::from(len),
        rkey,
    };
    conn.post_write(
        &[src.slice(0..msg.len())],
        remote.slice(0..msg.len() as u64),
        9,
        None,
    )
    .unwrap();
    let mut wc = [Wc::default(); 2];
    let done = cq.wait(&mut wc, T).unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!((done[0].wr_id, done[0].status), (9, WcStatus::Success));
    conn.disconnect(T).unwrap();
    let got = server.join().unwrap();
    assert_eq!(&got[..msg.len()], msg);
}

#[test]
fn listener_rejects_with_private_data_and_port_without_listener_is_rej_8() {
    let (a, b) = (open("127.0.170.3"), open("127.0.170.4"));
    let listener = CmListener::bind(&b, 7000).unwrap();
    // The same port twice: EADDRINUSE.
    assert_eq!(CmListener::bind(&b, 7000).unwrap_err().errno(), 98);
    let server = std::thread::spawn(move || {
        let req = listener.get_request(T).unwrap();
        assert_eq!(&req.private_data()[..3], b"may");
        req.reject(b"go away").unwrap();
        listener
    });
    let (pd, cq) = (a.alloc_pd().unwrap(), a.create_cq(8, 0).unwrap());
    let qp = || pd.create_qp(&cq, &cq, QpType::Rc).build().unwrap();
    let e = qp()
        .connect("127.0.170.4:7000".parse().unwrap(), b"may I?", T)
        .unwrap_err();
    let Error::Rejected(r) = &e else {
        panic!("{e}")
    };
    assert_eq!(r.reason, RejReason::CONSUMER_DEFINED);
    assert_eq!(&r.private_data[..7], b"go away");
    assert_eq!(e.errno(), 111); // ECONNREFUSED, as librdmacm's rdma_connect
    let _listener = server.join().unwrap();

    // Nobody listens on port 7001: the peer's CM answers REJ 8 (invalid service ID).
    let e = qp()
        .connect("127.0.170.4:7001".parse().unwrap(), &[], T)
        .unwrap_err();
    let Error::Rejected(r) = &e else {
        panic!("{e}")
    };
    assert_eq!(r.reason, RejReason::INVALID_SERVICE_ID);
    assert_eq!(e.errno(), 111);

    // Too much private data for a REQ (56 bytes after rdma_cm's header): EINVAL.
    let e = qp()
        .connect("127.0.170.4:7000".parse().unwrap(), &[0; 57], T)
        .unwrap_err();
    assert_eq!(e.errno(), 22);
}

// Dropping a connection disconnects it: the peer sees DISCONNECTED (our DREQ), answers with
// its DREP, and its engine then holds the connection in TIMEWAIT (or not at all).
#[test]
fn dropping_a_connection_sends_the_dreq() {
    let (a, b) = (open("127.0.170.6"), open("127.0.170.7"));
    let listener = CmListener::bind(&b, 7474).unwrap();
    let server = std::thread::spawn(move || {
        let (pd, cq) = (b.alloc_pd().unwrap(), b.create_cq(8, 0).unwrap());
        let qp = pd.create_qp(&cq, &cq, QpType::Rc).build().unwrap();
        let mut conn = listener.get_request(T).unwrap().accept(qp).unwrap();
        conn.wait_for_disconnect(T).unwrap();
        conn.disconnect(T).unwrap();
        // The connection is now in TIMEWAIT (or gone), not ESTABLISHED.
        let cm = b.cm().unwrap();
        cm.with(|cm, _| {
            cm.connections()
                .all(|(_, s)| s == softroce::cm::CmState::Timewait)
        })
    });
    let (pd, cq) = (a.alloc_pd().unwrap(), a.create_cq(8, 0).unwrap());
    let qp = pd.create_qp(&cq, &cq, QpType::Rc).build().unwrap();
    let conn = qp
        .connect("127.0.170.7:7474".parse().unwrap(), &[], T)
        .unwrap();
    assert_eq!(conn.private_data(), &[0u8; 196][..]);
    drop(conn);
    assert!(server.join().unwrap());
}

#[test]
fn connect_to_an_address_without_a_device_times_out() {
    let a = open("127.0.170.5");
    let (pd, cq) = (a.alloc_pd().unwrap(), a.create_cq(8, 0).unwrap());
    let qp = pd.create_qp(&cq, &cq, QpType::Rc).build().unwrap();
    let nobody: SocketAddr = "127.0.170.99:7471".parse().unwrap();
    let e = qp
        .connect(nobody, b"anyone?", Duration::from_millis(500))
        .unwrap_err();
    assert_eq!(e.errno(), 110, "{e}"); // ETIMEDOUT
    // The REQ was withdrawn: the device's CM holds no connection.
    let cm = a.cm().unwrap();
    assert_eq!(cm.with(|cm, _| cm.connection_count()), 0);
}

/// Compiles seed program `name` (tests/c/seed) with the seed's command into `dir`; None
/// (the caller skips, saying why) without librdmacm's headers or a C compiler.
fn seed_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("softroce-ibverbs-cm-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

// Interop: our connect against the seed's C rdma_server on softroce's librdmacm.so.1.
#[test]
fn rust_connect_writes_into_the_seed_c_rdma_server() {
    let dir = seed_dir("server");
    let Some(server) = exec_support::compile_c("seed/rdma_server", &dir) else {
        return;
    };
    let srv = exec_support::exec("127.0.170.10", &[server.as_os_str(), "7472".as_ref()])
        .spawn()
        .unwrap();
    exec_support::wait_device("127.0.170.10".parse().unwrap());
    let a = open("127.0.170.11");
    let (pd, cq) = (a.alloc_pd().unwrap(), a.create_cq(8, 0).unwrap());
    let to: SocketAddr = "127.0.170.10:7472".parse().unwrap();
    // The server opens its device before it listens: until then its CM answers REJ 8.
    let start = std::time::Instant::now();
    let mut conn = loop {
        let qp = pd.create_qp(&cq, &cq, QpType::Rc).build().unwrap();
        match qp.connect(to, &[], T) {
            Err(Error::Rejected(r))
                if r.reason == RejReason::INVALID_SERVICE_ID && start.elapsed() < T =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            r => break r.unwrap(),
        }
    };
    let (addr, rkey, len) = parse_conn_info(conn.private_data());
    assert_eq!(len, 4096);
    let msg = b"Hello RDMA from the Rust CM";
    let src = pd.register(msg).unwrap();
    let remote = softroce_ibverbs::RemoteMemorySlice {
        addr,
        length: 4096,
        rkey,
    };
    conn.post_write(
        &[src.slice(0..msg.len())],
        remote.slice(0..msg.len() as u64),
        1,
        None,
    )
    .unwrap();
    let mut wc = [Wc::default(); 2];
    let done = cq.wait(&mut wc, T).unwrap();
    assert_eq!((done.len(), done[0].status), (1, WcStatus::Success));
    // The server prints what landed after 2 s, then rdma_disconnect: DREQ, our DREP.
    conn.wait_for_disconnect(T).unwrap();
    conn.disconnect(T).unwrap();
    let out = exec_support::wait(srv, Duration::from_secs(20), "rdma_server");
    let _ = std::fs::remove_dir_all(&dir);
    let sout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{sout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        sout.lines()
            .any(|l| l == "[server] received: 'Hello RDMA from the Rust CM'"),
        "{sout}"
    );
}

// Interop the other way: the seed's C rdma_client connects to our listener and writes into
// the buffer our REP announced.
#[test]
fn seed_c_rdma_client_writes_into_a_rust_listener() {
    let dir = seed_dir("client");
    let Some(client) = exec_support::compile_c("seed/rdma_client", &dir) else {
        return;
    };
    let b = open("127.0.170.12");
    let listener = CmListener::bind(&b, 7473).unwrap();
    let cli = exec_support::exec(
        "127.0.170.13",
        &[client.as_os_str(), "127.0.170.12".as_ref(), "7473".as_ref()],
    )
    .spawn()
    .unwrap();
    let (pd, cq) = (b.alloc_pd().unwrap(), b.create_cq(8, 0).unwrap());
    let buf = pd.allocate(4096).unwrap();
    let req = listener.get_request(T).unwrap();
    assert_eq!(
        req.peer_addr().ip(),
        "127.0.170.13".parse::<IpAddr>().unwrap()
    );
    let qp = pd
        .create_qp(&cq, &cq, QpType::Rc)
        .set_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .build()
        .unwrap();
    let mut conn = req
        .accept_with(qp, &conn_info(buf.addr(), buf.rkey(), 4096))
        .unwrap();
    conn.wait_for_disconnect(T).unwrap();
    conn.disconnect(T).unwrap();
    let out = exec_support::wait(cli, Duration::from_secs(20), "rdma_client");
    let _ = std::fs::remove_dir_all(&dir);
    let cout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{cout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        cout.lines().any(|l| l == "[client] write done, status=0"),
        "{cout}"
    );
    let text = b"Hello RDMA from client! Data lands directly in server memory.";
    assert_eq!(&buf.to_vec()[..text.len()], text);
}

// No silent hang (issue 22): a panic in the device's CM driver thread makes a listener
// blocked in get_request return EIO, and a wait on a CQ after a panic in the device's own
// driver thread returns EIO too. The 20 s deadline only ends a run that hangs.
#[test]
fn a_cm_driver_panic_fails_a_blocked_get_request_then_a_device_panic_a_cq_wait() {
    let ctx = open("127.0.170.20");
    let listener = CmListener::bind(&ctx, 7471).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = listener.get_request(Duration::from_secs(3600));
        let _ = tx.send(r.map(|_| ()).map_err(|e| e.errno()));
    });
    ctx.cm().unwrap().inject_panic_for_test();
    assert_eq!(rx.recv_timeout(Duration::from_secs(20)), Ok(Err(5)));

    let cq = ctx.create_cq(4, 0).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut wc = [Wc::default()];
        let r = cq.wait(&mut wc, Duration::from_secs(3600)).map(|w| w.len());
        let _ = tx.send(r.map_err(|e| e.errno()));
    });
    ctx.inject_panic_for_test();
    assert_eq!(rx.recv_timeout(Duration::from_secs(20)), Ok(Err(5)));
}
