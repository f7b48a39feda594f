//! The verbs objects: protection domains, memory regions, completion channels and queues,
//! queue pairs, shared receive queues and address handles. Each is a `Box` of a
//! `#[repr(C)]` struct whose first field is the C struct handed to the program.

use crate::abi::*;
use crate::device::{Context, context, path_mtu, wait_readable};
use crate::{ffi, ffi_errno, neg_errno, null_errno};
use core::ffi::{c_int, c_uint, c_void};
use parking_lot::Mutex;
use softroce::verbs::{
    self, AccessFlags, AhAttr, Gid, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType,
    SrqAttr, SrqAttrMask, SrqInitAttr,
};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, Ordering};

/// A protection domain.
#[repr(C)]
pub(crate) struct Pd {
    pub ibv: ibv_pd,
    pub pd: verbs::Pd,
    /// MRs, MWs, QPs, SRQs and AHs made on this PD and not yet destroyed ([`uses`]).
    pub users: AtomicU32,
}

/// A memory region over the caller's memory.
#[repr(C)]
pub(crate) struct Mr {
    pub ibv: ibv_mr,
    pub mr: verbs::Mr,
}

/// A completion channel: `fd` is the engine channel's eventfd.
#[repr(C)]
pub(crate) struct CompChannel {
    pub ibv: ibv_comp_channel,
    pub ch: verbs::CompChannel,
}

/// A completion queue. Every CQ is a `struct ibv_cq_ex` (whose first fields are
/// `struct ibv_cq`); those made by `ibv_create_cq_ex` have its polling functions set.
#[repr(C)]
pub(crate) struct Cq {
    pub ibv: ibv_cq_ex,
    pub cq: verbs::Cq,
    /// How many send and receive queues of live QPs this CQ is ([`uses`]).
    pub users: AtomicU32,
    /// The completion `ibv_start_poll` / `ibv_next_poll` last took.
    pub current: Mutex<ibv_wc>,
}

/// A queue pair, with what `ibv_query_qp` reports that the engine does not keep: the
/// attributes last set by `ibv_modify_qp`, and the creation attributes. Every QP is a
/// `struct ibv_qp_ex` (whose first field is the `struct ibv_qp`); those made by
/// `ibv_create_qp_ex` with send ops have its `ibv_wr_*` functions set and `is_ex`.
#[repr(C)]
pub(crate) struct Qp {
    pub ibv: ibv_qp_ex,
    pub qp: verbs::Qp,
    pub is_ex: bool,
    /// The WRs of an `ibv_wr_start` … `ibv_wr_complete` sequence.
    pub build: Mutex<crate::ex::WrBuild>,
    pub cap: ibv_qp_cap,
    pub sq_sig_all: c_int,
    pub attr: Mutex<ibv_qp_attr>,
}

/// A shared receive queue.
#[repr(C)]
pub(crate) struct Srq {
    pub ibv: ibv_srq,
    pub srq: verbs::Srq,
}

/// An address handle.
#[repr(C)]
pub(crate) struct Ah {
    pub ibv: ibv_ah,
    pub ah: verbs::Ah,
}

/// The Rust object behind a C handle (the C struct is its first field).
///
/// # Safety
/// `p` must be a live handle of type `T`'s C struct, made by this library.
pub(crate) unsafe fn obj<'a, T, C>(p: *mut C) -> &'a T {
    // SAFETY: our caller's contract: `p` is the first field of a live `T`.
    unsafe { &*p.cast::<T>() }
}

/// Counts a user of a PD (an MR, MW, QP, SRQ or AH made on it: `is_pd`) or of a CQ (a live
/// QP's send or receive CQ), `on` when made, off when destroyed: `ibv_dealloc_pd` and
/// `ibv_destroy_cq` refuse with EBUSY while any remain and the handle stays valid, as kernel
/// uverbs does with its objects' `usecnt`.
///
/// # Safety
/// `p` is a live `ibv_pd` (`is_pd`) or `ibv_cq` of ours.
pub(crate) unsafe fn uses<C>(p: *mut C, is_pd: bool, on: bool) {
    // SAFETY: our caller's contract.
    let n = unsafe {
        if is_pd {
            &obj::<Pd, _>(p).users
        } else {
            &obj::<Cq, _>(p).users
        }
    };
    if on {
        n.fetch_add(1, Ordering::AcqRel);
    } else {
        n.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Frees a handle made by `Box::into_raw` of a `T`.
///
/// # Safety
/// As [`obj`], and the handle must not be used afterwards.
pub(crate) unsafe fn free<T, C>(p: *mut C) {
    // SAFETY: our caller's contract.
    drop(unsafe { Box::from_raw(p.cast::<T>()) });
}

fn mutex() -> libc::pthread_mutex_t {
    libc::PTHREAD_MUTEX_INITIALIZER
}

fn cond() -> libc::pthread_cond_t {
    libc::PTHREAD_COND_INITIALIZER
}

pub(crate) extern "C" fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    ffi!(std::ptr::null_mut(), {
        if ctx.is_null() {
            return null_errno(libc::EINVAL);
        }
        // SAFETY: a live context (the caller's contract).
        let c = unsafe { context(ctx) };
        match c.dev.device().alloc_pd() {
            Ok(pd) => {
                let handle = pd.handle();
                Box::into_raw(Box::new(Pd {
                    ibv: ibv_pd {
                        context: ctx,
                        handle,
                    },
                    pd,
                    users: AtomicU32::new(0),
                }))
                .cast()
            }
            Err(e) => null_errno(e.errno()),
        }
    })
}

pub(crate) extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    ffi_errno!({
        if pd.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live PD (the caller's contract).
        if unsafe { obj::<Pd, _>(pd) }.users.load(Ordering::Acquire) > 0 {
            return libc::EBUSY;
        }
        // SAFETY: a live PD that the caller gives up.
        unsafe { free::<Pd, _>(pd) };
        0
    })
}

/// The access flags softroce knows; the optional-range bits (`IBV_ACCESS_OPTIONAL_RANGE`)
/// are hints a device may ignore.
const ACCESS_KNOWN: c_uint = 0x1f;
const ACCESS_OPTIONAL_RANGE: c_uint = 0x3ff0_0000;

pub(crate) extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    ibv_reg_mr_iova2(pd, addr, length, addr as u64, access as c_uint)
}

