//! The thread that drives a device's Communication Manager: a [`CmPort`] on the device's
//! QP1, a driver thread that waits on QP1's CQ up to the engine's next timer and feeds what
//! comes in (MADs, due timers) to the engine, and mailboxes that sort the engine's events by
//! connection and by listened service ID, so that threads of the frontend (the Rust API's
//! connect/accept) wait for their own events. It adds no protocol: every decision is the
//! engine's ([`CmEngine`]); QPs are the caller's to modify (with `RcConnect::rdma_cm_*`).
//!
//! Open through [`UdpDevice::cm`](super::UdpDevice::cm): one per device, started on first
//! use, stopped when the device closes. librdmacm.so.1 runs the same engine with a driver
//! of its own over libibverbs.so.1's private MAD entry points (its devices live in another
//! library's registry, reached only through the C ABI).
//!
//! Time: the real monotonic clock, from when the driver started. Locks: one mutex over the
//! port and the mailboxes; nothing blocks while holding it.
//!
//! Failure: when the driver thread panics (reported as `net::panic` says), or sees its
//! device fail ([`Device::fail`]), the CM is failed for good: every wait for an event or a
//! request, pending or later, returns `EIO` ([`CmDriver::failure`] says why).

use super::cm_loop::LoopEnd;
use crate::cm::rdma_cm::req_matches_listener;
use crate::cm::{CmConfig, CmEngine, CmError, CmEvent, CommId};
use crate::transport::Instant;
use crate::verbs::{Clock, CmPort, Cq, Device, Error, ErrorKind, Wc};
use crate::wire::cm::SidrStatus;
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// A device's CM with its driver thread. See the module documentation.
#[derive(Debug)]
pub struct CmDriver {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    inner: Mutex<Inner>,
    /// Signalled whenever an event lands in a mailbox.
    arrived: Condvar,
    stop: AtomicBool,
    /// The engine's time ([`SystemClock`](super::SystemClock), as the device's).
    clock: super::SystemClock,
    /// Makes the driver thread panic at its next turn ([`CmDriver::inject_panic_for_test`]).
    panic_for_test: AtomicBool,
    /// Why the CM failed; set once, then `arrived` is signalled under the `inner` lock.
    failed: std::sync::OnceLock<String>,
    /// The device's name, for messages.
    name: String,
    /// The link of a shared device, whose keeper must learn this CM's listeners
    /// ([`super::UdpLink::share_listen`]).
    link: Option<Arc<super::UdpLink>>,
}

#[derive(Debug)]
struct Inner {
    port: CmPort,
    /// Events of each connection, oldest first, until its owner takes them.
    events: HashMap<CommId, VecDeque<CmEvent>>,
    /// ConnectRequests of each listened service ID, not yet taken.
    requests: HashMap<u64, VecDeque<CmEvent>>,
    /// Connections whose owner is gone: their remaining events are dropped.
    detached: HashSet<CommId>,
}

impl Shared {
    fn now(&self) -> Instant {
        self.clock.now()
    }

    /// Fails the CM for `why` and wakes every waiter (the flag is set before the lock is
    /// taken, and waiters check it under the lock, so none misses it).
    fn fail(&self, why: String) {
        let _ = self.failed.set(why);
        let _inner = self.inner.lock();
        self.arrived.notify_all();
    }

    /// The error of a wait on a failed CM.
    fn failed_error(&self) -> Option<Error> {
        self.failed.get().map(|why| {
            Error::new(
                ErrorKind::Io,
                format!("the CM of device {} failed: {why}", self.name),
            )
        })
    }
}

