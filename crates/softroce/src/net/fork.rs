//! What a `fork`ed child keeps of its parent's devices: not their port.
//!
//! A device's receive socket owns UDP port 4791 of the device's address. `fork` copies the
//! parent's descriptors into the child, so without this module a child that outlives the
//! parent's `ibv_close_device` (or that is still exiting when the parent reopens) keeps that
//! port bound, and the parent's next open of the device fails with EADDRINUSE. The child
//! cannot use the copy anyway: the driver thread that receives from it did not fork, so a
//! child that uses verbs opens the devices it uses itself (libibverbs.so.1 hands it no
//! device of the parent's: `softroce_cabi::fork::PerProcess`).
//!
//! So each receive socket is listed here while it is open, and a `pthread_atfork` child
//! handler, installed with the first device, puts `/dev/null` in the place of each listed
//! descriptor in the child (`dup3`, close-on-exec kept): the port is the parent's alone, and
//! a stale use of the parent's socket in the child fails (ENOTSOCK) instead of stealing the
//! parent's datagrams. The list holds [`SLOTS`] descriptors; a device opened past that many
//! at once is not listed (its child keeps the port, as before). Multicast group sockets are
//! not listed: they bind with `SO_REUSEADDR`, so a copy blocks no one, and a child that never
//! reads it takes nothing from the parent.

use std::os::fd::RawFd;
use std::sync::Once;
use std::sync::atomic::{AtomicI32, Ordering};

/// How many descriptors the list holds.
pub(super) const SLOTS: usize = 256;

/// The listed descriptors; -1 is a free slot. Lock-free, because the child handler runs
/// where a lock held by another thread of the parent at `fork` would never be released.
static FDS: [AtomicI32; SLOTS] = [const { AtomicI32::new(-1) }; SLOTS];

/// A descriptor on the list, taken off when this is dropped. Drop it before the descriptor
/// is closed (declare it before the socket in a struct), so that the slot never names a
/// number that a later `open` reuses.
#[derive(Debug)]
pub(super) struct Unshared(Option<usize>);

impl Drop for Unshared {
    fn drop(&mut self) {
        if let Some(i) = self.0 {
            FDS[i].store(-1, Ordering::SeqCst);
        }
    }
}

/// Lists `fd` (installing the child handler on first use): a child forked from now on
/// gets `/dev/null` in its place.
pub(super) fn unshared(fd: RawFd) -> Unshared {
    static HANDLER: Once = Once::new();
    HANDLER.call_once(|| {
        // SAFETY: registers a plain function with no arguments; it runs in the child only.
        // A failure (ENOMEM) leaves children with the copies, as before this module.
        unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
    });
    let slot = FDS.iter().position(|s| {
        s.compare_exchange(-1, fd, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    });
    Unshared(slot)
}

/// The `pthread_atfork` child handler: only async-signal-safe calls (`open`, `dup3`,
/// `close`), no allocation, no lock.
extern "C" fn in_child() {
    // SAFETY: a constant NUL-terminated path; the descriptor is closed below.
    let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if null < 0 {
        return;
    }
    for s in &FDS {
        let fd = s.swap(-1, Ordering::SeqCst);
        if fd >= 0 && fd != null {
            // SAFETY: replaces the child's copy of a socket of the parent's device; the
            // number stays valid for the objects that still name it.
            unsafe { libc::dup3(null, fd, libc::O_CLOEXEC) };
        }
    }
    // SAFETY: the descriptor opened above.
    unsafe { libc::close(null) };
}

/// Every signal blocked in the calling thread while this lives; the previous mask comes back
/// when it is dropped. Held across the `fork`/`clone` of softroce's own helper processes
/// (the stand-in, the keeper): the child starts with every signal blocked, so none of the
/// program's handlers can run in it before [`child_signal_defaults`] removes them.
pub(super) struct SignalsBlocked(libc::sigset_t);

impl SignalsBlocked {
    pub(super) fn new() -> SignalsBlocked {
        // SAFETY: sigfillset/pthread_sigmask on sets owned here; the old mask is kept to be
        // restored.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            SignalsBlocked(old)
        }
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved by `new` in this thread.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut());
        }
    }
}

/// In a helper child forked under [`SignalsBlocked`]: every signal back to its default
/// action, then `ignored` ignored, then nothing blocked. A copy of the program's handlers
/// would otherwise run in the child: libinfinipath (loaded by libfabric) catches SIGTERM and
/// calls `exit`, whose exit handlers in the child wait forever for a lock another thread of
/// the program held at the fork; the stand-in then never ended. Async-signal-safe (sigaction
/// and sigprocmask only).
///
/// # Safety
/// Only in a freshly forked child whose signal state nothing else in it relies on.
pub(super) unsafe fn child_signal_defaults(ignored: &[libc::c_int]) {
    // SAFETY: sigaction/sigprocmask with sets owned here; SIGKILL and SIGSTOP refuse the
    // change, which is harmless.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut dfl.sa_mask);
        for sig in 1..=libc::SIGRTMAX() {
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
        }
        let mut ign = dfl;
        ign.sa_sigaction = libc::SIG_IGN;
        for &sig in ignored {
            libc::sigaction(sig, &ign, std::ptr::null_mut());
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
}
