//! The Rust mirrors of `<rdma/rdma_cma.h>`'s structs (src/abi.rs) have the installed
//! header's sizes and field offsets: a C program compiled against it prints them. Skipped,
//! saying why, only when cc or the header is missing (CI installs librdmacm-dev).

use softroce_rdmacm::abi::*;
use std::mem::{offset_of, size_of};
use std::path::Path;
use std::process::Command;

const HEADER: &str = "/usr/include/rdma/rdma_cma.h";

/// (C expression, Rust value) pairs.
fn expected() -> Vec<(&'static str, usize)> {
    vec![
        (
            "sizeof(struct rdma_event_channel)",
            size_of::<rdma_event_channel>(),
        ),
        (
            "sizeof(struct ibv_sa_path_rec)",
            size_of::<ibv_sa_path_rec>(),
        ),
        (
            "offsetof(struct ibv_sa_path_rec, flow_label)",
            offset_of!(ibv_sa_path_rec, flow_label),
        ),
        (
            "offsetof(struct ibv_sa_path_rec, pkey)",
            offset_of!(ibv_sa_path_rec, pkey),
        ),
        (
            "offsetof(struct ibv_sa_path_rec, mtu)",
            offset_of!(ibv_sa_path_rec, mtu),
        ),
        (
            "offsetof(struct ibv_sa_path_rec, preference)",
            offset_of!(ibv_sa_path_rec, preference),
        ),
        ("sizeof(struct rdma_addr)", size_of::<rdma_addr>()),
        (
            "offsetof(struct rdma_addr, dst_addr)",
            offset_of!(rdma_addr, dst_storage),
        ),
        (
            "offsetof(struct rdma_addr, addr.ibaddr.pkey)",
            offset_of!(rdma_addr, ibaddr) + offset_of!(rdma_ib_addr, pkey),
        ),
        ("sizeof(struct rdma_route)", size_of::<rdma_route>()),
        (
            "offsetof(struct rdma_route, path_rec)",
            offset_of!(rdma_route, path_rec),
        ),
        (
            "offsetof(struct rdma_route, num_paths)",
            offset_of!(rdma_route, num_paths),
        ),
        ("sizeof(struct rdma_cm_id)", size_of::<rdma_cm_id>()),
        (
            "offsetof(struct rdma_cm_id, qp)",
            offset_of!(rdma_cm_id, qp),
        ),
        (
            "offsetof(struct rdma_cm_id, route)",
            offset_of!(rdma_cm_id, route),
        ),
        (
            "offsetof(struct rdma_cm_id, ps)",
            offset_of!(rdma_cm_id, ps),
        ),
        (
            "offsetof(struct rdma_cm_id, port_num)",
            offset_of!(rdma_cm_id, port_num),
        ),
        (
            "offsetof(struct rdma_cm_id, event)",
            offset_of!(rdma_cm_id, event),
        ),
        (
            "offsetof(struct rdma_cm_id, send_cq)",
            offset_of!(rdma_cm_id, send_cq),
        ),
        (
            "offsetof(struct rdma_cm_id, recv_cq)",
            offset_of!(rdma_cm_id, recv_cq),
        ),
        (
            "offsetof(struct rdma_cm_id, pd)",
            offset_of!(rdma_cm_id, pd),
        ),
        (
            "offsetof(struct rdma_cm_id, qp_type)",
            offset_of!(rdma_cm_id, qp_type),
        ),
        (
            "sizeof(struct rdma_conn_param)",
            size_of::<rdma_conn_param>(),
        ),
        (
            "offsetof(struct rdma_conn_param, rnr_retry_count)",
            offset_of!(rdma_conn_param, rnr_retry_count),
        ),
        (
            "offsetof(struct rdma_conn_param, qp_num)",
            offset_of!(rdma_conn_param, qp_num),
        ),
        ("sizeof(struct rdma_ud_param)", size_of::<rdma_ud_param>()),
        (
            "offsetof(struct rdma_ud_param, ah_attr)",
            offset_of!(rdma_ud_param, ah_attr),
        ),
        (
            "offsetof(struct rdma_ud_param, qkey)",
            offset_of!(rdma_ud_param, qkey),
        ),
        ("sizeof(struct rdma_cm_event)", size_of::<rdma_cm_event>()),
        (
            "offsetof(struct rdma_cm_event, status)",
            offset_of!(rdma_cm_event, status),
        ),
        (
            "offsetof(struct rdma_cm_event, param)",
            offset_of!(rdma_cm_event, param),
        ),
        (
            "sizeof(struct rdma_cm_join_mc_attr_ex)",
            size_of::<rdma_cm_join_mc_attr_ex>(),
        ),
        (
            "offsetof(struct rdma_cm_join_mc_attr_ex, join_flags)",
            offset_of!(rdma_cm_join_mc_attr_ex, join_flags),
        ),
        (
            "offsetof(struct rdma_cm_join_mc_attr_ex, addr)",
            offset_of!(rdma_cm_join_mc_attr_ex, addr),
        ),
        (
            "sizeof(struct ibv_srq_init_attr_ex)",
            size_of::<ibv_srq_init_attr_ex>(),
        ),
        (
            "offsetof(struct ibv_srq_init_attr_ex, comp_mask)",
            offset_of!(ibv_srq_init_attr_ex, comp_mask),
        ),
        (
            "offsetof(struct ibv_srq_init_attr_ex, pd)",
            offset_of!(ibv_srq_init_attr_ex, pd),
        ),
        (
            "offsetof(struct ibv_srq_init_attr_ex, cq)",
            offset_of!(ibv_srq_init_attr_ex, cq),
        ),
        (
            "offsetof(struct ibv_srq_init_attr_ex, tm_cap)",
            offset_of!(ibv_srq_init_attr_ex, tm_cap),
        ),
        (
            "sizeof(struct ibv_xrcd_init_attr)",
            size_of::<ibv_xrcd_init_attr>(),
        ),
        (
            "sizeof(struct ibv_qp_init_attr_ex)",
            size_of::<ibv_qp_init_attr_ex>(),
        ),
        (
            "offsetof(struct ibv_qp_init_attr_ex, pd)",
            offset_of!(ibv_qp_init_attr_ex, pd),
        ),
        (
            "offsetof(struct verbs_context, create_qp_ex)",
            offset_of!(verbs_context, create_qp_ex),
        ),
        (
            "offsetof(struct verbs_context, create_srq_ex)",
            offset_of!(verbs_context, create_srq_ex),
        ),
        (
            "offsetof(struct verbs_context, open_xrcd)",
            offset_of!(verbs_context, open_xrcd),
        ),
        (
            "offsetof(struct verbs_context, context)",
            offset_of!(verbs_context, context),
        ),
    ]
}

#[test]
fn rdma_cma_layouts_match_the_installed_header() {
    if !Path::new(HEADER).exists() {
        println!("SKIPPED: {HEADER} is not installed (apt-get install librdmacm-dev)");
        return;
    }
    let want = expected();
    let dir = std::env::temp_dir().join(format!("softroce-rdmacm-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <rdma/rdma_cma.h>\nint main(void) {\n",
    );
    for (expr, _) in &want {
        c.push_str(&format!("  printf(\"%zu\\n\", (size_t)({expr}));\n"));
    }
    c.push_str("  return 0;\n}\n");
    std::fs::write(dir.join("layout.c"), c).unwrap();
    let exe = dir.join("layout");
    let built = match Command::new("cc")
        .arg(dir.join("layout.c"))
        .arg("-o")
        .arg(&exe)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            println!("SKIPPED: no C compiler ({e})");
            return;
        }
    };
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let got: Vec<usize> = text.lines().map(|l| l.parse().unwrap()).collect();
    let _ = std::fs::remove_dir_all(&dir);
    let wrong: Vec<String> = want
        .iter()
        .zip(&got)
        .filter(|((_, r), c)| r != *c)
        .map(|((e, r), c)| format!("{e}: C {c}, Rust {r}"))
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
}
