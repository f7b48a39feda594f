//! Contexts (an open device): the `Context` behind an `ibv_context`, and the queries made
//! on one (`ibv_query_device`, `ibv_query_port`, the GID and P_Key tables, async events).
//! Opening and closing a device is `device.rs`'s.

use crate::handle::{Castable, try_ref};
use crate::strings::copy_str;
use core::ffi::{c_int, c_void};
use parking_lot::Mutex;
use softroce::net::UdpDevice;
use softroce::net::discover::DeviceAddr;
use softroce::verbs::EventElement;
use softroce_cabi::abi::*;
use softroce_cabi::{SetsErrno, ffi};
use std::collections::HashMap;
use std::sync::Arc;

/// An open device: the `verbs_context` (whose `context` is the `ibv_context` programs hold),
/// then softroce's state.
#[repr(C)]
pub(crate) struct Context {
    pub vctx: verbs_context,
    pub dev: Arc<UdpDevice>,
    /// The address of the device of the list this context opened.
    pub addr: &'static DeviceAddr,
    /// CQ number → its `*mut ibv_cq` handle, for `ibv_get_cq_event` and CQ async events.
    pub cqs: Mutex<HashMap<u32, usize>>,
    /// QP number → `*mut Qp`, for QP async events.
    pub qps: Mutex<HashMap<u32, usize>>,
    /// SRQ number → `*mut Srq`, for SRQ async events.
    pub srqs: Mutex<HashMap<u32, usize>>,
    /// `ibv_context.cmd_fd`: softroce has no uverbs command file, so this is `/dev/null`,
    /// open for the context's life. Programs that only `dup` it (pyverbs' shared-PD test,
    /// before `ibv_import_device`) get a valid descriptor, and `ibv_import_device` then says
    /// EOPNOTSUPP, as rdma-core does for a device that cannot import.
    pub cmd_fd: Option<std::os::fd::OwnedFd>,
}

impl Context {
    /// The `element` of an async event about `e`: the object's `ibv_qp`, `ibv_cq` or
    /// `ibv_srq`, or the port number; None when the object has been destroyed.
    fn element_of(&self, e: EventElement) -> Option<*mut c_void> {
        let known = |m: &Mutex<HashMap<u32, usize>>, n: u32| m.lock().get(&n).copied();
        match e {
            EventElement::Qp(n) => known(&self.qps, n),
            EventElement::Cq(n) => known(&self.cqs, n),
            EventElement::Srq(n) => known(&self.srqs, n),
            EventElement::Port(p) => Some(usize::from(p)),
        }
        .map(|a| a as *mut c_void)
    }
}

// SAFETY: a context's `ibv_context` is `vctx.context` of a `#[repr(C)]` `Context`, boxed by
// `ibv_open_device` (`into_handle`).
unsafe impl Castable for ibv_context {
    type RustType = Context;
    const OFFSET: usize =
        std::mem::offset_of!(Context, vctx) + std::mem::offset_of!(verbs_context, context);
}

