//! Completion queues: `ibv_create_cq`, `ibv_resize_cq`, `ibv_destroy_cq`, their events on
//! a completion channel (`ibv_get_cq_event`, `ibv_ack_cq_events`), the `ibv_context_ops`
//! entries behind verbs.h's static inline `ibv_poll_cq` and `ibv_req_notify_cq`, and the
//! extended CQ: `verbs_context.create_cq_ex` and the polling functions of
//! `struct ibv_cq_ex` (`ibv_start_poll`, `ibv_next_poll`, `ibv_end_poll`, `ibv_wc_read_*`).
//! The engine's completions become `struct ibv_wc` here ([`wc_to_c`]).

use crate::comp_channel::CompChannel;
use crate::context::{Context, wait_readable};
use crate::handle::{Castable, Users, free, into_handle, try_mut, try_ref};
use core::ffi::{c_int, c_uint, c_void};
use parking_lot::Mutex;
use softroce::verbs::{self, Wc, WcFlags, WcOpcode};
use softroce_cabi::abi::*;
use softroce_cabi::{SetsErrno, ffi};

/// A completion queue. Every CQ is a `struct ibv_cq_ex` (whose first fields are
/// `struct ibv_cq`); those made by `ibv_create_cq_ex` have its polling functions set.
#[repr(C)]
pub(crate) struct Cq {
    pub ibv: ibv_cq_ex,
    pub cq: verbs::Cq,
    /// How many send and receive queues of live QPs this CQ is.
    pub users: Users,
    /// The completion `ibv_start_poll` / `ibv_next_poll` last took.
    pub current: Mutex<ibv_wc>,
}

// SAFETY: `ibv_cq_ex` is the first field of the `#[repr(C)]` `Cq` that `ibv_create_cq`
// boxes.
unsafe impl Castable for ibv_cq_ex {
    type RustType = Cq;
}

// SAFETY: `struct ibv_cq_ex` begins with the fields of `struct ibv_cq` (verbs.h's
// `ibv_cq_ex_to_cq` makes the same cast), so an `ibv_cq` is at offset 0 of a `Cq` too.
unsafe impl Castable for ibv_cq {
    type RustType = Cq;
}

pub(crate) extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    ffi!({
        // SAFETY: NULL or a live context.
        let c: &Context = unsafe { try_ref(ctx) }?;
        if cqe <= 0 {
            return Err(libc::EINVAL);
        }
        let dev = c.dev.device();
        // Past the `max_cqe` ibv_query_device reports, or a completion vector the
        // context lacks: EINVAL, as rxe.
        let max_cqe = dev.query_device().max_cqe - 1;
        if cqe as u64 > u64::from(max_cqe)
            || !(0..c.vctx.context.num_comp_vectors).contains(&comp_vector)
        {
            return Err(libc::EINVAL);
        }
        // SAFETY: NULL (no channel) or a live channel.
        let ch: Option<&CompChannel> = unsafe { try_ref(channel) }.ok();
        let cq = match ch {
            None => dev.create_cq(cqe as u32),
            Some(ch) => dev.create_cq_with_channel(cqe as u32, &ch.ch),
        }
        .map_err(|e| e.errno())?;
        if ch.is_some() {
            // SAFETY: a live channel; its `refcnt` counts its CQs.
            unsafe { (*channel).refcnt += 1 };
        }
        let num = cq.cq_num();
        // SAFETY: all zeros is a valid `ibv_cq_ex` (NULL function pointers, numbers).
        let mut ibv: ibv_cq_ex = unsafe { std::mem::zeroed() };
        ibv.context = ctx;
        ibv.channel = channel;
        ibv.cq_context = cq_context;
        ibv.handle = num;
        ibv.cqe = cqe;
        ibv.mutex = libc::PTHREAD_MUTEX_INITIALIZER;
        ibv.cond = libc::PTHREAD_COND_INITIALIZER;
        let p: *mut ibv_cq = into_handle(Cq {
            ibv,
            cq,
            users: Users::default(),
            current: Mutex::new(ibv_wc::default()),
        });
        c.cqs.lock().insert(num, p as usize);
        Ok(p)
    })
}

