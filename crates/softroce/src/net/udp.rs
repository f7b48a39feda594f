//! UDP sockets and the driver thread of a device.
//!
//! A device owns UDP port 4791 on its address (IPv4, or IPv6 with `IPV6_V6ONLY`), sends from
//! one unconnected socket per UDP source port, and runs one driver thread (whatever the
//! number of QPs) that receives, feeds [`Device::handle_datagram`] and runs timers.
//!
//! Data path: the datagrams one pump of a QP produces go out as UDP GSO sends per (source
//! port, destination), each segment a whole RoCE packet with its own ICRC (for IPv4 over the
//! ID Linux gives that segment), else with `sendmmsg`; receives use `recvmmsg` and UDP GRO,
//! and the ACKs one receive batch causes leave together. [`UdpOptions::busy_poll`] lets the
//! thread polling a CQ drive the socket itself. See `net::batch` and examples/dataplane.rs. [`UdpOptions`] add the exact
//! receive-side ICRC mode (a raw socket beside the UDP one, `net::raw`) and a pcap capture
//! ([`Capture`](super::Capture)).

use super::SystemClock;
use super::batch::RecvBatch;
use super::cm::CmDriver;
use super::link::{FLUSH_AFTER_DATAGRAMS, UdpLink, UdpOptions};
use super::pcap::roce_addr;
use super::raw::split_gso_ipv4;
use super::sock;
use crate::cm::CmConfig;
use crate::verbs::{Cq, Device, DeviceConfig, PollHook, Wc};
use crate::wire::ROCE_V2_UDP_PORT;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// Longest the driver thread sleeps between timer checks.
const MAX_PARK: Duration = Duration::from_millis(5);

/// A device on real UDP, with its driver thread. Derefs to [`Device`]; dropping it stops the
/// thread and flushes its capture.
#[derive(Debug)]
pub struct UdpDevice {
    device: Device,
    link: Arc<UdpLink>,
    /// What the device's CQ poll hook drives, in busy-polling mode (`BusyPoll`).
    busy: Option<Arc<BusyPoller>>,
    stop: Arc<AtomicBool>,
    /// Makes the driver thread panic at its next turn ([`UdpDevice::inject_panic_for_test`]).
    panic_for_test: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// The CM on QP1, started by the first [`UdpDevice::cm`].
    cm: parking_lot::Mutex<Option<Arc<CmDriver>>>,
}

impl UdpDevice {
    /// Opens device `name` on `ip` (port 4791) with the system clock and starts its driver,
    /// with the process's default options ([`UdpOptions::set_process_default`]).
    /// Errors: socket errors (e.g. EADDRINUSE, EADDRNOTAVAIL for an address not on this host).
    pub fn open(name: &str, ip: IpAddr) -> io::Result<UdpDevice> {
        UdpDevice::open_with(DeviceConfig::new(name, ip))
    }

    /// Opens a device from a full config, with the process's default options.
    pub fn open_with(cfg: DeviceConfig) -> io::Result<UdpDevice> {
        UdpDevice::open_with_options(cfg, &UdpOptions::process_default())
    }

    /// Opens a device from a full config and explicit options. The port's active MTU is
    /// `cfg.active_mtu` capped as kernel rxe sets it from the netdev holding the address
    /// ([`rxe_port_mtu`](super::rxe_port_mtu): 1024 on a 1500-byte link), its speed and
    /// width rxe's for that netdev's link speed ([`rxe_port_rate`](super::rxe_port_rate):
    /// 10 Gb/s on a veth, 2.5 Gb/s on `lo`). Errors: as
    /// [`UdpDevice::open`]; with `exact_icrc` on IPv4, EPERM without CAP_NET_RAW.
    pub fn open_with_options(mut cfg: DeviceConfig, opts: &UdpOptions) -> io::Result<UdpDevice> {
        // The port's active MTU is at most what kernel rxe gives a port on the interface
        // holding the address (1024 on a 1500-byte link; 4096 on `lo`); its rate is rxe's.
        super::set_rxe_port(&mut cfg);
        let link = Arc::new(UdpLink::bind_with(cfg.ip, opts).map_err(|e| {
            let hint = match e.kind() {
                io::ErrorKind::AddrInUse => {
                    "; kernel rxe, or a softroce device opened with SOFTROCE_SHARE=0 or \
                     --exact-icrc, owns that address's RoCEv2 port: use another address (all \
                     of 127.0.0.0/8 is loopback)"
                }
                io::ErrorKind::AddrNotAvailable => "; that address is not on this host",
                io::ErrorKind::PermissionDenied if opts.exact_icrc => {
                    "; --exact-icrc needs a raw socket (root or CAP_NET_RAW)"
                }
                _ => "",
            };
            io::Error::new(
                e.kind(),
                format!(
                    "opening device {} on {}:{}: {e}{hint}",
                    cfg.name, cfg.ip, ROCE_V2_UDP_PORT
                ),
            )
        })?);
        cfg.qpn_slot = link.slot();
        let device = Device::new(cfg, link.clone(), Arc::new(SystemClock::new()));
        // Busy polling: every poll of the device's CQs receives in the polling thread, the
        // hook holding the device and link weakly (a CQ must not keep them open).
        let busy = link.busy_poll.then(|| {
            let poller = Arc::new(BusyPoller {
                device: device.clone(),
                link: link.clone(),
                group_buf: parking_lot::Mutex::new(Vec::new()),
                last_active_cq: AtomicUsize::new(0),
                idle_polls: AtomicU32::new(0),
            });
            device.set_poll_hook(Arc::new(BusyPoll(Arc::downgrade(&poller))));
            poller
        });
        let stop = Arc::new(AtomicBool::new(false));
        let panic_for_test = Arc::new(AtomicBool::new(false));
        let thread = {
            let (device, link, stop) = (device.clone(), link.clone(), stop.clone());
            let panic_for_test = panic_for_test.clone();
            std::thread::Builder::new()
                .name(format!("softroce-{}", device.name()))
                .spawn(move || {
                    // Real time where the process may (net::sched); no spinning then: a
                    // SCHED_FIFO thread that spins keeps the CPU from the application.
                    let rt = super::sched::realtime_wanted() && super::sched::enter_realtime();
                    // No silent hang: a panic fails the device, which wakes its waiters.
                    let run = || drive(&device, &link, &stop, &panic_for_test, !rt);
                    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
                        let msg = super::panic::message(&*p);
                        super::panic::report(
                            &format!("device {} driver thread", device.name()),
                            &msg,
                            "the device is now failed",
                        );
                        let why = format!("its driver thread panicked: {msg}");
                        let fail = || device.fail(&why);
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(fail));
                    }
                })?
        };
        Ok(UdpDevice {
            device,
            link,
            busy,
            stop,
            panic_for_test,
            thread: Some(thread),
            cm: parking_lot::Mutex::new(None),
        })
    }

    /// The device's Communication Manager (rdma_cm's connect/accept over QP1), started on
    /// first use with rdma_cm's timers ([`CmConfig::new`]): the device address, its node
    /// GUID, and a seed from the clock and the process ID. It takes over QP1; it stops when
    /// the device closes and the last handle is gone. It fails when the device does.
    /// Errors: those of [`CmDriver::start`]; `EIO` when the device failed before the CM
    /// started ([`Device::failure`]).
    pub fn cm(&self) -> crate::verbs::Result<Arc<CmDriver>> {
        let mut slot = self.cm.lock();
        if let Some(d) = &*slot {
            return Ok(d.clone());
        }
        if let Some(why) = self.device.failure() {
            return Err(crate::verbs::Error::new(
                crate::verbs::ErrorKind::Io,
                format!("device {}: {why}", self.device.name()),
            ));
        }
        let seed = super::clock::seed_from_clock_and_pid();
        let guid = self.device.query_device().node_guid;
        let mut config = CmConfig::new(self.device.ip(), guid, seed);
        config.comm_id_slot = self.link.slot();
        let d = Arc::new(CmDriver::start_shared(
            &self.device,
            config,
            Some(self.link.clone()),
        )?);
        *slot = Some(d.clone());
        Ok(d)
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The UDP link (datagram counters).
    pub fn link(&self) -> &UdpLink {
        &self.link
    }

    /// `ibv_poll_cq` on `cq`: [`Cq::poll`], which in busy-polling mode
    /// ([`UdpOptions::busy_poll`]) first receives in this thread, through the device's
    /// poll hook. Kept for callers; any CQ poll does the same.
    pub fn poll_cq(&self, cq: &Cq, out: &mut [Wc]) -> usize {
        cq.poll(out)
    }

    /// Test hook: makes the driver thread panic at its next turn, to check what a panic
    /// there does (the device fails, [`Device::fail`], and its waiters wake). Not for use
    /// outside tests.
    #[doc(hidden)]
    pub fn inject_panic_for_test(&self) {
        self.panic_for_test.store(true, Ordering::SeqCst);
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }

    /// In busy-polling mode, says that the thread that has been polling is about to block
    /// (on a completion channel, say): the ACKs its polls held back leave now and the
    /// driver thread goes back to receiving at once, instead of after the nap it takes while
    /// polls come in (up to 5 ms). The next poll undoes it. Does nothing
    /// outside busy-polling mode.
    pub fn poller_sleeps(&self) {
        if !self.link.busy_poll {
            return;
        }
        self.link.poller_asleep.store(true, Ordering::SeqCst);
        self.device.pump_deferred();
        self.link.flush_deferred();
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }
}

