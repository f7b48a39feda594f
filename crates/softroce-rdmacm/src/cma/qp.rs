//! An id's QP and SRQ: `rdma_create_qp(_ex)`, `rdma_create_srq(_ex)` and their destroy calls,
//! as rdma-core 44's `librdmacm/cma.c` has them.
//!
//! - `rdma_create_qp` copies its `ibv_qp_init_attr` into an `ibv_qp_init_attr_ex` with
//!   `comp_mask` = PD (the given PD, else the id's) and calls `rdma_create_qp_ex`, then copies
//!   the attributes back (the CQs, SRQ and capabilities the QP got).
//! - `rdma_create_qp_ex` takes the id's PD when the caller gave none, makes a send and/or a
//!   receive CQ, each with its own completion channel, for what neither the caller nor the id
//!   has (`ucma_create_cqs`; only these are stored in the id's `send_cq` / `recv_cq`), uses the
//!   id's SRQ when the caller gave none, creates the QP (verbs.h's `ibv_create_qp_ex`), and
//!   moves it to INIT (UD: on to RTS).
//! - `rdma_create_srq_ex` creates the SRQ on the id's PD when the caller gave none and keeps it
//!   in the id's `srq`; an XRC SRQ also gets the device's XRC domain and, when the caller gave
//!   no CQ, a receive CQ of the id. `rdma_create_srq` is the same with `srq_type` BASIC (XRC
//!   for an `IBV_QPT_XRC_RECV` id).
//! - `rdma_destroy_qp` / `rdma_destroy_srq` destroy the object and then the CQs and channels
//!   librdmacm made for the id (`ucma_destroy_cqs`), whichever call made them.
//!
//! Errors (-1 and errno): EINVAL for a NULL id or attributes, an id without a device, an id
//! that already has a QP, a PD of another device, CQs other than the id's own, an SRQ request
//! without `IBV_SRQ_INIT_ATTR_TYPE`; EOPNOTSUPP from verbs for what softroce's libibverbs does
//! not create (XRC, tag matching, extended QP attributes it refuses); otherwise the errno of
//! the failing libibverbs call.
//!
//! Where softroce differs (spec/deviations.toml): a CQ librdmacm makes for a capacity of 0
//! WRs (`max_send_wr` / `max_recv_wr` / SRQ `max_wr` 0) has 1 entry here, where librdmacm
//! makes none and hands libibverbs a NULL CQ; and a NULL id, attributes or PD is EINVAL where
//! librdmacm dereferences it.

use super::state::{StateGuard, errno_or, state};
use super::transitions::{qp_init, ud_qp_rts};
use crate::abi::*;
use crate::ffi;
use crate::ibv::{Ibv, ibv};
use core::ffi::{c_int, c_void};
use softroce_cabi::fork::ProcessLock;
use std::mem::offset_of;

/// verbs.h's `verbs_get_ctx_op(ctx, op)`: the extended context of `ctx` when it is one
/// (`abi_compat` is `__VERBS_ABI_IS_EXTENDED`) and its size reaches the op at `op_offset`.
///
/// # Safety
/// `ctx` is a live `ibv_context`.
unsafe fn verbs_ctx(ctx: *mut ibv_context, op_offset: usize) -> Option<&'static verbs_context> {
    // SAFETY: the caller's live context.
    if unsafe { (*ctx).abi_compat } != VERBS_ABI_IS_EXTENDED {
        return None;
    }
    // SAFETY: an extended context sits at the end of its `verbs_context` (verbs.h's
    // container_of), which lives as long as the context.
    let v = unsafe {
        &*ctx
            .cast::<u8>()
            .sub(offset_of!(verbs_context, context))
            .cast::<verbs_context>()
    };
    (v.sz >= size_of::<verbs_context>() - op_offset).then_some(v)
}

