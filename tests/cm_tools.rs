//! rdma-core's and perftest's unmodified rdma_cm tools (Debian's rdmacm-utils and perftest)
//! through `softroce exec` on softroce's librdmacm.so.1 and libibverbs.so.1, each a server and
//! a client process on two addresses of 127.0.117.0/24 or 127.0.119.0/24: `rping` (10 pings
//! with data verification: SEND, RDMA READ and WRITE), `ucmatose` (connect, SENDs both ways,
//! disconnect), `udaddy` (UD ids: SIDR through rdma_cm, datagrams both ways), `rdma_server`/
//! `rdma_client` (synchronous ids: rdma_create_ep, rdma_get_request), `mckey` (a sender and
//! a receiver joined to a multicast group through rdma_cm, on 127.0.160.0/24) and perftest's
//! `ib_send_bw`, `ib_write_bw`, `ib_write_lat` and `ib_read_lat` with `-R` (their connection
//! through rdma_cm). Skipped, saying why, only when a tool is not installed (CI installs
//! them). Every program is killed after a deadline.

mod exec_support;
use exec_support::*;
use std::process::{Child, Output};
use std::time::Duration;

/// The server while the client runs: killed (by its pid) if the test panics first, so that
/// no server outlives its test holding its address.
struct Reaper(Option<Child>);

