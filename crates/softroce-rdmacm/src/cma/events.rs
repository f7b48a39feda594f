//! Event channels and events: a channel is an eventfd in semaphore mode (one count per
//! queued event) plus a queue, so its fd works with poll/select as librdmacm's does;
//! `rdma_get_cm_event` blocks in `read(2)` on it (EAGAIN when the program made the fd
//! non-blocking) and `rdma_ack_cm_event` frees the event (and a destroyed id with its last
//! event). Also the synchronous ids' wait for their events (librdmacm's `ucma_complete`),
//! and librdmacm's `ucma_process_join`, which runs as a MULTICAST_JOIN is handed out.
//!
//! Contracts: an event's id is live while the event is queued or out (rdma_destroy_id drops
//! its queued events and is freed at its last ack); a channel outlives its ids.

use super::state::{State, errno_or, free_id, state};
use crate::abi::*;
use crate::ffi;
use crate::ibv::ibv;
use core::ffi::{c_char, c_int};
use parking_lot::{Mutex, MutexGuard};
use softroce_cabi::fork::ProcessLock;
use std::collections::{HashSet, VecDeque};

/// An event channel: the C struct (its fd an eventfd in semaphore mode, one count per queued
/// event), then the queue.
#[repr(C)]
struct Channel {
    ch: rdma_event_channel,
    queue: Mutex<VecDeque<usize>>,
}

/// An event handed out: the C struct, then the private data its `param` points at, inline
/// as in librdmacm's `struct cma_event`. Inline matters: programs read the private data after
/// `rdma_ack_cm_event` has freed the event (the seed's rdma_client does), which works with
/// librdmacm because free(3) clobbers only the first bytes of a block; a separate buffer
/// would be clobbered at its start, where the data is.
#[repr(C)]
pub(super) struct Event {
    pub(super) ev: rdma_cm_event,
    pub(super) data: [u8; 256],
    /// The multicast membership a MULTICAST_JOIN is for (librdmacm's `cma_event.mc`); 0
    /// for other events.
    pub(super) mc: u64,
}

pub(super) fn new_event(id: *mut rdma_cm_id, kind: c_int, status: c_int) -> Box<Event> {
    Box::new(Event {
        ev: rdma_cm_event {
            id,
            listen_id: std::ptr::null_mut(),
            event: kind,
            status,
            // SAFETY: the union of plain C structs; all zeros (NULL pointers) is valid.
            param: unsafe { std::mem::zeroed() },
        },
        data: [0; 256],
        mc: 0,
    })
}

/// Sets a connection event's private data (copied into the event).
pub(super) fn set_private(ev: &mut Event, data: &[u8]) {
    let n = data.len().min(ev.data.len());
    ev.data[..n].copy_from_slice(&data[..n]);
    // Writing a member of the union (the `conn` one) needs no unsafe.
    ev.ev.param.conn.private_data = if n == 0 {
        std::ptr::null()
    } else {
        ev.data.as_ptr().cast()
    };
    ev.ev.param.conn.private_data_len = n.min(255) as u8;
}

/// Queues `ev` on its id's channel.
pub(super) fn post(ev: Box<Event>) {
    // SAFETY: the event's id is live (callers hold the lock and checked it) and its channel
    // outlives it (rdma_destroy_event_channel requires its ids destroyed first).
    let ch = unsafe { (*ev.ev.id).channel };
    post_on(ch, ev);
}

/// Queues `ev` on channel `ch` (a request goes to its listener's channel, which is not the
/// new id's when the listener is synchronous).
pub(super) fn post_on(ch: *mut rdma_event_channel, ev: Box<Event>) {
    if ch.is_null() {
        return;
    }
    let chan = ch.cast::<Channel>();
    // SAFETY: every channel of an id is one of our boxed `Channel`s.
    let chan = unsafe { &*chan };
    chan.queue.lock().push_back(Box::into_raw(ev) as usize);
    let one: u64 = 1;
    // SAFETY: writing 8 bytes to our eventfd.
    let _ = unsafe { libc::write(chan.ch.fd, (&one as *const u64).cast(), 8) };
}