/// The CQ poll hook of a device opened with [`UdpOptions::busy_poll`]: a weak handle on its
/// [`BusyPoller`], so that a CQ the application keeps does not keep the sockets open. Once
/// the [`UdpDevice`] is gone, polls only take what the CQ holds.
struct BusyPoll(Weak<BusyPoller>);

impl PollHook for BusyPoll {
    fn poll(&self, cq: &Cq, out: &mut [Wc]) -> usize {
        match self.0.upgrade() {
            Some(poller) => poller.poll(cq, out),
            None => cq.poll_queued(out),
        }
    }
}

/// What a busy poll drives: the device and its link. Owned by the [`UdpDevice`].
#[derive(Debug)]
struct BusyPoller {
    device: Device,
    link: Arc<UdpLink>,
    /// The receive buffer of the multicast group sockets (64 KiB once a group is joined),
    /// taken with `try_lock` by one poller at a time.
    group_buf: parking_lot::Mutex<Vec<u8>>,
    /// The CQ ([`Cq::id`]) whose poll last received datagrams or returned completions; 0
    /// before any did. See [`flushes_held_acks`].
    last_active_cq: AtomicUsize,
    /// Polls in a row that neither received nor returned anything.
    idle_polls: AtomicU32,
}

/// Idle polls of other CQs in a row after which held ACKs go anyway (each looks at the
/// socket, about 1 µs: docs/performance.md), for an application that stops polling the CQ
/// its last completions came from and waits on another one.
const IDLE_POLLS_BEFORE_FLUSH: u32 = 16;

/// True when a busy poll of CQ `cq` that neither received nor returned anything should send
/// the ACKs held back: the application came back to the CQ that last gave it something
/// (`last_active`; or none did yet) and found nothing, so it waits for the peer; or
/// `idle_polls` polls in a row (this one included) found nothing. An idle poll of another
/// CQ is not that: UCX polls every CQ of every interface each progress round and answers
/// (a request that carries the held ACKs along) only after the round, so a flush on the
/// first idle CQ after the one that received costs a datagram and a system call per
/// message (`ucx_perftest -t tag_lat`: 2.2 `sendmsg` per round trip instead of 1.4).
fn flushes_held_acks(last_active: usize, cq: usize, idle_polls: u32) -> bool {
    last_active == 0 || last_active == cq || idle_polls >= IDLE_POLLS_BEFORE_FLUSH
}

impl BusyPoller {
    /// Notes what a poll of `cq` did: it received datagrams (`delivered`) or returned
    /// completions (`returned`), or neither. Returns true when the ACKs held back should go
    /// now ([`flushes_held_acks`]).
    fn note_poll(&self, cq: &Cq, delivered: bool, returned: bool) -> bool {
        let me = cq.id();
        self.link.poll_ended(returned);
        if returned {
            self.link.poll_returned();
        }
        if delivered || returned {
            self.last_active_cq.store(me, Ordering::Relaxed);
            self.idle_polls.store(0, Ordering::Relaxed);
            return false;
        }
        let idle = self.idle_polls.load(Ordering::Relaxed).saturating_add(1);
        self.idle_polls.store(idle, Ordering::Relaxed);
        flushes_held_acks(self.last_active_cq.load(Ordering::Relaxed), me, idle)
    }

    /// Polls `cq` into `out`: when the CQ holds nothing to return (or `out` is empty: a poll
    /// that only drives the device), it first receives and handles whatever datagrams are
    /// waiting on the device's socket, in this thread, without blocking.
    fn poll(&self, cq: &Cq, out: &mut [Wc]) -> usize {
        let link = &*self.link;
        link.polls.fetch_add(1, Ordering::Relaxed);
        let _running = InPoll::enter(&link.in_poll);
        // What posts left for this poll (doorbell batching, `Qp::post_send`) leaves first.
        self.device.pump_deferred();
        if link.poller_asleep.load(Ordering::Relaxed) {
            link.poller_asleep.store(false, Ordering::Relaxed);
        }
        if !link.poller_receives() {
            // Adaptive mode while the driver thread keeps up: it receives; we take what the
            // CQ holds, with no system call.
            return cq.poll_queued(out);
        }
        // Completions already in the CQ come back without a receive system call (≈ 1 µs
        // on an empty socket): the application acts on them first, and its answer can
        // still carry the ACKs held back.
        if !out.is_empty() {
            let n = cq.poll_queued(out);
            if n > 0 {
                self.note_poll(cq, false, true);
                if link.holds_too_many_acks() {
                    link.flush_deferred();
                }
                return n;
            }
        }
        // Whoever holds the receive buffers (the driver thread, for at most one
        // BUSY_DRIVER_RECV, before it sees the polls) delivers; we just poll then.
        let mut delivered = false;
        if let Some(mut rx) = link.rx.try_lock()
            && rx.recv(link.recv.as_raw_fd(), false).is_ok()
        {
            deliver(&self.device, link, &rx, false, true);
            delivered = true;
        }
        // The group sockets too: while a thread busy-polls, the driver thread waits on the
        // unicast socket only, so nobody else would receive them soon (mckey's receiver
        // spins on its CQ).
        if link.mcast_groups.load(Ordering::Relaxed) > 0
            && let Some(mut buf) = self.group_buf.try_lock()
        {
            buf.resize(GROUP_BUF_LEN, 0);
            delivered |= drain_groups(&self.device, link, &mut buf) > 0;
        }
        let n = cq.poll_queued(out);
        // The ACKs held back wait while the application has something new to act on (what
        // this poll delivered or returned: it may answer with a request that carries the
        // ACKs along, see `send_batch`). A poll that neither received nor returned anything
        // means it waits for the peer, so they go now, unless it is a poll of another CQ
        // (`flushes_held_acks`).
        if self.note_poll(cq, delivered, n > 0) || link.holds_too_many_acks() {
            link.flush_deferred();
        }
        n
    }
}

impl core::ops::Deref for UdpDevice {
    type Target = Device;
    fn deref(&self) -> &Device {
        &self.device
    }
}

impl Drop for UdpDevice {
    fn drop(&mut self) {
        drop(self.cm.lock().take());
        // From now on a poll of the device's CQs only takes what they hold.
        drop(self.busy.take());
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // ACKs a busy poller held back and nobody sent yet: the peer's last message must not
        // go unacknowledged because this side stopped polling and closed.
        self.link.flush_deferred();
        if let Some(c) = &self.link.capture {
            let _ = c.flush();
        }
    }
}

