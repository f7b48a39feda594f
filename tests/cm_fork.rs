//! rdma_cm across `fork` (tests/c/cm_fork.c, through `softroce exec` on 127.0.160.31 (the
//! parent's listener), .32 and .33 (the child's two sides)): a forked child's librdmacm
//! state is its own, not a copy of the parent's, whose devices and driver threads are the
//! parent's: its bind to the parent's device fails (it used to succeed on the copy), it
//! connects and accepts between devices of its own, and the parent's listener still takes a
//! connection after the child exits. Skipped, saying why, only when librdmacm-dev or a C
//! compiler is missing (CI installs them).

mod exec_support;
use exec_support::*;

#[test]
fn a_forked_child_uses_rdma_cm_on_devices_of_its_own() {
    // 18 checks: the child's included (its failures also fail the parent's check of it).
    if let Some(text) = run_c_checks(
        "cm_fork",
        "127.0.160.31,127.0.160.32,127.0.160.33",
        &["127.0.160.31", "127.0.160.32", "127.0.160.33"],
        18,
    ) {
        println!("{text}");
    }
}
