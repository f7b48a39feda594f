//! `SOFTROCE_LOG`: the engine's protocol events on stderr, for the `softroce` CLI and for
//! programs on softroce's `libibverbs.so.1` and `librdmacm.so.1` alike.

/// Installs a `tracing` subscriber for `$SOFTROCE_LOG` (tracing-subscriber's EnvFilter
/// syntax, e.g. `debug` or `softroce::nak=debug,softroce::drop=debug`): packets dropped (with
/// the drop reason), NAKs sent and received, retransmissions, RNR waits and QP state
/// changes, one line each on stderr. Unset, nothing is installed and the events cost one
/// relaxed load each. A process that already has a subscriber keeps it; a filter that does
/// not parse is reported on stderr and ignored.
pub fn init_log() {
    let Ok(filter) = std::env::var("SOFTROCE_LOG") else {
        return;
    };
    match tracing_subscriber::EnvFilter::try_new(&filter) {
        Ok(f) => {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(f)
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .without_time()
                .try_init();
        }
        Err(e) => eprintln!("softroce: SOFTROCE_LOG={filter:?} ignored: {e}"),
    }
}
