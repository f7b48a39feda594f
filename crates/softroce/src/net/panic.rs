//! What a thread softroce starts does when its body panics: the driver thread of a device
//! (`udp`), of a CM (`cm`), and librdmacm.so.1's CM driver threads each run their body under
//! `std::panic::catch_unwind`, report the panic here (a line on stderr and a
//! `tracing::error!` with target `softroce::net`, seen with `SOFTROCE_LOG`), then fail what
//! they drove, so that every caller waiting on them gets an error instead of a silent hang.
//!
//! The C libraries have a test hook to cause such a panic ([`SOFTROCE_TEST_PANIC`]); the
//! Rust types have `inject_panic_for_test` methods.
//!
//! Panics: never (a payload that is not a string is reported as such).

use std::sync::OnceLock;
use std::time::Duration;

/// Test hook of the C libraries, read once per process: `SOFTROCE_TEST_PANIC=<thread>:<ms>`
/// makes the named threads panic about `<ms>` milliseconds after they start, to test what a
/// panic there does. `<thread>` is `device` (each device driver thread libibverbs.so.1
/// starts) or `rdmacm` (each CM driver thread librdmacm.so.1 starts). Not for use outside
/// tests; anything else in the variable is ignored.
pub const SOFTROCE_TEST_PANIC: &str = "SOFTROCE_TEST_PANIC";

/// The delay [`SOFTROCE_TEST_PANIC`] sets for `thread` (`device` or `rdmacm`), if it names
/// that thread. The variable is read at the first call.
pub fn test_panic_delay(thread: &str) -> Option<Duration> {
    static HOOK: OnceLock<Option<(String, Duration)>> = OnceLock::new();
    let hook = HOOK.get_or_init(|| {
        let v = std::env::var(SOFTROCE_TEST_PANIC).ok()?;
        let (name, ms) = v.split_once(':')?;
        Some((name.to_string(), Duration::from_millis(ms.parse().ok()?)))
    });
    hook.as_ref()
        .filter(|(name, _)| name == thread)
        .map(|(_, d)| *d)
}

/// The message a panic carried: its `&str` or `String` payload (what `panic!` with a format
/// gives), else a placeholder.
pub fn message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a panic without a message)".to_string()
    }
}

/// Reports that `thread` (e.g. "device softroce0 driver thread") panicked with `msg`, and
/// `then` (what follows from it, e.g. "the device is now failed"): one line on stderr,
/// `softroce: <thread> panicked: <msg>; <then>`, and the same through `tracing` at ERROR
/// (target `softroce::net`).
pub fn report(thread: &str, msg: &str, then: &str) {
    eprintln!("softroce: {thread} panicked: {msg}; {then}");
    tracing::error!(target: "softroce::net", thread, "{thread} panicked: {msg}; {then}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_of_str_and_string_payloads() {
        let p = std::panic::catch_unwind(|| std::panic::panic_any("plain")).unwrap_err();
        assert_eq!(message(&*p), "plain");
        let n = 3;
        let p = std::panic::catch_unwind(|| std::panic::panic_any(format!("formatted {n}")))
            .unwrap_err();
        assert_eq!(message(&*p), "formatted 3");
        let p = std::panic::catch_unwind(|| std::panic::panic_any(7u8)).unwrap_err();
        assert_eq!(message(&*p), "(a panic without a message)");
    }
}
