//! `softroce exec`'s view of the devices where the kernel's are (issue 21 item 2): the
//! program finds `/dev/infiniband/uverbs<i>` (character devices it may open read-write) and
//! `/sys/class/infiniband/softroce<i>`, `/sys/class/infiniband_verbs/uverbs<i>` holding what
//! softroce's libibverbs reports, while the rest of `/sys` and `/dev` is the host's and the
//! host sees no change. As root (a mount namespace) and as an unprivileged user (a user
//! namespace too), and with UCX's `ucx_info -d`, which lists verbs transports only on devices
//! it finds there.
//!
//! Each test uses its own addresses (tests of one binary run in parallel, and a device binds
//! its address's port 4791).

mod exec_support;
use exec_support::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// What `/proc/self/mountinfo` (its mounts on /sys and /dev), `/sys/class` and `/dev` show
/// this (host) process.
fn host_state() -> (String, BTreeSet<String>, BTreeSet<String>) {
    let names = |d: &str| -> BTreeSet<String> {
        std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    // Only the mounts on /sys and /dev: other tests may mount elsewhere meanwhile (e.g.
    // /run/netns for `ip netns add`).
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| {
            let at = l.split(' ').nth(4).unwrap_or("");
            at.starts_with("/sys") || at.starts_with("/dev")
        })
        .collect::<Vec<_>>()
        .join("\n");
    (mounts, names("/sys/class"), names("/dev"))
}

/// The kernel's `%pI6` of a GID: eight groups of four hex digits.
fn gid_text(g: &softroce::verbs::Gid) -> String {
    g.0.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// ibv_devinfo's (and sysfs's) GUID: four groups of four hex digits.
fn guid_text(g: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        (g >> 48) & 0xffff,
        (g >> 32) & 0xffff,
        (g >> 16) & 0xffff,
        g & 0xffff
    )
}

/// The value after `key=` on a line of the script's output.
fn field<'a>(out: &'a str, key: &str) -> Option<&'a str> {
    let prefix = format!("{key}=");
    out.lines().find_map(|l| l.strip_prefix(prefix.as_str()))
}

/// The shell script the tests run inside: one `key=value` line per check.
const SCRIPT: &str = r#"
echo uid=$(id -u)
for n in uverbs0 uverbs1 rdma_cm; do
  f=/dev/infiniband/$n
  if [ -c $f ] && (exec 3<>$f) 2>/dev/null; then echo $n=char-rw; else echo $n=missing; fi
done
echo gid1=$(cat /sys/class/infiniband/softroce0/ports/1/gids/1)
echo gid0=$(cat /sys/class/infiniband/softroce1/ports/1/gids/0)
echo type1=$(cat /sys/class/infiniband/softroce0/ports/1/gid_attrs/types/1)
echo ndev1=$(cat /sys/class/infiniband/softroce0/ports/1/gid_attrs/ndevs/1)
echo state=$(cat /sys/class/infiniband/softroce0/ports/1/state)
echo guid=$(cat /sys/class/infiniband/softroce0/node_guid)
echo ibdev0=$(cat /sys/class/infiniband_verbs/uverbs0/ibdev)
echo ibdev1=$(cat /sys/class/infiniband_verbs/uverbs1/ibdev)
if [ -e /sys/class/net/lo ] && [ -r /sys/class/net/lo/mtu ]; then echo net=ok; else echo net=missing; fi
if [ -c /dev/null ] && [ -d /dev/shm ]; then echo dev=ok; else echo dev=missing; fi
"#;