impl Inner {
    /// Moves QP1's traffic and the engine's timers, then sorts the engine's events into the
    /// mailboxes; true when one landed. Requests nobody listens for any more are refused
    /// here (the engine itself answers REQs for services it does not listen on).
    fn pump(&mut self, now: Instant) -> bool {
        let _ = self.port.process(now);
        let mut landed = false;
        while let Some(ev) = self.port.cm().poll_event() {
            let id = ev.id();
            match &ev {
                CmEvent::ConnectRequest { req, cma, .. } => {
                    let local_ip = self.port.cm().config().local_ip;
                    if !req_matches_listener(req.service_id, cma.as_ref(), local_ip) {
                        // No rdma_cm listener takes a REQ whose IP header is bad or names
                        // another address: REJ (consumer defined), as the kernel.
                        let _ = self.port.cm().reject(now, id, &[]);
                    } else if let Some(q) = self.requests.get_mut(&req.service_id) {
                        q.push_back(ev);
                        landed = true;
                    } else {
                        let _ = self.port.cm().reject(now, id, &[]);
                    }
                }
                CmEvent::SidrRequest { req, .. } => {
                    if let Some(q) = self.requests.get_mut(&req.service_id) {
                        q.push_back(ev);
                        landed = true;
                    } else {
                        let _ =
                            self.port
                                .cm()
                                .sidr_reply(now, id, SidrStatus::UNSUPPORTED, 0, 0, &[]);
                    }
                }
                // A request not taken yet that its peer withdrew (REJ) or that timed out:
                // it leaves its listener's queue, and nobody hears of it.
                CmEvent::Rejected { .. } | CmEvent::Unreachable { .. }
                    if self.drop_queued_request(id) => {}
                _ if self.detached.contains(&id) => {
                    if matches!(
                        ev,
                        CmEvent::TimewaitExit { .. }
                            | CmEvent::Rejected { .. }
                            | CmEvent::Unreachable { .. }
                    ) {
                        self.detached.remove(&id);
                    } else if matches!(ev, CmEvent::Disconnected { .. }) {
                        // The peer's DREQ for a connection nobody owns: the DREP goes now.
                        let _ = self.port.cm().disconnect(now, id);
                    }
                }
                _ => {
                    self.events.entry(id).or_default().push_back(ev);
                    landed = true;
                }
            }
        }
        // What answering caused (REJ, DREP) leaves now.
        let _ = self.port.process(now);
        landed
    }

    /// Removes connection `id`'s ConnectRequest (or SidrRequest) from its listener's queue;
    /// false if none is queued.
    fn drop_queued_request(&mut self, id: CommId) -> bool {
        for q in self.requests.values_mut() {
            if let Some(i) = q.iter().position(|ev| ev.id() == id) {
                q.remove(i);
                return true;
            }
        }
        false
    }
}

impl CmDriver {
    /// Takes over `dev`'s QP1 for a CM engine of configuration `config` and starts the
    /// driver thread.
    /// Errors: those of [`CmPort::new`]; `EAGAIN` when the thread cannot start.
    pub fn start(dev: &Device, config: CmConfig) -> crate::verbs::Result<CmDriver> {
        CmDriver::start_shared(dev, config, None)
    }

