//! rdma_cm across `fork` (tests/c/cm_fork.c, through `softroce exec` on 127.0.160.31 (the
//! parent's listener), .32 and .33 (the child's two sides)): a forked child's librdmacm
//! state is its own, not a copy of the parent's, whose devices and driver threads are the
//! parent's: its bind to the parent's device fails (it used to succeed on the copy), it
//! connects and accepts between devices of its own, and the parent's listener still takes a
//! connection after the child exits. Skipped, saying why, only when librdmacm-dev or a C
//! compiler is missing (CI installs them).

mod exec_support;
use exec_support::*;
use std::time::Duration;

#[test]
fn a_forked_child_uses_rdma_cm_on_devices_of_its_own() {
    let dir = std::env::temp_dir().join(format!("softroce-cm-fork-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let Some(exe) = compile_c("cm_fork", &dir) else {
        return;
    };
    let ips = ["127.0.160.31", "127.0.160.32", "127.0.160.33"];
    let out = wait(
        exec(
            &ips.join(","),
            &[
                exe.as_os_str(),
                ips[0].as_ref(),
                ips[1].as_ref(),
                ips[2].as_ref(),
            ],
        )
        .spawn()
        .unwrap(),
        Duration::from_secs(60),
        "cm_fork",
    );
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout);
    let report = format!(
        "{}\n{text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{report}");
    assert!(text.lines().any(|l| l == "cm_fork: end 0"), "{report}");
    // Every check ran, the child's included.
    assert_eq!(
        text.lines().filter(|l| l.starts_with("ok   ")).count(),
        18,
        "{report}"
    );
    println!("{text}");
}