/// Runs [`SCRIPT`] (then `extra`) through `softroce exec --ip ips`, as `prefix` (e.g.
/// `setpriv …`) when given, with the softroce binary `softroce` and `env`; 30 s at most.
fn run_script(
    prefix: &[&str],
    softroce: &Path,
    env: &[(&str, &Path)],
    ips: &str,
    extra: &str,
) -> Output {
    let (prog, args) = match prefix.split_first() {
        Some((p, rest)) => (PathBuf::from(p), {
            let mut a: Vec<String> = rest.iter().map(|s| s.to_string()).collect();
            a.push(softroce.display().to_string());
            a
        }),
        None => (softroce.to_path_buf(), Vec::new()),
    };
    let mut c = Command::new(prog);
    c.args(args)
        .args(["exec", "--ip", ips, "--", "sh", "-c"])
        .arg(format!("{SCRIPT}{extra}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    wait(
        c.spawn().unwrap(),
        Duration::from_secs(30),
        "softroce exec sh",
    )
}

/// Asserts what [`SCRIPT`] printed for devices on `ips` (two addresses).
fn check_view(out: &str, ips: [&str; 2]) {
    let ip0: std::net::IpAddr = ips[0].parse().unwrap();
    let ip1: std::net::IpAddr = ips[1].parse().unwrap();
    for n in ["uverbs0", "uverbs1", "rdma_cm"] {
        assert_eq!(
            field(out, n),
            Some("char-rw"),
            "/dev/infiniband/{n}:\n{out}"
        );
    }
    let want1 = gid_text(&softroce::verbs::gid_table(ip0)[1].gid);
    assert_eq!(field(out, "gid1"), Some(want1.as_str()), "{out}");
    // For 127.0.77.x: the IPv4-mapped address the kernel prints for rxe's RoCE v2 GID.
    assert!(
        want1.starts_with("0000:0000:0000:0000:0000:ffff:7f00:4d"),
        "{want1}"
    );
    let want0 = gid_text(&softroce::verbs::gid_table(ip1)[0].gid);
    assert_eq!(field(out, "gid0"), Some(want0.as_str()), "{out}");
    assert!(want0.starts_with("fe80:0000:0000:0000:"), "{want0}");
    assert_eq!(field(out, "type1"), Some("RoCE v2"), "{out}");
    assert_eq!(field(out, "ndev1"), Some("lo"), "{out}");
    assert_eq!(field(out, "state"), Some("4: ACTIVE"), "{out}");
    let guid = guid_text(softroce::verbs::node_guid(ip0));
    assert_eq!(field(out, "guid"), Some(guid.as_str()), "{out}");
    assert_eq!(field(out, "ibdev0"), Some("softroce0"), "{out}");
    assert_eq!(field(out, "ibdev1"), Some("softroce1"), "{out}");
    assert_eq!(field(out, "net"), Some("ok"), "/sys/class/net:\n{out}");
    assert_eq!(field(out, "dev"), Some("ok"), "/dev:\n{out}");
}

fn report(out: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// True when softroce exec said it could not make the view because namespaces are refused.
fn view_refused(out: &Output) -> bool {
    String::from_utf8_lossy(&out.stderr).contains("no /dev/infiniband and /sys/class/infiniband")
}

#[test]
fn exec_shows_the_devices_in_dev_and_sys_and_leaves_the_host_alone() {
    let before = host_state();
    let devinfo = if have("ibv_devinfo") {
        "echo devinfo_guid=$(ibv_devinfo -v -d softroce0 | sed -n 's/^\\s*node_guid:\\s*//p')\n"
    } else {
        println!("(ibv_devinfo not installed: node_guid checked against the engine only)");
        ""
    };
    let out = run_script(
        &[],
        Path::new(SOFTROCE),
        &[],
        "127.0.77.1,127.0.77.2",
        devinfo,
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", report(&out));
    if euid() == 0 {
        assert!(!view_refused(&out), "{}", report(&out));
    } else if view_refused(&out) {
        println!("SKIPPED: namespaces refused here: {}", report(&out));
        return;
    }
    check_view(&text, ["127.0.77.1", "127.0.77.2"]);
    // The program keeps the caller's uid (root stays root: CLONE_NEWNS alone).
    let uid = euid().to_string();
    assert_eq!(field(&text, "uid"), Some(uid.as_str()), "{text}");
    if !devinfo.is_empty() {
        // The same GUID through libibverbs' ibv_query_device as in sysfs.
        assert_eq!(
            field(&text, "devinfo_guid"),
            field(&text, "guid"),
            "{}",
            report(&out)
        );
    }
    let after = host_state();
    assert_eq!(before.0, after.0, "the host's mounts changed");
    assert_eq!(before.1, after.1, "the host's /sys/class changed");
    assert_eq!(before.2, after.2, "the host's /dev changed");
    // --no-view: the program sees the host's directories.
    let mut cmd = Command::new(SOFTROCE);
    cmd.args(["exec", "--no-view", "--ip", "127.0.77.1", "--", "sh", "-c"])
        .arg("test -e /sys/class/infiniband/softroce0 && echo seen || echo unseen")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let plain = wait(
        cmd.spawn().unwrap(),
        Duration::from_secs(30),
        "exec --no-view",
    );
    assert_eq!(String::from_utf8_lossy(&plain.stdout).trim(), "unseen");
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The command that runs its arguments as `nobody` (uid and gid 65534, no supplementary
/// groups).
fn as_nobody() -> [&'static str; 4] {
    [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ]
}

/// The softroce binary and its libraries where `nobody` may run and read them: in place
/// when it can, else copied to a fresh directory under the temporary directory (a checkout
/// under /root is not readable by other users). Returns the binary and the libraries'
/// directory.
fn softroce_for_nobody(dir: &Path) -> (PathBuf, PathBuf) {
    let bin = PathBuf::from(SOFTROCE);
    let libs = bin.parent().unwrap().join("softroce-libs");
    let probe = Command::new(as_nobody()[0])
        .args(&as_nobody()[1..])
        .args([
            "sh",
            "-c",
            "test -x \"$0\" && test -r \"$1/libibverbs.so.1\"",
        ])
        .arg(&bin)
        .arg(&libs)
        .status()
        .unwrap();
    if probe.success() {
        return (bin, libs);
    }
    use std::os::unix::fs::PermissionsExt;
    let copy_libs = dir.join("softroce-libs");
    std::fs::create_dir_all(&copy_libs).unwrap();
    for d in [dir, copy_libs.as_path()] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let copy_bin = dir.join("softroce");
    std::fs::copy(&bin, &copy_bin).unwrap();
    for lib in ["libibverbs.so.1", "librdmacm.so.1"] {
        // fs::copy follows the links build.rs makes to target/<profile>/deps.
        std::fs::copy(libs.join(lib), copy_libs.join(lib)).unwrap();
    }
    (copy_bin, copy_libs)
}

#[test]
fn an_unprivileged_user_gets_the_view_and_keeps_their_uid() {
    let before = host_state();
    let dir = std::env::temp_dir().join(format!("softroce-exec-view-{}", std::process::id()));
    let (out, want_uid) = if euid() == 0 {
        if !have("setpriv") {
            println!("SKIPPED: setpriv (util-linux) is not installed");
            return;
        }
        let (bin, libs) = softroce_for_nobody(&dir);
        let out = run_script(
            &as_nobody(),
            &bin,
            &[("SOFTROCE_LIB_DIR", libs.as_path())],
            "127.0.77.11,127.0.77.12",
            "grep CapEff /proc/self/status | tr -d '\\t' | sed 's/:/=/'\n",
        );
        (out, 65534)
    } else {
        let out = run_script(
            &[],
            Path::new(SOFTROCE),
            &[],
            "127.0.77.11,127.0.77.12",
            "grep CapEff /proc/self/status | tr -d '\\t' | sed 's/:/=/'\n",
        );
        (out, euid())
    };
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", report(&out));
    if view_refused(&out) {
        // A machine that refuses unprivileged user namespaces (a sysctl, an LSM): exec says
        // so and runs the program without the view, which is what it promises.
        println!("SKIPPED: user namespaces refused here: {}", report(&out));
        return;
    }
    check_view(&text, ["127.0.77.11", "127.0.77.12"]);
    let uid = want_uid.to_string();
    assert_eq!(field(&text, "uid"), Some(uid.as_str()), "{text}");
    // The program holds no capabilities in its user namespace.
    assert_eq!(field(&text, "CapEff"), Some("0000000000000000"), "{text}");
    let after = host_state();
    assert_eq!(before.0, after.0, "the host's mounts changed");
    assert_eq!(before.1, after.1, "the host's /sys/class changed");
    assert_eq!(before.2, after.2, "the host's /dev changed");
}

/// The `Device:` lines that follow each `Transport: NAME` line of `ucx_info -d`.
fn ucx_devices(out: &str, transport: &str) -> Vec<String> {
    let lines: Vec<&str> = out.lines().map(str::trim).collect();
    let want = format!("#      Transport: {transport}");
    let want = want.trim_start_matches("#      ");
    lines
        .windows(2)
        .filter(|w| w[0].trim_start_matches('#').trim() == want)
        .filter_map(|w| w[1].trim_start_matches('#').trim().strip_prefix("Device: "))
        .map(str::to_string)
        .collect()
}

#[test]
fn ucx_info_lists_verbs_transports_on_softroce0() {
    if !have("ucx_info") {
        let why = "ucx_info is not installed (apt-get install ucx-utils)";
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but {why}"
        );
        println!("SKIPPED: {why}");
        return;
    }
    let out = wait(
        exec("127.0.77.21", &["ucx_info", "-d"]).spawn().unwrap(),
        Duration::from_secs(60),
        "ucx_info -d",
    );
    assert!(out.status.success(), "{}", report(&out));
    if euid() != 0 && view_refused(&out) {
        println!("SKIPPED: namespaces refused here: {}", report(&out));
        return;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    for t in ["rc_verbs", "ud_verbs"] {
        let devs = ucx_devices(&text, t);
        assert!(
            devs.iter().any(|d| d == "softroce0:1"),
            "ucx_info -d lists {t} on {devs:?}, not softroce0:1:\n{}",
            report(&out)
        );
    }
}

#[test]
fn sysfs_writes_the_same_tree_for_a_host_wide_view() {
    let dir = std::env::temp_dir().join(format!("softroce-sysfs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(SOFTROCE)
        .args(["sysfs", "--ip", "127.0.77.41,127.0.77.42", "--root"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", report(&out));
    let read = |p: &str| std::fs::read_to_string(dir.join(p)).unwrap();
    let ip: std::net::IpAddr = "127.0.77.42".parse().unwrap();
    let gid = gid_text(&softroce::verbs::gid_table(ip)[1].gid);
    assert_eq!(
        read("sys/class/infiniband/softroce1/ports/1/gids/1"),
        format!("{gid}\n")
    );
    assert_eq!(
        read("sys/class/infiniband_verbs/uverbs1/ibdev"),
        "softroce1\n"
    );
    assert!(dir.join("dev/infiniband/uverbs1").is_file());
    let script = String::from_utf8_lossy(&out.stdout);
    let bind = format!(
        "mount --bind {} /sys/class/infiniband\n",
        dir.join("sys/class/infiniband").display()
    );
    assert!(script.contains(&bind), "{script}");
    assert!(
        script.contains("mount --bind /dev/null /dev/infiniband/uverbs1"),
        "{script}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn without_namespaces_exec_says_so_in_one_line_and_runs_the_program() {
    if !have("unshare") || !have("setpriv") {
        println!("SKIPPED: unshare or setpriv (util-linux) is not installed");
        return;
    }
    // A user namespace of this test's own in which no further user namespace may be made
    // (its max_user_namespaces 0) and, with every capability dropped, no mount namespace
    // either: both of exec's ways are refused.
    let inner = format!(
        "echo 0 > /proc/sys/user/max_user_namespaces || exit 77; \
         exec setpriv --inh-caps=-all --bounding-set=-all {SOFTROCE} exec --ip 127.0.77.61 \
         -- sh -c 'echo ran; test -e /dev/infiniband/uverbs0 && echo view || echo no-view'"
    );
    let child = Command::new("unshare")
        .args(["--user", "--map-root-user", "sh", "-c", &inner])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait(child, Duration::from_secs(30), "exec without namespaces");
    if out.status.code() == Some(77) || String::from_utf8_lossy(&out.stderr).contains("unshare:") {
        println!(
            "SKIPPED: cannot make a user namespace to refuse namespaces in: {}",
            report(&out)
        );
        return;
    }
    assert!(out.status.success(), "{}", report(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout, "ran\nno-view\n", "{}", report(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", report(&out));
    assert!(
        lines[0].starts_with("softroce exec: no /dev/infiniband and /sys/class/infiniband view")
            && lines[0].contains("Operation not permitted")
            && lines[0].ends_with("running it without"),
        "{}",
        report(&out)
    );
}