    /// [`CmDriver::start`] for the device of `link`, which may be a shared device: each
    /// [`CmDriver::listen`] then also makes the service's REQs come to this process.
    pub fn start_shared(
        dev: &Device,
        config: CmConfig,
        link: Option<Arc<super::UdpLink>>,
    ) -> crate::verbs::Result<CmDriver> {
        let port = CmPort::new(dev, CmEngine::new(config))?;
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                port,
                events: HashMap::new(),
                requests: HashMap::new(),
                detached: HashSet::new(),
            }),
            arrived: Condvar::new(),
            stop: AtomicBool::new(false),
            clock: super::SystemClock::new(),
            panic_for_test: AtomicBool::new(false),
            failed: std::sync::OnceLock::new(),
            name: dev.name().to_string(),
            link,
        });
        let driver = Driver {
            shared: shared.clone(),
            dev: dev.clone(),
            cq: dev.gsi_cq(),
            wcs: [Wc::default(); 32],
        };
        let failing = shared.clone();
        let thread = super::cm_loop::spawn(
            format!("softroce-cm-{}", dev.name()),
            format!("CM driver thread of device {}", dev.name()),
            "the CM is now failed",
            driver,
            shared.clock,
            // No silent hang: a failed or panicked loop fails the CM, which wakes its waiters.
            move |why| failing.fail(why),
        )
        .map_err(|_| Error::new(ErrorKind::Again, "CmDriver: cannot start its thread"))?;
        Ok(CmDriver {
            shared,
            thread: Some(thread),
        })
    }

    /// The driver's clock: what the engine's `now` arguments are.
    pub fn now(&self) -> Instant {
        self.shared.now()
    }

    /// Runs `f` on the engine (a mutator: `connect`, `accept`, `establish`, `reject`,
    /// `disconnect`, …) with the current time, then sends what it queued and sorts its
    /// events, as the driver thread does after every input.
    pub fn with<R>(&self, f: impl FnOnce(&mut CmEngine, Instant) -> R) -> R {
        let now = self.shared.now();
        let mut inner = self.shared.inner.lock();
        let r = f(inner.port.cm(), now);
        if inner.pump(now) {
            self.shared.arrived.notify_all();
        }
        r
    }

    /// Listens on `service_id`: its ConnectRequests (and SidrRequests) wait for
    /// [`CmDriver::next_request`]; at most [`crate::cm::UCMA_MAX_BACKLOG`] unanswered.
    /// Errors: [`CmError::AddrInUse`] if someone already listens on it.
    pub fn listen(&self, service_id: u64) -> Result<(), CmError> {
        self.listen_with_backlog(service_id, 0)
    }

    /// [`CmDriver::listen`] with at most `backlog` requests not yet answered (units:
    /// requests; 0 or above [`crate::cm::UCMA_MAX_BACKLOG`] means that maximum); see
    /// [`crate::cm::CmEngine::listen_with_backlog`].
    /// Errors: [`CmError::AddrInUse`] if someone already listens on it.
    pub fn listen_with_backlog(&self, service_id: u64, backlog: usize) -> Result<(), CmError> {
        let mut inner = self.shared.inner.lock();
        inner.port.cm().listen_with_backlog(service_id, backlog)?;
        // Another process of a shared device listens on it: as the kernel CM, which keeps
        // one listener per service ID of a device.
        if let Some(link) = &self.shared.link
            && link.share_listen(service_id).is_err()
        {
            inner.port.cm().unlisten(service_id);
            return Err(CmError::AddrInUse);
        }
        inner.requests.insert(service_id, VecDeque::new());
        Ok(())
    }

    /// Stops listening on `service_id`; requests not taken are refused (REJ consumer
    /// defined, or SIDR_REP reject), as librdmacm's `rdma_destroy_id` of a listener does to
    /// the ids it has not handed out.
    pub fn unlisten(&self, service_id: u64) {
        let now = self.shared.now();
        let mut inner = self.shared.inner.lock();
        inner.port.cm().unlisten(service_id);
        if let Some(link) = &self.shared.link {
            link.share_unlisten(service_id);
        }
        for ev in inner.requests.remove(&service_id).unwrap_or_default() {
            let cm = inner.port.cm();
            let _ = match ev {
                CmEvent::SidrRequest { id, .. } => {
                    cm.sidr_reply(now, id, SidrStatus::REJECT, 0, 0, &[])
                }
                ev => cm.reject(now, ev.id(), &[]),
            };
        }
        inner.pump(now);
    }

    /// The oldest ConnectRequest (or SidrRequest) for `service_id`, waiting up to
    /// `timeout`; `None` on timeout or if nobody listens on it.
    /// Errors: `EIO` once the CM failed ([`CmDriver::failure`]), at once or while waiting.
    pub fn next_request(
        &self,
        service_id: u64,
        timeout: Duration,
    ) -> crate::verbs::Result<Option<CmEvent>> {
        self.wait(timeout, |inner| {
            inner
                .requests
                .get_mut(&service_id)
                .map(|q| q.pop_front())
                .ok_or(())
        })
    }

    /// The oldest event of connection `id`, waiting up to `timeout`; `None` on timeout.
    /// Errors: `EIO` once the CM failed ([`CmDriver::failure`]), at once or while waiting.
    pub fn next_event(
        &self,
        id: CommId,
        timeout: Duration,
    ) -> crate::verbs::Result<Option<CmEvent>> {
        self.wait(timeout, |inner| {
            Ok(inner.events.get_mut(&id).and_then(|q| q.pop_front()))
        })
    }

    /// How many events and requests wait in the mailboxes, and how many connections are
    /// held without an owner: 0 when every connection's owner took or dropped what came
    /// for it (a check that nothing piles up).
    pub fn mailbox_count(&self) -> usize {
        let inner = self.shared.inner.lock();
        inner.events.values().map(VecDeque::len).sum::<usize>()
            + inner.events.len()
            + inner.requests.values().map(VecDeque::len).sum::<usize>()
            + inner.detached.len()
    }

    /// Says that connection `id` has no owner any more: its mailbox goes, and events still
    /// to come are dropped (a DREQ from the peer is answered with a DREP), until the
    /// connection is gone from the engine.
    pub fn detach(&self, id: CommId) {
        let mut inner = self.shared.inner.lock();
        inner.events.remove(&id);
        if inner.port.cm().state(id).is_some() {
            inner.detached.insert(id);
        }
    }

    /// Why the CM failed (its driver thread panicked, or its device failed), or `None`
    /// while it works.
    pub fn failure(&self) -> Option<&str> {
        self.shared.failed.get().map(String::as_str)
    }

    /// Test hook: makes the driver thread panic at its next turn (within [`CM_TICK`](super::cm_loop::CM_TICK)),
    /// to check what a panic there does (the CM fails and its waiters get `EIO`). Not for
    /// use outside tests.
    #[doc(hidden)]
    pub fn inject_panic_for_test(&self) {
        self.shared.panic_for_test.store(true, Ordering::SeqCst);
    }

    /// `take` under the lock until it gives an event (or `Err`: give up), waiting for the
    /// driver between tries, up to `timeout`. Errors: `EIO` when the CM failed.
    fn wait(
        &self,
        timeout: Duration,
        mut take: impl FnMut(&mut Inner) -> Result<Option<CmEvent>, ()>,
    ) -> crate::verbs::Result<Option<CmEvent>> {
        let deadline = std::time::Instant::now() + timeout;
        let mut inner = self.shared.inner.lock();
        loop {
            if let Some(e) = self.shared.failed_error() {
                return Err(e);
            }
            match take(&mut inner) {
                Ok(Some(ev)) => return Ok(Some(ev)),
                Err(()) => return Ok(None),
                Ok(None) => {}
            }
            if self
                .shared
                .arrived
                .wait_until(&mut inner, deadline)
                .timed_out()
            {
                if let Some(e) = self.shared.failed_error() {
                    return Err(e);
                }
                return Ok(take(&mut inner).ok().flatten());
            }
        }
    }
}

