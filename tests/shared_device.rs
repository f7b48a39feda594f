//! A host's device (issue 21 item 1): every process that opens the device of an address
//! shares it, as every process of a host shares kernel rxe's `rxe0`
//! (`softroce::net::share`, `softroce::net::keeper`, docs/architecture.md "A host's
//! device"). Through `softroce exec` with rdma-core's own programs: a verbs server and
//! client in two processes on one address; two rdma_cm servers on two ports of one address
//! with their clients, all on that address, and a connect to a port nobody listens on
//! (REJ from the device, as the kernel CM answers); a second listener of a port refused; a
//! process killed with SIGKILL gives its slot back, and the device's keeper goes away with
//! the last process. Skipped, saying why, only when the programs are not installed (CI
//! installs them). And, with `softroce target` processes and the test's own device, the
//! device's counters are the device's, as rxe's `hw_counters` are: every process sees the sum
//! over all of them, a killed one's counts included (`softroce::net::counter_pages`).

mod exec_support;
use exec_support::*;
use serde_json::Value;
use softroce::net::UdpDevice;
use softroce::verbs::{Counters, DropReason};
use std::io::{BufRead, Write};
use std::net::{IpAddr, UdpSocket};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Whether the keeper of the device on `ip` is there: its Unix socket `@softroce/<ip>`.
fn keeper_listening(ip: &str) -> bool {
    let t = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    let name = format!("@softroce/{ip}");
    t.lines()
        .any(|l| l.split_whitespace().last() == Some(name.as_str()))
}