fn fill_device_attr(c: &Context, out: &mut ibv_device_attr) {
    let a = c.dev.device().query_device();
    // SAFETY: ibv_device_attr is plain old data; all zeros is a valid value.
    *out = unsafe { std::mem::zeroed() };
    copy_str(&mut out.fw_ver, &a.fw_ver);
    out.node_guid = a.node_guid.to_be();
    out.sys_image_guid = a.sys_image_guid.to_be();
    out.max_mr_size = a.max_mr_size;
    out.page_size_cap = a.page_size_cap;
    out.vendor_id = a.vendor_id;
    out.vendor_part_id = a.vendor_part_id;
    out.hw_ver = a.hw_ver;
    out.max_qp = a.max_qp as c_int;
    out.max_qp_wr = a.max_qp_wr as c_int;
    out.device_cap_flags = a.device_cap_flags;
    out.max_sge = a.max_sge as c_int;
    out.max_sge_rd = a.max_sge_rd as c_int;
    out.max_cq = a.max_cq as c_int;
    out.max_cqe = (a.max_cqe - 1) as c_int;
    out.max_mr = a.max_mr as c_int;
    out.max_pd = a.max_pd as c_int;
    out.max_qp_rd_atom = a.max_qp_rd_atom as c_int;
    out.max_res_rd_atom = a.max_res_rd_atom as c_int;
    out.max_qp_init_rd_atom = a.max_qp_init_rd_atom as c_int;
    out.atomic_cap = a.atomic_cap as c_int;
    out.max_mw = a.max_mw as c_int;
    out.max_mcast_grp = a.max_mcast_grp as c_int;
    out.max_mcast_qp_attach = a.max_mcast_qp_attach as c_int;
    out.max_total_mcast_qp_attach = a.max_total_mcast_qp_attach as c_int;
    out.max_ah = a.max_ah as c_int;
    out.max_srq = a.max_srq as c_int;
    out.max_srq_wr = a.max_srq_wr as c_int;
    out.max_srq_sge = a.max_srq_sge as c_int;
    out.max_pkeys = a.max_pkeys;
    out.local_ca_ack_delay = a.local_ca_ack_delay;
    out.phys_port_cnt = a.phys_port_cnt;
}

pub(crate) extern "C" fn ibv_query_device(
    ctx: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    ffi!(SetsErrno, {
        // SAFETY: NULL or a live context, NULL or a writable attribute struct (the
        // caller's contract).
        let (c, attr) = unsafe { (try_ref(ctx)?, attr.as_mut().ok_or(libc::EINVAL)?) };
        fill_device_attr(c, attr);
        Ok(())
    })
}

/// `verbs_context.query_device_ex`: `orig_attr` and zeros (no extended capabilities).
pub(crate) unsafe extern "C" fn query_device_ex_op(
    ctx: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    ffi!(SetsErrno, {
        // SAFETY: `input` is NULL or readable (the caller's contract).
        if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
            return Err(libc::EINVAL);
        }
        if attr.is_null() || attr_size < std::mem::size_of::<ibv_device_attr>() {
            return Err(libc::EINVAL);
        }
        // SAFETY: `attr` is writable for `attr_size` bytes and `ctx` is a live context.
        unsafe {
            std::ptr::write_bytes(attr.cast::<u8>(), 0, attr_size);
            let Ok(c) = try_ref(ctx) else {
                // verbs.h's inline ibv_query_device_ex only calls this on a live context.
                return Err(libc::EINVAL);
            };
            fill_device_attr(c, &mut (*attr).orig_attr);
            let n = std::mem::size_of::<ibv_device_attr_ex>();
            if attr_size >= n {
                (*attr).phys_port_cnt_ex = u32::from((*attr).orig_attr.phys_port_cnt);
            }
        }
        Ok(())
    })
}

fn port_attr(c: &Context, port_num: u8) -> Result<ibv_port_attr, i32> {
    let p = c.dev.device().query_port(port_num).map_err(|e| e.errno())?;
    Ok(ibv_port_attr {
        state: c_int::from(p.state),
        max_mtu: p.max_mtu as c_int,
        active_mtu: p.active_mtu as c_int,
        gid_tbl_len: p.gid_tbl_len as c_int,
        port_cap_flags: p.port_cap_flags,
        max_msg_sz: p.max_msg_sz.min(u64::from(u32::MAX)) as u32,
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: p.pkey_tbl_len,
        lid: 0,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: p.max_vl_num,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        active_width: p.active_width,
        active_speed: p.active_speed,
        phys_state: p.phys_state,
        link_layer: match p.link_layer {
            "Ethernet" => IBV_LINK_LAYER_ETHERNET,
            _ => IBV_LINK_LAYER_UNSPECIFIED,
        },
        flags: 0,
        port_cap_flags2: 0,
    })
}

