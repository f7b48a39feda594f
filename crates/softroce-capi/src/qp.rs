//! Queue pairs: `ibv_create_qp`, `ibv_modify_qp`, `ibv_query_qp`, `ibv_destroy_qp`, the
//! multicast attachments, and the data path of a QP: the `ibv_context_ops` entries behind
//! verbs.h's static inline `ibv_post_send`, `ibv_post_recv` and `ibv_bind_mw` (a BIND_MW
//! posted on the QP). Each converts the program's work requests to the engine's (a list
//! walk; SGE addresses are the program's virtual addresses). The extended QP's builder
//! (`ibv_wr_*`) is `qp_ex.rs`'s.

use crate::ah::{Ah, ah_attr, ibv_ah_attr_of};
use crate::context::Context;
use crate::cq::Cq;
use crate::handle::{Castable, free, into_handle, try_ref};
use crate::mw::{Mw, bind_wr};
use crate::pd::Pd;
use crate::srq::Srq;
use crate::wr::{finish_recv, recv_wrs, sges};
use core::ffi::c_int;
use parking_lot::Mutex;
use softroce::verbs::{
    self, AccessFlags, Gid, PathMtu, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpQuery, QpState,
    QpType, SendFlags, SendWr, WrOpcode,
};
use softroce_cabi::abi::*;
use softroce_cabi::{SetsErrno, ffi};

/// A queue pair: the engine's `verbs::Qp` (its capacities, `sq_sig_all` and the
/// attributes `ibv_modify_qp` set are the engine's), behind a `struct ibv_qp_ex` (whose
/// first field is the `struct ibv_qp`); those made by `ibv_create_qp_ex` with send ops have
/// its `ibv_wr_*` functions set and `is_ex`.
#[repr(C)]
pub(crate) struct Qp {
    pub ibv: ibv_qp_ex,
    pub qp: verbs::Qp,
    pub is_ex: bool,
    /// The WRs of an `ibv_wr_start` … `ibv_wr_complete` sequence.
    pub build: Mutex<WrBuild>,
}

// SAFETY: `ibv_qp_ex` is the first field of the `#[repr(C)]` `Qp` that `ibv_create_qp`
// boxes.
unsafe impl Castable for ibv_qp_ex {
    type RustType = Qp;
}

// SAFETY: `struct ibv_qp_ex` begins with its `struct ibv_qp` (`qp_base`), so an `ibv_qp`
// is at offset 0 of a `Qp` too.
unsafe impl Castable for ibv_qp {
    type RustType = Qp;
}

/// The WRs a `wr_start` … `wr_complete` sequence builds (qp_ex.rs), and the first error
/// met.
#[derive(Default)]
pub(crate) struct WrBuild {
    pub wrs: Vec<SendWr>,
    /// `inline[i]`: the bytes `wr_set_inline_data(_list)` copied for `wrs[i]`.
    pub inline: Vec<Option<Vec<u8>>>,
    pub err: c_int,
}

impl WrBuild {
    /// Starts a new WR (with no inline data yet).
    pub(crate) fn push(&mut self, wr: SendWr) {
        self.wrs.push(wr);
        self.inline.push(None);
    }
}

fn qp_type(v: c_int) -> Option<QpType> {
    match v {
        IBV_QPT_RC => Some(QpType::Rc),
        IBV_QPT_UC => Some(QpType::Uc),
        IBV_QPT_UD => Some(QpType::Ud),
        _ => None,
    }
}

pub(crate) fn qp_state(v: c_int) -> Option<QpState> {
    match v {
        IBV_QPS_RESET => Some(QpState::Reset),
        IBV_QPS_INIT => Some(QpState::Init),
        IBV_QPS_RTR => Some(QpState::Rtr),
        IBV_QPS_RTS => Some(QpState::Rts),
        IBV_QPS_SQD => Some(QpState::Sqd),
        IBV_QPS_SQE => Some(QpState::Sqe),
        IBV_QPS_ERR => Some(QpState::Err),
        _ => None,
    }
}