pub(crate) extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    ibv_reg_mr_iova2(pd, addr, length, iova, access as c_uint)
}

pub(crate) extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    ffi!(std::ptr::null_mut(), {
        if pd.is_null() {
            return null_errno(libc::EINVAL);
        }
        // On-demand paging, zero-based and the other access flags beyond these are not
        // supported.
        if access & !(ACCESS_KNOWN | ACCESS_OPTIONAL_RANGE) != 0 {
            return null_errno(libc::EOPNOTSUPP);
        }
        // SAFETY: a live PD (the caller's contract).
        let p = unsafe { obj::<Pd, _>(pd) };
        // SAFETY: libibverbs' contract: `addr` is valid for `length` bytes until
        // ibv_dereg_mr. (That the program keeps accessing it meanwhile is the engine's
        // user-memory model; see `Pd::reg_mr_user`.)
        let mr = unsafe {
            p.pd.reg_mr_user_iova(
                addr.cast(),
                length,
                iova,
                AccessFlags(access & ACCESS_KNOWN),
            )
        };
        if mr.is_ok() {
            // SAFETY: the live PD the MR is made on.
            unsafe { uses(pd, true, true) };
        }
        match mr {
            Ok(mr) => Box::into_raw(Box::new(Mr {
                ibv: ibv_mr {
                    context: p.ibv.context,
                    pd,
                    addr,
                    length,
                    handle: mr.lkey(),
                    lkey: mr.lkey(),
                    rkey: mr.rkey(),
                },
                mr,
            }))
            .cast(),
            Err(e) => null_errno(e.errno()),
        }
    })
}

/// `ibv_rereg_mr` fails as it does on rxe with rdma-core 44, whose provider has no
/// `rereg_mr`: libibverbs checks the arguments (`IBV_REREG_MR_ERR_INPUT`, -1, errno
/// `EINVAL`: flags other than CHANGE_TRANSLATION / CHANGE_PD / CHANGE_ACCESS, a new
/// translation without an address or a length, access flags without CHANGE_ACCESS), then
/// the provider's default says `EOPNOTSUPP` and libibverbs returns `IBV_REREG_MR_ERR_CMD`
/// (-4) with that errno. The MR stays registered as it was. Its results are
/// `enum ibv_rereg_mr_err_code` values, not errno values. Source: libibverbs 44 `verbs.c`
/// `ibv_rereg_mr`, `dummy_ops.c` `rereg_mr`; providers/rxe/rxe.c `rxe_ctx_ops`.
pub(crate) extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    _pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    /// `IBV_REREG_MR_CHANGE_TRANSLATION`, `_CHANGE_ACCESS`, `_FLAGS_SUPPORTED`.
    const CHANGE_TRANSLATION: c_int = 1 << 0;
    const CHANGE_ACCESS: c_int = 1 << 2;
    const FLAGS_SUPPORTED: c_int = (CHANGE_ACCESS << 1) - 1;
    /// `IBV_REREG_MR_ERR_INPUT`, `IBV_REREG_MR_ERR_CMD`.
    const ERR_INPUT: c_int = -1;
    const ERR_CMD: c_int = -4;
    let bad_input = mr.is_null()
        || flags & !FLAGS_SUPPORTED != 0
        || (flags & CHANGE_TRANSLATION != 0 && (length == 0 || addr.is_null()))
        || (access != 0 && flags & CHANGE_ACCESS == 0);
    if bad_input {
        crate::set_errno(libc::EINVAL);
        return ERR_INPUT;
    }
    crate::set_errno(libc::EOPNOTSUPP);
    ERR_CMD
}

pub(crate) extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    ffi_errno!({
        if mr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live MR that the caller gives up; its PD is live while it is.
        unsafe {
            uses((*mr).pd, true, false);
            free::<Mr, _>(mr);
        }
        0
    })
}

