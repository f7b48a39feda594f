//! The data path: the `ibv_context_ops` entries that verbs.h's static inline
//! `ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv`, `ibv_poll_cq` and
//! `ibv_req_notify_cq` call. Each converts the program's work requests to the engine's (a
//! list walk; SGE addresses are the program's virtual addresses) or the engine's
//! completions to `struct ibv_wc`.

use crate::abi::*;
use crate::device::context;
use crate::ffi;
use crate::objects::{Ah, Cq, Qp, Srq, obj};
use core::ffi::c_int;
use softroce::verbs::{RecvWr, SendFlags, SendWr, Sge, Wc, WcFlags, WcOpcode, WrOpcode};

/// The ops table of every context.
pub(crate) fn context_ops() -> ibv_context_ops {
    ibv_context_ops {
        _compat_query_device: None,
        _compat_query_port: None,
        _compat_alloc_pd: None,
        _compat_dealloc_pd: None,
        _compat_reg_mr: None,
        _compat_rereg_mr: None,
        _compat_dereg_mr: None,
        alloc_mw: Some(crate::mw::alloc_mw),
        bind_mw: Some(crate::mw::bind_mw),
        dealloc_mw: Some(crate::mw::dealloc_mw),
        _compat_create_cq: None,
        poll_cq: Some(poll_cq),
        req_notify_cq: Some(req_notify_cq),
        _compat_cq_event: None,
        _compat_resize_cq: None,
        _compat_destroy_cq: None,
        _compat_create_srq: None,
        _compat_modify_srq: None,
        _compat_query_srq: None,
        _compat_destroy_srq: None,
        post_srq_recv: Some(post_srq_recv),
        _compat_create_qp: None,
        _compat_query_qp: None,
        _compat_modify_qp: None,
        _compat_destroy_qp: None,
        post_send: Some(post_send),
        post_recv: Some(post_recv),
        _compat_create_ah: None,
        _compat_destroy_ah: None,
        _compat_attach_mcast: None,
        _compat_detach_mcast: None,
        _compat_async_event: None,
    }
}

/// Most SGEs softroce reads from one WR (the device's `max_sge`); more is `EINVAL` (the
/// engine would refuse them anyway).
const MAX_SGE: c_int = 32;