/// The driver loop: receive → `handle_datagram` (or `handle_ip_packet` in exact mode) →
/// (engine sends answers); between datagrams, run due timers. Sleeps at most [`MAX_PARK`]
/// so a timer armed by another thread is served late by at most that much. Plain UDP
/// receives are batched with `recvmmsg` and, with GRO, each buffer is cut at the segment
/// size the kernel reports. With `spin`, it spins [`DRIVER_SPIN`] on non-blocking receives,
/// yielding the CPU between them, before it blocks while traffic flows (not at real-time
/// priority: [`super::sched`]).
/// Panics (only) when a test asked it to with `panic_for_test`.
fn drive(
    device: &Device,
    link: &UdpLink,
    stop: &AtomicBool,
    panic_for_test: &AtomicBool,
    spin: bool,
) {
    let mut buf = vec![0u8; 65536];
    let mut seg_buf = Vec::with_capacity(65536);
    let mut timeout = None;
    let mut polls_seen = u64::MAX;
    let mut busy_until: Option<std::time::Instant> = None;
    let mut mix = TrafficMix::new(link);
    let mut nap = BusyNap::default();
    let mut unpolled = UnpolledSpin::new(std::time::Instant::now());
    *link.driver_thread.lock() = Some(std::thread::current());
    while !stop.load(Ordering::Relaxed) {
        // The test hook of `UdpDevice::inject_panic_for_test` (nothing else sets it): the
        // one panic here is the one a test asks for.
        if panic_for_test.load(Ordering::Relaxed) {
            panic!("panic injected by a test (UdpDevice::inject_panic_for_test)");
        }
        let mut park = device
            .next_timeout()
            .map_or(MAX_PARK, |d| d.clamp(Duration::from_micros(1), MAX_PARK));
        if !link.mcast.lock().is_empty() {
            // Group sockets are drained between receives on the unicast one.
            park = park.min(super::mcast::MAX_PARK);
        }
        if link.busy_poll {
            // What a poller's posts left, and the ACKs held back once they have waited
            // `DRIVER_ACK_HOLD` for the application's answer (the poller may have stopped
            // polling). Not sooner: this thread runs at times that have nothing to do with
            // the application's, and an ACK sent alone while the application was about to
            // answer ends the peer's poll before the answer comes, which then waits for the
            // peer's driver thread (seen in the rig's guest as one message in three).
            device.pump_deferred();
            match link.held_for() {
                Some(e) if e < DRIVER_ACK_HOLD && !link.holds_too_many_acks() => {
                    park = park.min(DRIVER_ACK_HOLD - e);
                }
                _ => link.flush_deferred(),
            }
            let polls = link.polls.load(Ordering::Relaxed);
            let now = std::time::Instant::now();
            unpolled.observe(polls, link.rx_datagrams.load(Ordering::Relaxed), now);
            if link.adaptive {
                mix.weigh(link);
            }
            if !link.poller_asleep.load(Ordering::SeqCst) && link.poller_receives() {
                let readable = if polls == polls_seen {
                    // No poll since we last looked: the application spins elsewhere
                    // (perftest's latency loop spins on memory for the peer's WRITE, which is
                    // ours to take at once) or works. Wait on the socket, without the receive
                    // buffers, so a poll that comes back still receives itself. An
                    // application that has not polled for long (a READ responder, a WRITE
                    // sink) is looked for first by a short spin (`UnpolledSpin`).
                    let budget = if spin {
                        unpolled.budget(now)
                    } else {
                        Duration::ZERO
                    };
                    let mut readable = Ok(false);
                    if !budget.is_zero() {
                        readable = spin_readable(link, polls, now + budget);
                    }
                    if matches!(readable, Ok(false)) && link.polls.load(Ordering::Relaxed) == polls
                    {
                        readable = sock::wait_readable(&link.recv, park.min(BUSY_DRIVER_RECV));
                    }
                    readable
                } else {
                    // A thread is busy-polling: it receives. We nap without waiting on the
                    // socket (each datagram would wake us for nothing, and on two cores that
                    // a ping-pong's applications keep busy a wakeup takes a core from one of
                    // them: in the rig's TCG guest each one cost hundreds of µs), then take
                    // what no poll took, serve timers, and nap again while polls take what
                    // comes (`BusyNap`; woken early by `UdpDevice::poller_sleeps`).
                    polls_seen = polls;
                    std::thread::park_timeout(park.min(BUSY_DRIVER_NAP));
                    sock::wait_readable(&link.recv, Duration::ZERO)
                };
                take_unpolled(device, link, readable, &mut nap, park);
                // The pollers drain the group sockets; this is for a poller that only
                // takes what its CQ holds (adaptive mode) or stopped between two turns.
                drain_groups(device, link, &mut buf);
                serve_timers(device, link);
                continue;
            }
            park = park.min(BUSY_DRIVER_RECV);
        }
        let got = match &link.raw {
            Some(raw) => raw.recv(&mut buf, park).map(|n| {
                link.rx_syscalls.fetch_add(1, Ordering::Relaxed);
                let packet = buf.get(..n).unwrap_or_default();
                let mut one = |data: &[u8]| {
                    link.rx_datagrams.fetch_add(1, Ordering::Relaxed);
                    if let Some(c) = &link.capture {
                        c.record_received_ip(data);
                    }
                    device.handle_ip_packet(data);
                };
                if !split_gso_ipv4(packet, &mut seg_buf, &mut one) {
                    one(packet);
                }
            }),
            None => {
                if timeout != Some(park) {
                    let _ = link.recv.set_read_timeout(Some(park));
                    timeout = Some(park);
                }
                let mut rx = link.rx.lock();
                // While traffic flows, spin a little on non-blocking receives before
                // sleeping in the kernel: a sleeping receiver costs the sender a wakeup (an
                // IPI, then a context switch here; ≈ 45–65 µs end to end, docs/performance.md#measured-costs-on-this-machine-class).
                let mut got = Err(io::ErrorKind::WouldBlock.into());
                if spin && busy_until.is_some_and(|t| std::time::Instant::now() < t) {
                    let spin_end = std::time::Instant::now() + DRIVER_SPIN;
                    loop {
                        got = rx.recv(link.recv.as_raw_fd(), false);
                        if got.is_ok() || std::time::Instant::now() >= spin_end {
                            break;
                        }
                        // Yield, not a spin hint: a thread that shares this CPU (the
                        // application posting, or waiting for what we receive) runs in our
                        // turn instead of after our spin. With a spin hint, each side
                        // pinned to a CPU of its own, write_lat 64 B took 60-68 µs instead
                        // of 20-29 and a 64 B WRITE stream ran 25 % slower; placed by the
                        // scheduler, latency is a quarter to a third higher with it
                        // (docs/performance.md, "The driver thread's spin yields").
                        std::thread::yield_now();
                    }
                }
                if got.is_err() {
                    got = rx.recv(link.recv.as_raw_fd(), true);
                }
                busy_until = got
                    .is_ok()
                    .then(|| std::time::Instant::now() + DRIVER_SPIN_AFTER_TRAFFIC);
                got.map(|_| {
                    // The ACKs this batch causes leave together at its end (one GSO send
                    // per flow where they are alike) instead of one system call each.
                    deliver(device, link, &rx, true, link.offload);
                    link.flush_deferred();
                })
            }
        };
        match got {
            Ok(()) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
        drain_groups(device, link, &mut buf);
        serve_timers(device, link);
    }
}

/// In busy-polling mode, after the driver thread found the socket `readable` (or not):
/// takes what waits there when no poll is about to ([`poller_quiet`]), holding the ACKs it
/// causes for the application's answer (`DRIVER_ACK_HOLD`); else, a poll runs and takes
/// it, so naps until a poll hands the application completions (it may go and spin on
/// memory now: `UdpLink::poll_returned`), or for the next [`BusyNap`].
fn take_unpolled(
    device: &Device,
    link: &UdpLink,
    readable: io::Result<bool>,
    nap: &mut BusyNap,
    park: Duration,
) {
    match readable {
        Ok(true) if poller_quiet(link) => {
            if drain_socket(device, link, DRAIN_BEFORE_TIMERS, true) > 0 {
                nap.took();
            }
        }
        Ok(true) => {
            link.driver_awaits_poll.store(true, Ordering::SeqCst);
            std::thread::park_timeout(park.min(nap.missed()));
            link.driver_awaits_poll.store(false, Ordering::Relaxed);
        }
        Ok(false) => {}
        Err(_) => std::thread::park_timeout(park.min(BUSY_DRIVER_NAP)),
    }
}

/// The most `recvmmsg` batches [`serve_timers`] takes from the socket before a due timer
/// runs: 64 batches of `RECV_BATCH` datagrams, more than a 128-PSN window of every QP of
/// a busy device (a socket that never empties must not hold the timers back for ever).
const DRAIN_BEFORE_TIMERS: usize = 64;

/// Runs the device's due QP timers, after receiving what already waits on its socket.
///
/// rxe handles each packet in softirq as it arrives, before the retransmit timer that the
/// packet's ACK stops can fire. Here the thread that receives may not have run for longer
/// than the ACK timeout (two cores, applications spinning on both): the ACK is queued on
/// the socket behind a due timer, and running the timer first would spend one of the
/// QP's `retry_cnt` retries (and resend a window) for a packet the peer acknowledged,
/// until `IBV_WC_RETRY_EXC_ERR` (libfabric's fi_pingpong, 1 MiB, beside CPU hogs).
/// So when a timer is due, the socket is drained first (up to [`DRAIN_BEFORE_TIMERS`]
/// batches; not if a busy poller holds the receive buffers: it is receiving). The raw
/// socket of exact-ICRC mode has no non-blocking receive here and is not drained.
fn serve_timers(device: &Device, link: &UdpLink) {
    // One look at the QPs' deadlines on a turn with nothing due (handle_timeouts would look
    // again and find nothing).
    if !device.timer_due() {
        return;
    }
    if link.raw.is_none() {
        drain_socket(device, link, DRAIN_BEFORE_TIMERS, false);
    }
    device.handle_timeouts();
}

/// Hands what waits on the plain UDP socket to the device, without blocking: up to `batches`
/// `recvmmsg` batches, none if another thread holds the receive buffers (a busy poller: it is
/// receiving). The ACKs the batches cause leave at the end, or with `hold` stay held for the
/// application's answer, as a busy poll holds them (unless [`UdpLink::holds_too_many_acks`]).
/// Returns the batches taken.
fn drain_socket(device: &Device, link: &UdpLink, batches: usize, hold: bool) -> usize {
    let mut taken = 0;
    while taken < batches {
        let Some(mut rx) = link.rx.try_lock() else {
            break;
        };
        if rx.recv(link.recv.as_raw_fd(), false).is_err() {
            break;
        }
        deliver(device, link, &rx, true, hold || link.offload);
        taken += 1;
    }
    if !hold || link.holds_too_many_acks() {
        link.flush_deferred();
    }
    taken
}

/// How long ACKs held back on a busy-polled device (by a poll, or by the driver thread for
/// what it took off the socket: a WRITE its application spins on memory for) wait for the
/// application's answer, which takes them along (`send_batch`), or its next idle poll,
/// before the driver thread sends them alone. perftest's latency loops answer within
/// microseconds, and the peer, polling for the ACK of its last message, then finds our
/// answer in the same receive: its poll takes it, no thread wakes (without the hold: a lone
/// ACK, the peer's poll returns, and every message after waits for a driver thread's
/// wakeup). 500 µs, not 100: an application that loses its core for a moment (to the
/// driver thread on two busy cores) answers late, and 100 µs then sent the ACK alone
/// (docs/performance.md, "The driver thread off the socket while polls receive"). The
/// peer's retransmit timer (4.096 µs × 2^timeout; rxe waits at least a jiffy) is far
/// longer for the timeouts programs set (perftest's default 14: 67 ms).
const DRIVER_ACK_HOLD: Duration = Duration::from_micros(500);

/// Counts a busy poll in [`UdpLink::in_poll`] for as long as it runs.
struct InPoll<'a>(&'a AtomicU32);

