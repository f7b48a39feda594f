//! Memory windows: the `ibv_context_ops` entries behind verbs.h's static inline
//! `ibv_alloc_mw`, `ibv_dealloc_mw` and `ibv_bind_mw`, and the BIND_MW work request of
//! `ibv_post_send` and `ibv_wr_bind_mw`, over the engine's `verbs::Mw`.
//!
//! Every bind is a BIND_MW work request (as rxe: `ibv_bind_mw` of a type 1 window posts one
//! with the next R_Key, `ibv_inc_rkey` of the current one; a type 2 window is bound by the
//! program's own BIND_MW request, which names its new R_Key). The bind completes with
//! `IBV_WC_BIND_MW`, or `IBV_WC_MW_BIND_ERR` when the engine's checks (MR range, rights,
//! PD, window state) fail.

use crate::abi::*;
use crate::objects::{Mr, Pd, Qp, free, obj};
use crate::{ffi, ffi_errno};
use core::ffi::c_int;
use softroce::verbs::{self, AccessFlags, BindMw, MwType, SendFlags, SendWr, WrOpcode};

/// A memory window.
#[repr(C)]
pub(crate) struct Mw {
    pub ibv: ibv_mw,
    pub mw: verbs::Mw,
}

/// `IBV_MW_TYPE_1`, `IBV_MW_TYPE_2`.
const IBV_MW_TYPE_1: c_int = 1;
const IBV_MW_TYPE_2: c_int = 2;

/// The rights a window can grant: REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC. Other bits
/// (LOCAL_WRITE, which pyverbs passes, and MW_BIND) mean nothing for a window; rxe
/// accepts and ignores them.
const MW_ACCESS: u32 = 0xe;
/// `IBV_ACCESS_ZERO_BASED`: a window addressed from 0 (type 2 only).
const ACCESS_ZERO_BASED: u32 = 0x20;

/// `ops.alloc_mw`: a window of type 1 or 2 on `pd`; another type is EINVAL (rxe), and
/// past 4096 windows ENOMEM.
pub(crate) unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, mw_type: c_int) -> *mut ibv_mw {
    ffi!(std::ptr::null_mut(), {
        let t = match mw_type {
            IBV_MW_TYPE_1 => MwType::Type1,
            IBV_MW_TYPE_2 => MwType::Type2,
            _ => return crate::null_errno(libc::EINVAL),
        };
        if pd.is_null() {
            return crate::null_errno(libc::EINVAL);
        }
        // SAFETY: a live PD (the caller's contract).
        let p = unsafe { obj::<Pd, _>(pd) };
        match p.pd.alloc_mw(t) {
            Ok(mw) => {
                // SAFETY: the live PD the window is made on.
                unsafe { crate::objects::uses(pd, true, true) };
                let rkey = mw.rkey();
                Box::into_raw(Box::new(Mw {
                    ibv: ibv_mw {
                        context: p.ibv.context,
                        pd,
                        rkey,
                        handle: rkey,
                        type_: mw_type,
                    },
                    mw,
                }))
                .cast()
            }
            Err(e) => crate::null_errno(e.errno()),
        }
    })
}

/// `ops.dealloc_mw`: frees the window; its R_Key stops working at once (a type 2 window's
/// binding goes with it).
pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    ffi_errno!({
        if mw.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live window the caller gives up; its PD is live while it is.
        unsafe {
            crate::objects::uses((*mw).pd, true, false);
            free::<Mw, _>(mw);
        }
        0
    })
}

/// The BIND_MW work request that gives window `mw` R_Key `rkey` over `info` (an unbind when
/// `info.length` is 0, where the MR may be NULL). EINVAL for a NULL window, or a NULL MR
/// with a length. A zero-based bind goes to the engine (a type 1 window fails there with
/// `IBV_WC_MW_BIND_ERR`, as rxe's kernel does for a BIND_MW work request).
///
/// # Safety
/// `mw` is NULL or a live window of this library; `info.mr` NULL or a live MR.
pub(crate) unsafe fn bind_wr(
    wr_id: u64,
    send_flags: u32,
    mw: *mut ibv_mw,
    rkey: u32,
    info: &ibv_mw_bind_info,
) -> Result<SendWr, c_int> {
    if mw.is_null() || (info.mr.is_null() && info.length != 0) {
        return Err(libc::EINVAL);
    }
    // SAFETY: our caller's contract.
    let w = unsafe { obj::<Mw, _>(mw) };
    let mr_lkey = if info.mr.is_null() {
        0
    } else {
        // SAFETY: our caller's contract.
        unsafe { obj::<Mr, _>(info.mr) }.mr.lkey()
    };
    let mut wr = SendWr::new(wr_id, WrOpcode::BindMw, Vec::new());
    wr.send_flags = SendFlags(send_flags & 0xf);
    wr.bind_mw = Some(BindMw {
        mw_rkey: w.mw.rkey(),
        rkey,
        mr_lkey,
        addr: info.addr,
        length: info.length,
        access: AccessFlags(info.mw_access_flags & (MW_ACCESS | ACCESS_ZERO_BASED)),
    });
    Ok(wr)
}

/// `ops.bind_mw` (`ibv_bind_mw`, type 1 windows; verbs.h checked the type and the PDs):
/// posts a BIND_MW work request with R_Key `ibv_inc_rkey(mw->rkey)` and, once it is
/// posted, sets `mw->rkey` to it (the key is usable when the bind completes).
pub(crate) unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    bind: *mut ibv_mw_bind,
) -> c_int {
    ffi!(libc::EIO, {
        // SAFETY: our caller's contract, passed on.
        let rc = unsafe { bind_mw_errno(qp, mw, bind) };
        // rxe's provider (rxe_bind_mw) leaves its return value in errno on every error path.
        if rc != 0 {
            crate::set_errno(rc);
        }
        rc
    })
}

/// The body of [`bind_mw`]: 0 or the errno value.
///
/// # Safety
/// As [`bind_mw`]: null or live objects of this library.
unsafe fn bind_mw_errno(qp: *mut ibv_qp, mw: *mut ibv_mw, bind: *mut ibv_mw_bind) -> c_int {
    if qp.is_null() || mw.is_null() || bind.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: live objects of this library (the caller's contract).
    let (q, b) = unsafe { (obj::<Qp, _>(qp), &*bind) };
    // rxe's provider refuses a zero-based type 1 bind before posting it.
    if b.bind_info.mw_access_flags & ACCESS_ZERO_BASED != 0 {
        return libc::EINVAL;
    }
    // SAFETY: as above.
    let rkey = verbs::inc_rkey(unsafe { obj::<Mw, _>(mw) }.mw.rkey());
    // SAFETY: as above.
    let wr = match unsafe { bind_wr(b.wr_id, b.send_flags, mw, rkey, &b.bind_info) } {
        Ok(wr) => wr,
        Err(e) => return e,
    };
    match q.qp.post_send(&[wr]) {
        Ok(()) => {
            // SAFETY: a live window; the program does not write it concurrently.
            unsafe { (*mw).rkey = rkey };
            0
        }
        Err(e) => e.errno(),
    }
}