/// verbs.h's static inline `ibv_create_qp_ex`: plain `ibv_create_qp` when `comp_mask` is
/// exactly PD, else the context's `create_qp_ex` op (EOPNOTSUPP without one).
///
/// # Safety
/// `ctx` is a live context; `a` the caller's init attributes.
unsafe fn ibv_create_qp_ex(
    ibv: &Ibv,
    ctx: *mut ibv_context,
    a: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    // SAFETY: our caller's contract; `ibv_qp_init_attr_ex` begins with `ibv_qp_init_attr`
    // (verbs.h makes the same cast).
    unsafe {
        if (*a).comp_mask == IBV_QP_INIT_ATTR_PD {
            return (ibv.create_qp)((*a).pd, a.cast());
        }
        match verbs_ctx(ctx, offset_of!(verbs_context, create_qp_ex)).and_then(|v| v.create_qp_ex) {
            Some(op) => op(ctx, a),
            None => {
                crate::set_errno(libc::EOPNOTSUPP);
                std::ptr::null_mut()
            }
        }
    }
}

/// verbs.h's static inline `ibv_create_srq_ex`: plain `ibv_create_srq` for a BASIC SRQ whose
/// `comp_mask` has PD and nothing but PD and TYPE, else the context's `create_srq_ex` op
/// (EOPNOTSUPP without one: softroce's libibverbs has none, as it has no XRC or tag matching).
///
/// # Safety
/// As [`ibv_create_qp_ex`].
unsafe fn ibv_create_srq_ex(
    ibv: &Ibv,
    ctx: *mut ibv_context,
    a: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    // SAFETY: our caller's contract; `ibv_srq_init_attr_ex` begins with `ibv_srq_init_attr`.
    unsafe {
        let mask = (*a).comp_mask;
        if mask & !(IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE) == 0
            && mask & IBV_SRQ_INIT_ATTR_PD != 0
            && (mask & IBV_SRQ_INIT_ATTR_TYPE == 0 || (*a).srq_type == IBV_SRQT_BASIC)
        {
            return (ibv.create_srq)((*a).pd, a.cast());
        }
        match verbs_ctx(ctx, offset_of!(verbs_context, create_srq_ex)).and_then(|v| v.create_srq_ex)
        {
            // The op's prototype in verbs.h is `CreateSrqExFn`; the shared ABI mirror only
            // names it as an unset slot.
            Some(op) => std::mem::transmute::<unsafe extern "C" fn(), CreateSrqExFn>(op)(ctx, a),
            None => {
                crate::set_errno(libc::EOPNOTSUPP);
                std::ptr::null_mut()
            }
        }
    }
}

/// The XRC domain of each device context, opened once (librdmacm's `ucma_get_xrcd`); per
/// process, as the contexts are ([`ProcessLock`]).
static XRCDS: ProcessLock<Vec<(usize, usize)>> = ProcessLock::new();

/// librdmacm's `ucma_get_xrcd`: the device's XRC domain, opened on first use with
/// `ibv_open_xrcd` (no file, `O_CREAT`). Errors: EOPNOTSUPP when the context has no
/// `open_xrcd` op (softroce's libibverbs: no XRC, as rxe), else the op's errno.
fn xrcd_of(ctx: *mut ibv_context) -> Result<*mut c_void, c_int> {
    let mut x = XRCDS.lock();
    if let Some(&(_, d)) = x.iter().find(|(c, _)| *c == ctx as usize) {
        return Ok(d as *mut c_void);
    }
    // SAFETY: the id's live context.
    let op = unsafe { verbs_ctx(ctx, offset_of!(verbs_context, open_xrcd)) }
        .and_then(|v| v.open_xrcd)
        .ok_or(libc::EOPNOTSUPP)?;
    let mut attr = ibv_xrcd_init_attr {
        comp_mask: IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
        fd: -1,
        oflags: libc::O_CREAT,
    };
    // SAFETY: the op's prototype in verbs.h is `OpenXrcdFn`; a live context and attributes.
    let d =
        unsafe { std::mem::transmute::<unsafe extern "C" fn(), OpenXrcdFn>(op)(ctx, &mut attr) };
    if d.is_null() {
        return Err(errno_or(libc::ENOMEM));
    }
    x.push((ctx as usize, d as usize));
    Ok(d)
}