/// The channels made and not destroyed yet, by address. A program may hand a channel back
/// after destroying it (perftest's `-R` client does, when its connection is refused: its
/// retry destroys the channel, then destroys it again); that call is refused with EBADF,
/// what librdmacm's calls on the channel's closed fd give, instead of reading freed memory.
/// Per process ([`ProcessLock`]): a `fork`ed child starts with none (its rdma_cm state starts
/// afresh, so the parent's channels would never get an event there), and never takes the
/// lock a thread of the parent (its `rdma_get_cm_event` loop) may have held at the fork.
fn live_channels() -> MutexGuard<'static, HashSet<usize>> {
    static LIVE: ProcessLock<HashSet<usize>> = ProcessLock::new();
    LIVE.lock()
}

/// A new channel: an eventfd in semaphore mode and an empty queue (None: errno is set).
pub(super) fn new_channel() -> Option<*mut rdma_event_channel> {
    // SAFETY: plain eventfd creation.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
    if fd < 0 {
        return None;
    }
    let ch = Box::new(Channel {
        ch: rdma_event_channel { fd },
        queue: Mutex::new(VecDeque::new()),
    });
    let ch = Box::into_raw(ch);
    live_channels().insert(ch as usize);
    Some(ch.cast())
}

pub(crate) extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    ffi!({
        drop(state()?);
        // NULL with the errno eventfd(2) set.
        Ok(new_channel().unwrap_or(std::ptr::null_mut()))
    })
}

pub(crate) extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    ffi!({
        if channel.is_null() || !live_channels().remove(&(channel as usize)) {
            crate::set_errno(libc::EBADF);
            return;
        }
        // SAFETY: a channel from rdma_create_event_channel, destroyed once (it was live).
        let ch = unsafe { Box::from_raw(channel.cast::<Channel>()) };
        for e in ch.queue.lock().drain(..) {
            // SAFETY: queued events are boxes nobody was handed.
            drop(unsafe { Box::from_raw(e as *mut Event) });
        }
        // SAFETY: our eventfd.
        unsafe { libc::close(ch.ch.fd) };
    })
}

/// Frees the events queued on channel `ch` (NULL: none) that `pred` picks, with their
/// counts on the channel's eventfd.
pub(super) fn drop_queued(ch: *mut rdma_event_channel, mut pred: impl FnMut(&Event) -> bool) {
    if ch.is_null() {
        return;
    }
    // SAFETY: every channel of an id is one of our boxed `Channel`s.
    let chan = unsafe { &*ch.cast::<Channel>() };
    let mut q = chan.queue.lock();
    let before = q.len();
    q.retain(|&e| {
        // SAFETY: queued events are live boxes nobody was handed.
        let picked = pred(unsafe { &*(e as *const Event) });
        if picked {
            // SAFETY: removed from the queue, so freed once.
            drop(unsafe { Box::from_raw(e as *mut Event) });
        }
        !picked
    });
    for _ in q.len()..before {
        take_count(chan.ch.fd);
    }
}

/// (Feature `testing`.) The events queued on channel `ch`, oldest first: each one's id,
/// listening id (0: none) and kind. For the in-memory bench's checks.
#[cfg(feature = "testing")]
pub(super) fn queued(ch: *mut rdma_event_channel) -> Vec<(usize, usize, c_int)> {
    if ch.is_null() {
        return Vec::new();
    }
    // SAFETY: every channel of an id is one of our boxed `Channel`s.
    let chan = unsafe { &*ch.cast::<Channel>() };
    let q = chan.queue.lock();
    q.iter()
        .map(|&e| {
            // SAFETY: queued events are live boxes nobody was handed.
            let ev = unsafe { &(*(e as *const Event)).ev };
            (ev.id as usize, ev.listen_id as usize, ev.event)
        })
        .collect()
}

