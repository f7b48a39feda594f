//! Completion queues (`ibv_cq`) and completion channels (`ibv_comp_channel`): the lock-free
//! queue of work completions, `ibv_poll_cq`, CQ arming (`ibv_req_notify_cq`) and the channel
//! an armed CQ reports to (`ibv_get_cq_event`, `ibv_ack_cq_events`). Source: rxe `rxe_cq.c`.

use super::event::SignalQueue;
use super::{Error, ErrorKind, Result};
use crate::transport::{Wc, WcOpcode, WcStatus};
use parking_lot::Mutex;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

/// Largest CQ size (`max_cqe`), in CQEs.
pub(super) const MAX_CQE: u32 = 1 << 20;

/// How long [`Cq::wait`] polls before it sleeps.
const CQ_WAIT_SPIN: Duration = Duration::from_micros(20);

pub(super) struct CqShared {
    /// Process-unique CQ number, named by `IBV_EVENT_CQ_ERR`.
    pub(super) handle: u32,
    /// The completions, oldest first: a lock-free queue (crossbeam's list channel), so that
    /// polling, empty or not, takes no lock. Only the device pushes (under its lock); any
    /// thread may poll. A thread in [`Cq::wait`] sleeps in the channel and a push wakes it.
    pub(super) ring_tx: crossbeam_channel::Sender<Slot>,
    pub(super) ring_rx: crossbeam_channel::Receiver<Slot>,
    /// Completions pushed and not yet polled; at most `cqe` (the rest overflow).
    pub(super) queued: std::sync::atomic::AtomicUsize,
    /// Capacity: set at creation, changed by [`Cq::resize`].
    pub(super) cqe: std::sync::atomic::AtomicUsize,
    pub(super) overflows: AtomicU64,
    pub(super) notify: CqNotify,
    /// The device's poll hook, if its link installed one ([`PollHook`]).
    pub(super) hook: OnceLock<Arc<dyn PollHook>>,
    /// The device's failed flag, set by [`Device::fail`](super::Device::fail) before it
    /// puts a [`Slot::Wake`] on each of its CQs.
    pub(super) failed: OnceLock<Arc<AtomicBool>>,
}

/// What a CQ's queue carries.
#[derive(Debug, Clone, Copy)]
pub(super) enum Slot {
    /// A completion.
    Wc(Wc),
    /// No completion: the device failed, and a thread asleep in [`Cq::wait`] must wake
    /// ([`CqShared::wake`]). Whoever takes it puts it back once, so that it wakes the next
    /// waiter too; polls skip it.
    Wake,
}

/// What a poll of a CQ does beyond taking its completions, provided by the link: a link
/// that receives in the polling thread (busy polling, `net::UdpOptions::busy_poll`) drives
/// its socket here. Installed on a device with
/// [`Device::set_poll_hook`](super::Device::set_poll_hook); every poll of that device's CQs
/// then goes through it ([`Cq::poll`], [`Cq::poll_one`]), whichever frontend polls, so a C
/// `ibv_poll_cq` through a function table busy-polls as the Rust API does. The verbs layer
/// opens no socket: the hook comes from `net`.
pub trait PollHook: Send + Sync {
    /// Polls `cq` into `out` and returns how many completions it moved. An implementation
    /// takes the completions with [`Cq::poll_queued`]; with an empty `out` it only drives
    /// the link.
    fn poll(&self, cq: &Cq, out: &mut [Wc]) -> usize;
}

impl CqShared {
    pub(super) fn new(cqe: u32) -> CqShared {
        static NEXT_HANDLE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
        let (ring_tx, ring_rx) = crossbeam_channel::unbounded();
        CqShared {
            handle: NEXT_HANDLE.fetch_add(1, Ordering::Relaxed),
            ring_tx,
            ring_rx,
            queued: std::sync::atomic::AtomicUsize::new(0),
            cqe: std::sync::atomic::AtomicUsize::new(cqe as usize),
            overflows: AtomicU64::new(0),
            notify: Default::default(),
            hook: OnceLock::new(),
            failed: OnceLock::new(),
        }
    }