pub(crate) extern "C" fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    ffi!(std::ptr::null_mut(), {
        if ctx.is_null() {
            return null_errno(libc::EINVAL);
        }
        // SAFETY: a live context.
        let c = unsafe { context(ctx) };
        match c.dev.device().create_comp_channel() {
            Ok(ch) => Box::into_raw(Box::new(CompChannel {
                ibv: ibv_comp_channel {
                    context: ctx,
                    fd: ch.as_raw_fd(),
                    refcnt: 0,
                },
                ch,
            }))
            .cast(),
            Err(e) => null_errno(e.errno()),
        }
    })
}

pub(crate) extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    ffi_errno!({
        if ch.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live channel.
        if unsafe { (*ch).refcnt } != 0 {
            return libc::EBUSY;
        }
        // SAFETY: a live channel the caller gives up.
        unsafe { free::<CompChannel, _>(ch) };
        0
    })
}

pub(crate) extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    ffi!(std::ptr::null_mut(), {
        if ctx.is_null() || cqe <= 0 {
            return null_errno(libc::EINVAL);
        }
        // SAFETY: a live context.
        let c = unsafe { context(ctx) };
        let dev = c.dev.device();
        // Past the `max_cqe` ibv_query_device reports, or a completion vector the context
        // lacks: EINVAL, as rxe.
        let max_cqe = dev.query_device().max_cqe - 1;
        if cqe as u64 > u64::from(max_cqe)
            || !(0..c.vctx.context.num_comp_vectors).contains(&comp_vector)
        {
            return null_errno(libc::EINVAL);
        }
        let cq = if channel.is_null() {
            dev.create_cq(cqe as u32)
        } else {
            // SAFETY: a live channel.
            dev.create_cq_with_channel(cqe as u32, unsafe { &obj::<CompChannel, _>(channel).ch })
        };
        let cq = match cq {
            Ok(cq) => cq,
            Err(e) => return null_errno(e.errno()),
        };
        if !channel.is_null() {
            // SAFETY: a live channel.
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
        ibv.mutex = mutex();
        ibv.cond = cond();
        let p = Box::into_raw(Box::new(Cq {
            ibv,
            cq,
            users: AtomicU32::new(0),
            current: Mutex::new(ibv_wc::default()),
        }));
        c.cqs.lock().insert(num, p as usize);
        p.cast()
    })
}

/// `ibv_resize_cq`: the CQ holds `cqe` completions from now on (`cq->cqe` says so), keeping
/// those it holds. EINVAL for 0, past `max_cqe`, or fewer than the completions waiting to be
/// polled (as rxe).
pub(crate) extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    ffi_errno!({
        if cq.is_null() || cqe <= 0 {
            return libc::EINVAL;
        }
        // SAFETY: a live CQ.
        let q = unsafe { obj::<Cq, _>(cq) };
        // SAFETY: a live CQ has a live context.
        let max_cqe = unsafe { context((*cq).context) }
            .dev
            .device()
            .query_device()
            .max_cqe
            - 1;
        if cqe as u64 > u64::from(max_cqe) {
            return libc::EINVAL;
        }
        match q.cq.resize(cqe as u32) {
            Ok(()) => {
                // SAFETY: a live CQ; `cqe` is the program's to read, ours to write.
                unsafe { (*cq).cqe = cqe };
                0
            }
            Err(e) => e.errno(),
        }
    })
}

pub(crate) extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    ffi_errno!({
        if cq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live CQ.
        let q = unsafe { obj::<Cq, _>(cq) };
        if q.users.load(Ordering::Acquire) > 0 {
            return libc::EBUSY;
        }
        // SAFETY: its context is live while it is.
        let c = unsafe { context(q.ibv.context) };
        c.cqs.lock().remove(&q.cq.cq_num());
        if !q.ibv.channel.is_null() {
            // SAFETY: the channel outlives its CQs (ibv_destroy_comp_channel refuses before).
            unsafe { (*q.ibv.channel).refcnt -= 1 };
        }
        // SAFETY: the caller gives the CQ up.
        unsafe { free::<Cq, _>(cq) };
        0
    })
}

pub(crate) extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    ffi!(neg_errno(libc::EIO), {
        if channel.is_null() || cq.is_null() || cq_context.is_null() {
            return neg_errno(libc::EINVAL);
        }
        // SAFETY: a live channel.
        let ch = unsafe { obj::<CompChannel, _>(channel) };
        // SAFETY: the channel's context is live.
        let c: &Context = unsafe { context(ch.ibv.context) };
        let got = loop {
            if let Some(q) = ch.ch.try_get_cq_event() {
                break q;
            }
            // The device failed (its driver thread panicked): no event will come, and the
            // channel's fd stays readable. The kernel's uverbs says EIO on a closed event file.
            if ch.ch.is_closed() {
                return neg_errno(libc::EIO);
            }
            // This thread blocks: in busy-polling mode the driver thread receives now.
            c.dev.poller_sleeps();
            if let Err(e) = wait_readable(ch.ibv.fd) {
                return neg_errno(e);
            }
        };
        let Some(p) = c.cqs.lock().get(&got.cq_num()).copied() else {
            // The CQ was destroyed after its event was raised.
            return neg_errno(libc::EAGAIN);
        };
        let p = p as *mut Cq;
        // SAFETY: `p` is a live CQ (in the table); the out pointers are writable.
        unsafe {
            *cq = p.cast();
            *cq_context = (*p).ibv.cq_context;
        }
        0
    })
}

