//! The extended QP: `verbs_context.create_qp_ex` (what verbs.h's inline
//! `ibv_create_qp_ex` calls), `ibv_qp_to_qp_ex` and the work request builder of
//! `struct ibv_qp_ex` (`ibv_wr_start` … `ibv_wr_complete`; its state is the QP's
//! `WrBuild`). The extended CQ is `cq.rs`'s. Behaviour follows rdma-core's rxe provider
//! (providers/rxe/rxe.c): the builder queues WRs from `wr_start` and posts them all in
//! `wr_complete`, which returns the first error met while building (posting none of them);
//! `wr_abort` drops them.

use crate::ah::Ah;
use crate::handle::{try_mut, try_ref};
use crate::mw::bind_wr;
use crate::qp::{Qp, WrBuild, ibv_create_qp};
use core::ffi::{c_int, c_void};
use softroce::verbs::{SendFlags, SendWr, Sge, WrOpcode};
use softroce_cabi::abi::*;
use softroce_cabi::ffi;

/// The `IBV_QP_EX_WITH_*` operations softroce builds (rxe's: all but TSO and ATOMIC_WRITE).
const SEND_OPS_SUPPORTED: u64 = (1 << 0) // RDMA_WRITE
    | (1 << 1) // RDMA_WRITE_WITH_IMM
    | (1 << 2) // SEND
    | (1 << 3) // SEND_WITH_IMM
    | (1 << 4) // RDMA_READ
    | (1 << 5) // ATOMIC_CMP_AND_SWP
    | (1 << 6) // ATOMIC_FETCH_AND_ADD
    | (1 << 7) // LOCAL_INV
    | (1 << 8) // BIND_MW
    | (1 << 9); // SEND_WITH_INV

/// `verbs_context.create_qp_ex`. Accepts a PD and, optionally, `send_ops_flags` (which make
/// the QP an extended one) and zero `create_flags`; anything else is EOPNOTSUPP (XRC, RSS,
/// TSO, source QPN).
pub(crate) unsafe extern "C" fn create_qp_ex(
    _ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    ffi!({
        // SAFETY: NULL or a readable, writable init attr (the caller's contract).
        let a = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
        let known =
            IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        if a.comp_mask & !known != 0
            || (a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0)
        {
            return Err(libc::EOPNOTSUPP);
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
            return Err(libc::EINVAL);
        }
        let send_ops =
            (a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0).then_some(a.send_ops_flags);
        if send_ops.is_some_and(|f| f & !SEND_OPS_SUPPORTED != 0) {
            return Err(libc::EOPNOTSUPP);
        }
        // `ibv_qp_init_attr_ex` begins with the fields of `ibv_qp_init_attr` (verbs.h's
        // inline ibv_create_qp_ex makes the same cast).
        let qp = ibv_create_qp(a.pd, attr.cast());
        if send_ops.is_some() {
            // SAFETY: NULL (with errno set), or just made by ibv_create_qp: a live `Qp` no
            // other thread uses yet.
            if let Ok(q) = unsafe { try_mut(qp) } {
                enable_qp_ex(q);
            }
        }
        Ok(qp)
    })
}

/// Makes `q` an extended QP: fills the builder's function table.
fn enable_qp_ex(q: &mut Qp) {
    q.is_ex = true;
    let x = &mut q.ibv;
    x.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    x.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    x.wr_bind_mw = Some(wr_bind_mw);
    x.wr_local_inv = Some(wr_local_inv);
    x.wr_rdma_read = Some(wr_rdma_read);
    x.wr_rdma_write = Some(wr_rdma_write);
    x.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    x.wr_send = Some(wr_send);
    x.wr_send_imm = Some(wr_send_imm);
    x.wr_send_inv = Some(wr_send_inv);
    x.wr_set_ud_addr = Some(wr_set_ud_addr);
    x.wr_set_inline_data = Some(wr_set_inline_data);
    x.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    x.wr_set_sge = Some(wr_set_sge);
    x.wr_set_sge_list = Some(wr_set_sge_list);
    x.wr_start = Some(wr_start);
    x.wr_complete = Some(wr_complete);
    x.wr_abort = Some(wr_abort);
}

/// `ibv_qp_to_qp_ex`: the QP as a `struct ibv_qp_ex` when it was made extended
/// (`ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`), else NULL.
pub(crate) extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    ffi!({
        // SAFETY: NULL or a live QP of this library.
        match unsafe { try_ref(qp) } {
            Ok(q) if q.is_ex => qp.cast(),
            _ => std::ptr::null_mut(),
        }
    })
}

/// Runs `f` on the builder of the extended QP `qp` (the `ibv_wr_*` functions return
/// nothing: a panic is swallowed, and the next `wr_complete` reports EIO).
fn with_build(qp: *mut ibv_qp_ex, f: impl FnOnce(&Qp, &mut WrBuild)) {
    ffi!({
        // SAFETY: NULL or an extended QP of this library (the caller's contract).
        let Ok(q) = (unsafe { try_ref(qp) }) else {
            return;
        };
        let mut b = q.build.lock();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(q, &mut b)));
        if r.is_err() && b.err == 0 {
            b.err = libc::EIO;
        }
    })
}

