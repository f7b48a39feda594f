//! Turns `exports.txt` (every symbol of rdma-core 44's libibverbs.so.1 with its version node)
//! into the linker's version script and the `.symver` directives that bind each Rust
//! function to its versioned name, sets the SONAME, and links
//! `target/<profile>/softroce-libs/libibverbs.so.1` to the built library so that
//! `LD_LIBRARY_PATH=target/<profile>/softroce-libs` (what `softroce exec` sets) loads it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The version nodes and their parents, as in rdma-core's libibverbs/libibverbs.map.in.
const NODES: &[(&str, Option<&str>)] = &[
    ("IBVERBS_1.0", None),
    ("IBVERBS_1.1", Some("IBVERBS_1.0")),
    ("IBVERBS_1.5", Some("IBVERBS_1.1")),
    ("IBVERBS_1.6", Some("IBVERBS_1.5")),
    ("IBVERBS_1.7", Some("IBVERBS_1.6")),
    ("IBVERBS_1.8", Some("IBVERBS_1.7")),
    ("IBVERBS_1.9", Some("IBVERBS_1.8")),
    ("IBVERBS_1.10", Some("IBVERBS_1.9")),
    ("IBVERBS_1.11", Some("IBVERBS_1.10")),
    ("IBVERBS_1.12", Some("IBVERBS_1.11")),
    ("IBVERBS_1.13", Some("IBVERBS_1.12")),
    ("IBVERBS_1.14", Some("IBVERBS_1.13")),
    ("IBVERBS_PRIVATE_34", None),
    // softroce's own: the raw QP1 entry points its librdmacm.so.1 uses (src/mad.rs).
    ("SOFTROCE_PRIVATE_1", None),
];

struct Export {
    name: String,
    node: String,
    default: bool,
    kind: String,
}

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
        let (default, node) = match w[1].strip_prefix("@@") {
            Some(n) => (true, n),
            None => (false, w[1].trim_start_matches('@')),
        };
        assert!(NODES.iter().any(|(n, _)| *n == node), "unknown node {node}");
        exports.push(Export {
            name: w[0].to_string(),
            node: node.to_string(),
            default,
            kind: w[2].to_string(),
        });
    }

    // The version script: each node lists its names; everything else is local.
    let mut map = String::new();
    for (i, (node, parent)) in NODES.iter().enumerate() {
        let _ = writeln!(map, "{node} {{\n  global:");
        for e in exports.iter().filter(|e| e.node == *node) {
            let _ = writeln!(map, "    {};", e.name);
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
    let map_path = out.join("libibverbs.map");
    std::fs::write(&map_path, map).unwrap();

    // The Rust side: one stub per unimplemented entry point; per export, a trampoline in
    // assembly that jumps to the Rust function and carries the versioned name. (`.symver`
    // needs its target defined in the same object file, which a Rust function in another
    // codegen unit is not.)
    let mut rs = String::new();
    for (i, e) in exports.iter().enumerate() {
        let sym = format!("{}{}{}", e.name, if e.default { "@@" } else { "@" }, e.node);
        let tramp = format!("softroce_export_{i}");
        if e.kind == "data" {
            // A one-byte variable (rdma-core's `bool verbs_allow_disassociate_destroy`).
            let _ = writeln!(
                rs,
                "core::arch::global_asm!(\".pushsection .bss.{tramp},\\\"aw\\\",@nobits\", \
                 \".globl {tramp}\", \".type {tramp},@object\", \".size {tramp},1\", \
                 \"{tramp}: .zero 1\", \".popsection\", \".symver {tramp}, {sym}\");"
            );
            continue;
        }
        let target = match e.kind.as_str() {
            "impl" => format!("crate::{}", e.name),
            kind => {
                let stub = format!(
                    "stub_{}_{}",
                    e.name.trim_start_matches('_'),
                    e.node.replace('.', "_").to_lowercase()
                );
                let body = match kind {
                    "errno" => "libc::EOPNOTSUPP as usize".to_string(),
                    "neg1" => "crate::set_errno(libc::EOPNOTSUPP); usize::MAX".to_string(),
                    "ptr" => "crate::set_errno(libc::EOPNOTSUPP); 0".to_string(),
                    "zero" => "0".to_string(),
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

    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map_path.display()
    );

    // target/<profile>/softroce-libs/libibverbs.so.1 -> ../deps/libsoftroce_capi.so (dangling
    // until the library is linked, a moment after this script). deps/ holds the library
    // whether cargo built it for `cargo build` (which also copies it up to target/<profile>/)
    // or only for `cargo test`.
    if let Some(profile_dir) = out.ancestors().nth(3) {
        link_library(profile_dir);
    }
}

fn link_library(profile_dir: &Path) {
    let dir = profile_dir.join("softroce-libs");
    let _ = std::fs::create_dir_all(&dir);
    let link = dir.join("libibverbs.so.1");
    let target = Path::new("../deps/libsoftroce_capi.so");
    if std::fs::read_link(&link).ok().as_deref() != Some(target) {
        let _ = std::fs::remove_file(&link);
        let _ = std::os::unix::fs::symlink(target, &link);
    }
}
