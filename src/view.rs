//! The `/dev` and `/sys` view of `softroce exec`: programs that look for RDMA devices where
//! the kernel's are (UCX, Open MPI, libfabric check `/dev/infiniband/<dev_name>` and read
//! `/sys/class/infiniband/...`) find softroce's there.
//!
//! [`enter`] gives the process (and so the program it execs, and every child of that) a
//! private mount namespace, as root with `unshare(CLONE_NEWNS)`, otherwise inside a new user
//! namespace that maps the user's own uid and gid to themselves (the program sees its own
//! uid and runs with no capabilities). Mount propagation is made private first, so nothing
//! reaches the host. Then `/sys/class` and `/dev` are each covered with a tmpfs holding
//! every entry of the real directory again (directories and files bind-mounted back through
//! a descriptor of the real directory taken before it was covered, `/proc/self/fd/N/<name>`,
//! symbolic links copied), plus:
//!
//! - `/sys/class/infiniband/softroce<i>/` and `/sys/class/infiniband_verbs/uverbs<i>/`: the
//!   files kernel rxe's devices have there (drivers/infiniband/core/sysfs.c, uverbs_main.c),
//!   with the values `ibv_query_device`/`_port`/`_gid` give ([`class_tree`]);
//! - `/dev/infiniband/uverbs<i>` and `/dev/infiniband/rdma_cm`: `/dev/null` bind-mounted
//!   onto them (a character device anyone may open read-write; softroce's libraries never
//!   open them). `uverbs<i>/dev` in sysfs names its major:minor.
//!
//! The tmpfs on `/sys/class` is then made read-only, as sysfs is to a user. Host-wide, root
//! can place the same files: `softroce sysfs --root DIR` ([`run_sysfs`]) writes them under
//! `DIR` and prints the bind mounts that put them in place.

use softroce::net::discover::DeviceAddr;
use softroce::verbs::{DeviceConfig, GidType};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// One node of a generated tree: a directory, or a file and its contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir,
    File(String),
}

/// `/sys/class/infiniband_verbs/abi_version`: the uverbs ABI (`IB_USER_VERBS_ABI_VERSION`,
/// include/uapi/rdma/ib_user_verbs.h), the version rdma-core's libibverbs requires.
const UVERBS_ABI_VERSION: u32 = 6;

/// `/sys/class/infiniband_verbs/uverbs<i>/abi_version`: the driver's ABI, kernel rxe's
/// (`RXE_UVERBS_ABI_VERSION`, include/uapi/rdma/rdma_user_rxe.h).
const RXE_UVERBS_ABI_VERSION: u32 = 2;

/// The directory names of `/sys/class` the view provides (replacing the host's, if any).
const CLASS_DIRS: [&str; 2] = ["infiniband", "infiniband_verbs"];

/// sysfs.c `state_show`'s names.
fn port_state_name(s: u8) -> &'static str {
    match s {
        0 => "NOP",
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        5 => "ACTIVE_DEFER",
        _ => "UNKNOWN",
    }
}

/// sysfs.c `phys_state_show`'s line.
fn phys_state_line(s: u8) -> String {
    let name = match s {
        1 => "Sleep",
        2 => "Polling",
        3 => "Disabled",
        4 => "PortConfigurationTraining",
        5 => "LinkUp",
        6 => "LinkErrorRecovery",
        7 => "Phy Test",
        _ => "<unknown>",
    };
    format!("{s}: {name}")
}

/// sysfs.c `rate_show`: "2.5 Gb/sec (1X)" for rxe's SDR 1X.
fn rate_line(active_speed: u8, active_width: u8) -> String {
    let (speed, deci) = match active_speed {
        2 => (" DDR", 50),
        4 => (" QDR", 100),
        8 => (" FDR10", 100),
        16 => (" FDR", 140),
        32 => (" EDR", 250),
        64 => (" HDR", 500),
        128 => (" NDR", 1000),
        _ => ("", 25), // SDR, and the kernel's default for others
    };
    // ib_width_enum_to_int.
    let width = match active_width {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => 1,
    };
    let rate = deci * width;
    let half = if rate % 10 != 0 { ".5" } else { "" };
    format!("{}{half} Gb/sec ({width}X{speed})", rate / 10)
}

/// A GID as the kernel prints it (`%pI6`): eight groups of four hex digits.
fn gid_line(raw: &[u8; 16]) -> String {
    raw.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// `ib_cache_gid_type_str`.
fn gid_type_name(t: GidType) -> &'static str {
    match t {
        GidType::RoceV2 => "RoCE v2",
    }
}