impl Drop for CmDriver {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The Rust API's side of the CM loop ([`super::cm_loop`]): waits on QP1's CQ, hands the
/// completions to the port, runs due timers and sorts the events into the mailboxes. Ends
/// when the driver is dropped, or, failing the CM, when the device fails. Panics (only) when
/// a test asked it to with `panic_for_test`.
struct Driver {
    shared: Arc<Shared>,
    dev: Device,
    cq: Cq,
    wcs: [Wc; 32],
}

impl super::cm_loop::CmLoop for Driver {
    /// How many completions `wcs` holds.
    type Input = usize;

    fn next_timer(&mut self) -> Result<Option<Instant>, LoopEnd> {
        if self.shared.stop.load(Ordering::SeqCst) {
            return Err(LoopEnd::Stopped);
        }
        // The test hook of `CmDriver::inject_panic_for_test` (nothing else sets it): the one
        // panic here is the one a test asks for.
        if self.shared.panic_for_test.load(Ordering::SeqCst) {
            panic!("panic injected by a test (CmDriver::inject_panic_for_test)");
        }
        if let Some(why) = self.dev.failure() {
            // QP1 is flushed and nothing receives on it: the CM cannot go on.
            tracing::error!(
                target: "softroce::net",
                device = self.dev.name(),
                "the CM stops: its device failed ({why})"
            );
            return Err(LoopEnd::Failed(format!("its device failed ({why})")));
        }
        Ok(self.shared.inner.lock().port.poll_timeout())
    }

    fn wait(&mut self, timeout: Duration) -> Result<usize, LoopEnd> {
        Ok(self.cq.wait(&mut self.wcs, timeout))
    }

    fn turn(&mut self, now: Instant, n: usize) -> Result<(), LoopEnd> {
        let mut inner = self.shared.inner.lock();
        let _ = inner.port.handle_completions(now, &self.wcs[..n]);
        if inner.pump(now) {
            self.shared.arrived.notify_all();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::UdpDevice;
    use std::net::{IpAddr, Ipv4Addr};

    // Issue 22 (no silent hang): a panic in the CM's driver thread fails the CM. A caller
    // blocked on it (rdma_cm's get_request, or connect/accept/disconnect waiting for their
    // connection's event) gets EIO, and so does every later wait; the device itself keeps
    // working. The 20 s deadline only ends a run in which the wait hangs.
    #[test]
    fn a_cm_driver_panic_fails_its_waits_with_eio() {
        const SERVICE: u64 = 0x0106_0000_0000_4321;
        let dev = UdpDevice::open(
            "softroce_cmpanic",
            IpAddr::V4(Ipv4Addr::new(127, 0, 24, 62)),
        )
        .expect("open a device on loopback");
        let cm = dev.cm().expect("start the device's CM");
        cm.listen(SERVICE).expect("listen");
        let long = Duration::from_secs(3600);
        let (tx, rx) = std::sync::mpsc::channel();
        for waiter in 0..2 {
            let (cm, tx) = (cm.clone(), tx.clone());
            std::thread::spawn(move || {
                let r = if waiter == 0 {
                    cm.next_request(SERVICE, long)
                } else {
                    cm.next_event(CommId(7), long)
                };
                let _ = tx.send(r.map(|_| ()).map_err(|e| e.kind()));
            });
        }
        cm.inject_panic_for_test();
        for _ in 0..2 {
            assert_eq!(
                rx.recv_timeout(Duration::from_secs(20)),
                Ok(Err(ErrorKind::Io)),
                "a CM wait returns EIO once its driver thread panicked"
            );
        }
        let why = cm.failure().expect("the CM is failed");
        assert!(why.contains("panic injected by a test"), "{why}");
        assert_eq!(
            cm.next_request(SERVICE, long).map_err(|e| e.kind()),
            Err(ErrorKind::Io),
            "a later wait fails at once"
        );
        assert_eq!(dev.failure(), None, "the device keeps working");
        assert!(dev.cm().is_ok_and(|d| Arc::ptr_eq(&d, &cm)));
    }
}
