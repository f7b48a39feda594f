//! A killed rdma_cm process ends its connections for its peers (issue 25 item 1), as the
//! kernel's CM does for a process that dies: `rping -s` through `softroce exec` is killed
//! (SIGKILL, then in a second run SIGINT, the Ctrl-C of a terminal) while an `rping -c` on
//! another address pings it. The client must get RDMA_CM_EVENT_DISCONNECTED and exit, and
//! its capture must hold the DREQ that the server's stand-in (`softroce::net::standin`)
//! sent from the server's address after the server died: a dead process sends nothing
//! itself. Skipped, saying why, only when rping is not installed (CI installs it).

mod exec_support;
use exec_support::*;
use softroce::net::pcap_reader::CaptureReader;
use softroce::wire::RocePacket;
use softroce::wire::ip_udp::parse_frame;
use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::os::unix::process::CommandExt;
use std::process::Child;
use std::sync::mpsc;
use std::time::Duration;

/// The CM attribute ID of a DREQ (IBTA 16.7.1 table 185).
const ATTR_DREQ: u16 = 0x15;

/// The server, killed by its pid if the test panics first.
struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// DREQs in `pcap` from `from` (the datagrams to QP1 whose MAD is a DREQ).
fn dreqs_from(pcap: &std::path::Path, from: IpAddr) -> usize {
    let reader = CaptureReader::open(pcap).expect("open the client's capture");
    let mut n = 0;
    for f in reader {
        let f = f.expect("a frame");
        let Ok(link) = f.link else { continue };
        let Ok(d) = parse_frame(&f.data, link) else {
            continue;
        };
        let Ok(p) = RocePacket::parse(d.payload) else {
            continue;
        };
        // The MAD header's attribute ID is at bytes 16..18.
        if d.src == from
            && p.repr.bth.dest_qpn == 1
            && p.payload.get(16..18) == Some(&ATTR_DREQ.to_be_bytes()[..])
        {
            n += 1;
        }
    }
    n
}

fn killed_server_disconnects_its_client(sig: libc::c_int, sip: &str, cip: &str, port: &str) {
    if !have("rping") {
        println!("SKIPPED: rping not installed (apt-get install rdmacm-utils)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("softroce-cm-kill-{}-{sig}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("client.pcap");
    let mut cmd = exec(
        sip,
        &["rping", "-s", "-a", sip, "-p", port, "-C", "100000000"],
    );
    // SIGINT at its default action in the server, as in a terminal's foreground job: a test
    // run started in the background without job control (`cargo test &` in a script, nohup)
    // inherits SIGINT ignored, exec keeps it so, and the server would never die of it.
    // SAFETY: signal(2) is async-signal-safe; the closure touches nothing else.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let server = Kill(cmd.spawn().unwrap());
    wait_device(sip.parse().unwrap());
    // The client pings until the server dies. A client whose REQ came before the server's
    // rdma_listen is rejected, as with the kernel, and started again (at most 3 times).
    let mut attempt = 0;
    let (client, lines) = loop {
        attempt += 1;
        let mut c = exec_pcap(
            cip,
            &pcap,
            &[
                "rping",
                "-c",
                "-a",
                sip,
                "-p",
                port,
                "-C",
                "100000000",
                "-v",
            ],
        )
        .spawn()
        .unwrap();
        let (tx, rx) = mpsc::channel();
        let out = c.stdout.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(l) if l.contains("ping data") => break (c, rx),
            other => {
                let o = wait(c, Duration::from_secs(30), "rping -c");
                assert!(
                    attempt < 3,
                    "the client never pinged ({other:?}): {}",
                    String::from_utf8_lossy(&o.stderr)
                );
                std::thread::sleep(Duration::from_millis(300));
            }
        }
    };
    // SAFETY: kill(2) on the pid of our own child, which has not been waited for.
    assert_eq!(unsafe { libc::kill(server.0.id() as libc::pid_t, sig) }, 0);
    let out = wait(
        client,
        Duration::from_secs(60),
        "rping -c after its server died",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let pings = lines.try_iter().count();
    assert!(
        stderr.contains("client DISCONNECT EVENT"),
        "the client saw no DISCONNECTED ({} more ping lines); status {}; stderr:\n{stderr}",
        pings,
        out.status
    );
    let dreqs = dreqs_from(&pcap, sip.parse().unwrap());
    assert!(
        dreqs >= 1,
        "no DREQ from the dead server {sip} in the client's capture:\n{}",
        decode(&pcap)
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_server_killed_with_sigkill_disconnects_its_client() {
    killed_server_disconnects_its_client(libc::SIGKILL, "127.0.123.1", "127.0.123.2", "7481");
}

#[test]
fn a_server_killed_with_sigint_disconnects_its_client() {
    killed_server_disconnects_its_client(libc::SIGINT, "127.0.123.3", "127.0.123.4", "7482");
}
