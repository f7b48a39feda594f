//! `softroce pingpong --rc/--uc/--ud/--srq` against itself, as two processes over UDP on loopback,
//! and against a hand-written peer that speaks rc_pingpong's TCP exchange byte for byte.
//!
//! Each test uses its own 127.0.6x.y addresses (Linux routes all of 127/8 to loopback) and a
//! free TCP port, so the tests can run in parallel with each other and with the other suites.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

mod proc;

use proc::{Proc, counter, finish, free_port, read_until_line, spawn, text};

/// Reads the server's stdout until a line starts with `prefix`; returns what was read.
fn wait_for_line(server: &mut Proc, prefix: &str) -> String {
    read_until_line(server, false, prefix, |l| l.starts_with(prefix))
}

/// `(qpn, psn)` from a "  local address: ..." or "  remote address: ..." line.
fn address(stdout: &str, which: &str) -> (String, String) {
    let l = stdout
        .lines()
        .find(|l| l.trim_start().starts_with(which))
        .unwrap_or_else(|| panic!("no {which} line in {stdout}"));
    let field = |name: &str| {
        l.split(", ")
            .find_map(|f| f.trim().strip_prefix(name))
            .unwrap_or_else(|| panic!("{name} missing in {l}"))
            .to_string()
    };
    (field("QPN "), field("PSN "))
}

/// Starts the server with `common` options on `sip`, waits for its first local address
/// line, runs the client on `cip` against it, and returns both outputs (client, server)
/// once both succeeded.
fn server_then_client(common: &[&str], sip: &str, cip: &str) -> (String, String) {
    let mut server = spawn(&[common, &["--ip", sip]].concat());
    let head = wait_for_line(&mut server, "  local address:");
    let client = spawn(&[common, &["--ip", cip, sip]].concat());
    let c = finish(client, Duration::from_secs(60));
    let s = finish(server, Duration::from_secs(60));
    let (cs, ss) = (text(&c), format!("{head}{}", text(&s)));
    assert!(c.status.success(), "client failed:\n{cs}\nserver:\n{ss}");
    assert!(s.status.success(), "server failed:\n{ss}\nclient:\n{cs}");
    (cs, ss)
}

/// The two result lines of `ibv_*_pingpong`: `B bytes in S seconds = R Mbit/sec` and
/// `N iters in S seconds = T usec/iter`.
fn assert_result_lines(out: &str, bytes: u64, iters: u32) {
    assert!(
        out.lines()
            .any(|l| l.starts_with(&format!("{bytes} bytes in ")) && l.ends_with(" Mbit/sec")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with(&format!("{iters} iters in ")) && l.ends_with(" usec/iter")),
        "{out}"
    );
}

fn run_pair(net: u8, transport: &str, size: u32, iters: u32, mtu: u32) {
    let (sip, cip) = (format!("127.0.{net}.1"), format!("127.0.{net}.2"));
    let port = free_port(&sip).to_string();
    let (size_s, iters_s, mtu_s) = (size.to_string(), iters.to_string(), mtu.to_string());
    let common = [
        "pingpong",
        transport,
        "-p",
        &port,
        "-s",
        &size_s,
        "-n",
        &iters_s,
        "-m",
        &mtu_s,
        "-g",
        "1",
        "-c",
        "--counters",
    ];
    let (cs, ss) = server_then_client(&common, &sip, &cip);

    let bytes = u64::from(size) * u64::from(iters) * 2;
    for out in [&cs, &ss] {
        // rc_pingpong's two result lines.
        assert_result_lines(out, bytes, iters);
        assert!(
            out.contains(&format!(
                "data: {iters} received messages of {size} bytes checked"
            )),
            "{out}"
        );
        assert!(!out.contains("invalid data"), "{out}");
        assert_eq!(counter(out, "icrc_errors"), 0, "{out}");
    }
    // Each side's remote address is the other's local address.
    assert_eq!(
        address(&cs, "remote address:"),
        address(&ss, "local address:")
    );
    assert_eq!(
        address(&ss, "remote address:"),
        address(&cs, "local address:")
    );
    // Loopback loses nothing: every packet one side sent, the other accepted.
    assert_eq!(counter(&cs, "sent_pkts"), counter(&ss, "rcvd_pkts"));
    assert_eq!(counter(&ss, "sent_pkts"), counter(&cs, "rcvd_pkts"));
    // One packet per MTU (at least one) per message, plus, on RC, one ACK per message.
    let per_msg = u64::from(size.div_ceil(mtu).max(1));
    let acks = u64::from(transport == "--rc");
    // Beyond that only what a retransmission explains: on a loaded machine an ACK timer may
    // expire, and then the peer counts the repeats as duplicate (or out-of-sequence)
    // requests and this side re-acknowledges the duplicates it got.
    let expected = u64::from(iters) * (per_msg + acks);
    let repeats =
        |out: &str| counter(out, "duplicate_request") + counter(out, "out_of_seq_request");
    let sent = counter(&cs, "sent_pkts");
    assert!(
        sent >= expected && sent <= expected + repeats(&ss) + repeats(&cs),
        "sent {sent}, expected {expected}:\n{cs}\nserver:\n{ss}"
    );
}

