//! The extended QP and CQ: `verbs_context.create_qp_ex` (what verbs.h's inline
//! `ibv_create_qp_ex` calls), `ibv_qp_to_qp_ex` and the work request builder of
//! `struct ibv_qp_ex` (`ibv_wr_start` … `ibv_wr_complete`); `verbs_context.create_cq_ex`
//! and the polling functions of `struct ibv_cq_ex` (`ibv_start_poll`, `ibv_next_poll`,
//! `ibv_end_poll`, `ibv_wc_read_*`). Behaviour follows rdma-core's rxe provider
//! (providers/rxe/rxe.c): the builder queues WRs from `wr_start` and posts them all in
//! `wr_complete`, which returns the first error met while building (posting none of them);
//! `wr_abort` drops them.

use crate::abi::*;
use crate::objects::{Ah, Cq, Qp, obj};
use crate::post::wc_to_c;
use crate::{ffi, null_errno};
use core::ffi::{c_int, c_uint, c_void};
use softroce::verbs::{SendFlags, SendWr, Sge, Wc, WrOpcode};

/// The WRs a `wr_start` … `wr_complete` sequence builds, and the first error met.
#[derive(Default)]
pub(crate) struct WrBuild {
    wrs: Vec<SendWr>,
    /// `inline[i]`: the bytes `wr_set_inline_data(_list)` copied for `wrs[i]`.
    inline: Vec<Option<Vec<u8>>>,
    err: c_int,
}

impl WrBuild {
    fn push(&mut self, wr: SendWr) {
        self.wrs.push(wr);
        self.inline.push(None);
    }
}

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
    ffi!(std::ptr::null_mut(), {
        if attr.is_null() {
            return null_errno(libc::EINVAL);
        }
        // SAFETY: a readable, writable init attr (the caller's contract).
        let a = unsafe { &mut *attr };
        let known =
            IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        if a.comp_mask & !known != 0
            || (a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0)
        {
            return null_errno(libc::EOPNOTSUPP);
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
            return null_errno(libc::EINVAL);
        }
        let send_ops =
            (a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0).then_some(a.send_ops_flags);
        if send_ops.is_some_and(|f| f & !SEND_OPS_SUPPORTED != 0) {
            return null_errno(libc::EOPNOTSUPP);
        }
        // `ibv_qp_init_attr_ex` begins with the fields of `ibv_qp_init_attr` (verbs.h's
        // inline ibv_create_qp_ex makes the same cast).
        let qp = crate::objects::ibv_create_qp(a.pd, attr.cast());
        if !qp.is_null() && send_ops.is_some() {
            // SAFETY: just made by ibv_create_qp: a live `Qp`.
            unsafe { enable_qp_ex(qp.cast()) };
        }
        qp
    })
}

/// Makes `qp` an extended QP: fills the builder's function table.
///
/// # Safety
/// `qp` is a live `Qp` no other thread uses yet.
unsafe fn enable_qp_ex(qp: *mut Qp) {
    // SAFETY: our caller's contract.
    let q = unsafe { &mut *qp };
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
    ffi!(std::ptr::null_mut(), {
        if qp.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: a live QP of this library.
        if unsafe { obj::<Qp, _>(qp) }.is_ex {
            qp.cast()
        } else {
            std::ptr::null_mut()
        }
    })
}

