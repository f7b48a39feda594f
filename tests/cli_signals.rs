//! Ctrl-C, SIGTERM and the device options, as a newcomer met them (issue 17 items 5 and 10):
//! `sim --seeds N` and `perf -D` printed nothing when interrupted, a `--pcap` file was not
//! flushed on a signal, and `sim --help` / `decode --help` listed `--pcap` and `--exact-icrc`,
//! which both refuse. Addresses: 127.0.89.64/26 (this file's share of cli_mismatch's /24).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn softroce() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_softroce"));
    c.env_remove("SOFTROCE_IP").env_remove("SOFTROCE_LOG");
    c
}

fn help_of(sub: &str) -> String {
    let o = softroce().args([sub, "--help"]).output().unwrap();
    assert!(o.status.success());
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn only_subcommands_that_open_devices_list_the_device_options() {
    for sub in ["sim", "decode"] {
        let h = help_of(sub);
        assert!(
            !h.contains("--pcap") && !h.contains("--exact-icrc"),
            "{sub}: {h}"
        );
    }
    for sub in ["demo", "devinfo", "pingpong", "target"] {
        let h = help_of(sub);
        assert!(
            h.contains("--pcap") && h.contains("--exact-icrc"),
            "{sub}: {h}"
        );
    }
    let o = softroce()
        .args(["sim", "--pcap", "x.pcap"])
        .output()
        .unwrap();
    assert!(!o.status.success());
}

/// Sends `sig` to the child once its first stdout line is there; returns (status, stdout,
/// stderr).
fn interrupt_after_first_line(
    mut cmd: Command,
    sig: i32,
) -> (std::process::ExitStatus, String, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    let r = unsafe { libc::kill(child.id() as i32, sig) };
    assert_eq!(r, 0);
    let until = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < until, "still runs 30 s after the signal");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let o = child.wait_with_output().unwrap();
    (
        o.status,
        first + &rest,
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn ctrl_c_on_a_sim_soak_prints_what_was_done() {
    let mut c = softroce();
    c.args(["sim", "--seeds", "1000000", "--ops", "5"]);
    let (status, out, err) = interrupt_after_first_line(c, libc::SIGINT);
    assert!(!status.success());
    assert!(
        out.contains("(interrupted: ") && out.contains(" of 1000000 seeds ran)"),
        "{out}"
    );
    assert!(err.contains("interrupted after "), "{err}");
}

#[test]
fn sigterm_flushes_and_closes_the_pcap() {
    let pcap = std::env::temp_dir().join(format!("softroce-{}-sig.pcap", std::process::id()));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port()
        .to_string();
    let mut c = softroce();
    // A pingpong server waits for its client forever: the signal ends it.
    c.args([
        "pingpong",
        "--rc",
        "--ip",
        "127.0.89.65",
        "-p",
        &port,
        "--pcap",
    ])
    .arg(&pcap);
    let (status, _, err) = interrupt_after_first_line(c, libc::SIGTERM);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status:?} {err}");
    assert!(err.contains("[pcap] 0 packets written to"), "{err}");
    // The file is a whole pcap (its header was written and flushed).
    let o = softroce().arg("decode").arg(&pcap).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(status.signal().is_none());
    let _ = std::fs::remove_file(&pcap);
}
