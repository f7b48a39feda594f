//! The scheduling policy of a device's driver thread.
//!
//! Kernel rxe handles a received packet in softirq on the CPU that took it, ahead of any
//! process. softroce's driver thread is a process thread: on a machine whose cores the
//! applications keep busy (perftest's latency tests spin on memory on every core of a 2-vCPU
//! guest) it waits for the scheduler, up to a tick (4 ms at HZ=250) per packet, when CFS does
//! not preempt the spinning task at its wakeup. With `SOFTROCE_RT=1`, where the process may
//! (root, CAP_SYS_NICE, or an RLIMIT_RTPRIO above 0), the driver thread runs SCHED_FIFO at
//! priority 1, the lowest real-time priority: it preempts normal threads as soon as a
//! datagram wakes it and, since it blocks in `recvmmsg` whenever its socket is empty, takes
//! no CPU it does not use. Off by default: its wakeups (at least every 5 ms, for the QP
//! timers) preempt the application too, and perftest's clock calibration then failed (0 MB/s
//! printed) in 3 of 108 runs, none of 54 without. Measured in
//! docs/performance.md ("Side by side with kernel rxe").

/// The environment variable that chooses the driver threads' policy: `1` asks for SCHED_FIFO
/// priority 1, which the kernel refuses (EPERM) to a process without the right (the thread
/// then keeps the normal policy); unset or anything else keeps the process's normal policy.
pub const SOFTROCE_RT: &str = "SOFTROCE_RT";

/// Whether `$SOFTROCE_RT` ([`SOFTROCE_RT`]) asks for a real-time driver thread.
pub(crate) fn realtime_wanted() -> bool {
    std::env::var_os(SOFTROCE_RT).is_some_and(|v| v == "1")
}

/// Moves the calling thread to SCHED_FIFO priority 1 with SCHED_RESET_ON_FORK (a process
/// forked from it, a stand-in or keeper, starts at the normal policy). Returns whether the
/// kernel allowed it; a refusal (EPERM without the right) leaves the thread as it was.
pub(crate) fn enter_realtime() -> bool {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: sched_setscheduler reads `param`, a valid sched_param on this stack, during the
    // call only; pid 0 names the calling thread.
    unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param) == 0
    }
}

/// The calling thread's scheduling policy (`SCHED_*`, without SCHED_RESET_ON_FORK).
#[cfg(test)]
pub(crate) fn current_policy() -> i32 {
    // SAFETY: sched_getscheduler takes no pointer; pid 0 names the calling thread.
    unsafe { libc::sched_getscheduler(0) & !libc::SCHED_RESET_ON_FORK }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_real_time_driver_thread_is_fifo_priority_1_and_its_forks_are_not() {
        let t = std::thread::spawn(|| {
            if !enter_realtime() {
                // Not permitted here (no root, no CAP_SYS_NICE, RLIMIT_RTPRIO 0): the
                // thread keeps the normal policy.
                return (false, current_policy(), None);
            }
            let mut param = libc::sched_param { sched_priority: 0 };
            // SAFETY: sched_getparam writes one sched_param into `param`, valid here.
            let rc = unsafe { libc::sched_getparam(0, &mut param) };
            assert_eq!(rc, 0);
            // SAFETY: a fork in a test thread; the child only asks its own policy and exits
            // with _exit, running no Rust code that could take a lock the fork copied.
            let child_policy = unsafe {
                let pid = libc::fork();
                if pid == 0 {
                    let p = libc::sched_getscheduler(0);
                    libc::_exit(if p == libc::SCHED_OTHER { 0 } else { 1 });
                }
                let mut status = 0;
                libc::waitpid(pid, &mut status, 0);
                libc::WEXITSTATUS(status)
            };
            (
                true,
                current_policy(),
                Some((param.sched_priority, child_policy)),
            )
        });
        let (entered, policy, detail) = t.join().unwrap();
        if entered {
            assert_eq!(policy, libc::SCHED_FIFO);
            assert_eq!(
                detail,
                Some((1, 0)),
                "priority 1; the forked child at SCHED_OTHER"
            );
        } else {
            assert_eq!(policy, libc::SCHED_OTHER);
        }
        // The test thread itself is untouched.
        assert_eq!(current_policy(), libc::SCHED_OTHER);
    }
}