#[test]
fn rc_pingpong_64_bytes() {
    run_pair(60, "--rc", 64, 200, 1024);
}

#[test]
fn rc_pingpong_4096_bytes_four_packets_per_message() {
    run_pair(61, "--rc", 4096, 200, 1024);
}

#[test]
fn rc_pingpong_odd_size_with_padding_at_mtu_256() {
    run_pair(62, "--rc", 1001, 50, 256);
}

#[test]
fn uc_pingpong_4096_bytes_no_acks() {
    run_pair(66, "--uc", 4096, 200, 1024);
}

#[test]
fn ud_pingpong_odd_size() {
    // One packet per message whatever -m says: UD messages fit the port MTU.
    run_pair(67, "--ud", 1001, 200, 4096);
}

/// The server answers a peer that speaks rc_pingpong's exchange: a 52-byte
/// `"%04x:%06x:%06x:<32 hex>"` + NUL message each way, then `"done"` + NUL from the client.
#[test]
fn server_speaks_rc_pingpong_exchange() {
    let ip = "127.0.63.1";
    let port = free_port(ip);
    let mut server = spawn(&[
        "pingpong",
        "--rc",
        "--ip",
        ip,
        "-p",
        &port.to_string(),
        "-n",
        "1",
    ]);
    wait_for_line(&mut server, "  local address:");
    let mut tcp = TcpStream::connect((ip, port)).expect("connect");
    // A client at ::ffff:127.0.63.2 with QPN 0x123, PSN 0xabcdef.
    let msg = b"0000:000123:abcdef:00000000000000000000ffff7f003f02\0";
    assert_eq!(msg.len(), 52);
    tcp.write_all(msg).expect("send our address");
    let mut reply = [0u8; 52];
    tcp.read_exact(&mut reply)
        .expect("read the server's address");
    assert_eq!(reply[51], 0, "NUL-terminated");
    let text = std::str::from_utf8(&reply[..51]).expect("text");
    let fields: Vec<&str> = text.split(':').collect();
    assert_eq!(fields.len(), 4, "{text}");
    for (f, n) in fields.iter().zip([4, 6, 6, 32]) {
        assert_eq!(f.len(), n, "{text}");
        assert!(f.chars().all(|c| c.is_ascii_hexdigit()), "{text}");
    }
    assert_eq!(
        fields[3], "00000000000000000000ffff7f003f01",
        "GID ::ffff:{ip}"
    );
    tcp.write_all(b"done\0").expect("done");
    drop(tcp);
    // No RoCE peer exists at 127.0.63.2: the server's QP is connected but nothing arrives.
    // It must still have accepted the exchange (the remote line shows our QPN and PSN).
    let head = wait_for_line(&mut server, "  remote address:");
    assert!(
        head.contains(
            "  remote address: LID 0x0000, QPN 0x000123, PSN 0xabcdef, GID ::ffff:127.0.63.2"
        ),
        "{head}"
    );
    drop(server);
}

