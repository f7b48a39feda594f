//! libibverbs.so.1's exports, version script, SONAME and softroce-libs link, made by the
//! generator shared with softroce-rdmacm (softroce_cabi::exports) from `exports.txt`.

use softroce_cabi::exports as build_exports;

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

fn main() {
    build_exports::generate(&build_exports::Library {
        nodes: NODES,
        soname: "libibverbs.so.1",
        cdylib: "libsoftroce_capi.so",
        trampoline_prefix: "softroce_export_",
        unsupported_errno: "libc::EOPNOTSUPP",
    });
}