/// Moves the events of `id` queued on channel `from` to the end of channel `to`, in order
/// (the kernel's `ucma_migrate_id` moves an id's unread events to its new file).
pub(super) fn move_queued(
    from: *mut rdma_event_channel,
    to: *mut rdma_event_channel,
    id: *mut rdma_cm_id,
) {
    if from.is_null() || to.is_null() || from == to {
        return;
    }
    // SAFETY: every channel of an id is one of our boxed `Channel`s.
    let chan = unsafe { &*from.cast::<Channel>() };
    let mut moved = Vec::new();
    {
        let mut q = chan.queue.lock();
        q.retain(|&e| {
            // SAFETY: queued events are live boxes nobody was handed.
            let mine = unsafe { (*(e as *const Event)).ev.id } == id;
            if mine {
                moved.push(e);
            }
            !mine
        });
    }
    for e in moved {
        take_count(chan.ch.fd);
        // SAFETY: removed from `from`'s queue: a live box owned by nobody else.
        post_on(to, unsafe { Box::from_raw(e as *mut Event) });
    }
}

/// Takes one count from a channel's eventfd without blocking.
fn take_count(fd: c_int) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let mut v = 0u64;
    // SAFETY: poll on one pollfd, then an 8-byte read from our eventfd, which is ready.
    unsafe {
        if libc::poll(&mut p, 1, 0) == 1 {
            let _ = libc::read(fd, (&mut v as *mut u64).cast(), 8);
        }
    }
}

/// Whether `id` is a live synchronous id.
pub(super) fn is_sync(id: *mut rdma_cm_id) -> bool {
    state().is_ok_and(|mut st| st.id_mut(id).is_ok_and(|s| s.sync))
}

/// An entry point's return (0, or -1 and errno): on success, a synchronous id then waits
/// for its event.
pub(super) fn sync_result(id: *mut rdma_cm_id, r: Result<(), c_int>) -> Result<c_int, c_int> {
    match r {
        Ok(()) if is_sync(id) => complete(id),
        r => r.map(|()| 0),
    }
}

/// librdmacm's `ucma_complete`: acks the id's last event, waits on its own channel for the
/// next one and keeps it in `id->event`; an event with a status is the call's error
/// (ECONNREFUSED for REJECTED). Called without the state lock.
fn complete(id: *mut rdma_cm_id) -> Result<c_int, c_int> {
    // SAFETY: a live synchronous id; its `event` is one we handed out (or NULL).
    let prev = unsafe { std::mem::replace(&mut (*id).event, std::ptr::null_mut()) };
    if !prev.is_null() {
        rdma_ack_cm_event(prev);
    }
    let mut ev = std::ptr::null_mut();
    // SAFETY: the id's own channel.
    if rdma_get_cm_event(unsafe { (*id).channel }, &mut ev) != 0 {
        // The errno rdma_get_cm_event set.
        return Err(errno_or(libc::EIO));
    }
    // SAFETY: live id; `ev` the event just taken.
    let (kind, status) = unsafe {
        (*id).event = ev;
        ((*ev).event, (*ev).status)
    };
    match status {
        0 => Ok(0),
        _ if kind == event::REJECTED => Err(libc::ECONNREFUSED),
        s => Err(s.abs()),
    }
}

pub(crate) extern "C" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    ffi!({
        if channel.is_null() || event.is_null() {
            return Err(libc::EINVAL);
        }
        if !live_channels().contains(&(channel as usize)) {
            return Err(libc::EBADF);
        }
        // SAFETY: a live channel of ours.
        let chan = unsafe { &*channel.cast::<Channel>() };
        loop {
            let mut v = 0u64;
            // SAFETY: an 8-byte read from our eventfd; blocks unless made non-blocking.
            let n = unsafe { libc::read(chan.ch.fd, (&mut v as *mut u64).cast(), 8) };
            if n != 8 {
                let e = errno_or(libc::EIO);
                if e == libc::EINTR {
                    continue;
                }
                return Err(e);
            }
            // The id's state is updated under the state lock, before the queue.
            let Ok(mut st) = state() else {
                return Err(libc::ENODEV);
            };
            let Some(e) = chan.queue.lock().pop_front() else {
                continue; // its id was destroyed meanwhile
            };
            let ev = e as *mut Event;
            // SAFETY: a live queued event, now ours alone.
            let id = unsafe { (*ev).ev.id };
            // SAFETY: as above.
            process_join(&mut st, unsafe { &mut *ev });
            if let Some(s) = st.ids.get_mut(&(id as usize)) {
                s.events_out += 1;
            }
            // SAFETY: the caller's out pointer.
            unsafe { *event = ev.cast() };
            return Ok(0);
        }
    })
}

