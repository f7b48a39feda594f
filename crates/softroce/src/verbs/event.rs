//! Asynchronous events and completion channels, as libibverbs has them: a device's async
//! event queue (`ibv_get_async_event`), completion channels (`ibv_create_comp_channel`,
//! `ibv_get_cq_event`, `ibv_ack_cq_events`) and CQ arming (`ibv_req_notify_cq`). Each queue
//! has a Linux eventfd that is readable while something is pending, so a caller can wait on
//! it with poll/epoll next to its sockets.
//!
//! Locking: every queue has its own lock, taken after the device lock when the device raises
//! an event or completes a WR; waiting on a queue never holds the device lock.

use super::device::{Cq, CqShared};
use super::{Device, Error, ErrorKind, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// An asynchronous event type, in `enum ibv_event_type` order.
/// Source: rdma-core `libibverbs/verbs.h`; IBTA Vol 1 ch. 11 (asynchronous events).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// `IBV_EVENT_CQ_ERR`: a CQ overran.
    CqErr,
    /// `IBV_EVENT_QP_FATAL`: a QP entered ERR because of an error (not by `modify_qp`).
    QpFatal,
    /// `IBV_EVENT_QP_REQ_ERR`: invalid request local work queue error.
    QpReqErr,
    /// `IBV_EVENT_QP_ACCESS_ERR`: local access violation error.
    QpAccessErr,
    /// `IBV_EVENT_COMM_EST`: communication established.
    CommEst,
    /// `IBV_EVENT_SQ_DRAINED`: a QP in SQD has completed every send WR it had started.
    SqDrained,
    /// `IBV_EVENT_PATH_MIG`.
    PathMig,
    /// `IBV_EVENT_PATH_MIG_ERR`.
    PathMigErr,
    /// `IBV_EVENT_DEVICE_FATAL`.
    DeviceFatal,
    /// `IBV_EVENT_PORT_ACTIVE`: the port became active (raised once when the device opens).
    PortActive,
    /// `IBV_EVENT_PORT_ERR`.
    PortErr,
    /// `IBV_EVENT_LID_CHANGE`.
    LidChange,
    /// `IBV_EVENT_PKEY_CHANGE`.
    PkeyChange,
    /// `IBV_EVENT_SM_CHANGE`.
    SmChange,
    /// `IBV_EVENT_SRQ_ERR`.
    SrqErr,
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: fewer WRs than the armed limit are left in an SRQ.
    SrqLimitReached,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: a QP attached to an SRQ entered ERR.
    QpLastWqeReached,
    /// `IBV_EVENT_CLIENT_REREGISTER`.
    ClientReregister,
    /// `IBV_EVENT_GID_CHANGE`.
    GidChange,
}

impl EventType {
    /// The `IBV_EVENT_*` constant name.
    pub const fn ibv_name(self) -> &'static str {
        match self {
            EventType::CqErr => "IBV_EVENT_CQ_ERR",
            EventType::QpFatal => "IBV_EVENT_QP_FATAL",
            EventType::QpReqErr => "IBV_EVENT_QP_REQ_ERR",
            EventType::QpAccessErr => "IBV_EVENT_QP_ACCESS_ERR",
            EventType::CommEst => "IBV_EVENT_COMM_EST",
            EventType::SqDrained => "IBV_EVENT_SQ_DRAINED",
            EventType::PathMig => "IBV_EVENT_PATH_MIG",
            EventType::PathMigErr => "IBV_EVENT_PATH_MIG_ERR",
            EventType::DeviceFatal => "IBV_EVENT_DEVICE_FATAL",
            EventType::PortActive => "IBV_EVENT_PORT_ACTIVE",
            EventType::PortErr => "IBV_EVENT_PORT_ERR",
            EventType::LidChange => "IBV_EVENT_LID_CHANGE",
            EventType::PkeyChange => "IBV_EVENT_PKEY_CHANGE",
            EventType::SmChange => "IBV_EVENT_SM_CHANGE",
            EventType::SrqErr => "IBV_EVENT_SRQ_ERR",
            EventType::SrqLimitReached => "IBV_EVENT_SRQ_LIMIT_REACHED",
            EventType::QpLastWqeReached => "IBV_EVENT_QP_LAST_WQE_REACHED",
            EventType::ClientReregister => "IBV_EVENT_CLIENT_REREGISTER",
            EventType::GidChange => "IBV_EVENT_GID_CHANGE",
        }
    }
}