pub(crate) extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    ffi!((), {
        if cq.is_null() {
            return;
        }
        // SAFETY: a live CQ.
        let q = unsafe { obj::<Cq, _>(cq) };
        if !q.ibv.channel.is_null() {
            // SAFETY: the CQ's channel is live while the CQ is.
            let ch = unsafe { obj::<CompChannel, _>(q.ibv.channel) };
            let _ = ch.ch.ack_cq_events(&q.cq, nevents);
        }
        // SAFETY: the program's own CQ struct; rdma-core updates this field under the CQ's
        // mutex; we are the only writer.
        unsafe { (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(nevents) };
    })
}

fn qp_type(v: c_int) -> Option<QpType> {
    match v {
        2 => Some(QpType::Rc),
        3 => Some(QpType::Uc),
        4 => Some(QpType::Ud),
        _ => None,
    }
}

pub(crate) fn qp_state(v: c_int) -> Option<QpState> {
    match v {
        0 => Some(QpState::Reset),
        1 => Some(QpState::Init),
        2 => Some(QpState::Rtr),
        3 => Some(QpState::Rts),
        4 => Some(QpState::Sqd),
        5 => Some(QpState::Sqe),
        6 => Some(QpState::Err),
        _ => None,
    }
}

pub(crate) extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    ffi!(std::ptr::null_mut(), {
        if pd.is_null() || init.is_null() {
            return null_errno(libc::EINVAL);
        }
        // SAFETY: a live PD and a readable/writable init attr (the caller's contract).
        let (p, init) = unsafe { (obj::<Pd, _>(pd), &mut *init) };
        let Some(ty) = qp_type(init.qp_type) else {
            return null_errno(libc::EOPNOTSUPP);
        };
        if init.send_cq.is_null() || init.recv_cq.is_null() {
            return null_errno(libc::EINVAL);
        }
        // SAFETY: live CQs and SRQ of this context (the caller's contract).
        let (scq, rcq) = unsafe { (obj::<Cq, _>(init.send_cq), obj::<Cq, _>(init.recv_cq)) };
        let srq = (!init.srq.is_null()).then(|| unsafe { &obj::<Srq, _>(init.srq).srq });
        let cap = QpCap {
            max_send_wr: init.cap.max_send_wr,
            max_recv_wr: init.cap.max_recv_wr,
            max_send_sge: init.cap.max_send_sge,
            max_recv_sge: init.cap.max_recv_sge,
            max_inline_data: init.cap.max_inline_data,
        };
        let attr = QpInitAttr {
            qp_type: ty,
            send_cq: &scq.cq,
            recv_cq: &rcq.cq,
            cap,
            sq_sig_all: init.sq_sig_all != 0,
            srq,
        };
        let qp = match p.pd.create_qp(&attr) {
            Ok(qp) => qp,
            Err(e) => return null_errno(e.errno()),
        };
        // As the kernel's create_qp response does: the send queue's capacities as rxe sized
        // them (`max_inline_data` and `max_send_sge` may grow, `Pd::create_qp`).
        let sized = qp.cap();
        init.cap.max_send_sge = sized.max_send_sge;
        init.cap.max_inline_data = sized.max_inline_data;
        if !init.srq.is_null() {
            init.cap.max_recv_wr = 0;
            init.cap.max_recv_sge = 0;
        }
        let num = qp.qp_num();
        // SAFETY: all zeros is a valid `ibv_qp_ex` (NULL function pointers, numbers).
        let mut ibv: ibv_qp_ex = unsafe { std::mem::zeroed() };
        ibv.qp_base = ibv_qp {
            context: p.ibv.context,
            qp_context: init.qp_context,
            pd,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            srq: init.srq,
            handle: num,
            qp_num: num,
            state: 0,
            qp_type: init.qp_type,
            mutex: mutex(),
            cond: cond(),
            events_completed: 0,
        };
        let q = Box::into_raw(Box::new(Qp {
            ibv,
            qp,
            is_ex: false,
            build: Mutex::new(Default::default()),
            cap: init.cap,
            sq_sig_all: init.sq_sig_all,
            attr: Mutex::new(ibv_qp_attr {
                port_num: 1,
                ..Default::default()
            }),
        }));
        // SAFETY: the PD's context is live.
        unsafe { context(p.ibv.context) }
            .qps
            .lock()
            .insert(num, q as usize);
        // SAFETY: the PD and CQs the QP was made with, live (checked above).
        unsafe {
            uses(pd, true, true);
            uses(init.send_cq, false, true);
            uses(init.recv_cq, false, true);
        }
        q.cast()
    })
}

