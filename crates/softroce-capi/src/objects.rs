//! The verbs objects: protection domains, memory regions, completion channels and queues,
//! queue pairs, shared receive queues and address handles. Each is a `Box` of a
//! `#[repr(C)]` struct whose first field is the C struct handed to the program.

use crate::abi::*;
use crate::device::{Context, context, path_mtu, wait_readable};
use crate::{ffi, neg_errno, null_errno};
use core::ffi::{c_int, c_uint, c_void};
use parking_lot::Mutex;
use softroce::verbs::{
    self, AccessFlags, AhAttr, Gid, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType,
    SrqAttr, SrqAttrMask, SrqInitAttr,
};
use std::os::fd::AsRawFd;

/// A protection domain.
#[repr(C)]
pub(crate) struct Pd {
    pub ibv: ibv_pd,
    pub pd: verbs::Pd,
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
                }))
                .cast()
            }
            Err(e) => null_errno(e.errno()),
        }
    })
}

pub(crate) extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    ffi!(libc::EIO, {
        if pd.is_null() {
            return libc::EINVAL;
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
        // An IOVA other than the address (and zero-based, on-demand paging, ...) are not
        // supported yet: softroce's MR addresses are the process's virtual addresses.
        if iova != addr as u64 || access & !(ACCESS_KNOWN | ACCESS_OPTIONAL_RANGE) != 0 {
            return null_errno(libc::EOPNOTSUPP);
        }
        // SAFETY: a live PD (the caller's contract).
        let p = unsafe { obj::<Pd, _>(pd) };
        // SAFETY: libibverbs' contract: `addr` is valid for `length` bytes until
        // ibv_dereg_mr. (That the program keeps accessing it meanwhile is the engine's
        // user-memory model; see `Pd::reg_mr_user`.)
        let mr = unsafe {
            p.pd.reg_mr_user(addr.cast(), length, AccessFlags(access & ACCESS_KNOWN))
        };
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

/// `ibv_rereg_mr`: not supported. Its failures are `enum ibv_rereg_mr_err_code` values with
/// errno saying why (not an errno value): `IBV_REREG_MR_ERR_CMD` (-4) and errno
/// `EOPNOTSUPP`, what libibverbs returns for a provider without rereg.
pub(crate) extern "C" fn ibv_rereg_mr(
    _mr: *mut ibv_mr,
    _flags: c_int,
    _pd: *mut ibv_pd,
    _addr: *mut c_void,
    _length: usize,
    _access: c_int,
) -> c_int {
    crate::set_errno(libc::EOPNOTSUPP);
    -4
}

pub(crate) extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    ffi!(libc::EIO, {
        if mr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live MR that the caller gives up.
        unsafe { free::<Mr, _>(mr) };
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
    ffi!(libc::EIO, {
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
    ffi!(libc::EIO, {
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
    ffi!(libc::EIO, {
        if cq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live CQ.
        let q = unsafe { obj::<Cq, _>(cq) };
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
    ffi!(libc::EIO, {
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
    ffi!(libc::EIO, {
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
    ffi!(libc::EIO, {
        if qp.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live QP; its context outlives it.
        let q = unsafe { obj::<Qp, _>(qp) };
        unsafe { context(q.ibv.qp_base.context) }
            .qps
            .lock()
            .remove(&q.ibv.qp_base.qp_num);
        // SAFETY: the caller gives the QP up.
        unsafe { free::<Qp, _>(qp) };
        0
    })
}

pub(crate) extern "C" fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    ffi!(libc::EIO, {
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
    ffi!(libc::EIO, {
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
    ffi!(libc::EIO, {
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
    ffi!(libc::EIO, {
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
    ffi!(libc::EIO, {
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
        match p.pd.create_ah(&a) {
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

/// `ibv_init_ah_from_wc`: the address handle attributes that answer a UD receive. On RoCE the
/// GRH area holds the datagram's network header (IPv4 in its last 20 bytes, as rxe writes
/// it, or an IPv6 header): the answer goes to its source, from the GID index of its
/// destination (libibverbs `ibv_init_ah_from_wc`: hop limit 0xff, the IPv6 flow label and
/// traffic class). Errors (-1, errno): EINVAL without a GRH (a RoCE address needs one) or
/// when no GID of the port is the datagram's destination.
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
        // SAFETY: a live context, the caller's work completion and its 40-byte GRH area.
        let (c, wc, g) = unsafe { (context(ctx), &*wc, std::slice::from_raw_parts(grh, 40)) };
        if wc.wc_flags & IBV_WC_GRH == 0 {
            return neg_errno(libc::EINVAL);
        }
        let v4 = g[..20].iter().all(|&b| b == 0) && g[20] >> 4 == 4;
        let (src, dst, flow_label, traffic_class) = if v4 {
            let v4 = |a: &[u8]| std::net::Ipv4Addr::new(a[0], a[1], a[2], a[3]).to_ipv6_mapped();
            (v4(&g[32..36]), v4(&g[36..40]), 0, g[21] >> 2)
        } else {
            let head = u32::from_be_bytes([g[0], g[1], g[2], g[3]]);
            let v6 = |a: &[u8]| std::net::Ipv6Addr::from(<[u8; 16]>::try_from(a).unwrap());
            (
                v6(&g[8..24]),
                v6(&g[24..40]),
                head & 0x000f_ffff,
                (head >> 20) as u8,
            )
        };
        let dev = c.dev.device();
        let Some(sgid_index) = (0..=u8::MAX)
            .map_while(|i| dev.query_gid(port_num, i).ok().map(|e| (i, e)))
            .find(|(_, e)| e.gid.0 == dst.octets())
            .map(|(i, _)| i)
        else {
            return neg_errno(libc::EINVAL);
        };
        let a = ibv_ah_attr {
            grh: ibv_global_route {
                dgid: ibv_gid { raw: src.octets() },
                flow_label,
                sgid_index,
                hop_limit: 0xff,
                traffic_class,
            },
            dlid: wc.slid,
            sl: wc.sl,
            src_path_bits: wc.dlid_path_bits,
            static_rate: 0,
            is_global: 1,
            port_num,
        };
        // SAFETY: writable (the caller's contract).
        unsafe { *ah_attr = a };
        0
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
    ffi!(libc::EIO, {
        if ah.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live AH the caller gives up.
        unsafe { free::<Ah, _>(ah) };
        0
    })
}