/// Starts a new WR of `opcode` with the QP's current `wr_id` and `wr_flags`.
fn new_wr(qp: *mut ibv_qp_ex, opcode: WrOpcode, fill: impl FnOnce(&mut SendWr)) {
    with_build(qp, |q, b| {
        let mut wr = SendWr::new(q.ibv.wr_id, opcode, Vec::new());
        wr.send_flags = SendFlags(q.ibv.wr_flags & 0xf);
        fill(&mut wr);
        b.push(wr);
    });
}

/// Sets something on the WR last started (given with the inline data copied for it);
/// EINVAL at `wr_complete` if there is none.
fn last_wr(
    qp: *mut ibv_qp_ex,
    f: impl FnOnce(&Qp, &mut SendWr, &mut Option<Vec<u8>>) -> Result<(), c_int>,
) {
    with_build(qp, |q, b| {
        let r = match (b.wrs.last_mut(), b.inline.last_mut()) {
            (Some(wr), Some(data)) => f(q, wr, data),
            _ => Err(libc::EINVAL),
        };
        if let Err(e) = r
            && b.err == 0
        {
            b.err = e;
        }
    });
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    new_wr(qp, WrOpcode::AtomicCmpAndSwp, |w| {
        (w.rkey, w.remote_addr, w.compare_add, w.swap) = (rkey, remote_addr, compare, swap);
    });
}

unsafe extern "C" fn wr_atomic_fetch_add(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    new_wr(qp, WrOpcode::AtomicFetchAndAdd, |w| {
        (w.rkey, w.remote_addr, w.compare_add) = (rkey, remote_addr, add);
    });
}

/// `ibv_wr_bind_mw`: binds `mw` (type 2) with R_Key `rkey` over `info`.
unsafe extern "C" fn wr_bind_mw(
    qp: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    with_build(qp, |q, b| {
        let r = if info.is_null() {
            Err(libc::EINVAL)
        } else {
            // SAFETY: live objects of this library (the caller's contract).
            unsafe { bind_wr(q.ibv.wr_id, q.ibv.wr_flags, mw, rkey, &*info) }
        };
        match r {
            Ok(wr) => b.push(wr),
            Err(e) if b.err == 0 => b.err = e,
            Err(_) => {}
        }
    });
}

unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    new_wr(qp, WrOpcode::LocalInv, |w| {
        w.invalidate_rkey = invalidate_rkey
    });
}

unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    new_wr(qp, WrOpcode::RdmaRead, |w| {
        (w.rkey, w.remote_addr) = (rkey, remote_addr);
    });
}

unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    new_wr(qp, WrOpcode::RdmaWrite, |w| {
        (w.rkey, w.remote_addr) = (rkey, remote_addr);
    });
}

unsafe extern "C" fn wr_rdma_write_imm(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm: u32) {
    new_wr(qp, WrOpcode::RdmaWriteWithImm, |w| {
        (w.rkey, w.remote_addr) = (rkey, remote_addr);
        // `imm` is in network order; the engine holds the wire bytes as a BE number.
        w.imm_data = u32::from_be(imm);
    });
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    new_wr(qp, WrOpcode::Send, |_| {});
}

unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm: u32) {
    new_wr(qp, WrOpcode::SendWithImm, |w| {
        w.imm_data = u32::from_be(imm)
    });
}

unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, invalidate_rkey: u32) {
    new_wr(qp, WrOpcode::SendWithInv, |w| {
        w.invalidate_rkey = invalidate_rkey
    });
}

unsafe extern "C" fn wr_set_ud_addr(
    qp: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    last_wr(qp, |_, w, _| {
        // SAFETY: NULL or a live AH of this library (the caller's contract).
        let ah: &Ah = unsafe { try_ref(ah) }?;
        w.ud = Some(ah.ah.dest(remote_qpn, remote_qkey));
        Ok(())
    });
}

/// Replaces the WR's data with SGEs: inline data set before for it is dropped, and the WR
/// is IBV_SEND_INLINE only if the QP's `wr_flags` say so.
fn set_sges(q: &Qp, w: &mut SendWr, data: &mut Option<Vec<u8>>, sg_list: Vec<Sge>) {
    w.sg_list = sg_list;
    if data.take().is_some() && q.ibv.wr_flags & SendFlags::INLINE.0 == 0 {
        w.send_flags = SendFlags(w.send_flags.0 & !SendFlags::INLINE.0);
    }
}

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    last_wr(qp, |q, w, data| {
        set_sges(q, w, data, vec![Sge { addr, length, lkey }]);
        Ok(())
    });
}