impl<'a> InPoll<'a> {
    fn enter(running: &'a AtomicU32) -> InPoll<'a> {
        running.fetch_add(1, Ordering::SeqCst);
        InPoll(running)
    }
}

impl Drop for InPoll<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// True when no busy poll runs and none started for [`QUIET_SPIN`]: a datagram on the
/// socket now is one no poller is about to take (the application spins elsewhere, on
/// memory, or blocks), so the driver thread takes it. A thread that polls in a loop starts
/// its next poll well within that time (a 64 B stream polls about every 2 µs here).
fn poller_quiet(link: &UdpLink) -> bool {
    if link.polling_in_a_loop(POLL_LOOP_WINDOW) {
        return false;
    }
    let polls = link.polls.load(Ordering::SeqCst);
    let end = std::time::Instant::now() + QUIET_SPIN;
    loop {
        if link.in_poll.load(Ordering::SeqCst) > 0 || link.polls.load(Ordering::SeqCst) != polls {
            return false;
        }
        if std::time::Instant::now() >= end {
            return true;
        }
        std::hint::spin_loop();
    }
}

/// How long [`poller_quiet`] watches the poll count before it says no poll is coming.
const QUIET_SPIN: Duration = Duration::from_micros(2);

/// A busy poll that returned nothing less than this long ago says that its application
/// loops on the CQ and will poll again ([`UdpLink::polling_in_a_loop`]), even when it does
/// not run just now: the driver thread, woken on one of the two cores that a ping-pong's
/// applications keep busy, may have taken that core from it, and then saw no poll in its
/// [`QUIET_SPIN`] and took what the poll was there for (in the rig's TCG guest, about one
/// message in four; on the host, the ping-pong's 99.9 % tail). Measured, 100 µs:
/// docs/performance.md, "The driver thread off the socket while polls receive".
const POLL_LOOP_WINDOW: Duration = Duration::from_micros(100);

/// The nap of a driver thread that found datagrams on the socket while busy polls took
/// them: [`BUSY_DRIVER_NAP_MIN`] after it last took some itself, doubling each time it
/// found a poll there to take them, up to [`BUSY_DRIVER_NAP`]. A ping-pong whose
/// application polls only for its own completions keeps it short (the driver takes every
/// other message); a stream the application polls for keeps it long, so the socket wakes
/// the driver thread a few thousand times a second at most, not once a datagram.
#[derive(Debug)]
struct BusyNap(Duration);

impl Default for BusyNap {
    fn default() -> BusyNap {
        BusyNap(BUSY_DRIVER_NAP_MIN)
    }
}

impl BusyNap {
    /// The driver thread took datagrams no poll was there to take.
    fn took(&mut self) {
        self.0 = BUSY_DRIVER_NAP_MIN;
    }

    /// A poll was there to take them: the nap to take now (the next one is twice as long).
    fn missed(&mut self) -> Duration {
        let now = self.0;
        self.0 = (now * 2).min(BUSY_DRIVER_NAP);
        now
    }
}

/// Looks at the socket without blocking, yielding the CPU between looks, until it is
/// readable (or fails), a busy poll starts (`link.polls` moves from `polls`), or `end`.
/// Returns the last look (`Ok(false)`: nothing came).
fn spin_readable(link: &UdpLink, polls: u64, end: std::time::Instant) -> io::Result<bool> {
    loop {
        let r = sock::wait_readable(&link.recv, Duration::ZERO);
        if !matches!(r, Ok(false))
            || link.polls.load(Ordering::Relaxed) != polls
            || std::time::Instant::now() >= end
        {
            return r;
        }
        std::thread::yield_now();
    }
}

/// In busy-polling mode, how long the driver thread spins on the socket before it blocks
/// there, for an application that does not poll (a READ responder: perftest's `ib_read_lat`
/// server never calls softroce during the test; a WRITE sink). Its driver thread takes every
/// request, and one that sleeps in `poll(2)` between requests is woken by each: in the rig's
/// TCG guest a wakeup on the idle vCPU took hundreds of µs (`ib_read_lat -s 64` t_typical
/// 610 µs [397-640] without the spin, 401 [244-429] with it, 5 rounds each; kernel rxe
/// 138-161 µs in the same runs; docs/performance.md, "A spin for applications that do not
/// poll").
/// The spin lasts twice the last interval between receives, at least [`DRIVER_SPIN`] and at
/// most [`UNPOLLED_SPIN_MAX`], and only while datagrams came in the last
/// [`DRIVER_SPIN_AFTER_TRAFFIC`] and no busy poll ran for [`UNPOLLED_AFTER`] (an
/// application that polls takes what comes itself, and a spinning driver thread would take
/// a core from it). It yields between looks, so a thread that shares the core runs. What it
/// costs: each look is a system call taken from whatever shares the core; on the host the
/// 64 B WRITE rate through the C library fell 4-9 % (its server's driver thread spins
/// between the client's bursts).
#[derive(Debug)]
struct UnpolledSpin {
    /// The poll count last seen, and when it was first seen.
    polls: u64,
    polls_at: std::time::Instant,
    /// The receive count last seen, and when it was first seen.
    rx: u64,
    rx_at: std::time::Instant,
    /// The last interval between two moves of the receive count.
    gap: Duration,
}

/// The longest spin of [`UnpolledSpin`].
const UNPOLLED_SPIN_MAX: Duration = Duration::from_micros(500);
/// [`UnpolledSpin`] spins only once no busy poll ran for this long: two of the driver
/// thread's longest naps.
const UNPOLLED_AFTER: Duration = Duration::from_millis(10);

impl UnpolledSpin {
    fn new(now: std::time::Instant) -> UnpolledSpin {
        UnpolledSpin {
            polls: u64::MAX,
            polls_at: now,
            rx: u64::MAX,
            rx_at: now,
            gap: Duration::ZERO,
        }
    }

    /// Notes the device's poll and receive counts at `now` (once a turn of the driver loop).
    fn observe(&mut self, polls: u64, rx: u64, now: std::time::Instant) {
        if polls != self.polls {
            self.polls = polls;
            self.polls_at = now;
        }
        if rx != self.rx {
            if self.rx != u64::MAX {
                self.gap = now.saturating_duration_since(self.rx_at);
            }
            self.rx = rx;
            self.rx_at = now;
        }
    }

    /// How long to spin at `now` before blocking (zero: block at once).
    fn budget(&self, now: std::time::Instant) -> Duration {
        let flowing = now.saturating_duration_since(self.rx_at) < DRIVER_SPIN_AFTER_TRAFFIC;
        let unpolled = now.saturating_duration_since(self.polls_at) >= UNPOLLED_AFTER;
        if flowing && unpolled {
            (self.gap * 2).clamp(DRIVER_SPIN, UNPOLLED_SPIN_MAX)
        } else {
            Duration::ZERO
        }
    }
}

/// In adaptive busy-polling mode ([`UdpOptions::busy_poll_adaptive`]), how often the driver
/// thread weighs what the device sent against what it received.
const MIX_PERIOD: Duration = Duration::from_millis(2);
/// A device that sent more than this many datagrams per datagram received in the last
/// [`MIX_PERIOD`] (a requester of bulk WRITEs or SENDs: many data packets out, an ACK back
/// now and then) leaves receiving to its driver thread; any other mix (ping-pong, a
/// receiver of bulk data, READ responses) lets busy polls receive.
const SENDER_RATIO: u64 = 4;

/// The driver thread's view of the device's traffic mix (adaptive busy polling).
#[derive(Debug)]
struct TrafficMix {
    /// When the mix was last weighed.
    at: std::time::Instant,
    /// `tx_datagrams` and `rx_datagrams` then.
    tx: u64,
    rx: u64,
}

impl TrafficMix {
    fn new(link: &UdpLink) -> TrafficMix {
        TrafficMix {
            at: std::time::Instant::now(),
            tx: link.tx_datagrams.load(Ordering::Relaxed),
            rx: link.rx_datagrams.load(Ordering::Relaxed),
        }
    }