/// What an asynchronous event is about (the `element` union of `struct ibv_async_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventElement {
    /// A QP, by QP number.
    Qp(u32),
    /// An SRQ, by SRQ number ([`super::Srq::srq_num`]).
    Srq(u32),
    /// A port, by number (1).
    Port(u8),
    /// A CQ, by [`super::Cq::cq_num`].
    Cq(u32),
}

/// One asynchronous event (`struct ibv_async_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AsyncEvent {
    /// What happened.
    pub event_type: EventType,
    /// To which object.
    pub element: EventElement,
}

/// Most async events a device keeps unread; past this the oldest is dropped (and counted in
/// [`Device::async_events_lost`]).
const MAX_ASYNC_EVENTS: usize = 4096;

/// A Linux eventfd used as a level signal: readable (counter non-zero) while its queue is
/// not empty.
#[derive(Debug)]
struct EventFd(OwnedFd);

impl EventFd {
    fn new() -> std::io::Result<EventFd> {
        // SAFETY: eventfd takes no pointers; a non-negative return is a new descriptor that
        // nothing else owns, so OwnedFd may take it.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a valid descriptor owned by no one else (see above).
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the descriptor readable.
    fn set(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd. It cannot block
        // (EFD_NONBLOCK); a saturated counter (EAGAIN) is still readable, which is all we need.
        let _ = unsafe {
            libc::write(
                self.0.as_raw_fd(),
                (&raw const one).cast::<libc::c_void>(),
                core::mem::size_of::<u64>(),
            )
        };
    }

    /// Makes the descriptor unreadable (resets the counter).
    fn clear(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our own eventfd; EFD_NONBLOCK, so an
        // already-zero counter returns EAGAIN instead of blocking.
        let _ = unsafe {
            libc::read(
                self.0.as_raw_fd(),
                (&raw mut v).cast::<libc::c_void>(),
                core::mem::size_of::<u64>(),
            )
        };
    }
}

/// A queue with a condition variable and an eventfd that is readable while it is not empty.
struct SignalQueue<T> {
    items: Mutex<VecDeque<T>>,
    ready: Condvar,
    fd: Option<EventFd>,
    lost: AtomicU64,
    cap: usize,
}

impl<T> SignalQueue<T> {
    fn new(fd: Option<EventFd>, cap: usize) -> SignalQueue<T> {
        SignalQueue {
            items: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            fd,
            lost: AtomicU64::new(0),
            cap,
        }
    }

    fn push(&self, item: T) {
        let mut q = self.items.lock();
        if q.len() >= self.cap {
            q.pop_front();
            self.lost.fetch_add(1, Ordering::Relaxed);
        }
        q.push_back(item);
        if let Some(fd) = &self.fd {
            fd.set();
        }
        drop(q);
        self.ready.notify_all();
    }

    fn pop_locked(&self, q: &mut VecDeque<T>) -> Option<T> {
        let item = q.pop_front();
        if q.is_empty()
            && let Some(fd) = &self.fd
        {
            fd.clear();
        }
        item
    }

    fn try_pop(&self) -> Option<T> {
        let mut q = self.items.lock();
        self.pop_locked(&mut q)
    }

    fn pop_timeout(&self, timeout: Duration) -> Option<T> {
        let deadline = std::time::Instant::now().checked_add(timeout);
        let mut q = self.items.lock();
        while q.is_empty() {
            match deadline {
                Some(d) => {
                    if self.ready.wait_until(&mut q, d).timed_out() {
                        break;
                    }
                }
                None => self.ready.wait(&mut q),
            }
        }
        self.pop_locked(&mut q)
    }