/// librdmacm's `ucma_create_cqs`: for each `Some(wrs)`, a completion channel and a CQ of
/// `wrs` entries (at least 1) on the id's context, stored in the id. On an error the id's
/// CQs and channels are destroyed ([`destroy_cqs`]) and the errno returned.
fn create_cqs(
    ibv: &Ibv,
    id: *mut rdma_cm_id,
    send: Option<u32>,
    recv: Option<u32>,
) -> Result<(), c_int> {
    // SAFETY: a live id with a device (checked by our callers).
    let idr = unsafe { &mut *id };
    let mut make = |wrs: u32, is_send: bool| -> Result<(), c_int> {
        // SAFETY: calls on the id's live context.
        unsafe {
            let ch = (ibv.create_comp_channel)(idr.verbs);
            if ch.is_null() {
                return Err(errno_or(libc::ENOMEM));
            }
            if is_send {
                idr.send_cq_channel = ch;
            } else {
                idr.recv_cq_channel = ch;
            }
            let n = wrs.clamp(1, c_int::MAX as u32) as c_int;
            let cq = (ibv.create_cq)(idr.verbs, n, id.cast(), ch, 0);
            if cq.is_null() {
                return Err(errno_or(libc::ENOMEM));
            }
            if is_send {
                idr.send_cq = cq;
            } else {
                idr.recv_cq = cq;
            }
        }
        Ok(())
    };
    let r = recv
        .map_or(Ok(()), |n| make(n, false))
        .and_then(|()| send.map_or(Ok(()), |n| make(n, true)));
    if let Err(e) = r {
        destroy_cqs(ibv, id);
        return Err(e);
    }
    Ok(())
}

/// librdmacm's `ucma_destroy_cqs`: the id's CQs and completion channels (send and receive,
/// once when they are the same), except those of an XRC receive id with an SRQ.
fn destroy_cqs(ibv: &Ibv, id: *mut rdma_cm_id) {
    // SAFETY: a live id; its CQs and channels are ones ucma_create_cqs made.
    unsafe {
        let idr = &mut *id;
        if idr.qp_type == IBV_QPT_XRC_RECV && !idr.srq.is_null() {
            return;
        }
        if !idr.recv_cq.is_null() {
            (ibv.destroy_cq)(idr.recv_cq);
            if !idr.send_cq.is_null() && idr.send_cq != idr.recv_cq {
                (ibv.destroy_cq)(idr.send_cq);
                idr.send_cq = std::ptr::null_mut();
            }
            idr.recv_cq = std::ptr::null_mut();
        }
        if !idr.recv_cq_channel.is_null() {
            (ibv.destroy_comp_channel)(idr.recv_cq_channel);
            if !idr.send_cq_channel.is_null() && idr.send_cq_channel != idr.recv_cq_channel {
                (ibv.destroy_comp_channel)(idr.send_cq_channel);
                idr.send_cq_channel = std::ptr::null_mut();
            }
            idr.recv_cq_channel = std::ptr::null_mut();
        }
    }
}

/// The state's lock, held while an id's QP or SRQ changes (the driver threads apply REQ and
/// REP to `id->qp` under it), once `id` is known to be a live id with a device.
fn lock_id_with_device(id: *mut rdma_cm_id) -> Result<StateGuard, c_int> {
    let mut st = state()?;
    let s = st.id_mut(id)?;
    // SAFETY: a live id.
    if s.dev.is_none() || unsafe { (*id).verbs }.is_null() {
        return Err(libc::EINVAL);
    }
    Ok(st)
}

/// The state's lock, once `id` is known to be a live id.
fn lock_id(id: *mut rdma_cm_id) -> Option<StateGuard> {
    let mut st = state().ok()?;
    st.id_mut(id).ok()?;
    Some(st)
}

pub(crate) extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    ffi!({ create_qp_ex(id, attr).map(|()| 0) })
}