fn ah_attr(a: &ibv_ah_attr) -> Result<AhAttr, c_int> {
    // A RoCE port routes by GID: an address without a GRH is refused (as rxe, through
    // ib_core's rdma_check_ah_attr).
    if a.is_global == 0 {
        return Err(libc::EINVAL);
    }
    Ok(AhAttr {
        dgid: Gid(a.grh.dgid.raw),
        sgid_index: a.grh.sgid_index,
        flow_label: a.grh.flow_label,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        port_num: a.port_num,
    })
}

pub(crate) extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    ffi_errno!({
        if qp.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live QP and a readable attr.
        let (q, a) = unsafe { (obj::<Qp, _>(qp), &*attr) };
        let mask = QpAttrMask(mask as u32);
        let mut e = QpAttr::default();
        if mask.contains(QpAttrMask::STATE) {
            match qp_state(a.qp_state) {
                Some(s) => e.qp_state = s,
                None => return libc::EINVAL,
            }
        }
        if mask.contains(QpAttrMask::CUR_STATE) {
            match qp_state(a.cur_qp_state) {
                Some(s) => e.cur_qp_state = s,
                None => return libc::EINVAL,
            }
        }
        if mask.contains(QpAttrMask::PATH_MTU) {
            match path_mtu(a.path_mtu) {
                Some(m) => e.path_mtu = m,
                None => return libc::EINVAL,
            }
        }
        if mask.contains(QpAttrMask::AV) {
            match ah_attr(&a.ah_attr) {
                Ok(ah) => e.ah_attr = ah,
                Err(err) => return err,
            }
        }
        e.qkey = a.qkey;
        e.rq_psn = a.rq_psn;
        e.sq_psn = a.sq_psn;
        e.dest_qp_num = a.dest_qp_num;
        e.qp_access_flags = AccessFlags(a.qp_access_flags);
        e.pkey_index = a.pkey_index;
        e.max_rd_atomic = a.max_rd_atomic;
        e.max_dest_rd_atomic = a.max_dest_rd_atomic;
        e.min_rnr_timer = a.min_rnr_timer;
        e.port_num = a.port_num;
        e.timeout = a.timeout;
        e.retry_cnt = a.retry_cnt;
        e.rnr_retry = a.rnr_retry;
        if let Err(err) = q.qp.modify(&e, mask) {
            return err.errno();
        }
        // What ibv_query_qp reports back.
        let mut s = q.attr.lock();
        macro_rules! keep {
            ($bit:ident: $($f:ident),+) => {
                if mask.contains(QpAttrMask::$bit) {
                    $(s.$f = a.$f;)+
                }
            };
        }
        keep!(EN_SQD_ASYNC_NOTIFY: en_sqd_async_notify);
        keep!(ACCESS_FLAGS: qp_access_flags);
        keep!(PKEY_INDEX: pkey_index);
        keep!(PORT: port_num);
        keep!(QKEY: qkey);
        keep!(AV: ah_attr);
        keep!(PATH_MTU: path_mtu);
        keep!(TIMEOUT: timeout);
        keep!(RETRY_CNT: retry_cnt);
        keep!(RNR_RETRY: rnr_retry);
        keep!(RQ_PSN: rq_psn);
        keep!(MAX_QP_RD_ATOMIC: max_rd_atomic);
        keep!(MIN_RNR_TIMER: min_rnr_timer);
        keep!(SQ_PSN: sq_psn);
        keep!(MAX_DEST_RD_ATOMIC: max_dest_rd_atomic);
        keep!(PATH_MIG_STATE: path_mig_state);
        keep!(DEST_QPN: dest_qp_num);
        if mask.contains(QpAttrMask::STATE) {
            // SAFETY: the program's own QP struct; libibverbs updates `state` here too.
            unsafe { (*qp).state = a.qp_state };
        }
        0
    })
}

pub(crate) extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    ffi_errno!({
        if qp.is_null() || attr.is_null() || init.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live QP.
        let q = unsafe { obj::<Qp, _>(qp) };
        let mut a = *q.attr.lock();
        let state = q.qp.state() as c_int;
        a.qp_state = state;
        a.cur_qp_state = state;
        a.cap = q.cap;
        a.sq_draining = u8::from(q.qp.state() == QpState::Sqd);
        // SAFETY: writable out structs (the caller's contract).
        unsafe {
            *attr = a;
            *init = ibv_qp_init_attr {
                qp_context: q.ibv.qp_base.qp_context,
                send_cq: q.ibv.qp_base.send_cq,
                recv_cq: q.ibv.qp_base.recv_cq,
                srq: q.ibv.qp_base.srq,
                cap: q.cap,
                qp_type: q.ibv.qp_base.qp_type,
                sq_sig_all: q.sq_sig_all,
            };
            (*qp).state = state;
        }
        0
    })
}

