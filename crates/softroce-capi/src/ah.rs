//! Address handles: `ibv_create_ah`, `ibv_destroy_ah`, and the AH attributes that answer a
//! UD receive (`ibv_init_ah_from_wc`, `ibv_create_ah_from_wc`), over the engine's
//! `verbs::Ah`. [`ah_attr`] is the one conversion of an `ibv_ah_attr`, also used by
//! `ibv_modify_qp` (qp.rs), and [`ibv_ah_attr_of`] its way back for `ibv_query_qp`.

use crate::context::{ibv_query_gid, ibv_query_gid_type};
use crate::handle::{Castable, free, into_handle, try_ref};
use crate::pd::Pd;
use core::ffi::c_int;
use softroce::verbs::{self, AhAttr, GID_TBL_LEN, Gid};
use softroce::wire::grh::{GRH_LEN, Grh, flow_label};
use softroce_cabi::abi::*;
use softroce_cabi::{SetsErrno, ffi, neg_errno};

/// An address handle.
#[repr(C)]
pub(crate) struct Ah {
    pub ibv: ibv_ah,
    pub ah: verbs::Ah,
}

// SAFETY: `ibv_ah` is the first field of the `#[repr(C)]` `Ah` that `ibv_create_ah` boxes.
unsafe impl Castable for ibv_ah {
    type RustType = Ah;
}

/// The engine's address from an `ibv_ah_attr`. Errors: `EINVAL` without a GRH.
pub(crate) fn ah_attr(a: &ibv_ah_attr) -> Result<AhAttr, c_int> {
    // A RoCE port routes by GID: an address without a GRH is refused (as rxe, through
    // ib_core's rdma_check_ah_attr).
    if a.is_global == 0 {
        return Err(libc::EINVAL);
    }
    Ok(AhAttr {
        dgid: Gid(a.grh.dgid.raw),
        sgid_index: a.grh.sgid_index,
        flow_label: a.grh.flow_label,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        port_num: a.port_num,
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
    })
}

/// The `ibv_ah_attr` of an engine address (`ibv_query_qp`): [`ah_attr`] read back, with
/// `is_global` 1 (the only kind [`ah_attr`] takes).
pub(crate) fn ibv_ah_attr_of(a: &AhAttr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: a.dgid.0 },
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: 1,
        port_num: a.port_num,
    }
}

pub(crate) extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    ffi!({
        // SAFETY: NULL or a live PD, NULL or a readable attr.
        let (p, a): (&Pd, _) = unsafe { (try_ref(pd)?, attr.as_ref().ok_or(libc::EINVAL)?) };
        let ah = p.pd.create_ah(&ah_attr(a)?).map_err(|e| e.errno())?;
        p.users.hold();
        Ok(into_handle(Ah {
            ibv: ibv_ah {
                context: p.ibv.context,
                pd,
                handle: 0,
            },
            ah,
        }))
    })
}

/// `IBV_GID_TYPE_SYSFS_IB_ROCE_V1` and `IBV_GID_TYPE_SYSFS_ROCE_V2` (what
/// `ibv_query_gid_type` reports).
const GID_TYPE_SYSFS_ROCE_V1: u32 = 0;
const GID_TYPE_SYSFS_ROCE_V2: u32 = 1;
/// The IPv6 next header that marks a RoCE v1 GRH (the IB BTH), as libibverbs names it.
const IB_NEXT_HDR: u8 = 0x1b;

/// The GID index of `port_num` whose GID is `gid` and whose type is `gid_type`, found as
/// libibverbs' `ibv_find_gid_index` finds it: walking the table from index 0 with
/// `ibv_query_gid` and `ibv_query_gid_type` until one matches or a query fails (past the
/// table: -1, errno EINVAL).
fn find_gid_index(ctx: *mut ibv_context, port_num: u8, gid: &[u8; 16], gid_type: u32) -> c_int {
    for i in 0..GID_TBL_LEN as c_int {
        let mut g = ibv_gid { raw: [0; 16] };
        if ibv_query_gid(ctx, port_num, i, &mut g) != 0 {
            return -1;
        }
        let mut t = 0u32;
        if ibv_query_gid_type(ctx, port_num, i as u32, &mut t) != 0 {
            return -1;
        }
        if g.raw == *gid && t == gid_type {
            return i;
        }
    }
    // The index past the table fails as every query there does.
    let mut g = ibv_gid { raw: [0; 16] };
    ibv_query_gid(ctx, port_num, GID_TBL_LEN as c_int, &mut g)
}

