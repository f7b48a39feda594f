//! A host's device (issue 21 item 1): every process that opens the device of an address
//! shares it, as every process of a host shares kernel rxe's `rxe0`
//! (`softroce::net::share`, `softroce::net::keeper`, docs/architecture.md "A host's
//! device"). Through `softroce exec` with rdma-core's own programs: a verbs server and
//! client in two processes on one address; two rdma_cm servers on two ports of one address
//! with their clients, all on that address, and a connect to a port nobody listens on
//! (REJ from the device, as the kernel CM answers); a second listener of a port refused; a
//! process killed with SIGKILL gives its slot back, and the device's keeper goes away with
//! the last process. Skipped, saying why, only when the programs are not installed (CI
//! installs them).

mod exec_support;
use exec_support::*;
use std::process::Stdio;
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
