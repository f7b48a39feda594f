//! Registered memory the application keeps using (issue 13, item 1): two softroce devices
//! on loopback (127.13.0.1 and .2, which no other test uses), both MRs over application
//! memory (`reg_mr_user`). A thread spins on the last byte of the target buffer while the
//! peer RDMA WRITEs it, as perftest's latency tests do, and must see the flag and then the
//! whole payload; between messages the application rewrites its buffers while they stay
//! registered. The WRITEs leave the source buffer zero-copy (the UDP link gathers), so the
//! ICRC over application memory in pieces is checked by the receiver on every packet.

use softroce::net::UdpDevice;
use softroce::verbs::{
    AccessFlags, Cq, Gid, Mr, PathMtu, Pd, Qp, QpCap, QpInitAttr, QpType, RcConnect, SendFlags,
    SendWr, Wc, WcStatus, WrOpcode,
};
use std::alloc::Layout;
use std::net::{IpAddr, Ipv4Addr};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// The longest message: 16 packets at MTU 4096, plus one more byte.
const LEN: usize = (64 << 10) + 1;

/// Application memory from the global allocator, page-aligned, touched only through raw
/// pointers and atomics (as a C program would), freed on drop.
struct AppBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: a plain allocation, shared between the test's threads only through raw pointers
// and atomics.
unsafe impl Send for AppBuf {}
// SAFETY: as for `Send`.
unsafe impl Sync for AppBuf {}

impl AppBuf {
    fn new(len: usize) -> AppBuf {
        let layout = Layout::from_size_align(len, 4096).expect("layout");
        // SAFETY: `layout` has a non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }).expect("alloc");
        AppBuf { ptr, layout }
    }

    fn register(&self, pd: &Pd) -> Mr {
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        // SAFETY: the buffer outlives the MR: every `Mr` is dropped before its `AppBuf`
        // (declared after it in `Side`).
        unsafe { pd.reg_mr_user(self.ptr.as_ptr(), self.layout.size(), access) }
            .expect("reg_mr_user")
    }

    /// The application writes `data` at `off`.
    fn poke(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.layout.size());
        // SAFETY: in bounds (asserted) of the live allocation; `data` is ours.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(off), data.len())
        };
    }

    /// The application reads `n` bytes at `off`.
    fn peek(&self, off: usize, n: usize) -> Vec<u8> {
        assert!(off + n <= self.layout.size());
        let mut v = vec![0u8; n];
        // SAFETY: in bounds (asserted) of the live allocation; `v` is ours.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), v.as_mut_ptr(), n) };
        v
    }

    /// The byte at `off` as the flag the application spins on.
    fn flag(&self, off: usize) -> &AtomicU8 {
        assert!(off < self.layout.size());
        // SAFETY: in bounds (asserted) of the allocation, which lives as long as `&self`;
        // the device's store to the last byte of a WRITE is atomic (release), and the
        // application's other accesses to it are ordered by this one.
        unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(off)) }
    }
}

impl Drop for AppBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

struct Side {
    dev: UdpDevice,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    // Dropped after `mr`, which deregisters it.
    buf: AppBuf,
    _pd: Pd,
}

fn side(ip: Ipv4Addr) -> Side {
    let dev = UdpDevice::open("softroce_test", IpAddr::V4(ip)).expect("open device");
    let pd = dev.alloc_pd().expect("pd");
    let cq = dev.create_cq(64).expect("cq");
    let qp = pd
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            cap: QpCap::default(),
            sq_sig_all: false,
            srq: None,
        })
        .expect("qp");
    let buf = AppBuf::new(LEN);
    let mr = buf.register(&pd);
    Side {
        dev,
        cq,
        qp,
        mr,
        buf,
        _pd: pd,
    }
}

fn wait_one(cq: &Cq) -> Wc {
    let mut wc = [Wc::default()];
    assert_eq!(
        cq.wait(&mut wc, Duration::from_secs(20)),
        1,
        "no completion within 20 s"
    );
    wc[0]
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    // Never 0 in the last byte, which is the flag.
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(salt) | 1)
        .collect()
}

/// A thread spins on the last byte of a registered buffer while the peer WRITEs it; it
/// sees the flag, then the whole payload. Sizes of one byte, one packet and many packets.
#[test]
fn a_thread_spinning_on_a_registered_buffer_sees_a_remote_write_land() {
    let a = side(Ipv4Addr::new(127, 13, 0, 1));
    let b = side(Ipv4Addr::new(127, 13, 0, 2));
    for (me, peer) in [(&a, &b), (&b, &a)] {
        let mut c = RcConnect::new(peer.qp.qp_num(), Gid::from_ip(peer.dev.ip()), 0, 0);
        c.path_mtu = PathMtu::Mtu4096;
        me.qp.connect_rc(&c).expect("connect");
    }
    for (round, len) in [1usize, 64, 4096, 4097, LEN].into_iter().enumerate() {
        let data = pattern(len, round as u8);
        // The application fills its source buffer while it is registered.
        a.buf.poke(0, &data);
        let flag_at = len - 1;
        assert_eq!(b.buf.flag(flag_at).load(Ordering::Relaxed), 0);
        let seen = std::thread::scope(|s| {
            let spinner = s.spawn(|| {
                let flag = b.buf.flag(flag_at);
                let deadline = Instant::now() + Duration::from_secs(30);
                let mut spins = 0u64;
                while flag.load(Ordering::Acquire) == 0 {
                    spins += 1;
                    if spins.is_multiple_of(4096) {
                        assert!(
                            Instant::now() < deadline,
                            "round {round}: the flag byte of a {len}-byte WRITE never changed"
                        );
                    }
                    std::hint::spin_loop();
                }
                b.buf.peek(0, len)
            });
            let mut w = SendWr::new(
                round as u64,
                WrOpcode::RdmaWrite,
                vec![a.mr.sge(0, len as u32)],
            );
            w.remote_addr = b.mr.addr();
            w.rkey = b.mr.rkey();
            w.send_flags = SendFlags::SIGNALED;
            a.qp.post_send(&[w]).expect("post_send");
            spinner.join().expect("spinner")
        });
        assert!(
            seen == data,
            "round {round}: the spinner saw the flag before the payload"
        );
        let wc = wait_one(&a.cq);
        assert_eq!((wc.status, wc.wr_id), (WcStatus::Success, round as u64));
        // The application clears its target buffer for the next round, still registered.
        b.buf.poke(0, &vec![0u8; len]);
    }
    assert_eq!(b.buf.peek(0, LEN), vec![0u8; LEN]);
    for s in [&a, &b] {
        let c = s.dev.counters();
        assert_eq!(c.dropped_total(), 0, "{:?}", c.entries());
    }
}