    /// Every [`MIX_PERIOD`]: lets busy polls receive unless the device mostly sent
    /// ([`SENDER_RATIO`]). A quiet period changes nothing.
    fn weigh(&mut self, link: &UdpLink) {
        if self.at.elapsed() < MIX_PERIOD {
            return;
        }
        let now = TrafficMix::new(link);
        let (sent, received) = (now.tx - self.tx, now.rx - self.rx);
        *self = now;
        if sent + received == 0 {
            return;
        }
        let sender = sent > SENDER_RATIO * received;
        if link.poller_takes_socket.swap(!sender, Ordering::Relaxed) == sender {
            tracing::debug!(
                target: "softroce::net",
                sent,
                received,
                "busy polls {} the socket",
                if sender { "leave" } else { "take" }
            );
        }
    }
}

/// Hands the datagrams waiting on every multicast group socket of `link` to the device (at
/// most [`DRAIN_BATCH`] per group), without blocking; `buf` holds the largest datagram.
/// Returns how many were handed over. Called by the driver thread on each turn and by busy
/// polls, so that group traffic moves whichever of them runs.
fn drain_groups(device: &Device, link: &UdpLink, buf: &mut [u8]) -> usize {
    if link.mcast_groups.load(Ordering::Relaxed) == 0 {
        return 0;
    }
    let groups: Vec<_> = link
        .mcast
        .lock()
        .iter()
        .map(|(g, s)| (*g, s.clone()))
        .collect();
    groups
        .iter()
        .map(|(group, sock)| drain_group(device, link, *group, sock, buf))
        .sum()
}

/// Hands the datagrams waiting on group socket `sock` to the device (at most a batch);
/// returns how many.
fn drain_group(
    device: &Device,
    link: &UdpLink,
    group: IpAddr,
    sock: &UdpSocket,
    buf: &mut [u8],
) -> usize {
    for taken in 0..DRAIN_BATCH {
        let Ok((n, src)) = sock.recv_from(buf) else {
            return taken;
        };
        let data = buf.get(..n).unwrap_or_default();
        link.rx_datagrams
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some(c) = link.capture() {
            c.record_received_udp(src, SocketAddr::new(group, ROCE_V2_UDP_PORT), data);
        }
        device.handle_multicast_datagram(src, group, data);
    }
    DRAIN_BATCH
}

/// Most datagrams taken from one group socket per driver turn or busy poll.
const DRAIN_BATCH: usize = 64;
/// The size of a busy poller's group receive buffer: the largest UDP datagram.
const GROUP_BUF_LEN: usize = 65536;

/// How long the driver thread spins on non-blocking receives (yielding between them)
/// before it blocks, while traffic flows.
const DRIVER_SPIN: Duration = Duration::from_micros(30);
/// Traffic "flows" for this long after the last datagram received.
const DRIVER_SPIN_AFTER_TRAFFIC: Duration = Duration::from_millis(1);

/// In busy-polling mode, the longest the driver thread naps while a thread polls (the
/// polls receive; the nap ends sooner for a due QP timer, an ACK held too long, or
/// [`UdpDevice::poller_sleeps`]). 5 ms ([`MAX_PARK`]), not 0.5: in the rig's TCG guest each
/// wakeup of the driver thread took a vCPU from a spinning application (a ping-pong's
/// driver threads woke about once a message, 13-19 thousand context switches per 1,000
/// round trips of `ib_write_lat`; 7-9 thousand with 5 ms naps), and write_lat 64 B went from
/// 6.6x to 2.9x kernel rxe's t_typical (docs/performance.md, "Longer naps of the driver
/// thread while polls receive"). What it costs: a datagram that arrives after the
/// application's last poll, while it spins elsewhere, waits for the nap to end; perftest's
/// latency loops (poll for their own completion, then spin on memory for the peer's WRITE)
/// mostly find the WRITE taken by the poll that took its ACK, which travels with it.
const BUSY_DRIVER_NAP: Duration = MAX_PARK;
/// The shortest nap of [`BusyNap`].
const BUSY_DRIVER_NAP_MIN: Duration = Duration::from_micros(25);
/// In busy-polling mode, the longest the driver thread blocks in a receive (the longest a
/// poller that starts polling waits before it gets the socket).
const BUSY_DRIVER_RECV: Duration = Duration::from_millis(1);

/// Feeds what one `recvmmsg` returned to the device, cutting GRO buffers into their
/// datagrams. Segment `i` of a GRO buffer is checked first for IPv4 ID `i`, the ID the
/// kernel gives segment `i` of a GSO send (see [`Device::handle_gro_segment`]). With
/// `hold_acks`, the ACKs the batch causes wait in the link's hold for the caller to send
/// ([`UdpLink::flush_deferred`]). The caller holds `link.rx`.
fn deliver(device: &Device, link: &UdpLink, batch: &RecvBatch, per_buffer: bool, hold_acks: bool) {
    link.holding_acks.store(hold_acks, Ordering::Relaxed);
    let local = roce_addr(link.ip);
    link.rx_syscalls.fetch_add(1, Ordering::Relaxed);
    // One lock hold per batch (or per buffer), taken at its first datagram; each QP answers
    // once, at its end, so ACKs coalesce into the newest.
    let mut rx = None;
    for r in batch.received() {
        let Some(src) = r.src else { continue };
        let coalesced = r.segment_bytes.is_some_and(|g| g < r.data.len());
        if coalesced {
            link.rx_gro_buffers.fetch_add(1, Ordering::Relaxed);
        }
        let b = rx.get_or_insert_with(|| device.rx_batch());
        for (i, seg) in r.segments().enumerate() {
            link.rx_datagrams.fetch_add(1, Ordering::Relaxed);
            if let Some(c) = &link.capture {
                c.record_received_udp(src, local, seg);
            }
            if coalesced {
                b.gro_segment(src, seg, i);
            } else {
                b.datagram(src, seg);
            }
        }
        if per_buffer && link.datagrams_since_flush() >= FLUSH_AFTER_DATAGRAMS {
            // The ACKs of this buffer (up to 64 KiB) leave before the next is handled, so
            // the requester's window reopens while the rest of the batch is worked on. Not
            // after every short buffer: a message of a few datagrams that are not all of
            // one size is a buffer of its own (GSO and GRO coalesce only equal sizes), and
            // answering each one (an ACK per 8,256-byte SEND) cost more than half the
            // bandwidth of such a stream.
            drop(rx.take());
            link.flush_deferred();
        }
    }
    // The last QPs answer here, while the ACKs are still held.
    drop(rx);
    link.holding_acks.store(false, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::{
        AccessFlags, AhAttr, Gid, MULTICAST_QPN, QpCap, QpInitAttr, QpType, RecvWr, SendWr,
        WcStatus, WrOpcode,
    };
    use std::net::Ipv4Addr;

    /// A device on `ip` in busy-polling mode whose driver thread is stopped: only busy polls
    /// move its sockets.
    fn busy_device_without_driver(ip: Ipv4Addr) -> UdpDevice {
        let opts = UdpOptions {
            busy_poll: true,
            ..UdpOptions::default()
        };
        let mut d = UdpDevice::open_with_options(
            DeviceConfig::new("softroce_busy_mcast", IpAddr::V4(ip)),
            &opts,
        )
        .expect("open a device on loopback");
        d.stop.store(true, Ordering::SeqCst);
        if let Some(t) = d.thread.take() {
            t.join().expect("driver thread");
        }
        d
    }

    /// A PD on `d`, one CQ of 8, a QP of `qp_type` on it (all sends signaled) and an MR of
    /// `mr_len` bytes with local write.
    fn qp_with_mr(
        d: &Device,
        qp_type: QpType,
        mr_len: usize,
    ) -> (crate::verbs::Pd, Cq, crate::verbs::Qp, crate::verbs::Mr) {
        let pd = d.alloc_pd().unwrap();
        let cq = d.create_cq(8).unwrap();
        let qp = pd
            .create_qp(&QpInitAttr {
                qp_type,
                send_cq: &cq,
                recv_cq: &cq,
                cap: QpCap::default(),
                sq_sig_all: true,
                srq: None,
            })
            .unwrap();
        let mr = pd.reg_mr(mr_len, AccessFlags::LOCAL_WRITE).unwrap();
        (pd, cq, qp, mr)
    }

    /// The QP, CQ, MR and PD of one side of [`rc_pair`].
    type Side = (crate::verbs::Pd, Cq, crate::verbs::Qp, crate::verbs::Mr);

    /// A busy-polled device on 127.0.24.`a` without a driver thread and a plain one on
    /// 127.0.24.`b` (named `peer`), each with an RC QP and an MR of `mr_len` bytes
    /// (`qp_with_mr`), connected to each other with MTU 1024 and what `tune` sets on both.
    fn rc_pair(
        a: u8,
        b: u8,
        peer: &str,
        mr_len: usize,
        tune: impl Fn(&mut crate::verbs::RcConnect),
    ) -> (UdpDevice, UdpDevice, Side, Side) {
        let (ia, ib) = (Ipv4Addr::new(127, 0, 24, a), Ipv4Addr::new(127, 0, 24, b));
        let da = busy_device_without_driver(ia);
        let db = UdpDevice::open(peer, IpAddr::V4(ib)).expect("open a device on loopback");
        let sa = qp_with_mr(&da, QpType::Rc, mr_len);
        let sb = qp_with_mr(&db, QpType::Rc, mr_len);
        for (qp, other, ip) in [(&sa.2, &sb.2, ib), (&sb.2, &sa.2, ia)] {
            let mut c = crate::verbs::RcConnect::new(other.qp_num(), Gid::from(ip), 100, 100);
            c.path_mtu = crate::verbs::PathMtu::Mtu1024;
            tune(&mut c);
            qp.connect_rc(&c).unwrap();
        }
        (da, db, sa, sb)
    }

    // While an application thread busy-polls, the driver thread only serves timers
    // (mckey's receiver spins on ibv_poll_cq): the busy polls must receive the multicast
    // group sockets as well as the unicast one, or group datagrams reach the engine only
    // when the spinning thread happens to be descheduled for the driver's nap (the mckey
    // test hung in about half its runs). With the driver stopped, a poll is the only
    // receiver, so this fails whenever a busy poll skips the group sockets.
    #[test]
    fn a_busy_poll_receives_the_multicast_group_sockets() {
        let r = busy_device_without_driver(Ipv4Addr::new(127, 0, 24, 41));
        let s = UdpDevice::open(
            "softroce_mcast_tx",
            IpAddr::V4(Ipv4Addr::new(127, 0, 24, 42)),
        )
        .expect("open a device on loopback");
        let group = Gid::from(Ipv4Addr::new(239, 24, 0, 3));
        const QKEY: u32 = 0x1234_5678;
        let ud = |d: &Device| {
            let (pd, cq, qp, mr) = qp_with_mr(d, QpType::Ud, 256);
            qp.ready_ud(QKEY, 0).unwrap();
            (pd, cq, qp, mr)
        };
        let (_rpd, rcq, rqp, rmr) = ud(&r);
        rqp.post_recv(&[RecvWr {
            wr_id: 7,
            sg_list: vec![rmr.sge(0, 256)],
        }])
        .unwrap();
        rqp.attach_mcast(&group, 0).unwrap();
        let (spd, scq, sqp, smr) = ud(&s);
        smr.write(0, b"to the group").unwrap();
        let ah = spd.create_ah(&AhAttr::roce_v2(group)).unwrap();
        let mut wr = SendWr::new(1, WrOpcode::Send, vec![smr.sge(0, 12)]);
        wr.ud = Some(ah.dest(MULTICAST_QPN, QKEY));
        sqp.post_send(&[wr]).unwrap();
        let mut wc = [Wc::default()];
        assert_eq!(scq.wait(&mut wc, Duration::from_secs(10)), 1);
        assert_eq!(wc[0].status, WcStatus::Success);
        // The datagram is on the group socket (loopback delivers within the send); the
        // deadline only ends a failing run.
        let end = std::time::Instant::now() + Duration::from_secs(10);
        let mut polls = 0u64;
        while r.poll_cq(&rcq, &mut wc) == 0 {
            polls += 1;
            assert!(
                std::time::Instant::now() < end,
                "{polls} busy polls took nothing from the group socket"
            );
        }
        assert_eq!((wc[0].status, wc[0].wr_id), (WcStatus::Success, 7));
        assert_eq!(wc[0].byte_len, 40 + 12);
        let mut got = [0u8; 12];
        rmr.read(40, &mut got).unwrap();
        assert_eq!(&got, b"to the group");
    }

    // An ACK that waits on the socket when the retransmit timer is due must be handled
    // before the timer: the thread that receives may not have run for longer than the ACK
    // timeout (fi_pingpong beside CPU hogs spent retries on ACKs it had, until
    // IBV_WC_RETRY_EXC_ERR). With retry_cnt 0 a single spurious timeout ends the SEND with
    // RETRY_EXC_ERR, so this fails whenever the timer runs first.
    #[test]
    fn a_due_retransmit_timer_waits_for_the_ack_already_on_the_socket() {
        // The shortest ACK timeout (8.192 µs) and no retry: one timeout is fatal.
        let (a, b, (_apd, acq, aqp, amr), (_bpd, bcq, bqp, bmr)) =
            rc_pair(71, 72, "softroce_ack_peer", 64, |c| {
                c.timeout = 1;
                c.retry_cnt = 0;
            });
        bqp.post_recv(&[RecvWr {
            wr_id: 5,
            sg_list: vec![bmr.sge(0, 64)],
        }])
        .unwrap();
        amr.write(0, b"acknowledged").unwrap();
        aqp.post_send(&[SendWr::new(1, WrOpcode::Send, vec![amr.sge(0, 12)])])
            .unwrap();
        let mut wc = [Wc::default()];
        assert_eq!(bcq.wait(&mut wc, Duration::from_secs(10)), 1);
        assert_eq!((wc[0].status, wc[0].wr_id), (WcStatus::Success, 5));
        // B's driver sends the ACK at the end of its receive batch, after the receive
        // completed: wait for that send (B's only datagram; loopback queues it on A's socket
        // within the send call, before the count moves).
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while b.link().tx_datagrams.load(Ordering::SeqCst) == 0 {
            assert!(std::time::Instant::now() < end, "B never sent its ACK");
            std::thread::yield_now();
        }
        // A's retransmit timer (8 µs) comes due while nothing has received the ACK.
        while !a.timer_due() {
            assert!(
                std::time::Instant::now() < end,
                "the retransmit timer never came due"
            );
            std::thread::yield_now();
        }
        serve_timers(&a.device, &a.link);
        assert_eq!(acq.poll_queued(&mut wc), 1, "the SEND completed");
        assert_eq!((wc[0].status, wc[0].wr_id), (WcStatus::Success, 1));
        assert_eq!(aqp.counters().completer_retry_err, 0, "no retry was spent");
    }

    // An idle poll sends the held ACKs only when it is a poll of the CQ that last gave
    // something (or none did), or after IDLE_POLLS_BEFORE_FLUSH idle polls in a row.
    #[test]
    fn only_an_idle_poll_of_the_last_active_cq_or_a_long_idle_run_flushes() {
        let n = IDLE_POLLS_BEFORE_FLUSH;
        for (last_active, cq, idle, flushes) in [
            (0, 7, 1, true),  // nothing was received or returned yet
            (7, 7, 1, true),  // back at the CQ that gave the last completions
            (7, 8, 1, false), // another CQ of the same progress round
            (7, 8, n - 1, false),
            (7, 8, n, true), // the application waits on another CQ
        ] {
            assert_eq!(
                flushes_held_acks(last_active, cq, idle),
                flushes,
                "{last_active} {cq} {idle}"
            );
        }
    }

    // UCX polls every CQ of every interface in a progress round and posts its answer only
    // after the round: the ACK a poll of the receive CQ holds back must survive the idle
    // polls of the other CQs, or it leaves alone instead of with the answer. The receiver's
    // driver thread is stopped, so only its polls send (its count of sent datagrams).
    #[test]
    fn idle_polls_of_another_cq_keep_the_held_ack() {
        // An ACK timeout of 4.3 s: no retransmission while the receiver holds its ACK.
        let (r, _s, (_rpd, rcq, rqp, rmr), (_spd, scq, sqp, smr)) =
            rc_pair(91, 92, "softroce_hold_tx", 64, |c| c.timeout = 20);
        let other = r.create_cq(8).unwrap();
        let sent = || r.link().tx_datagrams.load(Ordering::SeqCst);
        let mut wc = [Wc::default()];
        // The deadline only ends a failing run.
        let end = std::time::Instant::now() + Duration::from_secs(10);
        for round in 0..2u64 {
            rqp.post_recv(&[RecvWr {
                wr_id: round,
                sg_list: vec![rmr.sge(0, 64)],
            }])
            .unwrap();
            smr.write(0, b"held").unwrap();
            sqp.post_send(&[SendWr::new(round, WrOpcode::Send, vec![smr.sge(0, 4)])])
                .unwrap();
            while r.poll_cq(&rcq, &mut wc) == 0 {
                assert!(std::time::Instant::now() < end, "the SEND never arrived");
            }
            assert_eq!((wc[0].status, wc[0].wr_id), (WcStatus::Success, round));
            let before = sent();
            // Round 0: one idle poll of another CQ keeps the ACK, the next idle poll of the
            // receive CQ sends it. Round 1: the receive CQ is not polled again; the ACK
            // goes on the IDLE_POLLS_BEFORE_FLUSH-th idle poll of the other CQ.
            let keeps = if round == 0 {
                1
            } else {
                IDLE_POLLS_BEFORE_FLUSH - 1
            };
            for i in 0..keeps {
                assert_eq!(r.poll_cq(&other, &mut wc), 0);
                assert_eq!(
                    sent(),
                    before,
                    "round {round}: idle poll {i} of another CQ sent"
                );
            }
            if round == 0 {
                assert_eq!(r.poll_cq(&rcq, &mut wc), 0);
            } else {
                assert_eq!(r.poll_cq(&other, &mut wc), 0);
            }
            assert_eq!(sent(), before + 1, "round {round}: the held ACK did not go");
            assert_eq!(scq.wait(&mut wc, Duration::from_secs(10)), 1);
            assert_eq!((wc[0].status, wc[0].wr_id), (WcStatus::Success, round));
        }
    }

    /// Posts `n` receives of `msg` bytes each, back to back in `mr`, WR IDs 0 to n - 1.
    fn post_recvs(qp: &crate::verbs::Qp, mr: &crate::verbs::Mr, n: u64, msg: usize) {
        let wrs: Vec<RecvWr> = (0..n)
            .map(|i| RecvWr {
                wr_id: i,
                sg_list: vec![mr.sge(i as usize * msg, msg as u32)],
            })
            .collect();
        qp.post_recv(&wrs).unwrap();
    }

    /// Posts 8 receives of `msg` bytes on the receiver's QP and 8 SENDs of `msg` bytes on
    /// the sender's, and waits until the sender `s` sent `datagrams` (loopback queues each
    /// on the receiver's socket within the send call).
    fn send_8_and_wait(
        s: &UdpDevice,
        (rqp, rmr): (&crate::verbs::Qp, &crate::verbs::Mr),
        (sqp, smr): (&crate::verbs::Qp, &crate::verbs::Mr),
        msg: usize,
        datagrams: u64,
    ) {
        post_recvs(rqp, rmr, 8, msg);
        let sends: Vec<SendWr> = (0..8)
            .map(|i| {
                SendWr::new(
                    i,
                    WrOpcode::Send,
                    vec![smr.sge(i as usize * msg, msg as u32)],
                )
            })
            .collect();
        sqp.post_send(&sends).unwrap();
        // The deadline only ends a failing run.
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while s.link().tx_datagrams.load(Ordering::SeqCst) < datagrams {
            assert!(
                std::time::Instant::now() < end,
                "the sender did not send {datagrams} datagrams"
            );
            std::thread::yield_now();
        }
    }

    // A busy poller that keeps finding completions never polls idle, so the ACKs it holds
    // must still go once ACK_AFTER_DATAGRAMS datagrams came in: the peer's window is 128
    // PSNs, and ACKs that wait for an idle poll let it fill the window and stop (UCX's
    // tag_bw spent most of its time that way). Here 8 SENDs of 5 packets (40 datagrams)
    // are all on the receiver's socket before it polls, one completion per poll, none idle.
    #[test]
    fn a_poller_that_never_polls_idle_still_acks_a_stream() {
        const MSG: usize = 5 * 1024;
        let (r, s, (_rpd, rcq, rqp, rmr), (_spd, scq, sqp, smr)) =
            rc_pair(93, 94, "softroce_stream_tx", 8 * MSG, |c| c.timeout = 20);
        send_8_and_wait(&s, (&rqp, &rmr), (&sqp, &smr), MSG, 40);
        let mut wc = [Wc::default()];
        for i in 0..8 {
            assert_eq!(r.poll_cq(&rcq, &mut wc), 1, "poll {i} found no completion");
            assert_eq!((wc[0].status, wc[0].wr_id), (WcStatus::Success, i));
        }
        assert!(
            r.link().tx_datagrams.load(Ordering::SeqCst) >= 1,
            "40 datagrams in, 8 completions out, no idle poll: no ACK went"
        );
        // The idle poll that sends what is still held (the receiver has no driver thread).
        assert_eq!(r.poll_cq(&rcq, &mut wc), 0);
        let mut done = 0;
        while done < 8 {
            let n = scq.wait(&mut wc, Duration::from_secs(10));
            assert_eq!(n, 1, "the sender's SEND {done} did not complete");
            assert_eq!(wc[0].status, WcStatus::Success);
            done += 1;
        }
    }

    // The driver thread answers after a received buffer only once FLUSH_AFTER_DATAGRAMS
    // datagrams came in since it last did. A SEND that is not a multiple of the MTU is a
    // buffer of its own (GSO and GRO coalesce equal sizes only: 5 full packets and a short
    // one here), and answering after each such buffer sent an ACK per message (`softroce
    // perf send_bw -s 8256`, UCX's fragment size: 0.46x the bandwidth of 8192-byte SENDs).
    // Here the receiver's driver is stopped and its turn is run by hand on 8 such buffers
    // (48 datagrams): 3 ACKs at most (one per 16 datagrams and the end), not 8.
    #[test]
    fn the_driver_acks_a_stream_of_short_buffers_once_per_16_datagrams() {
        const MSG: usize = 5 * 1024 + 64;
        let (r, s, (_rpd, rcq, rqp, rmr), (_spd, scq, sqp, smr)) =
            rc_pair(95, 96, "softroce_short_bufs", 8 * MSG, |c| c.timeout = 20);
        let link = r.link();
        if !link.offload {
            // One datagram per receive without offloads: no buffer of several to answer.
            return;
        }
        send_8_and_wait(&s, (&rqp, &rmr), (&sqp, &smr), MSG, 48);
        // The deadline only ends a failing run.
        let end = std::time::Instant::now() + Duration::from_secs(10);
        // The driver thread's turn: receive batches, deliver buffer by buffer, answer.
        let mut received = 0;
        while received < 48 {
            let mut rx = link.rx.lock();
            if rx.recv(link.recv.as_raw_fd(), false).is_ok() {
                deliver(&r, link, &rx, true, true);
                link.flush_deferred();
            }
            received = link.rx_datagrams.load(Ordering::SeqCst);
            assert!(
                std::time::Instant::now() < end,
                "{received} of 48 datagrams received"
            );
        }
        let acks = link.tx_datagrams.load(Ordering::SeqCst);
        assert!(
            (1..=3).contains(&acks),
            "{acks} ACKs for 8 SENDs of 6 datagrams (one per buffer would be 8)"
        );
        let mut wc = [Wc::default()];
        for i in 0..8 {
            assert_eq!(r.poll_cq(&rcq, &mut wc), 1, "receive {i} did not complete");
            assert_eq!((wc[0].status, wc[0].wr_id), (WcStatus::Success, i));
        }
        for i in 0..8 {
            assert_eq!(
                scq.wait(&mut wc, Duration::from_secs(10)),
                1,
                "the sender's SEND {i} did not complete"
            );
            assert_eq!(wc[0].status, WcStatus::Success);
        }
    }

    // Doorbell batching (`Qp::post_send`): on a busy-polled device, a post to a QP with WRs
    // outstanding leaves its transmit to the next poll (perftest's ib_write_bw posts one WR
    // per call, then polls: 0.36 -> about 1 M messages/s at 64 B), and a post to an idle QP
    // (a ping-pong) leaves at once. The sender here has no driver thread: only its posts
    // and polls move its socket, so what each one sent is counted exactly.
    #[test]
    fn a_post_to_a_busy_qp_leaves_with_the_next_poll_and_one_to_an_idle_qp_at_once() {
        const MSG: usize = 64;
        let (s, _r, (_spd, scq, sqp, smr), (_rpd, rcq, rqp, rmr)) =
            rc_pair(97, 98, "softroce_doorbell", 4 * MSG, |c| c.timeout = 20);
        post_recvs(&rqp, &rmr, 2, MSG);
        let send = |i: u64| {
            SendWr::new(
                i,
                WrOpcode::Send,
                vec![smr.sge(i as usize * MSG, MSG as u32)],
            )
        };
        let sent = || s.link().tx_datagrams.load(Ordering::SeqCst);
        sqp.post_send(&[send(0)]).unwrap();
        assert_eq!(
            sent(),
            1,
            "a post to an idle QP is sent before post_send returns"
        );
        // SEND 0 is outstanding: its ACK waits on the socket until a poll takes it.
        sqp.post_send(&[send(1)]).unwrap();
        assert_eq!(
            sent(),
            1,
            "a post to a QP with a WR outstanding waits for the next poll"
        );
        let mut wc = [Wc::default()];
        // This poll may also return SEND 0's completion (its ACK can be on the socket by
        // now): it counts.
        let mut done = s.poll_cq(&scq, &mut wc);
        assert!(sent() >= 2, "the poll sent the waiting SEND");
        // Both arrive and both complete (the deadline only ends a failing run).
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while done < 2 {
            done += s.poll_cq(&scq, &mut wc);
            assert!(
                std::time::Instant::now() < end,
                "{done} of 2 SENDs completed"
            );
        }
        for i in 0..2 {
            assert_eq!(rcq.wait(&mut wc, Duration::from_secs(10)), 1, "receive {i}");
            assert_eq!((wc[0].status, wc[0].wr_id), (WcStatus::Success, i));
        }
    }

    /// Runs `f` in a thread and returns what it gives, waiting up to 20 s for it: the
    /// deadline only ends a run in which `f` hangs (the bug these tests catch).
    fn returns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(20))
            .expect("a waiter on the device still blocks 20 s after its driver thread panicked")
    }

