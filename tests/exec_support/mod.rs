//! Helpers shared by the tests that run C programs through `softroce exec` (capi_exec,
//! capi_tools, cm_seed, cm_tools): finding a tool, starting it on a device address, waiting
//! for it with a deadline, and waiting until a device owns an address's RoCEv2 port.

#![allow(dead_code)] // each test binary uses a different subset

use std::ffi::OsStr;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `softroce` binary under test.
pub const SOFTROCE: &str = env!("CARGO_BIN_EXE_softroce");

/// True when `tool` is installed (Debian's packages put them in /usr/bin).
pub fn have(tool: &str) -> bool {
    ["/usr/bin", "/bin", "/usr/local/bin"]
        .iter()
        .any(|d| Path::new(d).join(tool).exists())
}

/// `softroce exec --ip IP -- ARGS…`, stdout and stderr captured.
pub fn exec<S: AsRef<OsStr>>(ip: &str, args: &[S]) -> Command {
    let mut c = Command::new(SOFTROCE);
    c.args(["exec", "--ip", ip, "--"]).args(args);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// Waits for `child` up to `limit`, killing it past that.
pub fn wait(mut child: Child, limit: Duration, what: &str) -> Output {
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

/// Waits for `child` up to `limit`; past that kills it (by its pid) and returns None.
pub fn wait_or_kill(mut child: Child, limit: Duration) -> Option<Output> {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(child.wait_with_output().unwrap())
}

/// Waits (up to 10 s) until a softroce device owns `ip`'s RoCEv2 port, read from
/// /proc/net/udp (binding the port to probe it could steal it from the server).
pub fn wait_device(ip: Ipv4Addr) {
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

/// Compiles tests/c/`name`.c against the installed rdma-core headers (`cc -Wall -o DIR/name
/// … -lrdmacm -libverbs`) into `dir`. None, saying why on stdout, when librdmacm-dev or a C
/// compiler is missing; a compile error fails the test.
pub fn compile_c(name: &str, dir: &Path) -> Option<std::path::PathBuf> {
    if !Path::new("/usr/include/rdma/rdma_cma.h").exists() {
        println!("SKIPPED: librdmacm-dev is not installed (apt-get install librdmacm-dev)");
        return None;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let exe = dir.join(name);
    let Ok(out) = Command::new("cc")
        .args(["-Wall", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(["-lrdmacm", "-libverbs"])
        .output()
    else {
        println!("SKIPPED: no C compiler (cc)");
        return None;
    };
    assert!(
        out.status.success(),
        "cc {name}.c failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(exe)
}
