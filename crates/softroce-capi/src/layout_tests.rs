//! Every mirrored struct of [`softroce_cabi::abi`] against the installed `<infiniband/verbs.h>`: a C
//! program compiled with `cc` prints `sizeof`, `_Alignof` and every field's `offsetof`; the
//! Rust side prints the same with `size_of`/`align_of`/`offset_of!`; both must agree. The
//! same for the value of every `IBV_*` constant it mirrors.
//! Skipped, saying why, only when `cc` or the header is missing.

use softroce_cabi::abi::*;
use std::mem::{align_of, offset_of, size_of};
use std::process::Command;

/// (C type, size, alignment, [(C field, offset)]) of each mirrored struct.
type Layout = (&'static str, usize, usize, Vec<(&'static str, usize)>);

macro_rules! layouts {
    ($($ty:ident $(as $cty:literal)? { $($f:ident $(as $cf:literal)?),* $(,)? })*) => {
        vec![$(
            (
                layouts!(@name concat!("struct ", stringify!($ty)) $(, $cty)?),
                size_of::<$ty>(),
                align_of::<$ty>(),
                vec![$((layouts!(@name stringify!($f) $(, $cf)?), offset_of!($ty, $f))),*],
            )
        ),*]
    };
    (@name $default:expr) => { $default };
    (@name $default:expr, $given:literal) => { $given };
}

fn rust_layouts() -> Vec<Layout> {
    layouts! {
        ibv_device { _ops, node_type, transport_type, name, dev_name, dev_path, ibdev_path }
        ibv_context_ops {
            _compat_query_device, _compat_query_port, alloc_mw, bind_mw, dealloc_mw, poll_cq,
            req_notify_cq, post_srq_recv, post_send, post_recv, _compat_async_event
        }
        ibv_context { device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat }
        verbs_context {
            query_port, advise_mr, create_cq_ex, priv_ as "priv", query_device_ex,
            abi_placeholder2 as "ABI_placeholder2", abi_placeholder1 as "ABI_placeholder1",
            open_qp, create_qp_ex, close_xrcd, _abi_placeholder3 as "_ABI_placeholder3", sz,
            context
        }
        ibv_device_attr {
            fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id,
            vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge, max_sge_rd,
            max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom,
            max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap, max_ee, max_rdd, max_mw,
            max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp, max_mcast_qp_attach,
            max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq, max_srq_wr,
            max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt
        }
        ibv_query_device_ex_input { comp_mask }
        ibv_device_attr_ex { orig_attr, comp_mask, xrc_odp_caps, phys_port_cnt_ex }
        ibv_port_attr {
            state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz, bad_pkey_cntr,
            qkey_viol_cntr, pkey_tbl_len, lid, sm_lid, lmc, max_vl_num, sm_sl, subnet_timeout,
            init_type_reply, active_width, active_speed, phys_state, link_layer, flags,
            port_cap_flags2
        }
        ibv_gid as "union ibv_gid" { raw }
        ibv_gid_entry { gid, gid_index, port_num, gid_type, ndev_ifindex }
        ibv_pd { context, handle }
        ibv_mr { context, pd, addr, length, handle, lkey, rkey }
        ibv_comp_channel { context, fd, refcnt }
        ibv_cq {
            context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
            async_events_completed
        }
        ibv_srq { context, srq_context, pd, handle, mutex, cond, events_completed }
        ibv_qp {
            context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type, mutex,
            cond, events_completed
        }
        ibv_ah { context, pd, handle }
        ibv_global_route { dgid, flow_label, sgid_index, hop_limit, traffic_class }
        ibv_ah_attr { grh, dlid, sl, src_path_bits, static_rate, is_global, port_num }
        ibv_qp_cap { max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data }
        ibv_qp_attr {
            qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn, dest_qp_num,
            qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index, alt_pkey_index,
            en_sqd_async_notify, sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer,
            port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout, rate_limit
        }
        ibv_qp_init_attr { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all }
        ibv_srq_attr { max_wr, max_sge, srq_limit }
        ibv_srq_init_attr { srq_context, attr }
        ibv_sge { addr, length, lkey }
        ibv_recv_wr { wr_id, next, sg_list, num_sge }
        ibv_send_wr {
            wr_id, next, sg_list, num_sge, opcode, send_flags, imm_data, wr,
            remote_srqn as "qp_type", bind_mw
        }
        ibv_mw { context, pd, rkey, handle, type_ as "type" }
        ibv_mw_bind_info { mr, addr, length, mw_access_flags }
        ibv_mw_bind { wr_id, send_flags, bind_info }
        ibv_send_wr_bind_mw as "__typeof__(((struct ibv_send_wr *)0)->bind_mw)" {
            mw, rkey, bind_info
        }
        ibv_send_wr_rdma as "__typeof__(((struct ibv_send_wr *)0)->wr.rdma)" { remote_addr, rkey }
        ibv_send_wr_atomic as "__typeof__(((struct ibv_send_wr *)0)->wr.atomic)" {
            remote_addr, compare_add, swap, rkey
        }
        ibv_send_wr_ud as "__typeof__(((struct ibv_send_wr *)0)->wr.ud)" {
            ah, remote_qpn, remote_qkey
        }
        ibv_send_wr_wr as "__typeof__(((struct ibv_send_wr *)0)->wr)" {}
        ibv_wc {
            wr_id, status, opcode, vendor_err, byte_len, imm_data, qp_num, src_qp, wc_flags,
            pkey_index, slid, sl, dlid_path_bits
        }
        ibv_async_event { element, event_type }
        ibv_rx_hash_conf {
            rx_hash_function, rx_hash_key_len, rx_hash_key, rx_hash_fields_mask
        }
        ibv_qp_init_attr_ex {
            qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all, comp_mask, pd, xrcd,
            create_flags, max_tso_header, rwq_ind_tbl, rx_hash_conf, source_qpn, send_ops_flags
        }
        ibv_data_buf { addr, length }
        ibv_qp_ex {
            qp_base, comp_mask, wr_id, wr_flags, wr_atomic_cmp_swp, wr_atomic_fetch_add,
            wr_bind_mw, wr_local_inv, wr_rdma_read, wr_rdma_write, wr_rdma_write_imm, wr_send,
            wr_send_imm, wr_send_inv, wr_send_tso, wr_set_ud_addr, wr_set_xrc_srqn,
            wr_set_inline_data, wr_set_inline_data_list, wr_set_sge, wr_set_sge_list, wr_start,
            wr_complete, wr_abort, wr_atomic_write
        }
        ibv_cq_init_attr_ex {
            cqe, cq_context, channel, comp_vector, wc_flags, comp_mask, flags, parent_domain
        }
        ibv_poll_cq_attr { comp_mask }
        ibv_cq_ex {
            context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
            async_events_completed, comp_mask, status, wr_id, start_poll, next_poll, end_poll,
            read_opcode, read_vendor_err, read_byte_len, read_imm_data, read_qp_num, read_src_qp,
            read_wc_flags, read_slid, read_sl, read_dlid_path_bits, read_completion_ts,
            read_cvlan, read_flow_tag, read_tm_info, read_completion_wallclock_ns
        }
    }
}

