//! Checks of a built C library against the system's rdma-core library of the same name, read
//! with `objdump -T` / `objdump -p`: the (symbol, version) pairs, the version nodes, the
//! SONAME and the `target/<profile>/softroce-libs/` link: what softroce-capi's and
//! softroce-rdmacm's `tests/symbols.rs` run. Test support only, behind the `testing` feature
//! (the two crates enable it in their dev-dependencies); it asserts, so no library calls it.
//! Skipped, saying why, only when the system library or objdump is missing.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// target/<profile>/deps/`file`, beside the running test binary (where cargo builds a
/// cdylib for `cargo test` as well as for `cargo build`).
pub fn built_lib(file: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().join(file)
}

/// `objdump ARGS lib`'s output; `None` when objdump is not installed.
fn objdump(args: &[&str], lib: &Path) -> Option<String> {
    let out = Command::new("objdump").args(args).arg(lib).output().ok()?;
    assert!(
        out.status.success(),
        "objdump {args:?} {} failed",
        lib.display()
    );
    Some(String::from_utf8(out.stdout).unwrap())
}

/// Every defined dynamic symbol as "VERSION name" ("(VERSION)" for a hidden version), the
/// version nodes' own absolute symbols left out (newer linkers do not emit them).
fn exported(lib: &Path) -> Option<BTreeSet<String>> {
    let text = objdump(&["-T"], lib)?;
    Some(
        text.lines()
            .filter(|l| l.contains(" g ") && !l.contains("*UND*") && !l.contains("*ABS*"))
            .filter_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                (w.len() >= 2).then(|| format!("{} {}", w[w.len() - 2], w[w.len() - 1]))
            })
            .collect(),
    )
}

/// The names of the version definitions, in order. Their parents (IBVERBS_1.1 after
/// IBVERBS_1.0, ...) are not read: rust-lld, rustc's default linker here, writes no Verdaux
/// parent entries, and the dynamic loader binds by node name alone.
fn version_nodes(lib: &Path) -> Option<Vec<String>> {
    let text = objdump(&["-p"], lib)?;
    let defs = text.split("Version definitions:").nth(1)?;
    let defs = defs.split("Version References:").next()?;
    Some(
        defs.lines()
            .filter_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                (w.len() == 4 && w[1] == "0x00").then(|| w[3].to_string())
            })
            .collect(),
    )
}

/// Asserts that `ours` exports exactly what `system_lib` exports, under the same version
/// nodes in the same order, apart from softroce's own `private_node` (the last node
/// defined, whose symbols are ours alone). Skips (printing why) when `system_lib` (from
/// Debian's `dev_package`) or objdump is missing.
pub fn assert_same_exports(
    system_lib: &str,
    dev_package: &str,
    ours: &Path,
    private_node: Option<&str>,
) {
    if !Path::new(system_lib).exists() {
        println!("SKIPPED: {system_lib} is not installed (apt-get install {dev_package})");
        return;
    }
    assert!(ours.exists(), "{} was not built", ours.display());
    let (Some(want), Some(have)) = (exported(Path::new(system_lib)), exported(ours)) else {
        println!("SKIPPED: objdump is not installed (apt-get install binutils)");
        return;
    };
    let have: BTreeSet<String> = have
        .into_iter()
        .filter(|s| private_node.is_none_or(|p| !s.starts_with(p)))
        .collect();
    let missing: Vec<_> = want.difference(&have).collect();
    let extra: Vec<_> = have.difference(&want).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing: {missing:#?}\nextra: {extra:#?}"
    );
    let mut ours_nodes = version_nodes(ours).unwrap_or_default();
    if let Some(p) = private_node {
        assert_eq!(ours_nodes.pop().as_deref(), Some(p));
    }
    assert_eq!(
        version_nodes(Path::new(system_lib)).unwrap_or_default(),
        ours_nodes,
        "version nodes differ"
    );
    println!("{} symbols under the same versions", want.len());
}

/// Asserts that `ours` has SONAME `soname` and that target/<profile>/softroce-libs/`soname`
/// (what `softroce exec` puts on the library path) leads to it.
pub fn assert_soname_and_link(ours: &Path, soname: &str) {
    let Some(text) = objdump(&["-p"], ours) else {
        println!("SKIPPED: objdump is not installed");
        return;
    };
    assert!(
        text.lines()
            .any(|l| l.contains("SONAME") && l.trim_end().ends_with(soname)),
        "no SONAME {soname} in {}",
        ours.display()
    );
    let link = ours
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("softroce-libs")
        .join(soname);
    assert_eq!(
        std::fs::canonicalize(&link).unwrap(),
        std::fs::canonicalize(ours).unwrap(),
        "{} does not lead to the built library",
        link.display()
    );
}
