//! The built library exports exactly the (symbol, version) pairs Debian 12's
//! libibverbs.so.1 (rdma-core 44) exports, with the same hidden/default split and the same
//! version nodes, plus softroce's private node; its SONAME is libibverbs.so.1 and
//! target/<profile>/softroce-libs/libibverbs.so.1 leads to it. Skipped, saying why, only when
//! the system library or objdump is missing (CI installs libibverbs-dev).

use softroce_cabi::elf_check as elf;

/// The version node of softroce's own entry points (src/mad.rs), the last one defined.
const PRIVATE_NODE: &str = "SOFTROCE_PRIVATE_1";

#[test]
fn exports_every_symbol_of_debians_libibverbs() {
    elf::assert_same_exports(
        "/usr/lib/x86_64-linux-gnu/libibverbs.so.1",
        "libibverbs-dev",
        &elf::built_lib("libsoftroce_capi.so"),
        Some(PRIVATE_NODE),
    );
}

#[test]
fn soname_is_libibverbs_so_1() {
    elf::assert_soname_and_link(&elf::built_lib("libsoftroce_capi.so"), "libibverbs.so.1");
}