/// The QPN an ibv_rc_pingpong prints as its own ("local address: ... QPN 0x010000").
fn local_qpn(out: &str) -> u32 {
    let l = out
        .lines()
        .find(|l| l.contains("local address"))
        .unwrap_or_else(|| panic!("no local address line in:\n{out}"));
    let q = l
        .split("QPN ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .unwrap();
    u32::from_str_radix(q.trim_start_matches("0x"), 16).unwrap()
}

fn pingpong(ip: &str, port: u16, server_of: Option<&str>) -> std::process::Command {
    let port = port.to_string();
    let mut args = vec!["ibv_rc_pingpong", "-g", "1", "-n", "200", "-p", &port];
    if let Some(s) = server_of {
        args.push(s);
    }
    let mut c = exec(ip, &args);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

#[test]
fn a_verbs_server_and_client_in_two_processes_share_one_address() {
    if !have("ibv_rc_pingpong") {
        println!("SKIPPED: ibv_rc_pingpong not installed (apt-get install ibverbs-utils)");
        return;
    }
    let ip = "127.0.79.1";
    let srv = Kill(Some(pingpong(ip, 18601, None).spawn().unwrap()));
    wait_tcp_listen(18601, &mut None);
    let c = wait(
        pingpong(ip, 18601, Some("127.0.0.1")).spawn().unwrap(),
        Duration::from_secs(60),
        "ibv_rc_pingpong client",
    );
    let mut srv = srv;
    let s = wait(srv.0.take().unwrap(), Duration::from_secs(60), "server");
    let (cout, sout) = (
        String::from_utf8_lossy(&c.stdout).into_owned(),
        String::from_utf8_lossy(&s.stdout).into_owned(),
    );
    let report = format!(
        "client {}:\n{cout}{}\nserver {}:\n{sout}{}",
        c.status,
        String::from_utf8_lossy(&c.stderr),
        s.status,
        String::from_utf8_lossy(&s.stderr)
    );
    assert!(c.status.success() && s.status.success(), "{report}");
    // Each process has its own slot: its QPNs' top 8 bits (softroce::net::steer).
    let (qs, qc) = (local_qpn(&sout), local_qpn(&cout));
    assert_ne!(qs >> 16, qc >> 16, "one slot for two processes:\n{report}");
    assert!(qs >> 16 != 0 && qc >> 16 != 0, "{report}");
    // The keeper went away with the last process.
    let end = Instant::now() + Duration::from_secs(20);
    while keeper_listening(ip) {
        assert!(
            Instant::now() < end,
            "the keeper of {ip} outlived its processes"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `rping -c` to `port` on `ip` from a process on `ip`: its stdout and stderr. A REQ that
/// came before the server's rdma_listen is rejected (REJ 8, as with the kernel): the
/// client is started again until the server listens (the servers start in parallel with
/// it), for up to 60 s.
fn rping_client(ip: &str, port: &str, until_not_rejected: bool) -> (bool, String) {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let o = wait(
            exec(ip, &["rping", "-c", "-a", ip, "-p", port, "-C", "3", "-v"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
            Duration::from_secs(60),
            "rping -c",
        );
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        if until_not_rejected && text.contains("RDMA_CM_EVENT_REJECTED") && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        return (o.status.success(), text);
    }
}

#[test]
fn two_rdma_cm_servers_and_their_clients_share_one_address() {
    if !have("rping") {
        println!("SKIPPED: rping not installed (apt-get install rdmacm-utils)");
        return;
    }
    let ip = "127.0.79.2";
    let server = |port: &str| {
        Kill(Some(
            exec(ip, &["rping", "-s", "-a", ip, "-p", port, "-C", "3", "-v"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        ))
    };
    let mut s1 = server("7101");
    let mut s2 = server("7102");
    for port in ["7101", "7102"] {
        let (ok, text) = rping_client(ip, port, true);
        assert!(
            ok && text.contains("ping data: rdma-ping-2"),
            "client of {port}:\n{text}"
        );
    }
    for s in [&mut s1, &mut s2] {
        let o = wait(s.0.take().unwrap(), Duration::from_secs(60), "rping -s");
        assert!(
            o.status.success(),
            "server: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // Nobody listens on 7103: the device answers the REQ with REJ 8 (invalid service ID),
    // as the kernel CM does, while other processes hold the device open.
    let _hold = server("7104");
    let (ok, text) = rping_client(ip, "7103", false);
    assert!(
        !ok && text.contains("RDMA_CM_EVENT_REJECTED, error 8"),
        "{text}"
    );
}

fn persistent_server(ip: &str, port: &str) -> Kill {
    Kill(Some(
        exec(ip, &["rping", "-s", "-P", "-a", ip, "-p", port])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ))
}

/// A second process's rdma_listen on a port another process of the device listens on fails
/// with EADDRINUSE (the kernel's rdma_cm refuses it at bind); once the first is killed
/// (SIGKILL: it runs nothing on its way out), its listener is gone with its slot and a new
/// server in a third process takes the port and serves.
#[test]
fn a_port_is_one_processes_until_it_is_killed() {
    if !have("rping") {
        println!("SKIPPED: rping not installed (apt-get install rdmacm-utils)");
        return;
    }
    let ip = "127.0.79.3";
    let mut first = persistent_server(ip, "7201");
    let (ok, text) = rping_client(ip, "7201", true);
    assert!(ok, "client of the first server:\n{text}");
    let second = wait(
        exec(ip, &["rping", "-s", "-a", ip, "-p", "7201", "-C", "1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        Duration::from_secs(30),
        "a second rping -s on the port",
    );
    let err = format!(
        "{}{}",
        String::from_utf8_lossy(&second.stdout),
        String::from_utf8_lossy(&second.stderr)
    );
    assert!(
        !second.status.success() && err.contains("Address already in use"),
        "the second listener was not refused ({}):\n{err}",
        second.status
    );
    let mut c = first.0.take().unwrap();
    c.kill().unwrap();
    c.wait().unwrap();
    let _third = persistent_server(ip, "7201");
    let (ok, text) = rping_client(ip, "7201", true);
    assert!(ok, "client of the server after the killed one:\n{text}");
}

/// Every process of the address that joined a multicast group gets its copy of each
/// datagram sent to it (rxe: `rxe_rcv_mcast_pkt`, every QP attached): two mckey receivers and
/// the sender, all on one address.
#[test]
fn every_process_joined_to_a_group_gets_its_copy() {
    if !have("mckey") || !have("stdbuf") {
        println!("SKIPPED: mckey or stdbuf not installed (apt-get install rdmacm-utils)");
        return;
    }
    let (ip, group) = ("127.0.79.4", "239.160.0.9");
    let mut r1 = Lines::spawn(ip, &["mckey", "-m", group, "-b", ip]);
    let mut r2 = Lines::spawn(ip, &["mckey", "-m", group, "-b", ip]);
    for r in [&mut r1, &mut r2] {
        r.wait_for("receiving data transfers");
    }
    let s = Lines::spawn(ip, &["mckey", "-m", group, "-b", ip, "-s"]);
    let (ss, st) = s.finish("mckey -s");
    assert!(
        ss.success() && st.contains("data transfers complete"),
        "{st}"
    );
    for (i, r) in [r1, r2].into_iter().enumerate() {
        let (rs, rt) = r.finish("mckey");
        assert!(
            rs.success()
                && rt.contains("data transfers complete")
                && rt.contains("return status 0"),
            "receiver {i}:\n{rt}\nsender:\n{st}"
        );
    }
}

/// A process killed (SIGKILL) in the middle of its transfer gives its slot back, and the
/// other processes of the address keep running and lose nothing: an `ibv_rc_pingpong` pair
/// pings on the address while an `ib_write_bw` pair runs there; the pingpong server is
/// killed during the WRITEs, which still complete and report their bandwidth.
#[test]
fn a_process_killed_mid_transfer_leaves_the_others_running() {
    if !have("ibv_rc_pingpong") || !have("ib_write_bw") || !have("stdbuf") {
        println!("SKIPPED: ibverbs-utils, perftest or stdbuf not installed");
        return;
    }
    let ip = "127.0.79.5";
    let mut victim_s = Lines::spawn(
        ip,
        &[
            "ibv_rc_pingpong",
            "-g",
            "1",
            "-n",
            "100000000",
            "-p",
            "18711",
        ],
    );
    wait_tcp_listen(18711, &mut None);
    let mut victim_c = Lines::spawn(
        ip,
        &[
            "ibv_rc_pingpong",
            "-g",
            "1",
            "-n",
            "100000000",
            "-p",
            "18711",
            ip,
        ],
    );
    victim_c.wait_for("remote address");
    victim_s.wait_for("remote address");
    // 3000 WRITEs of 64 KiB: about 2 s in a debug build. (Not perftest's timed mode, `-D`:
    // on a loaded machine its clock calibration refuses to report, "r^2 < 0.9".)
    let bw = ["ib_write_bw", "-x", "1", "-p", "18712", "-n", "3000"];
    let bw_s = Lines::spawn(ip, &bw);
    wait_tcp_listen(18712, &mut None);
    let mut client_args = bw.to_vec();
    client_args.push(ip);
    let mut bw_c = Lines::spawn(ip, &client_args);
    // The header comes just before the test starts.
    bw_c.wait_for("#bytes");
    victim_s.kill_now();
    let (cs, ct) = bw_c.finish("ib_write_bw client");
    let (ss, st) = bw_s.finish("ib_write_bw server");
    assert!(cs.success() && ss.success(), "client:\n{ct}\nserver:\n{st}");
    // The result line: "65536  <iters>  <peak>  <average MB/sec>  <msg rate>".
    let result = ct
        .lines()
        .find(|l| l.trim_start().starts_with("65536"))
        .unwrap_or_else(|| panic!("no result line:\n{ct}"));
    let avg: f64 = result.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert!(avg > 0.0, "{result}");
    drop(victim_c);
}

/// A `softroce target` process: JSON commands on its stdin, its output lines (replies, `wc`
/// and `event` lines) read as they come.
struct Target {
    kill: Kill,
    stdin: std::process::ChildStdin,
    lines: mpsc::Receiver<String>,
    /// `wc` and `event` lines read while waiting for something else.
    kept: Vec<(String, Value)>,
}

impl Target {
    /// Starts a target on `ip` (first PSN 0x100, a 256-byte MR) and returns it with its
    /// `ready` line.
    fn start(ip: &str) -> (Target, Value) {
        let mut c = std::process::Command::new(SOFTROCE)
            .args(["target", "--ip", ip, "--psn", "0x100", "--mr-size", "256"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let (stdin, out) = (c.stdin.take().unwrap(), c.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut t = Target {
            kill: Kill(Some(c)),
            stdin,
            lines,
            kept: Vec::new(),
        };
        let ready = t.next_of("ready");
        (t, ready)
    }

    /// The next output line: its kind and body.
    fn line(&mut self) -> (String, Value) {
        let text = self
            .lines
            .recv_timeout(Duration::from_secs(30))
            .expect("a line from softroce target within 30 s");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let (k, body) = v
            .as_object()
            .and_then(|o| o.iter().next())
            .unwrap_or_else(|| panic!("not a one-key object: {text}"));
        (k.clone(), body.clone())
    }

    /// The next line of kind `kind`, keeping the `wc` and `event` lines before it; any
    /// other line (an `error`) fails the test.
    fn next_of(&mut self, kind: &str) -> Value {
        if let Some(i) = self.kept.iter().position(|(k, _)| k == kind) {
            return self.kept.remove(i).1;
        }
        loop {
            let (k, v) = self.line();
            if k == kind {
                return v;
            }
            assert!(k == "wc" || k == "event", "waiting for {kind}: {k} {v}");
            self.kept.push((k, v));
        }
    }

    /// Sends one command line and returns its reply.
    fn cmd(&mut self, kind: &str, args: Value) -> Value {
        let line = serde_json::json!({ kind: args }).to_string();
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
        self.next_of(kind)
    }

    /// Connects the target's QP to `peer`'s (a target's `ready` line) on `ip`.
    fn connect(&mut self, peer: &Value, ip: &str) {
        let args =
            serde_json::json!({"dest_qpn": peer["qpn"], "dest_gid": ip, "dest_psn": "0x100"});
        let c = self.cmd("connect", args);
        assert_eq!(c["state"], "RTS", "{c}");
    }

    /// Sends `n` SENDs of 16 bytes, one at a time, each completed before the next.
    fn sends(&mut self, n: u64) {
        for i in 0..n {
            let args = serde_json::json!({"opcode": "send", "length": 16, "wr_id": i});
            self.cmd("post_send", args);
            loop {
                let wc = self.next_of("wc");
                if wc["opcode"] == "IBV_WC_SEND" {
                    assert_eq!(
                        (&wc["status"], &wc["wr_id"]),
                        (&"IBV_WC_SUCCESS".into(), &i.into())
                    );
                    break;
                }
            }
        }
    }

    /// The counters the target's device shows (the `counters` command).
    fn counters(&mut self) -> Value {
        self.cmd("counters", serde_json::json!({}))
    }
}

/// The counters of the test's traffic: packets sent and received, SENDs completed at
/// either end, drops (all of them) and the truncated ones among them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    sent_pkts: u64,
    rcvd_pkts: u64,
    rdma_sends: u64,
    rdma_recvs: u64,
    drops: u64,
    truncated: u64,
}

impl Seen {
    /// From a target's `counters` line.
    fn of_json(c: &Value) -> Seen {
        let n = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("no {k} in {c}"));
        Seen {
            sent_pkts: n("sent_pkts"),
            rcvd_pkts: n("rcvd_pkts"),
            rdma_sends: n("rdma_sends"),
            rdma_recvs: n("rdma_recvs"),
            drops: DropReason::ALL.iter().map(|r| n(r.name())).sum(),
            truncated: n("truncated"),
        }
    }

    fn of(c: &Counters) -> Seen {
        Seen {
            sent_pkts: c.sent_pkts,
            rcvd_pkts: c.rcvd_pkts,
            rdma_sends: c.rdma_sends,
            rdma_recvs: c.rdma_recvs,
            drops: c.dropped_total(),
            truncated: c.dropped(DropReason::Truncated),
        }
    }
}

/// Waits (up to 30 s) until `get` gives `want`; the last reading is in the failure.
fn shows<T: std::fmt::Debug>(who: &str, want: Seen, mut get: impl FnMut() -> (Seen, T)) {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let (got, raw) = get();
        if got == want {
            return;
        }
        assert!(
            Instant::now() < end,
            "{who}: counters {got:?}, want {want:?}: {raw:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// rxe's `hw_counters` are per device, and so are a shared device's counters: two
/// `softroce target` processes and the test's own device share one address; the targets
/// send each other 5 and 3 SENDs (each one packet, acknowledged by one ACK), and one
/// datagram too short for RoCE reaches the address from a plain UDP socket (the keeper's
/// drop: it is for no process). Every process then shows the device's counters: 16 packets
/// sent and received, 8 SENDs at each end, 1 truncated drop; the test's device, which sent
/// nothing, counts nothing of its own. Then one target is killed (SIGKILL: it runs nothing
/// on its way out) and every process left, and one that comes after it, still shows its
/// counts in the device's.
#[test]
fn device_counters_are_the_sum_over_the_processes_sharing_the_address() {
    let ip = "127.0.79.6";
    let (mut a, ready_a) = Target::start(ip);
    let (mut b, ready_b) = Target::start(ip);
    let dev = UdpDevice::open("softroce_counters", ip.parse::<IpAddr>().unwrap()).unwrap();
    assert!(dev.link().slot().is_some(), "the test's device is shared");
    a.connect(&ready_b, ip);
    b.connect(&ready_a, ip);
    a.sends(5);
    b.sends(3);
    UdpSocket::bind("127.0.79.7:0")
        .unwrap()
        .send_to(b"not RoCE", (ip, 4791))
        .unwrap();
    let want = Seen {
        sent_pkts: 16,
        rcvd_pkts: 16,
        rdma_sends: 8,
        rdma_recvs: 8,
        drops: 1,
        truncated: 1,
    };
    for (name, t) in [("target a", &mut a), ("target b", &mut b)] {
        shows(name, want, || {
            let c = t.counters();
            (Seen::of_json(&c), c)
        });
    }
    shows("the test's device", want, || {
        let c = dev.counters();
        (Seen::of(&c), c)
    });
    assert_eq!(
        dev.process_counters(),
        Counters::default(),
        "the test's own part"
    );

    let mut killed = a.kill.0.take().unwrap();
    killed.kill().unwrap();
    killed.wait().unwrap();
    // The counts of the killed target stay: read now, and by a process that comes later.
    assert_eq!(
        Seen::of_json(&b.counters()),
        want,
        "target b after the kill"
    );
    assert_eq!(Seen::of(&dev.counters()), want, "the test's device");
    let (mut c, _) = Target::start(ip);
    assert_eq!(
        Seen::of_json(&c.counters()),
        want,
        "a target started after the kill"
    );
    b.cmd("quit", serde_json::json!({}));
    c.cmd("quit", serde_json::json!({}));
}
