//! Unmodified rdma-core programs (Debian's ibverbs-utils) run through `softroce exec` on
//! softroce's libibverbs.so.1 (crates/softroce-capi): ibv_devices, ibv_devinfo and an RC
//! pingpong between two processes on loopback with data checked. Skipped, saying why, only
//! when the tools are not installed (CI installs them). Every program is killed after a
//! deadline.

mod exec_support;
use exec_support::*;
use std::time::Duration;

fn run_ok(ip: &str, args: &[&str]) -> String {
    let out = wait(
        exec(ip, args).spawn().unwrap(),
        Duration::from_secs(20),
        args[0],
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{args:?} failed ({}):\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn ibv_devices_and_devinfo_see_softroce_devices() {
    if !have("ibv_devinfo") || !have("ibv_devices") {
        println!("SKIPPED: ibv_devices/ibv_devinfo not installed (apt-get install ibverbs-utils)");
        return;
    }
    let list = run_ok("127.0.115.1,127.0.115.2", &["ibv_devices"]);
    assert!(
        list.contains("softroce0") && list.contains("softroce1"),
        "{list}"
    );
    let info = run_ok("127.0.115.1", &["ibv_devinfo", "-v"]);
    for want in [
        "hca_id:\tsoftroce0",
        "PORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "GID[  0]:\t\tfe80::",
        "GID[  1]:\t\t::ffff:127.0.115.1, RoCE v2",
    ] {
        assert!(
            info.contains(want),
            "ibv_devinfo -v lacks {want:?}:\n{info}"
        );
    }
}

/// A free TCP port on loopback for the pingpong's out-of-band exchange.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn ibv_rc_pingpong_between_two_processes() {
    if !have("ibv_rc_pingpong") {
        println!("SKIPPED: ibv_rc_pingpong not installed (apt-get install ibverbs-utils)");
        return;
    }
    let port = free_port().to_string();
    // 4096-byte messages over a 1024-byte path MTU: four packets each way; -c checks data.
    let common = [
        "ibv_rc_pingpong",
        "-g",
        "1",
        "-c",
        "-s",
        "4096",
        "-m",
        "1024",
        "-n",
        "20",
        "-p",
        &port,
    ];
    let mut server = Some(exec("127.0.115.11", &common).spawn().unwrap());
    // The server listens on TCP once its device is up; the client retries connecting only
    // briefly, so it starts then.
    wait_tcp_listen(port.parse().unwrap(), &mut server);
    let server = server.unwrap();
    let mut client_args = common.to_vec();
    client_args.push("127.0.0.1");
    let client = exec("127.0.115.12", &client_args).spawn().unwrap();
    let c = wait(client, Duration::from_secs(30), "ibv_rc_pingpong client");
    let s = wait(server, Duration::from_secs(30), "ibv_rc_pingpong server");
    for (who, out) in [("client", &c), ("server", &s)] {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{who} failed ({}):\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("20 iters in"), "{who}:\n{text}");
        assert!(text.contains("GID ::ffff:127.0.115.1"), "{who}:\n{text}");
    }
}

/// rdma-core's own `ibv_rc_pingpong -g 0` (issue 25 item 2), as tutorials run it: on rxe,
/// GID index 0 is the link-local GID; softroce sends from none, so `ibv_modify_qp` to RTR
/// fails with EINVAL as there, and the library says once, on stderr, what to pass instead.
/// The server fails first (after the TCP exchange) and exits non-zero; its client sees the
/// exchange end.
#[test]
fn ibv_rc_pingpong_with_gid_index_0_fails_naming_gid_index_1() {
    if !have("ibv_rc_pingpong") {
        println!("SKIPPED: ibv_rc_pingpong not installed (apt-get install ibverbs-utils)");
        return;
    }
    let port = free_port().to_string();
    let common = ["ibv_rc_pingpong", "-g", "0", "-n", "5", "-p", &port];
    let mut server = Some(exec("127.0.115.13", &common).spawn().unwrap());
    wait_tcp_listen(port.parse().unwrap(), &mut server);
    let mut client_args = common.to_vec();
    client_args.push("127.0.0.1");
    let client = exec("127.0.115.14", &client_args).spawn().unwrap();
    let s = wait(
        server.unwrap(),
        Duration::from_secs(30),
        "ibv_rc_pingpong -g 0 server",
    );
    let c = wait(
        client,
        Duration::from_secs(30),
        "ibv_rc_pingpong -g 0 client",
    );
    let (out, err) = (
        String::from_utf8_lossy(&s.stdout),
        String::from_utf8_lossy(&s.stderr),
    );
    assert!(
        !s.status.success(),
        "the server ran with GID 0:\n{out}{err}"
    );
    assert!(!c.status.success(), "the client ran with GID 0");
    assert!(err.contains("Failed to modify QP to RTR"), "{err}");
    let hints: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("GID index 0 is the link-local GID; pass GID index 1"))
        .collect();
    assert_eq!(hints.len(), 1, "one hint, naming the fix:\n{err}");
    assert!(hints[0].contains("-g 1"), "{}", hints[0]);
}

// `softroce exec --pcap FILE` (issue 25 item 4): every datagram of the program's devices and
// of its children's goes to FILE, which `softroce decode` reads. The program is a shell whose
// two children each run tests/c/verbs_gaps.c (RC traffic between its two devices) on their
// own pair of addresses, one after the other: the capture holds both pairs' traffic and every
// record's ICRC checks.
#[test]
fn exec_pcap_captures_the_program_and_its_children() {
    let dir = std::env::temp_dir().join(format!("softroce-exec-pcap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let Some(prog) = compile_c("verbs_gaps", &dir) else {
        return;
    };
    let pcap = dir.join("children.pcap");
    let script = format!(
        "SOFTROCE_IP=127.0.151.1,127.0.151.2 {p} && SOFTROCE_IP=127.0.151.3,127.0.151.4 {p}",
        p = prog.display()
    );
    let mut cmd = std::process::Command::new(SOFTROCE);
    cmd.args(["exec", "--pcap"])
        .arg(&pcap)
        .args(["--", "sh", "-c", &script]);
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = wait(
        cmd.spawn().unwrap(),
        Duration::from_secs(90),
        "verbs_gaps x2",
    );
    assert!(
        out.status.success(),
        "{}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = decode(&pcap);
    let frames: Vec<&str> = text.lines().collect();
    for pair in [
        ("127.0.151.1", "127.0.151.2"),
        ("127.0.151.3", "127.0.151.4"),
    ] {
        let n = frames
            .iter()
            .filter(|l| {
                l.contains(&format!("{}:", pair.0)) && l.contains(&format!("{}:4791", pair.1))
            })
            .count();
        assert!(
            n > 0,
            "no datagram from {} to {} in the capture:\n{text}",
            pair.0,
            pair.1
        );
    }
    let bad: Vec<&&str> = frames.iter().filter(|l| !l.contains("icrc=ok")).collect();
    assert!(bad.is_empty(), "records whose ICRC does not check: {bad:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