/// The files of `/sys/class` for `devices`, paths relative to `/sys/class`, parents before
/// children. `cdev` is the major and minor of the nodes `/dev/infiniband/uverbs<i>` are.
/// Values come from the engine: [`softroce::verbs::device_attr`], [`softroce::verbs::port_attr`],
/// [`softroce::verbs::gid_table`] (what an open device's `ibv_query_*` report) and, for the
/// GIDs' netdev, [`softroce::net::interface_name`] (no `ndevs/N` when no interface has the
/// address, as the kernel's read fails then).
pub fn class_tree(devices: &[DeviceAddr], cdev: (u32, u32)) -> Vec<(PathBuf, Node)> {
    let mut t: Vec<(PathBuf, Node)> = Vec::new();
    let dir = |t: &mut Vec<(PathBuf, Node)>, p: PathBuf| t.push((p, Node::Dir));
    let file = |t: &mut Vec<(PathBuf, Node)>, p: PathBuf, v: String| t.push((p, Node::File(v)));
    let ib = PathBuf::from("infiniband");
    let verbs = PathBuf::from("infiniband_verbs");
    dir(&mut t, ib.clone());
    dir(&mut t, verbs.clone());
    file(
        &mut t,
        verbs.join("abi_version"),
        UVERBS_ABI_VERSION.to_string(),
    );
    for (i, d) in devices.iter().enumerate() {
        let a = softroce::verbs::device_attr(d.ip);
        let mut cfg = DeviceConfig::new(&d.name, d.ip);
        softroce::net::set_rxe_port(&mut cfg);
        let p = softroce::verbs::port_attr(&cfg);
        let dev = ib.join(&d.name);
        dir(&mut t, dev.clone());
        file(&mut t, dev.join("node_type"), "1: CA".into());
        file(
            &mut t,
            dev.join("node_guid"),
            crate::devinfo::guid_str(a.node_guid),
        );
        file(
            &mut t,
            dev.join("sys_image_guid"),
            crate::devinfo::guid_str(a.sys_image_guid),
        );
        file(&mut t, dev.join("fw_ver"), a.fw_ver.clone());
        // rxe names its node "rxe" (rxe_verbs.c); softroce, its own name.
        file(&mut t, dev.join("node_desc"), "softroce".into());
        // No PCI device behind it: no NUMA node (what UCX reads, device/numa_node). The
        // netdev under device/net/, as a NIC's PCI device lists its own (what pyverbs'
        // tests/base.py reads to find a device's IP interface).
        let ndev = softroce::net::interface_name(d.ip);
        dir(&mut t, dev.join("device"));
        file(&mut t, dev.join("device/numa_node"), "-1".into());
        if let Some(nd) = &ndev {
            dir(&mut t, dev.join("device/net"));
            dir(&mut t, dev.join("device/net").join(nd));
        }
        dir(&mut t, dev.join("ports"));
        for port in 1..=a.phys_port_cnt {
            let pd = dev.join(format!("ports/{port}"));
            dir(&mut t, pd.clone());
            let state = format!("{}: {}", p.state, port_state_name(p.state));
            file(&mut t, pd.join("state"), state);
            file(&mut t, pd.join("phys_state"), phys_state_line(p.phys_state));
            file(&mut t, pd.join("link_layer"), p.link_layer.into());
            file(
                &mut t,
                pd.join("rate"),
                rate_line(p.active_speed, p.active_width),
            );
            file(
                &mut t,
                pd.join("cap_mask"),
                format!("0x{:08x}", p.port_cap_flags),
            );
            // RoCE ports have no LIDs and no subnet manager: rxe's zeros (`ibv_devinfo`
            // prints the same).
            file(&mut t, pd.join("lid"), "0x0".into());
            file(&mut t, pd.join("lid_mask_count"), "0".into());
            file(&mut t, pd.join("sm_lid"), "0x0".into());
            file(&mut t, pd.join("sm_sl"), "0".into());
            dir(&mut t, pd.join("pkeys"));
            for k in 0..p.pkey_tbl_len {
                let v = format!("0x{:04x}", softroce::wire::DEFAULT_PKEY);
                file(&mut t, pd.join(format!("pkeys/{k}")), v);
            }
            dir(&mut t, pd.join("gids"));
            dir(&mut t, pd.join("gid_attrs"));
            dir(&mut t, pd.join("gid_attrs/types"));
            dir(&mut t, pd.join("gid_attrs/ndevs"));
            for g in softroce::verbs::gid_table(d.ip) {
                let n = g.index;
                file(&mut t, pd.join(format!("gids/{n}")), gid_line(&g.gid.0));
                let kind = gid_type_name(g.gid_type).to_string();
                file(&mut t, pd.join(format!("gid_attrs/types/{n}")), kind);
                if let Some(nd) = &ndev {
                    file(&mut t, pd.join(format!("gid_attrs/ndevs/{n}")), nd.clone());
                }
            }
        }
        let u = verbs.join(format!("uverbs{i}"));
        dir(&mut t, u.clone());
        file(&mut t, u.join("ibdev"), d.name.clone());
        file(
            &mut t,
            u.join("abi_version"),
            RXE_UVERBS_ABI_VERSION.to_string(),
        );
        file(&mut t, u.join("dev"), format!("{}:{}", cdev.0, cdev.1));
    }
    t
}