/// `struct ibv_qp_cap` of the engine's capacities.
pub(crate) fn ibv_qp_cap_of(c: QpCap) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// The engine's path MTU from an `enum ibv_mtu` value.
pub(crate) fn path_mtu(v: c_int) -> Option<PathMtu> {
    u8::try_from(v).ok().and_then(PathMtu::from_ibv)
}

pub(crate) extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    ffi!({
        // SAFETY: NULL or a live PD, NULL or a readable/writable init attr (the
        // caller's contract).
        let (p, init): (&Pd, _) = unsafe { (try_ref(pd)?, init.as_mut().ok_or(libc::EINVAL)?) };
        let ty = qp_type(init.qp_type).ok_or(libc::EOPNOTSUPP)?;
        // SAFETY: NULL or live CQs of this context (the caller's contract).
        let (scq, rcq): (&Cq, &Cq) = unsafe { (try_ref(init.send_cq)?, try_ref(init.recv_cq)?) };
        // SAFETY: NULL (no SRQ) or a live SRQ of this context.
        let srq = unsafe { try_ref(init.srq) }.ok().map(|s: &Srq| &s.srq);
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
        let qp = p.pd.create_qp(&attr).map_err(|e| e.errno())?;
        // As the kernel's create_qp response does: the capacities as rxe sized them
        // (`max_inline_data` and `max_send_sge` may grow, the receive ones are 0 with an
        // SRQ: `Pd::create_qp`).
        init.cap = ibv_qp_cap_of(qp.cap());
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
            mutex: libc::PTHREAD_MUTEX_INITIALIZER,
            cond: libc::PTHREAD_COND_INITIALIZER,
            events_completed: 0,
        };
        let q: *mut ibv_qp = into_handle(Qp {
            ibv,
            qp,
            is_ex: false,
            build: Mutex::new(Default::default()),
        });
        // SAFETY: the PD's context is live.
        let c: &Context = unsafe { try_ref(p.ibv.context) }?;
        c.qps.lock().insert(num, q as usize);
        // The PD and CQs the QP was made with.
        p.users.hold();
        scq.users.hold();
        rcq.users.hold();
        Ok(q)
    })
}

/// Says once per process, on stderr, why a modify to RTR with GID index 0 failed and what to
/// pass instead (rdma-core's tools print only "Failed to modify QP to RTR"); the errno stays
/// EINVAL, as on rxe.
fn link_local_sgid_hint(err: &softroce::verbs::Error) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        eprintln!(
            "softroce: ibv_modify_qp: {err}: GID index 0 is the link-local GID; pass GID index 1 \
             (-g 1 to rdma-core's examples, -x 1 to perftest, sgid_index = 1 in ibv_ah_attr)"
        );
    });
}

