//! `softroce target`, the scriptable responder, driven from outside as its users drive it.
//!
//! - `scripted_peer_checks_the_responder`: `tests/target_peer.py` (Python 3 standard library)
//!   starts the target, connects through the JSON protocol, sends hand-built RoCEv2 packets
//!   from its own UDP sockets on 127.0.42.2 and checks every answer byte by byte (BTH, AETH,
//!   AtomicAckETH, payload, pad, UDP source port, ICRC), plus the completion, event and reply
//!   lines. Skipped, with the reason printed, when `python3` is not installed.
//! - The other tests need no Python: the JSON command protocol, its errors, and exits.
//!
//! Addresses 127.0.42.x are this file's alone (other suites bind 127.0.0.1/2 and
//! 127.0.10.x–127.0.20.x), so it runs in parallel with them.

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_softroce");
/// Longest any one process may take before the test gives up on it.
const LIMIT: Duration = Duration::from_secs(30);

/// A child process that is killed if the test fails before it ends.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for `p` to exit; kills it and fails after [`LIMIT`].
fn wait_exit(p: &mut Proc) -> std::process::ExitStatus {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(s) = p.0.try_wait().expect("try_wait") {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "process did not exit in {LIMIT:?}"
        );
        std::thread::sleep(Duration::from_millis(10)); // polling interval, not an assertion
    }
}