pub(crate) extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    ffi!({
        if event.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: an event from rdma_get_cm_event, acked once.
        let ev = unsafe { Box::from_raw(event.cast::<Event>()) };
        let Ok(mut st) = state() else { return Ok(0) };
        let id = ev.ev.id as usize;
        if let Some(s) = st.ids.get_mut(&id) {
            s.events_out = s.events_out.saturating_sub(1);
            if s.destroyed && s.events_out == 0 {
                st.ids.remove(&id);
                free_id(id as *mut rdma_cm_id);
            }
        }
        Ok(0)
    })
}

/// librdmacm's `ucma_process_join`, run as `rdma_get_cm_event` hands out `ev`: a
/// MULTICAST_JOIN records the MGID in its membership and attaches the id's QP (if any, and
/// unless the join was send-only); a failed attach makes the event MULTICAST_ERROR with
/// status -1 and errno the attach's error. Other events pass unchanged.
fn process_join(st: &mut State, ev: &mut Event) {
    if ev.ev.event != event::MULTICAST_JOIN || ev.mc == 0 {
        return;
    }
    let id = ev.ev.id;
    let Some(m) = st
        .ids
        .get_mut(&(id as usize))
        .and_then(|s| s.mcast.iter_mut().find(|m| m.handle == ev.mc))
    else {
        return;
    };
    // SAFETY: a MULTICAST_JOIN's `ud` member is the one join() wrote.
    let mgid = unsafe { ev.ev.param.ud.ah_attr.grh.dgid.raw };
    m.mgid = mgid;
    // SAFETY: the event's id is live (its state was just found).
    let qp = unsafe { (*id).qp };
    if qp.is_null() || m.join_flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER {
        return;
    }
    let Ok(ibv) = ibv() else { return };
    let gid = ibv_gid { raw: mgid };
    // SAFETY: the id's live QP and a GID on our stack; libibverbs does not call back.
    let r = unsafe { (ibv.attach_mcast)(qp, &gid, 0) };
    if r != 0 {
        crate::set_errno(r);
        ev.ev.event = event::MULTICAST_ERROR;
        ev.ev.status = -1;
    }
}

pub(crate) extern "C" fn rdma_event_str(event: c_int) -> *const c_char {
    const NAMES: [&std::ffi::CStr; 16] = [
        c"RDMA_CM_EVENT_ADDR_RESOLVED",
        c"RDMA_CM_EVENT_ADDR_ERROR",
        c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        c"RDMA_CM_EVENT_ROUTE_ERROR",
        c"RDMA_CM_EVENT_CONNECT_REQUEST",
        c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        c"RDMA_CM_EVENT_CONNECT_ERROR",
        c"RDMA_CM_EVENT_UNREACHABLE",
        c"RDMA_CM_EVENT_REJECTED",
        c"RDMA_CM_EVENT_ESTABLISHED",
        c"RDMA_CM_EVENT_DISCONNECTED",
        c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        c"RDMA_CM_EVENT_MULTICAST_JOIN",
        c"RDMA_CM_EVENT_MULTICAST_ERROR",
        c"RDMA_CM_EVENT_ADDR_CHANGE",
        c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
    ];
    usize::try_from(event)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or(c"UNKNOWN EVENT".as_ptr(), |n| n.as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;
    use softroce_cabi::errno;

    // A channel destroyed twice (perftest -R's client retry does it) is refused with EBADF,
    // as librdmacm's calls on the closed fd are, and so is taking an event from it.
    #[test]
    fn destroyed_channel_is_refused_with_ebadf() {
        let ch = new_channel().unwrap();
        rdma_destroy_event_channel(ch);
        crate::set_errno(0);
        rdma_destroy_event_channel(ch);
        assert_eq!(errno(), libc::EBADF);
        let mut ev = std::ptr::null_mut();
        assert_eq!(rdma_get_cm_event(ch, &mut ev), -1);
        assert_eq!(errno(), libc::EBADF);
        assert!(ev.is_null());
    }
}