pub(crate) extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    ffi!(SetsErrno, {
        // SAFETY: NULL or a live QP, NULL or a readable attr.
        let (q, a): (&Qp, _) = unsafe { (try_ref(qp)?, attr.as_ref().ok_or(libc::EINVAL)?) };
        let mask = QpAttrMask(mask as u32);
        let mut e = QpAttr::default();
        if mask.contains(QpAttrMask::STATE) {
            match qp_state(a.qp_state) {
                Some(s) => e.qp_state = s,
                None => return Err(libc::EINVAL),
            }
        }
        if mask.contains(QpAttrMask::CUR_STATE) {
            match qp_state(a.cur_qp_state) {
                Some(s) => e.cur_qp_state = s,
                None => return Err(libc::EINVAL),
            }
        }
        if mask.contains(QpAttrMask::PATH_MTU) {
            match path_mtu(a.path_mtu) {
                Some(m) => e.path_mtu = m,
                None => return Err(libc::EINVAL),
            }
        }
        if mask.contains(QpAttrMask::AV) {
            match ah_attr(&a.ah_attr) {
                Ok(ah) => e.ah_attr = ah,
                Err(err) => return Err(err),
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
        e.path_mig_state = a.path_mig_state as u32;
        e.en_sqd_async_notify = a.en_sqd_async_notify;
        if let Err(err) = q.qp.modify(&e, mask) {
            tracing::debug!(target: "softroce::verbs", qpn = q.qp.qp_num(), "ibv_modify_qp: {err}");
            if err.what().ends_with(softroce::verbs::LINK_LOCAL_SGID) {
                link_local_sgid_hint(&err);
            }
            return Err(err.errno());
        }
        if mask.contains(QpAttrMask::STATE) {
            // SAFETY: the program's own QP struct; libibverbs updates `state` here too.
            unsafe { (*qp).state = a.qp_state };
        }
        Ok(())
    })
}

pub(crate) extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    ffi!(SetsErrno, {
        // SAFETY: NULL or a live QP.
        let q: &Qp = unsafe { try_ref(qp) }?;
        if attr.is_null() || init.is_null() {
            return Err(libc::EINVAL);
        }
        let QpQuery { attr: e, mask } = q.qp.query().map_err(|e| e.errno())?;
        // What modify_qp set, the rest zero (port 1).
        let mut a = ibv_qp_attr {
            port_num: 1,
            ..Default::default()
        };
        macro_rules! set {
            ($($bit:ident: $f:ident = $v:expr),+ $(,)?) => {
                $(if mask.contains(QpAttrMask::$bit) {
                    a.$f = $v;
                })+
            };
        }
        set!(
            EN_SQD_ASYNC_NOTIFY: en_sqd_async_notify = e.en_sqd_async_notify,
            ACCESS_FLAGS: qp_access_flags = e.qp_access_flags.0,
            PKEY_INDEX: pkey_index = e.pkey_index,
            PORT: port_num = e.port_num,
            QKEY: qkey = e.qkey,
            AV: ah_attr = ibv_ah_attr_of(&e.ah_attr),
            PATH_MTU: path_mtu = e.path_mtu as c_int,
            TIMEOUT: timeout = e.timeout,
            RETRY_CNT: retry_cnt = e.retry_cnt,
            RNR_RETRY: rnr_retry = e.rnr_retry,
            RQ_PSN: rq_psn = e.rq_psn,
            MAX_QP_RD_ATOMIC: max_rd_atomic = e.max_rd_atomic,
            MIN_RNR_TIMER: min_rnr_timer = e.min_rnr_timer,
            SQ_PSN: sq_psn = e.sq_psn,
            MAX_DEST_RD_ATOMIC: max_dest_rd_atomic = e.max_dest_rd_atomic,
            PATH_MIG_STATE: path_mig_state = e.path_mig_state as c_int,
            DEST_QPN: dest_qp_num = e.dest_qp_num,
        );
        let state = e.qp_state as c_int;
        a.qp_state = state;
        a.cur_qp_state = state;
        let cap = ibv_qp_cap_of(q.qp.cap());
        a.cap = cap;
        a.sq_draining = u8::from(e.qp_state == QpState::Sqd);
        // SAFETY: writable out structs (the caller's contract).
        unsafe {
            *attr = a;
            *init = ibv_qp_init_attr {
                qp_context: q.ibv.qp_base.qp_context,
                send_cq: q.ibv.qp_base.send_cq,
                recv_cq: q.ibv.qp_base.recv_cq,
                srq: q.ibv.qp_base.srq,
                cap,
                qp_type: q.ibv.qp_base.qp_type,
                sq_sig_all: c_int::from(q.qp.sq_sig_all()),
            };
            (*qp).state = state;
        }
        Ok(())
    })
}

pub(crate) extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    ffi!(SetsErrno, {
        // SAFETY: NULL or a live QP; its context, PD and CQs outlive it.
        let q: &Qp = unsafe { try_ref(qp) }?;
        let b = &q.ibv.qp_base;
        // SAFETY: as above.
        let (c, p, scq, rcq): (&Context, &Pd, &Cq, &Cq) = unsafe {
            (
                try_ref(b.context)?,
                try_ref(b.pd)?,
                try_ref(b.send_cq)?,
                try_ref(b.recv_cq)?,
            )
        };
        c.qps.lock().remove(&b.qp_num);
        p.users.release();
        scq.users.release();
        rcq.users.release();
        // SAFETY: the caller gives the QP up.
        unsafe { free(qp) };
        Ok(())
    })
}