/// `ibv_resize_cq`: the CQ holds `cqe` completions from now on (`cq->cqe` says so), keeping
/// those it holds. EINVAL for 0, past `max_cqe`, or fewer than the completions waiting to be
/// polled (as rxe).
pub(crate) extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    ffi!(SetsErrno, {
        // SAFETY: NULL or a live CQ.
        let q = unsafe { try_ref(cq) }?;
        if cqe <= 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: a live CQ has a live context.
        let c: &Context = unsafe { try_ref(q.ibv.context) }?;
        let max_cqe = c.dev.device().query_device().max_cqe - 1;
        if cqe as u64 > u64::from(max_cqe) {
            return Err(libc::EINVAL);
        }
        q.cq.resize(cqe as u32).map_err(|e| e.errno())?;
        // SAFETY: a live CQ; `cqe` is the program's to read, ours to write.
        unsafe { (*cq).cqe = cqe };
        Ok(())
    })
}

pub(crate) extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    ffi!(SetsErrno, {
        // SAFETY: NULL or a live CQ.
        let q = unsafe { try_ref(cq) }?;
        if q.users.in_use() {
            return Err(libc::EBUSY);
        }
        // SAFETY: its context is live while it is.
        let c: &Context = unsafe { try_ref(q.ibv.context) }?;
        c.cqs.lock().remove(&q.cq.cq_num());
        if !q.ibv.channel.is_null() {
            // SAFETY: the channel outlives its CQs (ibv_destroy_comp_channel refuses
            // before).
            unsafe { (*q.ibv.channel).refcnt -= 1 };
        }
        // SAFETY: the caller gives the CQ up.
        unsafe { free(cq) };
        Ok(())
    })
}

pub(crate) extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    ffi!({
        // SAFETY: NULL or a live channel.
        let ch: &CompChannel = unsafe { try_ref(channel) }?;
        if cq.is_null() || cq_context.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the channel's context is live.
        let c: &Context = unsafe { try_ref(ch.ibv.context) }?;
        let got = loop {
            if let Some(q) = ch.ch.try_get_cq_event() {
                break q;
            }
            // The device failed (its driver thread panicked): no event will come, and the
            // channel's fd stays readable. The kernel's uverbs says EIO on a closed event file.
            if ch.ch.is_closed() {
                return Err(libc::EIO);
            }
            // This thread blocks: in busy-polling mode the driver thread receives now.
            c.dev.poller_sleeps();
            wait_readable(ch.ibv.fd)?;
        };
        // The CQ was destroyed after its event was raised: EAGAIN.
        let p = c
            .cqs
            .lock()
            .get(&got.cq_num())
            .copied()
            .ok_or(libc::EAGAIN)?;
        let p = p as *mut ibv_cq;
        // SAFETY: `p` is the handle of a live CQ (in the table, as ibv_create_cq put it).
        let q: &Cq = unsafe { try_ref(p) }?;
        // SAFETY: the out pointers are writable (checked non-NULL above).
        unsafe {
            *cq = p;
            *cq_context = q.ibv.cq_context;
        }
        Ok(0)
    })
}

pub(crate) extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    ffi!({
        // SAFETY: NULL or a live CQ.
        let Ok(q) = (unsafe { try_ref(cq) }) else {
            return;
        };
        // SAFETY: the CQ's channel (if any) is live while the CQ is.
        let ch: Result<&CompChannel, _> = unsafe { try_ref(q.ibv.channel) };
        if let Ok(ch) = ch {
            let _ = ch.ch.ack_cq_events(&q.cq, nevents);
        }
        // SAFETY: the program's own CQ struct; rdma-core updates this field under the CQ's
        // mutex; we are the only writer.
        unsafe { (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(nevents) };
    })
}

