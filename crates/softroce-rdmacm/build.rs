//! Turns `exports.txt` (every symbol of rdma-core 44's librdmacm.so.1 with its version node)
//! into the linker's version script and the `.symver` trampolines that bind each Rust
//! function to its versioned name, sets the SONAME, and links
//! `target/<profile>/softroce-libs/librdmacm.so.1` to the built library, beside
//! softroce-capi's libibverbs.so.1, so that `softroce exec` loads both. The same scheme as
//! crates/softroce-capi/build.rs.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The version nodes and their parents, as in rdma-core's librdmacm/librdmacm.map.
const NODES: &[(&str, Option<&str>)] = &[
    ("RDMACM_1.0", None),
    ("RDMACM_1.1", Some("RDMACM_1.0")),
    ("RDMACM_1.2", Some("RDMACM_1.1")),
    ("RDMACM_1.3", Some("RDMACM_1.2")),
];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-changed=exports.txt");
    println!("cargo:rerun-if-changed=build.rs");

    let text = std::fs::read_to_string(manifest.join("exports.txt")).unwrap();
    let mut exports = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let w: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(w.len(), 3, "exports.txt: bad line {line:?}");
        let node = w[1]
            .strip_prefix("@@")
            .expect("librdmacm's versions are all defaults");
        assert!(NODES.iter().any(|(n, _)| *n == node), "unknown node {node}");
        exports.push((w[0].to_string(), node.to_string(), w[2].to_string()));
    }

    let mut map = String::new();
    for (i, (node, parent)) in NODES.iter().enumerate() {
        let _ = writeln!(map, "{node} {{\n  global:");
        for (name, _, _) in exports.iter().filter(|e| e.1 == *node) {
            let _ = writeln!(map, "    {name};");
        }
        if i == 0 {
            map.push_str("  local: *;\n");
        }
        match parent {
            Some(p) => {
                let _ = writeln!(map, "}} {p};");
            }
            None => map.push_str("};\n"),
        }
    }
    let map_path = out.join("librdmacm.map");
    std::fs::write(&map_path, map).unwrap();

    let mut rs = String::new();
    for (i, (name, node, kind)) in exports.iter().enumerate() {
        let sym = format!("{name}@@{node}");
        let tramp = format!("softroce_rdmacm_export_{i}");
        let target = match kind.as_str() {
            "impl" => format!("crate::{name}"),
            kind => {
                let stub = format!("stub_{name}");
                let body = match kind {
                    "neg1" => "crate::set_errno(libc::ENOSYS); usize::MAX",
                    "zero" => "0",
                    other => panic!("exports.txt: unknown kind {other}"),
                };
                let _ = writeln!(
                    rs,
                    "/// `{sym}`: not supported by softroce ({kind}).\n\
                     extern \"C\" fn {stub}() -> usize {{ {body} }}"
                );
                stub
            }
        };
        let _ = writeln!(
            rs,
            "core::arch::global_asm!(\".pushsection .text.{tramp},\\\"ax\\\",@progbits\", \
             \".globl {tramp}\", \".type {tramp},@function\", \"{tramp}:\", \
             crate::jump!(), \".size {tramp},.-{tramp}\", \".popsection\", \
             \".symver {tramp}, {sym}\", f = sym {target});"
        );
    }
    std::fs::write(out.join("exports.rs"), rs).unwrap();

    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdmacm.so.1");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map_path.display()
    );
    if let Some(profile_dir) = out.ancestors().nth(3) {
        link_library(profile_dir);
    }
}

/// target/<profile>/softroce-libs/librdmacm.so.1 -> ../deps/libsoftroce_rdmacm.so.
fn link_library(profile_dir: &Path) {
    let dir = profile_dir.join("softroce-libs");
    let _ = std::fs::create_dir_all(&dir);
    let link = dir.join("librdmacm.so.1");
    let target = Path::new("../deps/libsoftroce_rdmacm.so");
    if std::fs::read_link(&link).ok().as_deref() != Some(target) {
        let _ = std::fs::remove_file(&link);
        let _ = std::os::unix::fs::symlink(target, &link);
    }
}
