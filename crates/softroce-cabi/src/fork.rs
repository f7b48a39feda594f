//! What a `fork`ed child keeps of its parent's objects: nothing. [`PerProcess`] is the one
//! per-process reset of both C libraries: libibverbs.so.1's tables of open devices and MAD
//! ports, librdmacm.so.1's whole rdma_cm state.
//!
//! A child that uses verbs or rdma_cm after `fork` must not use the parent's devices: their
//! driver threads did not fork (a child has only the forking thread), so nothing would
//! receive for them. So the first use in the child starts afresh, and the child opens the
//! devices it uses itself. The parent's value is leaked in the child, not dropped: dropping
//! it could run the destructors of the parent's devices, which join threads that do not
//! exist in the child.
//!
//! `PerProcess` is not a lock: it sits behind the library's own (`Mutex<PerProcess<T>>`).
//! That lock is the library's to keep usable across `fork` (librdmacm.so.1 holds its state's
//! lock across it with `pthread_atfork`, so a child never inherits it locked by a thread
//! that is not there). [`ProcessLock`] is both in one, for a table whose child value is
//! simply empty: the child gets a lock of its own, so the parent's lock, whichever thread
//! held it at the `fork`, is never taken there.

use parking_lot::{Mutex, MutexGuard};
use std::convert::Infallible;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, Ordering};

/// A value of one process: in another one (a `fork`ed child) it is replaced, on first use,
/// by a fresh one, and the parent's is leaked (module doc).
pub struct PerProcess<T> {
    /// The process the value belongs to.
    pid: u32,
    value: T,
}

impl<T> PerProcess<T> {
    /// `value`, as this process's.
    pub fn new(value: T) -> Self {
        PerProcess {
            pid: std::process::id(),
            value,
        }
    }

    /// The value, after replacing it with `fresh()` if it is not this process's (a `fork`ed
    /// child's first use); the parent's value is leaked. An error of `fresh` is returned and
    /// leaves the parent's value in place, so the next call tries again.
    pub fn get_or_reset<E>(&mut self, fresh: impl FnOnce() -> Result<T, E>) -> Result<&mut T, E> {
        let pid = std::process::id();
        if self.pid != pid {
            let new = fresh()?;
            std::mem::forget(std::mem::replace(&mut self.value, new));
            self.pid = pid;
        }
        Ok(&mut self.value)
    }
}

impl<T: Default> PerProcess<T> {
    /// The value, emptied first ([`Default`]) if it is not this process's.
    pub fn get(&mut self) -> &mut T {
        match self.get_or_reset(|| Ok::<T, Infallible>(T::default())) {
            Ok(v) => v,
            Err(never) => match never {},
        }
    }
}

impl<T: Default> Default for PerProcess<T> {
    /// An empty value of this process.
    fn default() -> Self {
        PerProcess::new(T::default())
    }
}

/// A process-wide lock around a value of one process, for a library's table that its own
/// threads use (libibverbs.so.1's MAD ports, taken by librdmacm.so.1's CM driver thread at
/// every receive): in a `fork`ed child the first [`lock`](ProcessLock::lock) makes a new,
/// unlocked lock around `T::default()`, and the parent's lock and value are leaked there.
///
/// Why not a `Mutex<PerProcess<T>>`: `fork` copies the lock as it is, and the child has only
/// the forking thread. If another thread of the parent held the lock at that moment, it is
/// held for ever in the child, and the child's first use waits for ever (the CM driver thread
/// takes the MAD ports' lock every few milliseconds, so a child's `rdma_bind_addr` hung now
/// and then: tests/cm_fork.rs). Taking the lock in a `pthread_atfork` prepare handler, as
/// librdmacm.so.1 does for its state, deadlocks where the forking thread itself holds it
/// (opening a shared device forks its keeper while the table of open devices is locked).
/// Here the child never looks at the parent's lock: the process is checked before locking.
///
/// The lock is parking_lot's `Mutex`; the check is a `getpid` per call.
pub struct ProcessLock<T> {
    /// The current process's lock; null before the first use. Never freed (a `static`'s
    /// locks live as long as the process; a replaced parent's lock is leaked in the child).
    cur: AtomicPtr<Owned<T>>,
    /// Send and Sync as `Mutex<T>` is.
    _value: PhantomData<Mutex<T>>,
}

/// A lock and the process that made it.
struct Owned<T> {
    pid: u32,
    lock: Mutex<T>,
}

impl<T: Default> ProcessLock<T> {
    /// An unused lock; the value is made (`T::default()`) at the first
    /// [`lock`](ProcessLock::lock).
    pub const fn new() -> Self {
        ProcessLock {
            cur: AtomicPtr::new(std::ptr::null_mut()),
            _value: PhantomData,
        }
    }