impl Reaper {
    fn exited(&mut self) -> bool {
        self.0
            .as_mut()
            .is_none_or(|c| c.try_wait().unwrap().is_some())
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits (up to 10 s) until a device owns `ip`'s RoCEv2 port (/proc/net/udp), then a moment
/// for the server's rdma_listen to follow its device's opening.
fn wait_server(ip: &str) {
    wait_device(ip.parse().unwrap());
    std::thread::sleep(Duration::from_millis(300));
}

/// Runs `server` on `sip` and `client` on `cip`; both must exit 0. Returns their stdouts.
/// A client that fails while the server still runs is started again (twice at most): on a
/// loaded machine the server may open its device well before it listens, and a REQ before
/// `rdma_listen` is rejected (REJ, no listener), as with the kernel.
fn pair(sip: &str, server: &[&str], cip: &str, client: &[&str]) -> (String, String) {
    let mut s = Reaper(Some(exec(sip, server).spawn().unwrap()));
    wait_server(sip);
    let mut attempts = 0;
    let c = loop {
        attempts += 1;
        let c = exec(cip, client).spawn().unwrap();
        if attempts == 3 {
            break wait(c, Duration::from_secs(30), client[0]);
        }
        // A client whose first REQ came before `rdma_listen` is rejected (REJ 8) and exits;
        // it is started again while the server waits. (perftest's second connection, on
        // the same port after its server replaced the listener, is held for the new one:
        // tests/cm_relisten.rs.)
        match wait_or_kill(c, Duration::from_secs(15)) {
            Some(c) if c.status.success() || s.exited() => break c,
            None if s.exited() => panic!("{}: hung, and the server exited", client[0]),
            _ => std::thread::sleep(Duration::from_millis(500)),
        }
    };
    let s = wait(s.0.take().unwrap(), Duration::from_secs(30), server[0]);
    let text = |o: &Output| String::from_utf8_lossy(&o.stdout).into_owned();
    let report = format!(
        "client ({}):\n{}{}\nserver ({}):\n{}{}",
        c.status,
        text(&c),
        String::from_utf8_lossy(&c.stderr),
        s.status,
        text(&s),
        String::from_utf8_lossy(&s.stderr)
    );
    let race = rping_exit_race(server[0], &s);
    if race {
        println!(
            "{}: the server hit rping 44's exit race after its last event",
            server[0]
        );
    }
    assert!(
        c.status.success() && (s.status.success() || race),
        "{report}"
    );
    (text(&s), text(&c))
}

/// True when `program`'s end is rping's own exit race (rdma-core before f3ae6534a, "rping:
/// terminate CM event thread before exiting", 2025; Debian 12 ships 44): its main thread
/// destroys the CM event channel while the CM thread, done with the DISCONNECTED event, has
/// not yet called `rdma_get_cm_event` again; that call then fails with EBADF and the thread
/// exits the process with 255, with kernel rdma_cm as with softroce's. Only that end: the
/// server saw the disconnect, then `rdma_get_cm_event: Bad file descriptor`, status 255.
fn rping_exit_race(program: &str, o: &Output) -> bool {
    let stderr = String::from_utf8_lossy(&o.stderr);
    program == "rping"
        && o.status.code() == Some(255)
        && stderr.contains("server DISCONNECT EVENT...")
        && stderr
            .trim_end()
            .ends_with("rdma_get_cm_event: Bad file descriptor")
}

#[test]
fn rping_ten_pings_with_verification() {
    if !have("rping") {
        println!("SKIPPED: rping not installed (apt-get install rdmacm-utils)");
        return;
    }
    let (s, c) = pair(
        "127.0.117.11",
        &[
            "rping",
            "-s",
            "-a",
            "127.0.117.11",
            "-p",
            "7480",
            "-C",
            "10",
            "-v",
        ],
        "127.0.117.12",
        &[
            "rping",
            "-c",
            "-a",
            "127.0.117.11",
            "-p",
            "7480",
            "-C",
            "10",
            "-v",
            "-V",
        ],
    );
    assert!(c.contains("ping data: rdma-ping-9: "), "{c}");
    assert!(s.contains("server ping data: rdma-ping-9: "), "{s}");
}

#[test]
fn ucmatose_connects_transfers_and_disconnects() {
    if !have("ucmatose") {
        println!("SKIPPED: ucmatose not installed (apt-get install rdmacm-utils)");
        return;
    }
    let (s, c) = pair(
        "127.0.117.21",
        &["ucmatose", "-p", "7481"],
        "127.0.117.22",
        &["ucmatose", "-s", "127.0.117.21", "-p", "7481"],
    );
    for out in [&s, &c] {
        assert!(out.contains("data transfers complete"), "{out}");
        assert!(out.contains("return status 0"), "{out}");
    }
    assert!(s.contains("disconnected"), "{s}");
}

/// Runs perftest's `tool -R -n 100` (server on `sip`, client on `cip`); both must print the
/// result line of `bytes` × 100 iterations (`ib_*_lat` reports on the client only).
fn perftest(tool: &str, port: &str, sip: &str, cip: &str, bytes: &str, server_reports: bool) {
    if !have(tool) {
        println!("SKIPPED: {tool} not installed (apt-get install perftest)");
        return;
    }
    let common = [tool, "-R", "-d", "softroce0", "-p", port, "-n", "100"];
    let mut client = common.to_vec();
    client.push(sip);
    let (s, c) = pair(sip, &common, cip, &client);
    let reported = |out: &str| {
        out.lines()
            .any(|l| l.split_whitespace().take(2).eq([bytes, "100"]))
    };
    assert!(reported(&c), "{c}");
    assert!(!server_reports || reported(&s), "{s}");
}

#[test]
fn ib_send_bw_over_rdma_cm() {
    perftest(
        "ib_send_bw",
        "7482",
        "127.0.117.31",
        "127.0.117.32",
        "65536",
        true,
    );
}

#[test]
fn ib_write_bw_over_rdma_cm() {
    perftest(
        "ib_write_bw",
        "7483",
        "127.0.119.31",
        "127.0.119.32",
        "65536",
        true,
    );
}

#[test]
fn ib_write_lat_over_rdma_cm() {
    perftest(
        "ib_write_lat",
        "7484",
        "127.0.119.33",
        "127.0.119.34",
        "2",
        true,
    );
}

#[test]
fn ib_read_lat_over_rdma_cm() {
    perftest(
        "ib_read_lat",
        "7485",
        "127.0.119.35",
        "127.0.119.36",
        "2",
        false,
    );
}

#[test]
fn udaddy_resolves_ud_and_exchanges_datagrams() {
    if !have("udaddy") {
        println!("SKIPPED: udaddy not installed (apt-get install rdmacm-utils)");
        return;
    }
    // SIDR_REQ/SIDR_REP on the UDP port space (udaddy's port is 7174), then 10 datagrams
    // each way, the server answering through an AH made from the receive's GRH.
    let (s, c) = pair(
        "127.0.119.41",
        &["udaddy", "-c", "2"],
        "127.0.119.42",
        &["udaddy", "-s", "127.0.119.41", "-c", "2"],
    );
    for out in [&s, &c] {
        assert!(out.contains("data transfers complete"), "{out}");
        assert!(out.contains("return status 0"), "{out}");
    }
    assert!(s.contains("sending replies"), "{s}");
}

#[test]
fn rdma_server_and_rdma_client_synchronous() {
    if !have("rdma_server") || !have("rdma_client") {
        println!("SKIPPED: rdma_server/rdma_client not installed (apt-get install rdmacm-utils)");
        return;
    }
    // Synchronous ids (rdma_create_ep, rdma_get_request; every call waits for its event),
    // one inline SEND each way from unregistered buffers, then rdma_disconnect.
    let (s, c) = pair(
        "127.0.119.51",
        &["rdma_server", "-p", "7486"],
        "127.0.119.52",
        &["rdma_client", "-s", "127.0.119.51", "-p", "7486"],
    );
    assert!(s.contains("rdma_server: end 0"), "{s}");
    assert!(c.contains("rdma_client: end 0"), "{c}");
}

#[test]
fn mckey_sender_to_receiver_through_a_multicast_group() {
    if !have("mckey") {
        println!("SKIPPED: mckey not installed (apt-get install rdmacm-utils)");
        return;
    }
    // Both join 239.160.0.1 through rdma_cm (MULTICAST_JOIN, the QP attached to
    // ::ffff:239.160.0.1); after its 3 s pause the sender posts 10 SENDs of 100 bytes to
    // DestQP 0xFFFFFF, the receiver polls its 10 receives; both leave the group.
    let (rip, sip, group) = ("127.0.160.11", "127.0.160.12", "239.160.0.1");
    let mut r = Reaper(Some(
        exec(rip, &["mckey", "-m", group, "-b", rip])
            .spawn()
            .unwrap(),
    ));
    wait_server(rip);
    let s = wait(
        exec(sip, &["mckey", "-m", group, "-b", sip, "-s"])
            .spawn()
            .unwrap(),
        Duration::from_secs(30),
        "mckey -s",
    );
    let r = wait(r.0.take().unwrap(), Duration::from_secs(30), "mckey");
    let text = |o: &Output| String::from_utf8_lossy(&o.stdout).into_owned();
    let report = format!(
        "sender ({}):\n{}{}\nreceiver ({}):\n{}{}",
        s.status,
        text(&s),
        String::from_utf8_lossy(&s.stderr),
        r.status,
        text(&r),
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(s.status.success() && r.status.success(), "{report}");
    for out in [text(&s), text(&r)] {
        assert!(
            out.contains("mckey: joined dgid: ::ffff:239.160.0.1 mlid 0x0 sl 0"),
            "{report}"
        );
        assert!(out.contains("data transfers complete"), "{report}");
        assert!(out.contains("return status 0"), "{report}");
    }
    assert!(text(&s).contains("initiating data transfers"), "{report}");
    assert!(text(&r).contains("receiving data transfers"), "{report}");
}

// Issue 25 item 3: an rdma_cm connect to an address with no RoCE device (nothing on UDP 4791
// of 127.0.117.91) is RDMA_CM_EVENT_UNREACHABLE from the ICMP port unreachable its REQ draws,
// not after the REQ's 15 retries (77 s): the capture of the client's device holds exactly
// one REQ, and none of the retransmissions the first response timeout (4.3 s) would bring.
#[test]
fn ucmatose_to_an_address_without_a_device_is_unreachable_from_icmp() {
    if !have("ucmatose") {
        println!("SKIPPED: ucmatose not installed (apt-get install rdmacm-utils)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("softroce-cm-icmp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("client.pcap");
    let mut cmd = exec_pcap(
        "127.0.117.90",
        &pcap,
        &["ucmatose", "-s", "127.0.117.91", "-p", "7499"],
    );
    cmd.env("SOFTROCE_LOG", "softroce::cm=info");
    let out = wait(cmd.spawn().unwrap(), Duration::from_secs(60), "ucmatose");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("event: RDMA_CM_EVENT_UNREACHABLE"),
        "{}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // librdmacm.so.1's own copy of the CM logs through SOFTROCE_LOG too.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("softroce::cm: connect to 127.0.117.91: unreachable"),
        "{err}"
    );
    let frames = decode(&pcap);
    let reqs = frames
        .lines()
        .filter(|l| l.contains("> 127.0.117.91:4791") && l.contains("qp=0x1 "))
        .count();
    assert_eq!(reqs, 1, "REQs sent:\n{frames}");
    let _ = std::fs::remove_dir_all(&dir);
}