/// `verbs_context.query_port`, what the static inline `ibv_query_port` calls.
pub(crate) unsafe extern "C" fn query_port_op(
    ctx: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
    attr_len: usize,
) -> c_int {
    ffi!(SetsErrno, {
        // SAFETY: NULL or a live context.
        let c = unsafe { try_ref(ctx) }?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        let p = port_attr(c, port_num)?;
        let n = attr_len.min(std::mem::size_of::<ibv_port_attr>());
        // SAFETY: `attr` is writable for `attr_len` bytes; we write at most that.
        unsafe { std::ptr::copy_nonoverlapping((&raw const p).cast::<u8>(), attr.cast::<u8>(), n) };
        Ok(())
    })
}

/// The exported `ibv_query_port` (the fallback of the inline one for contexts without
/// `verbs_context.query_port`): the struct up to and including `link_layer`.
pub(crate) extern "C" fn ibv_query_port(
    ctx: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    let n = std::mem::offset_of!(ibv_port_attr, link_layer) + 1;
    // SAFETY: forwards the caller's pointers; the compat struct holds at least `n` bytes.
    unsafe { query_port_op(ctx, port_num, attr, n) }
}

/// GID `index` of port `port_num`: `Ok(None)` for an empty entry of the table (all but the
/// first [`GID_ENTRIES`](softroce::verbs::GID_ENTRIES); `ibv_query_gid` reads one as zeros,
/// `ibv_query_gid_ex` says ENODATA, as on rxe), EINVAL for a port other than 1 or an index
/// past the port's `gid_tbl_len` entries.
fn gid_slot(
    c: &Context,
    port_num: u32,
    index: u32,
) -> Result<Option<softroce::verbs::GidEntry>, i32> {
    let port = u8::try_from(port_num).map_err(|_| libc::EINVAL)?;
    let p = c.dev.device().query_port(port).map_err(|e| e.errno())?;
    if index >= p.gid_tbl_len {
        return Err(libc::EINVAL);
    }
    let Ok(index) = u8::try_from(index) else {
        return Ok(None);
    };
    Ok(c.dev.device().query_gid(port, index).ok())
}

pub(crate) extern "C" fn ibv_query_gid(
    ctx: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    ffi!({
        // SAFETY: NULL or a live context, NULL or a writable GID (the caller's contract).
        let (c, gid) = unsafe { (try_ref(ctx)?, gid.as_mut().ok_or(libc::EINVAL)?) };
        if index < 0 {
            return Err(libc::EINVAL);
        }
        // An empty entry reads as zeros (rdma-core: "preserve API behavior for empty GID").
        let e = gid_slot(c, u32::from(port_num), index as u32)?;
        gid.raw = e.map_or([0; 16], |e| e.gid.0);
        Ok(0)
    })
}

/// `ibv_query_gid_type` (IBVERBS_PRIVATE_34, used by ibv_devinfo): every softroce GID is
/// RoCE v2 (`IBV_GID_TYPE_SYSFS_ROCE_V2` = 1).
pub(crate) extern "C" fn ibv_query_gid_type(
    ctx: *mut ibv_context,
    port_num: u8,
    index: u32,
    gid_type: *mut u32,
) -> c_int {
    ffi!({
        // SAFETY: NULL or a live context, NULL or a writable u32 (the caller's contract).
        let (c, gid_type) = unsafe { (try_ref(ctx)?, gid_type.as_mut().ok_or(libc::EINVAL)?) };
        // An empty entry is IBV_GID_TYPE_SYSFS_IB_ROCE_V1 (0), as rdma-core says for one.
        let e = gid_slot(c, u32::from(port_num), index)?;
        *gid_type = u32::from(e.is_some());
        Ok(0)
    })
}

pub(crate) extern "C" fn _ibv_query_gid_ex(
    ctx: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    ffi!({
        // SAFETY: NULL or a live context.
        let c = unsafe { try_ref(ctx) }?;
        if entry.is_null() || flags != 0 || entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return Err(libc::EINVAL);
        }
        let e = gid_slot(c, port_num, gid_index)?.ok_or(libc::ENODATA)?;
        // SAFETY: `entry` is writable for `entry_size` bytes.
        unsafe {
            *entry = ibv_gid_entry {
                gid: ibv_gid { raw: e.gid.0 },
                gid_index,
                port_num,
                gid_type: IBV_GID_TYPE_ROCE_V2,
                ndev_ifindex: 0,
            }
        };
        Ok(())
    })
}