/// An io::Error saying what failed on which path.
fn at(path: &Path, what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// Writes `tree` under `root` (which must exist): directories 0755, files 0444 holding
/// their value and a newline, as sysfs shows them. Errors name the path.
pub fn write_tree(root: &Path, tree: &[(PathBuf, Node)]) -> io::Result<()> {
    for (rel, node) in tree {
        let path = root.join(rel);
        match node {
            Node::Dir => {
                std::fs::create_dir(&path).map_err(|e| at(&path, "mkdir", e))?;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                    .map_err(|e| at(&path, "chmod", e))?;
            }
            Node::File(v) => {
                use std::io::Write as _;
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o444)
                    .open(&path)
                    .map_err(|e| at(&path, "create", e))?;
                writeln!(f, "{v}").map_err(|e| at(&path, "write", e))?;
            }
        }
    }
    Ok(())
}

/// The major and minor of `/dev/null`, the node the view's `/dev/infiniband` entries are.
pub fn null_cdev() -> io::Result<(u32, u32)> {
    let null = Path::new("/dev/null");
    let rdev = std::fs::metadata(null)
        .map_err(|e| at(null, "stat", e))?
        .rdev();
    Ok((libc::major(rdev), libc::minor(rdev)))
}

/// Enters a private mount namespace in which `/dev/infiniband` and `/sys/class/infiniband*`
/// show `devices` (the module's documentation). Call while single-threaded (a user namespace
/// cannot be entered otherwise), before exec. Errors: why the namespace or a mount could
/// not be made; once in the namespace, a failed mount has the tmpfs on `/sys/class` and
/// `/dev` unmounted again first, so they show what they showed before.
pub fn enter(devices: &[DeviceAddr]) -> io::Result<()> {
    use rustix::thread::UnshareFlags;
    let (uid, gid) = (rustix::process::getuid(), rustix::process::getgid());
    let own_ns = || -> io::Result<()> {
        // SAFETY: neither CLONE_FILES nor CLONE_FS is unshared, so no descriptor table or
        // working directory stops being shared with another thread (there is none yet).
        unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWUSER | UnshareFlags::NEWNS) }
            .map_err(|e| io::Error::other(format!("unshare(CLONE_NEWUSER|CLONE_NEWNS): {e}")))?;
        // The user's own ids, mapped to themselves; setgroups must be denied before an
        // unprivileged process may write gid_map.
        for (file, text) in [
            ("/proc/self/uid_map", format!("{0} {0} 1\n", uid.as_raw())),
            ("/proc/self/setgroups", "deny\n".to_string()),
            ("/proc/self/gid_map", format!("{0} {0} 1\n", gid.as_raw())),
        ] {
            std::fs::write(file, text).map_err(|e| at(Path::new(file), "write", e))?;
        }
        Ok(())
    };
    if rustix::process::geteuid().is_root() {
        // SAFETY: as above: only the mount namespace is unshared.
        if let Err(e) = unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWNS) } {
            // Root without CAP_SYS_ADMIN (a container): a user namespace may still be allowed.
            own_ns().map_err(|e2| io::Error::other(format!("unshare(CLONE_NEWNS): {e}; {e2}")))?;
        }
    } else {
        own_ns()?;
    }
    use rustix::mount::MountPropagationFlags as P;
    rustix::mount::mount_change("/", P::REC | P::PRIVATE).map_err(|e| {
        at(
            Path::new("/"),
            "making mount propagation private (MS_REC|MS_PRIVATE) on",
            e.into(),
        )
    })?;
    let cdev = null_cdev()?;
    let tree = class_tree(devices, cdev);
    cover(Path::new("/sys/class"), &CLASS_DIRS, true, &|root| {
        write_tree(root, &tree)
    })?;
    let names = dev_names(devices.len());
    let dev = cover(Path::new("/dev"), &["infiniband"], false, &|root| {
        let ib = root.join("infiniband");
        std::fs::create_dir(&ib).map_err(|e| at(&ib, "mkdir", e))?;
        std::fs::set_permissions(&ib, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| at(&ib, "chmod", e))?;
        for n in &names {
            let node = ib.join(n);
            std::fs::File::create(&node).map_err(|e| at(&node, "create", e))?;
            rustix::mount::mount_bind("/dev/null", &node)
                .map_err(|e| at(&node, "bind-mounting /dev/null on", e.into()))?;
        }
        Ok(())
    });
    if dev.is_err() {
        // All or nothing: /sys/class shows the host's again.
        let _ = rustix::mount::unmount("/sys/class", rustix::mount::UnmountFlags::DETACH);
    }
    dev
}