    /// Wakes the threads asleep in [`Cq::wait`] on this CQ (its device failed).
    pub(super) fn wake(&self) {
        // Cannot fail: `self` holds the receiving end.
        let _ = self.ring_tx.send(Slot::Wake);
    }

    /// True once the CQ's device failed.
    fn device_failed(&self) -> bool {
        self.failed.get().is_some_and(|f| f.load(Ordering::SeqCst))
    }

    /// Adds `wc`; false when the CQ is full (the entry is dropped and counted, and the
    /// caller raises `IBV_EVENT_CQ_ERR`, as rxe `rxe_cq_post` does).
    pub(super) fn push(self: &Arc<Self>, wc: Wc, solicited: bool) -> bool {
        // Counted before it is queued, uncounted after it is polled: `queued` never
        // undercounts, so the CQ never holds more than `cqe`.
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.cqe.load(Ordering::Acquire) {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            self.overflows.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let error = wc.status != WcStatus::Success;
        // Cannot fail: `self` holds the receiving end.
        let _ = self.ring_tx.send(Slot::Wc(wc));
        self.notify.completed(self, solicited, error);
        true
    }

    /// Uncounts `wc`, just taken off the queue (frees its slot), and returns it.
    fn taken(&self, wc: Wc) -> Wc {
        self.queued.fetch_sub(1, Ordering::AcqRel);
        wc
    }
}

/// A completion queue.
#[derive(Clone)]
pub struct Cq {
    pub(super) shared: Arc<CqShared>,
}

impl core::fmt::Debug for Cq {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Cq")
            .field("cqe", &self.shared.cqe.load(Ordering::Relaxed))
            .finish()
    }
}

impl Cq {
    pub(super) fn shared(&self) -> &Arc<CqShared> {
        &self.shared
    }

    pub(super) fn from_shared(shared: Arc<CqShared>) -> Cq {
        Cq { shared }
    }

