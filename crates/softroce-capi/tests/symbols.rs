//! The built library exports exactly the (symbol, version) pairs Debian 12's
//! libibverbs.so.1 (rdma-core 44) exports, with the same hidden/default split and the same
//! version nodes, read with `objdump -T` / `objdump -p`. Skipped, saying why, only when the
//! system library or objdump is missing (CI installs libibverbs-dev).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const SYSTEM_LIB: &str = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";
/// The version node of softroce's own entry points (src/mad.rs), the last one defined.
const PRIVATE_NODE: &str = "SOFTROCE_PRIVATE_1";

/// target/<profile>/deps/libsoftroce_capi.so, beside this test binary (where cargo builds
/// the library for `cargo test` as well as for `cargo build`).
fn built_lib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().join("libsoftroce_capi.so")
}

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

/// The version definitions ("IBVERBS_1.1 IBVERBS_1.0" = node and parent).
fn version_nodes(lib: &Path) -> Option<Vec<String>> {
    let text = objdump(&["-p"], lib)?;
    let defs = text.split("Version definitions:").nth(1)?;
    let defs = defs.split("Version References:").next()?;
    let mut nodes = Vec::new();
    for l in defs.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.len() {
            4 if w[1] == "0x00" => nodes.push(w[3].to_string()),
            1 => {
                if let Some(last) = nodes.last_mut() {
                    *last = format!("{last} {}", w[0]);
                }
            }
            _ => {}
        }
    }
    Some(nodes)
}

#[test]
fn exports_every_symbol_of_debians_libibverbs() {
    if !Path::new(SYSTEM_LIB).exists() {
        println!("SKIPPED: {SYSTEM_LIB} is not installed (apt-get install libibverbs-dev)");
        return;
    }
    let ours = built_lib();
    assert!(ours.exists(), "{} was not built", ours.display());
    let (Some(want), Some(have)) = (exported(Path::new(SYSTEM_LIB)), exported(&ours)) else {
        println!("SKIPPED: objdump is not installed (apt-get install binutils)");
        return;
    };
    // softroce's private node (the raw QP1 entry points its librdmacm.so.1 uses) is ours
    // alone; everything else must match.
    let have: BTreeSet<String> = have
        .into_iter()
        .filter(|s| !s.starts_with(PRIVATE_NODE))
        .collect();
    let missing: Vec<_> = want.difference(&have).collect();
    let extra: Vec<_> = have.difference(&want).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing: {missing:#?}\nextra: {extra:#?}"
    );
    // The same nodes in the same order. Their parents (IBVERBS_1.1 after IBVERBS_1.0, ...)
    // are not compared: rust-lld, rustc's default linker here, writes no Verdaux parent
    // entries, and the dynamic loader binds by node name alone.
    let names = |v: Option<Vec<String>>| -> Vec<String> {
        v.unwrap_or_default()
            .iter()
            .map(|n| n.split_whitespace().next().unwrap_or("").to_string())
            .collect()
    };
    let mut ours_nodes = names(version_nodes(&ours));
    assert_eq!(ours_nodes.pop().as_deref(), Some(PRIVATE_NODE));
    assert_eq!(
        names(version_nodes(Path::new(SYSTEM_LIB))),
        ours_nodes,
        "version nodes differ"
    );
    println!("{} symbols under the same versions", want.len());
}

#[test]
fn soname_is_libibverbs_so_1() {
    let ours = built_lib();
    let Some(text) = objdump(&["-p"], &ours) else {
        println!("SKIPPED: objdump is not installed");
        return;
    };
    assert!(
        text.lines()
            .any(|l| l.contains("SONAME") && l.trim_end().ends_with("libibverbs.so.1")),
        "no SONAME libibverbs.so.1 in {}",
        ours.display()
    );
    // target/<profile>/softroce-libs/, beside deps/.
    let link = ours
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("softroce-libs/libibverbs.so.1");
    assert_eq!(
        std::fs::canonicalize(&link).unwrap(),
        std::fs::canonicalize(&ours).unwrap(),
        "{} does not lead to the built library",
        link.display()
    );
}