/// `ibv_wr_set_sge_list`. Errors (at `wr_complete`): `ENOSPC` for more SGEs than the QP's
/// `max_send_sge` (rxe's provider), `EINVAL` for a NULL list.
unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge) {
    last_wr(qp, |q, w, data| {
        if num_sge > q.qp.cap().max_send_sge as usize {
            return Err(libc::ENOSPC);
        }
        if num_sge > 0 && sg_list.is_null() {
            return Err(libc::EINVAL);
        }
        let list = (0..num_sge)
            .map(|i| {
                // SAFETY: `sg_list` holds `num_sge` entries (the caller's contract).
                let s = unsafe { sg_list.add(i).read_unaligned() };
                Sge {
                    addr: s.addr,
                    length: s.length,
                    lkey: s.lkey,
                }
            })
            .collect();
        set_sges(q, w, data, list);
        Ok(())
    });
}

/// `ibv_wr_set_inline_data(_list)`: copies the bytes of `bufs` (address, length) now, as
/// rxe's provider copies them into the WQE: any readable memory, registered or not, which
/// the program may reuse as soon as the call returns. The WR becomes IBV_SEND_INLINE with
/// one keyless SGE of the total length. Errors (at `wr_complete`): `ENOSPC` past the QP's
/// `max_inline_data` (rxe's provider), `EINVAL` without a WR started.
///
/// The buffers are `buf(0)` .. `buf(num_buf - 1)`, read one at a time up to the first that
/// takes the total past the limit, as rxe's provider reads `buf_list` (so a `num_buf` too
/// large for any list fails there, not before).
///
/// # Safety
/// Each `(addr, length)` that `buf` gives names `length` readable bytes (the caller's
/// contract).
unsafe fn set_inline(qp: *mut ibv_qp_ex, num_buf: usize, buf: impl Fn(usize) -> (u64, usize)) {
    with_build(qp, |q, b| {
        let r = (|| {
            let i = b.wrs.len().checked_sub(1).ok_or(libc::EINVAL)?;
            let mut total = 0usize;
            let mut bufs = Vec::new();
            for k in 0..num_buf {
                let (addr, length) = buf(k);
                total = total
                    .checked_add(length)
                    .filter(|&t| t <= q.qp.cap().max_inline_data as usize)
                    .ok_or(libc::ENOSPC)?;
                bufs.push((addr, length));
            }
            let mut data = vec![0u8; total];
            let mut at = 0usize;
            for &(addr, length) in bufs.iter().filter(|b| b.1 > 0) {
                // SAFETY: `length` readable bytes of the program's memory at `addr` (our
                // caller's contract), copied without a reference to them, into
                // `data[at..at + length]` (the lengths sum to `data.len()`).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        addr as usize as *const u8,
                        data.as_mut_ptr().add(at),
                        length,
                    )
                };
                at += length;
            }
            let w = &mut b.wrs[i];
            w.sg_list = match bufs.first() {
                Some(&(addr, _)) if total > 0 => vec![Sge {
                    addr,
                    length: total as u32,
                    lkey: 0,
                }],
                _ => Vec::new(),
            };
            w.send_flags = SendFlags(w.send_flags.0 | SendFlags::INLINE.0);
            b.inline[i] = Some(data);
            Ok(())
        })();
        if let Err(e) = r
            && b.err == 0
        {
            b.err = e;
        }
    });
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    // SAFETY: `addr` holds `length` readable bytes (the caller's contract).
    unsafe { set_inline(qp, 1, |_| (addr as u64, length)) };
}

unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    num_buf: usize,
    buf_list: *const ibv_data_buf,
) {
    let buf = |i: usize| {
        if buf_list.is_null() {
            // Nothing to read: refused like data over the limit.
            return (0, usize::MAX);
        }
        // SAFETY: `buf_list` holds `num_buf` entries (the caller's contract) and `i` is
        // below it; read as a copy, unaligned-safe.
        let b = unsafe { buf_list.add(i).read_unaligned() };
        (b.addr as u64, b.length)
    };
    // SAFETY: each buffer holds `length` readable bytes (the caller's contract).
    unsafe { set_inline(qp, num_buf, buf) };
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    with_build(qp, |_, b| {
        b.wrs.clear();
        b.inline.clear();
        b.err = 0;
    });
}

unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    ffi!({
        // SAFETY: NULL or an extended QP of this library (the caller's contract).
        let q: &Qp = unsafe { try_ref(qp) }?;
        let mut b = q.build.lock();
        let wrs = std::mem::take(&mut b.wrs);
        let inline = std::mem::take(&mut b.inline);
        let err = std::mem::take(&mut b.err);
        drop(b);
        if err != 0 {
            return Err(err);
        }
        if wrs.is_empty() {
            return Ok(());
        }
        q.qp.post_send_gathered(&wrs, inline).map_err(|e| e.errno())
    })
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    with_build(qp, |_, b| {
        b.wrs.clear();
        b.inline.clear();
        b.err = 0;
    });
}
