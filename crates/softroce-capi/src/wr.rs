//! Work requests: the SGE list of an `ibv_send_wr` / `ibv_recv_wr`, and the receive WR
//! lists that `ibv_post_recv` (qp.rs) and `ibv_post_srq_recv` (srq.rs) post, with the
//! `bad_wr` they report. SGE addresses are the program's virtual addresses.

use core::ffi::c_int;
use softroce::verbs::{RecvWr, Sge};
use softroce_cabi::abi::*;

/// Most SGEs softroce reads from one WR (the device's `max_sge`, the engine's); more is
/// `EINVAL` (the engine would refuse them anyway).
const MAX_SGE: c_int = softroce::verbs::MAX_SGE as c_int;

/// The SGE list of a WR.
///
/// # Safety
/// `sg_list` must be readable for `num_sge` entries when `num_sge > 0`.
pub(crate) unsafe fn sges(sg_list: *const ibv_sge, num_sge: c_int) -> Result<Vec<Sge>, c_int> {
    if !(0..=MAX_SGE).contains(&num_sge) || (num_sge > 0 && sg_list.is_null()) {
        return Err(libc::EINVAL);
    }
    let mut v = Vec::with_capacity(num_sge as usize);
    for i in 0..num_sge as usize {
        // SAFETY: our caller's contract.
        let s = unsafe { *sg_list.add(i) };
        v.push(Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        });
    }
    Ok(v)
}

/// The receive WRs of a list, with their pointers for `bad_wr`.
///
/// # Safety
/// `wr` is NULL or a readable list of readable WRs.
pub(crate) unsafe fn recv_wrs(
    wr: *mut ibv_recv_wr,
) -> (
    Vec<RecvWr>,
    Vec<*mut ibv_recv_wr>,
    Option<(*mut ibv_recv_wr, c_int)>,
) {
    let (mut wrs, mut ptrs) = (Vec::new(), Vec::new());
    let mut p = wr;
    while !p.is_null() {
        // SAFETY: our caller's contract.
        let w = unsafe { &*p };
        // SAFETY: as above.
        match unsafe { sges(w.sg_list, w.num_sge) } {
            Ok(sg_list) => {
                wrs.push(RecvWr {
                    wr_id: w.wr_id,
                    sg_list,
                });
                ptrs.push(p);
            }
            Err(e) => return (wrs, ptrs, Some((p, e))),
        }
        p = w.next;
    }
    (wrs, ptrs, None)
}

/// Posts `wrs` with `post`, then reports the first failure in `bad_wr`.
pub(crate) fn finish_recv(
    wrs: Vec<RecvWr>,
    ptrs: Vec<*mut ibv_recv_wr>,
    mut failed: Option<(*mut ibv_recv_wr, c_int)>,
    bad_wr: *mut *mut ibv_recv_wr,
    post: impl FnOnce(&[RecvWr]) -> softroce::verbs::Result<()>,
) -> Result<(), c_int> {
    if !wrs.is_empty()
        && let Err(e) = post(&wrs)
    {
        let i = e.bad_wr().unwrap_or(0).min(ptrs.len() - 1);
        failed = Some((ptrs[i], e.errno()));
    }
    match failed {
        Some((p, e)) => {
            if !bad_wr.is_null() {
                // SAFETY: writable (the caller's contract).
                unsafe { *bad_wr = p };
            }
            Err(e)
        }
        None => Ok(()),
    }
}
