//! librdmacm.so.1's exports, version script, SONAME and softroce-libs link (beside
//! softroce-capi's libibverbs.so.1, so that `softroce exec` loads both), made by
//! the generator both C libraries share (softroce_cabi::exports) from `exports.txt`.

use softroce_cabi::exports as build_exports;

/// The version nodes and their parents, as in rdma-core's librdmacm/librdmacm.map.
const NODES: &[(&str, Option<&str>)] = &[
    ("RDMACM_1.0", None),
    ("RDMACM_1.1", Some("RDMACM_1.0")),
    ("RDMACM_1.2", Some("RDMACM_1.1")),
    ("RDMACM_1.3", Some("RDMACM_1.2")),
];

fn main() {
    build_exports::generate(&build_exports::Library {
        nodes: NODES,
        soname: "librdmacm.so.1",
        cdylib: "libsoftroce_rdmacm.so",
        trampoline_prefix: "softroce_rdmacm_export_",
        unsupported_errno: "libc::ENOSYS",
    });
}