pub(crate) extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    ffi_errno!({
        if qp.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live QP; its context outlives it.
        let q = unsafe { obj::<Qp, _>(qp) };
        unsafe { context(q.ibv.qp_base.context) }
            .qps
            .lock()
            .remove(&q.ibv.qp_base.qp_num);
        let b = &q.ibv.qp_base;
        // SAFETY: its PD and CQs are live while it is; then the caller gives the QP up.
        unsafe {
            uses(b.pd, true, false);
            uses(b.send_cq, false, false);
            uses(b.recv_cq, false, false);
            free::<Qp, _>(qp);
        }
        0
    })
}

pub(crate) extern "C" fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    ffi_errno!({
        if qp.is_null() || gid.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live QP and a readable GID.
        let (q, g) = unsafe { (obj::<Qp, _>(qp), *gid) };
        match q.qp.attach_mcast(&Gid(g.raw), lid) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}

pub(crate) extern "C" fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    ffi_errno!({
        if qp.is_null() || gid.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live QP and a readable GID.
        let (q, g) = unsafe { (obj::<Qp, _>(qp), *gid) };
        match q.qp.detach_mcast(&Gid(g.raw), lid) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}

pub(crate) extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    init: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    ffi!(std::ptr::null_mut(), {
        if pd.is_null() || init.is_null() {
            return null_errno(libc::EINVAL);
        }
        // SAFETY: a live PD and a readable init attr.
        let (p, init) = unsafe { (obj::<Pd, _>(pd), &*init) };
        let srq = match p.pd.create_srq(&SrqInitAttr {
            max_wr: init.attr.max_wr,
            max_sge: init.attr.max_sge,
            srq_limit: init.attr.srq_limit,
        }) {
            Ok(s) => s,
            Err(e) => return null_errno(e.errno()),
        };
        let num = srq.srq_num();
        // SAFETY: the live PD the SRQ is made on.
        unsafe { uses(pd, true, true) };
        let s = Box::into_raw(Box::new(Srq {
            ibv: ibv_srq {
                context: p.ibv.context,
                srq_context: init.srq_context,
                pd,
                handle: num,
                mutex: mutex(),
                cond: cond(),
                events_completed: 0,
            },
            srq,
        }));
        // SAFETY: the PD's context is live.
        unsafe { context(p.ibv.context) }
            .srqs
            .lock()
            .insert(num, s as usize);
        s.cast()
    })
}

pub(crate) extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    ffi_errno!({
        if srq.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live SRQ and a readable attr.
        let (s, a) = unsafe { (obj::<Srq, _>(srq), &*attr) };
        let a = SrqAttr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: a.srq_limit,
        };
        match s.srq.modify(&a, SrqAttrMask(mask as u32)) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}

pub(crate) extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    ffi_errno!({
        if srq.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live SRQ.
        let s = unsafe { obj::<Srq, _>(srq) };
        match s.srq.query() {
            Ok(a) => {
                // SAFETY: writable (the caller's contract).
                unsafe {
                    *attr = ibv_srq_attr {
                        max_wr: a.max_wr,
                        max_sge: a.max_sge,
                        srq_limit: a.srq_limit,
                    }
                };
                0
            }
            Err(e) => e.errno(),
        }
    })
}

pub(crate) extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    ffi_errno!({
        if srq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live SRQ the caller gives up; its context outlives it.
        unsafe {
            let s = &mut *srq.cast::<Srq>();
            if let Err(e) = s.srq.destroy() {
                return e.errno();
            }
            context(s.ibv.context).srqs.lock().remove(&s.ibv.handle);
            uses(s.ibv.pd, true, false);
            free::<Srq, _>(srq);
        }
        0
    })
}

pub(crate) extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    ffi!(std::ptr::null_mut(), {
        if pd.is_null() || attr.is_null() {
            return null_errno(libc::EINVAL);
        }
        // SAFETY: a live PD and a readable attr.
        let (p, a) = unsafe { (obj::<Pd, _>(pd), &*attr) };
        let a = match ah_attr(a) {
            Ok(a) => a,
            Err(e) => return null_errno(e),
        };
        let ah = p.pd.create_ah(&a);
        if ah.is_ok() {
            // SAFETY: the live PD the AH is made on.
            unsafe { uses(pd, true, true) };
        }
        match ah {
            Ok(ah) => Box::into_raw(Box::new(Ah {
                ibv: ibv_ah {
                    context: p.ibv.context,
                    pd,
                    handle: 0,
                },
                ah,
            }))
            .cast(),
            Err(e) => null_errno(e.errno()),
        }
    })
}

/// `IBV_WC_GRH`: the receive buffer starts with the 40-byte network header.
const IBV_WC_GRH: c_uint = 1 << 0;
/// `IBV_GID_TYPE_SYSFS_IB_ROCE_V1` and `IBV_GID_TYPE_SYSFS_ROCE_V2` (what
/// `ibv_query_gid_type` reports).
const GID_TYPE_SYSFS_ROCE_V1: u32 = 0;
const GID_TYPE_SYSFS_ROCE_V2: u32 = 1;
/// The IPv6 next header that marks a RoCE v1 GRH (the IB BTH), as libibverbs names it.
const IB_NEXT_HDR: u8 = 0x1b;