    // Issue 22 (no silent hang): a panic in the device's driver thread fails the device.
    // Waiters blocked on it then return, each with an error or what the failure flushed:
    // a CQ wait with nothing outstanding (0), one with a receive posted (WR_FLUSH_ERR), a
    // completion channel wait (EIO), the async event queue (IBV_EVENT_DEVICE_FATAL), and a
    // wait on the device's CM (EIO). Later waits return at once too.
    #[test]
    fn a_driver_thread_panic_fails_the_device_and_wakes_its_waiters() {
        let dev = UdpDevice::open("softroce_panic0", IpAddr::V4(Ipv4Addr::new(127, 0, 24, 61)))
            .expect("open a device on loopback");
        let cm = dev.cm().expect("start the device's CM");
        cm.listen(0x0106_0000_0000_1234).expect("listen");
        assert_eq!(
            dev.get_async_event(Duration::from_secs(1))
                .map(|e| e.event_type),
            Ok(crate::verbs::EventType::PortActive)
        );
        let pd = dev.alloc_pd().unwrap();
        let idle_cq = dev.create_cq(8).unwrap();
        let rq_cq = dev.create_cq(8).unwrap();
        let channel = dev.create_comp_channel().unwrap();
        let armed_cq = dev.create_cq_with_channel(8, &channel).unwrap();
        armed_cq.req_notify(false).unwrap();
        let qp = pd
            .create_qp(&QpInitAttr {
                qp_type: QpType::Ud,
                send_cq: &rq_cq,
                recv_cq: &rq_cq,
                cap: QpCap::default(),
                sq_sig_all: true,
                srq: None,
            })
            .unwrap();
        qp.ready_ud(0x1111, 0).unwrap();
        let mr = pd.reg_mr(256, AccessFlags::LOCAL_WRITE).unwrap();
        qp.post_recv(&[RecvWr {
            wr_id: 9,
            sg_list: vec![mr.sge(0, 256)],
        }])
        .unwrap();
        let long = Duration::from_secs(3600);
        let idle = {
            let cq = idle_cq.clone();
            std::thread::spawn(move || cq.wait(&mut [Wc::default()], long))
        };
        let flushed = {
            let cq = rq_cq.clone();
            std::thread::spawn(move || {
                let mut wc = [Wc::default()];
                (cq.wait(&mut wc, long), wc[0].status, wc[0].wr_id)
            })
        };
        let event = {
            let ch = channel.clone();
            std::thread::spawn(move || ch.get_cq_event(long).map(|_| ()).map_err(|e| e.kind()))
        };
        let request = {
            let cm = cm.clone();
            std::thread::spawn(move || {
                cm.next_request(0x0106_0000_0000_1234, long)
                    .map(|_| ())
                    .map_err(|e| e.kind())
            })
        };
        let fatal = {
            let d = dev.device().clone();
            std::thread::spawn(move || d.get_async_event(long).map(|e| e.event_type))
        };
        dev.inject_panic_for_test();
        let joined = returns(move || {
            (
                idle.join().ok(),
                flushed.join().ok(),
                event.join().ok(),
                request.join().ok(),
                fatal.join().ok(),
            )
        });
        assert_eq!(joined.0, Some(0), "an idle CQ wait returns empty");
        assert_eq!(
            joined.1,
            Some((1, WcStatus::WrFlushErr, 9)),
            "the receive is flushed"
        );
        assert_eq!(
            joined.2,
            Some(Err(crate::verbs::ErrorKind::Io)),
            "get_cq_event fails"
        );
        assert_eq!(
            joined.3,
            Some(Err(crate::verbs::ErrorKind::Io)),
            "the CM wait fails"
        );
        assert_eq!(
            joined.4,
            Some(Ok(crate::verbs::EventType::DeviceFatal)),
            "IBV_EVENT_DEVICE_FATAL"
        );
        let why = dev.failure().expect("the device is failed");
        assert!(why.contains("panic injected by a test"), "{why}");
        assert!(cm.failure().is_some());
        // Later waits do not block either.
        let (cq, ch, cm2) = (idle_cq.clone(), channel.clone(), cm.clone());
        let later = returns(move || {
            (
                cq.wait(&mut [Wc::default()], long),
                ch.get_cq_event(long).map(|_| ()).map_err(|e| e.kind()),
                cm2.next_event(crate::cm::CommId(1), long)
                    .map(|_| ())
                    .map_err(|e| e.kind()),
            )
        });
        assert_eq!(
            later,
            (
                0,
                Err(crate::verbs::ErrorKind::Io),
                Err(crate::verbs::ErrorKind::Io)
            )
        );
        drop(cm);
        drop(dev);
    }

