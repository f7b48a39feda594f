//! Acceptance 1 of issue 16: the seed's two rdma_cm programs (tests/c/seed, verbatim from
//! "RDMA and RoCE in practice"), compiled with the seed's own command
//! (`cc -o rdma_server rdma_server.c -lrdmacm -libverbs`) against the installed rdma-core
//! headers, run unmodified through `softroce exec` on softroce's librdmacm.so.1 and
//! libibverbs.so.1: the server on 127.0.117.1, the client on 127.0.117.2 connecting to it
//! with REQ/REP/RTU over QP1, one RDMA WRITE into the buffer the server announced in its
//! REP's private data, then DREQ/DREP. Skipped, saying why, only when librdmacm-dev or a C
//! compiler is missing (CI installs them). Every program is killed after a deadline.

mod exec_support;
use exec_support::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const SERVER_IP: &str = "127.0.117.1";
const CLIENT_IP: &str = "127.0.117.2";

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

    let r = server_then_client(
        SERVER_IP,
        &[server.as_os_str(), port.as_ref()],
        CLIENT_IP,
        &[client.as_os_str(), SERVER_IP.as_ref(), port.as_ref()],
        Duration::from_secs(20),
        ("rdma_server", "rdma_client"),
    );
    let _ = std::fs::remove_dir_all(&dir);
    let (cout, sout, report) = (&r.client, &r.server, &r.report);
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