/// Which network header the 40-byte GRH area of a UD receive holds: 4 (20 bytes of zeros,
/// then an IPv4 header, as rxe writes it), 6 (an IPv6 header), or `None` (errno
/// `EPROTONOSUPPORT`). An area whose first nibble says 6 is still IPv4 when its last 20
/// bytes are an IPv4 header with IHL 5 and a right checksum. Source: libibverbs 44
/// `verbs.c` `get_grh_header_version`.
fn grh_version(g: &[u8; 40]) -> Option<u8> {
    let ip4 = &g[20..40];
    if g[0] >> 4 != 6 {
        return (ip4[0] >> 4 == 4).then_some(4);
    }
    if ip4[0] & 0x0f != 5 {
        return Some(6);
    }
    // The header's one's-complement sum with the checksum field taken as 0, complemented.
    let sum: u32 = (0..10)
        .filter(|&i| i != 5)
        .map(|i| u32::from(u16::from_ne_bytes([ip4[2 * i], ip4[2 * i + 1]])))
        .sum();
    let folded = (sum & 0xffff) + (sum >> 16);
    let check = !(folded as u16);
    Some(if u16::from_ne_bytes([ip4[10], ip4[11]]) == check {
        4
    } else {
        6
    })
}

/// The GID index of `port_num` whose GID is `gid` and whose type is `gid_type`, found as
/// libibverbs' `ibv_find_gid_index` finds it: walking the table from index 0 with
/// `ibv_query_gid` and `ibv_query_gid_type` until one matches or a query fails (past the
/// table: -1, errno EINVAL).
fn find_gid_index(ctx: *mut ibv_context, port_num: u8, gid: &[u8; 16], gid_type: u32) -> c_int {
    for i in 0..crate::device::GID_TBL_LEN as c_int {
        let mut g = ibv_gid { raw: [0; 16] };
        if crate::device::ibv_query_gid(ctx, port_num, i, &mut g) != 0 {
            return -1;
        }
        let mut t = 0u32;
        if crate::device::ibv_query_gid_type(ctx, port_num, i as u32, &mut t) != 0 {
            return -1;
        }
        if g.raw == *gid && t == gid_type {
            return i;
        }
    }
    // The index past the table fails as every query there does.
    let mut g = ibv_gid { raw: [0; 16] };
    crate::device::ibv_query_gid(ctx, port_num, crate::device::GID_TBL_LEN as c_int, &mut g)
}

/// `ibv_init_ah_from_wc`: the address handle attributes that answer a UD receive, computed
/// as libibverbs 44 computes them (generic code in rdma-core, the same on rxe). Always:
/// `dlid`, `sl`, `src_path_bits` from the WC, `port_num`, and `grh.flow_label` from the
/// GRH area's first word. With `IBV_WC_GRH` (every softroce UD receive has it),
/// `is_global` = 1 and, for an IPv4 header (in the area's last 20 bytes): `dgid` = the
/// IPv4-mapped source address, `sgid_index` = the RoCE v2 GID of the destination address,
/// `hop_limit` = its TTL, `traffic_class` = its TOS byte; for an IPv6 header: `dgid` = its
/// source, `sgid_index` = the GID of its destination (RoCE v2 when the next header is UDP,
/// v1 for 0x1b), `hop_limit` and `traffic_class` from it. Without `IBV_WC_GRH` it returns
/// 0 with `is_global` = 0 (which `ibv_create_ah` then refuses on a RoCE port).
///
/// Errors (-1, errno): `EINVAL` for a multicast destination or when no GID of the port
/// matches (the failing `ibv_query_gid` past the table); `EPROTONOSUPPORT` for a GRH area
/// that is neither IPv4 nor IPv6 or an IPv6 next header other than UDP / 0x1b; `EINVAL`
/// for a NULL argument (libibverbs would crash). Source: libibverbs 44 `verbs.c`
/// (`ibv_init_ah_from_wc`, `set_ah_attr_by_ipv4`, `set_ah_attr_by_ipv6`,
/// `ibv_find_gid_index`).
pub(crate) extern "C" fn ibv_init_ah_from_wc(
    ctx: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut u8,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    ffi!(neg_errno(libc::EIO), {
        if ctx.is_null() || wc.is_null() || grh.is_null() || ah_attr.is_null() {
            return neg_errno(libc::EINVAL);
        }
        let mut g = [0u8; 40];
        // SAFETY: the caller's work completion (readable) and its 40-byte GRH area, which
        // is the program's receive buffer: copied out, never referenced.
        let wc = unsafe {
            std::ptr::copy_nonoverlapping(grh.cast_const(), g.as_mut_ptr(), 40);
            wc.read_unaligned()
        };
        let head = u32::from_be_bytes([g[0], g[1], g[2], g[3]]);
        let mut a = ibv_ah_attr {
            dlid: wc.slid,
            sl: wc.sl,
            src_path_bits: wc.dlid_path_bits,
            port_num,
            ..Default::default()
        };
        a.grh.flow_label = head & 0x000f_ffff;
        let mut ret = 0;
        if wc.wc_flags & IBV_WC_GRH != 0 {
            a.is_global = 1;
            ret = match grh_version(&g) {
                Some(4) => {
                    let ip4 = &g[20..40];
                    let mapped = |b: &[u8]| {
                        std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3])
                            .to_ipv6_mapped()
                            .octets()
                    };
                    if ip4[16] >> 4 == 0xe {
                        // A class D (multicast) destination is in no GID table.
                        neg_errno(libc::EINVAL)
                    } else {
                        let i = find_gid_index(
                            ctx,
                            port_num,
                            &mapped(&ip4[16..20]),
                            GID_TYPE_SYSFS_ROCE_V2,
                        );
                        if i >= 0 {
                            a.grh.dgid.raw = mapped(&ip4[12..16]);
                            a.grh.sgid_index = i as u8;
                            a.grh.hop_limit = ip4[8];
                            a.grh.traffic_class = ip4[1];
                        }
                        i.min(0)
                    }
                }
                Some(_) => {
                    let (sgid, dgid) = (&g[8..24], &g[24..40]);
                    let gid_type = match g[6] {
                        17 => Some(GID_TYPE_SYSFS_ROCE_V2),
                        IB_NEXT_HDR => Some(GID_TYPE_SYSFS_ROCE_V1),
                        _ => None,
                    };
                    match gid_type {
                        _ if dgid[0] == 0xff => neg_errno(libc::EINVAL),
                        None => neg_errno(libc::EPROTONOSUPPORT),
                        Some(t) => {
                            a.grh.dgid.raw.copy_from_slice(sgid);
                            let mut want = [0u8; 16];
                            want.copy_from_slice(dgid);
                            let i = find_gid_index(ctx, port_num, &want, t);
                            if i >= 0 {
                                a.grh.sgid_index = i as u8;
                                a.grh.hop_limit = g[7];
                                a.grh.traffic_class = (head >> 20) as u8;
                            }
                            i.min(0)
                        }
                    }
                }
                None => neg_errno(libc::EPROTONOSUPPORT),
            };
        }
        // SAFETY: writable (the caller's contract). libibverbs fills it even on failure.
        unsafe { ah_attr.write_unaligned(a) };
        ret
    })
}