/// `enum ibv_wc_opcode` of an engine completion.
fn wc_opcode(o: WcOpcode) -> c_int {
    match o {
        WcOpcode::Send => IBV_WC_SEND,
        WcOpcode::RdmaWrite => IBV_WC_RDMA_WRITE,
        WcOpcode::RdmaRead => IBV_WC_RDMA_READ,
        WcOpcode::CompSwap => IBV_WC_COMP_SWAP,
        WcOpcode::FetchAdd => IBV_WC_FETCH_ADD,
        WcOpcode::BindMw => IBV_WC_BIND_MW,
        WcOpcode::LocalInv => IBV_WC_LOCAL_INV,
        // The kernel's IB_WC_REG_MR, which rxe passes through (verbs.h names no 8).
        WcOpcode::RegMr => 8,
        WcOpcode::Recv => IBV_WC_RECV,
        WcOpcode::RecvRdmaWithImm => IBV_WC_RECV_RDMA_WITH_IMM,
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
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // A count, or -1 without errno (verbs.h: "a negative value on failure").
    ffi!(panic = -1, {
        // SAFETY: NULL or a live CQ.
        let Ok(q) = (unsafe { try_ref(cq) }) else {
            return -1;
        };
        if n > 0 && wc.is_null() {
            return -1;
        }
        if n <= 0 {
            return 0;
        }
        // SAFETY: a live CQ's context is live.
        let Ok::<&Context, _>(c) = (unsafe { try_ref(q.ibv.context) }) else {
            return -1;
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
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    ffi!({
        // SAFETY: NULL or a live CQ.
        let q = unsafe { try_ref(cq) }?;
        q.cq.req_notify(solicited_only != 0)
            .map_err(|e| e.errno())?;
        // A program that arms its CQ may block next (on the channel's fd, which libibverbs
        // does not see): what its posts left for the next poll leaves now.
        // SAFETY: a live CQ's context is live.
        if let Ok::<&Context, _>(c) = unsafe { try_ref(q.ibv.context) } {
            c.dev.pump_deferred();
        }
        Ok(())
    })
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
    ffi!({
        // SAFETY: NULL or a readable init attr (the caller's contract).
        let a = unsafe { attr.as_ref() }.ok_or(libc::EINVAL)?;
        if a.wc_flags & !WC_STANDARD_FLAGS != 0
            || a.comp_mask & !CQ_INIT_ATTR_MASK_FLAGS != 0
            || (a.comp_mask & CQ_INIT_ATTR_MASK_FLAGS != 0
                && a.flags & !CREATE_CQ_ATTR_SINGLE_THREADED != 0)
        {
            return Err(libc::EOPNOTSUPP);
        }
        let cqe = c_int::try_from(a.cqe).map_err(|_| libc::EINVAL)?;
        let cq = ibv_create_cq(ctx, cqe, a.cq_context, a.channel, a.comp_vector as c_int);
        // SAFETY: NULL, or just made by ibv_create_cq: a live `Cq` no other thread knows yet.
        let Ok(q) = (unsafe { try_mut(cq) }) else {
            // NULL with the errno ibv_create_cq set.
            return Ok(std::ptr::null_mut());
        };
        let x = &mut q.ibv;
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
        Ok(cq.cast())
    })
}

/// Takes the next completion of `cq` as the current one: 0, or ENOENT when it is empty.
fn advance(cq: *mut ibv_cq_ex) -> c_int {
    ffi!({
        // SAFETY: NULL or a live CQ of this library (the caller's contract).
        let q = unsafe { try_ref(cq) }?;
        // SAFETY: its context is live while it is.
        let c: &Context = unsafe { try_ref(q.ibv.context) }?;
        let mut one = [Wc::default()];
        if c.dev.poll_cq(&q.cq, &mut one) == 0 {
            return Err(libc::ENOENT);
        }
        let w = wc_to_c(&one[0]);
        // SAFETY: the program's own CQ struct, which it reads between polls; only the
        // polling thread writes it (the API's rule).
        unsafe {
            (*cq).status = w.status;
            (*cq).wr_id = w.wr_id;
        }
        *q.current.lock() = w;
        Ok(())
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
    // The `ibv_wc_read_*` functions have no error return.
    ffi!(panic = T::default(), {
        // SAFETY: NULL or a live CQ of this library (the caller's contract).
        let Ok(q) = (unsafe { try_ref(cq) }) else {
            return T::default();
        };
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
