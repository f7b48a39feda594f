//! The build-script half of a C library that takes an rdma-core library's place: turns
//! `exports.txt` (every symbol of the rdma-core 44 library with its version node and how
//! softroce answers it) into the linker's version script and one `.symver` trampoline per
//! symbol, sets the SONAME, and links `target/<profile>/softroce-libs/<soname>` to the built
//! library so that `LD_LIBRARY_PATH=target/<profile>/softroce-libs` (what `softroce exec`
//! sets) loads it. Used by softroce-capi's build.rs (libibverbs.so.1) and softroce-rdmacm's
//! (librdmacm.so.1), each with this crate as a build-dependency.
//!
//! `exports.txt`: one `name @@NODE kind` (default version) or `name @NODE kind` (hidden
//! version) per line, `#` comments. Kinds: `impl` (the crate's function `name`), `errno`
//! (returns the unsupported errno value), `neg1` (-1 with errno set to it), `ptr` (NULL
//! with errno set), `zero` (returns 0), `data` (a one-byte variable).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// What differs between the libraries.
pub struct Library<'a> {
    /// The version nodes and their parents, in the order of rdma-core's `.map` file.
    pub nodes: &'a [(&'a str, Option<&'a str>)],
    /// The SONAME, also the link's name in softroce-libs/ (`libibverbs.so.1`).
    pub soname: &'a str,
    /// The cdylib cargo writes to deps/ (`libsoftroce_capi.so`).
    pub cdylib: &'a str,
    /// Prefix of the trampolines' local labels.
    pub trampoline_prefix: &'a str,
    /// The errno of what softroce does not implement, as a `libc` path: rdma-core's
    /// answer for that library (`libc::EOPNOTSUPP` for verbs, `libc::ENOSYS` for rdma_cm).
    pub unsupported_errno: &'a str,
}

struct Export {
    name: String,
    node: String,
    default: bool,
    kind: String,
}

/// Writes `$OUT_DIR/exports.rs` (included by the crate's lib.rs; its stubs set errno with
/// `softroce_cabi::set_errno`, and the file defines the trampolines' `jump!` itself) and
/// the version script, and tells cargo how to link. Panics (failing the build) on a
/// malformed `exports.txt`. A change to this generator reruns the build scripts through
/// their build-dependency on this crate.
pub fn generate(lib: &Library) {
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
        assert!(
            lib.nodes.iter().any(|(n, _)| *n == node),
            "unknown node {node}"
        );
        exports.push(Export {
            name: w[0].to_string(),
            node: node.to_string(),
            default,
            kind: w[2].to_string(),
        });
    }

    // The version script: each node lists its names; everything else is local.
    let mut map = String::new();
    for (i, (node, parent)) in lib.nodes.iter().enumerate() {
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
    let map_path = out.join(lib.soname.replace(".so.1", ".map"));
    std::fs::write(&map_path, map).unwrap();

    // The Rust side: one stub per unimplemented entry point; per export, a trampoline in
    // assembly that jumps to the Rust function and carries the versioned name. (`.symver`
    // needs its target defined in the same object file, which a Rust function in another
    // codegen unit is not.)
    let errno = lib.unsupported_errno;
    // The tail jump of a trampoline to its Rust function `{f}`.
    let mut rs = String::from(
        "#[cfg(target_arch = \"x86_64\")]\n\
         macro_rules! jump {\n    () => {\n        \"jmp {f}\"\n    };\n}\n\
         #[cfg(target_arch = \"aarch64\")]\n\
         macro_rules! jump {\n    () => {\n        \"b {f}\"\n    };\n}\n",
    );
    for (i, e) in exports.iter().enumerate() {
        let sym = format!("{}{}{}", e.name, if e.default { "@@" } else { "@" }, e.node);
        let tramp = format!("{}{i}", lib.trampoline_prefix);
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
                    "errno" => format!("{errno} as usize"),
                    "neg1" => format!("softroce_cabi::set_errno({errno}); usize::MAX"),
                    "ptr" => format!("softroce_cabi::set_errno({errno}); 0"),
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
             jump!(), \".size {tramp},.-{tramp}\", \".popsection\", \
             \".symver {tramp}, {sym}\", f = sym {target});"
        );
    }
    std::fs::write(out.join("exports.rs"), rs).unwrap();

    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{}", lib.soname);
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map_path.display()
    );

    // target/<profile>/softroce-libs/<soname> -> ../deps/<cdylib> (dangling until the
    // library is linked, a moment after this script). deps/ holds the library whether cargo
    // built it for `cargo build` (which also copies it up to target/<profile>/) or only for
    // `cargo test`.
    if let Some(profile_dir) = out.ancestors().nth(3) {
        link_library(profile_dir, lib);
    }
}

fn link_library(profile_dir: &Path, lib: &Library) {
    let dir = profile_dir.join("softroce-libs");
    let _ = std::fs::create_dir_all(&dir);
    let link = dir.join(lib.soname);
    let target = PathBuf::from("../deps").join(lib.cdylib);
    if std::fs::read_link(&link).ok().as_deref() != Some(target.as_path()) {
        let _ = std::fs::remove_file(&link);
        let _ = std::os::unix::fs::symlink(&target, &link);
    }
}