    fn raw_fd(&self) -> RawFd {
        self.fd.as_ref().map_or(-1, |f| f.0.as_raw_fd())
    }
}

/// A device's asynchronous event queue. Owned by the device; see [`Device::get_async_event`].
pub(super) struct AsyncEvents(SignalQueue<AsyncEvent>);

impl AsyncEvents {
    pub(super) fn new() -> AsyncEvents {
        AsyncEvents(SignalQueue::new(EventFd::new().ok(), MAX_ASYNC_EVENTS))
    }
    pub(super) fn push(&self, event_type: EventType, element: EventElement) {
        self.0.push(AsyncEvent {
            event_type,
            element,
        });
    }
}

impl Device {
    /// `ibv_get_async_event` with a timeout: waits up to `timeout` for the next asynchronous
    /// event of this device and returns it (events need no acknowledgement here).
    ///
    /// Errors: `EAGAIN` when none arrived in time.
    /// Events raised: `IBV_EVENT_PORT_ACTIVE` (port 1, once when the device is made),
    /// `IBV_EVENT_QP_FATAL`, `IBV_EVENT_QP_LAST_WQE_REACHED`, `IBV_EVENT_SQ_DRAINED` (QPN)
    /// and `IBV_EVENT_SRQ_LIMIT_REACHED` (SRQ number). Source: rxe raises the same ones from
    /// `rxe_qp.c`, `rxe_comp.c`, `rxe_resp.c` and `rxe_net.c` (`rxe_port_up`).
    pub fn get_async_event(&self, timeout: Duration) -> Result<AsyncEvent> {
        self.async_events()
            .0
            .pop_timeout(timeout)
            .ok_or_else(|| Error::new(ErrorKind::Again, "get_async_event: no event pending"))
    }

    /// The next asynchronous event if one is pending, without waiting (what
    /// `ibv_get_async_event` does on a non-blocking `async_fd`).
    pub fn try_get_async_event(&self) -> Option<AsyncEvent> {
        self.async_events().0.try_pop()
    }

    /// Asynchronous events dropped because more than 4096 were unread.
    pub fn async_events_lost(&self) -> u64 {
        self.async_events().0.lost.load(Ordering::Relaxed)
    }

    /// `ibv_create_comp_channel`. Errors: `ENOMEM` when no eventfd can be made (the
    /// process is out of descriptors).
    pub fn create_comp_channel(&self) -> Result<CompChannel> {
        let fd = EventFd::new().map_err(|e| {
            Error::new(
                ErrorKind::NoMem,
                format!("create_comp_channel: eventfd: {e}"),
            )
        })?;
        Ok(CompChannel {
            shared: Arc::new(SignalQueue::new(Some(fd), usize::MAX)),
        })
    }

    /// `ibv_create_cq` with a completion channel: like [`Device::create_cq`], and
    /// [`Cq::req_notify`] then reports completions on `channel`. Errors: those of
    /// [`Device::create_cq`].
    pub fn create_cq_with_channel(&self, cqe: u32, channel: &CompChannel) -> Result<Cq> {
        let cq = self.create_cq(cqe)?;
        *cq.shared().notify.channel.lock() = Some(channel.clone());
        Ok(cq)
    }
}

/// The device's event queue is readable (pollable) while events are pending: its eventfd.
/// -1 if the process had no descriptor left when the device was made.
impl AsRawFd for Device {
    fn as_raw_fd(&self) -> RawFd {
        self.async_events().0.raw_fd()
    }
}

/// A completion channel (`struct ibv_comp_channel`): where armed CQs report that they have a
/// new completion. Its descriptor is readable while an event is pending. Cloning gives another
/// handle to the same channel.
#[derive(Clone)]
pub struct CompChannel {
    /// CQs with an event, held weakly: a CQ keeps its channel alive, not the reverse.
    shared: Arc<SignalQueue<Weak<CqShared>>>,
}

impl core::fmt::Debug for CompChannel {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CompChannel")
            .field("fd", &self.shared.raw_fd())
            .finish()
    }
}

impl CompChannel {
    /// `ibv_get_cq_event`: waits up to `timeout` for the next CQ event and returns the CQ.
    /// The CQ is disarmed; call [`Cq::req_notify`] again for the next event, and acknowledge
    /// it with [`CompChannel::ack_cq_events`]. Errors: `EAGAIN` on timeout.
    pub fn get_cq_event(&self, timeout: Duration) -> Result<Cq> {
        let deadline = std::time::Instant::now().checked_add(timeout);
        loop {
            let left = deadline.map_or(timeout, |d| {
                d.saturating_duration_since(std::time::Instant::now())
            });
            match self.shared.pop_timeout(left) {
                // An event of a CQ dropped since is skipped.
                Some(w) => {
                    if let Some(cq) = w.upgrade() {
                        return Ok(Cq::from_shared(cq));
                    }
                }
                None => {
                    return Err(Error::new(
                        ErrorKind::Again,
                        "get_cq_event: no event pending",
                    ));
                }
            }
        }
    }

    /// The next CQ event if one is pending, without waiting.
    pub fn try_get_cq_event(&self) -> Option<Cq> {
        while let Some(w) = self.shared.try_pop() {
            if let Some(cq) = w.upgrade() {
                return Some(Cq::from_shared(cq));
            }
        }
        None
    }

