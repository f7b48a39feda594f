//! rdma-core's pyverbs test suite (Debian's python3-pyverbs) through `softroce exec`, by
//! `scripts/pyverbs.sh --check`: 0 errors, 0 failures, and at least the 86 tests kernel rxe
//! 6.1 passes (docs/pyverbs.md). About a second. Skipped, saying why, when the suite or
//! pyverbs is not installed (the script exits 77). Killed after a deadline.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs scripts/`script` with `args` and `$SOFTROCE` set to this build's softroce, killed
/// after `limit`; asserts it exited 0 and prints its last line. Exit 77 is a skip (printed
/// with the script's reason).
fn run_check_script(script: &str, args: &[&str], limit: Duration, what: &str) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts")
        .join(script);
    let mut child = Command::new("bash")
        .arg(&script)
        .args(args)
        .env("SOFTROCE", env!("CARGO_BIN_EXE_softroce"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    if out.status.code() == Some(77) {
        println!("SKIPPED: {text}");
        return;
    }
    assert!(
        out.status.success(),
        "{what} ({}):\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{}", text.lines().last().unwrap_or(""));
}

#[test]
fn pyverbs_suite_through_softroce_exec() {
    run_check_script(
        "pyverbs.sh",
        &["--check", "--ip", "127.0.121.9"],
        Duration::from_secs(120),
        "pyverbs",
    );
}

/// pyverbs' rdma_cm tests (test_rdmacm), unmodified, by `scripts/pyverbs-rdmacm.sh --check`:
/// in a private network namespace the script makes, softroce0 on 127.0.0.1 (the first
/// address of lo, the netdev `softroce exec` shows for it in /sys/class/infiniband, where the
/// tests look); each test's passive and active processes and the test runner share
/// softroce0, as they would share rxe0. All 10 pass (docs/pyverbs.md, "rdma_cm"). Skipped,
/// saying why, without root or pyverbs.
#[test]
fn pyverbs_rdmacm_tests_in_a_private_namespace() {
    run_check_script(
        "pyverbs-rdmacm.sh",
        &["--check"],
        Duration::from_secs(180),
        "pyverbs rdma_cm",
    );
}
