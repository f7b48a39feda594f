//! Every mirrored struct of [`softroce_cabi::abi`] against the installed `<infiniband/verbs.h>`: a C
//! program compiled with `cc` prints `sizeof`, `_Alignof` and every field's `offsetof`; the
//! Rust side prints the same with `size_of`/`align_of`/`offset_of!`; both must agree.
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

#[test]
fn structs_match_installed_verbs_h() {
    if !std::path::Path::new("/usr/include/infiniband/verbs.h").exists() {
        println!(
            "SKIPPED: /usr/include/infiniband/verbs.h is missing (apt-get install libibverbs-dev)"
        );
        return;
    }
    let layouts = rust_layouts();
    let dir = std::env::temp_dir().join(format!("softroce-capi-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c_program(&layouts)).unwrap();
    let cc = match Command::new("cc").arg("-o").arg(&exe).arg(&src).output() {
        Ok(o) => o,
        Err(e) => {
            println!("SKIPPED: cannot run cc: {e}");
            return;
        }
    };
    assert!(
        cc.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    let c_side = String::from_utf8(run.stdout).unwrap();
    let rust_side = render(&layouts);
    let _ = std::fs::remove_dir_all(&dir);
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
