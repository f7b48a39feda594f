//! What a newcomer met when the two sides of a pingpong or perf run did not match (issue 17,
//! items 1 and 2): one side waited forever and printed nothing, or printed Rust's "failed to
//! fill whole buffer". Now the TCP exchange has a deadline and names the likely cause, a peer
//! that closes the connection is called that, and a run in which completions stop coming says
//! which device counters moved. Addresses: 127.0.89.0/24, which no other test uses.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_softroce"))
        .args(args)
        .env_remove("SOFTROCE_IP")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs")
}

/// Waits for `child` to exit (at most `limit`; a hang fails the test); returns (success,
/// stderr).
fn finish(mut child: Child, limit: Duration) -> (bool, String) {
    let until = Instant::now() + limit;
    while child.try_wait().expect("waits").is_none() {
        if Instant::now() > until {
            let _ = child.kill();
            panic!("still runs after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = child.wait_with_output().expect("output");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A TCP port nobody listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

#[test]
fn a_client_pointed_at_a_silent_port_names_the_cause() {
    // Some other program holds the port: it accepts and never answers.
    let other = TcpListener::bind("127.0.89.1:0").unwrap();
    let port = other.local_addr().unwrap().port().to_string();
    let child = spawn(&[
        "pingpong",
        "--rc",
        "--ip",
        "127.0.89.2",
        "-p",
        &port,
        "127.0.89.1",
    ]);
    let (ok, err) = finish(child, Duration::from_secs(40));
    assert!(!ok);
    assert!(
        err.contains(&format!("no answer from 127.0.89.1:{port} in 10 s"))
            && err.contains("same test listening there?"),
        "{err}"
    );
    drop(other);
}

#[test]
fn a_peer_that_closes_the_exchange_is_named() {
    let other = TcpListener::bind("127.0.89.3:0").unwrap();
    let port = other.local_addr().unwrap().port().to_string();
    let closer = std::thread::spawn(move || {
        // Accept, read nothing, close: what a peer that failed does.
        let (tcp, _) = other.accept().unwrap();
        drop(tcp);
    });
    let child = spawn(&[
        "perf",
        "write_bw",
        "--ip",
        "127.0.89.4",
        "-p",
        &port,
        "127.0.89.3",
    ]);
    let (ok, err) = finish(child, Duration::from_secs(40));
    closer.join().unwrap();
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "127.0.89.3:{port} closed the connection before sending its"
        )) && !err.contains("failed to fill whole buffer"),
        "{err}"
    );
}

#[test]
fn a_mode_mismatch_says_which_counters_moved() {
    let port = free_port().to_string();
    let mut server = spawn(&[
        "pingpong",
        "--rc",
        "--ip",
        "127.0.89.5",
        "-p",
        &port,
        "-n",
        "5",
    ]);
    // The server prints its address line once it listens.
    let mut out = BufReader::new(server.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.contains("local address"), "{line}");
    let client = spawn(&[
        "pingpong",
        "--ud",
        "--ip",
        "127.0.89.6",
        "-p",
        &port,
        "-n",
        "5",
        "127.0.89.5",
    ]);
    // The RC server drops the client's UD SENDs (wrong_qp_type); after 5 s it says so.
    let mut err = BufReader::new(server.stderr.take().unwrap());
    let until = Instant::now() + Duration::from_secs(25);
    let mut seen = String::new();
    while Instant::now() < until {
        let mut l = String::new();
        if err.read_line(&mut l).unwrap_or(0) == 0 {
            break;
        }
        seen.push_str(&l);
        if l.contains("no completion for") {
            break;
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    let mut client = client;
    let _ = client.kill();
    let _ = client.wait();
    assert!(
        seen.contains("no completion for 5 s (0 of 5 messages received")
            && seen.contains("wrong_qp_type +")
            && seen.contains("same mode (--rc, --uc, --ud, --srq)"),
        "{seen}"
    );
}