    // Issue 23 (the latency tail): while a thread busy-polls, the driver thread naps after
    // the socket woke it for a datagram a poll was there to take, 25 µs the first time and
    // twice as long each time again (a stream the application polls for wakes it a few
    // thousand times a second, not once a datagram), back to 25 µs once it took datagrams
    // no poll was there for (a ping-pong whose application spins on memory).
    #[test]
    fn the_driver_nap_doubles_while_polls_take_the_datagrams_and_resets_when_it_takes_one() {
        let mut nap = BusyNap::default();
        let naps: Vec<u128> = (0..10).map(|_| nap.missed().as_micros()).collect();
        assert_eq!(naps, [25, 50, 100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        nap.took();
        assert_eq!(nap.missed(), BUSY_DRIVER_NAP_MIN);
    }

    // Issue 23 (read_lat in the rig's guest): the driver thread of a busy-polled device
    // whose application does not poll spins on the socket before it blocks: twice the last
    // interval between receives, within [DRIVER_SPIN, UNPOLLED_SPIN_MAX], only while
    // datagrams keep coming and only once no poll ran for UNPOLLED_AFTER.
    #[test]
    fn the_driver_spins_for_an_application_that_does_not_poll_while_traffic_flows() {
        let t0 = std::time::Instant::now();
        let at = |us: u64| t0 + Duration::from_micros(us);
        let mut s = UnpolledSpin::new(t0);
        s.observe(7, 0, t0);
        assert_eq!(
            s.budget(t0),
            Duration::ZERO,
            "no traffic yet, a poll just ran"
        );
        // Requests 200 µs apart, no poll since t0.
        let mut now = 0;
        for rx in 1..=60 {
            now = 200 * rx;
            s.observe(7, rx, at(now));
        }
        assert!(at(now) - t0 >= UNPOLLED_AFTER);
        assert_eq!(s.budget(at(now)), Duration::from_micros(400));
        // Back to back: at least DRIVER_SPIN; far apart: at most UNPOLLED_SPIN_MAX.
        s.observe(7, 61, at(now + 1));
        assert_eq!(s.budget(at(now + 1)), DRIVER_SPIN);
        s.observe(7, 62, at(now + 901));
        assert_eq!(s.budget(at(now + 901)), UNPOLLED_SPIN_MAX);
        // Silence for DRIVER_SPIN_AFTER_TRAFFIC: block at once.
        let quiet = now + 901 + DRIVER_SPIN_AFTER_TRAFFIC.as_micros() as u64;
        assert_eq!(s.budget(at(quiet)), Duration::ZERO);
        // A poll ran: the poller takes what comes, for UNPOLLED_AFTER no spin.
        s.observe(8, 63, at(quiet + 10));
        assert_eq!(s.budget(at(quiet + 20)), Duration::ZERO);
        let later = quiet + 10 + UNPOLLED_AFTER.as_micros() as u64;
        s.observe(8, 64, at(later));
        assert!(s.budget(at(later)) > Duration::ZERO);
    }

    // The driver thread takes a datagram off a busy-polled device's socket only when no
    // poll runs (and none starts within QUIET_SPIN); otherwise the poll takes it.
    #[test]
    fn the_driver_takes_the_socket_only_while_no_poll_runs() {
        let d = busy_device_without_driver(Ipv4Addr::new(127, 0, 24, 71));
        let link = d.link();
        assert!(poller_quiet(link), "no poll ran: quiet");
        {
            let _running = InPoll::enter(&link.in_poll);
            assert!(!poller_quiet(link), "a poll runs");
        }
        assert_eq!(link.in_poll.load(Ordering::SeqCst), 0);
        assert!(poller_quiet(link), "the poll returned");
    }

    // A poll that ended a moment ago with nothing to return belongs to an application that
    // loops on its CQ (perftest waiting for its send completion): the driver thread leaves
    // the socket to the next poll, even though none runs right now (the driver may have
    // taken the application's core). A poll that returned completions does not say that.
    #[test]
    fn an_idle_poll_a_moment_ago_keeps_the_driver_off_the_socket() {
        let d = busy_device_without_driver(Ipv4Addr::new(127, 0, 24, 72));
        let link = d.link();
        assert!(!link.polling_in_a_loop(POLL_LOOP_WINDOW), "no poll yet");
        link.poll_ended(false);
        assert!(link.polling_in_a_loop(POLL_LOOP_WINDOW));
        assert!(!poller_quiet(link), "the application polls in a loop");
        assert!(
            !link.polling_in_a_loop(Duration::ZERO),
            "outside the window the poll is history"
        );
        link.poll_ended(true);
        assert!(!link.polling_in_a_loop(POLL_LOOP_WINDOW));
        assert!(
            poller_quiet(link),
            "the application acts on its completions"
        );
    }

    // A driver thread that naps because a poll took what woke it goes back to the socket as
    // soon as a poll returns completions (the application may now spin on memory for the
    // peer's next message, which nobody else would receive): `poll_returned` wakes it.
    #[test]
    fn a_poll_that_returns_completions_wakes_the_napping_driver_thread() {
        let d = busy_device_without_driver(Ipv4Addr::new(127, 0, 24, 72));
        let link = Arc::clone(&d.link);
        link.driver_awaits_poll.store(true, Ordering::SeqCst);
        let (tx, rx) = std::sync::mpsc::channel();
        let napper = {
            let link = Arc::clone(&link);
            std::thread::spawn(move || {
                // In place of the device's (stopped) driver thread.
                *link.driver_thread.lock() = Some(std::thread::current());
                tx.send(()).unwrap();
                // Parks until `poll_returned` clears the flag and unparks (a spurious
                // wakeup just parks again).
                while link.driver_awaits_poll.load(Ordering::SeqCst) {
                    std::thread::park();
                }
            })
        };
        rx.recv().unwrap();
        link.poll_returned();
        assert!(!link.driver_awaits_poll.load(Ordering::SeqCst));
        returns(move || napper.join().is_ok());
        // Without a napping driver thread it does nothing.
        link.poll_returned();
        assert!(!link.driver_awaits_poll.load(Ordering::SeqCst));
    }

    // Issue 23: the ACK for a message the driver thread took off a busy-polled device's
    // socket (its application spins on memory for it, as perftest's latency loop does)
    // waits for the application's answer and leaves in the same system call, so that the
    // peer, polling for that ACK, finds the answer in the same receive.
    #[test]
    fn the_ack_for_what_the_driver_took_waits_for_the_answer_and_leaves_with_it() {
        const MSG: usize = 64;
        let (a, _b, (_apd, _acq, aqp, amr), (_bpd, bcq, bqp, bmr)) =
            rc_pair(73, 74, "softroce_ack_hold", 2 * MSG, |c| c.timeout = 20);
        post_recvs(&aqp, &amr, 1, MSG);
        post_recvs(&bqp, &bmr, 1, MSG);
        let send = |mr: &crate::verbs::Mr, i: u64| {
            SendWr::new(i, WrOpcode::Send, vec![mr.sge(MSG, MSG as u32)])
        };
        bqp.post_send(&[send(&bmr, 1)]).unwrap();
        let link = a.link();
        let sent = || link.tx_datagrams.load(Ordering::SeqCst);
        // The deadline only ends a failing run.
        assert_eq!(
            sock::wait_readable(&link.recv, Duration::from_secs(10)).ok(),
            Some(true),
            "the SEND reached the socket"
        );
        let before = sent();
        assert_eq!(drain_socket(&a, link, DRAIN_BEFORE_TIMERS, true), 1);
        assert_eq!(link.deferred.lock().len(), 1, "the ACK is held");
        assert!(
            link.held_for().is_some(),
            "the hold is timed, whoever flushes it"
        );
        assert_eq!(sent(), before, "nothing went out yet");
        aqp.post_send(&[send(&amr, 2)]).unwrap();
        assert!(
            link.deferred.lock().is_empty(),
            "the answer took the ACK along"
        );
        assert_eq!(link.held_for(), None, "nothing is held");
        assert_eq!(sent(), before + 2, "the answer and the ACK");
        // The peer: its SEND completes (the ACK) and the answer arrives.
        let mut got = Vec::new();
        let mut wc = [Wc::default()];
        while got.len() < 2 {
            assert_eq!(bcq.wait(&mut wc, Duration::from_secs(10)), 1, "{got:?}");
            got.push((wc[0].status, wc[0].wr_id));
        }
        got.sort_by_key(|g| g.1);
        assert_eq!(got, [(WcStatus::Success, 0), (WcStatus::Success, 1)]);
    }
}
