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
//! that is not there).

use std::convert::Infallible;

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
}