/// The names of `/dev/infiniband` for `n` devices: `uverbs0` … and `rdma_cm`.
fn dev_names(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("uverbs{i}"))
        .chain(["rdma_cm".to_string()])
        .collect()
}

/// Covers `dir` with a tmpfs that holds every entry of the real `dir` but `replaced` (bound
/// back, or for symbolic links copied), then has `fill` add the rest; read-only afterwards
/// when `read_only`. On an error the tmpfs is unmounted again.
fn cover(
    dir: &Path,
    replaced: &[&str],
    read_only: bool,
    fill: &dyn Fn(&Path) -> io::Result<()>,
) -> io::Result<()> {
    use rustix::mount::MountFlags as F;
    // The real directory, before it is covered: its entries stay reachable through this.
    let real = std::fs::File::open(dir).map_err(|e| at(dir, "open", e))?;
    let real_path = PathBuf::from(format!("/proc/self/fd/{}", real.as_raw_fd()));
    let mode = std::fs::metadata(dir)
        .map_err(|e| at(dir, "stat", e))?
        .mode()
        & 0o7777;
    let entries: Vec<std::fs::DirEntry> = std::fs::read_dir(&real_path)
        .map_err(|e| at(dir, "reading", e))?
        .collect::<io::Result<_>>()
        .map_err(|e| at(dir, "reading", e))?;
    let mut flags = F::NOSUID;
    if read_only {
        flags |= F::NOEXEC | F::NODEV;
    }
    let data = std::ffi::CString::new(format!("mode={mode:o}")).map_err(io::Error::other)?;
    rustix::mount::mount("tmpfs", dir, "tmpfs", flags, data.as_c_str())
        .map_err(|e| at(dir, "mounting a tmpfs on", e.into()))?;
    let filled = (|| -> io::Result<()> {
        for entry in &entries {
            let name = entry.file_name();
            if replaced.iter().any(|r| name == *r) {
                continue;
            }
            let src = real_path.join(&name);
            let dst = dir.join(&name);
            let kind = entry.file_type().map_err(|e| at(&dst, "stat", e))?;
            if kind.is_symlink() {
                let target = std::fs::read_link(&src).map_err(|e| at(&dst, "readlink", e))?;
                std::os::unix::fs::symlink(&target, &dst).map_err(|e| at(&dst, "symlink", e))?;
                continue;
            }
            if kind.is_dir() {
                std::fs::create_dir(&dst).map_err(|e| at(&dst, "mkdir", e))?;
            } else {
                std::fs::File::create(&dst).map_err(|e| at(&dst, "create", e))?;
            }
            rustix::mount::mount_bind_recursive(&src, &dst)
                .map_err(|e| at(&dst, "bind-mounting the real entry on", e.into()))?;
        }
        fill(dir)?;
        if read_only {
            rustix::mount::mount_remount(dir, F::BIND | F::RDONLY | flags, "")
                .map_err(|e| at(dir, "remounting read-only", e.into()))?;
        }
        Ok(())
    })();
    if filled.is_err() {
        // Detached with whatever was bound on it: `dir` shows the real directory again.
        let _ = rustix::mount::unmount(dir, rustix::mount::UnmountFlags::DETACH);
    }
    filled
}

/// Options of `softroce sysfs`.
#[derive(clap::Args)]
pub struct SysfsArgs {
    /// The devices' addresses, comma-separated, as `softroce exec --ip` (softroce0, …);
    /// default: SOFTROCE_IP as set, else 127.0.0.1.
    #[arg(long)]
    ip: Option<String>,
    /// The directory to write into (created; must not hold a previous tree):
    /// DIR/sys/class/infiniband*, and DIR/dev/infiniband with an empty file per node.
    #[arg(long, value_name = "DIR")]
    root: PathBuf,
}