/// Runs `f` on the builder of the extended QP `qp` (the `ibv_wr_*` functions return
/// nothing: a panic is swallowed, and the next `wr_complete` reports EIO).
fn with_build(qp: *mut ibv_qp_ex, f: impl FnOnce(&Qp, &mut WrBuild)) {
    ffi!((), {
        if qp.is_null() {
            return;
        }
        // SAFETY: an extended QP of this library (the caller's contract).
        let q = unsafe { obj::<Qp, _>(qp) };
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
            unsafe { crate::mw::bind_wr(q.ibv.wr_id, q.ibv.wr_flags, mw, rkey, &*info) }
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
        if ah.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: a live AH of this library (the caller's contract).
        let ah = unsafe { obj::<Ah, _>(ah) };
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
        if num_sge > q.cap.max_send_sge as usize {
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
                    .filter(|&t| t <= q.cap.max_inline_data as usize)
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
    ffi!(libc::EIO, {
        if qp.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: an extended QP of this library (the caller's contract).
        let q = unsafe { obj::<Qp, _>(qp) };
        let mut b = q.build.lock();
        let wrs = std::mem::take(&mut b.wrs);
        let inline = std::mem::take(&mut b.inline);
        let err = std::mem::take(&mut b.err);
        drop(b);
        if err != 0 {
            return err;
        }
        if wrs.is_empty() {
            return 0;
        }
        match q.qp.post_send_gathered(&wrs, inline) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    with_build(qp, |_, b| {
        b.wrs.clear();
        b.inline.clear();
        b.err = 0;
    });
}

/// `IBV_WC_STANDARD_FLAGS`: what an extended CQ of softroce can report (as rxe).
const WC_STANDARD_FLAGS: u64 = 0x7f;
/// `IBV_CQ_INIT_ATTR_MASK_FLAGS`.
const CQ_INIT_ATTR_MASK_FLAGS: u32 = 1 << 0;
/// `IBV_CREATE_CQ_ATTR_SINGLE_THREADED` (a hint).
const CREATE_CQ_ATTR_SINGLE_THREADED: u32 = 1 << 0;

/// `verbs_context.create_cq_ex`: a CQ whose completions are also read with
/// `ibv_start_poll` … `ibv_end_poll`. `wc_flags` beyond `IBV_WC_STANDARD_FLAGS`
/// (timestamps, CVLAN, flow tag, TM info) are EOPNOTSUPP.
pub(crate) unsafe extern "C" fn create_cq_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    ffi!(std::ptr::null_mut(), {
        if attr.is_null() {
            return null_errno(libc::EINVAL);
        }
        // SAFETY: a readable init attr (the caller's contract).
        let a = unsafe { &*attr };
        if a.wc_flags & !WC_STANDARD_FLAGS != 0
            || a.comp_mask & !CQ_INIT_ATTR_MASK_FLAGS != 0
            || (a.comp_mask & CQ_INIT_ATTR_MASK_FLAGS != 0
                && a.flags & !CREATE_CQ_ATTR_SINGLE_THREADED != 0)
        {
            return null_errno(libc::EOPNOTSUPP);
        }
        let Ok(cqe) = c_int::try_from(a.cqe) else {
            return null_errno(libc::EINVAL);
        };
        let cq = crate::objects::ibv_create_cq(
            ctx,
            cqe,
            a.cq_context,
            a.channel,
            a.comp_vector as c_int,
        );
        if cq.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: just made by ibv_create_cq: a live `Cq` no other thread knows yet.
        let x = unsafe { &mut (*cq.cast::<Cq>()).ibv };
        x.start_poll = Some(start_poll);
        x.next_poll = Some(next_poll);
        x.end_poll = Some(end_poll);
        x.read_opcode = Some(read_opcode);
        x.read_vendor_err = Some(read_vendor_err);
        x.read_byte_len = Some(read_byte_len);
        x.read_imm_data = Some(read_imm_data);
        x.read_qp_num = Some(read_qp_num);
        x.read_src_qp = Some(read_src_qp);
        x.read_wc_flags = Some(read_wc_flags);
        x.read_slid = Some(read_slid);
        x.read_sl = Some(read_sl);
        x.read_dlid_path_bits = Some(read_dlid_path_bits);
        cq.cast()
    })
}

/// Takes the next completion of `cq` as the current one: 0, or ENOENT when it is empty.
fn advance(cq: *mut ibv_cq_ex) -> c_int {
    ffi!(libc::EIO, {
        if cq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live CQ of this library (the caller's contract).
        let q = unsafe { obj::<Cq, _>(cq) };
        // SAFETY: its context is live while it is.
        let c = unsafe { crate::device::context(q.ibv.context) };
        let mut one = [Wc::default()];
        if c.dev.poll_cq(&q.cq, &mut one) == 0 {
            return libc::ENOENT;
        }
        let w = wc_to_c(&one[0]);
        // SAFETY: the program's own CQ struct, which it reads between polls; only the
        // polling thread writes it (the API's rule).
        unsafe {
            (*cq).status = w.status;
            (*cq).wr_id = w.wr_id;
        }
        *q.current.lock() = w;
        0
    })
}

unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    // SAFETY: NULL or readable (the caller's contract).
    if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
        return libc::EINVAL;
    }
    advance(cq)
}

unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    advance(cq)
}

unsafe extern "C" fn end_poll(_cq: *mut ibv_cq_ex) {}

/// A field of the current completion of `cq`.
fn current<T: Default>(cq: *mut ibv_cq_ex, f: impl FnOnce(&ibv_wc) -> T) -> T {
    ffi!(T::default(), {
        if cq.is_null() {
            return T::default();
        }
        // SAFETY: a live CQ of this library (the caller's contract).
        let q = unsafe { obj::<Cq, _>(cq) };
        f(&q.current.lock())
    })
}

unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> c_int {
    current(cq, |w| w.opcode)
}
unsafe extern "C" fn read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w| w.vendor_err)
}
unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w| w.byte_len)
}
unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w| w.imm_data)
}
unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w| w.qp_num)
}
unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w| w.src_qp)
}
unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> c_uint {
    current(cq, |w| w.wc_flags)
}
unsafe extern "C" fn read_slid(cq: *mut ibv_cq_ex) -> u32 {
    current(cq, |w| u32::from(w.slid))
}
unsafe extern "C" fn read_sl(cq: *mut ibv_cq_ex) -> u8 {
    current(cq, |w| w.sl)
}
unsafe extern "C" fn read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8 {
    current(cq, |w| w.dlid_path_bits)
}
