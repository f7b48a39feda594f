//! How the command line fails: a reader that closes stdout early, and the two-device
//! subcommands (`demo`, `perf --loopback`) when an address is taken or unusable. Each must
//! exit non-zero at once with the cause in one line on stderr, never hang and never panic.
//! The taken addresses are held by a UDP socket of this test on port 4791 (127.0.87.0/24,
//! which no other test uses); nothing is sent.

use std::io::{BufRead, BufReader};
use std::net::UdpSocket;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs softroce with `args`; kills it after 30 s (a hang fails the test). Returns
/// (success, stderr).
fn softroce(args: &[&str]) -> (bool, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_softroce"))
        .args(args)
        .env_remove("SOFTROCE_IP")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    let until = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("waits").is_none() {
        if Instant::now() > until {
            let _ = child.kill();
            panic!("softroce {args:?} still runs after 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = child.wait_with_output().expect("output");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Holds UDP port 4791 on `ip`, as another device would.
fn hold(ip: &str) -> UdpSocket {
    UdpSocket::bind((ip, 4791)).expect("binds a free loopback address")
}

/// Runs softroce with `args` while another socket holds `held`:4791, and checks that it
/// fails naming `side` ("server" or "client") and the taken address.
fn fails_naming_the_taken_side(held: &str, side: &str, args: &[&str]) {
    let _held = hold(held);
    let (ok, err) = softroce(args);
    assert!(!ok, "{args:?}");
    assert!(
        err.contains(&format!("{side}: opening device")) && err.contains("Address already in use"),
        "{args:?}: {err}"
    );
}

#[test]
fn a_reader_that_goes_away_ends_the_process_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_softroce"))
        .args(["sim", "--seeds", "500", "--ops", "5"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("reads a line");
    assert!(first.starts_with("seed 1:"), "{first}");
    // The pipe's read end is closed here; the next write gets EPIPE.
    let o = child.wait_with_output().expect("output");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        o.status.signal(),
        Some(libc::SIGPIPE),
        "{:?}: {err}",
        o.status
    );
}

#[test]
fn demo_names_the_side_whose_address_is_taken() {
    let demo = |server: &'static str, client: &'static str| {
        ["demo", "--server-ip", server, "--client-ip", client]
    };
    fails_naming_the_taken_side("127.0.87.5", "server", &demo("127.0.87.5", "127.0.87.6"));
    fails_naming_the_taken_side("127.0.87.8", "client", &demo("127.0.87.7", "127.0.87.8"));
}

#[test]
fn demo_refuses_one_address_for_both_and_one_not_on_this_host() {
    let (ok, err) = softroce(&[
        "demo",
        "--server-ip",
        "127.0.87.9",
        "--client-ip",
        "127.0.87.9",
    ]);
    assert!(!ok);
    assert!(err.contains("need different addresses"), "{err}");
    // TEST-NET-1 (RFC 5737): on no host.
    let (ok, err) = softroce(&["demo", "--server-ip", "192.0.2.1"]);
    assert!(!ok);
    assert!(err.contains("that address is not on this host"), "{err}");
}

#[test]
fn perf_loopback_names_the_side_whose_address_is_taken() {
    let perf = |test: &'static str, server: &'static str, client: &'static str| {
        [
            "perf",
            test,
            "--loopback",
            "--ip",
            server,
            "--peer-ip",
            client,
            "-n",
            "5",
        ]
    };
    // The client's address taken: the server, already waiting for it, must not hang the run.
    fails_naming_the_taken_side(
        "127.0.87.2",
        "client",
        &perf("write_bw", "127.0.87.1", "127.0.87.2"),
    );
    // The server's address taken: its error, not the client's refused connection.
    fails_naming_the_taken_side(
        "127.0.87.3",
        "server",
        &perf("write_lat", "127.0.87.3", "127.0.87.4"),
    );
}