/// `softroce sysfs`: writes [`class_tree`] under `DIR/sys/class` and the `/dev/infiniband`
/// placeholders under `DIR/dev/infiniband`, then prints the commands that mount them
/// host-wide (`/sys/class/infiniband*` exist once ib_core and ib_uverbs are loaded, empty
/// without a kernel device; sysfs has no room for new directories otherwise).
pub fn run_sysfs(a: SysfsArgs) -> Result<(), crate::BoxError> {
    let devices = match &a.ip {
        Some(ip) => softroce::net::discover::parse_device_list(ip)?,
        None => softroce::net::discover::devices_from_env()?,
    };
    let class = a.root.join("sys/class");
    let dev = a.root.join("dev/infiniband");
    for d in [&class, &dev] {
        std::fs::create_dir_all(d).map_err(|e| at(d, "mkdir", e))?;
    }
    write_tree(&class, &class_tree(&devices, null_cdev()?))?;
    let names = dev_names(devices.len());
    for n in &names {
        let p = dev.join(n);
        std::fs::File::create(&p).map_err(|e| at(&p, "create", e))?;
    }
    let abs = std::path::absolute(&a.root)?;
    let mut s = String::new();
    s.push_str(
        "# As root, to show these devices host-wide (undo: umount the same paths):
",
    );
    s.push_str(
        "modprobe ib_uverbs  # makes /sys/class/infiniband and infiniband_verbs
",
    );
    for c in CLASS_DIRS {
        let src = abs.join("sys/class").join(c);
        s.push_str(&format!(
            "mount --bind {} /sys/class/{c}
",
            src.display()
        ));
    }
    s.push_str(
        "mkdir -p /dev/infiniband
",
    );
    for n in &names {
        s.push_str(&format!(
            "touch /dev/infiniband/{n} && mount --bind /dev/null /dev/infiniband/{n}
"
        ));
    }
    print!("{s}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use softroce::net::discover::parse_device_list;

    fn value<'a>(t: &'a [(PathBuf, Node)], p: &str) -> Option<&'a str> {
        t.iter().find_map(|(q, n)| match n {
            Node::File(v) if q == Path::new(p) => Some(v.as_str()),
            _ => None,
        })
    }

    #[test]
    fn the_tree_holds_kernel_formatted_values() {
        let devs = parse_device_list("127.0.77.1,127.0.77.2").unwrap();
        let t = class_tree(&devs, (1, 3));
        let gid = value(&t, "infiniband/softroce0/ports/1/gids/1");
        assert_eq!(gid, Some("0000:0000:0000:0000:0000:ffff:7f00:4d01"));
        let ll = value(&t, "infiniband/softroce1/ports/1/gids/0").unwrap();
        assert!(ll.starts_with("fe80:0000:0000:0000:"), "{ll}");
        assert_eq!(
            value(&t, "infiniband/softroce0/ports/1/state"),
            Some("4: ACTIVE")
        );
        assert_eq!(
            value(&t, "infiniband/softroce0/ports/1/phys_state"),
            Some("5: LinkUp")
        );
        assert_eq!(
            value(&t, "infiniband/softroce0/ports/1/rate"),
            Some("2.5 Gb/sec (1X)")
        );
        assert_eq!(
            value(&t, "infiniband/softroce0/ports/1/gid_attrs/types/1"),
            Some("RoCE v2")
        );
        assert_eq!(
            value(&t, "infiniband_verbs/uverbs1/ibdev"),
            Some("softroce1")
        );
        assert_eq!(value(&t, "infiniband_verbs/uverbs1/dev"), Some("1:3"));
        let guid = softroce::verbs::node_guid(devs[0].ip);
        assert_eq!(
            value(&t, "infiniband/softroce0/node_guid"),
            Some(crate::devinfo::guid_str(guid).as_str())
        );
        // Parents come before their children.
        for (i, (p, _)) in t.iter().enumerate() {
            if let Some(parent) = p.parent().filter(|q| !q.as_os_str().is_empty()) {
                assert!(
                    t[..i].iter().any(|(q, n)| q == parent && *n == Node::Dir),
                    "{} before its directory",
                    p.display()
                );
            }
        }
    }

    #[test]
    fn rates_print_as_the_kernel_does() {
        assert_eq!(rate_line(1, 1), "2.5 Gb/sec (1X)");
        assert_eq!(rate_line(1, 2), "10 Gb/sec (4X)");
        assert_eq!(rate_line(32, 2), "100 Gb/sec (4X EDR)");
        assert_eq!(rate_line(2, 1), "5 Gb/sec (1X DDR)");
    }
}
