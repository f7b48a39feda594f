//! No silent hang (issue 22): a panic in a thread softroce starts fails what waits on it, in
//! the C libraries. tests/c/cm_panic.c, through `softroce exec`, with the test hook
//! `SOFTROCE_TEST_PANIC` (softroce::net::panic) making one thread panic 500 ms after it
//! starts: librdmacm.so.1's CM driver thread (`rdmacm`), then libibverbs.so.1's device
//! driver thread (`device`). A listener blocked in rdma_get_cm_event gets DEVICE_REMOVAL
//! (status -EIO), as does a listener on the wildcard address; a later bind fails with EIO,
//! and so does a synchronous listener's rdma_get_request; with the device's thread,
//! ibv_get_cq_event fails with EIO too and IBV_EVENT_DEVICE_FATAL is raised. Each run must
//! report the panic on stderr. The 60 s limit only ends a run that hangs. Skipped, saying
//! why, only when librdmacm-dev or a C compiler is missing (CI installs them).

mod exec_support;
use exec_support::*;
use std::time::Duration;

/// Runs cm_panic.c on `ip` with `SOFTROCE_TEST_PANIC=<thread>:500` and checks its report.
fn panic_in(thread: &str, ip: &str, checks: usize, stderr_line: &str) {
    let dir =
        std::env::temp_dir().join(format!("softroce-cm_panic-{thread}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let Some(exe) = compile_c("cm_panic", &dir) else {
        return;
    };
    let mut cmd = exec(ip, &[exe.as_os_str(), ip.as_ref(), thread.as_ref()]);
    cmd.env("SOFTROCE_TEST_PANIC", format!("{thread}:500"));
    let out = wait(cmd.spawn().unwrap(), Duration::from_secs(60), "cm_panic");
    let _ = std::fs::remove_dir_all(&dir);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    let report = format!("{}\n{stdout}{stderr}", out.status);
    assert!(out.status.success(), "{report}");
    assert!(stdout.lines().any(|l| l == "cm_panic: end 0"), "{report}");
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("ok   ")).count(),
        checks,
        "{report}"
    );
    assert!(
        stderr.lines().any(|l| l.starts_with("softroce: ")
            && l.contains(stderr_line)
            && l.contains("panicked: panic injected by a test")),
        "{report}"
    );
}

#[test]
fn a_librdmacm_driver_panic_fails_the_devices_ids() {
    panic_in(
        "rdmacm",
        "127.0.226.1",
        4,
        "librdmacm CM driver thread of device softroce0",
    );
}

#[test]
fn a_device_driver_panic_fails_rdma_cm_and_the_completion_channel() {
    panic_in(
        "device",
        "127.0.226.2",
        6,
        "device softroce0 driver thread panicked",
    );
}
