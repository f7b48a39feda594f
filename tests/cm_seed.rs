//! Acceptance 1 of issue 16: the seed's two rdma_cm programs (tests/c/seed, verbatim from
//! "RDMA and RoCE in practice"), compiled with the seed's own command
//! (`cc -o rdma_server rdma_server.c -lrdmacm -libverbs`) against the installed rdma-core
//! headers, run unmodified through `softroce exec` on softroce's librdmacm.so.1 and
//! libibverbs.so.1: the server on 127.0.117.1, the client on 127.0.117.2 connecting to it
//! with REQ/REP/RTU over QP1, one RDMA WRITE into the buffer the server announced in its
//! REP's private data, then DREQ/DREP. Skipped, saying why, only when librdmacm-dev or a C
//! compiler is missing (CI installs them). Every program is killed after a deadline.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const SOFTROCE: &str = env!("CARGO_BIN_EXE_softroce");
const SERVER_IP: &str = "127.0.117.1";
const CLIENT_IP: &str = "127.0.117.2";

fn exec(ip: &str, prog: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(SOFTROCE);
    c.args(["exec", "--ip", ip, "--"]).arg(prog).args(args);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// Waits for `child` up to `limit`, killing it past that.
fn wait(mut child: Child, limit: Duration, what: &str) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what}: still running after {limit:?}; stdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Compiles the seed program `name` with the seed's command into `dir`; None when the
/// headers or a compiler are missing.
fn compile(name: &str, dir: &Path) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/seed/{name}.c"));
    let exe = dir.join(name);
    let out = Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .args(["-lrdmacm", "-libverbs"])
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "cc {name}.c failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(exe)
}

/// Waits (up to 10 s) until a softroce device owns `ip`'s RoCEv2 port, read from
/// /proc/net/udp (binding the port to probe it could steal it from the server): the
/// server's librdmacm opened its device in rdma_listen.
fn wait_device(ip: Ipv4Addr) {
    // /proc/net/udp writes the address as the hex of its in-memory (network-order) u32.
    let want = format!("{:08X}:12B7", u32::from_ne_bytes(ip.octets()));
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let table = std::fs::read_to_string("/proc/net/udp").unwrap_or_default();
        if table
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some(&want))
        {
            return;
        }
        assert!(Instant::now() < end, "no device on {ip} within 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn seed_rdma_server_and_client_run_unmodified() {
    if !Path::new("/usr/include/rdma/rdma_cma.h").exists()
        || !Path::new("/usr/lib/x86_64-linux-gnu/librdmacm.so").exists()
    {
        println!("SKIPPED: librdmacm-dev is not installed (apt-get install librdmacm-dev)");
        return;
    }
    let lib = Path::new(SOFTROCE)
        .parent()
        .unwrap()
        .join("softroce-libs/librdmacm.so.1");
    assert!(
        lib.exists(),
        "{} missing: build softroce-rdmacm (cargo build)",
        lib.display()
    );
    let dir = std::env::temp_dir().join(format!("softroce-cm-seed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (Some(server), Some(client)) = (compile("rdma_server", &dir), compile("rdma_client", &dir))
    else {
        println!("SKIPPED: no C compiler (cc)");
        return;
    };
    let port = "7471";

    let srv = exec(SERVER_IP, &server, &[port]).spawn().unwrap();
    wait_device(SERVER_IP.parse().unwrap());
    // rdma_listen opens the device, then listens: a moment for the second step.
    std::thread::sleep(Duration::from_millis(300));
    let cli = exec(CLIENT_IP, &client, &[SERVER_IP, port])
        .spawn()
        .unwrap();
    let c = wait(cli, Duration::from_secs(20), "rdma_client");
    let s = wait(srv, Duration::from_secs(20), "rdma_server");
    let _ = std::fs::remove_dir_all(&dir);

    let (cout, sout) = (
        String::from_utf8_lossy(&c.stdout),
        String::from_utf8_lossy(&s.stdout),
    );
    let report = format!(
        "client ({}):\n{cout}{}\nserver ({}):\n{sout}{}",
        c.status,
        String::from_utf8_lossy(&c.stderr),
        s.status,
        String::from_utf8_lossy(&s.stderr)
    );
    assert!(c.status.success() && s.status.success(), "{report}");
    assert!(
        cout.lines().any(|l| l == "[client] write done, status=0"),
        "{report}"
    );
    assert!(
        sout.lines().any(|l| l
            == "[server] received: 'Hello RDMA from client! Data lands directly in server memory.'"),
        "{report}"
    );
    assert!(
        sout.lines()
            .any(|l| l == format!("[server] listening on port {port}")),
        "{report}"
    );
    println!("{cout}{sout}");
}
