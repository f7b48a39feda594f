//! Asynchronous events, as libibverbs has them: the event types and the device's async event
//! queue (`ibv_get_async_event`, read through `Device` in `device.rs`), and the signalling
//! queue it shares with completion channels (`cq.rs`). Each queue has a descriptor that is
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

/// A level signal on a descriptor: readable while its queue is not empty. A Unix stream
/// socket pair: the queue writes one byte into one end when the queue stops being empty and
/// drains the other end when it empties; the read end is the descriptor handed out (a
/// completion channel's `fd` in C, a context's `async_fd`). Blocking (no `O_NONBLOCK`):
/// its `O_NONBLOCK` flag is the holder's to set, as on the kernel's uverbs file.
///
/// A socket rather than an eventfd so that a waiter can block in a receive that peeks
/// ([`wait_readable`]): that call is interrupted by a signal, or restarted, exactly as the
/// kernel's `read` of a uverbs event file is (EINTR unless the handler has `SA_RESTART`),
/// where `poll` always fails with EINTR. qperf stops its timed tests with SIGALRM and a
/// handler without `SA_RESTART`, and expects `ibv_get_cq_event` to return EINTR then;
/// perftest's duration mode installs its handler with `signal` (`SA_RESTART`) and expects
/// the wait to go on.
#[derive(Debug)]
pub(super) struct LevelFd {
    /// The end handed out and waited on; the queue drains it.
    read: OwnedFd,
    /// The end the queue writes its byte into.
    write: OwnedFd,
}