/// The SGE list of a WR.
///
/// # Safety
/// `sg_list` must be readable for `num_sge` entries when `num_sge > 0`.
unsafe fn sges(sg_list: *const ibv_sge, num_sge: c_int) -> Result<Vec<Sge>, c_int> {
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

fn wr_opcode(v: c_int) -> Option<WrOpcode> {
    Some(match v {
        0 => WrOpcode::RdmaWrite,
        1 => WrOpcode::RdmaWriteWithImm,
        2 => WrOpcode::Send,
        3 => WrOpcode::SendWithImm,
        4 => WrOpcode::RdmaRead,
        5 => WrOpcode::AtomicCmpAndSwp,
        6 => WrOpcode::AtomicFetchAndAdd,
        7 => WrOpcode::LocalInv,
        8 => WrOpcode::BindMw,
        9 => WrOpcode::SendWithInv,
        // TSO (10) and DRIVER1 (11) need a raw packet QP.
        _ => return None,
    })
}

/// One `ibv_send_wr` as the engine's `SendWr`.
///
/// # Safety
/// `w` is a readable WR whose pointers (SGE list, AH) are valid, as `ibv_post_send` requires.
unsafe fn send_wr(w: &ibv_send_wr, qp_type: c_int) -> Result<SendWr, c_int> {
    let opcode = wr_opcode(w.opcode).ok_or(libc::EINVAL)?;
    if opcode == WrOpcode::BindMw {
        let b = w.bind_mw;
        // SAFETY: our caller's contract (the window and MR are live objects).
        return unsafe { crate::mw::bind_wr(w.wr_id, w.send_flags, b.mw, b.rkey, &b.bind_info) };
    }
    // SAFETY: our caller's contract.
    let mut wr = SendWr::new(w.wr_id, opcode, unsafe { sges(w.sg_list, w.num_sge)? });
    wr.send_flags = SendFlags(w.send_flags & 0xf);
    match opcode {
        WrOpcode::LocalInv | WrOpcode::SendWithInv => wr.invalidate_rkey = w.imm_data,
        // `imm_data` is in network order; the engine holds the wire bytes as a BE number.
        _ => wr.imm_data = u32::from_be(w.imm_data),
    }
    // SAFETY: which union member is meaningful follows from the opcode and QP type.
    unsafe {
        match opcode {
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm | WrOpcode::RdmaRead => {
                wr.remote_addr = w.wr.rdma.remote_addr;
                wr.rkey = w.wr.rdma.rkey;
            }
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => {
                wr.remote_addr = w.wr.atomic.remote_addr;
                wr.rkey = w.wr.atomic.rkey;
                wr.compare_add = w.wr.atomic.compare_add;
                wr.swap = w.wr.atomic.swap;
            }
            _ => {}
        }
        if qp_type == 4 {
            let ud = w.wr.ud;
            if ud.ah.is_null() {
                return Err(libc::EINVAL);
            }
            let ah = obj::<Ah, _>(ud.ah);
            wr.ud = Some(ah.ah.dest(ud.remote_qpn, ud.remote_qkey));
        }
    }
    Ok(wr)
}

/// The data of an IBV_SEND_INLINE WR, copied from its SGEs' addresses at post time, as
/// rxe's provider copies them into the WQE (`init_send_wqe`): any readable memory (stack,
/// heap, registered or not), no lkey checked. `Ok(None)` for a WR without the flag or for an
/// opcode that carries no data (the engine posts those as usual).
///
/// Errors: `EINVAL` when the SGEs add up to more than the QP's `max_inline_data`, whatever
/// the opcode (rxe's provider `validate_send_wr`).
///
/// # Safety
/// For an inline WR, each SGE addresses `length` readable bytes (libibverbs' contract: the
/// caller may reuse them as soon as `ibv_post_send` returns).
unsafe fn inline_bytes(wr: &SendWr, max_inline_data: u32) -> Result<Option<Vec<u8>>, c_int> {
    if !wr.send_flags.contains(SendFlags::INLINE) {
        return Ok(None);
    }
    // In 64 bits: rxe's provider sums in 32, so lengths that wrap pass its check and
    // overrun its WQE (spec/deviations.toml); here they are EINVAL.
    let length: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
    if length > u64::from(max_inline_data) {
        return Err(libc::EINVAL);
    }
    if !matches!(
        wr.opcode,
        WrOpcode::Send
            | WrOpcode::SendWithImm
            | WrOpcode::SendWithInv
            | WrOpcode::RdmaWrite
            | WrOpcode::RdmaWriteWithImm
    ) {
        return Ok(None);
    }
    let mut data = vec![0u8; length as usize];
    let mut at = 0usize;
    for s in wr.sg_list.iter().filter(|s| s.length > 0) {
        let n = s.length as usize;
        // SAFETY: the source is `n` readable bytes of the program's memory (our caller's
        // contract), copied without forming a reference to them; the destination is
        // `data[at..at + n]`, inside `data` because the lengths sum to `data.len()`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                s.addr as usize as *const u8,
                data.as_mut_ptr().add(at),
                n,
            )
        };
        at += n;
    }
    Ok(Some(data))
}

/// `ops.post_send`. Returns 0, or an errno with `*bad_wr` at the first WR not posted.
unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    ffi!(libc::EIO, {
        if qp.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live QP.
        let q = unsafe { obj::<Qp, _>(qp) };
        let mut ptrs = Vec::new();
        let mut wrs = Vec::new();
        let mut inline = Vec::new();
        let mut failed = None;
        let mut p = wr;
        while !p.is_null() {
            // SAFETY: the program's WR list, readable as ibv_post_send requires.
            let w = unsafe { &*p };
            // SAFETY: as above.
            let r = unsafe { send_wr(w, q.ibv.qp_base.qp_type) }.and_then(|e| {
                // SAFETY: an inline WR's SGEs address readable bytes (libibverbs'
                // contract: the provider copies them before ibv_post_send returns).
                unsafe { inline_bytes(&e, q.cap.max_inline_data) }.map(|d| (e, d))
            });
            match r {
                Ok((e, data)) => {
                    inline.push(data);
                    wrs.push(e);
                    ptrs.push(p);
                }
                Err(e) => {
                    failed = Some((p, e));
                    break;
                }
            }
            p = w.next;
        }
        let mut ret = 0;
        if !wrs.is_empty()
            && let Err(e) = q.qp.post_send_gathered(&wrs, inline)
        {
            let i = e.bad_wr().unwrap_or(0).min(ptrs.len() - 1);
            failed = Some((ptrs[i], e.errno()));
        }
        if let Some((p, e)) = failed {
            if !bad_wr.is_null() {
                // SAFETY: writable (the caller's contract).
                unsafe { *bad_wr = p };
            }
            ret = e;
        }
        ret
    })
}

