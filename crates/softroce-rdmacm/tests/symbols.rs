//! The built library exports exactly the (symbol, version) pairs Debian 12's librdmacm.so.1
//! (rdma-core 44) exports, under the same version nodes, read with `objdump -T` / `-p`; its
//! SONAME is librdmacm.so.1 and target/<profile>/softroce-libs/librdmacm.so.1 leads to it.
//! Skipped, saying why, only when the system library or objdump is missing (CI installs
//! librdmacm-dev).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const SYSTEM_LIB: &str = "/usr/lib/x86_64-linux-gnu/librdmacm.so.1";

/// target/<profile>/deps/libsoftroce_rdmacm.so, beside this test binary.
fn built_lib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().join("libsoftroce_rdmacm.so")
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

/// Every defined dynamic symbol as "VERSION name", the nodes' own symbols left out.
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

/// The names of the version definitions, in order.
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

#[test]
fn exports_every_symbol_of_debians_librdmacm() {
    if !Path::new(SYSTEM_LIB).exists() {
        println!("SKIPPED: {SYSTEM_LIB} is not installed (apt-get install librdmacm-dev)");
        return;
    }
    let ours = built_lib();
    assert!(ours.exists(), "{} was not built", ours.display());
    let (Some(want), Some(have)) = (exported(Path::new(SYSTEM_LIB)), exported(&ours)) else {
        println!("SKIPPED: objdump is not installed (apt-get install binutils)");
        return;
    };
    let missing: Vec<_> = want.difference(&have).collect();
    let extra: Vec<_> = have.difference(&want).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing: {missing:#?}\nextra: {extra:#?}"
    );
    assert_eq!(
        version_nodes(Path::new(SYSTEM_LIB)),
        version_nodes(&ours),
        "version nodes differ"
    );
    println!("{} symbols under the same versions", want.len());
}

#[test]
fn soname_is_librdmacm_so_1() {
    let ours = built_lib();
    let Some(text) = objdump(&["-p"], &ours) else {
        println!("SKIPPED: objdump is not installed");
        return;
    };
    assert!(
        text.lines()
            .any(|l| l.contains("SONAME") && l.trim_end().ends_with("librdmacm.so.1")),
        "no SONAME librdmacm.so.1 in {}",
        ours.display()
    );
    let link = ours
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("softroce-libs/librdmacm.so.1");
    assert_eq!(
        std::fs::canonicalize(&link).unwrap(),
        std::fs::canonicalize(&ours).unwrap(),
        "{} does not lead to the built library",
        link.display()
    );
}
