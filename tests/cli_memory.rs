//! A large pingpong message costs its MR and one copy (issue 17 item 10: a 100 MB message
//! peaked at about 5× its size in RSS, a new buffer per message received). Both sides' peak
//! RSS (`ru_maxrss` from wait4) must stay under 3.5× the message size plus 16 MiB. Addresses 127.0.89.96/.97.

use std::process::{Child, Command, Stdio};

const SIZE: usize = 32 << 20;

fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_softroce"))
        .args(args)
        .env_remove("SOFTROCE_IP")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs")
}

/// Waits for `child`; returns (exited 0, peak RSS in bytes).
fn wait_rss(child: &Child) -> (bool, u64) {
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 on our own child; `status` and `usage` are valid for writes.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32);
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    (ok, usage.ru_maxrss as u64 * 1024)
}

#[test]
// Every child is reaped, by wait4 in `wait_rss` (which also gives its rusage), which clippy
// cannot see.
#[allow(clippy::zombie_processes)]
fn a_large_message_costs_its_mr_and_one_copy() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port()
        .to_string();
    let size = SIZE.to_string();
    let common = ["-p", port.as_str(), "-s", size.as_str(), "-n", "3"];
    let mut s_args = vec!["pingpong", "--rc", "--ip", "127.0.89.96"];
    s_args.extend(common);
    let server = spawn(&s_args);
    // The client retries until the server listens (the exchange refuses a closed port).
    let mut c_args = vec!["pingpong", "--rc", "--ip", "127.0.89.97"];
    c_args.extend(common);
    c_args.push("127.0.89.96");
    let mut client_rss = None;
    for _ in 0..100 {
        let client = spawn(&c_args);
        let (ok, rss) = wait_rss(&client);
        if ok {
            client_rss = Some(rss);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let client_rss = client_rss.expect("the client ran");
    let (ok, server_rss) = wait_rss(&server);
    assert!(ok, "server failed");
    // The MR's send and receive halves, the session's reference copy, and 16 MiB for the
    // process itself (the old code's five copies would exceed it).
    let budget = 35 * SIZE as u64 / 10 + 16 * 1024 * 1024;
    for (side, rss) in [("client", client_rss), ("server", server_rss)] {
        assert!(
            rss < budget,
            "{side} peaked at {} MiB for a {} MiB message (budget {} MiB)",
            rss >> 20,
            SIZE >> 20,
            budget >> 20
        );
    }
}