    /// Locks this process's value, after replacing the lock with a new one around
    /// `T::default()` if it is not this process's (the first use, or a `fork`ed child's).
    pub fn lock(&self) -> MutexGuard<'_, T> {
        let pid = std::process::id();
        loop {
            let p = self.cur.load(Ordering::Acquire);
            // SAFETY: a non-null pointer here came from `Box::into_raw` below and is never
            // freed, so it is valid for as long as `self` is.
            if let Some(owned) = unsafe { p.as_ref() }
                && owned.pid == pid
            {
                return owned.lock.lock();
            }
            let fresh = Box::into_raw(Box::new(Owned {
                pid,
                lock: Mutex::new(T::default()),
            }));
            if self
                .cur
                .compare_exchange(p, fresh, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                // Another thread of this process installed its own first: use that one.
                // SAFETY: `fresh` was never published; this is its only owner.
                drop(unsafe { Box::from_raw(fresh) });
            }
        }
    }
}

impl<T: Default> Default for ProcessLock<T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Forks; the child runs `child` and exits with its code (`_exit`, so nothing of the
    /// test harness runs there); the parent returns the child's exit status.
    fn in_child(child: impl FnOnce() -> i32) -> i32 {
        // SAFETY: the child only runs `child` (plain code on its copy of this thread's
        // data: no lock another thread of the harness could hold) and `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(99);
            // SAFETY: ends the child without unwinding or running atexit handlers.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child, with a valid status pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(r, pid);
        assert!(libc::WIFEXITED(status), "child did not exit: {status:#x}");
        libc::WEXITSTATUS(status)
    }

    #[test]
    fn a_forked_child_starts_afresh_and_the_parent_keeps_its_value() {
        let mut p = PerProcess::new(vec![1u8, 2, 3]);
        assert_eq!(p.get(), &[1, 2, 3]);
        let code = in_child(|| {
            // A failing reset leaves the parent's value for the next try.
            if p.get_or_reset(|| Err::<Vec<u8>, i32>(7)) != Err(7) {
                return 1;
            }
            if p.get_or_reset(|| Ok::<_, i32>(vec![9])).map(|v| v.clone()) != Ok(vec![9]) {
                return 2;
            }
            // The child's value from then on: no second reset.
            p.get().push(10);
            if p.get() != &[9, 10] {
                return 3;
            }
            0
        });
        assert_eq!(code, 0);
        assert_eq!(p.get(), &[1, 2, 3]);
        assert_eq!(
            p.get_or_reset(|| Err::<Vec<u8>, i32>(7)).cloned(),
            Ok(vec![1, 2, 3])
        );
    }

    #[test]
    fn get_empties_the_table_in_a_child() {
        let mut p: PerProcess<Vec<u32>> = PerProcess::default();
        p.get().push(5);
        let code = in_child(|| if p.get().is_empty() { 0 } else { 1 });
        assert_eq!(code, 0);
        assert_eq!(p.get(), &[5]);
    }

    #[test]
    fn a_forked_child_gets_a_lock_of_its_own_even_while_another_thread_holds_the_parents() {
        static TABLE: ProcessLock<Vec<u32>> = ProcessLock::new();
        TABLE.lock().push(1);
        // A thread of the parent holds the lock across the fork, as librdmacm.so.1's CM
        // driver thread can hold the MAD ports' lock (with a Mutex<PerProcess> the child
        // waited for ever).
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let g = TABLE.lock();
            held_tx.send(()).unwrap();
            done_rx.recv().unwrap();
            drop(g);
        });
        held_rx.recv().unwrap();
        let code = in_child(|| {
            let mut t = TABLE.lock();
            if !t.is_empty() {
                return 1;
            }
            t.push(7);
            drop(t);
            if *TABLE.lock() != [7] {
                return 2;
            }
            0
        });
        assert_eq!(code, 0);
        done_tx.send(()).unwrap();
        holder.join().unwrap();
        assert_eq!(*TABLE.lock(), [1], "the parent keeps its value");
    }

    #[test]
    fn threads_racing_to_the_first_lock_share_one_value() {
        static TABLE: ProcessLock<Vec<u32>> = ProcessLock::new();
        let threads: Vec<_> = (0..8)
            .map(|i| std::thread::spawn(move || TABLE.lock().push(i)))
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut v = TABLE.lock().clone();
        v.sort_unstable();
        assert_eq!(v, (0..8).collect::<Vec<_>>());
    }
}