/// A peer without a GID (rc_pingpong run without -g) cannot be reached over RoCE.
#[test]
fn peer_without_gid_is_refused() {
    let ip = "127.0.64.1";
    let port = free_port(ip);
    let mut server = spawn(&["pingpong", "--rc", "--ip", ip, "-p", &port.to_string()]);
    wait_for_line(&mut server, "  local address:");
    let mut tcp = TcpStream::connect((ip, port)).expect("connect");
    tcp.write_all(b"0000:000123:abcdef:00000000000000000000000000000000\0")
        .expect("send");
    let s = finish(server, Duration::from_secs(20));
    assert!(!s.status.success());
    assert!(text(&s).contains("RoCE needs a GID"), "{}", text(&s));
}

/// `--srq` (ibv_srq_pingpong) between two softroce processes: `qps` RC QPs on one SRQ each.
fn run_srq_pair(net: u8, qps: u32, size: u32, iters: u32, extra: &[&str]) {
    let (sip, cip) = (format!("127.0.{net}.1"), format!("127.0.{net}.2"));
    let port = free_port(&sip).to_string();
    let (qps_s, size_s, iters_s) = (qps.to_string(), size.to_string(), iters.to_string());
    let common = [
        &[
            "pingpong",
            "--srq",
            "-p",
            &port,
            "-q",
            &qps_s,
            "-s",
            &size_s,
            "-n",
            &iters_s,
            "-r",
            "64",
            "-g",
            "1",
            "--counters",
        ][..],
        extra,
    ]
    .concat();
    let (cs, ss) = server_then_client(&common, &sip, &cip);
    let bytes = u64::from(size) * u64::from(iters) * 2;
    for out in [&cs, &ss] {
        // srq_pingpong's two result lines.
        assert_result_lines(out, bytes, iters);
        // srq_pingpong counts SENDs over all QPs and may post up to one more per QP.
        let line = out
            .lines()
            .find(|l| l.starts_with("data: "))
            .unwrap_or_else(|| panic!("no data line: {out}"));
        let received: u32 = line
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        assert!(
            (iters..iters + qps).contains(&received),
            "{received} received for {iters} iters: {out}"
        );
        assert!(
            line.contains(&format!("on {qps} QPs and one SRQ checked")),
            "{out}"
        );
        assert_eq!(counter(out, "icrc_errors"), 0, "{out}");
        // The peer may post a few more SENDs after this side has stopped counting; they
        // still land in the SRQ.
        assert!(counter(out, "rdma_recvs") >= u64::from(received), "{out}");
        // "sends: posted=N": every SEND completed was posted, and at most one per QP more
        // than -n were.
        let posted: u64 = out
            .lines()
            .find_map(|l| l.strip_prefix("sends: posted="))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no sends line: {out}"));
        assert!(
            (counter(out, "rdma_sends")..u64::from(iters + qps)).contains(&posted),
            "{posted} SENDs posted for {iters} iters: {out}"
        );
        assert_eq!(
            out.lines()
                .filter(|l| l.starts_with("  local address:"))
                .count(),
            qps as usize,
            "one local address line per QP: {out}"
        );
    }
    // QP i of one side is connected to QP i of the other.
    let lines = |out: &str, which: &str| -> Vec<String> {
        out.lines()
            .filter_map(|l| l.trim_start().strip_prefix(which))
            .map(|l| l.trim().to_string())
            .collect()
    };
    assert_eq!(lines(&cs, "remote address:"), lines(&ss, "local address:"));
    assert_eq!(lines(&ss, "remote address:"), lines(&cs, "local address:"));
    // Every packet one side sent, the other accepted; every SEND acknowledged was received.
    assert_eq!(counter(&cs, "sent_pkts"), counter(&ss, "rcvd_pkts"));
    assert_eq!(counter(&ss, "sent_pkts"), counter(&cs, "rcvd_pkts"));
    assert_eq!(counter(&cs, "rdma_sends"), counter(&ss, "rdma_recvs"));
    assert_eq!(counter(&ss, "rdma_sends"), counter(&cs, "rdma_recvs"));
}

