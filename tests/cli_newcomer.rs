//! What a newcomer hit (issue 17 items 4, 6, 7, 10), each as they typed it: `-g 0` from a
//! Soft-RoCE tutorial, `-e` on the rc/uc/ud pingpongs, perftest options, limits in errors.
//! Addresses: 127.0.91.0/24, which no other test uses (tests/cli_devinfo.rs takes .1-.19).

use std::time::Duration;

mod proc;

use proc::{finish, free_port, read_until_line, spawn, text};

/// Runs softroce with `args` alone; (success, stdout + stderr). A hang fails the test.
fn alone(args: &[&str]) -> (bool, String) {
    let o = finish(spawn(args), Duration::from_secs(30));
    (o.status.success(), text(&o))
}

// Issue 17 item 4: GID 0 is the link-local GID, which the device does not send from; each side
// says so before any exchange, naming the index to use.
#[test]
fn gid_index_0_fails_on_both_sides_naming_g_1() {
    for t in ["--rc", "--uc", "--ud", "--srq"] {
        let (ok, out) = alone(&["pingpong", t, "-g", "0", "--ip", "127.0.91.20"]);
        assert!(!ok, "{t} server: {out}");
        assert!(out.contains("-g 0: GID[0] fe80::"), "{t} server: {out}");
        assert!(out.contains("use -g 1"), "{t} server: {out}");
        // The client fails the same way before it connects (nothing listens on .21).
        let (ok, out) = alone(&[
            "pingpong",
            t,
            "-g",
            "0",
            "--ip",
            "127.0.91.20",
            "127.0.91.21",
        ]);
        assert!(!ok, "{t} client: {out}");
        assert!(
            out.contains("use -g 1, the GID of the device address, ::ffff:127.0.91.20"),
            "{t} client: {out}"
        );
    }
    let (ok, out) = alone(&["perf", "write_bw", "-x", "0", "--ip", "127.0.91.20"]);
    assert!(!ok, "{out}");
    assert!(out.contains("use -x 1"), "{out}");
}

/// Server on `.{a}`, client on `.{a+1}` with `extra` options; both must succeed.
fn pingpong_pair(a: u8, extra: &[&str]) -> (String, String) {
    let (sip, cip) = (format!("127.0.91.{a}"), format!("127.0.91.{}", a + 1));
    let port = free_port(&sip).to_string();
    let common = [&["pingpong", "-p", &port, "-n", "50"][..], extra].concat();
    let mut server = spawn(&[&common[..], &["--ip", &sip]].concat());
    let head = read_until_line(&mut server, false, "local address", |l| {
        l.starts_with("  local address:")
    });
    let client = spawn(&[&common[..], &["--ip", &cip, &sip]].concat());
    let c = finish(client, Duration::from_secs(60));
    let s = finish(server, Duration::from_secs(60));
    let (cs, ss) = (text(&c), format!("{head}{}", text(&s)));
    assert!(c.status.success(), "{extra:?} client:\n{cs}\nserver:\n{ss}");
    assert!(s.status.success(), "{extra:?} server:\n{ss}\nclient:\n{cs}");
    (cs, ss)
}

// Issue 17 item 6: rdma-core's rc, uc and ud pingpongs all take -e (CQ events).
#[test]
fn pingpong_e_sleeps_on_cq_events_for_rc_uc_ud() {
    for (a, t) in [(30, "--rc"), (32, "--uc"), (34, "--ud")] {
        let (c, s) = pingpong_pair(a, &[t, "-e", "-s", "1024"]);
        for out in [c, s] {
            assert!(out.contains("102400 bytes in "), "{t}: {out}");
            assert!(out.contains("50 iters in "), "{t}: {out}");
        }
    }
}