impl LevelFd {
    pub(super) fn new() -> std::io::Result<LevelFd> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: socketpair writes two descriptors into the live 2-element array.
        let r = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: two new descriptors nothing else owns, so OwnedFd may take them.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // Only the read end goes to the program; the write end stays inside.
        // SAFETY: shutdown(2) on a descriptor this function owns; no pointers.
        let _ = unsafe { libc::shutdown(write.as_raw_fd(), libc::SHUT_RD) };
        Ok(LevelFd { read, write })
    }

    /// Makes the descriptor readable.
    fn set(&self) {
        let one = 1u8;
        // SAFETY: sends 1 byte from a live u8 on our own socket, without blocking: a full
        // buffer (which one byte per empty-to-pending change never fills) is readable anyway.
        let _ = unsafe {
            libc::send(
                self.write.as_raw_fd(),
                (&raw const one).cast::<libc::c_void>(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
    }

    /// Makes the descriptor unreadable (reads every byte waiting).
    fn clear(&self) {
        let mut buf = [0u8; 64];
        loop {
            // SAFETY: receives into a live 64-byte buffer from our own socket, without
            // blocking.
            let n = unsafe {
                libc::recv(
                    self.read.as_raw_fd(),
                    buf.as_mut_ptr().cast::<libc::c_void>(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < buf.len() as isize {
                return;
            }
        }
    }
}

/// Waits until `fd`, the read end of an event descriptor (a completion channel's or a device's
/// async event descriptor), is readable, as a `read` of the kernel's uverbs event file
/// waits: it fails with `EAGAIN` at once when the holder made the descriptor non-blocking,
/// and with `EINTR` when a signal whose handler lacks `SA_RESTART` interrupts it (a handler
/// with `SA_RESTART` lets the wait go on). Errors: those of `recv(2)`.
pub fn wait_readable(fd: RawFd) -> std::io::Result<()> {
    let mut b = 0u8;
    // SAFETY: peeks at most 1 byte into a live u8; the descriptor is the caller's.
    let n = unsafe { libc::recv(fd, (&raw mut b).cast::<libc::c_void>(), 1, libc::MSG_PEEK) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A queue with a condition variable and a descriptor that is readable while it is not empty,
/// or for good once it is closed ([`SignalQueue::close`]).
pub(super) struct SignalQueue<T> {
    items: Mutex<VecDeque<T>>,
    ready: Condvar,
    fd: Option<LevelFd>,
    /// Set by `close`, under the `items` lock.
    closed: AtomicBool,
    pub(super) lost: AtomicU64,
    cap: usize,
}

impl<T> SignalQueue<T> {
    pub(super) fn new(fd: Option<LevelFd>, cap: usize) -> SignalQueue<T> {
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
        let was_empty = q.is_empty();
        q.push_back(item);
        if was_empty && let Some(fd) = &self.fd {
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
        self.fd.as_ref().map_or(-1, |f| f.read.as_raw_fd())
    }
}

/// A device's asynchronous event queue. Owned by the device; see [`Device::get_async_event`].
pub(super) struct AsyncEvents(pub(super) SignalQueue<AsyncEvent>);

impl AsyncEvents {
    pub(super) fn new() -> AsyncEvents {
        AsyncEvents(SignalQueue::new(LevelFd::new().ok(), MAX_ASYNC_EVENTS))
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
        let q: SignalQueue<u32> = SignalQueue::new(Some(LevelFd::new().unwrap()), 3);
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
        let q = std::sync::Arc::new(SignalQueue::<u32>::new(Some(LevelFd::new().unwrap()), 8));
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

    static HANDLED: AtomicU64 = AtomicU64::new(0);

    extern "C" fn count_signal(_: libc::c_int) {
        HANDLED.fetch_add(1, Ordering::SeqCst);
    }

    /// Installs `count_signal` for SIGUSR1, with `SA_RESTART` or without.
    fn on_sigusr1(restart: bool) {
        // SAFETY: a zeroed sigaction is valid; the handler is an extern "C" fn(c_int).
        unsafe {
            let mut sa: libc::sigaction = core::mem::zeroed();
            sa.sa_sigaction = count_signal as *const () as usize;
            sa.sa_flags = if restart { libc::SA_RESTART } else { 0 };
            libc::sigemptyset(&raw mut sa.sa_mask);
            assert_eq!(
                libc::sigaction(libc::SIGUSR1, &raw const sa, core::ptr::null_mut()),
                0
            );
        }
    }

    /// Waits (the deadline only ends a failing run) until thread `tid` of this process
    /// blocks in recvfrom(2), the system call of `wait_readable`.
    fn wait_blocked_in_recv(tid: libc::pid_t) {
        let path = format!("/proc/self/task/{tid}/syscall");
        let nr = libc::SYS_recvfrom.to_string();
        let end = std::time::Instant::now() + Duration::from_secs(20);
        while std::fs::read_to_string(&path)
            .map(|t| t.split_whitespace().next() != Some(nr.as_str()))
            .unwrap_or(true)
        {
            assert!(
                std::time::Instant::now() < end,
                "thread {tid} never blocked in recv"
            );
            std::thread::yield_now();
        }
    }

    // `wait_readable` behaves as the kernel's read of a uverbs event file: a signal whose
    // handler lacks SA_RESTART ends the wait with EINTR (qperf's SIGALRM ends its timed
    // tests so); with SA_RESTART the wait goes on until the queue has something.
    #[test]
    fn wait_readable_is_interrupted_by_a_signal_as_read_is() {
        use std::os::unix::thread::JoinHandleExt;
        let q = std::sync::Arc::new(SignalQueue::<u32>::new(Some(LevelFd::new().unwrap()), 8));
        for restart in [false, true] {
            on_sigusr1(restart);
            let before = HANDLED.load(Ordering::SeqCst);
            let fd = q.raw_fd();
            let (tx, rx) = std::sync::mpsc::channel();
            let waiter = std::thread::spawn(move || {
                // SAFETY: gettid takes nothing.
                let _ = tx.send(unsafe { libc::gettid() });
                wait_readable(fd).map_err(|e| e.raw_os_error())
            });
            let tid = rx.recv().unwrap();
            wait_blocked_in_recv(tid);
            // SAFETY: the waiter thread is alive (it has not returned: it is in recv).
            assert_eq!(
                unsafe { libc::pthread_kill(waiter.as_pthread_t(), libc::SIGUSR1) },
                0
            );
            if restart {
                let end = std::time::Instant::now() + Duration::from_secs(20);
                while HANDLED.load(Ordering::SeqCst) == before {
                    assert!(std::time::Instant::now() < end, "the signal never came");
                    std::thread::yield_now();
                }
                // The handler ran and the wait restarted: it ends only with an item.
                wait_blocked_in_recv(tid);
                assert!(!waiter.is_finished());
                q.push(1);
                assert_eq!(waiter.join().unwrap(), Ok(()));
                assert_eq!(q.try_pop(), Some(1));
            } else {
                assert_eq!(waiter.join().unwrap(), Err(Some(libc::EINTR)));
                assert_eq!(HANDLED.load(Ordering::SeqCst), before + 1);
            }
        }
        // SAFETY: restores the default disposition of SIGUSR1.
        unsafe { libc::signal(libc::SIGUSR1, libc::SIG_DFL) };
    }
}
