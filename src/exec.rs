//! `softroce exec`: runs an unmodified, dynamically linked verbs or rdma_cm program on
//! softroce devices. It puts the directory holding softroce's `libibverbs.so.1`
//! (crates/softroce-capi) and `librdmacm.so.1` (crates/softroce-rdmacm) first in
//! `LD_LIBRARY_PATH`, sets `SOFTROCE_IP` when `--ip` is given, and replaces itself with the
//! program (`execvp`), which then loads softroce's libraries instead of rdma-core's.
//!
//! The library directory is `$SOFTROCE_LIB_DIR` when set, else `softroce-libs/` next to this
//! executable (`target/<profile>/softroce-libs/libibverbs.so.1` and `librdmacm.so.1`, the
//! links the two crates' build.rs make to `target/<profile>/deps/libsoftroce_capi.so` and
//! `libsoftroce_rdmacm.so`).
//!
//! Before the exec, the process enters a private mount namespace in which `/dev/infiniband`
//! and `/sys/class/infiniband*` show the program's devices as the kernel shows its own
//! (`view.rs`); when namespaces are not permitted it says so in one line and runs the
//! program without that view.

use crate::BoxError;
use softroce::net::discover::{SOFTROCE_IP, devices_from_env, parse_device_list};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

/// Environment variable naming the directory that holds softroce's `libibverbs.so.1`.
pub const SOFTROCE_LIB_DIR: &str = "SOFTROCE_LIB_DIR";

#[derive(clap::Args)]
pub struct ExecArgs {
    /// The devices' addresses, comma-separated (softroce0, softroce1, … in that order);
    /// sets SOFTROCE_IP for the program. Default: SOFTROCE_IP as set, else 127.0.0.1.
    #[arg(long)]
    ip: Option<String>,
    /// Write every RoCEv2 datagram that the program's devices (and its children's) send and
    /// receive to this pcap (created or truncated here; each process appends whole records,
    /// so a datagram between two of them appears twice, as sent and as received). Read it
    /// with `softroce decode` or Wireshark.
    #[arg(long, value_name = "FILE")]
    pcap: Option<PathBuf>,
    /// Do not give the program the private /dev/infiniband and /sys/class/infiniband* that
    /// show its devices (a mount namespace, in a user namespace unless run as root).
    #[arg(long)]
    no_view: bool,
    /// The program and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    program: Vec<OsString>,
}

/// The directory holding softroce's `libibverbs.so.1`.
pub fn lib_dir() -> Result<PathBuf, BoxError> {
    let dir = match std::env::var_os(SOFTROCE_LIB_DIR) {
        Some(d) => PathBuf::from(d),
        None => std::env::current_exe()?
            .parent()
            .ok_or("cannot locate the softroce executable's directory")?
            .join("softroce-libs"),
    };
    if !dir.join("libibverbs.so.1").exists() {
        return Err(format!(
            "{}/libibverbs.so.1 not found: build the libraries with `cargo build` (add \
             `--release` for a release softroce: the same profile as this executable), or set \
             {SOFTROCE_LIB_DIR} to their directory",
            dir.display()
        )
        .into());
    }
    // Without softroce's librdmacm.so.1 an rdma_cm program would load rdma-core's, which
    // cannot drive softroce devices: say so, but verbs-only programs still run.
    if !dir.join("librdmacm.so.1").exists() {
        eprintln!(
            "softroce exec: {}/librdmacm.so.1 not found (build it with \
             `cargo build -p softroce-rdmacm`); rdma_cm programs will not work",
            dir.display()
        );
    }
    Ok(dir)
}

/// Settings middleware needs on softroce (as on kernel rxe), each set for the program only
/// when the caller has not set it (`is_set`):
///
/// - `UCX_UD_VERBS_ETH_DGID_CHECK=n`: UCX's `ud_verbs` (which `rc_verbs` uses to connect)
///   reads a received packet's IP version from `wc.sl`, where mlx5 puts it; rxe and softroce
///   leave `sl` 0, so UCX would check the IPv4 header as an IPv6 destination GID and drop
///   every packet.
/// - `UCX_ADAPTIVE_PROGRESS=n`: with adaptive progress (UCX 1.13's default) UCP stops
///   progressing an auxiliary `ud_verbs` interface it sees idle and removes its resend timer,
///   even while the interface holds a wireup reply its peer has not acknowledged; only a packet
///   arriving on that interface runs its resends again. When the reply and its one resend are
///   lost (softroce's datagrams can be, in a socket buffer or on a lossy link; so can rxe's),
///   the peer, whose request was acknowledged, sends nothing more and the connection waits
///   forever. Every interface is then progressed, timers included.
pub fn middleware_defaults(is_set: impl Fn(&str) -> bool) -> Vec<(&'static str, &'static str)> {
    [
        ("UCX_UD_VERBS_ETH_DGID_CHECK", "n"),
        ("UCX_ADAPTIVE_PROGRESS", "n"),
    ]
    .into_iter()
    .filter(|(n, _)| !is_set(n))
    .collect()
}

/// Execs the program; returns only on failure.
pub fn run(args: ExecArgs) -> Result<(), BoxError> {
    let dir = lib_dir()?;
    let mut cmd = std::process::Command::new(&args.program[0]);
    cmd.args(&args.program[1..]);
    // An unusable $SOFTROCE_IP is the program's to report (its libibverbs says why when it
    // lists devices, as without exec); it then gets no view.
    let devices = match &args.ip {
        Some(ip) => {
            let devices = parse_device_list(ip)?;
            cmd.env(SOFTROCE_IP, ip);
            Some(devices)
        }
        None => devices_from_env().ok(),
    };
    if let Some(file) = &args.pcap {
        // Created (truncated) with its header now; the program's processes append to it.
        std::fs::File::create(file).map_err(|e| format!("--pcap {}: {e}", file.display()))?;
        softroce::net::Capture::append(file)
            .map_err(|e| format!("--pcap {}: {e}", file.display()))?;
        let abs = std::path::absolute(file)?;
        cmd.env(softroce::net::pcap::SOFTROCE_PCAP, abs);
    }
    let mut path = dir.into_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    cmd.env("LD_LIBRARY_PATH", path);
    for (name, value) in middleware_defaults(|n| std::env::var_os(n).is_some()) {
        cmd.env(name, value);
    }
    if let Some(devices) = devices.filter(|_| !args.no_view) {
        // Still single-threaded here, as a user namespace requires.
        if let Err(e) = crate::view::enter(&devices) {
            eprintln!(
                "softroce exec: no /dev/infiniband and /sys/class/infiniband view for {} ({e}); \
                 running it without",
                args.program[0].to_string_lossy()
            );
        }
    }
    let e = cmd.exec();
    Err(format!("cannot run {}: {e}", args.program[0].to_string_lossy()).into())
}

#[cfg(test)]
mod tests {
    use super::middleware_defaults;

    #[test]
    fn ucx_settings_apply_unless_set() {
        assert_eq!(
            middleware_defaults(|_| false),
            vec![
                ("UCX_UD_VERBS_ETH_DGID_CHECK", "n"),
                ("UCX_ADAPTIVE_PROGRESS", "n")
            ]
        );
        assert_eq!(
            middleware_defaults(|n| n == "UCX_UD_VERBS_ETH_DGID_CHECK"),
            vec![("UCX_ADAPTIVE_PROGRESS", "n")]
        );
        assert!(
            middleware_defaults(
                |n| n == "UCX_UD_VERBS_ETH_DGID_CHECK" || n == "UCX_ADAPTIVE_PROGRESS"
            )
            .is_empty()
        );
    }
}