// Issue 17 item 7: an out-of-range value is refused naming the limit, and a post on an
// unconnected QP names its state.
#[test]
fn limits_and_states_are_named_in_errors() {
    let (ok, out) = alone(&[
        "pingpong",
        "--rc",
        "-s",
        "3000000000",
        "--ip",
        "127.0.91.40",
    ]);
    assert!(!ok);
    assert!(
        out.contains("-s 3000000000: message size out of range: at most 1073741824"),
        "{out}"
    );
    let (ok, out) = alone(&["pingpong", "--rc", "-r", "100000", "--ip", "127.0.91.40"]);
    assert!(!ok);
    assert!(
        out.contains("max_recv_wr 100000 out of range")
            && out.contains("(each 0..=16384, max_qp_wr)"),
        "{out}"
    );
}

#[test]
fn target_post_send_before_connect_names_reset() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(proc::BIN)
        .args(["target", "--ip", "127.0.91.41"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    let mut stdin = child.stdin.take().expect("piped stdin");
    writeln!(
        stdin,
        r#"{{"post_send": {{"opcode": "send", "length": 8}}}}"#
    )
    .expect("writes");
    // End of input ends the target.
    drop(stdin);
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("waits").is_none() {
        if std::time::Instant::now() > until {
            let _ = child.kill();
            panic!("target still runs after 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = text(&child.wait_with_output().expect("output"));
    assert!(
        out.contains("post_send: the QP is in RESET; posting needs RTS (connect the QP first)"),
        "{out}"
    );
}

// Issue 17 item 6, perf half: perftest's -R, -b, -e and -c UC|UD are refused by name (not
// supported yet), and -c RC, the default, is accepted. Item 10: `perf` alone lists the tests.
#[test]
fn perf_names_the_perftest_options_it_lacks_and_lists_its_tests() {
    for (args, want) in [
        (&["-R"][..], "-R: rdma_cm support is not there yet"),
        (&["-b"], "-b: bidirectional tests are not supported yet"),
        (
            &["-e"],
            "-e: CQ events are not supported by softroce perf yet",
        ),
        (&["-c", "UD"], "-c UD: only RC connections are supported"),
        (&["-c", "UC"], "-c UC: only RC connections are supported"),
    ] {
        let (ok, out) = alone(&[&["perf", "send_bw", "--ip", "127.0.91.50"][..], args].concat());
        assert!(!ok, "{args:?}: {out}");
        assert!(out.contains(want), "{args:?}: {out}");
    }
    // -c RC passes the option check and fails only for want of a peer (nothing listens).
    let port = free_port("127.0.91.50").to_string();
    let (ok, out) = alone(&[
        "perf",
        "write_bw",
        "-c",
        "RC",
        "--ip",
        "127.0.91.50",
        "-p",
        &port,
        "127.0.91.51",
    ]);
    assert!(!ok);
    assert!(!out.contains("-c RC"), "{out}");
    let (ok, out) = alone(&["perf"]);
    assert!(!ok);
    assert!(
        out.contains("[possible values: write_bw, read_bw, send_bw, atomic_bw, write_lat"),
        "{out}"
    );
}

// Issue 25 item 7: the demo's server names its client by the client's device address (the
// GID the client sent), not by the TCP source address of the exchange.
#[test]
fn demo_names_the_client_by_its_device_address() {
    let (ok, out) = alone(&[
        "demo",
        "--server-ip",
        "127.0.91.40",
        "--client-ip",
        "127.0.91.41",
    ]);
    assert!(ok, "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("[server] client device 127.0.91.41: QPN ")),
        "{out}"
    );
}

// Issue 22 item 6: the GID-index message is one sentence, without the runs of spaces a
// string continued without a backslash left in it.
#[test]
fn the_gid_index_message_has_no_runs_of_spaces() {
    let (ok, out) = alone(&["pingpong", "--rc", "-g", "0", "--ip", "127.0.91.42"]);
    assert!(!ok, "{out}");
    let line = out
        .lines()
        .find(|l| l.contains("-g 0: GID[0]"))
        .unwrap_or_else(|| panic!("no GID message: {out}"));
    assert!(!line.contains("  "), "{line}");
}