fn create_qp_ex(id: *mut rdma_cm_id, attr: *mut ibv_qp_init_attr_ex) -> Result<(), c_int> {
    let ibv = ibv()?;
    if attr.is_null() {
        return Err(libc::EINVAL);
    }
    let _st = lock_id_with_device(id)?;
    // SAFETY: a live id; `attr` the caller's init attributes.
    let (idr, a) = unsafe { (&mut *id, &mut *attr) };
    if !idr.qp.is_null() {
        return Err(libc::EINVAL);
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
        a.comp_mask |= IBV_QP_INIT_ATTR_PD;
        a.pd = idr.pd;
    } else {
        // SAFETY: a non-NULL PD the caller passed.
        let pd_ctx = unsafe { (*a.pd).context };
        if pd_ctx != idr.verbs {
            return Err(libc::EINVAL);
        }
    }
    if a.pd.is_null()
        || (!idr.recv_cq.is_null() && !a.recv_cq.is_null() && idr.recv_cq != a.recv_cq)
        || (!idr.send_cq.is_null() && !a.send_cq.is_null() && idr.send_cq != a.send_cq)
    {
        return Err(libc::EINVAL);
    }
    if idr.qp_type == IBV_QPT_XRC_RECV
        && (a.comp_mask & IBV_QP_INIT_ATTR_XRCD == 0 || a.xrcd.is_null())
    {
        a.xrcd = xrcd_of(idr.verbs)?;
        a.comp_mask |= IBV_QP_INIT_ATTR_XRCD;
    }
    let send = (a.send_cq.is_null() && idr.send_cq.is_null()).then_some(a.cap.max_send_wr);
    let recv = (a.recv_cq.is_null() && idr.recv_cq.is_null()).then_some(a.cap.max_recv_wr);
    create_cqs(ibv, id, send, recv)?;
    if a.send_cq.is_null() {
        a.send_cq = idr.send_cq;
    }
    if a.recv_cq.is_null() {
        a.recv_cq = idr.recv_cq;
    }
    if !idr.srq.is_null() && a.srq.is_null() {
        a.srq = idr.srq;
    }
    // SAFETY: the id's live context and the caller's attributes.
    let qp = unsafe { ibv_create_qp_ex(ibv, idr.verbs, a) };
    if qp.is_null() {
        let e = errno_or(libc::ENOMEM);
        destroy_cqs(ibv, id);
        return Err(e);
    }
    let ready = qp_init(ibv, qp, a.qp_type).and_then(|()| {
        if a.qp_type == IBV_QPT_UD {
            ud_qp_rts(ibv, qp)
        } else {
            Ok(())
        }
    });
    if let Err(e) = ready {
        // SAFETY: the QP just made.
        unsafe { (ibv.destroy_qp)(qp) };
        destroy_cqs(ibv, id);
        return Err(e);
    }
    // SAFETY: the QP just made.
    idr.pd = unsafe { (*qp).pd };
    idr.qp = qp;
    Ok(())
}

pub(crate) extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    ffi!({
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        let pd = if pd.is_null() {
            state()?.id_mut(id)?;
            // SAFETY: a live id.
            unsafe { (*id).pd }
        } else {
            pd
        };
        // SAFETY: all-zero is a valid ibv_qp_init_attr_ex (NULL pointers, no bits).
        let mut ex: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
        // SAFETY: `ibv_qp_init_attr_ex` begins with the fields of `ibv_qp_init_attr`;
        // `attr` is the caller's.
        unsafe {
            std::ptr::copy_nonoverlapping(
                attr.cast::<u8>(),
                (&raw mut ex).cast::<u8>(),
                size_of::<ibv_qp_init_attr>(),
            )
        };
        ex.comp_mask = IBV_QP_INIT_ATTR_PD;
        ex.pd = pd;
        let r = create_qp_ex(id, &mut ex);
        // SAFETY: as above, back into the caller's attributes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&raw const ex).cast::<u8>(),
                attr.cast::<u8>(),
                size_of::<ibv_qp_init_attr>(),
            )
        };
        r?;
        Ok(0)
    })
}