    /// A number that identifies this CQ among the live CQs of the process (never 0): its
    /// shared state's address, as an `ibv_cq` pointer identifies a CQ.
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.shared) as usize
    }

    /// True when `self` and `other` are handles to the same CQ (as comparing `ibv_cq`
    /// pointers).
    pub fn same_cq(&self, other: &Cq) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// `ibv_poll_cq`: moves up to `out.len()` completions into `out`; returns how many.
    /// On a device whose link installed a [`PollHook`] (busy polling) the poll goes through
    /// it, which may first receive what waits on the link; an empty `out` then only drives
    /// the link. Otherwise it takes no lock: an empty poll is two atomic loads.
    pub fn poll(&self, out: &mut [Wc]) -> usize {
        match self.shared.hook.get() {
            Some(hook) => hook.poll(self, out),
            None => self.poll_queued(out),
        }
    }

    /// One completion, if any: [`Cq::poll`] of one.
    pub fn poll_one(&self) -> Option<Wc> {
        let mut one = [Wc::default()];
        (self.poll(&mut one) == 1).then_some(one[0])
    }

    /// Moves up to `out.len()` completions already in the CQ into `out`, without the
    /// link's [`PollHook`]; returns how many. What a hook calls to take them.
    pub fn poll_queued(&self, out: &mut [Wc]) -> usize {
        let mut n = 0;
        let mut woke = false;
        while let Some(slot) = out.get_mut(n) {
            match self.shared.ring_rx.try_recv() {
                Ok(Slot::Wc(wc)) => {
                    *slot = self.shared.taken(wc);
                    n += 1;
                }
                Ok(Slot::Wake) => woke = true,
                Err(_) => break,
            }
        }
        if woke {
            // For the next waiter (see `Slot::Wake`).
            self.shared.wake();
        }
        n
    }

    /// Waits up to `timeout` for at least one completion, then takes what else is queued
    /// ([`Cq::poll_queued`]; a wait sleeps, it does not drive the link).
    /// Returns 0 on timeout, and at once for an empty `out`. On a failed device
    /// ([`Device::fail`](super::Device::fail): its driver thread panicked) it returns at
    /// once, with what the CQ holds (the flushed WRs among them), 0 if nothing.
    pub fn wait(&self, out: &mut [Wc], timeout: Duration) -> usize {
        let now = std::time::Instant::now();
        let deadline = now + timeout;
        // Spin briefly before sleeping: a completion that comes within the spin costs no
        // wakeup (≈ 45–65 µs across cores here, docs/performance.md#measured-costs-on-this-machine-class).
        // The clock is read once every 64 looks: a read costs more than a look (in a 64 B
        // WRITE stream, reading it on every look was 7 % of the posting thread's time).
        let spin_end = now + CQ_WAIT_SPIN.min(timeout);
        let mut looks = 0u32;
        while self.shared.ring_rx.is_empty() {
            looks = looks.wrapping_add(1);
            if looks.is_multiple_of(64) && std::time::Instant::now() >= spin_end {
                break;
            }
            std::hint::spin_loop();
        }
        let Some(first) = out.first_mut() else {
            return 0;
        };
        loop {
            if self.shared.device_failed() {
                // Nothing will come: what is queued (the flushed WRs), at once.
                return self.poll_queued(out);
            }
            match self.shared.ring_rx.recv_deadline(deadline) {
                Ok(Slot::Wc(wc)) => {
                    *first = self.shared.taken(wc);
                    return 1 + self.poll_queued(&mut out[1..]);
                }
                // The device failed: for the next waiter, then the look above.
                Ok(Slot::Wake) => self.shared.wake(),
                Err(_) => return 0,
            }
        }
    }

    /// The CQ's number, unique in the process: what an `IBV_EVENT_CQ_ERR` event names
    /// ([`EventElement::Cq`](super::EventElement::Cq)).
    pub fn cq_num(&self) -> u32 {
        self.shared.handle
    }

    /// The CQ's capacity: completions it holds before the next overflows.
    pub fn cqe(&self) -> u32 {
        self.shared.cqe.load(Ordering::Relaxed) as u32
    }

    /// `ibv_resize_cq`: the CQ holds up to `cqe` completions from now on, keeping those it
    /// holds. Errors: `EINVAL` for 0, more than the device's `max_cqe`, or fewer than the
    /// completions queued now (rxe: `rxe_cq_chk_attr`).
    pub fn resize(&self, cqe: u32) -> Result<()> {
        if cqe == 0 || cqe > MAX_CQE {
            return Err(Error::new(ErrorKind::Inval, "resize_cq: cqe out of range"));
        }
        if (cqe as usize) < self.shared.queued.load(Ordering::Acquire) {
            return Err(Error::new(
                ErrorKind::Inval,
                "resize_cq: fewer entries than completions queued",
            ));
        }
        self.shared.cqe.store(cqe as usize, Ordering::Release);
        Ok(())
    }

    /// Completions dropped because the CQ was full; each raised `IBV_EVENT_CQ_ERR`.
    pub fn overflows(&self) -> u64 {
        self.shared.overflows.load(Ordering::Relaxed)
    }
}

impl Default for Wc {
    fn default() -> Wc {
        Wc {
            wr_id: 0,
            status: WcStatus::GeneralErr,
            opcode: WcOpcode::Send,
            vendor_err: 0,
            byte_len: 0,
            imm_data: 0,
            qp_num: 0,
            src_qp: 0,
            wc_flags: crate::transport::WcFlags::empty(),
        }
    }
}

