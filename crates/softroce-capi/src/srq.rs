//! Shared receive queues: `ibv_create_srq`, `ibv_modify_srq`, `ibv_query_srq`,
//! `ibv_destroy_srq`, and the `ibv_context_ops` entry behind verbs.h's static inline
//! `ibv_post_srq_recv`, over the engine's `verbs::Srq`.

use crate::context::Context;
use crate::handle::{Castable, free, into_handle, try_mut, try_ref};
use crate::pd::Pd;
use crate::wr::{finish_recv, recv_wrs};
use core::ffi::c_int;
use softroce::verbs::{self, SrqAttr, SrqAttrMask, SrqInitAttr};
use softroce_cabi::abi::*;
use softroce_cabi::{SetsErrno, ffi};

/// A shared receive queue.
#[repr(C)]
pub(crate) struct Srq {
    pub ibv: ibv_srq,
    pub srq: verbs::Srq,
}

// SAFETY: `ibv_srq` is the first field of the `#[repr(C)]` `Srq` that `ibv_create_srq`
// boxes.
unsafe impl Castable for ibv_srq {
    type RustType = Srq;
}

pub(crate) extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    init: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    ffi!({
        // SAFETY: NULL or a live PD, NULL or a readable init attr.
        let (p, init): (&Pd, _) = unsafe { (try_ref(pd)?, init.as_ref().ok_or(libc::EINVAL)?) };
        let srq =
            p.pd.create_srq(&SrqInitAttr {
                max_wr: init.attr.max_wr,
                max_sge: init.attr.max_sge,
                srq_limit: init.attr.srq_limit,
            })
            .map_err(|e| e.errno())?;
        let num = srq.srq_num();
        p.users.hold();
        let s: *mut ibv_srq = into_handle(Srq {
            ibv: ibv_srq {
                context: p.ibv.context,
                srq_context: init.srq_context,
                pd,
                handle: num,
                mutex: libc::PTHREAD_MUTEX_INITIALIZER,
                cond: libc::PTHREAD_COND_INITIALIZER,
                events_completed: 0,
            },
            srq,
        });
        // SAFETY: the PD's context is live.
        let c: &Context = unsafe { try_ref(p.ibv.context) }?;
        c.srqs.lock().insert(num, s as usize);
        Ok(s)
    })
}

pub(crate) extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    ffi!(SetsErrno, {
        // SAFETY: NULL or a live SRQ, NULL or a readable attr.
        let (s, a) = unsafe { (try_ref(srq)?, attr.as_ref().ok_or(libc::EINVAL)?) };
        let a = SrqAttr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: a.srq_limit,
        };
        s.srq
            .modify(&a, SrqAttrMask(mask as u32))
            .map_err(|e| e.errno())
    })
}

pub(crate) extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    ffi!(SetsErrno, {
        // SAFETY: NULL or a live SRQ, NULL or a writable attr (the caller's contract).
        let (s, attr) = unsafe { (try_ref(srq)?, attr.as_mut().ok_or(libc::EINVAL)?) };
        let a = s.srq.query().map_err(|e| e.errno())?;
        *attr = ibv_srq_attr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: a.srq_limit,
        };
        Ok(())
    })
}

pub(crate) extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    ffi!(SetsErrno, {
        // SAFETY: NULL or a live SRQ the caller gives up (no other thread uses it).
        let s = unsafe { try_mut(srq) }?;
        s.srq.destroy().map_err(|e| e.errno())?;
        // SAFETY: its context and PD outlive it.
        let (c, p): (&Context, &Pd) = unsafe { (try_ref(s.ibv.context)?, try_ref(s.ibv.pd)?) };
        c.srqs.lock().remove(&s.ibv.handle);
        p.users.release();
        // SAFETY: the caller gives the SRQ up.
        unsafe { free(srq) };
        Ok(())
    })
}

/// `ops.post_srq_recv`.
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    ffi!({
        // SAFETY: NULL or a live SRQ.
        let s: &Srq = unsafe { try_ref(srq) }?;

        // SAFETY: the program's WR list.
        let (wrs, ptrs, failed) = unsafe { recv_wrs(wr) };
        finish_recv(wrs, ptrs, failed, bad_wr, |w| s.srq.post_recv(w))
    })
}