fn render(layouts: &[Layout]) -> String {
    let mut out = String::new();
    for (ty, size, align, fields) in layouts {
        out += &format!("{ty} size {size} align {align}\n");
        for (f, off) in fields {
            out += &format!("{ty} .{f} {off}\n");
        }
    }
    out
}

fn c_program(layouts: &[Layout]) -> String {
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\n\
         int main(void) {\n",
    );
    for (ty, _, _, fields) in layouts {
        c += &format!(
            "  printf(\"%s size %zu align %zu\\n\", \"{ty}\", sizeof({ty}), _Alignof({ty}));\n"
        );
        for (f, _) in fields {
            c += &format!("  printf(\"%s .%s %zu\\n\", \"{ty}\", \"{f}\", offsetof({ty}, {f}));\n");
        }
    }
    c + "  return 0;\n}\n"
}

/// Compiles `program` against the installed headers and runs it: its stdout, or None (and
/// a SKIPPED line saying why) when verbs.h or `cc` is missing.
fn run_c(tag: &str, program: &str) -> Option<String> {
    if !std::path::Path::new("/usr/include/infiniband/verbs.h").exists() {
        println!(
            "SKIPPED: /usr/include/infiniband/verbs.h is missing (apt-get install libibverbs-dev)"
        );
        return None;
    }
    let dir = std::env::temp_dir().join(format!("softroce-capi-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{tag}.c"));
    let exe = dir.join(tag);
    std::fs::write(&src, program).unwrap();
    let cc = match Command::new("cc").arg("-o").arg(&exe).arg(&src).output() {
        Ok(o) => o,
        Err(e) => {
            println!("SKIPPED: cannot run cc: {e}");
            return None;
        }
    };
    assert!(
        cc.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    let _ = std::fs::remove_dir_all(&dir);
    Some(String::from_utf8(run.stdout).unwrap())
}

#[test]
fn structs_match_installed_verbs_h() {
    let layouts = rust_layouts();
    let Some(c_side) = run_c("layout", &c_program(&layouts)) else {
        return;
    };
    let rust_side = render(&layouts);
    let diff: Vec<String> = c_side
        .lines()
        .zip(rust_side.lines())
        .filter(|(c, r)| c != r)
        .map(|(c, r)| format!("verbs.h: {c}\n   Rust: {r}"))
        .collect();
    assert!(diff.is_empty(), "layout differs:\n{}", diff.join("\n"));
    assert_eq!(c_side.lines().count(), rust_side.lines().count());
    println!(
        "{} structs, {} lines checked",
        layouts.len(),
        c_side.lines().count()
    );
}

/// (name, value) of each `IBV_*` constant of [`softroce_cabi::abi`] that mirrors a verbs.h
/// enum member or macro.
macro_rules! constants {
    ($($name:ident),* $(,)?) => {
        vec![$((stringify!($name), i64::from($name))),*]
    };
}

fn rust_constants() -> Vec<(&'static str, i64)> {
    constants![
        IBV_QPT_RC,
        IBV_QPT_UC,
        IBV_QPT_UD,
        IBV_QPT_XRC_RECV,
        IBV_QPS_RESET,
        IBV_QPS_INIT,
        IBV_QPS_RTR,
        IBV_QPS_RTS,
        IBV_QPS_SQD,
        IBV_QPS_SQE,
        IBV_QPS_ERR,
        IBV_QP_STATE,
        IBV_QP_CUR_STATE,
        IBV_QP_EN_SQD_ASYNC_NOTIFY,
        IBV_QP_ACCESS_FLAGS,
        IBV_QP_PKEY_INDEX,
        IBV_QP_PORT,
        IBV_QP_QKEY,
        IBV_QP_AV,
        IBV_QP_PATH_MTU,
        IBV_QP_TIMEOUT,
        IBV_QP_RETRY_CNT,
        IBV_QP_RNR_RETRY,
        IBV_QP_RQ_PSN,
        IBV_QP_MAX_QP_RD_ATOMIC,
        IBV_QP_ALT_PATH,
        IBV_QP_MIN_RNR_TIMER,
        IBV_QP_SQ_PSN,
        IBV_QP_MAX_DEST_RD_ATOMIC,
        IBV_QP_PATH_MIG_STATE,
        IBV_QP_CAP,
        IBV_QP_DEST_QPN,
        IBV_ACCESS_LOCAL_WRITE,
        IBV_ACCESS_REMOTE_WRITE,
        IBV_ACCESS_REMOTE_READ,
        IBV_ACCESS_REMOTE_ATOMIC,
        IBV_ACCESS_MW_BIND,
        IBV_ACCESS_ZERO_BASED,
        IBV_ACCESS_OPTIONAL_RANGE,
        IBV_MW_TYPE_1,
        IBV_MW_TYPE_2,
        IBV_WR_RDMA_WRITE,
        IBV_WR_RDMA_WRITE_WITH_IMM,
        IBV_WR_SEND,
        IBV_WR_SEND_WITH_IMM,
        IBV_WR_RDMA_READ,
        IBV_WR_ATOMIC_CMP_AND_SWP,
        IBV_WR_ATOMIC_FETCH_AND_ADD,
        IBV_WR_LOCAL_INV,
        IBV_WR_BIND_MW,
        IBV_WR_SEND_WITH_INV,
        IBV_WC_SEND,
        IBV_WC_RDMA_WRITE,
        IBV_WC_RDMA_READ,
        IBV_WC_COMP_SWAP,
        IBV_WC_FETCH_ADD,
        IBV_WC_BIND_MW,
        IBV_WC_LOCAL_INV,
        IBV_WC_RECV,
        IBV_WC_RECV_RDMA_WITH_IMM,
        IBV_WC_GRH,
        IBV_GID_TYPE_ROCE_V2,
        IBV_LINK_LAYER_UNSPECIFIED,
        IBV_LINK_LAYER_ETHERNET,
        IBV_QP_INIT_ATTR_PD,
        IBV_QP_INIT_ATTR_CREATE_FLAGS,
        IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
        IBV_QP_INIT_ATTR_XRCD,
    ]
}

#[test]
fn constants_match_installed_verbs_h() {
    let want = rust_constants();
    let mut c =
        String::from("#include <stdio.h>\n#include <infiniband/verbs.h>\nint main(void) {\n");
    for (name, _) in &want {
        c += &format!("  printf(\"{name} %lld\\n\", (long long)({name}));\n");
    }
    c += "  return 0;\n}\n";
    let Some(c_side) = run_c("constants", &c) else {
        return;
    };
    let rust_side: String = want.iter().map(|(n, v)| format!("{n} {v}\n")).collect();
    let diff: Vec<String> = c_side
        .lines()
        .zip(rust_side.lines())
        .filter(|(c, r)| c != r)
        .map(|(c, r)| format!("verbs.h: {c}\n   Rust: {r}"))
        .collect();
    assert!(diff.is_empty(), "constants differ:\n{}", diff.join("\n"));
    assert_eq!(c_side.lines().count(), want.len());
    println!("{} constants checked", want.len());
}