#[test]
fn scripted_peer_checks_the_responder() {
    if Command::new("python3")
        .arg("--version")
        .output()
        .map_or(true, |o| !o.status.success())
    {
        eprintln!("skipping scripted_peer_checks_the_responder: python3 is not installed");
        return;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/target_peer.py");
    let mut p = Proc(
        Command::new("python3")
            .arg(script)
            .arg(BIN)
            .args(["127.0.42.2", "127.0.42.1", "127.0.42.3"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start python3"),
    );
    let status = wait_exit(&mut p);
    let mut out = String::new();
    let mut err = String::new();
    use std::io::Read;
    if let Some(o) = p.0.stdout.as_mut() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(e) = p.0.stderr.as_mut() {
        let _ = e.read_to_string(&mut err);
    }
    println!("{out}{err}");
    assert!(
        status.success(),
        "target_peer.py failed ({status}):\n{out}{err}"
    );
    assert!(out.contains("all checks passed"), "{out}");
}

/// A target process with line-wise access to its stdin and stdout.
struct Target {
    proc: Proc,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Target {
    fn start(args: &[&str]) -> Target {
        let mut child = Command::new(BIN)
            .arg("target")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start softroce target");
        let stdin = child.stdin.take();
        let stdout: ChildStdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Target {
            proc: Proc(child),
            stdin,
            lines,
        }
    }

    /// The next output line, parsed; it must be an object with exactly one key.
    fn line(&self) -> (String, Value) {
        let text = self
            .lines
            .recv_timeout(LIMIT)
            .expect("an output line from the target");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let obj = v
            .as_object()
            .unwrap_or_else(|| panic!("not an object: {text}"));
        assert_eq!(obj.len(), 1, "one key per line: {text}");
        let (k, body) = obj.iter().next().expect("one key");
        (k.clone(), body.clone())
    }

    fn send(&mut self, text: &str) -> (String, Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{text}").expect("write a command");
        stdin.flush().expect("flush");
        self.line()
    }
}

#[test]
fn commands_reply_and_errors_are_lines_not_panics() {
    let mut t = Target::start(&[
        "--ip",
        "127.0.42.5",
        "--mr-size",
        "64,128",
        "--psn",
        "0x123456",
        "--access",
        "local_write,remote_read",
    ]);
    let (kind, ready) = t.line();
    assert_eq!(kind, "ready");
    assert_eq!(ready["gid"], "::ffff:127.0.42.5");
    assert_eq!(ready["psn"], 0x12_3456);
    assert_eq!(ready["mrs"][0]["length"], 64);
    assert_eq!(ready["mrs"][1]["length"], 128);
    assert_eq!(
        ready["mrs"][1]["access"],
        serde_json::json!(["local_write", "remote_read"])
    );
    assert!(ready["mrs"][0]["rkey"].as_u64().is_some() && ready["mrs"][0]["va"].as_u64().is_some());

    let (kind, w) = t.send(r#"{"write_mr": {"index": 1, "offset": "0x7c", "hex": "c0ffee11"}}"#);
    assert_eq!(
        (kind.as_str(), &w["length"]),
        ("write_mr", &serde_json::json!(4))
    );
    let (_, d) = t.send(r#"{"dump_mr": {"index": 1, "offset": 120}}"#);
    assert_eq!(d["hex"], "00000000c0ffee11");
    let (_, f) = t.send(r#"{"write_mr": {"index": 0, "fill": 171, "length": 3}}"#);
    assert_eq!(f["length"], 3);
    let (_, d) = t.send(r#"{"dump_mr": {"index": 0, "length": 4}}"#);
    assert_eq!(d["hex"], "ababab00");

    // Each bad line gives one error line naming the command, and the target carries on.
    for (line, command) in [
        ("{", Value::Null),
        ("{}", Value::Null),
        (r#"{"a": {}, "b": {}}"#, Value::Null),
        (r#"{"dump_mr": 5}"#, "dump_mr".into()),
        (r#"{"dump_mr": {"index": 2}}"#, "dump_mr".into()),
        (
            r#"{"dump_mr": {"index": 1, "offset": 129}}"#,
            "dump_mr".into(),
        ),
        (r#"{"dump_mr": {"index": -1}}"#, "dump_mr".into()),
        (
            r#"{"write_mr": {"index": 1, "offset": 126, "hex": "00112233"}}"#,
            "write_mr".into(),
        ),
        (
            r#"{"write_mr": {"index": 1, "hex": "00", "fill": 1}}"#,
            "write_mr".into(),
        ),
        (r#"{"post_recv": {}}"#, "post_recv".into()),
        (
            r#"{"connect": {"dest_qpn": 16777216, "dest_gid": "::1"}}"#,
            "connect".into(),
        ),
        (r#"{"counters": {"x": 1}}"#, "counters".into()),
        (r#"{"launch": {}}"#, "launch".into()),
    ] {
        let (kind, e) = t.send(line);
        assert_eq!(kind, "error", "{line} -> {e}");
        assert_eq!(e["command"], command, "{line} -> {e}");
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
    }
    // An IPv6 GID on an IPv4 device fails in modify_qp INIT->RTR; the error names the step
    // and where the QP was left.
    let (kind, e) = t.send(r#"{"connect": {"dest_qpn": 17, "dest_gid": "::1"}}"#);
    assert_eq!(kind, "error");
    let msg = e["message"].as_str().unwrap_or_default();
    assert!(
        msg.starts_with("modify_qp INIT->RTR: ") && msg.ends_with("(QP now INIT)"),
        "{msg}"
    );
    let (_, q) = t.send(r#"{"query_qp": {}}"#);
    assert_eq!(q["state"], "INIT");

    let (kind, c) =
        t.send(r#"{"connect": {"dest_qpn": "0x11", "dest_psn": 5, "dest_gid": "127.0.42.6"}}"#);
    assert_eq!(kind, "connect", "{c}");
    assert_eq!(c["state"], "RTS");
    assert_eq!(c["recv_posted"], 16);
    assert_eq!(c["dest_gid"], "::ffff:127.0.42.6");
    let (_, q) = t.send(r#"{"query_qp": null}"#);
    assert_eq!(
        (q["state"].as_str(), q["recv_outstanding"].as_u64()),
        (Some("RTS"), Some(16))
    );
    let (kind, _) = t.send(r#"{"post_recv": {"count": 1}}"#);
    assert_eq!(kind, "error", "all 16 slots are in use");
    let (_, c) = t.send(r#"{"counters": {}}"#);
    for name in [
        "icrc_errors",
        "rcvd_pkts",
        "duplicate_request",
        "out_of_seq_request",
    ] {
        assert_eq!(c[name], 0, "{name}");
    }
    // Reconnecting goes through RESET: the receives are posted afresh.
    let (_, c) = t.send(r#"{"connect": {"dest_qpn": 18, "dest_gid": "127.0.42.6"}}"#);
    assert_eq!(
        (c["state"].as_str(), c["recv_posted"].as_u64()),
        (Some("RTS"), Some(16))
    );

    t.stdin = None; // EOF
    let status = wait_exit(&mut t.proc);
    assert!(status.success(), "{status}");
}

#[test]
fn quit_exits_zero_and_bad_options_print_an_error_line() {
    let mut t = Target::start(&["--ip", "127.0.42.7", "--no-recv"]);
    let (kind, ready) = t.line();
    assert_eq!(
        (kind.as_str(), &ready["recv"]["auto"]),
        ("ready", &Value::Bool(false))
    );
    let (kind, q) = t.send(r#"{"quit": {}}"#);
    assert_eq!((kind.as_str(), &q["ok"]), ("quit", &Value::Bool(true)));
    assert!(wait_exit(&mut t.proc).success());

    for args in [
        &["--ip", "127.0.42.8", "--path-mtu", "1000"][..],
        &["--ip", "127.0.42.8", "--access", "remote_write"][..],
        &["--ip", "127.0.42.8", "--access", "remote_wrte"][..],
        &["--ip", "127.0.42.8", "--min-rnr-timer", "32"][..],
    ] {
        let mut t = Target::start(args);
        let (kind, e) = t.line();
        assert_eq!(kind, "error", "{args:?}: {e}");
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()));
        let status = wait_exit(&mut t.proc);
        assert_eq!(status.code(), Some(1), "{args:?}");
    }
}

/// The next line of kind `kind` (other kinds, e.g. `event`, are skipped).
fn next_of(t: &Target, kind: &str) -> Value {
    loop {
        let (k, v) = t.line();
        if k == kind {
            return v;
        }
    }
}

/// The next completion of a send-queue WR (receives flushed by a QP in ERR are skipped).
fn next_send_wc(t: &Target) -> Value {
    loop {
        let wc = next_of(t, "wc");
        if wc["opcode"] != "IBV_WC_RECV" {
            return wc;
        }
    }
}

/// Two targets, one the requester (`post_send`), one the responder: a SEND into a QP with no
/// receive posted is RNR NAKed until `post_recv`, then lands; with `rnr_retry` 0 it ends in
/// IBV_WC_RNR_RETRY_EXC_ERR; a READ inside the MR returns its bytes, one past its end ends in
/// IBV_WC_REM_ACCESS_ERR (rxe NAKs it remote access error).
#[test]
fn post_send_drives_a_second_target() {
    let start = |ip: &str, extra: &[&str]| {
        let mut args = vec!["--ip", ip, "--psn", "0x100", "--mr-size", "256"];
        args.extend_from_slice(extra);
        let t = Target::start(&args);
        let (kind, ready) = t.line();
        assert_eq!(kind, "ready", "{ready}");
        (t, ready)
    };
    let connect = |t: &mut Target, peer: &Value, ip: &str, rnr_retry: u32| {
        let (kind, c) = t.send(&format!(
            r#"{{"connect": {{"dest_qpn": {}, "dest_psn": "0x100", "dest_gid": "{ip}", "rnr_retry": {rnr_retry}}}}}"#,
            peer["qpn"]
        ));
        assert_eq!(
            (kind.as_str(), &c["state"]),
            ("connect", &"RTS".into()),
            "{c}"
        );
        assert_eq!(c["rnr_retry"], rnr_retry);
    };
    let (req_ip, resp_ip) = ("127.0.42.10", "127.0.42.11");
    // RNR timer code 1 (0.01 ms): the retries come quickly.
    let (mut resp, resp_ready) = start(resp_ip, &["--no-recv", "--min-rnr-timer", "1"]);
    let (mut req, req_ready) = start(req_ip, &[]);
    connect(&mut resp, &req_ready, req_ip, 7);
    connect(&mut req, &resp_ready, resp_ip, 7);

    let (_, w) = req.send(r#"{"write_mr": {"index": 0, "hex": "5365 6e64 21"}}"#);
    assert_eq!(w["length"], 5);
    let (kind, p) = req.send(r#"{"post_send": {"opcode": "send", "length": 5, "wr_id": 7}}"#);
    assert_eq!(
        (kind.as_str(), &p["wr_id"]),
        ("post_send", &7.into()),
        "{p}"
    );
    // Wait for the responder's first RNR NAK, then give it a receive.
    let deadline = Instant::now() + LIMIT;
    loop {
        let (_, c) = resp.send(r#"{"counters": {}}"#);
        if c["send_rnr_err"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no RNR NAK: {c}");
        std::thread::sleep(Duration::from_millis(5)); // polling interval
    }
    let (kind, _) = resp.send(r#"{"post_recv": {}}"#);
    assert_eq!(kind, "post_recv");
    let wc = next_of(&resp, "wc");
    assert_eq!(
        (&wc["status"], &wc["opcode"], &wc["data"]),
        (
            &"IBV_WC_SUCCESS".into(),
            &"IBV_WC_RECV".into(),
            &"53656e6421".into()
        )
    );
    let wc = next_send_wc(&req);
    assert_eq!(
        (&wc["wr_id"], &wc["status"], &wc["opcode"]),
        (&7.into(), &"IBV_WC_SUCCESS".into(), &"IBV_WC_SEND".into())
    );
    let (_, c) = req.send(r#"{"counters": {}}"#);
    assert!(c["rcvd_rnr_err"].as_u64().unwrap_or(0) > 0, "{c}");

    // READ: the responder's MR 0 is 256 bytes.
    let va = resp_ready["mrs"][0]["va"].as_u64().expect("va");
    let rkey = &resp_ready["mrs"][0]["rkey"];
    let (_, _) = resp.send(r#"{"write_mr": {"index": 0, "offset": 252, "hex": "a1b2c3d4"}}"#);
    let (kind, p) = req.send(&format!(
        r#"{{"post_send": {{"opcode": "read", "offset": 16, "length": 4, "remote_addr": {}, "rkey": {rkey}, "wr_id": 8}}}}"#,
        va + 252
    ));
    assert_eq!(kind, "post_send", "{p}");
    let wc = next_send_wc(&req);
    assert_eq!(
        (&wc["status"], &wc["opcode"]),
        (&"IBV_WC_SUCCESS".into(), &"IBV_WC_RDMA_READ".into())
    );
    let (_, d) = req.send(r#"{"dump_mr": {"index": 0, "offset": 16, "length": 4}}"#);
    assert_eq!(d["hex"], "a1b2c3d4");

    // SEND_WITH_IMM and RDMA_WRITE_WITH_IMM: byte_len the message length and IBV_WC_WITH_IMM
    // at the requester; at the responder IBV_WC_GRH, IBV_WC_WITH_IMM and the immediate as on
    // the wire (rxe's make_send_cqe / do_complete).
    let (kind, _) = resp.send(r#"{"post_recv": {"count": 2}}"#);
    assert_eq!(kind, "post_recv");
    // One WR at a time: its completion line may come before the reply to a next command.
    let write_imm = format!(
        r#"{{"post_send": {{"opcode": "write_imm", "length": 3, "remote_addr": {}, "rkey": {rkey}, "imm_data": 3237998081, "wr_id": 11}}}}"#,
        va + 100
    );
    for (post, wr_id, len, imm, recv_opcode) in [
        (
            r#"{"post_send": {"opcode": "send_imm", "length": 5, "imm_data": "0x5eed1234", "wr_id": 10}}"#,
            10,
            5,
            0x5eed_1234u32,
            "IBV_WC_RECV",
        ),
        (
            write_imm.as_str(),
            11,
            3,
            0xc0ff_ee01,
            "IBV_WC_RECV_RDMA_WITH_IMM",
        ),
    ] {
        let (kind, p) = req.send(post);
        assert_eq!(
            (kind.as_str(), &p["imm_data"]),
            ("post_send", &imm.into()),
            "{p}"
        );
        let wc = next_send_wc(&req);
        assert_eq!(
            (
                &wc["wr_id"],
                &wc["status"],
                &wc["byte_len"],
                &wc["with_imm"]
            ),
            (
                &wr_id.into(),
                &"IBV_WC_SUCCESS".into(),
                &len.into(),
                &true.into()
            ),
            "{wc}"
        );
        let wc = next_of(&resp, "wc");
        assert_eq!(
            (&wc["opcode"], &wc["byte_len"], &wc["grh"], &wc["with_imm"]),
            (&recv_opcode.into(), &len.into(), &true.into(), &true.into()),
            "{wc}"
        );
        assert_eq!(
            (&wc["imm_data"], &wc["wc_flags"]),
            (&imm.into(), &3.into()),
            "{wc}"
        );
    }
    let (_, d) = resp.send(r#"{"dump_mr": {"index": 0, "offset": 100, "length": 3}}"#);
    assert_eq!(d["hex"], "53656e");
    // Each post_send's reply comes before its WR's `wc` line (the protocol's order; once, in
    // a soak run, a fast WRITE's line came first). 200 WRITEs, each awaited.
    for wr_id in 100..300u64 {
        let (kind, p) = req.send(&format!(
            r#"{{"post_send": {{"opcode": "write", "length": 4, "remote_addr": {}, "rkey": {rkey}, "wr_id": {wr_id}}}}}"#,
            va + 200
        ));
        assert_eq!(
            (kind.as_str(), &p["wr_id"]),
            ("post_send", &wr_id.into()),
            "{p}"
        );
        let wc = next_send_wc(&req);
        assert_eq!(
            (&wc["wr_id"], &wc["status"]),
            (&wr_id.into(), &"IBV_WC_SUCCESS".into()),
            "{wc}"
        );
    }
    let (_, p) = req.send(&format!(
        r#"{{"post_send": {{"opcode": "read", "length": 8, "remote_addr": {}, "rkey": {rkey}, "wr_id": 9}}}}"#,
        va + 252
    ));
    assert_eq!(p["wr_id"], 9);
    let wc = next_send_wc(&req);
    assert_eq!(
        (&wc["wr_id"], &wc["status"]),
        (&9.into(), &"IBV_WC_REM_ACCESS_ERR".into()),
        "{wc}"
    );

    // Bad post_send lines are errors, not panics. (The READ's error moved the QP to ERR,
    // which flushes the posted receives: their `wc` lines and the `event` line may come
    // between the replies, so those are skipped.)
    for line in [
        r#"{"post_send": {}}"#,
        r#"{"post_send": {"opcode": "atomic"}}"#,
        r#"{"post_send": {"opcode": "read", "length": 4}}"#,
        r#"{"post_send": {"opcode": "send", "rkey": 1}}"#,
        r#"{"post_send": {"opcode": "send", "imm_data": 1}}"#,
        r#"{"post_send": {"opcode": "send", "offset": 250, "length": 7}}"#,
        r#"{"post_send": {"opcode": "send", "index": 3}}"#,
    ] {
        let (mut kind, mut e) = req.send(line);
        while kind == "wc" || kind == "event" {
            (kind, e) = req.line();
        }
        assert_eq!(
            (kind.as_str(), &e["command"]),
            ("error", &"post_send".into()),
            "{line}: {e}"
        );
    }

    // rnr_retry 0: the first RNR NAK ends the SEND.
    let (mut resp, resp_ready) = start("127.0.42.12", &["--no-recv"]);
    let (mut req, req_ready) = start("127.0.42.13", &[]);
    connect(&mut resp, &req_ready, "127.0.42.13", 7);
    connect(&mut req, &resp_ready, "127.0.42.12", 0);
    let (kind, _) = req.send(r#"{"post_send": {"opcode": "send", "length": 16}}"#);
    assert_eq!(kind, "post_send");
    let wc = next_send_wc(&req);
    assert_eq!(wc["status"], "IBV_WC_RNR_RETRY_EXC_ERR", "{wc}");
    let (_, c) = resp.send(r#"{"counters": {}}"#);
    assert_eq!(c["send_rnr_err"], 1, "{c}");
}