/// `ibv_init_ah_from_wc`: the address handle attributes that answer a UD receive, computed
/// as libibverbs 44 computes them (generic code in rdma-core, the same on rxe). Always:
/// `dlid`, `sl`, `src_path_bits` from the WC, `port_num`, and `grh.flow_label` from the
/// GRH area's first word. With `IBV_WC_GRH` (every softroce UD receive has it),
/// `is_global` = 1 and, for an IPv4 header (in the area's last 20 bytes): `dgid` = the
/// IPv4-mapped source address, `sgid_index` = the RoCE v2 GID of the destination address,
/// `hop_limit` = its TTL, `traffic_class` = its TOS byte; for an IPv6 header: `dgid` = its
/// source, `sgid_index` = the GID of its destination (RoCE v2 when the next header is UDP,
/// v1 for 0x1b), `hop_limit` and `traffic_class` from it. Without `IBV_WC_GRH` it returns
/// 0 with `is_global` = 0 (which `ibv_create_ah` then refuses on a RoCE port).
///
/// Errors (-1, errno): `EINVAL` for a multicast destination or when no GID of the port
/// matches (the failing `ibv_query_gid` past the table); `EPROTONOSUPPORT` for a GRH area
/// that is neither IPv4 nor IPv6 or an IPv6 next header other than UDP / 0x1b; `EINVAL`
/// for a NULL argument (libibverbs would crash). Source: libibverbs 44 `verbs.c`
/// (`ibv_init_ah_from_wc`, `set_ah_attr_by_ipv4`, `set_ah_attr_by_ipv6`,
/// `ibv_find_gid_index`).
pub(crate) extern "C" fn ibv_init_ah_from_wc(
    ctx: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut u8,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    ffi!({
        if ctx.is_null() || wc.is_null() || grh.is_null() || ah_attr.is_null() {
            return Err(libc::EINVAL);
        }
        let mut g = [0u8; GRH_LEN];
        // SAFETY: the caller's work completion (readable) and its 40-byte GRH area, which
        // is the program's receive buffer: copied out, never referenced.
        let wc = unsafe {
            std::ptr::copy_nonoverlapping(grh.cast_const(), g.as_mut_ptr(), GRH_LEN);
            wc.read_unaligned()
        };
        let mut a = ibv_ah_attr {
            dlid: wc.slid,
            sl: wc.sl,
            src_path_bits: wc.dlid_path_bits,
            port_num,
            ..Default::default()
        };
        a.grh.flow_label = flow_label(&g);
        let mut ret = 0;
        if wc.wc_flags & IBV_WC_GRH != 0 {
            a.is_global = 1;
            ret = match Grh::parse(&g) {
                // A multicast destination is in no GID table.
                Some(h) if h.dst.is_multicast() => neg_errno(libc::EINVAL),
                Some(h) if h.is_ipv4() => {
                    let i = find_gid_index(
                        ctx,
                        port_num,
                        &Gid::from_ip(h.dst).0,
                        GID_TYPE_SYSFS_ROCE_V2,
                    );
                    if i >= 0 {
                        a.grh.dgid.raw = Gid::from_ip(h.src).0;
                        a.grh.sgid_index = i as u8;
                        a.grh.hop_limit = h.hop_limit;
                        a.grh.traffic_class = h.traffic_class;
                    }
                    i.min(0)
                }
                Some(h) => {
                    let gid_type = match h.next_header {
                        17 => Some(GID_TYPE_SYSFS_ROCE_V2),
                        IB_NEXT_HDR => Some(GID_TYPE_SYSFS_ROCE_V1),
                        _ => None,
                    };
                    match gid_type {
                        None => neg_errno(libc::EPROTONOSUPPORT),
                        Some(t) => {
                            a.grh.dgid.raw = Gid::from_ip(h.src).0;
                            let i = find_gid_index(ctx, port_num, &Gid::from_ip(h.dst).0, t);
                            if i >= 0 {
                                a.grh.sgid_index = i as u8;
                                a.grh.hop_limit = h.hop_limit;
                                a.grh.traffic_class = h.traffic_class;
                            }
                            i.min(0)
                        }
                    }
                }
                None => neg_errno(libc::EPROTONOSUPPORT),
            };
        }
        // SAFETY: writable (the caller's contract). libibverbs fills it even on failure.
        unsafe { ah_attr.write_unaligned(a) };
        // 0, or -1 with the errno set above.
        Ok(ret)
    })
}

/// `ibv_create_ah_from_wc`: [`ibv_init_ah_from_wc`], then `ibv_create_ah`.
pub(crate) extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut u8,
    port_num: u8,
) -> *mut ibv_ah {
    ffi!({
        // SAFETY: NULL or a live PD.
        let p: &Pd = unsafe { try_ref(pd) }?;
        let mut a = ibv_ah_attr::default();
        if ibv_init_ah_from_wc(p.ibv.context, port_num, wc, grh, &mut a) != 0 {
            // NULL with the errno ibv_init_ah_from_wc set.
            return Ok(std::ptr::null_mut());
        }
        Ok(ibv_create_ah(pd, &mut a))
    })
}

pub(crate) extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    ffi!(SetsErrno, {
        // SAFETY: NULL or a live AH; its PD is live while it is.
        let p: &Pd = unsafe { try_ref(try_ref(ah)?.ibv.pd) }?;
        p.users.release();
        // SAFETY: a live AH the caller gives up.
        unsafe { free(ah) };
        Ok(())
    })
}
