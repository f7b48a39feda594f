//! A listener replaced between two connections (issue 16; perftest `-R` does this: it
//! destroys its control connection's listener, then listens on the same port for the data
//! connection, and its client's REQ may come in between). tests/c/cm_relisten.c, through
//! `softroce exec` with a server device on 127.0.160.25 and a client device on 127.0.160.26
//! in one process: the REQ that comes between the two listeners is held and becomes the new
//! listener's CONNECT_REQUEST; after 3 s without a listener a REQ gets REJ 8, the kernel's
//! answer; a channel destroyed twice is refused with EBADF. Skipped, saying why, only when
//! librdmacm-dev or a C compiler is missing (CI installs them).

mod exec_support;
use exec_support::*;
use std::time::Duration;

#[test]
fn a_req_between_two_listeners_goes_to_the_second() {
    let dir = std::env::temp_dir().join(format!("softroce-cm-relisten-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let Some(exe) = compile_c("cm_relisten", &dir) else {
        return;
    };
    let (server, client) = ("127.0.160.25", "127.0.160.26");
    let out = wait(
        exec(
            &format!("{server},{client}"),
            &[exe.as_os_str(), server.as_ref(), client.as_ref()],
        )
        .spawn()
        .unwrap(),
        Duration::from_secs(60),
        "cm_relisten",
    );
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout);
    let report = format!(
        "{}\n{text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{report}");
    assert!(text.lines().any(|l| l == "cm_relisten: end 0"), "{report}");
    assert_eq!(
        text.lines().filter(|l| l.starts_with("ok   ")).count(),
        6,
        "{report}"
    );
    println!("{text}");
}
