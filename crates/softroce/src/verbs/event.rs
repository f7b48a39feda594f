//! Asynchronous events, as libibverbs has them: the event types and the device's async event
//! queue (`ibv_get_async_event`, read through `Device` in `device.rs`), and the signalling
//! queue it shares with completion channels (`cq.rs`). Each queue has a Linux eventfd that is
//! readable while something is pending, so a caller can wait on it with poll/epoll next to
//! its sockets.
//!
//! Locking: every queue has its own lock, taken after the device lock when the device raises
//! an event or completes a WR; waiting on a queue never holds the device lock.

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
/// not empty. Blocking (no `EFD_NONBLOCK`): the descriptor is handed out (a completion
/// channel's `fd` in C) and its `O_NONBLOCK` flag is the holder's to set, as on the
/// kernel's uverbs file; `ibv_get_cq_event` blocks on a blocking one and fails with EAGAIN
/// on a non-blocking one. The queue only writes and reads it under its lock, reading only
/// when it is readable, so it never blocks itself.
#[derive(Debug)]
pub(super) struct EventFd(OwnedFd);

impl EventFd {
    pub(super) fn new() -> std::io::Result<EventFd> {
        // SAFETY: eventfd takes no pointers; a non-negative return is a new descriptor that
        // nothing else owns, so OwnedFd may take it.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a valid descriptor owned by no one else (see above).
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the descriptor readable.
    fn set(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd. It would block only at a
        // counter of 2^64 - 2, which one write per queued item between two clears never
        // reaches.
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
        let mut p = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, timeout 0. A read of a zero counter would block: read
        // only what is there (writers and readers hold the queue's lock).
        if unsafe { libc::poll(&raw mut p, 1, 0) } != 1 {
            return;
        }
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our own eventfd, which is readable.
        let _ = unsafe {
            libc::read(
                self.0.as_raw_fd(),
                (&raw mut v).cast::<libc::c_void>(),
                core::mem::size_of::<u64>(),
            )
        };
    }
}

/// A queue with a condition variable and an eventfd that is readable while it is not empty,
/// or for good once it is closed ([`SignalQueue::close`]).
pub(super) struct SignalQueue<T> {
    items: Mutex<VecDeque<T>>,
    ready: Condvar,
    fd: Option<EventFd>,
    /// Set by `close`, under the `items` lock.
    closed: AtomicBool,
    pub(super) lost: AtomicU64,
    cap: usize,
}

impl<T> SignalQueue<T> {
    pub(super) fn new(fd: Option<EventFd>, cap: usize) -> SignalQueue<T> {
        SignalQueue {
            items: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            fd,
            closed: AtomicBool::new(false),
            lost: AtomicU64::new(0),
            cap,
        }
    }

    /// Closes the queue (its device failed): waiters wake, and from now on a wait on an
    /// empty queue returns at once and the descriptor stays readable. Items still queued
    /// are taken as before.
    pub(super) fn close(&self) {
        let q = self.items.lock();
        self.closed.store(true, Ordering::SeqCst);
        if let Some(fd) = &self.fd {
            fd.set();
        }
        drop(q);
        self.ready.notify_all();
    }

    /// True once [`SignalQueue::close`] ran.
    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    pub(super) fn push(&self, item: T) {
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
            && !self.is_closed()
            && let Some(fd) = &self.fd
        {
            fd.clear();
        }
        item
    }

    pub(super) fn try_pop(&self) -> Option<T> {
        let mut q = self.items.lock();
        self.pop_locked(&mut q)
    }

    pub(super) fn pop_timeout(&self, timeout: Duration) -> Option<T> {
        let deadline = std::time::Instant::now().checked_add(timeout);
        let mut q = self.items.lock();
        while q.is_empty() && !self.is_closed() {
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

    pub(super) fn raw_fd(&self) -> RawFd {
        self.fd.as_ref().map_or(-1, |f| f.0.as_raw_fd())
    }
}

/// A device's asynchronous event queue. Owned by the device; see [`Device::get_async_event`].
pub(super) struct AsyncEvents(pub(super) SignalQueue<AsyncEvent>);

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

    // A closed queue (its device failed) wakes its waiter, hands out what it still holds,
    // then its waits return at once and its descriptor stays readable, so a poll(2) on it
    // wakes too.
    #[test]
    fn a_closed_signal_queue_wakes_its_waiter_and_stays_readable() {
        let q = std::sync::Arc::new(SignalQueue::<u32>::new(Some(EventFd::new().unwrap()), 8));
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let q = q.clone();
            std::thread::spawn(move || {
                let _ = tx.send(q.pop_timeout(Duration::from_secs(3600)));
            })
        };
        q.close();
        // The deadline only ends a failing run.
        assert_eq!(rx.recv_timeout(Duration::from_secs(20)), Ok(None));
        waiter.join().unwrap();
        assert!(q.is_closed());
        assert!(readable(q.raw_fd()));
        q.push(7);
        assert_eq!(q.pop_timeout(Duration::from_secs(3600)), Some(7));
        assert!(readable(q.raw_fd()), "readable once closed, even empty");
        assert_eq!(q.pop_timeout(Duration::from_secs(3600)), None);
    }
}
