//! Unmodified perftest and rdma-core tools between two processes on loopback through
//! `softroce exec` (softroce's libibverbs.so.1): perftest's default path (the extended QP and
//! its `ibv_wr_*` builder) and its old one (`--use_old_post_send`), RC/UD, the pingpongs with
//! completion channels (`-e`) and UC. A representative subset with few iterations, so that it
//! runs in seconds; docs/performance.md and the README list the rest, checked by hand.
//! Skipped, saying why, only when a tool is not installed. Every program is killed after a
//! deadline. Addresses 127.0.115.30–.59 and 127.0.190.60–.61 (one pair per test, so tests
//! run in parallel). Every `$SOFTROCE_BUSY_POLL` value (unset, 0, 1, always, adaptive, garbage, empty)
//! runs ibv_rc_pingpong -c and ib_write_bw.

mod exec_support;
use exec_support::*;
use std::time::{Duration, Instant};

/// A free TCP port on loopback for the tools' out-of-band exchange.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `args` as a server on `server_ip` and as a client on `client_ip` (connecting over TCP
/// to 127.0.0.1 with `port_flag` + a free port), both under a deadline; returns the client's
/// and the server's stdout after checking that both succeeded.
fn pair(server_ip: &str, client_ip: &str, port_flag: &str, args: &[&str]) -> (String, String) {
    pair_env(server_ip, client_ip, port_flag, args, None)
}

/// [`pair`] with `$SOFTROCE_BUSY_POLL` set to `busy_poll` in both programs (`None`: unset).
fn pair_env(
    server_ip: &str,
    client_ip: &str,
    port_flag: &str,
    args: &[&str],
    busy_poll: Option<&str>,
) -> (String, String) {
    let with_env = |mut c: std::process::Command| {
        match busy_poll {
            Some(v) => c.env("SOFTROCE_BUSY_POLL", v),
            None => c.env_remove("SOFTROCE_BUSY_POLL"),
        };
        c
    };
    let tool = args[0];
    if !have(tool) {
        println!("SKIPPED: {tool} not installed (apt-get install perftest ibverbs-utils)");
        return (String::new(), String::new());
    }
    let port = free_port().to_string();
    let mut common = args.to_vec();
    common.extend([port_flag, &port]);
    let mut server = Some(with_env(exec(server_ip, &common)).spawn().unwrap());
    // The server listens on TCP once its device is up, and the clients do not retry: wait
    // for the listening socket (a fixed 700 ms once was too short at the start of a soak
    // run: the client gave up and the server waited for it until the 40 s limit).
    wait_tcp_listen(port.parse().unwrap(), &mut server);
    let server = server.take().unwrap();
    let mut client_args = common.clone();
    client_args.push("127.0.0.1");
    let client = with_env(exec(client_ip, &client_args)).spawn().unwrap();
    let c = wait(client, Duration::from_secs(40), &format!("{tool} client"));
    let s = wait(server, Duration::from_secs(40), &format!("{tool} server"));
    let mut texts = Vec::new();
    for (who, out) in [("client", &c), ("server", &s)] {
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{args:?} {who} failed ({}):\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        texts.push(text);
    }
    let s = texts.pop().unwrap();
    (texts.pop().unwrap(), s)
}

/// The result line of a perftest run: the line after the header that starts with `#bytes`.
fn result_line(text: &str) -> &str {
    let mut lines = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("#bytes"));
    lines.next();
    lines.next().unwrap_or("")
}

/// perftest's result line names the message size and iterations.
fn check_perftest(text: &str, size: &str, iters: &str, what: &str) {
    let line = result_line(text);
    let w: Vec<&str> = line.split_whitespace().collect();
    assert!(
        w.len() >= 3 && w[0] == size && w[1] == iters,
        "{what}: no result for {size} bytes x {iters}:\n{text}"
    );
}

#[test]
fn ib_write_bw_default_path_extended_qp() {
    let (c, _) = pair(
        "127.0.115.31",
        "127.0.115.32",
        "-p",
        &["ib_write_bw", "-x", "1", "-n", "200", "-s", "65536"],
    );
    if !c.is_empty() {
        check_perftest(&c, "65536", "200", "ib_write_bw");
    }
}

#[test]
fn ib_read_lat_and_send_lat_default_path() {
    let (c, _) = pair(
        "127.0.115.33",
        "127.0.115.34",
        "-p",
        &["ib_read_lat", "-x", "1", "-n", "200"],
    );
    if !c.is_empty() {
        check_perftest(&c, "2", "200", "ib_read_lat");
    }
    let (c, s) = pair(
        "127.0.115.33",
        "127.0.115.34",
        "-p",
        &["ib_send_lat", "-x", "1", "-n", "200", "-s", "64"],
    );
    if !c.is_empty() {
        check_perftest(&c, "64", "200", "ib_send_lat client");
        check_perftest(&s, "64", "200", "ib_send_lat server");
    }
}

