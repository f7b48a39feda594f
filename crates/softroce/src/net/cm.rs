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

use crate::cm::rdma_cm::req_matches_listener;
use crate::cm::{CmConfig, CmEngine, CmError, CmEvent, CommId};
use crate::transport::Instant;
use crate::verbs::{CmPort, Cq, Device, Error, ErrorKind, Wc};
use crate::wire::cm::SidrStatus;
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// Longest the driver thread waits on QP1 before it looks at the timers and the stop flag.
const DRIVER_TICK: Duration = Duration::from_millis(20);

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
    epoch: std::time::Instant,
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
        Instant::from_nanos(self.epoch.elapsed().as_nanos() as u64 + 1)
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
            epoch: std::time::Instant::now(),
        });
        let thread = {
            let (shared, cq) = (shared.clone(), dev.gsi_cq());
            std::thread::Builder::new()
                .name(format!("softroce-cm-{}", dev.name()))
                .spawn(move || drive(&shared, &cq))
                .map_err(|_| Error::new(ErrorKind::Again, "CmDriver: cannot start its thread"))?
        };
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
    pub fn next_request(&self, service_id: u64, timeout: Duration) -> Option<CmEvent> {
        self.wait(timeout, |inner| {
            inner
                .requests
                .get_mut(&service_id)
                .map(|q| q.pop_front())
                .ok_or(())
        })
    }

    /// The oldest event of connection `id`, waiting up to `timeout`; `None` on timeout.
    pub fn next_event(&self, id: CommId, timeout: Duration) -> Option<CmEvent> {
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

    /// `take` under the lock until it gives an event (or `Err`: give up), waiting for the
    /// driver between tries, up to `timeout`.
    fn wait(
        &self,
        timeout: Duration,
        mut take: impl FnMut(&mut Inner) -> Result<Option<CmEvent>, ()>,
    ) -> Option<CmEvent> {
        let deadline = std::time::Instant::now() + timeout;
        let mut inner = self.shared.inner.lock();
        loop {
            match take(&mut inner) {
                Ok(Some(ev)) => return Some(ev),
                Err(()) => return None,
                Ok(None) => {}
            }
            if self
                .shared
                .arrived
                .wait_until(&mut inner, deadline)
                .timed_out()
            {
                return take(&mut inner).ok().flatten();
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

/// The driver loop: wait on QP1's CQ up to the next CM timer (at most [`DRIVER_TICK`]),
/// hand the completions to the port, run due timers, sort the events.
fn drive(shared: &Shared, cq: &Cq) {
    let mut wcs = [Wc::default(); 32];
    while !shared.stop.load(Ordering::SeqCst) {
        let wait = {
            let inner = shared.inner.lock();
            let now = shared.now();
            inner.port.poll_timeout().map_or(DRIVER_TICK, |t| {
                Duration::from_nanos(t.as_nanos().saturating_sub(now.as_nanos())).min(DRIVER_TICK)
            })
        };
        let n = cq.wait(&mut wcs, wait);
        let now = shared.now();
        let mut inner = shared.inner.lock();
        let _ = inner.port.handle_completions(now, &wcs[..n]);
        if inner.pump(now) {
            shared.arrived.notify_all();
        }
    }
}