pub(crate) extern "C" fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    ffi!(SetsErrno, {
        // SAFETY: NULL or a live QP, NULL or a readable GID.
        let (q, g): (&Qp, _) = unsafe { (try_ref(qp)?, gid.as_ref().ok_or(libc::EINVAL)?) };
        q.qp.attach_mcast(&Gid(g.raw), lid).map_err(|e| e.errno())
    })
}

pub(crate) extern "C" fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    ffi!(SetsErrno, {
        // SAFETY: NULL or a live QP, NULL or a readable GID.
        let (q, g): (&Qp, _) = unsafe { (try_ref(qp)?, gid.as_ref().ok_or(libc::EINVAL)?) };
        q.qp.detach_mcast(&Gid(g.raw), lid).map_err(|e| e.errno())
    })
}

fn wr_opcode(v: c_int) -> Option<WrOpcode> {
    Some(match v {
        IBV_WR_RDMA_WRITE => WrOpcode::RdmaWrite,
        IBV_WR_RDMA_WRITE_WITH_IMM => WrOpcode::RdmaWriteWithImm,
        IBV_WR_SEND => WrOpcode::Send,
        IBV_WR_SEND_WITH_IMM => WrOpcode::SendWithImm,
        IBV_WR_RDMA_READ => WrOpcode::RdmaRead,
        IBV_WR_ATOMIC_CMP_AND_SWP => WrOpcode::AtomicCmpAndSwp,
        IBV_WR_ATOMIC_FETCH_AND_ADD => WrOpcode::AtomicFetchAndAdd,
        IBV_WR_LOCAL_INV => WrOpcode::LocalInv,
        IBV_WR_BIND_MW => WrOpcode::BindMw,
        IBV_WR_SEND_WITH_INV => WrOpcode::SendWithInv,
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
        return unsafe { bind_wr(w.wr_id, w.send_flags, b.mw, b.rkey, &b.bind_info) };
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
            let ah: &Ah = try_ref(ud.ah)?;
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
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    ffi!({
        // SAFETY: NULL or a live QP.
        let q = unsafe { try_ref::<ibv_qp>(qp) }?;
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
                unsafe { inline_bytes(&e, q.qp.cap().max_inline_data) }.map(|d| (e, d))
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
            return Err(e);
        }
        Ok(())
    })
}

/// `ops.post_recv`.
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    ffi!({
        // SAFETY: NULL or a live QP.
        let q = unsafe { try_ref::<ibv_qp>(qp) }?;
        // SAFETY: the program's WR list.
        let (wrs, ptrs, failed) = unsafe { recv_wrs(wr) };
        finish_recv(wrs, ptrs, failed, bad_wr, |w| q.qp.post_recv(w))
    })
}

/// `ops.bind_mw` (`ibv_bind_mw`, type 1 windows; verbs.h checked the type and the PDs):
/// posts a BIND_MW work request with R_Key `ibv_inc_rkey(mw->rkey)` and, once it is
/// posted, sets `mw->rkey` to it (the key is usable when the bind completes).
pub(crate) unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    bind: *mut ibv_mw_bind,
) -> c_int {
    // rxe's provider (rxe_bind_mw) leaves its return value in errno on every error path.
    ffi!(SetsErrno, {
        // SAFETY: NULL or live objects of this library (the caller's contract).
        let (q, w, b): (&Qp, &Mw, _) = unsafe {
            (
                try_ref(qp)?,
                try_ref(mw)?,
                bind.as_ref().ok_or(libc::EINVAL)?,
            )
        };
        // rxe's provider refuses a zero-based type 1 bind before posting it.
        if b.bind_info.mw_access_flags & IBV_ACCESS_ZERO_BASED != 0 {
            return Err(libc::EINVAL);
        }
        let rkey = verbs::inc_rkey(w.mw.rkey());
        // SAFETY: as above.
        let wr = unsafe { bind_wr(b.wr_id, b.send_flags, mw, rkey, &b.bind_info) }?;
        q.qp.post_send(&[wr]).map_err(|e| e.errno())?;
        // SAFETY: a live window; the program does not write it concurrently.
        unsafe { (*mw).rkey = rkey };
        Ok(())
    })
}