pub(crate) extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    ffi!({
        let Ok(ibv) = ibv() else { return };
        let Some(_st) = lock_id(id) else { return };
        // SAFETY: a live id; its QP.
        unsafe {
            if !(*id).qp.is_null() {
                (ibv.destroy_qp)((*id).qp);
                (*id).qp = std::ptr::null_mut();
            }
        }
        destroy_cqs(ibv, id);
    })
}

pub(crate) extern "C" fn rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    ffi!({ create_srq_ex(id, attr).map(|()| 0) })
}

fn create_srq_ex(id: *mut rdma_cm_id, attr: *mut ibv_srq_init_attr_ex) -> Result<(), c_int> {
    let ibv = ibv()?;
    if attr.is_null() {
        return Err(libc::EINVAL);
    }
    let _st = lock_id_with_device(id)?;
    // SAFETY: a live id; `attr` the caller's init attributes.
    let (idr, a) = unsafe { (&mut *id, &mut *attr) };
    if a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE == 0 {
        return Err(libc::EINVAL);
    }
    if a.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 || a.pd.is_null() {
        a.pd = idr.pd;
        a.comp_mask |= IBV_SRQ_INIT_ATTR_PD;
    }
    if a.pd.is_null() {
        return Err(libc::EINVAL);
    }
    if a.srq_type == IBV_SRQT_XRC {
        if a.comp_mask & IBV_SRQ_INIT_ATTR_XRCD == 0 || a.xrcd.is_null() {
            a.xrcd = xrcd_of(idr.verbs)?;
        }
        if a.comp_mask & IBV_SRQ_INIT_ATTR_CQ == 0 || a.cq.is_null() {
            create_cqs(ibv, id, None, Some(a.attr.max_wr))?;
            a.cq = idr.recv_cq;
        }
        a.comp_mask |= IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
    }
    // SAFETY: the id's live context and the caller's attributes.
    let srq = unsafe { ibv_create_srq_ex(ibv, idr.verbs, a) };
    if srq.is_null() {
        let e = errno_or(libc::ENOMEM);
        destroy_cqs(ibv, id);
        return Err(e);
    }
    if idr.pd.is_null() {
        idr.pd = a.pd;
    }
    idr.srq = srq;
    Ok(())
}

pub(crate) extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    ffi!({
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        state()?.id_mut(id)?;
        // SAFETY: all-zero is a valid ibv_srq_init_attr_ex (NULL pointers, no bits).
        let mut ex: ibv_srq_init_attr_ex = unsafe { std::mem::zeroed() };
        // SAFETY: `ibv_srq_init_attr_ex` begins with the fields of `ibv_srq_init_attr`;
        // `attr` is the caller's.
        unsafe {
            std::ptr::copy_nonoverlapping(
                attr.cast::<u8>(),
                (&raw mut ex).cast::<u8>(),
                size_of::<ibv_srq_init_attr>(),
            )
        };
        ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
        // SAFETY: a live id.
        ex.srq_type = if unsafe { (*id).qp_type } == IBV_QPT_XRC_RECV {
            IBV_SRQT_XRC
        } else {
            IBV_SRQT_BASIC
        };
        ex.pd = pd;
        let r = create_srq_ex(id, &mut ex);
        // SAFETY: as above, back into the caller's attributes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&raw const ex).cast::<u8>(),
                attr.cast::<u8>(),
                size_of::<ibv_srq_init_attr>(),
            )
        };
        r?;
        Ok(0)
    })
}

pub(crate) extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    ffi!({
        let Ok(ibv) = ibv() else { return };
        let Some(_st) = lock_id(id) else { return };
        // SAFETY: a live id; its SRQ.
        unsafe {
            if !(*id).srq.is_null() {
                (ibv.destroy_srq)((*id).srq);
                (*id).srq = std::ptr::null_mut();
            }
        }
        destroy_cqs(ibv, id);
    })
}