#[test]
fn ib_send_bw_ud_and_atomic_bw_old_post_send() {
    let (c, _) = pair(
        "127.0.115.35",
        "127.0.115.36",
        "-p",
        &[
            "ib_send_bw",
            "-x",
            "1",
            "-c",
            "UD",
            "-n",
            "200",
            "-s",
            "1024",
        ],
    );
    if !c.is_empty() {
        check_perftest(&c, "1024", "200", "ib_send_bw -c UD");
    }
    let (c, _) = pair(
        "127.0.115.35",
        "127.0.115.36",
        "-p",
        &[
            "ib_atomic_bw",
            "-x",
            "1",
            "-n",
            "200",
            "--use_old_post_send",
        ],
    );
    if !c.is_empty() {
        check_perftest(&c, "8", "200", "ib_atomic_bw --use_old_post_send");
    }
}

#[test]
fn ib_write_lat_four_qps_bw() {
    let (c, _) = pair(
        "127.0.115.37",
        "127.0.115.38",
        "-p",
        &["ib_write_lat", "-x", "1", "-n", "200", "-s", "64"],
    );
    if !c.is_empty() {
        check_perftest(&c, "64", "200", "ib_write_lat");
    }
    let (c, _) = pair(
        "127.0.115.37",
        "127.0.115.38",
        "-p",
        &[
            "ib_read_bw",
            "-x",
            "1",
            "-q",
            "4",
            "-n",
            "100",
            "-s",
            "4096",
        ],
    );
    if !c.is_empty() {
        // perftest counts the iterations of all QPs.
        check_perftest(&c, "4096", "400", "ib_read_bw -q 4");
    }
}

#[test]
fn pingpongs_with_completion_channels_and_uc() {
    for (tool, ip) in [
        ("ibv_rc_pingpong", ["127.0.115.41", "127.0.115.42"]),
        ("ibv_uc_pingpong", ["127.0.115.43", "127.0.115.44"]),
        ("ibv_ud_pingpong", ["127.0.115.45", "127.0.115.46"]),
    ] {
        for events in [false, true] {
            let mut args = vec![tool, "-g", "1", "-n", "50"];
            if events {
                args.push("-e");
            }
            if tool != "ibv_ud_pingpong" {
                args.extend(["-s", "4096", "-m", "1024", "-c"]);
            }
            let (c, s) = pair(ip[0], ip[1], "-p", &args);
            for text in [c, s].iter().filter(|t| !t.is_empty()) {
                assert!(text.contains("50 iters in"), "{args:?}:\n{text}");
            }
        }
    }
}

// Every value of $SOFTROCE_BUSY_POLL drives the library correctly: unset, 1, always and
// anything unknown (busy polling), adaptive, 0 (never). ibv_rc_pingpong checks its data
// (-c); ib_write_bw runs its iterations. Addresses 127.0.190.60-.61.
#[test]
fn every_busy_poll_value_runs_rc_pingpong_and_ib_write_bw() {
    for v in [
        None,
        Some("0"),
        Some("1"),
        Some("always"),
        Some("adaptive"),
        Some("garbage"),
        Some(""),
    ] {
        let args = [
            "ibv_rc_pingpong",
            "-g",
            "1",
            "-n",
            "100",
            "-s",
            "4096",
            "-c",
        ];
        let (c, s) = pair_env("127.0.190.60", "127.0.190.61", "-p", &args, v);
        for text in [c, s].iter().filter(|t| !t.is_empty()) {
            assert!(text.contains("100 iters in"), "BUSY_POLL {v:?}:\n{text}");
        }
        let args = ["ib_write_bw", "-x", "1", "-s", "65536", "-n", "200"];
        let (c, _) = pair_env("127.0.190.60", "127.0.190.61", "-p", &args, v);
        if !c.is_empty() {
            check_perftest(&c, "65536", "200", &format!("ib_write_bw BUSY_POLL {v:?}"));
        }
    }
}

#[test]
fn ibv_asyncwatch_sees_port_active() {
    if !have("ibv_asyncwatch") {
        println!("SKIPPED: ibv_asyncwatch not installed (apt-get install ibverbs-utils)");
        return;
    }
    // It watches until killed: give it a moment, then kill it and read what it printed.
    let mut child = exec("127.0.115.47", &["ibv_asyncwatch", "-d", "softroce0"])
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("event_type IBV_EVENT_PORT_ACTIVE (9), port 1"),
        "ibv_asyncwatch:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
