//! Ctrl-C (SIGINT) and SIGTERM, as a newcomer expects them (issue 17).
//!
//! A thread of signal-hook's waits for the two signals. A subcommand that can stop cleanly
//! and report what it did (`sim --seeds N`, `perf -D`) says so with [`handle_in_command`] and
//! polls [`interrupted`]; a second signal ends it anyway. Any other subcommand ends at once.
//! Either way the `--pcap` capture is flushed and closed first, as tcpdump does, so that the
//! file holds every packet written before the signal and reads back whole.

use softroce::net::Capture;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set by the first SIGINT or SIGTERM.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);
/// Set by a subcommand that stops by itself when [`INTERRUPTED`] is set.
static HANDLED: AtomicBool = AtomicBool::new(false);

/// True once SIGINT or SIGTERM arrived.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// The running subcommand stops by itself at the first signal (it polls [`interrupted`]).
pub fn handle_in_command() {
    HANDLED.store(true, Ordering::Relaxed);
}

/// Starts the thread that waits for the signals. `capture` (written to `path`) is flushed
/// before the process ends on a signal. If the signals cannot be hooked, their default
/// action stays (the process ends without the flush).
pub fn install(capture: Option<Arc<Capture>>, path: Option<PathBuf>) {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) else {
        return;
    };
    let spawned = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                let first = !INTERRUPTED.swap(true, Ordering::Relaxed);
                if first && HANDLED.load(Ordering::Relaxed) {
                    continue;
                }
                if let (Some(c), Some(p)) = (&capture, &path) {
                    let _ = c.flush();
                    eprintln!("[pcap] {} packets written to {}", c.packets(), p.display());
                }
                // The shell's convention for a process ended by a signal.
                std::process::exit(128 + sig);
            }
        });
    drop(spawned);
}