/// The receive WRs of a list, with their pointers for `bad_wr`.
///
/// # Safety
/// `wr` is NULL or a readable list of readable WRs.
unsafe fn recv_wrs(
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
fn finish_recv(
    wrs: Vec<RecvWr>,
    ptrs: Vec<*mut ibv_recv_wr>,
    mut failed: Option<(*mut ibv_recv_wr, c_int)>,
    bad_wr: *mut *mut ibv_recv_wr,
    post: impl FnOnce(&[RecvWr]) -> softroce::verbs::Result<()>,
) -> c_int {
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
            e
        }
        None => 0,
    }
}

/// `ops.post_recv`.
unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    ffi!(libc::EIO, {
        if qp.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live QP and the program's WR list.
        let (q, (wrs, ptrs, failed)) = unsafe { (obj::<Qp, _>(qp), recv_wrs(wr)) };
        finish_recv(wrs, ptrs, failed, bad_wr, |w| q.qp.post_recv(w))
    })
}

/// `ops.post_srq_recv`.
unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    ffi!(libc::EIO, {
        if srq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live SRQ and the program's WR list.
        let (s, (wrs, ptrs, failed)) = unsafe { (obj::<Srq, _>(srq), recv_wrs(wr)) };
        finish_recv(wrs, ptrs, failed, bad_wr, |w| s.srq.post_recv(w))
    })
}

/// `enum ibv_wc_opcode` of an engine completion.
fn wc_opcode(o: WcOpcode) -> c_int {
    match o {
        WcOpcode::Send => 0,
        WcOpcode::RdmaWrite => 1,
        WcOpcode::RdmaRead => 2,
        WcOpcode::CompSwap => 3,
        WcOpcode::FetchAdd => 4,
        WcOpcode::BindMw => 5,
        WcOpcode::LocalInv => 6,
        // The kernel's IB_WC_REG_MR, which rxe passes through.
        WcOpcode::RegMr => 8,
        WcOpcode::Recv => 128,
        WcOpcode::RecvRdmaWithImm => 129,
    }
}

pub(crate) fn wc_to_c(w: &Wc) -> ibv_wc {
    ibv_wc {
        wr_id: w.wr_id,
        status: w.status as c_int,
        opcode: wc_opcode(w.opcode),
        vendor_err: w.vendor_err,
        byte_len: w.byte_len,
        imm_data: if w.wc_flags.contains(WcFlags::WITH_INV) {
            w.imm_data
        } else {
            w.imm_data.to_be()
        },
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags: w.wc_flags.0,
        pkey_index: 0,
        slid: 0,
        sl: 0,
        dlid_path_bits: 0,
    }
}

/// `ops.poll_cq`: up to `n` completions into `wc`; the number written. A negative `n`
/// takes none and returns 0, as rxe's provider (`rxe_poll_cq` loops while `npolled < ne`).
/// -1 for a NULL CQ, or a NULL `wc` with `n` > 0 (rxe's provider would crash).
unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    ffi!(-1, {
        if cq.is_null() || (n > 0 && wc.is_null()) {
            return -1;
        }
        if n <= 0 {
            return 0;
        }
        // SAFETY: a live CQ; its context is live.
        let (q, c) = unsafe {
            let q = obj::<Cq, _>(cq);
            (q, context(q.ibv.context))
        };
        let mut buf = [Wc::default(); 16];
        let mut done = 0usize;
        let want = n as usize;
        loop {
            let k = (want - done).min(buf.len());
            let got = c.dev.poll_cq(&q.cq, &mut buf[..k]);
            for (i, w) in buf[..got].iter().enumerate() {
                // SAFETY: `wc` has room for `n` entries (the caller's contract).
                unsafe { *wc.add(done + i) = wc_to_c(w) };
            }
            done += got;
            if got < k || done == want {
                break;
            }
        }
        done as c_int
    })
}

/// `ops.req_notify_cq`.
unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    ffi!(libc::EIO, {
        if cq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live CQ.
        let q = unsafe { obj::<Cq, _>(cq) };
        match q.cq.req_notify(solicited_only != 0) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}