#[test]
fn srq_pingpong_16_qps_on_one_srq() {
    run_srq_pair(69, 16, 1000, 300, &[]);
}

#[test]
fn srq_pingpong_with_completion_events() {
    run_srq_pair(70, 4, 8192, 200, &["-e", "-c"]);
}

/// The server answers a peer that speaks srq_pingpong's exchange: 256 messages of 52 bytes
/// each way (entries past the QPs in use are zeros), then `"done"` + NUL from the client.
#[test]
fn server_speaks_srq_pingpong_exchange() {
    let ip = "127.0.71.1";
    let port = free_port(ip);
    let mut server = spawn(&[
        "pingpong",
        "--srq",
        "-q",
        "2",
        "--ip",
        ip,
        "-p",
        &port.to_string(),
        "-n",
        "1",
    ]);
    wait_for_line(&mut server, "  local address:");
    let mut tcp = TcpStream::connect((ip, port)).expect("connect");
    let mut ours = Vec::new();
    ours.extend_from_slice(b"0000:000123:abcdef:00000000000000000000ffff7f004702\0");
    ours.extend_from_slice(b"0000:000124:123456:00000000000000000000ffff7f004702\0");
    for _ in 2..256 {
        ours.extend_from_slice(b"0000:000000:000000:00000000000000000000000000000000\0");
    }
    tcp.write_all(&ours).expect("send our addresses");
    let mut reply = vec![0u8; 256 * 52];
    tcp.read_exact(&mut reply)
        .expect("read the server's 256 addresses");
    for (i, m) in reply.chunks(52).enumerate() {
        assert_eq!(m[51], 0, "NUL-terminated");
        let text = std::str::from_utf8(&m[..51]).expect("text");
        if i < 2 {
            // LID 0000, then a QPN (of the process's slot: its top 8 bits may be set).
            assert!(
                text.starts_with("0000:") && text.ends_with(":00000000000000000000ffff7f004701"),
                "{text}"
            );
        } else {
            assert_eq!(text, "0000:000000:000000:00000000000000000000000000000000");
        }
    }
    tcp.write_all(b"done\0").expect("done");
    drop(tcp);
    let head = wait_for_line(&mut server, "  remote address: LID 0x0000, QPN 0x000124");
    assert!(
        head.contains(
            "  remote address: LID 0x0000, QPN 0x000123, PSN 0xabcdef, GID ::ffff:127.0.71.2"
        ),
        "{head}"
    );
    drop(server);
}

#[test]
fn num_qp_needs_srq() {
    let o = finish(
        spawn(&["pingpong", "--rc", "-q", "4", "--ip", "127.0.72.1"]),
        Duration::from_secs(20),
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).contains("-q is an ibv_srq_pingpong option: use it with --srq"),
        "{}",
        text(&o)
    );
}

#[test]
fn ud_message_larger_than_the_port_mtu_is_refused() {
    let o = finish(
        spawn(&["pingpong", "--ud", "--ip", "127.0.68.1", "-s", "8192"]),
        Duration::from_secs(20),
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).contains("Requested size larger than port MTU (4096)"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_transport_must_be_chosen() {
    let o = finish(spawn(&["pingpong"]), Duration::from_secs(20));
    assert_eq!(o.status.code(), Some(2), "clap usage error");
    assert!(text(&o).contains("--rc"), "{}", text(&o));
}

#[test]
fn bad_mtu_is_refused() {
    let o = finish(
        spawn(&["pingpong", "--rc", "--ip", "127.0.65.1", "-m", "1500"]),
        Duration::from_secs(20),
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("MTU 1500"), "{}", text(&o));
}