    /// `ibv_ack_cq_events`: acknowledges `n` events of `cq` taken with
    /// [`CompChannel::get_cq_event`]. Errors: `EINVAL` when that would acknowledge more
    /// events than were delivered for `cq`.
    pub fn ack_cq_events(&self, cq: &Cq, n: u32) -> Result<()> {
        let notify = &cq.shared().notify;
        let mut counts = notify.counts.lock();
        let (delivered, acked) = *counts;
        if acked + u64::from(n) > delivered {
            return Err(Error::new(
                ErrorKind::Inval,
                "ack_cq_events: more events than were delivered",
            ));
        }
        counts.1 += u64::from(n);
        Ok(())
    }

    fn notify(&self, cq: &Arc<CqShared>) {
        self.shared.push(Arc::downgrade(cq));
    }
}

impl AsRawFd for CompChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.shared.raw_fd()
    }
}

/// A CQ's completion-event state: its channel, whether it is armed (and for what) and how
/// many events were delivered and acknowledged.
#[derive(Default)]
pub(super) struct CqNotify {
    channel: Mutex<Option<CompChannel>>,
    /// `Some(solicited_only)` while armed.
    armed: Mutex<Option<bool>>,
    /// (events delivered, events acknowledged).
    counts: Mutex<(u64, u64)>,
}

impl CqNotify {
    /// Called after a completion entered the CQ: delivers one event if the CQ is armed for
    /// it (any completion; or, solicited-only, a solicited or unsuccessful one), and disarms.
    /// Source: `ibv_req_notify_cq(3)`; IBTA Vol 1 ch. 11 (completion event handler);
    /// rxe `rxe_cq.c` `rxe_cq_post`.
    pub(super) fn completed(&self, cq: &Arc<CqShared>, solicited: bool, error: bool) {
        let mut armed = self.armed.lock();
        let fire = match *armed {
            None => false,
            Some(solicited_only) => !solicited_only || solicited || error,
        };
        if !fire {
            return;
        }
        *armed = None;
        drop(armed);
        let channel = self.channel.lock().clone();
        if let Some(ch) = channel {
            self.counts.lock().0 += 1;
            ch.notify(cq);
        }
    }
}

impl Cq {
    /// `ibv_req_notify_cq`: arms the CQ so that the next completion added to it (with
    /// `solicited_only`, the next receive completion of a message sent with
    /// `IBV_SEND_SOLICITED`, or the next unsuccessful completion) puts one event on its
    /// completion channel. Completions already in the CQ do not count. Arming an armed CQ
    /// changes only the kind (solicited-only is cleared by a later plain arm, as on rxe).
    ///
    /// Errors: `EINVAL` for a CQ made without a channel.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        let notify = &self.shared().notify;
        if notify.channel.lock().is_none() {
            return Err(Error::new(
                ErrorKind::Inval,
                "req_notify_cq: the CQ has no completion channel",
            ));
        }
        let mut armed = notify.armed.lock();
        *armed = Some(match *armed {
            Some(so) => so && solicited_only,
            None => solicited_only,
        });
        Ok(())
    }

    /// Events delivered for this CQ and not yet acknowledged with
    /// [`CompChannel::ack_cq_events`].
    pub fn unacked_events(&self) -> u64 {
        let (delivered, acked) = *self.shared().notify.counts.lock();
        delivered - acked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: RawFd) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, timeout 0.
        let n = unsafe { libc::poll(&raw mut p, 1, 0) };
        n == 1 && p.revents & libc::POLLIN != 0
    }

    #[test]
    fn signal_queue_fd_is_readable_exactly_while_items_are_pending() {
        let q: SignalQueue<u32> = SignalQueue::new(Some(EventFd::new().unwrap()), 3);
        let fd = q.raw_fd();
        assert!(!readable(fd));
        q.push(1);
        q.push(2);
        assert!(readable(fd));
        assert_eq!(q.try_pop(), Some(1));
        assert!(readable(fd));
        assert_eq!(q.pop_timeout(Duration::from_millis(1)), Some(2));
        assert!(!readable(fd));
        assert_eq!(q.pop_timeout(Duration::from_millis(1)), None);
        for i in 0..5 {
            q.push(i);
        }
        assert_eq!(q.lost.load(Ordering::Relaxed), 2);
        assert_eq!(q.try_pop(), Some(2));
    }
}
