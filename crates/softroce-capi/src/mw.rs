//! Memory windows: the `ibv_context_ops` entries behind verbs.h's static inline
//! `ibv_alloc_mw` and `ibv_dealloc_mw`, and the BIND_MW work request ([`bind_wr`]) that
//! `ibv_bind_mw` (`qp::bind_mw`, which posts it on the QP), `ibv_post_send` and
//! `ibv_wr_bind_mw` (qp_ex.rs) make, over the engine's `verbs::Mw`.
//!
//! Every bind is a BIND_MW work request (as rxe: `ibv_bind_mw` of a type 1 window posts one
//! with the next R_Key, `ibv_inc_rkey` of the current one; a type 2 window is bound by the
//! program's own BIND_MW request, which names its new R_Key). The bind completes with
//! `IBV_WC_BIND_MW`, or `IBV_WC_MW_BIND_ERR` when the engine's checks (MR range, rights,
//! PD, window state) fail.

use crate::handle::{Castable, free, into_handle, try_ref};
use crate::mr::Mr;
use crate::pd::Pd;
use core::ffi::c_int;
use softroce::verbs::{self, AccessFlags, BindMw, MwType, SendFlags, SendWr, WrOpcode};
use softroce_cabi::abi::*;
use softroce_cabi::{SetsErrno, ffi};

/// A memory window.
#[repr(C)]
pub(crate) struct Mw {
    pub ibv: ibv_mw,
    pub mw: verbs::Mw,
}

// SAFETY: `ibv_mw` is the first field of the `#[repr(C)]` `Mw` that `alloc_mw` boxes.
unsafe impl Castable for ibv_mw {
    type RustType = Mw;
}

/// The rights a window can grant: REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC. Other bits
/// (LOCAL_WRITE, which pyverbs passes, and MW_BIND) mean nothing for a window; rxe
/// accepts and ignores them.
const MW_ACCESS: u32 = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

/// `ops.alloc_mw`: a window of type 1 or 2 on `pd`; another type is EINVAL (rxe), and
/// past 4096 windows ENOMEM.
pub(crate) unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, mw_type: c_int) -> *mut ibv_mw {
    ffi!({
        let t = match mw_type {
            IBV_MW_TYPE_1 => MwType::Type1,
            IBV_MW_TYPE_2 => MwType::Type2,
            _ => return Err(libc::EINVAL),
        };
        // SAFETY: NULL or a live PD (the caller's contract).
        let p: &Pd = unsafe { try_ref(pd) }?;
        let mw = p.pd.alloc_mw(t).map_err(|e| e.errno())?;
        p.users.hold();
        let rkey = mw.rkey();
        Ok(into_handle(Mw {
            ibv: ibv_mw {
                context: p.ibv.context,
                pd,
                rkey,
                handle: rkey,
                type_: mw_type,
            },
            mw,
        }))
    })
}

/// `ops.dealloc_mw`: frees the window; its R_Key stops working at once (a type 2 window's
/// binding goes with it).
pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    ffi!(SetsErrno, {
        // SAFETY: NULL or a live window; its PD is live while it is.
        let p: &Pd = unsafe { try_ref(try_ref(mw)?.ibv.pd) }?;
        p.users.release();
        // SAFETY: a live window the caller gives up.
        unsafe { free(mw) };
        Ok(())
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
    // SAFETY: our caller's contract.
    let w = unsafe { try_ref(mw) }?;
    // SAFETY: our caller's contract.
    let mr: Result<&Mr, _> = unsafe { try_ref(info.mr) };
    let mr_lkey = match mr {
        Ok(m) => m.mr.lkey(),
        // An unbind names no MR.
        Err(_) if info.length == 0 => 0,
        Err(e) => return Err(e.into()),
    };
    let mut wr = SendWr::new(wr_id, WrOpcode::BindMw, Vec::new());
    wr.send_flags = SendFlags(send_flags & 0xf);
    wr.bind_mw = Some(BindMw {
        mw_rkey: w.mw.rkey(),
        rkey,
        mr_lkey,
        addr: info.addr,
        length: info.length,
        access: AccessFlags(info.mw_access_flags & (MW_ACCESS | IBV_ACCESS_ZERO_BASED)),
    });
    Ok(wr)
}