/// A completion channel (`struct ibv_comp_channel`): where armed CQs report that they have a
/// new completion. Its descriptor is readable while an event is pending. Cloning gives another
/// handle to the same channel.
#[derive(Clone)]
pub struct CompChannel {
    /// CQs with an event, held weakly: a CQ keeps its channel alive, not the reverse.
    pub(super) shared: Arc<SignalQueue<Weak<CqShared>>>,
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
    /// it with [`CompChannel::ack_cq_events`]. Errors: `EAGAIN` on timeout; `EIO` once the
    /// device that made the channel failed ([`CompChannel::is_closed`]) and the events
    /// raised before are taken.
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
                None if self.is_closed() => {
                    return Err(Error::new(
                        ErrorKind::Io,
                        "get_cq_event: the device failed (its driver thread stopped)",
                    ));
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

    /// True once the device that made the channel failed
    /// ([`Device::fail`](super::Device::fail)): no event will come after those pending, and
    /// the channel's descriptor stays readable, so a caller that polls it must check this
    /// when [`CompChannel::try_get_cq_event`] gives nothing.
    pub fn is_closed(&self) -> bool {
        self.shared.is_closed()
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
    pub(super) channel: Mutex<Option<CompChannel>>,
    /// `Some(solicited_only)` while armed.
    pub(super) armed: Mutex<Option<bool>>,
    /// (events delivered, events acknowledged).
    pub(super) counts: Mutex<(u64, u64)>,
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

    fn wc(wr_id: u64) -> Wc {
        Wc {
            wr_id,
            status: WcStatus::Success,
            ..Wc::default()
        }
    }

    /// The lock-free CQ keeps order, holds at most `cqe` completions (the rest overflow and
    /// are counted), frees a slot per poll, and `wait` sleeps until another thread pushes.
    #[test]
    fn cq_keeps_order_and_bounds_and_wakes_a_waiter() {
        let cq = Cq::from_shared(Arc::new(CqShared::new(3)));
        let sh = cq.shared().clone();
        for i in 0..4 {
            assert_eq!(sh.push(wc(i), false), i < 3, "push {i}");
        }
        assert_eq!(cq.overflows(), 1);
        let mut out = [Wc::default(); 2];
        assert_eq!(cq.poll(&mut out), 2);
        assert_eq!([out[0].wr_id, out[1].wr_id], [0, 1]);
        assert!(sh.push(wc(10), false) && sh.push(wc(11), false));
        assert!(!sh.push(wc(12), false), "full again at 3");
        let mut all = [Wc::default(); 8];
        assert_eq!(cq.poll(&mut all), 3);
        assert_eq!([all[0].wr_id, all[1].wr_id, all[2].wr_id], [2, 10, 11]);
        assert_eq!(cq.poll(&mut all), 0);
        assert_eq!(cq.wait(&mut all, Duration::from_millis(20)), 0, "timeout");

        let pusher = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            sh.push(wc(20), false) && sh.push(wc(21), false)
        });
        let n = cq.wait(&mut all, Duration::from_secs(10));
        assert!(pusher.join().unwrap_or(false));
        assert!(
            n >= 1 && all[0].wr_id == 20,
            "woken with the first completion"
        );
        let rest = cq.poll(&mut all[n..]);
        assert_eq!(n + rest, 2);
    }

    // A failed device (Device::fail) wakes every thread asleep on its CQs; a poll in
    // between neither loses the wake-up nor counts it as a completion. Waits after it return
    // at once, with what the CQ holds. The 20 s deadline only ends a run that hangs.
    #[test]
    fn a_failed_device_wakes_every_waiter_of_a_cq() {
        let cq = Cq::from_shared(Arc::new(CqShared::new(4)));
        let failed = Arc::new(AtomicBool::new(false));
        let _ = cq.shared().failed.set(failed.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..3 {
            let (cq, tx) = (cq.clone(), tx.clone());
            std::thread::spawn(move || {
                let _ = tx.send(cq.wait(&mut [Wc::default()], Duration::from_secs(3600)));
            });
        }
        let sh = cq.shared().clone();
        failed.store(true, Ordering::SeqCst);
        sh.wake();
        assert_eq!(
            cq.poll(&mut [Wc::default(); 2][..]),
            0,
            "a poll skips the wake-up"
        );
        for _ in 0..3 {
            assert_eq!(
                rx.recv_timeout(Duration::from_secs(20)),
                Ok(0),
                "a waiter woke"
            );
        }
        assert_eq!(cq.wait(&mut [Wc::default()], Duration::from_secs(3600)), 0);
        for i in 0..4 {
            assert!(sh.push(wc(i), false), "a wake-up takes no CQ slot");
        }
        let mut out = [Wc::default(); 8];
        assert_eq!(cq.wait(&mut out, Duration::from_secs(3600)), 4);
        assert_eq!(out[3].wr_id, 3);
    }
}