pub(crate) extern "C" fn _ibv_query_gid_table(
    ctx: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    ffi!({
        // SAFETY: NULL or a live context.
        let c: &Context = unsafe { try_ref(ctx) }?;
        if flags != 0 || entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return Err(libc::EINVAL);
        }
        let gids = c.dev.device().gids();
        if gids.len() > max_entries {
            return Err(libc::EINVAL);
        }
        for (i, e) in gids.iter().enumerate() {
            // SAFETY: `entries` holds `max_entries` entries of `entry_size` bytes.
            unsafe {
                let p = entries
                    .cast::<u8>()
                    .add(i * entry_size)
                    .cast::<ibv_gid_entry>();
                p.write_unaligned(ibv_gid_entry {
                    gid: ibv_gid { raw: e.gid.0 },
                    gid_index: u32::from(e.index),
                    port_num: 1,
                    gid_type: IBV_GID_TYPE_ROCE_V2,
                    ndev_ifindex: 0,
                });
            }
        }
        Ok(gids.len() as isize)
    })
}

/// The one P_Key: the default full-membership 0xFFFF (network order in `*pkey`).
pub(crate) extern "C" fn ibv_query_pkey(
    ctx: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    ffi!({
        // SAFETY: NULL or a live context, NULL or a writable u16 (the caller's contract).
        let (_, pkey) = unsafe { (try_ref(ctx)?, pkey.as_mut().ok_or(libc::EINVAL)?) };
        if port_num != 1 || index != 0 {
            return Err(libc::EINVAL);
        }
        *pkey = 0xffff_u16.to_be();
        Ok(0)
    })
}

pub(crate) extern "C" fn ibv_get_pkey_index(
    ctx: *mut ibv_context,
    port_num: u8,
    pkey: u16,
) -> c_int {
    ffi!({
        // SAFETY: NULL or a live context.
        unsafe { try_ref(ctx) }?;
        if port_num != 1 {
            return Err(libc::EINVAL);
        }
        if u16::from_be(pkey) & 0x7fff == 0x7fff {
            Ok(0)
        } else {
            Err(libc::ENOENT)
        }
    })
}

pub(crate) extern "C" fn ibv_get_async_event(
    ctx: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    ffi!({
        // SAFETY: NULL or a live context.
        let c = unsafe { try_ref(ctx) }?;
        if event.is_null() {
            return Err(libc::EINVAL);
        }
        let dev = c.dev.device();
        // An event of a QP, CQ or SRQ destroyed since it was raised is dropped, as the
        // kernel's destroy drops the object's unread events (`ib_uverbs_release_uevent`):
        // the program never sees an element that is NULL or freed (UCX reads
        // `element.qp->qp_num` of every QP event).
        let (ev, element) = loop {
            if let Some(ev) = dev.try_get_async_event() {
                if let Some(element) = c.element_of(ev.element) {
                    break (ev, element);
                }
                continue;
            }
            wait_readable(c.vctx.context.async_fd)?;
        };
        // SAFETY: writable (the caller's contract).
        unsafe {
            *event = ibv_async_event {
                element,
                event_type: ev.event_type as c_int,
            }
        };
        Ok(0)
    })
}

pub(crate) extern "C" fn ibv_ack_async_event(_event: *mut ibv_async_event) {}

/// Waits until `fd` (a completion channel's or the context's async event descriptor) is
/// readable, as a `read` of the kernel's uverbs event file waits: `EAGAIN` at once for a
/// descriptor the program made non-blocking, `EINTR` when a signal handler without
/// `SA_RESTART` interrupts it ([`softroce::verbs::wait_readable`]).
pub(crate) fn wait_readable(fd: c_int) -> Result<(), i32> {
    softroce::verbs::wait_readable(fd).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
}