/// `ibv_create_ah_from_wc`: [`ibv_init_ah_from_wc`], then `ibv_create_ah`.
pub(crate) extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut u8,
    port_num: u8,
) -> *mut ibv_ah {
    ffi!(std::ptr::null_mut(), {
        if pd.is_null() {
            return null_errno(libc::EINVAL);
        }
        let mut a = ibv_ah_attr::default();
        // SAFETY: a live PD.
        let ctx = unsafe { (*pd).context };
        if ibv_init_ah_from_wc(ctx, port_num, wc, grh, &mut a) != 0 {
            return std::ptr::null_mut();
        }
        ibv_create_ah(pd, &mut a)
    })
}

pub(crate) extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    ffi_errno!({
        if ah.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live AH the caller gives up; its PD is live while it is.
        unsafe {
            uses((*ah).pd, true, false);
            free::<Ah, _>(ah);
        }
        0
    })
}

#[cfg(test)]
mod tests {
    use super::grh_version;

    /// The GRH area of a UD receive as rxe writes it for IPv4: 20 zero bytes, then the
    /// IPv4 header (here 127.0.150.2 -> 127.0.150.1, TTL 64, UDP, right checksum).
    fn rxe_ipv4_area() -> [u8; 40] {
        let mut g = [0u8; 40];
        g[20..40].copy_from_slice(&[
            0x45, 0x00, 0x00, 0x3c, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 127, 0, 150, 2,
            127, 0, 150, 1,
        ]);
        let sum: u32 = (0..10)
            .map(|i| u32::from(u16::from_be_bytes([g[20 + 2 * i], g[21 + 2 * i]])))
            .sum();
        let folded = (sum & 0xffff) + (sum >> 16);
        g[30..32].copy_from_slice(&(!(folded as u16)).to_be_bytes());
        g
    }

    // libibverbs get_grh_header_version: a first nibble other than 6 with an IPv4 header in
    // the last 20 bytes is IPv4; neither is EPROTONOSUPPORT.
    #[test]
    fn grh_version_ipv4_as_rxe_writes_it() {
        assert_eq!(grh_version(&rxe_ipv4_area()), Some(4));
        assert_eq!(grh_version(&[0u8; 40]), None);
    }

    // libibverbs get_grh_header_version: a first nibble of 6 is IPv6 unless the last 20
    // bytes are an IPv4 header with IHL 5 and a right checksum.
    #[test]
    fn grh_version_ipv6_unless_a_checked_ipv4_header_follows() {
        let mut v6 = [0u8; 40];
        v6[0] = 0x60;
        v6[6] = 17;
        v6[7] = 64;
        v6[23] = 1; // source ::1
        v6[39] = 1; // destination ::1
        assert_eq!(grh_version(&v6), Some(6));
        let mut both = rxe_ipv4_area();
        both[0] = 0x60;
        assert_eq!(grh_version(&both), Some(4));
        both[31] ^= 1; // a wrong checksum: IPv6 after all
        assert_eq!(grh_version(&both), Some(6));
    }
}
