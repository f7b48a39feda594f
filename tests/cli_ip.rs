//! `--ip` on the subcommands that open a device: an explicit `--ip` wins, else the first
//! address of `$SOFTROCE_IP` (`softroce::net::discover`), else 127.0.0.1; a `$SOFTROCE_IP` that is not an address is an error.
//! `devinfo` opens each device it describes (UDP port 4791 on its address); pingpong, perf
//! and target share the same `device_ip` helper and each declares `--ip` (checked through
//! `--help`).

use std::process::Command;

fn softroce(args: &[&str], env: Option<&str>) -> (bool, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_softroce"));
    c.args(args).env_remove("SOFTROCE_IP");
    if let Some(v) = env {
        c.env("SOFTROCE_IP", v);
    }
    let o = c.output().expect("runs");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn devinfo_takes_ip_then_env_then_localhost() {
    // 127.0.0.1 may be in use by a device of another program on this host: then the error
    // names it.
    let (ok, out, err) = softroce(&["devinfo", "-v"], None);
    assert!(
        out.contains("::ffff:127.0.0.1, RoCE v2") || (!ok && err.contains("on 127.0.0.1:4791")),
        "{out}{err}"
    );
    let (ok, out, _) = softroce(&["devinfo", "-v"], Some("127.0.24.9"));
    assert!(ok);
    assert!(out.contains("::ffff:127.0.24.9, RoCE v2"), "{out}");
    let (ok, out, _) = softroce(
        &["devinfo", "-v", "--ip", "127.0.24.10"],
        Some("127.0.24.9"),
    );
    assert!(ok);
    assert!(out.contains("::ffff:127.0.24.10, RoCE v2"), "{out}");
    assert!(!out.contains("127.0.24.9"), "{out}");
    let (ok, _, err) = softroce(&["devinfo"], Some("not-an-ip"));
    assert!(!ok);
    assert!(
        err.contains("SOFTROCE_IP: \"not-an-ip\" is not an IP address"),
        "{err}"
    );
    // A list, as the ibverbs-shaped API and the C library read it: every device, as
    // ibv_devinfo prints every device it finds.
    let (ok, out, err) = softroce(&["devinfo", "-v"], Some("127.0.24.11, 127.0.24.12"));
    assert!(ok, "{err}");
    assert!(out.contains("hca_id:\tsoftroce0"), "{out}");
    assert!(out.contains("::ffff:127.0.24.11, RoCE v2"), "{out}");
    assert!(out.contains("hca_id:\tsoftroce1"), "{out}");
    assert!(out.contains("::ffff:127.0.24.12, RoCE v2"), "{out}");
}

#[test]
fn every_device_subcommand_has_ip() {
    for sub in [
        &["devinfo", "--help"][..],
        &["pingpong", "--help"],
        &["perf", "write_bw", "--help"],
        &["target", "--help"],
    ] {
        let (ok, out, err) = softroce(sub, None);
        assert!(ok, "{sub:?}: {err}");
        assert!(out.contains("--ip <IP>"), "{sub:?}: {out}");
        assert!(out.contains("SOFTROCE_IP"), "{sub:?}: {out}");
    }
}
